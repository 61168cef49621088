package etcd

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/engine/meta/internal/metautil"
	"github.com/tecache/te/internal/errs"
)

// Schemes of this store: plaintext, and TLS.
const (
	Scheme    = "etcd"
	SchemeTLS = "etcds"
)

// Environment variables for etcd's security: TLS files (PEM) for etcds://,
// and a user for etcd's authentication (either scheme).
const (
	EnvCACert   = "TE_ETCD_CACERT"   // CAs that sign the servers' certificates (default: the system's)
	EnvCert     = "TE_ETCD_CERT"     // client certificate, for --client-cert-auth
	EnvKey      = "TE_ETCD_KEY"      // its key
	EnvUser     = "TE_ETCD_USER"     // user name, for etcd's authentication
	EnvPassword = "TE_ETCD_PASSWORD" // its password
)

// Defaults for the connection-string settings.
const (
	DefaultTTL     = 10 * time.Second
	DefaultTimeout = 5 * time.Second
)

func init() {
	for _, sc := range []string{Scheme, SchemeTLS} {
		meta.RegisterScheme(sc, func(conn string) (meta.Store, error) { return Open(conn) })
	}
}

var (
	_ meta.Store   = (*Store)(nil)
	_ meta.Watcher = (*Store)(nil)
)

// Store is a meta.Store on etcd. It is safe for concurrent use.
type Store struct {
	cli     *clientv3.Client
	tls     bool
	pfx     metautil.Prefix
	ttl     time.Duration
	timeout time.Duration
	owned   *metautil.Owned

	// wmu serialises writes, so a republication after a lost lease never
	// puts back a value a later Put or Delete replaced.
	wmu   sync.Mutex
	lease clientv3.LeaseID // 0: none (not needed yet, or lost)

	kick   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// Open connects to the etcd cluster named by conn. It does not wait for
// etcd to answer: an unreachable cluster shows as errors of the first
// operations, and the client keeps trying to reconnect. With a user
// (TE_ETCD_USER), though, it authenticates at once, so etcd must answer
// within the timeout (at least 5 s).
func Open(conn string) (*Store, error) {
	scheme, _, _ := strings.Cut(conn, "://")
	scheme = strings.ToLower(scheme)
	if scheme != Scheme && scheme != SchemeTLS {
		return nil, errs.New(errs.InvalidArgument, "etcd", "%q is not an etcd:// or etcds:// connection string", conn)
	}
	o, err := metautil.Parse(scheme, scheme+conn[len(scheme):], metautil.Options{TTL: DefaultTTL, Timeout: DefaultTimeout})
	if err != nil {
		return nil, err
	}
	if o.TTL < time.Second {
		return nil, errs.New(errs.InvalidArgument, "etcd", "lease ttl %v is under the 1s etcd allows", o.TTL)
	}
	cfg := clientv3.Config{
		DialTimeout:          o.Timeout,
		DialKeepAliveTime:    o.TTL / 2,
		DialKeepAliveTimeout: o.TTL / 2,
		// The client's own log lines would go to stderr of the host
		// process; te reports through errors instead.
		Logger: zap.NewNop(),
		// gRPC's default reconnection backoff grows to two minutes: an
		// engine would stay cut off from etcd that long after an outage.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: o.Timeout,
		})},
		Username: os.Getenv(EnvUser),
		Password: os.Getenv(EnvPassword),
	}
	if (cfg.Username == "") != (cfg.Password == "") {
		return nil, errs.New(errs.InvalidArgument, "etcd", "%s and %s go together", EnvUser, EnvPassword)
	}
	if cfg.Username != "" {
		// The client authenticates before New returns, within DialTimeout;
		// etcd checks the password with bcrypt, slow on a loaded machine.
		cfg.DialTimeout = max(o.Timeout, 5*time.Second)
	}
	ca, cert, key := os.Getenv(EnvCACert), os.Getenv(EnvCert), os.Getenv(EnvKey)
	proto := "http://"
	if scheme == SchemeTLS {
		proto = "https://"
		if cfg.TLS, err = metautil.TLSConfig("etcd", ca, cert, key); err != nil {
			return nil, err
		}
	} else if ca != "" || cert != "" || key != "" {
		return nil, errs.New(errs.InvalidArgument, "etcd", "%s, %s or %s is set but %q is plaintext", EnvCACert, EnvCert, EnvKey, conn).
			WithHint("use etcds:// for TLS")
	}
	for _, h := range strings.Split(o.Hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			cfg.Endpoints = append(cfg.Endpoints, proto+h)
		}
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, (&Store{tls: cfg.TLS != nil}).fail("connecting to "+o.Hosts, "", err)
	}
	s := &Store{
		cli: cli, tls: cfg.TLS != nil, pfx: metautil.NewPrefix(o.Cluster), ttl: o.TTL, timeout: o.Timeout,
		owned: metautil.NewOwned(), kick: make(chan struct{}, 1),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.keeper()
	return s, nil
}

