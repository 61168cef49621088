package sidecar

import (
	"github.com/tecache/te/kvcache/handoff/proto"

	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	vm "github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
	"golang.org/x/sync/semaphore"

	"github.com/tecache/te/cmd/te-sidecar/rendezvous"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
)

// Config configures a Server. The zero value serves with the defaults below.
type Config struct {
	// Secret is the cluster secret. When set, every route but /healthz and
	// /metrics needs "Authorization: Bearer <token>" with the token derived
	// from it (authsecret.Token; either secret during a rotation).
	Secret *authsecret.Secrets
	// Token, when set, is also accepted as the bearer token on /metadata
	// (Mooncake's MC_METADATA_HTTP_TOKEN); without a Secret it is the only
	// token /metadata needs.
	Token string
	// MaxValue bounds a stored value (default 16 MiB, the largest
	// descriptor an engine accepts).
	MaxValue int
	// MaxKeys bounds the number of stored keys (default 1<<20).
	MaxKeys int
	// MaxMetadataBytes bounds the bytes of every stored key and value
	// together (default 256 MiB).
	MaxMetadataBytes int
	// MaxBodyInFlight bounds the bytes of request bodies being read at
	// once, over all connections (default 32 MiB); a request that cannot
	// get its share within a second is refused with 503.
	MaxBodyInFlight int64
	// MaxConns bounds the connections served at once (default 4096).
	MaxConns int
	// ReadTimeout and WriteTimeout bound one request (default 30s).
	ReadTimeout, WriteTimeout time.Duration
	// IdleTimeout closes idle keep-alive connections (default 2m).
	IdleTimeout time.Duration
	// Handoff bounds the handoff rendezvous (see rendezvous.Config).
	Handoff rendezvous.Config
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
	// Version is reported by /healthz and te_sidecar_build_info.
	Version string
}

func (c *Config) fill() {
	if c.MaxValue <= 0 {
		c.MaxValue = 16 << 20
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = 1 << 20
	}
	if c.MaxMetadataBytes <= 0 {
		c.MaxMetadataBytes = 256 << 20
	}
	if c.MaxBodyInFlight <= 0 {
		c.MaxBodyInFlight = 32 << 20
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 4096
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = 30 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 30 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Version == "" {
		c.Version = "dev"
	}
}

// Route access levels.
type access int

const (
	open     access = iota // /healthz, /metrics
	metadata               // the secret's token or the metadata token
	secret                 // the secret's token (when a secret is set)
)

// Server is the sidecar's HTTP server. Routes are matched exactly on path,
// then on method; add routes with Handle before Serve.
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *Metrics
	kv      *KV
	srv     *fasthttp.Server
	start   time.Time
	tokens  []string // accepted on every authenticated route
	mdToken []string // accepted on /metadata as well
	bodies  *semaphore.Weighted

	mu      sync.RWMutex
	routes  map[string]map[string]route // path -> method -> route
	handoff *rendezvous.Service

	addr     atomic.Value // string, once serving
	draining atomic.Bool

	requests Counter
	duration Histogram
	refused  Counter
}

type route struct {
	h      fasthttp.RequestHandler
	access access
	limit  int // largest body, for Expect: 100-continue
}

