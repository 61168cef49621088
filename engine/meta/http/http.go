package httpmeta

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/engine/meta/internal/metautil"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sidecarproof"
)

// EnvToken is Mooncake's variable for the metadata server's bearer token.
const EnvToken = "MC_METADATA_HTTP_TOKEN"

// Defaults for the connection-string settings.
const (
	DefaultTimeout = 3 * time.Second
	DefaultRetries = 2
	DefaultRefresh = 5 * time.Second
)

func init() {
	for _, s := range []string{"http", "https"} {
		meta.RegisterSchemeWith(s, func(conn string, o meta.Options) (meta.Store, error) { return OpenWith(conn, o) })
	}
}

var _ meta.Store = (*Store)(nil)

// Store is a meta.Store on an HTTP metadata server. Safe for concurrent use.
type Store struct {
	base    string // scheme://host/path, no query
	cli     *http.Client
	pfx     metautil.Prefix
	timeout time.Duration
	retries int
	refresh time.Duration
	token   string
	owned   *metautil.Owned

	// With a token derived from the cluster secret (sec set), every
	// connection is proven before it carries a request (dialProven).
	sec   *authsecret.Secrets
	proof *sidecarproof.Prover // its Roots: nil, the system's (tests set their own)

	wmu    sync.Mutex // serialises writes with the refresher's
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// Open returns a store for the server at conn. It does not contact the
// server.
func Open(conn string) (*Store, error) { return OpenWith(conn, meta.Options{}) }

// bearer picks the token the store sends: the one given, else
// MC_METADATA_HTTP_TOKEN (a Mooncake metadata server's), else te-sidecar's
// token derived from the cluster secret (given, or from the environment).
// It returns the secret when the token is derived from it: that token goes
// only over connections whose server proved it holds the secret.
func bearer(o meta.Options) (string, *authsecret.Secrets, error) {
	if o.Token != "" {
		return o.Token, nil, nil
	}
	if t := os.Getenv(EnvToken); t != "" {
		return t, nil, nil
	}
	sec, err := authsecret.Load(o.AuthSecret, o.AuthSecretFile, os.Getenv)
	if err != nil {
		return "", nil, errs.Wrap(errs.CodeOf(err), "http metadata", err, "the cluster secret")
	}
	if sec != nil {
		return sec.Token(), sec, nil
	}
	return "", nil, nil
}

// OpenWith is Open with the engine's options: the bearer token, or the
// cluster secret it is derived from.
func OpenWith(conn string, mo meta.Options) (*Store, error) {
	token, sec, err := bearer(mo)
	if err != nil {
		return nil, err
	}
	scheme, _, _ := strings.Cut(conn, "://")
	scheme = strings.ToLower(scheme)
	if scheme != "http" && scheme != "https" {
		return nil, errs.New(errs.InvalidArgument, "http metadata", "%q is not an http:// or https:// URL", conn)
	}
	o, err := metautil.Parse(scheme, scheme+conn[len(scheme):], metautil.Options{
		Timeout: DefaultTimeout, Retries: DefaultRetries, Refresh: DefaultRefresh})
	if err != nil {
		return nil, err
	}
	if strings.ContainsAny(o.Hosts, " \t\r\n@") {
		return nil, errs.New(errs.InvalidArgument, "http metadata", "bad host %q in %q", o.Hosts, conn)
	}
	path := o.Path
	if path == "" {
		path = "/metadata"
	}
	dialer := &net.Dialer{Timeout: o.Timeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:               nil, // metadata servers are local to the cluster
		DialContext:         dialer.DialContext,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
	}
	s := &Store{
		base: scheme + "://" + o.Hosts + path,
		// net/http rather than fasthttp's client: requests follow the
		// caller's context, and Close leaves no cleaner goroutines behind.
		cli: &http.Client{Transport: tr},
		pfx: metautil.NewPrefix(o.Cluster), timeout: o.Timeout, retries: o.Retries, refresh: o.Refresh,
		token: token, owned: metautil.NewOwned(),
		sec: sec,
	}
	if sec != nil {
		s.dialProven(tr, scheme, path)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.refresher()
	return s, nil
}

// URL returns the metadata URL requests go to (without ?key=).
func (s *Store) URL() string { return s.base }

// do sends one request, retrying network failures and 5xx answers, and
// returns the status and the body.
func (s *Store) do(ctx context.Context, method, key string, body []byte) (int, []byte, error) {
	if s.ctx.Err() != nil {
		return 0, nil, errs.New(errs.Closed, "http metadata", "http store closed")
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout) // the earlier deadline wins
	defer cancel()
	u := s.base + "?key=" + url.QueryEscape(s.pfx.Key(key))
	var code int
	var out []byte
	err := metautil.Retry(ctx, s.retries+1, func(ctx context.Context) (bool, error) {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, u, rd)
		if err != nil {
			return false, errs.Wrap(errs.InvalidArgument, "http metadata", err, "request for key %q", key)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if s.token != "" {
			req.Header.Set("Authorization", "Bearer "+s.token)
		}
		resp, err := s.cli.Do(req)
		if err != nil {
			if errs.CodeOf(err) == errs.Unauthenticated {
				return false, sidecarproof.Ours(err) // the server did not prove it holds the secret
			}
			code := errs.Metadata
			if errors.Is(err, context.DeadlineExceeded) || errs.CodeOf(err) == errs.Timeout {
				code = errs.Timeout
			}
			return true, errs.Wrap(code, "http metadata", err, "%s %s key %q", method, s.base, key).
				WithHint("check that the metadata server is running and reachable")
		}
		defer resp.Body.Close()
		// A store is not trusted with unbounded memory.
		b, err := io.ReadAll(io.LimitReader(resp.Body, segment.MaxDescSize+1))
		if err != nil {
			return true, errs.Wrap(errs.Metadata, "http metadata", err, "%s %s key %q: reading the answer", method, s.base, key)
		}
		if len(b) > segment.MaxDescSize {
			return false, errs.New(errs.Metadata, "http metadata", "%s %s key %q: answer exceeds %d bytes", method, s.base, key, segment.MaxDescSize)
		}
		code = resp.StatusCode
		if code >= 500 {
			return true, errs.New(errs.Metadata, "http metadata", "%s %s key %q: HTTP %d: %.200s", method, s.base, key, code, b)
		}
		out = b
		return false, nil
	})
	return code, out, err
}

// Get returns the value at key; a 404 is an error with code NotFound.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	code, body, err := s.do(ctx, http.MethodGet, key, nil)
	if err != nil {
		return nil, err
	}
	switch {
	case code == http.StatusOK:
		return body, nil
	case code == http.StatusNotFound:
		return nil, errs.New(errs.NotFound, "http metadata", "no key %q", key)
	}
	return nil, statusErr("GET", s.base, key, code, body)
}

func statusErr(method, base, key string, code int, body []byte) error {
	e := errs.New(errs.Metadata, "http metadata", "%s %s key %q: HTTP %d: %.200s", method, base, key, code, body)
	if code == http.StatusUnauthorized || code == http.StatusForbidden {
		e = e.WithHint("give this process te-sidecar's cluster secret (" + authsecret.EnvSecretFile + " or " +
			authsecret.EnvSecret + "), or set " + EnvToken + " to a Mooncake metadata server's token")
	}
	return e
}

// Put stores value at key. A write the server did not take is remembered
// and retried by the refresher; the error still reports the failure.
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	if value == nil {
		value = []byte{}
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.owned.Put(key, value)
	return s.put(ctx, key, value)
}

func (s *Store) put(ctx context.Context, key string, value []byte) error {
	code, body, err := s.do(ctx, http.MethodPut, key, value)
	if err != nil {
		return err
	}
	if code/100 != 2 {
		return statusErr("PUT", s.base, key, code, body)
	}
	s.owned.Confirm(key, value)
	return nil
}

// Delete removes key; a missing key is not an error.
func (s *Store) Delete(ctx context.Context, key string) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.owned.Delete(key)
	return s.del(ctx, key)
}