func (s *Store) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.timeout)
}

// Get returns the value at key; a missing key is an error with code NotFound.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if s.ctx.Err() != nil {
		return nil, errs.New(errs.Closed, "etcd", "etcd store closed")
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	// The client retries reads on an unavailable endpoint by itself until
	// the deadline.
	resp, err := s.cli.Get(ctx, s.pfx.Key(key))
	if err != nil {
		return nil, s.fail("get", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, errs.New(errs.NotFound, "etcd", "no key %q", key)
	}
	return resp.Kvs[0].Value, nil
}

// Put writes value at key under the store's lease (taken on the first Put).
// When etcd cannot be reached the write is remembered and done as soon as it
// is back; the error still reports the failure.
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	if s.ctx.Err() != nil {
		return errs.New(errs.Closed, "etcd", "etcd store closed")
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.owned.Put(key, value)
	err := s.put(ctx, key, value)
	if err != nil {
		s.poke()
		return err
	}
	return nil
}

// put writes under the lease, taking one if there is none; a lease etcd no
// longer knows (it restarted empty, or the lease expired) is replaced and the
// write tried once more. Callers hold wmu.
func (s *Store) put(ctx context.Context, key string, value []byte) error {
	err := s.putOnce(ctx, key, value)
	if isLeaseGone(err) {
		err = s.putOnce(ctx, key, value)
	}
	if err != nil {
		return s.fail("put", key, err)
	}
	return nil
}

func (s *Store) putOnce(ctx context.Context, key string, value []byte) error {
	if s.lease == 0 {
		resp, err := s.cli.Grant(ctx, int64((s.ttl+time.Second-1)/time.Second))
		if err != nil {
			return err
		}
		s.lease = resp.ID
		s.poke() // the keeper keeps it alive from now on
	}
	err := metautil.Retry(ctx, 1<<20, func(ctx context.Context) (bool, error) {
		_, err := s.cli.Put(ctx, s.pfx.Key(key), string(value), clientv3.WithLease(s.lease))
		return transient(err), err
	})
	if err != nil {
		if isLeaseGone(err) {
			s.lease = 0
			s.owned.Lost()
		}
		return err
	}
	s.owned.Confirm(key, value)
	return nil
}

