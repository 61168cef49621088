package rendezvous

import (
	"github.com/tecache/te/kvcache/handoff/proto"

	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tecache/te/internal/errs"
)

// Mux is where the routes go: te-sidecar's *sidecar.Server satisfies it.
type Mux interface {
	Handle(method, path string, h fasthttp.RequestHandler)
	// ReadBody reads the request's body, at most limit bytes. On failure it
	// returns the HTTP status and a message for the caller (413 for a body
	// over limit, which it has drained so the client reads the answer).
	ReadBody(ctx *fasthttp.RequestCtx, limit int) ([]byte, int, error)
	// Client names the caller for its quotas.
	Client(ctx *fasthttp.RequestCtx) string
}

// Service is the rendezvous mounted on an HTTP server.
type Service struct {
	*Table
	mux Mux
}

// Mount installs the handoff routes on mux and registers the metrics in reg
// (may be nil):
//
//	POST /handoff/expect    decode declares where the KV goes (Decl)
//	POST /handoff/ready     prefill declares the KV is ready (Decl)
//	POST /handoff/complete  the mover reports the outcome (Complete)
//	POST /handoff/abort     either side gives up (Abort)
//	GET  /handoff/status?id=ID[&role=R]
//	GET  /handoff/wait?id=ID&since=VERSION&timeout_ms=MS[&role=R]
//
// A declaration's answer carries the side's capability; complete, abort,
// status and wait need it in CapabilityHeader. Every answer is JSON and
// carries the sidecar's instance (a Record on success, an ErrorBody with
// code and message on 4xx/5xx). Long polls end when the server shuts down.
func Mount(mux Mux, reg Registry, cfg Config) *Service {
	s := &Service{Table: NewTable(cfg, reg), mux: mux}
	mux.Handle("POST", "/handoff/expect", func(ctx *fasthttp.RequestCtx) { s.declare(ctx, proto.Decode) })
	mux.Handle("POST", "/handoff/ready", func(ctx *fasthttp.RequestCtx) { s.declare(ctx, proto.Prefill) })
	mux.Handle("POST", "/handoff/complete", s.complete)
	mux.Handle("POST", "/handoff/abort", s.abort)
	mux.Handle("GET", "/handoff/status", s.status)
	mux.Handle("GET", "/handoff/wait", s.wait)
	return s
}

func (s *Service) reply(ctx *fasthttp.RequestCtx, r proto.Record, e *Refusal) {
	ctx.Response.Header.Set(proto.InstanceHeader, s.instance)
	ctx.SetContentType("application/json")
	var b []byte
	if e != nil {
		ctx.SetStatusCode(e.Status)
		b, _ = json.Marshal(proto.ErrorBody{Instance: s.instance, Error: e.Msg, Code: int32(e.Code), Record: e.Record})
	} else {
		b, _ = json.Marshal(r)
	}
	ctx.SetBody(b)
}

// decode reads the JSON body into v.
func (s *Service) decode(ctx *fasthttp.RequestCtx, v any) *Refusal {
	body, status, err := s.mux.ReadBody(ctx, s.cfg.MaxBody)
	if err != nil {
		code := errs.InvalidArgument
		switch status {
		case http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable:
			code = errs.ResourceExhausted
		}
		e := refuse(status, code, "%v", err)
		if status == http.StatusServiceUnavailable {
			e.kind = "busy"
		}
		return e
	}
	if len(body) == 0 {
		return refuse(http.StatusBadRequest, errs.InvalidArgument, "empty body: a JSON object is expected")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return refuse(http.StatusBadRequest, errs.InvalidArgument, "malformed JSON body: %v", err)
	}
	return nil
}

func capability(ctx *fasthttp.RequestCtx) string {
	return string(ctx.Request.Header.Peek(proto.CapabilityHeader))
}

func (s *Service) declare(ctx *fasthttp.RequestCtx, role proto.Role) {
	serveBody(s, ctx, func(d proto.Decl) (proto.Record, *Refusal) { return s.Declare(role, d, s.mux.Client(ctx)) })
}

func (s *Service) complete(ctx *fasthttp.RequestCtx) {
	serveBody(s, ctx, func(c proto.Complete) (proto.Record, *Refusal) { return s.Complete(c, capability(ctx)) })
}

func (s *Service) abort(ctx *fasthttp.RequestCtx) {
	serveBody(s, ctx, func(a proto.Abort) (proto.Record, *Refusal) { return s.Abort(a, capability(ctx)) })
}

// serveBody decodes a route's JSON body into a T and answers with what do
// makes of it; a body that does not decode is refused and counted.
func serveBody[T any](s *Service, ctx *fasthttp.RequestCtx, do func(T) (proto.Record, *Refusal)) {
	var v T
	if e := s.decode(ctx, &v); e != nil {
		s.m.rejected(e)
		s.reply(ctx, proto.Record{}, e)
		return
	}
	r, e := do(v)
	s.reply(ctx, r, e)
}

func query(ctx *fasthttp.RequestCtx) (id string, role proto.Role, e *Refusal) {
	q := ctx.QueryArgs()
	id = string(q.Peek("id"))
	role = proto.Role(q.Peek("role"))
	switch role {
	case "", proto.Prefill, proto.Decode:
	default:
		return "", "", refuse(http.StatusBadRequest, errs.InvalidArgument, "role %q is neither prefill nor decode", role)
	}
	return id, role, checkID(id)
}

func (s *Service) status(ctx *fasthttp.RequestCtx) {
	id, role, e := query(ctx)
	if e != nil {
		s.reply(ctx, proto.Record{}, e)
		return
	}
	r, e := s.Status(id, capability(ctx), role)
	s.reply(ctx, r, e)
}

func (s *Service) wait(ctx *fasthttp.RequestCtx) {
	id, role, e := query(ctx)
	if e != nil {
		s.reply(ctx, proto.Record{}, e)
		return
	}
	q := ctx.QueryArgs()
	num := func(name string) (uint64, *Refusal) {
		v := q.Peek(name)
		if len(v) == 0 {
			return 0, nil
		}
		n, err := strconv.ParseUint(string(v), 10, 63)
		if err != nil {
			return 0, refuse(http.StatusBadRequest, errs.InvalidArgument, "%s=%q is not a non-negative integer", name, v)
		}
		return n, nil
	}
	since, e := num("since")
	if e != nil {
		s.reply(ctx, proto.Record{}, e)
		return
	}
	ms, e := num("timeout_ms")
	if e != nil {
		s.reply(ctx, proto.Record{}, e)
		return
	}
	timeout := time.Duration(min(ms, uint64(s.cfg.MaxWait/time.Millisecond))) * time.Millisecond
	r, e := s.Wait(id, capability(ctx), role, since, timeout, ctx.Done())
	s.reply(ctx, r, e)
}
