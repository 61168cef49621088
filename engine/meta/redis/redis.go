package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/engine/meta/internal/metautil"
	"github.com/tecache/te/internal/errs"
)

// Mooncake's environment variables for the connection.
const (
	EnvUsername = "MC_REDIS_USERNAME"
	EnvPassword = "MC_REDIS_PASSWORD"
	EnvDBIndex  = "MC_REDIS_DB_INDEX"
)

// te's environment variables for TLS (rediss://), PEM files: Mooncake has
// none for redis TLS.
const (
	EnvCACert = "TE_REDIS_CACERT" // CAs that sign the server's certificate (default: the system's)
	EnvCert   = "TE_REDIS_CERT"   // client certificate, for tls-auth-clients
	EnvKey    = "TE_REDIS_KEY"    // its key
)

// Defaults for the connection-string settings.
const (
	DefaultTTL     = 10 * time.Second
	DefaultTimeout = 3 * time.Second
)

func init() {
	for _, sc := range []string{"redis", "rediss"} {
		meta.RegisterScheme(sc, func(conn string) (meta.Store, error) { return Open(conn) })
	}
	// go-redis logs every failed dial to stderr through a process-wide
	// logger; a library must not write to its host's stderr, and te reports
	// failures as errors. Its lines go to slog at debug level instead.
	goredis.SetLogger(debugLogger{})
}

type debugLogger struct{}

func (debugLogger) Printf(ctx context.Context, format string, v ...any) {
	slog.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

var _ meta.Store = (*Store)(nil)

// Store is a meta.Store on redis. Safe for concurrent use.
type Store struct {
	cli     *goredis.Client
	tls     bool
	pfx     metautil.Prefix
	ttl     time.Duration
	timeout time.Duration
	refresh time.Duration
	owned   *metautil.Owned

	wmu    sync.Mutex // serialises writes with the refresher's
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// Open returns a store for the server at conn. It does not contact the
// server: the first operations report an unreachable one.
func Open(conn string) (*Store, error) {
	scheme, _, _ := strings.Cut(conn, "://")
	scheme = strings.ToLower(scheme)
	if scheme != "redis" && scheme != "rediss" {
		return nil, errs.New(errs.InvalidArgument, "redis", "%q is not a redis:// or rediss:// connection string", conn)
	}
	o, err := metautil.Parse(scheme, scheme+conn[len(scheme):], metautil.Options{TTL: DefaultTTL, Timeout: DefaultTimeout})
	if err != nil {
		return nil, err
	}
	if o.TTL > 0 && o.TTL < time.Second {
		return nil, errs.New(errs.InvalidArgument, "redis", "ttl %v is under 1s", o.TTL)
	}
	if o.Refresh == 0 {
		o.Refresh = o.TTL / 3
		if o.TTL == 0 {
			o.Refresh = 5 * time.Second
		}
	}
	if o.TTL > 0 && o.Refresh >= o.TTL {
		return nil, errs.New(errs.InvalidArgument, "redis", "refresh %v must be shorter than ttl %v", o.Refresh, o.TTL)
	}
	opt := &goredis.Options{
		Addr:         o.Hosts,
		Username:     os.Getenv(EnvUsername),
		Password:     os.Getenv(EnvPassword),
		DialTimeout:  o.Timeout,
		ReadTimeout:  o.Timeout,
		WriteTimeout: o.Timeout,
		// go-redis retries by itself; bounded so a dead server fails
		// within the caller's deadline.
		MaxRetries:      2,
		MinRetryBackoff: 20 * time.Millisecond,
		MaxRetryBackoff: 200 * time.Millisecond,
		PoolSize:        8,
		// Identify no client library name: older servers refuse CLIENT
		// SETINFO on connect.
		DisableIdentity: true,
	}
	if v := os.Getenv(EnvDBIndex); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 255 {
			return nil, errs.New(errs.InvalidArgument, "redis", "%s=%q is not a database index 0..255", EnvDBIndex, v)
		}
		opt.DB = n
	}
	// redis://user:pass@host:port/db overrides the environment.
	if user, host, ok := strings.Cut(o.Hosts, "@"); ok {
		opt.Addr = host
		u, p, hasPass := strings.Cut(user, ":")
		if hasPass {
			opt.Username, opt.Password = u, p
		} else {
			opt.Password = u
		}
	}
	if db := strings.Trim(o.Path, "/"); db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 || n > 255 {
			return nil, errs.New(errs.InvalidArgument, "redis", "database %q in %q is not 0..255", db, conn)
		}
		opt.DB = n
	}
	if _, _, err := net.SplitHostPort(opt.Addr); err != nil {
		return nil, errs.New(errs.InvalidArgument, "redis", "%q in %q is not host:port", opt.Addr, conn)
	}
	ca, cert, key := os.Getenv(EnvCACert), os.Getenv(EnvCert), os.Getenv(EnvKey)
	if scheme == "rediss" {
		if opt.TLSConfig, err = metautil.TLSConfig("redis", ca, cert, key); err != nil {
			return nil, err
		}
	} else if ca != "" || cert != "" || key != "" {
		return nil, errs.New(errs.InvalidArgument, "redis", "%s, %s or %s is set but %q is plaintext", EnvCACert, EnvCert, EnvKey, conn).
			WithHint("use rediss:// for TLS")
	}
	s := &Store{
		cli: goredis.NewClient(opt), tls: opt.TLSConfig != nil, pfx: metautil.NewPrefix(o.Cluster), ttl: o.TTL, timeout: o.Timeout,
		refresh: o.Refresh, owned: metautil.NewOwned(),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.refresher()
	return s, nil
}

func (s *Store) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.timeout)
}