// Delete removes key; a missing key is not an error. A delete that fails
// is retried in the background.
func (s *Store) Delete(ctx context.Context, key string) error {
	if s.ctx.Err() != nil {
		return errs.New(errs.Closed, "etcd", "etcd store closed")
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.owned.Delete(key)
	if err := s.del(ctx, key); err != nil {
		s.poke()
		return err
	}
	return nil
}

func (s *Store) del(ctx context.Context, key string) error {
	err := metautil.Retry(ctx, 1<<20, func(ctx context.Context) (bool, error) {
		_, err := s.cli.Delete(ctx, s.pfx.Key(key))
		return transient(err), err
	})
	if err != nil {
		return s.fail("delete", key, err)
	}
	s.owned.Confirm(key, nil)
	return nil
}

func (s *Store) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// keeper keeps the lease alive and, whenever the lease was lost or writes
// failed, takes a new lease and writes every owned key again.
func (s *Store) keeper() {
	defer s.wg.Done()
	retry := time.NewTicker(s.ttl / 4)
	defer retry.Stop()
	for s.ctx.Err() == nil {
		s.wmu.Lock()
		id := s.lease
		s.wmu.Unlock()
		if id == 0 {
			if s.owned.Len() == 0 {
				select { // nothing to keep: no lease
				case <-s.ctx.Done():
				case <-s.kick:
				}
				continue
			}
			s.flush()
			s.wmu.Lock()
			id = s.lease
			s.wmu.Unlock()
			if id == 0 {
				metautil.Sleep(s.ctx, s.ttl/4)
				continue
			}
		}
		s.keepAlive(id, retry.C)
	}
}

// keepAlive keeps lease id alive and flushes pending writes until the lease
// is lost or replaced, or the store closes.
func (s *Store) keepAlive(id clientv3.LeaseID, retry <-chan time.Time) {
	kctx, kcancel := context.WithCancel(s.ctx)
	defer kcancel() // the client stops sending keepalives for id
	ch, err := s.cli.KeepAlive(kctx, id)
	if err != nil {
		if s.ctx.Err() == nil {
			s.lost(id)
		}
		return
	}
	s.flush()
	for {
		select {
		case _, ok := <-ch:
			if !ok && s.ctx.Err() != nil {
				return // closing: Close revokes the lease
			}
			if !ok {
				// Expired, revoked or not answered within the TTL:
				// the keys under it are gone or going.
				s.lost(id)
				return
			}
		case <-s.kick:
			s.flush()
		case <-retry:
			if len(s.owned.Pending()) > 0 {
				s.flush()
			}
		}
		s.wmu.Lock()
		changed := s.lease != id
		s.wmu.Unlock()
		if changed {
			return
		}
	}
}

func (s *Store) lost(id clientv3.LeaseID) {
	s.wmu.Lock()
	if s.lease == id {
		s.lease = 0
		s.owned.Lost()
	}
	s.wmu.Unlock()
}

// flush writes the pending puts and deletes (every owned key after a lost
// lease).
func (s *Store) flush() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.owned.Replay(s.ctx, s.timeout, s.put, s.del)
}

// Watch calls fn for every change under prefix until ctx ends (see
// meta.Watcher). It returns once etcd confirmed the watch, or after the
// store's timeout if etcd does not answer (the watch then starts when it
// does).
func (s *Store) Watch(ctx context.Context, prefix string, fn func(key string)) error {
	if s.ctx.Err() != nil {
		return errs.New(errs.Closed, "etcd", "etcd store closed")
	}
	ready := make(chan struct{})
	s.wg.Add(1)
	go s.watch(ctx, prefix, fn, ready)
	t := time.NewTimer(s.timeout)
	defer t.Stop()
	select {
	case <-ready:
	case <-t.C:
	case <-ctx.Done():
	}
	return nil
}