// New builds a server with /metadata, /healthz and /metrics installed.
func New(cfg Config) *Server {
	cfg.fill()
	s := &Server{cfg: cfg, log: cfg.Logger, metrics: NewMetrics(), kv: NewKV(cfg.MaxKeys, cfg.MaxValue, cfg.MaxMetadataBytes),
		routes: map[string]map[string]route{}, start: time.Now(), bodies: semaphore.NewWeighted(cfg.MaxBodyInFlight)}
	if cfg.Secret != nil {
		s.tokens = cfg.Secret.Tokens()
	}
	s.mdToken = s.tokens
	if cfg.Token != "" {
		s.mdToken = append(slices.Clone(s.tokens), cfg.Token)
	}
	s.addr.Store("")
	s.requests = s.metrics.Counter("te_sidecar_http_requests_total", "HTTP requests by route, method and status code.", "route", "method", "code")
	s.duration = s.metrics.Histogram("te_sidecar_http_request_duration_seconds", "Time to serve an HTTP request.", DefBuckets, "route", "method")
	s.refused = s.metrics.Counter("te_sidecar_refused_total",
		"Requests refused before their handler by reason: unauthenticated (401), too_large (413), busy (503: request bodies in flight at their bound).", "reason")
	s.metrics.Gauge("te_sidecar_build_info", "Build of this sidecar (always 1).", "version", "go_version").
		Set(1, cfg.Version, runtime.Version())
	s.metrics.GaugeFunc("te_sidecar_start_time_seconds", "Unix time the sidecar started.", func() float64 {
		return float64(s.start.UnixNano()) / 1e9
	})
	s.metrics.GaugeFunc("te_sidecar_goroutines", "Goroutines of the sidecar process.", func() float64 {
		return float64(runtime.NumGoroutine())
	})
	s.metrics.GaugeFunc("te_sidecar_gomaxprocs", "GOMAXPROCS (set from the cgroup CPU quota).", func() float64 {
		return float64(runtime.GOMAXPROCS(0))
	})
	s.metrics.GaugeFunc("te_sidecar_metadata_keys", "Keys in the in-memory metadata store.", func() float64 {
		n, _ := s.kv.Size()
		return float64(n)
	})
	s.metrics.GaugeFunc("te_sidecar_metadata_bytes", "Bytes of keys and values in the in-memory metadata store.", func() float64 {
		_, b := s.kv.Size()
		return float64(b)
	})
	s.metrics.CounterFunc("te_sidecar_refused_connections_total",
		"Connections refused with 503 because the sidecar served its maximum (-max-conns).", func() float64 {
			return float64(s.srv.GetRejectedConnectionsCount())
		})
	s.installMetadata()
	mountHandoff(s)
	s.handle("GET", "/healthz", s.healthz, open)
	s.handle("GET", "/metrics", s.serveMetrics, open)
	s.srv = &fasthttp.Server{
		Handler:      s.serve,
		Name:         "te-sidecar",
		ReadTimeout:  cfg.ReadTimeout,
		WriteTimeout: cfg.WriteTimeout,
		IdleTimeout:  cfg.IdleTimeout,
		// Bodies are read by the handlers, with each route's limit
		// (ReadBody), so that an oversized one gets a 413 it can read.
		StreamRequestBody:  true,
		ExpectHandler:      s.expect,
		MaxRequestBodySize: max(cfg.MaxValue, s.handoffMaxBody()),
		Concurrency:        cfg.MaxConns,
		// Room for a request line with the longest key, escaped.
		ReadBufferSize:  4*MaxKeyLen + 4096,
		NoDefaultDate:   true,
		CloseOnShutdown: true,
		Logger:          fasthttpLogger{cfg.Logger},
		ErrorHandler:    requestError,
	}
	return s
}

// Metrics returns the registry /metrics exports, for handlers added with
// Handle.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Logger returns the server's logger.
func (s *Server) Logger() *slog.Logger { return s.log }

// KV returns the in-memory metadata store behind /metadata.
func (s *Server) KV() *KV { return s.kv }

// Handle installs h for method on path (exact match), replacing any earlier
// handler. Requests are counted and timed per path. With a secret, the
// route needs its token. A handler reads the request body with ReadBody.
func (s *Server) Handle(method, path string, h fasthttp.RequestHandler) {
	s.handle(method, path, h, secret)
}

func (s *Server) handle(method, path string, h fasthttp.RequestHandler, a access) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.routes[path]
	if m == nil {
		m = map[string]route{}
		s.routes[path] = m
	}
	limit := s.handoffMaxBody()
	if a == metadata {
		limit = s.cfg.MaxValue
	}
	m[strings.ToUpper(method)] = route{h: h, access: a, limit: limit}
}

func (s *Server) route(path, method string) (map[string]route, route, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m := s.routes[path]
	r, ok := m[method]
	if !ok && method == "HEAD" {
		r, ok = m["GET"]
	}
	return m, r, ok
}