func (s *Store) live() error {
	if s.ctx.Err() != nil {
		return errs.New(errs.Closed, "redis", "redis store closed")
	}
	return nil
}

// Get returns the value at key; a missing key is an error with code NotFound.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	v, err := s.cli.Get(ctx, s.pfx.Key(key)).Bytes()
	if errors.Is(err, goredis.Nil) {
		return nil, errs.New(errs.NotFound, "redis", "no key %q", key)
	}
	if err != nil {
		return nil, s.fail("GET", key, err)
	}
	return v, nil
}

// Put stores value at key with the store's TTL. A write the server did not
// take is remembered and retried by the refresher; the error still reports
// the failure.
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	if err := s.live(); err != nil {
		return err
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.owned.Put(key, value)
	return s.put(ctx, key, value)
}

func (s *Store) put(ctx context.Context, key string, value []byte) error {
	if err := s.cli.Set(ctx, s.pfx.Key(key), value, s.ttl).Err(); err != nil {
		return s.fail("SET", key, err)
	}
	s.owned.Confirm(key, value)
	return nil
}

// Delete removes key; a missing key is not an error.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.live(); err != nil {
		return err
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.owned.Delete(key)
	return s.del(ctx, key)
}

func (s *Store) del(ctx context.Context, key string) error {
	if err := s.cli.Del(ctx, s.pfx.Key(key)).Err(); err != nil {
		return s.fail("DEL", key, err)
	}
	s.owned.Confirm(key, nil)
	return nil
}

// refresher extends the TTL of every owned key (EXPIRE, or EXISTS with no
// TTL) in one pipeline; a key the server no longer has is written again, and
// so are writes and deletes that failed.
func (s *Store) refresher() {
	defer s.wg.Done()
	for metautil.Sleep(s.ctx, s.refresh) {
		s.refreshOnce()
	}
}

func (s *Store) refreshOnce() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	all := s.owned.All()
	if len(all) > 0 {
		pipe := s.cli.Pipeline()
		gone := make([]func() bool, len(all))
		for i, e := range all {
			if s.ttl > 0 {
				c := pipe.PExpire(ctx, s.pfx.Key(e.Key), s.ttl)
				gone[i] = func() bool { return !c.Val() }
			} else {
				c := pipe.Exists(ctx, s.pfx.Key(e.Key))
				gone[i] = func() bool { return c.Val() == 0 }
			}
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return // server away: next round
		}
		for i, g := range gone {
			if g() {
				s.owned.Lose(all[i].Key)
			}
		}
	}
	s.owned.Replay(s.ctx, s.timeout, s.put, s.del)
}

// Close stops the refresher and closes the connections. It does not delete
// the keys (the engine does before closing its store); they expire after the
// TTL otherwise.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.cancel()
		s.wg.Wait()
		s.cli.Close()
	})
	return nil
}

// fail turns a client error into a Metadata error (Timeout when the
// deadline ran out), saying which key and what to check.
func (s *Store) fail(op, key string, err error) error {
	code := errs.Metadata
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		code = errs.Timeout
	}
	e := errs.Wrap(code, "redis", err, "%s %q", op, key)
	msg := err.Error()
	switch {
	case strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "WRONGPASS"):
		e = e.WithHint("set " + EnvUsername + "/" + EnvPassword + " to the server's credentials")
	case strings.Contains(msg, "NOPERM"):
		e = e.WithHint("the redis user " + EnvUsername + " names may not run this command on te's keys: grant it ~mooncake/* and +@read +@write +@keyspace")
	case s.tls:
		e = e.WithHint("check that redis is running and serves TLS, and " + EnvCACert + " (the CA that signed its certificate), " +
			EnvCert + " and " + EnvKey + " (a client certificate it trusts)")
	default:
		e = e.WithHint("check that redis is running and reachable, and serves plaintext (rediss:// is TLS)")
	}
	return e
}
