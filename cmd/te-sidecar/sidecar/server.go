package sidecar

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sync/semaphore"

	"github.com/tecache/te/cmd/te-sidecar/api"
	"github.com/tecache/te/cmd/te-sidecar/rendezvous"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache/handoff/proto"
)

// Config configures a Server. The zero value serves with the defaults below.
type Config struct {
	// Secret is the cluster secret. When set, every route but /healthz,
	// /metrics, /openapi.json and /metadata/proof needs "Authorization:
	// Bearer <token>" with the token derived from it (authsecret.Token;
	// either secret during a rotation), or a client's own token
	// (authsecret.ClientToken) for the name in X-Te-Client.
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
	// MaxConns bounds the connections open at once (default 4096).
	MaxConns int
	// MaxConnsPerIP bounds the connections from one IP address (default
	// MaxConns/2).
	MaxConnsPerIP int
	// ReservedConns are the slots only authenticated connections take
	// (default MaxConns/4): connections on which no request has passed a
	// route's access check yet (pending) hold at most MaxConns-ReservedConns.
	ReservedConns int
	// MaxPendingConnsPerIP bounds the pending connections from one IP
	// address (default 64).
	MaxPendingConnsPerIP int
	// HeaderTimeout bounds the wait for a request line and headers from
	// the first byte, and every read of a pending connection, its first
	// request included (default 2s).
	HeaderTimeout time.Duration
	// ReadTimeout bounds the reading of a request body, WriteTimeout the
	// writing of an answer (default 30s each).
	ReadTimeout, WriteTimeout time.Duration
	// IdleTimeout closes idle keep-alive connections (default 2m).
	IdleTimeout time.Duration
	// RefusalLogRate bounds the log lines of refused requests per second
	// (default 10, bursts of 50); past it they are counted in
	// te_sidecar_refusal_logs_suppressed_total.
	RefusalLogRate float64
	// Handoff bounds the handoff rendezvous (see rendezvous.Config).
	Handoff rendezvous.Config
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
	// Version is reported by /healthz, /openapi.json and
	// te_sidecar_build_info.
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
	if c.MaxConnsPerIP <= 0 {
		c.MaxConnsPerIP = max(1, c.MaxConns/2)
	}
	if c.ReservedConns <= 0 {
		c.ReservedConns = c.MaxConns / 4
	}
	c.ReservedConns = min(c.ReservedConns, c.MaxConns-1)
	if c.MaxPendingConnsPerIP <= 0 {
		c.MaxPendingConnsPerIP = 64
	}
	if c.HeaderTimeout <= 0 {
		c.HeaderTimeout = 2 * time.Second
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
	if c.RefusalLogRate <= 0 {
		c.RefusalLogRate = 10
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Version == "" {
		c.Version = "dev"
	}
}

// Server is the sidecar's HTTP server. Routes are matched exactly on path,
// then on method; add routes with Route or Handle before Serve.
type Server struct {
	cfg      Config
	log      *slog.Logger
	metrics  *Metrics
	kv       *KV
	srv      *fasthttp.Server
	gate     *gate
	start    time.Time
	instance string
	tokens   []string // accepted on every authenticated route
	mdToken  []string // accepted on /metadata as well
	bodies   *semaphore.Weighted
	refusals *refusalLog

	mu      sync.RWMutex
	routes  map[string]map[string]*api.Route // path -> method -> route
	handoff *rendezvous.Service
	openapi []byte // the document, built at the first request for it

	addr     atomic.Value // string, once serving
	draining atomic.Bool

	requests Counter
	duration Histogram
	refused  Counter
}

// New builds a server with /metadata, /handoff/..., /healthz, /metrics and
// /openapi.json installed.
func New(cfg Config) *Server {
	cfg.fill()
	s := &Server{cfg: cfg, log: cfg.Logger, metrics: NewMetrics(), kv: NewKV(cfg.MaxKeys, cfg.MaxValue, cfg.MaxMetadataBytes),
		routes: map[string]map[string]*api.Route{}, start: time.Now(), bodies: semaphore.NewWeighted(cfg.MaxBodyInFlight)}
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
		"Requests refused before their handler by reason: unauthenticated (401), too_large (413), busy (503: request bodies in flight "+
			"at their bound), bad_request (400: an undeclared query parameter, an unreadable request), not_found (404), "+
			"method (405), timeout (408).", "reason")
	s.refusals = newRefusalLog(s.log, cfg.RefusalLogRate, s.metrics.Counter("te_sidecar_refusal_logs_suppressed_total",
		"Log lines of refused requests left out to keep within -log-refusals-per-second."))
	s.metrics.Gauge("te_sidecar_build_info", "Build of this sidecar (always 1).", "version", "go_version").
		Set(1, cfg.Version, runtime.Version())
	s.metrics.GaugeFunc("te_sidecar_start_time_seconds", "Unix time the sidecar started.", func() float64 {
		return float64(s.start.UnixNano()) / 1e9
	})
	s.metrics.GaugeFunc("te_sidecar_metadata_keys", "Keys in the in-memory metadata store.", func() float64 {
		n, _ := s.kv.Size()
		return float64(n)
	})
	s.metrics.GaugeFunc("te_sidecar_metadata_bytes", "Bytes of keys and values in the in-memory metadata store.", func() float64 {
		_, b := s.kv.Size()
		return float64(b)
	})
	s.gate = newGate(cfg.MaxConns, cfg.MaxConnsPerIP, cfg.ReservedConns, cfg.MaxPendingConnsPerIP, cfg.HeaderTimeout, s.metrics)
	s.gate.m.onRefusal = func(remote net.Addr, reason string) {
		s.refusals.note("", "", remote.String(), fasthttp.StatusServiceUnavailable, "connection refused: every slot is held ("+reason+")")
	}
	s.installMetadata()
	mountHandoff(s)
	s.instance = s.handoff.Instance()
	s.gate.instance = s.instance
	s.installOpen()
	s.srv = &fasthttp.Server{
		Handler: s.serve,
		Name:    "te-sidecar",
		// The request line and headers, from accept or from the first
		// byte; the body gets ReadTimeout from there (HeaderReceived).
		ReadTimeout:  cfg.HeaderTimeout,
		WriteTimeout: cfg.WriteTimeout,
		IdleTimeout:  cfg.IdleTimeout,
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: cfg.ReadTimeout}
		},
		// Bodies are read by the handlers, with each route's limit
		// (ReadBody), so that an oversized one gets a 413 it can read.
		StreamRequestBody:  true,
		ExpectHandler:      s.expect,
		MaxRequestBodySize: max(cfg.MaxValue, s.handoffMaxBody()),
		// The gate bounds connections; fasthttp's own bound only has to
		// leave room for the workers of connections the gate just closed.
		Concurrency: 2 * cfg.MaxConns,
		// Room for a request line with the longest key, escaped.
		ReadBufferSize:  4*MaxKeyLen + 4096,
		NoDefaultDate:   true,
		CloseOnShutdown: true,
		Logger:          fasthttpLogger{cfg.Logger},
		ErrorHandler:    s.requestError,
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
// handler; the route needs the token when the server has a secret, takes
// no query parameters and is documented with a summary only. Use Route to
// describe it. Requests are counted and timed per path. A handler reads
// the request body with ReadBody.
func (s *Server) Handle(method, path string, h fasthttp.RequestHandler) {
	s.Route(api.Route{Method: method, Path: path, Handler: h, Summary: strings.ToUpper(method) + " " + path})
}

// Route installs r, replacing any earlier route with its method and path.
// Query parameters r does not declare are refused with 400 before its
// handler runs.
func (s *Server) Route(r api.Route) {
	r.Method = strings.ToUpper(r.Method)
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.routes[r.Path]
	if m == nil {
		m = map[string]*api.Route{}
		s.routes[r.Path] = m
	}
	m[r.Method] = &r
	s.openapi = nil
}

// Routes returns the routes served, sorted by path and method.
func (s *Server) Routes() []api.Route {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []api.Route
	for _, m := range s.routes {
		for _, r := range m {
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b api.Route) int {
		return cmp.Or(cmp.Compare(a.Path, b.Path), cmp.Compare(a.Method, b.Method))
	})
	return out
}

// limit is the largest body of route r.
func (s *Server) limit(r *api.Route) int {
	if r.Auth == api.Metadata {
		return s.cfg.MaxValue
	}
	return s.handoffMaxBody()
}

func (s *Server) route(path, method string) (map[string]*api.Route, *api.Route) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m := s.routes[path]
	r := m[method]
	if r == nil && method == "HEAD" {
		r = m["GET"]
	}
	return m, r
}

