package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	vm "github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/tecache/te/engine/errs"
)

// Config configures a Server. The zero value serves with the defaults below.
type Config struct {
	// Token, when set, is required as "Authorization: Bearer <token>" on
	// /metadata (Mooncake's MC_METADATA_HTTP_TOKEN).
	Token string
	// MaxValue bounds a stored value (default 16 MiB, the largest
	// descriptor an engine accepts).
	MaxValue int
	// MaxKeys bounds the number of stored keys (default 1<<20).
	MaxKeys int
	// ReadTimeout and WriteTimeout bound one request (default 30s).
	ReadTimeout, WriteTimeout time.Duration
	// IdleTimeout closes idle keep-alive connections (default 2m).
	IdleTimeout time.Duration
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

// Server is the sidecar's HTTP server. Routes are matched exactly on path,
// then on method; add routes with Handle before Serve.
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *Metrics
	kv      *KV
	srv     *fasthttp.Server
	start   time.Time

	mu     sync.RWMutex
	routes map[string]map[string]route // path -> method -> route

	addr     atomic.Value // string, once serving
	draining atomic.Bool

	requests Counter
	duration Histogram
}

type route struct {
	h    fasthttp.RequestHandler
	auth bool
}

// New builds a server with /metadata, /healthz and /metrics installed.
func New(cfg Config) *Server {
	cfg.fill()
	s := &Server{cfg: cfg, log: cfg.Logger, metrics: NewMetrics(), kv: NewKV(cfg.MaxKeys, cfg.MaxValue),
		routes: map[string]map[string]route{}, start: time.Now()}
	s.addr.Store("")
	s.requests = s.metrics.Counter("te_sidecar_http_requests_total", "HTTP requests by route, method and status code.", "route", "method", "code")
	s.duration = s.metrics.Histogram("te_sidecar_http_request_duration_seconds", "Time to serve an HTTP request.", DefBuckets, "route", "method")
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
	s.installMetadata()
	mountHandoff(s)
	s.Handle("GET", "/healthz", s.healthz)
	s.Handle("GET", "/metrics", s.serveMetrics)
	s.srv = &fasthttp.Server{
		Handler:            s.serve,
		Name:               "te-sidecar",
		ReadTimeout:        cfg.ReadTimeout,
		WriteTimeout:       cfg.WriteTimeout,
		IdleTimeout:        cfg.IdleTimeout,
		MaxRequestBodySize: cfg.MaxValue,
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
// handler. Requests are counted and timed per path.
func (s *Server) Handle(method, path string, h fasthttp.RequestHandler) {
	s.handle(method, path, h, false)
}

func (s *Server) handle(method, path string, h fasthttp.RequestHandler, auth bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.routes[path]
	if m == nil {
		m = map[string]route{}
		s.routes[path] = m
	}
	m[strings.ToUpper(method)] = route{h: h, auth: auth}
}

func (s *Server) serve(ctx *fasthttp.RequestCtx) {
	t0 := time.Now()
	path := string(ctx.Path())
	method := string(ctx.Method())
	s.mu.RLock()
	m := s.routes[path]
	r, ok := m[method]
	if !ok && method == "HEAD" {
		r, ok = m["GET"]
	}
	s.mu.RUnlock()
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
	case r.auth && !s.authorized(ctx):
		ctx.Error("unauthorized", fasthttp.StatusUnauthorized) // resets headers
		ctx.Response.Header.Set("WWW-Authenticate", "Bearer")
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

func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	if s.cfg.Token == "" {
		return true
	}
	got, ok := strings.CutPrefix(string(ctx.Request.Header.Peek("Authorization")), "Bearer ")
	return ok && constantTimeEqual(got, s.cfg.Token)
}

func constantTimeEqual(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	var d byte
	for i := 0; i < len(a); i++ {
		d |= a[i] ^ b[i]
	}
	return d == 0
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
	return s.srv.ShutdownWithContext(ctx)
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