// expect answers "Expect: 100-continue" before the body is sent: a request
// without its token or with a body over its route's limit is refused at once
// (401, 413), so the client never sends the body.
func (s *Server) expect(ctx *fasthttp.RequestCtx) int {
	_, r, ok := s.route(string(ctx.Path()), string(ctx.Method()))
	switch {
	case !ok:
		return fasthttp.StatusContinue // the handler answers 404 or 405
	case !s.authorized(ctx, r.access):
		s.refused.Inc("unauthenticated")
		return fasthttp.StatusUnauthorized
	case ctx.Request.Header.ContentLength() > r.limit:
		s.refused.Inc("too_large")
		return fasthttp.StatusRequestEntityTooLarge
	}
	return fasthttp.StatusContinue
}

func (s *Server) serve(ctx *fasthttp.RequestCtx) {
	t0 := time.Now()
	path := string(ctx.Path())
	method := string(ctx.Method())
	m, r, ok := s.route(path, method)
	label := path
	switch {
	case m == nil:
		label = "other" // unbounded paths must not become label values
		ctx.Error("not found", fasthttp.StatusNotFound)
	case !ok:
		methods := make([]string, 0, len(m))
		for k := range m {
			methods = append(methods, k)
		}
		sort.Strings(methods)
		ctx.Error("method not allowed", fasthttp.StatusMethodNotAllowed)
		ctx.Response.Header.Set("Allow", strings.Join(methods, ", "))
	case !s.authorized(ctx, r.access):
		s.refused.Inc("unauthenticated")
		ctx.Response.Reset()
		ctx.SetStatusCode(fasthttp.StatusUnauthorized)
		ctx.Response.Header.Set("WWW-Authenticate", "Bearer")
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":"unauthenticated: this route needs Authorization: Bearer <token> (see te-sidecar -h)","code":` +
			strconv.Itoa(int(errs.Unauthenticated)) + `}`)
	default:
		r.h(ctx)
	}
	if !ok {
		method = "other"
	}
	code := ctx.Response.StatusCode()
	s.requests.Inc(label, method, strconv.Itoa(code))
	s.duration.Observe(time.Since(t0).Seconds(), label, method)
	if code >= 500 {
		s.log.Warn("request failed", "method", method, "path", path, "code", code, "remote", ctx.RemoteAddr().String())
	} else if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("request", "method", method, "path", path, "code", code, "remote", ctx.RemoteAddr().String(),
			"duration", time.Since(t0))
	}
}

func (s *Server) authorized(ctx *fasthttp.RequestCtx, a access) bool {
	want := s.tokens
	switch a {
	case open:
		return true
	case metadata:
		want = s.mdToken
	}
	if len(want) == 0 {
		return true
	}
	got, ok := strings.CutPrefix(string(ctx.Request.Header.Peek("Authorization")), "Bearer ")
	return ok && authsecret.Match(got, want)
}

// maxDrain bounds what is read and discarded of a body refused for its
// size, so that the client, still sending, gets to read the 413.
const maxDrain = 1 << 30