// expect answers "Expect: 100-continue" before the body is sent: a request
// without its token or with a body over its route's limit is refused at once
// (401, 413), so the client never sends the body.
func (s *Server) expect(ctx *fasthttp.RequestCtx) int {
	_, r := s.route(string(ctx.Path()), string(ctx.Method()))
	status, reason := fasthttp.StatusContinue, ""
	switch {
	case r == nil:
		return fasthttp.StatusContinue // the handler answers 404 or 405
	case s.unauthorized(ctx, r.Auth) != "":
		s.refused.Inc("unauthenticated")
		status, reason = fasthttp.StatusUnauthorized, s.unauthorized(ctx, r.Auth)
		ctx.Response.Header.Set("WWW-Authenticate", "Bearer")
	case ctx.Request.Header.ContentLength() > s.limit(r):
		s.refused.Inc("too_large")
		status = fasthttp.StatusRequestEntityTooLarge
		reason = fmt.Sprintf("request body of %d bytes is over the limit of %d", ctx.Request.Header.ContentLength(), s.limit(r))
	default:
		return fasthttp.StatusContinue
	}
	s.refuse(ctx, status, codeOf(status), reason)
	s.refusals.note(r.Path, r.Method, ctx.RemoteAddr().String(), status, reason)
	return status
}

