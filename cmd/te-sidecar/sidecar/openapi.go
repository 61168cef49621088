package sidecar

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/tecache/te/cmd/te-sidecar/api"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache"
	"github.com/tecache/te/kvcache/handoff/proto"
)

// OpenRoutes names the routes that answer without a token, as -h, the log
// and the OpenAPI document say it; TestOpenRoutes checks it against the
// route table.
const OpenRoutes = "/healthz, /metrics, /openapi.json and /metadata/proof"

// Answered are the codes the sidecar's refusals carry, in the order the
// document lists them; TestAnsweredCodes checks that every code the source
// refuses with, and every status codeOf maps, is one of them.
var Answered = []errs.Code{errs.InvalidArgument, errs.Timeout, errs.Closed, errs.Internal, errs.NotFound,
	errs.Unauthenticated, errs.ResourceExhausted}

// answeredCodes lists Answered as "1 invalid argument, 8 timeout, ...",
// numbers and names from internal/errs.
func answeredCodes() string {
	parts := make([]string, len(Answered))
	for i, c := range Answered {
		parts[i] = fmt.Sprintf("%d %s", int32(c), c)
	}
	return strings.Join(parts, ", ")
}

// apiInfo describes the document's types beyond what their Go types say.
func (s *Server) apiInfo() api.Info {
	states := make([]string, len(proto.States))
	for i, st := range proto.States {
		states[i] = string(st)
	}
	return api.Info{
		Title:   "te-sidecar",
		Version: s.cfg.Version,
		Description: "te's per-pod daemon: the prefill-to-decode handoff rendezvous, Mooncake's HTTP metadata protocol, " +
			"health and Prometheus metrics. With a cluster secret every route but " + OpenRoutes + " needs " +
			"Authorization: Bearer <token>. Every refusal is a JSON ErrorBody with a stable code (te's error codes: " +
			answeredCodes() + "). Bodies are decoded strictly: " +
			"an unknown field is refused by name, and so is a query parameter a route does not declare.",
		Error: reflect.TypeFor[proto.ErrorBody](),
		Enums: map[reflect.Type][]string{
			reflect.TypeFor[proto.State](): states,
			reflect.TypeFor[proto.Mode]():  {string(proto.Push), string(proto.Pull)},
			reflect.TypeFor[proto.Role]():  {string(proto.Prefill), string(proto.Decode)},
		},
		Raw: map[string]reflect.Type{"layout": reflect.TypeFor[kvcache.Layout]()},
		Fields: map[string]string{
			"Decl.id":               "The transfer id both sides declare (1..256 printable bytes).",
			"Decl.segment":          "The declaring side's engine segment name, which the mover opens.",
			"Decl.layout":           "The side's KV cache layout, with the base address of each layer.",
			"Decl.blocks":           "Block ids: prefill's sources, decode's destinations (distinct), in transfer order.",
			"Decl.mode":             "push (prefill writes; default) or pull (decode reads); set by decode.",
			"Decl.timeout_ms":       "Unpaired or unfinished by then, the transfer expires (0: the sidecar's default, 30s).",
			"Decl.window":           "The key of the engine window granted over the side's blocks; only the mover receives it.",
			"Record.version":        "Grows with every change: GET /handoff/wait?since=V answers once it exceeds V.",
			"Record.settled":        "The mover is known not to touch either side's memory any more: blocks may be reused.",
			"Record.capability":     "In the answer to a declaration only: the side's capability, for X-Te-Capability.",
			"Record.peer":           "The other side's declaration, for the mover once paired.",
			"Record.mover":          "The mover's segment name, for both sides once paired: the other side binds its window to it.",
			"Record.code":           "te's error code of a failed, aborted or expired transfer.",
			"Record.instance":       "The sidecar's instance (random per start): another one means the transfer was lost.",
			"ErrorBody.code":        "te's error code: " + answeredCodes() + ".",
			"ErrorBody.record":      "The transfer's record when the request conflicted with its state (409).",
			"Complete.ok":           "Whether the mover moved every byte.",
			"Complete.code":         "te's error code of the mover's failure.",
			"Layout.format":         "vllm, flashinfer, mla or sglang.",
			"Layout.order":          "NHD or HND.",
			"Layout.dtype":          "The element type: fp16, bf16, fp8_e4m3, fp8_e5m2 or fp32.",
			"Layout.bases":          "One address per layer for formats that keep a layer in one tensor.",
			"Layout.k_bases":        "The K tensors' addresses per layer, when K and V are separate.",
			"Layout.v_bases":        "The V tensors' addresses per layer, when K and V are separate.",
			"MetadataAnswer.status": "updated or deleted.",
			"Health.status":         "ok, or draining (with 503) once shutting down.",
			"Health.uptime_seconds": "Seconds since the sidecar started.",
			"Health.instance":       "The sidecar's instance, as in every handoff answer.",
		},
	}
}
