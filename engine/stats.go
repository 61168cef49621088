package engine

import (
	"sync/atomic"

	"github.com/tecache/te/engine/transport"
)

type stats struct {
	completed, failed, timedOut, canceled atomic.Uint64
	bytes                                 atomic.Uint64
	notifiesSent, notifiesReceived        atomic.Uint64
	notifiesDuplicate                     atomic.Uint64
	refusedRecords                        atomic.Uint64 // store records that did not verify
	windowsGranted, windowsRevoked        atomic.Uint64
	windowsUnenforced                     atomic.Uint64
	strayCompletions                      atomic.Uint64
}

// Stats are an engine's counters since it started.
type Stats struct {
	Segment    string   `json:"segment"`
	Transports []string `json:"transports"`
	// Caps are the installed transports' declared capabilities.
	Caps             map[string]transport.Caps `json:"caps"`
	Buffers          int                       `json:"buffers"`
	TasksCompleted   uint64                    `json:"tasks_completed"`
	TasksFailed      uint64                    `json:"tasks_failed"`
	TasksTimedOut    uint64                    `json:"tasks_timed_out"`
	BytesTransferred uint64                    `json:"bytes_transferred"`
	NotifiesSent     uint64                    `json:"notifies_sent"`
	NotifiesReceived uint64                    `json:"notifies_received"`
	// NotifiesDuplicate counts notifications received again with an id
	// already queued (a sender's retry after a lost reply): answered ok,
	// not queued twice.
	NotifiesDuplicate uint64 `json:"notifies_duplicate"`
	// RefusedRecords counts descriptors and rpc_meta records read from the
	// store that did not verify (spec.md, "Authenticated store records").
	RefusedRecords uint64 `json:"refused_records"`
	// Windows granted and revoked (GrantWindow, GrantWindowTo); requests
	// that named a window and were refused because only transports that
	// cannot enforce one reach the peer (such a request is never carried
	// under the buffer's own key).
	WindowsGranted    uint64 `json:"windows_granted"`
	WindowsRevoked    uint64 `json:"windows_revoked"`
	WindowsUnenforced uint64 `json:"windows_unenforced"`
	// StrayCompletions counts completions a transport reported for a task
	// that was not pending under the generation it named (late or
	// duplicated: a transport bug). They are dropped; a task that reuses
	// the slot is not touched.
	StrayCompletions uint64 `json:"stray_completions"`
	// Routes says which transport served each open segment, per memory
	// class, and why better-ranked ones were passed over.
	Routes []Route `json:"routes,omitempty"`
	// Control counts the control plane's connections and every refusal
	// of a peer over a bound (internal/wire/spec.md, "Resource bounds").
	Control ControlStats `json:"control"`
	// Transport holds the counters of the transports that keep their own
	// (TransportStats): for file, io_uring (1) or the pread/pwrite pool
	// (0), and buffered_ios, the I/Os that could not go O_DIRECT; for rdma,
	// bytes, errors, retries and cooldowns per rail and NIC, and how GPU
	// memory was registered.
	Transport map[string]map[string]uint64 `json:"transport_stats,omitempty"`
	// Live is what peers cost this engine now, per transport that holds
	// per-peer resources (LiveTransports): peers known, connections
	// dialled and accepted, endpoints and queue pairs. Gauges that fall
	// back when a peer goes or restarts under its name (bench/README.md,
	// "Peer restarts").
	Live map[string]transport.Live `json:"live,omitempty"`
	// Topology is the NICs near each memory location, as the rdma
	// transport uses them (Topology); absent without it.
	Topology map[string][2][]string `json:"topology,omitempty"`
	// Stages is where batches' time went, per transport that served any
	// (te_batch_stage_seconds in WriteMetrics).
	Stages map[string]StageTimes `json:"stages,omitempty"`
}

// StageTimes adds up the stages of the batches one transport served: Submit's
// own work up to the hand-off to the transport (one per submit), the
// hand-off to the last task's end (one per settled batch), and from then
// until a waiter blocked in Wait ran again (one per such wake-up). Counts
// and total nanoseconds; a mean is a difference of two snapshots' sums over
// that of their counts.
type StageTimes struct {
	Submits    uint64 `json:"submits"`
	SubmitNS   uint64 `json:"submit_ns"`
	Transfers  uint64 `json:"transfers"`
	TransferNS uint64 `json:"transfer_ns"`
	Wakeups    uint64 `json:"wakeups"`
	WakeupNS   uint64 `json:"wakeup_ns"`
}