// The reasons of a 401. They say which of the three it is (no token, a
// header that is not a bearer token, a token that matches none this route
// accepts) and nothing about the token itself: not its length, not how
// much of it matched.
const (
	noToken       = "unauthenticated: no token: this route needs Authorization: Bearer <token> (see te-sidecar -h)"
	notBearer     = "unauthenticated: the Authorization header is not \"Bearer <token>\" (see te-sidecar -h)"
	wrongToken    = "unauthenticated: the bearer token does not match this sidecar's cluster secret (made from another secret, or a client token for another X-Te-Client; see te-sidecar -h)"
	wrongMetadata = "unauthenticated: the bearer token is neither the cluster secret's nor -metadata-token (see te-sidecar -h)"
)

// clientKey is the request's user value holding the client name its
// token proved.
const clientKey = "te.client"

func (s *Server) serve(ctx *fasthttp.RequestCtx) {
	t0 := time.Now()
	path := string(ctx.Path())
	method := string(ctx.Method())
	m, r := s.route(path, method)
	label := path
	var reason string
	switch {
	case m == nil:
		label = "other" // unbounded paths must not become label values
		reason = fmt.Sprintf("no route %s", truncate(path, 200))
		s.refused.Inc("not_found")
		s.refuse(ctx, fasthttp.StatusNotFound, errs.NotFound, reason)
	case r == nil:
		methods := make([]string, 0, len(m))
		for k := range m {
			methods = append(methods, k)
		}
		sort.Strings(methods)
		allow := strings.Join(methods, ", ")
		reason = fmt.Sprintf("%s takes %s, not %s", path, allow, truncate(method, 20))
		s.refused.Inc("method")
		s.refuse(ctx, fasthttp.StatusMethodNotAllowed, errs.InvalidArgument, reason)
		ctx.Response.Header.Set("Allow", allow)
	case s.unauthorized(ctx, r.Auth) != "":
		reason = s.unauthorized(ctx, r.Auth)
		s.refused.Inc("unauthenticated")
		s.refuse(ctx, fasthttp.StatusUnauthorized, errs.Unauthenticated, reason)
		ctx.Response.Header.Set("WWW-Authenticate", "Bearer")
	default:
		if r.Auth != api.Open {
			s.gate.authenticated(ctx.Conn())
		}
		if bad := undeclared(ctx, r); bad != "" {
			reason = bad
			s.refused.Inc("bad_request")
			s.refuse(ctx, fasthttp.StatusBadRequest, errs.InvalidArgument, reason)
			break
		}
		r.Handler(ctx)
	}
	if r == nil {
		method = "other"
	} else {
		label = r.Path
	}
	code := ctx.Response.StatusCode()
	s.requests.Inc(label, method, strconv.Itoa(code))
	s.duration.Observe(time.Since(t0).Seconds(), label, method)
	switch {
	case refusal(code):
		if reason == "" {
			reason = bodyError(ctx.Response.Body())
		}
		s.refusals.note(label, method, ctx.RemoteAddr().String(), code, reason)
	case code >= 500:
		s.log.Warn("request failed", "route", label, "method", method, "code", code, "source", ctx.RemoteAddr().String(),
			"reason", bodyError(ctx.Response.Body()))
	case s.log.Enabled(context.Background(), slog.LevelDebug):
		s.log.Debug("request", "route", label, "method", method, "code", code, "source", ctx.RemoteAddr().String(),
			"duration", time.Since(t0))
	}
}