// ReadBody reads the request body, at most limit bytes. A larger body is
// drained (up to 1 GiB, nothing kept) and refused with 413, and the
// connection is closed after the answer; a body that cannot get its share
// of the bytes in flight within a second is refused with 503. On error it
// returns the status and a message for the caller's answer.
func (s *Server) ReadBody(ctx *fasthttp.RequestCtx, limit int) ([]byte, int, error) {
	cl := ctx.Request.Header.ContentLength() // -1: chunked, -2: none
	if cl > limit {
		s.drain(ctx)
		s.refused.Inc("too_large")
		return nil, fasthttp.StatusRequestEntityTooLarge, fmt.Errorf("request body of %d bytes is over the limit of %d", cl, limit)
	}
	need := int64(limit)
	if cl >= 0 {
		need = int64(cl)
	}
	need = min(need, s.cfg.MaxBodyInFlight)
	wctx, cancel := context.WithTimeout(context.Background(), time.Second)
	err := s.bodies.Acquire(wctx, need)
	cancel()
	if err != nil {
		s.drain(ctx)
		s.refused.Inc("busy")
		return nil, fasthttp.StatusServiceUnavailable, fmt.Errorf("the sidecar is reading %d bytes of request bodies, its limit: retry", s.cfg.MaxBodyInFlight)
	}
	defer s.bodies.Release(need)
	stream := ctx.RequestBodyStream()
	if stream == nil {
		b := ctx.PostBody()
		if len(b) > limit {
			s.refused.Inc("too_large")
			return nil, fasthttp.StatusRequestEntityTooLarge, fmt.Errorf("request body is over the limit of %d bytes", limit)
		}
		return b, 0, nil
	}
	var b []byte
	if cl >= 0 {
		// The length is known and within the limit: one allocation.
		b = make([]byte, cl)
		_, err = io.ReadFull(stream, b)
	} else {
		b, err = io.ReadAll(io.LimitReader(stream, int64(limit)+1))
	}
	if err != nil {
		ctx.SetConnectionClose()
		return nil, fasthttp.StatusBadRequest, fmt.Errorf("reading the request body: %v", err)
	}
	if len(b) > limit {
		s.drain(ctx)
		s.refused.Inc("too_large")
		return nil, fasthttp.StatusRequestEntityTooLarge, fmt.Errorf("request body is over the limit of %d bytes", limit)
	}
	return b, 0, nil
}

// drain discards the rest of a refused body and closes the connection after
// the answer: a client still sending would otherwise see the connection
// reset instead of the answer.
func (s *Server) drain(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	if stream := ctx.RequestBodyStream(); stream != nil {
		io.CopyN(io.Discard, stream, maxDrain)
	}
}

// Client names the caller for quotas: with a secret, the name it gives in
// X-Te-Client (authenticated callers are trusted not to impersonate each
// other); otherwise its remote address, with the name when there is one.
func (s *Server) Client(ctx *fasthttp.RequestCtx) string {
	name := string(ctx.Request.Header.Peek(proto.ClientHeader))
	if len(name) > 256 || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		name = ""
	}
	if s.cfg.Secret != nil && name != "" {
		return name
	}
	ip := ctx.RemoteIP().String()
	if name != "" {
		return ip + "/" + name
	}
	return ip
}

func (s *Server) healthz(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	if s.draining.Load() {
		// Load balancers stop sending before the listener closes.
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"status":"draining"}`)
		return
	}
	ctx.SetBodyString(`{"status":"ok","version":"` + escapeValue(s.cfg.Version) + `","uptime_seconds":` +
		strconv.FormatFloat(time.Since(s.start).Seconds(), 'f', 3, 64) + `}`)
}

func (s *Server) serveMetrics(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	s.metrics.WriteTo(ctx)
	// The process's own figures (resident memory, open fds, Go heap and
	// GC) without HELP lines: standard names every dashboard knows.
	vm.WriteProcessMetrics(ctx)
}

// Serve serves on ln until Shutdown; it returns nil after a shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.addr.Store(ln.Addr().String())
	if err := s.srv.Serve(ln); err != nil {
		return errs.Wrap(errs.Internal, "sidecar", err, "serving on %s", ln.Addr())
	}
	return nil
}

// Addr returns the address Serve listens on ("" before Serve).
func (s *Server) Addr() string { return s.addr.Load().(string) }

// Shutdown stops accepting connections, lets requests in flight finish and
// returns; when ctx ends first, it closes the remaining connections and
// returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	err := s.srv.ShutdownWithContext(ctx)
	s.handoff.Close()
	return err
}

// requestError answers a request fasthttp could not read.
func requestError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		ctx.Error("request body too large", fasthttp.StatusRequestEntityTooLarge)
	case errors.As(err, &small):
		ctx.Error("request header too large", fasthttp.StatusRequestHeaderFieldsTooLarge)
	case errors.As(err, &ne) && ne.Timeout():
		ctx.Error("request timeout", fasthttp.StatusRequestTimeout)
	default:
		ctx.Error("bad request", fasthttp.StatusBadRequest)
	}
}

type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Warn("http server", "msg", strings.TrimSpace(fmt.Sprintf(format, args...)))
}
