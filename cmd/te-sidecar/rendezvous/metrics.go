package rendezvous

import (
	"github.com/tecache/te/kvcache/handoff/proto"

	"strings"
	"time"

	"github.com/tecache/te/internal/errs"
)

// Registry is where the handoff registers its metrics: te-sidecar's
// registry satisfies it through a small adapter.
type Registry interface {
	Counter(name, help string, labels ...string) Adder
	Gauge(name, help string, labels ...string) Adder
	Histogram(name, help string, buckets []float64, labels ...string) Observer
	GaugeFunc(name, help string, f func() float64)
}

// Adder is a counter or gauge family.
type Adder interface {
	Add(v float64, labelValues ...string)
}

// Observer is a histogram family.
type Observer interface {
	Observe(v float64, labelValues ...string)
}

// Buckets for handoff latencies in seconds: a few KiB over loopback to
// gigabytes over a slow network, and timeouts.
var Buckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

type metricSet struct {
	states    Adder    // te_handoff_transfers_held{state}
	ends      Adder    // te_handoff_transfers_total{mode,state}
	bytes     Adder    // te_handoff_bytes_total{mode}
	requests  Adder    // te_handoff_requests_total{mode}
	failures  Adder    // te_handoff_failures_total{reason}
	rejects   Adder    // te_handoff_rejected_total{reason}
	pairWait  Observer // te_handoff_pair_wait_seconds
	transfer  Observer // te_handoff_transfer_seconds{mode}
	move      Observer // te_handoff_move_seconds{mode}
	endToEnd  Observer // te_handoff_seconds{mode,state}
	hasStates bool
}

func newMetricSet(reg Registry, t *Table) *metricSet {
	if reg == nil {
		return &metricSet{}
	}
	m := &metricSet{
		states: reg.Gauge("te_handoff_transfers_held", "Handoff transfers held by the sidecar, by state (finished ones stay for the retention time).", "state"),
		ends:   reg.Counter("te_handoff_transfers_total", "Handoff transfers that reached a final state, by mode and state.", "mode", "state"),
		bytes:  reg.Counter("te_handoff_bytes_total", "Bytes moved by completed handoff transfers, as their movers report.", "mode"),
		requests: reg.Counter("te_handoff_requests_total",
			"Engine requests (after coalescing) submitted by completed handoff transfers.", "mode"),
		failures: reg.Counter("te_handoff_failures_total",
			"Handoff transfers that did not complete, by reason: expired_unpaired, expired_moving, evicted (unpaired, to make room), aborted_by_prefill, aborted_by_decode, mismatch, or the mover's error code.", "reason"),
		rejects: reg.Counter("te_handoff_rejected_total",
			"Handoff requests refused, by reason: invalid, duplicate, conflict, not_found (an unknown id, or a capability that is not the transfer's: "+
				"both answer 404), capability (the other side's, or not the mover's: 403), client_quota (429), full (503), too_large (413), busy (503).", "reason"),
		pairWait: reg.Histogram("te_handoff_pair_wait_seconds", "Time from a transfer's first declaration to its second.", Buckets),
		transfer: reg.Histogram("te_handoff_transfer_seconds", "Time from pairing to the mover's completion, by mode.", Buckets, "mode"),
		move:     reg.Histogram("te_handoff_move_seconds", "Time the mover spent moving bytes, as it reports, by mode.", Buckets, "mode"),
		endToEnd: reg.Histogram("te_handoff_seconds", "Time from a transfer's first declaration to its final state, by mode and state.", Buckets, "mode", "state"),
	}
	reg.GaugeFunc("te_handoff_declaration_bytes", "Memory held by the declarations of live handoff transfers (estimated).",
		func() float64 { return float64(t.Usage().Bytes) })
	reg.GaugeFunc("te_handoff_clients", "Clients holding declarations of live handoff transfers.",
		func() float64 { return float64(t.Usage().Clients) })
	reg.GaugeFunc("te_handoff_long_polls", "GET /handoff/wait requests waiting.",
		func() float64 { return float64(t.Usage().LongPolls) })
	m.hasStates = true
	for _, s := range proto.States {
		m.states.Add(0, string(s)) // every state shows, at 0
	}
	return m
}

func (m *metricSet) enter(s proto.State) {
	if m.hasStates {
		m.states.Add(1, string(s))
	}
}

func (m *metricSet) leave(s proto.State) {
	if m.hasStates {
		m.states.Add(-1, string(s))
	}
}

func (m *metricSet) paired(d time.Duration) {
	if m.hasStates {
		m.pairWait.Observe(d.Seconds())
	}
}

// ended counts a transfer that reached a final state from state from.
func (m *metricSet) ended(r *rec, from proto.State) {
	if !m.hasStates {
		return
	}
	mode := string(r.mode)
	if mode == "" {
		mode = "unknown"
	}
	m.ends.Add(1, mode, string(r.state))
	m.endToEnd.Observe(r.ended.Sub(r.created).Seconds(), mode, string(r.state))
	if from == proto.Transferring && (r.state == proto.Done || r.state == proto.Failed) {
		m.transfer.Observe(r.ended.Sub(r.paired).Seconds(), mode)
	}
	switch r.state {
	case proto.Done:
		return
	case proto.Expired:
		if r.code == errs.ResourceExhausted {
			m.failures.Add(1, "evicted")
		} else if from == proto.Waiting {
			m.failures.Add(1, "expired_unpaired")
		} else {
			m.failures.Add(1, "expired_moving")
		}
	case proto.Aborted:
		by := "client"
		if r.abortBy != "" {
			by = string(r.abortBy)
		}
		m.failures.Add(1, "aborted_by_"+by)
	case proto.Failed:
		if from == proto.Waiting {
			m.failures.Add(1, "mismatch")
		} else {
			m.failures.Add(1, strings.ReplaceAll(r.code.String(), " ", "_"))
		}
	}
}

// completed counts what a mover reported for a completed transfer.
func (m *metricSet) completed(mode proto.Mode, c proto.Complete) {
	if !m.hasStates || !c.OK {
		return
	}
	m.bytes.Add(float64(c.Bytes), string(mode))
	m.requests.Add(float64(c.Requests), string(mode))
	if c.Seconds > 0 {
		m.move.Observe(c.Seconds, string(mode))
	}
}

func (m *metricSet) rejected(e *Refusal) {
	if !m.hasStates {
		return
	}
	reason := "invalid"
	switch {
	case e.kind != "":
		reason = e.kind
	case e.Status == 404:
		reason = "not_found"
	case e.Status == 503:
		reason = "full"
	case e.Status == 413:
		reason = "too_large"
	case e.Status == 409 && e.Code == errs.InvalidArgument:
		reason = "duplicate"
	case e.Status == 409:
		reason = "conflict"
	}
	m.rejects.Add(1, reason)
}