// refusal reports whether status refuses a caller for who it is or what it
// holds: these are logged (rate-limited) as they happen.
func refusal(status int) bool {
	switch status {
	case fasthttp.StatusUnauthorized, fasthttp.StatusForbidden, fasthttp.StatusRequestEntityTooLarge,
		fasthttp.StatusTooManyRequests, fasthttp.StatusServiceUnavailable:
		return true
	}
	return false
}

// bodyError is the message of a JSON error body.
func bodyError(b []byte) string {
	var e proto.ErrorBody
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	return e.Error
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:n]) + "..."
}

// undeclared returns why the request's query is refused: a parameter the
// route does not declare, or one given twice.
func undeclared(ctx *fasthttp.RequestCtx, r *api.Route) string {
	seen := map[string]bool{}
	for k := range ctx.QueryArgs().All() {
		name := string(k)
		switch {
		case !r.Declares(name):
			bad := fmt.Sprintf("unknown query parameter %s", truncate(name, 64))
			if len(r.Query) == 0 {
				return bad + fmt.Sprintf(": %s %s takes none", r.Method, r.Path)
			}
			names := make([]string, len(r.Query))
			for i, p := range r.Query {
				names[i] = p.Name
			}
			return bad + fmt.Sprintf(": %s %s takes %s", r.Method, r.Path, strings.Join(names, ", "))
		case seen[name]:
			return fmt.Sprintf("query parameter %q given twice", name)
		}
		seen[name] = true
	}
	return ""
}

