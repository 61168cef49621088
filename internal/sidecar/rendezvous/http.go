package rendezvous

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tecache/te/engine/errs"
)

// InstanceHeader carries the sidecar instance on every handoff answer.
const InstanceHeader = "X-Te-Sidecar-Instance"

// Mux is where the routes go: te-sidecar's *sidecar.Server satisfies it.
type Mux interface {
	Handle(method, path string, h fasthttp.RequestHandler)
}

// Service is the rendezvous mounted on an HTTP server.
type Service struct {
	*Table
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
// Every answer is JSON and carries the sidecar's instance (a Record on
// success, an ErrorBody with code and message on 4xx/5xx). Long polls end
// when the server shuts down.
func Mount(mux Mux, reg Registry, cfg Config) *Service {
	s := &Service{NewTable(cfg, reg)}
	mux.Handle("POST", "/handoff/expect", func(ctx *fasthttp.RequestCtx) { s.declare(ctx, Decode) })
	mux.Handle("POST", "/handoff/ready", func(ctx *fasthttp.RequestCtx) { s.declare(ctx, Prefill) })
	mux.Handle("POST", "/handoff/complete", s.complete)
	mux.Handle("POST", "/handoff/abort", s.abort)
	mux.Handle("GET", "/handoff/status", s.status)
	mux.Handle("GET", "/handoff/wait", s.wait)
	return s
}

func (s *Service) reply(ctx *fasthttp.RequestCtx, r Record, e *Refusal) {
	ctx.Response.Header.Set(InstanceHeader, s.instance)
	ctx.SetContentType("application/json")
	var b []byte
	if e != nil {
		ctx.SetStatusCode(e.Status)
		b, _ = json.Marshal(ErrorBody{Instance: s.instance, Error: e.Msg, Code: int32(e.Code), Record: e.Record})
	} else {
		b, _ = json.Marshal(r)
	}
	ctx.SetBody(b)
}

// decode parses the JSON body into v.
func decode(ctx *fasthttp.RequestCtx, v any) *Refusal {
	body := ctx.PostBody()
	if len(body) == 0 {
		return refuse(http.StatusBadRequest, errs.InvalidArgument, "empty body: a JSON object is expected")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return refuse(http.StatusBadRequest, errs.InvalidArgument, "malformed JSON body: %v", err)
	}
	return nil
}

func (s *Service) declare(ctx *fasthttp.RequestCtx, role Role) {
	var d Decl
	if e := decode(ctx, &d); e != nil {
		s.m.rejected(e)
		s.reply(ctx, Record{}, e)
		return
	}
	r, e := s.Declare(role, d)
	s.reply(ctx, r, e)
}

func (s *Service) complete(ctx *fasthttp.RequestCtx) {
	var c Complete
	if e := decode(ctx, &c); e != nil {
		s.m.rejected(e)
		s.reply(ctx, Record{}, e)
		return
	}
	r, e := s.Complete(c)
	s.reply(ctx, r, e)
}

func (s *Service) abort(ctx *fasthttp.RequestCtx) {
	var a Abort
	if e := decode(ctx, &a); e != nil {
		s.m.rejected(e)
		s.reply(ctx, Record{}, e)
		return
	}
	r, e := s.Abort(a)
	s.reply(ctx, r, e)
}

func query(ctx *fasthttp.RequestCtx) (id string, role Role, e *Refusal) {
	q := ctx.QueryArgs()
	id = string(q.Peek("id"))
	role = Role(q.Peek("role"))
	switch role {
	case "", Prefill, Decode:
	default:
		return "", "", refuse(http.StatusBadRequest, errs.InvalidArgument, "role %q is neither prefill nor decode", role)
	}
	return id, role, checkID(id)
}

func (s *Service) status(ctx *fasthttp.RequestCtx) {
	id, role, e := query(ctx)
	if e != nil {
		s.reply(ctx, Record{}, e)
		return
	}
	r, e := s.Status(id, role)
	s.reply(ctx, r, e)
}

func (s *Service) wait(ctx *fasthttp.RequestCtx) {
	id, role, e := query(ctx)
	if e != nil {
		s.reply(ctx, Record{}, e)
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
		s.reply(ctx, Record{}, e)
		return
	}
	ms, e := num("timeout_ms")
	if e != nil {
		s.reply(ctx, Record{}, e)
		return
	}
	timeout := time.Duration(min(ms, uint64(s.cfg.MaxWait/time.Millisecond))) * time.Millisecond
	r, e := s.Wait(id, role, since, timeout, ctx.Done())
	s.reply(ctx, r, e)
}