func (s *Store) watch(ctx context.Context, prefix string, fn func(string), ready chan struct{}) {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel) // the store's Close ends it too
	defer stop()
	full := s.pfx.Key(prefix)
	first := true
	for gen := 0; ctx.Err() == nil; gen++ {
		// Each generation gets a gRPC stream of its own (the client keys
		// streams by the context's metadata): the stream of the last one
		// may be resuming old watches against a server that restarted.
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(
			metadata.AppendToOutgoingContext(ctx, "te-watch-gen", strconv.Itoa(gen))))
		wch := s.cli.Watch(wctx, full, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		// A watch resumes by itself after a reconnection, but from its old
		// revision: after etcd restarted from scratch it would wait for
		// revisions that never come. So the watch is set up again whenever
		// the connection comes back, and everything counts as changed.
		reconnected := make(chan struct{})
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.awaitReconnect(wctx, reconnected)
		}()
	events:
		for {
			select {
			case resp, ok := <-wch:
				if !ok || resp.Canceled || resp.Err() != nil {
					break events
				}
				if resp.Created {
					if first {
						close(ready)
						first = false
					} else {
						// Changes between the last watch and this
						// one were not seen: everything counts as
						// changed.
						fn(prefix)
					}
				}
				for _, ev := range resp.Events {
					fn(s.pfx.Unkey(string(ev.Kv.Key)))
				}
			case <-reconnected:
				break events
			}
		}
		wcancel()
		for range wch { // the client closes it after cancel
		}
		// No fn(prefix) here: etcd may still be away, and stale handles
		// would then fail their transfers on a refetch. The next watch's
		// creation, with etcd back, reports it.
		metautil.Sleep(ctx, 100*time.Millisecond)
	}
}

// awaitReconnect closes done when the client connection went away and is
// ready again, or returns when ctx ends.
func (s *Store) awaitReconnect(ctx context.Context, done chan struct{}) {
	cc := s.cli.ActiveConnection()
	st := cc.GetState()
	down := st != connectivity.Ready
	for cc.WaitForStateChange(ctx, st) {
		st = cc.GetState()
		switch {
		case st == connectivity.Ready && down:
			close(done)
			return
		case st == connectivity.TransientFailure || st == connectivity.Connecting || st == connectivity.Idle:
			down = true
		}
	}
}

// Close revokes the lease (so the store's keys disappear now rather than
// after the TTL), stops the background work and closes the client.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.cancel()
		s.wg.Wait()
		s.wmu.Lock()
		id := s.lease
		s.lease = 0
		s.wmu.Unlock()
		if id != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
			s.cli.Revoke(ctx, id)
			cancel()
		}
		s.cli.Close()
	})
	return nil
}

// fail turns a client error into a Metadata error (Timeout when the
// deadline ran out with etcd connected), saying which key and what to check:
// the credentials when etcd refused them, the TLS files when the connection
// keeps failing over TLS, else that etcd may be down.
func (s *Store) fail(op, key string, err error) error {
	what := op
	if key != "" {
		what += " " + strconv.Quote(key)
	}
	code := errs.Metadata
	hint := "check that etcd is running and reachable"
	msg := err.Error()
	switch sc := status.Code(err); {
	case errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrAuthFailed) ||
		errors.Is(err, rpctypes.ErrPermissionDenied) || sc == codes.Unauthenticated || sc == codes.PermissionDenied ||
		strings.Contains(msg, "user name is empty") || strings.Contains(msg, "authentication failed") ||
		strings.Contains(msg, "permission denied"):
		hint = "etcd requires authentication: set " + EnvUser + " and " + EnvPassword + " to a user that may read and write te's keys"
	case errors.Is(err, context.DeadlineExceeded) || sc == codes.DeadlineExceeded:
		if s.cli != nil && s.cli.ActiveConnection().GetState() != connectivity.Ready {
			// The deadline ran out while no connection could be made.
			what += ": no connection to etcd"
			if s.tls {
				hint = "the TLS connection to etcd fails: check " + EnvCACert + " (the CA that signed etcd's certificate), " +
					EnvCert + " and " + EnvKey + " (a client certificate etcd trusts), and that etcd serves TLS"
			} else {
				hint = "check that etcd is running and reachable, and serves plaintext (etcds:// is TLS)"
			}
		} else {
			code = errs.Timeout
		}
	}
	return errs.Wrap(code, "etcd", err, "%s", what).WithHint(hint)
}

// transient reports whether a failed request may succeed if tried again.
func transient(err error) bool {
	if err == nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}

func isLeaseGone(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound)
}