// unauthorized checks the request's bearer token for access a. A client
// token for the name in X-Te-Client is accepted wherever the cluster token
// is, and records that name as the request's client (for quotas).
// It returns why the request may not use the route, "" when it may.
func (s *Server) unauthorized(ctx *fasthttp.RequestCtx, a api.Auth) string {
	want, wrong := s.tokens, wrongToken
	switch a {
	case api.Open:
		return ""
	case api.Metadata:
		want = s.mdToken
		if s.cfg.Token != "" {
			wrong = wrongMetadata
		}
	}
	header := ctx.Request.Header.Peek("Authorization")
	got, ok := strings.CutPrefix(string(header), "Bearer ")
	if s.cfg.Secret != nil && ok {
		if name, valid := clientName(ctx); valid && name != "" && authsecret.Match(got, s.cfg.Secret.ClientTokens(name)) {
			ctx.SetUserValue(clientKey, name)
			return ""
		}
	}
	switch {
	case len(want) == 0:
		return ""
	case len(header) == 0:
		return noToken
	case !ok || got == "":
		return notBearer
	case !authsecret.Match(got, want):
		return wrong
	}
	return ""
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

// Client names the caller for its handoff quotas, with an identity the
// caller cannot choose per request: the name its client token proved
// ("client:NAME", see authsecret.ClientToken), else its source host
// ("host:ADDR"). A host is an IPv4 address, an IPv6 /64 (what one host
// can pick addresses from), or "local" for every loopback address (a
// process on this host can bind any of 127.0.0.0/8). X-Te-Client without
// its client token is ignored here.
func (s *Server) Client(ctx *fasthttp.RequestCtx) string {
	if name, ok := ctx.UserValue(clientKey).(string); ok {
		return "client:" + name
	}
	return "host:" + hostOf(ctx.RemoteAddr())
}

// hostOf is the quota host of a remote address.
func hostOf(a net.Addr) string {
	ip, ok := addrOf(a)
	switch {
	case !ok:
		return "unknown"
	case ip.IsLoopback():
		return "local"
	case ip.Is6():
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// clientName returns X-Te-Client, and whether it is a usable name (at most
// 256 bytes, no control characters).
func clientName(ctx *fasthttp.RequestCtx) (string, bool) {
	name := string(ctx.Request.Header.Peek(proto.ClientHeader))
	if len(name) > 256 || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return "", false
	}
	return name, true
}

// Health is the answer of GET /healthz.
type Health struct {
	Status        string  `json:"status"` // ok, or draining once shutting down (with 503)
	Version       string  `json:"version"`
	Instance      string  `json:"instance"`
	UptimeSeconds float64 `json:"uptime_seconds"`
}

// installOpen installs the routes open to all.
func (s *Server) installOpen() {
	s.Route(api.Route{Method: "GET", Path: "/healthz", Auth: api.Open, Tag: "operations",
		Summary:     "Liveness and readiness",
		Description: "200 while serving, 503 with status draining once shutting down (load balancers stop sending before the listener closes).",
		Answer:      reflect.TypeFor[Health](), Handler: s.healthz})
	s.Route(api.Route{Method: "GET", Path: "/metrics", Auth: api.Open, Tag: "operations",
		Summary: "Prometheus metrics", Description: "The text exposition format, version 0.0.4: counts, sizes and the build, never keys, descriptors or transfer ids.",
		AnswerType: "text/plain; version=0.0.4", Handler: s.serveMetrics})
	s.Route(api.Route{Method: "GET", Path: "/openapi.json", Auth: api.Open, Tag: "operations",
		Summary: "This API as an OpenAPI 3.0 document", AnswerType: "application/json", Handler: s.serveOpenAPI})
}

func (s *Server) healthz(ctx *fasthttp.RequestCtx) {
	h := Health{Status: "ok", Version: s.cfg.Version, Instance: s.instance, UptimeSeconds: math.Round(time.Since(s.start).Seconds()*1000) / 1000}
	if s.draining.Load() {
		h.Status = "draining"
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
	b, _ := json.Marshal(h)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

func (s *Server) serveMetrics(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	s.metrics.WriteTo(ctx)
	writeProcessMetrics(ctx)
}

// OpenAPI returns the OpenAPI 3.0 document of the routes served.
func (s *Server) OpenAPI() []byte {
	s.mu.RLock()
	doc := s.openapi
	s.mu.RUnlock()
	if doc != nil {
		return doc
	}
	doc, err := api.Document(s.apiInfo(), s.Routes())
	if err != nil {
		s.log.Error("building the OpenAPI document", "err", err)
		return nil
	}
	s.mu.Lock()
	s.openapi = doc
	s.mu.Unlock()
	return doc
}

func (s *Server) serveOpenAPI(ctx *fasthttp.RequestCtx) {
	doc := s.OpenAPI()
	if doc == nil {
		s.refuse(ctx, fasthttp.StatusInternalServerError, errs.Internal, "the OpenAPI document could not be built")
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(doc)
}

// Serve serves on ln until Shutdown; it returns nil after a shutdown.
// Connections are admitted through the server's connection bounds
// (MaxConns, MaxConnsPerIP, ReservedConns, MaxPendingConnsPerIP).
func (s *Server) Serve(ln net.Listener) error {
	s.addr.Store(ln.Addr().String())
	if err := s.srv.Serve(&listener{Listener: ln, g: s.gate}); err != nil {
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

// requestError answers a request fasthttp could not read, in JSON.
func (s *Server) requestError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	status, reason, msg := fasthttp.StatusBadRequest, "bad_request", "malformed request"
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status, reason, msg = fasthttp.StatusRequestEntityTooLarge, "too_large", "request body too large"
	case errors.As(err, &small):
		status, reason, msg = fasthttp.StatusRequestHeaderFieldsTooLarge, "bad_request", "request line or headers too large"
	case errors.As(err, &ne) && ne.Timeout():
		status, reason, msg = fasthttp.StatusRequestTimeout, "timeout", "request not received in time"
	}
	s.refused.Inc(reason)
	s.refuse(ctx, status, codeOf(status), msg)
}

type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Warn("http server", "msg", strings.TrimSpace(fmt.Sprintf(format, args...)))
}