// ControlStats are the control plane's counters: its connections, and each
// kind of refusal of a peer that failed authentication or passed a bound.
type ControlStats struct {
	// Authenticated says whether this engine holds a cluster secret.
	Authenticated bool `json:"authenticated"`
	// ConnsOpen is the accepted connections open now, ConnsPeak the most
	// open at once, ConnsAccepted those accepted since start.
	ConnsOpen     int    `json:"conns_open"`
	ConnsPeak     int    `json:"conns_peak"`
	ConnsAccepted uint64 `json:"conns_accepted"`
	// RefusedConns and RefusedConnsPerHost count connections refused at
	// accept: the listener was at MaxConns, or the address at
	// MaxConnsPerHost.
	RefusedConns        uint64 `json:"refused_conns"`
	RefusedConnsPerHost uint64 `json:"refused_conns_per_host"`
	// AuthRefused counts accepted connections whose peer did not prove the
	// cluster secret (none, another one, a wrong proof, a replay).
	AuthRefused uint64 `json:"auth_refused"`
	// AuthFailedOutbound counts dialled peers that refused this engine or
	// could not prove the secret themselves.
	AuthFailedOutbound uint64 `json:"auth_failed_outbound"`
	// HandshakeTimeouts counts connections that did not authenticate
	// within Limits.HandshakeTimeout.
	HandshakeTimeouts uint64 `json:"handshake_timeouts"`
	// IdleClosed counts accepted connections closed after IdleTimeout;
	// PeerIdleClosed dialled ones closed after PeerIdleTimeout.
	IdleClosed     uint64 `json:"idle_closed"`
	PeerIdleClosed uint64 `json:"peer_idle_closed"`
	// SlowClosed counts connections cut because a frame header did not
	// complete within HandshakeTimeout, or a body or reply made no
	// progress (64 KiB) within ProgressTimeout.
	SlowClosed uint64 `json:"slow_closed"`
	// RefusedFrames counts connections closed for a frame over its kind's
	// limit or malformed; RefusedMooncake those opening with a Mooncake
	// handshake frame (kinds 0-3), which is not served.
	RefusedFrames   uint64 `json:"refused_frames"`
	RefusedMooncake uint64 `json:"refused_mooncake"`
	// RefusedNotifies counts notifications refused to their sender with
	// ResourceExhausted (byte budget or queue length).
	RefusedNotifies uint64 `json:"refused_notifies"`
	// NotifyBytes is the bytes charged to the notification budget now.
	NotifyBytes uint64 `json:"notify_bytes"`
	// CallsInFlight is the calls being served now; CallsThrottled counts
	// the times a connection was not read because its calls, or the
	// engine's, were at their bound.
	CallsInFlight  int64  `json:"calls_in_flight"`
	CallsThrottled uint64 `json:"calls_throttled"`
	// AcceptErrors counts failed accepts (e.g. out of file descriptors).
	AcceptErrors uint64 `json:"accept_errors"`
	// EvictedPending counts connections closed before they authenticated
	// to make room for a new one (oldest first).
	EvictedPending uint64 `json:"evicted_pending"`
	// Peers is the peers this engine keeps a dialled control connection
	// slot for, PeerConnsOpen those connections open now (ConnsOpen counts
	// the accepted ones). Gauges: a peer that goes (or restarts under its
	// name) gives its connection back, and an idle one goes after
	// Limits.PeerIdleTimeout.
	Peers         int `json:"peers"`
	PeerConnsOpen int `json:"peer_conns_open"`
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	caps := make(map[string]transport.Caps, len(e.transports))
	for _, t := range e.transports {
		caps[t.Name()] = t.Caps()
	}
	return Stats{
		Caps:              caps,
		Segment:           e.name,
		Transports:        e.Transports(),
		Buffers:           len(e.reg.Regions()),
		TasksCompleted:    e.stats.completed.Load(),
		TasksFailed:       e.stats.failed.Load() + e.stats.canceled.Load(),
		TasksTimedOut:     e.stats.timedOut.Load(),
		BytesTransferred:  e.stats.bytes.Load(),
		NotifiesSent:      e.stats.notifiesSent.Load(),
		NotifiesReceived:  e.stats.notifiesReceived.Load(),
		NotifiesDuplicate: e.stats.notifiesDuplicate.Load(),
		RefusedRecords:    e.stats.refusedRecords.Load(),

		WindowsGranted:    e.stats.windowsGranted.Load(),
		WindowsRevoked:    e.stats.windowsRevoked.Load(),
		WindowsUnenforced: e.stats.windowsUnenforced.Load(),
		StrayCompletions:  e.stats.strayCompletions.Load(),
		Routes:            e.routes(),
		Control:           e.controlStats(),
		Transport:         e.TransportStats(),
		Live:              e.LiveTransports(),
		Topology:          e.Topology(),
		Stages:            e.stageTimes(),
	}
}

func (e *Engine) controlStats() ControlStats {
	s := e.ctrl.Stats()
	e.nq.mu.Lock()
	nb := e.nq.total
	e.nq.mu.Unlock()
	return ControlStats{
		Authenticated:       e.secret != nil,
		ConnsOpen:           s.ConnsOpen,
		ConnsPeak:           s.ConnsPeak,
		ConnsAccepted:       s.ConnsAccepted,
		RefusedConns:        s.RefusedConns,
		RefusedConnsPerHost: s.RefusedConnsPerHost,
		AuthRefused:         s.AuthRefused,
		AuthFailedOutbound:  s.AuthFailedOutbound,
		HandshakeTimeouts:   s.HandshakeTimeouts,
		IdleClosed:          s.IdleClosed,
		PeerIdleClosed:      s.PeerIdleClosed,
		SlowClosed:          s.SlowClosed,
		RefusedFrames:       s.RefusedFrames,
		RefusedMooncake:     s.RefusedMooncake,
		RefusedNotifies:     s.RefusedNotifies,
		NotifyBytes:         nb,
		CallsInFlight:       s.CallsInFlight,
		CallsThrottled:      s.CallsThrottled,
		AcceptErrors:        s.AcceptErrors,
		EvictedPending:      s.EvictedPending,
		Peers:               s.Peers,
		PeerConnsOpen:       s.PeerConnsOpen,
	}
}