func (s *Store) del(ctx context.Context, key string) error {
	code, body, err := s.do(ctx, http.MethodDelete, key, nil)
	if err != nil {
		return err
	}
	if code/100 != 2 && code != http.StatusNotFound {
		return statusErr("DELETE", s.base, key, code, body)
	}
	s.owned.Confirm(key, nil)
	return nil
}

// refresher writes what failed earlier and checks, through the smallest key
// it owns, that the server still holds its keys: an in-memory server that
// restarted lost them all, and gets them all again.
func (s *Store) refresher() {
	defer s.wg.Done()
	for metautil.Sleep(s.ctx, s.refresh) {
		s.refreshOnce()
	}
}

func (s *Store) refreshOnce() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	all := s.owned.All()
	if len(all) > 0 {
		canary := all[0]
		for _, e := range all[1:] {
			if len(e.Value) < len(canary.Value) {
				canary = e
			}
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
		code, _, err := s.do(ctx, http.MethodGet, canary.Key, nil)
		cancel()
		if err != nil {
			return // server away: try next round
		}
		if code == http.StatusNotFound {
			s.owned.Lost()
		}
	}
	s.owned.Replay(s.ctx, s.timeout, s.put, s.del)
}

// Close stops the refresher and closes idle connections. It does not delete
// the keys (the engine does, before closing its store).
func (s *Store) Close() error {
	s.once.Do(func() {
		s.cancel()
		s.wg.Wait()
		s.cli.CloseIdleConnections()
	})
	return nil
}
