package rendezvous

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tecache/te/cmd/te-sidecar/api"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache/handoff/proto"
)

// Mux is where the routes go: te-sidecar's *sidecar.Server satisfies it.
type Mux interface {
	// Route installs a route; the mux refuses query parameters it does not
	// declare.
	Route(r api.Route)
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

// The query parameters of the handoff routes.
var (
	idParam   = api.Param{Name: "id", Required: true, Description: "The transfer id (1..256 printable bytes)."}
	roleParam = api.Param{Name: "role", Enum: []string{string(proto.Prefill), string(proto.Decode)},
		Description: "The side the caller claims to be; refused with 403 when its capability is the other side's."}
	sinceParam = api.Param{Name: "since", Type: "integer",
		Description: "Answer once the transfer's version exceeds this (0: at once if it changed since it was created)."}
	timeoutParam = api.Param{Name: "timeout_ms", Type: "integer",
		Description: "Longest wait in milliseconds (capped by the sidecar, 30s by default); then the record as it is."}
	capHeader = api.Param{Name: proto.CapabilityHeader, Required: true,
		Description: "The capability the side's declaration returned."}
	clientHeader = api.Param{Name: proto.ClientHeader,
		Description: "The client's name; its quotas are kept under it when the bearer token is the client token minted for it, " +
			"else under the source host."}
)

// Routes returns the handoff routes, served by s:
//
//	POST /handoff/expect    decode declares where the KV goes (Decl)
//	POST /handoff/ready     prefill declares the KV is ready (Decl)
//	POST /handoff/complete  the mover reports the outcome (Complete)
//	POST /handoff/abort     either side gives up (Abort)
//	GET  /handoff/status?id=ID[&role=R]
//	GET  /handoff/wait?id=ID&since=VERSION&timeout_ms=MS[&role=R]
func (s *Service) Routes() []api.Route {
	rec := reflect.TypeFor[proto.Record]()
	const capNote = " Needs the side's capability in X-Te-Capability; an unknown id and a capability that is not one of " +
		"the transfer's get the same 404."
	return []api.Route{
		bodyRoute(s, "/handoff/expect", "Decode declares where a request's KV must go",
			"Decode's declaration: its segment, layout (with base addresses) and destination block ids, the mode and a timeout. "+
				"Pairs the transfer if prefill declared first. The answer carries decode's capability. Quotas are kept per client "+
				"(the name its client token proves, else its source host).",
			[]int{409, 429}, func(ctx *fasthttp.RequestCtx, d proto.Decl) (proto.Record, *Refusal) {
				return s.Declare(proto.Decode, d, s.mux.Client(ctx))
			}),
		bodyRoute(s, "/handoff/ready", "Prefill declares that the KV is ready",
			"Prefill's declaration: its segment, layout and source block ids. Pairs the transfer if decode declared first; "+
				"the mover then finds the other side's declaration in the answer's peer. The answer carries prefill's capability.",
			[]int{409, 429}, func(ctx *fasthttp.RequestCtx, d proto.Decl) (proto.Record, *Refusal) {
				return s.Declare(proto.Prefill, d, s.mux.Client(ctx))
			}),
		bodyRoute(s, "/handoff/complete", "The mover reports the outcome",
			"Accepted with the mover's capability (prefill in push mode, decode in pull mode) once the transfer is paired."+capNote,
			[]int{403, 404, 409}, func(ctx *fasthttp.RequestCtx, c proto.Complete) (proto.Record, *Refusal) {
				return s.Complete(c, capability(ctx))
			}),
		bodyRoute(s, "/handoff/abort", "Either side gives up",
			"Ends a transfer that is not finished; once paired it is settled when the mover reports or after the grace period."+capNote,
			[]int{403, 404, 409}, func(ctx *fasthttp.RequestCtx, a proto.Abort) (proto.Record, *Refusal) {
				return s.Abort(a, capability(ctx))
			}),
		{Method: "GET", Path: "/handoff/status", Tag: "handoff", Summary: "Read a transfer's state",
			Description: "The record; the mover also finds the other side's declaration in peer." + capNote,
			Query:       []api.Param{idParam, roleParam}, Headers: []api.Param{capHeader}, Answer: rec, Refusals: []int{403, 404}, Handler: s.status},
		{Method: "GET", Path: "/handoff/wait", Tag: "handoff", Summary: "Wait for a transfer to change",
			Description: "A long poll: answers once the transfer's version exceeds since, after timeout_ms, or when the sidecar shuts down." + capNote,
			Query:       []api.Param{idParam, sinceParam, timeoutParam, roleParam}, Headers: []api.Param{capHeader}, Answer: rec, Refusals: []int{403, 404}, Handler: s.wait},
	}
}

// Mount installs the handoff routes (Routes) on mux and registers the
// metrics in reg (may be nil). A declaration's answer carries the side's
// capability; complete, abort, status and wait need it in
// CapabilityHeader. Every answer is JSON and carries the sidecar's
// instance (a Record on success, an ErrorBody with code and message on
// 4xx/5xx). Long polls end when the server shuts down.
func Mount(mux Mux, reg Registry, cfg Config) *Service {
	s := &Service{Table: NewTable(cfg, reg), mux: mux}
	for _, r := range s.Routes() {
		mux.Route(r)
	}
	return s
}

// bodyRoute is a POST route whose JSON body decodes strictly into a T.
func bodyRoute[T any](s *Service, path, summary, desc string, refusals []int,
	do func(*fasthttp.RequestCtx, T) (proto.Record, *Refusal)) api.Route {
	hdr := []api.Param{capHeader}
	if path == "/handoff/expect" || path == "/handoff/ready" {
		hdr = []api.Param{clientHeader}
	}
	return api.Route{Method: "POST", Path: path, Tag: "handoff", Summary: summary, Description: desc, Headers: hdr,
		Body: reflect.TypeFor[T](), Answer: reflect.TypeFor[proto.Record](), Refusals: refusals,
		Handler: func(ctx *fasthttp.RequestCtx) {
			var v T
			if e := s.decode(ctx, &v); e != nil {
				s.m.rejected(e)
				s.reply(ctx, proto.Record{}, e)
				return
			}
			r, e := do(ctx, v)
			s.reply(ctx, r, e)
		}}
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
	if err := api.Decode(body, v); err != nil {
		return refuse(http.StatusBadRequest, errs.InvalidArgument, "%v", err)
	}
	return nil
}

func capability(ctx *fasthttp.RequestCtx) string {
	return string(ctx.Request.Header.Peek(proto.CapabilityHeader))
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
