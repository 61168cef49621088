package engine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/connlimit"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/tlog"
)

// Metrics in Prometheus's text format (WriteMetrics, te_metrics, the
// MetricsAddr listener): the Stats counters, the control plane's refusals,
// the transports' own counters, the routes, and a histogram of the time from
// submit to its batch's completion per transport and peer class.

// Peer classes of the latency histograms: where the target segment's engine
// runs, as its descriptor says.
const (
	peerSameProcess uint8 = iota
	peerSameHost
	peerOtherHost
	numPeerClasses
)

var peerClassNames = [numPeerClasses]string{"same_process", "same_host", "other_host"}

// maxHistTransports bounds the transports with a histogram (there are five).
const maxHistTransports = 8

// latencyBuckets are the histogram's upper bounds in seconds: 10 µs (a
// local copy) to 10 s (a large transfer over a slow link).
var latencyBuckets = [...]float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, .01, .025, .05, .1,
	.25, .5, 1, 2.5, 5, 10}

// latencyBucketsNS are the same in nanoseconds, for the hot path.
var latencyBucketsNS = func() (b [len(latencyBuckets)]int64) {
	for i, s := range latencyBuckets {
		b[i] = int64(s * 1e9)
	}
	return b
}()

type histogram struct {
	counts [len(latencyBuckets) + 1]atomic.Uint64 // the last is +Inf
	sumNS  atomic.Uint64
}

// metricsState is an engine's metrics: histograms, the host identity peer
// classes compare against, and the optional /metrics listener.
type metricsState struct {
	hist   [maxHistTransports][numPeerClasses]histogram
	stages [maxHistTransports][numStages]histogram
	boot   string // this host's boot id
	pidNS  string
	srv    *http.Server
	addr   string // the listener's address
	done   chan struct{}
}

// liveInstances holds the instance ids of this process's open engines: a
// peer among them is in this process, whatever its descriptor says.
var liveInstances sync.Map

// epoch is the origin of monoNow: time.Since reads the monotonic clock.
var epoch = time.Now()

func monoNow() int64 { return int64(time.Since(epoch)) }

// peerClass says where the engine behind d runs, relative to this one.
func (e *Engine) peerClass(st *segState, d *segment.Desc) uint8 {
	if st.local {
		return peerSameProcess
	}
	if _, ok := liveInstances.Load(d.Instance); ok && d.Instance != "" {
		return peerSameProcess
	}
	if h := d.Host; h != nil && h.BootID != "" {
		if h.BootID != e.metrics.boot {
			return peerOtherHost
		}
		if h.Pid == os.Getpid() && h.PidNS == e.metrics.pidNS {
			return peerSameProcess
		}
		return peerSameHost
	}
	// No host identity (a Mooncake peer): a loopback address is this host.
	host, _, err := net.SplitHostPort(d.RPC)
	if err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() || host == "localhost" {
			return peerSameHost
		}
	}
	return peerOtherHost
}

// flushHistograms adds the tasks that COMPLETED since the last flush to the
// latency histograms, each with the time from its submit to now, when its
// batch settles: the time a caller waiting on the batch sees; it returns
// the clock it read (0: none). Called with b.mu held. It reads the clock
// once per settle, not per task (a clock read is a system call on some
// virtual machines), and adds to the histograms once per bucket a run of
// tasks of one transport and peer class touched, as flushStats does for
// the counters.
func (b *Batch) flushHistograms() (now int64) {
	var (
		counts [len(latencyBuckets) + 1]uint64
		sum    int64
		cur    *histogram
	)
	flush := func() {
		if cur == nil {
			return
		}
		for i, n := range counts {
			if n > 0 {
				cur.counts[i].Add(n)
				counts[i] = 0
			}
		}
		cur.sumNS.Add(uint64(sum))
		sum = 0
	}
	e := b.e
	if b.histFrom >= b.n {
		return 0
	}
	now = monoNow()
	var lastT transport.Transport
	idx := -1
	for i := b.histFrom; i < b.n; i++ {
		t := &b.tasks[i]
		if t.state() != Completed {
			continue
		}
		if t.t != lastT {
			lastT, idx = t.t, -1
			for k, tr := range e.transports {
				if tr == t.t {
					idx = k
				}
			}
		}
		if idx < 0 || idx >= maxHistTransports {
			continue
		}
		h := &e.metrics.hist[idx][t.peer]
		if h != cur {
			flush()
			cur = h
		}
		ns := max(now-t.start, 0)
		k := 0 // a linear scan: most tasks fall in the first few buckets
		for k < len(latencyBucketsNS) && ns > latencyBucketsNS[k] {
			k++
		}
		counts[k]++
		sum += ns
	}
	flush()
	b.histFrom = b.n
	return now
}

// Stages of a batch, each a histogram per transport
// (te_batch_stage_seconds): where the time of a batch goes.
const (
	stageSubmit   = iota // Submit's own work: validation, routing, slots; to the hand-off to the transport
	stageTransfer        // the hand-off (the transport's Submit, posting) to the last task's end
	stageWakeup          // the last task's end to the waiter running again (Wait)
	numStages
)

var stageNames = [numStages]string{"submit", "transfer", "wakeup"}

func (h *histogram) observe(ns int64) {
	ns = max(ns, 0)
	k := 0
	for k < len(latencyBucketsNS) && ns > latencyBucketsNS[k] {
		k++
	}
	h.counts[k].Add(1)
	h.sumNS.Add(uint64(ns))
}

// stageHist is the histogram of stage s for transport index i, nil where
// there is none.
func (e *Engine) stageHist(i int32, s int) *histogram {
	if i < 0 || i >= maxHistTransports {
		return nil
	}
	return &e.metrics.stages[i][s]
}

// stageTimes is Stats.Stages: the stage histograms' counts and sums of
// each transport that has any.
func (e *Engine) stageTimes() map[string]StageTimes {
	var out map[string]StageTimes
	for i, t := range e.transports {
		if i >= maxHistTransports {
			break
		}
		h := &e.metrics.stages[i]
		count := func(s int) (n uint64) {
			for j := range h[s].counts {
				n += h[s].counts[j].Load()
			}
			return n
		}
		st := StageTimes{Submits: count(stageSubmit), SubmitNS: h[stageSubmit].sumNS.Load(),
			Transfers: count(stageTransfer), TransferNS: h[stageTransfer].sumNS.Load(),
			Wakeups: count(stageWakeup), WakeupNS: h[stageWakeup].sumNS.Load()}
		if st.Submits == 0 && st.Transfers == 0 {
			continue
		}
		if out == nil {
			out = map[string]StageTimes{}
		}
		out[t.Name()] = st
	}
	return out
}

// stageSampleReqs spaces the submits whose stages are timed: about one
// per that many requests (a submit of at least as many is always timed),
// so the two clock reads of a timed batch (60 ns each on a quiet virtual
// machine here, up to 250 loaded) stay near 2 ns a request whatever the
// batch size. The spacing is jittered so that a periodic workload does
// not alias with it.
const stageSampleReqs = 256

// markHanded records that the submit in progress (its first request at
// slot lo, n requests) is about to hand its requests to their transports:
// the end of the submit stage and the start of the transfer stage, for a
// submit that is timed. Called under subMu and smu.
func (b *Batch) markHanded(lo, n int) {
	if b.stageDue -= n; b.stageDue > 0 {
		if b.stageOn.Load() {
			b.stageOn.Store(false)
		}
		return
	}
	b.timeSubmit(lo)
}

// timeSubmit is markHanded for a submit that is timed.
func (b *Batch) timeSubmit(lo int) {
	b.stageDue = stageSampleReqs/2 + rand.IntN(stageSampleReqs)
	b.stageOn.Store(true)
	now := monoNow()
	idx := int32(-1)
	for k, tr := range b.e.transports {
		if tr == b.tasks[lo].t {
			idx = int32(k)
			break
		}
	}
	b.stageT.Store(idx)
	b.handAt.Store(now)
	if h := b.e.stageHist(idx, stageSubmit); h != nil {
		h.observe(now - int64(b.now.Sub(epoch)))
	}
}

// observeTransfer ends the transfer stage of a timed batch as it settles,
// with the clock flushHistograms read (0: none read). Called with b.mu
// held.
func (b *Batch) observeTransfer(now int64) {
	if b.stageOn.Load() {
		b.timeTransfer(now)
	}
}

func (b *Batch) timeTransfer(now int64) {
	if now == 0 {
		now = monoNow()
	}
	b.settleAt.Store(now)
	if h := b.e.stageHist(b.stageT.Load(), stageTransfer); h != nil {
		h.observe(now - b.handAt.Load())
	}
}

// observeWakeup ends the wakeup stage of a timed batch: a waiter that
// blocked runs again.
func (b *Batch) observeWakeup() {
	if b.stageOn.Load() {
		b.timeWakeup()
	}
}

func (b *Batch) timeWakeup() {
	if h := b.e.stageHist(b.stageT.Load(), stageWakeup); h != nil {
		h.observe(monoNow() - b.settleAt.Load())
	}
}

// logBatch writes a batch's outcome at debug level. Called with b.mu held,
// when the batch settles.
func (b *Batch) logBatch() {
	l := b.e.cfg.Logger
	if !l.Enabled(context.Background(), slog.LevelDebug) || b.n == 0 {
		return
	}
	args := []any{"tasks", b.n, "completed", b.nDone.Load(), "failed", b.nFail.Load(), "bytes", b.bytes.Load(),
		"elapsed", time.Duration(monoNow() - b.tasks[0].start).Round(time.Microsecond), "transport", b.tasks[0].t.Name()}
	if b.firstErr != nil {
		args = append(args, "err", b.firstErr)
	}
	if b.notifyErr != nil {
		args = append(args, "notify_err", b.notifyErr)
	}
	l.Debug("te: batch finished", args...)
}

// logSegmentOpened writes a segment open at debug level.
func (e *Engine) logSegmentOpened(st *segState, start time.Time, cached bool) {
	l := e.cfg.Logger
	if !l.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	args := []any{"segment", st.name, "cached", cached, tlog.Since("elapsed", start)}
	if d := st.desc.Load(); d != nil {
		args = append(args, "buffers", len(d.Buffers), "transports", d.Transports)
	} else if st.local {
		args = append(args, "local", true)
	}
	l.Debug("te: segment opened", args...)
}

// metricsWriter writes families of the text exposition format, each with
// its HELP and TYPE lines.
type metricsWriter struct {
	w   *bufio.Writer
	err error
}

func (m *metricsWriter) family(name, typ, help string) {
	if m.err != nil {
		return
	}
	fmt.Fprintf(m.w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// sample writes one line; labels are name, value pairs.
func (m *metricsWriter) sample(name string, v float64, labels ...string) {
	m.w.WriteString(name)
	if len(labels) > 0 {
		m.w.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				m.w.WriteByte(',')
			}
			m.w.WriteString(labels[i])
			m.w.WriteString(`="`)
			m.w.WriteString(labelEscaper.Replace(labels[i+1]))
			m.w.WriteByte('"')
		}
		m.w.WriteByte('}')
	}
	m.w.WriteByte(' ')
	m.w.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
	m.w.WriteByte('\n')
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func (m *metricsWriter) one(name, typ, help string, v float64, labels ...string) {
	m.family(name, typ, help)
	m.sample(name, v, labels...)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// WriteMetrics writes the engine's metrics to w in Prometheus's text
// exposition format (version 0.0.4): every family with HELP and TYPE lines,
// counters ending in _total, times in seconds, sizes in bytes.
func (e *Engine) WriteMetrics(w io.Writer) error {
	s := e.Stats()
	c := s.Control
	m := &metricsWriter{w: bufio.NewWriter(w)}

	m.one("te_engine_info", "gauge", "Always 1; labels: te's version, the segment name and this start's instance id.",
		1, "version", Version, "segment", s.Segment, "instance", e.instance)
	m.one("te_buffers_registered", "gauge", "Memory ranges registered with the engine.", float64(s.Buffers))

	m.family("te_tasks_total", "counter", "Tasks (requests of a batch) that ended, by final state.")
	for _, st := range []struct {
		state string
		n     uint64
	}{
		{"completed", e.stats.completed.Load()}, {"failed", e.stats.failed.Load()},
		{"timeout", e.stats.timedOut.Load()}, {"canceled", e.stats.canceled.Load()},
	} {
		m.sample("te_tasks_total", float64(st.n), "state", st.state)
	}
	m.one("te_transferred_bytes_total", "counter", "Bytes of tasks that completed, read and write.", float64(s.BytesTransferred))
	m.one("te_notifies_sent_total", "counter", "Notifications sent.", float64(s.NotifiesSent))
	m.one("te_notifies_received_total", "counter", "Notifications received.", float64(s.NotifiesReceived))
	m.one("te_notifies_duplicate_total", "counter", "Notifications received again after a lost reply, answered without queueing them twice.", float64(s.NotifiesDuplicate))
	m.one("te_refused_records_total", "counter", "Store records (descriptors, rpc_meta) that did not verify.", float64(s.RefusedRecords))
	m.one("te_windows_granted_total", "counter", "Access windows granted (GrantWindow).", float64(s.WindowsGranted))
	m.one("te_windows_revoked_total", "counter", "Access windows revoked.", float64(s.WindowsRevoked))
	m.one("te_windows_unenforced_total", "counter",
		"Requests that named a window and were refused: only transports that cannot enforce one reach the peer.", float64(s.WindowsUnenforced))

	e.writeHistograms(m)
	e.writeStageHistograms(m)

	m.one("te_control_authenticated", "gauge", "1 when the engine holds a cluster secret and peers must prove it.",
		b2f(c.Authenticated))
	m.one("te_control_connections", "gauge", "Accepted control connections open now.", float64(c.ConnsOpen))
	m.one("te_control_peer_connections", "gauge", "Control connections this engine dialled to peers, open now.",
		float64(c.PeerConnsOpen))
	m.one("te_control_peers", "gauge", "Peers the engine keeps a dialled control connection slot for.", float64(c.Peers))
	m.one("te_control_connections_peak", "gauge", "The most accepted control connections open at once.", float64(c.ConnsPeak))
	m.one("te_control_connections_accepted_total", "counter", "Control connections accepted.", float64(c.ConnsAccepted))
	m.family("te_control_refused_total", "counter",
		"Peers refused by the control plane, by reason (a bound passed, a malformed or Mooncake frame).")
	for _, r := range []struct {
		reason string
		n      uint64
	}{
		{"max_conns", c.RefusedConns}, {"max_conns_per_host", c.RefusedConnsPerHost},
		{"frame", c.RefusedFrames}, {"mooncake_handshake", c.RefusedMooncake}, {"notify", c.RefusedNotifies},
	} {
		m.sample("te_control_refused_total", float64(r.n), "reason", r.reason)
	}
	m.one("te_auth_refused_total", "counter", "Accepted connections whose peer did not prove the cluster secret.",
		float64(c.AuthRefused))
	m.one("te_auth_failed_outbound_total", "counter",
		"Dialled peers that refused this engine or could not prove the cluster secret.", float64(c.AuthFailedOutbound))
	m.one("te_control_handshake_timeouts_total", "counter",
		"Connections that did not authenticate within the handshake timeout.", float64(c.HandshakeTimeouts))
	m.family("te_control_closed_total", "counter",
		"Control connections closed by the engine, by reason: idle (accepted), peer_idle (dialled), slow (no progress).")
	m.sample("te_control_closed_total", float64(c.IdleClosed), "reason", "idle")
	m.sample("te_control_closed_total", float64(c.PeerIdleClosed), "reason", "peer_idle")
	m.sample("te_control_closed_total", float64(c.SlowClosed), "reason", "slow")
	m.one("te_notify_queued_bytes", "gauge", "Bytes of received, undrained notifications.", float64(c.NotifyBytes))
	m.one("te_control_calls_in_flight", "gauge", "Control calls being served now.", float64(c.CallsInFlight))
	m.one("te_control_calls_throttled_total", "counter",
		"Times a connection was not read because its calls, or the engine's, were at their bound.", float64(c.CallsThrottled))
	m.one("te_control_accept_errors_total", "counter", "Failed accepts (e.g. out of file descriptors).", float64(c.AcceptErrors))

	m.family("te_transport_installed", "gauge", "1 per installed transport, labelled with its rank (lower is preferred).")
	for _, t := range e.transports {
		m.sample("te_transport_installed", 1, "transport", t.Name(), "rank", strconv.Itoa(t.Caps().Rank))
	}
	ts := e.TransportStats()
	names := make([]string, 0, len(ts))
	for n := range ts {
		names = append(names, n)
	}
	sort.Strings(names)
	m.family("te_transport_stat", "gauge", "A transport's own counters and gauges (Engine.TransportStats), by transport and stat.")
	for _, n := range names {
		keys := make([]string, 0, len(ts[n]))
		for k := range ts[n] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			m.sample("te_transport_stat", float64(ts[n][k]), "transport", n, "stat", k)
		}
	}
	e.writeLive(m, s.Live)
	m.family("te_route_info", "gauge", "Always 1: the transport that served each open segment last, per memory class.")
	for _, r := range s.Routes {
		m.sample("te_route_info", 1, "segment", r.Segment, "memory", r.Memory, "transport", r.Transport)
	}
	return m.w.Flush()
}

// writeLive writes what peers cost the engine now, per transport that holds
// per-peer resources (Stats.Live): gauges that fall back when peers go.
func (e *Engine) writeLive(m *metricsWriter, live map[string]transport.Live) {
	names := make([]string, 0, len(live))
	for n := range live {
		names = append(names, n)
	}
	sort.Strings(names)
	m.family("te_transport_peers", "gauge", "Peers a transport keeps state for now.")
	for _, n := range names {
		m.sample("te_transport_peers", float64(live[n].Peers), "transport", n)
	}
	m.family("te_transport_connections", "gauge",
		"A transport's connections open now, by direction: dialed (to peers) or accepted (from peers).")
	for _, n := range names {
		m.sample("te_transport_connections", float64(live[n].ConnsDialed), "transport", n, "direction", "dialed")
		m.sample("te_transport_connections", float64(live[n].ConnsAccepted), "transport", n, "direction", "accepted")
	}
	m.family("te_transport_endpoints", "gauge", "A transport's endpoints to peers open now (rdma: NIC pairs, initiating and accepting).")
	for _, n := range names {
		m.sample("te_transport_endpoints", float64(live[n].Endpoints), "transport", n)
	}
	m.family("te_transport_queue_pairs", "gauge", "Verbs queue pairs a transport holds now.")
	for _, n := range names {
		m.sample("te_transport_queue_pairs", float64(live[n].QueuePairs), "transport", n)
	}
}

func (e *Engine) writeHistograms(m *metricsWriter) {
	const name = "te_task_duration_seconds"
	m.family(name, "histogram", "Time from each task's submit until it and the rest of its batch completed "+
		"(what a caller waiting on the batch sees), by transport and peer class (same_process, same_host, other_host).")
	for i, t := range e.transports {
		if i >= maxHistTransports {
			break
		}
		for p := range numPeerClasses {
			m.histogram(name, &e.metrics.hist[i][p], "transport", t.Name(), "peer", peerClassNames[p])
		}
	}
}

func (e *Engine) writeStageHistograms(m *metricsWriter) {
	const name = "te_batch_stage_seconds"
	m.family(name, "histogram", "Where a batch's time goes, by transport: submit (Submit's own work until the hand-off "+
		"to the transport), transfer (from the hand-off until the last task ended), wakeup (from then until a "+
		"waiter blocked in Wait ran again). About one submit per 256 requests is timed.")
	for i, t := range e.transports {
		if i >= maxHistTransports {
			break
		}
		for s := range numStages {
			m.histogram(name, &e.metrics.stages[i][s], "transport", t.Name(), "stage", stageNames[s])
		}
	}
}

// histogram writes h's cumulative buckets, sum (seconds) and count under
// the labels (name, value pairs).
func (m *metricsWriter) histogram(name string, h *histogram, labels ...string) {
	var cum uint64
	for j := range h.counts {
		cum += h.counts[j].Load()
		le := "+Inf"
		if j < len(latencyBuckets) {
			le = strconv.FormatFloat(latencyBuckets[j], 'g', -1, 64)
		}
		m.sample(name+"_bucket", float64(cum), append(labels, "le", le)...)
	}
	m.sample(name+"_sum", float64(h.sumNS.Load())/1e9, labels...)
	m.sample(name+"_count", float64(cum), labels...)
}

// metricsListenAddr applies the binding rule of MetricsAddr: an empty host
// is loopback. The port may be a range ("0.0.0.0:9464-9471"), for several
// engines on one host (the ranks of a serving pod): each binds the first
// free port of the range.
func metricsListenAddr(addr string) (host string, lo, hi int, err error) {
	bad := func(cause error) error {
		return errs.Wrap(errs.InvalidArgument, "new", cause,
			"metrics address %q (Config.MetricsAddr, %s) is not host:port or host:port-port", addr, EnvMetricsAddr)
	}
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, 0, bad(err)
	}
	if h == "" {
		h = "127.0.0.1"
	}
	a, b, isRange := strings.Cut(p, "-")
	lo, err = strconv.Atoi(a)
	hi = lo
	if err == nil && isRange {
		hi, err = strconv.Atoi(b)
	}
	if err == nil && (lo < 0 || hi > 65535 || hi < lo || hi-lo > 255 || (isRange && lo == 0)) {
		err = errors.New("ports outside 0..65535, or a range that is empty, starts at 0 or spans over 256 ports")
	}
	if err != nil {
		return "", 0, 0, bad(err)
	}
	return h, lo, hi, nil
}

// startMetrics learns this host's identity for the peer classes and, with
// MetricsAddr, serves /metrics. An address whose every port is taken (by
// another engine) is not an error: the engine runs without a listener and
// says so.
func (e *Engine) startMetrics() error {
	liveInstances.Store(e.instance, struct{}{})
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		e.metrics.boot = strings.TrimSpace(string(b))
	}
	if ns, err := os.Readlink("/proc/self/ns/pid"); err == nil {
		e.metrics.pidNS = ns
	}
	if e.cfg.MetricsAddr == "" {
		return nil
	}
	host, lo, hi, err := metricsListenAddr(e.cfg.MetricsAddr)
	if err != nil {
		return err
	}
	var ln net.Listener
	for p := lo; p <= hi; p++ {
		ln, err = net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			e.cfg.Logger.Warn("te: no metrics listener: every port of the metrics address is in use (another engine?); "+
				"give each engine its own address, or a range such as 0.0.0.0:9464-9471", "addr", e.cfg.MetricsAddr)
			return nil
		}
		return errs.Wrap(errs.InvalidArgument, "new", err, "metrics listener on %s (%s)", e.cfg.MetricsAddr, EnvMetricsAddr)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		e.WriteMetrics(w)
	})
	e.metrics.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	e.metrics.done = make(chan struct{})
	e.metrics.addr = ln.Addr().String()
	ln = &cappedListener{Listener: ln, lim: connlimit.New(metricsMaxConns, metricsMaxPerHost)}
	e.cfg.Logger.Info("te: serving metrics", "addr", "http://"+ln.Addr().String()+"/metrics")
	go func() {
		defer close(e.metrics.done)
		if err := e.metrics.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.cfg.Logger.Warn("te: metrics listener stopped", "err", err)
		}
	}()
	return nil
}

// MetricsAddr returns the address the /metrics listener is bound to, or ""
// without one.
func (e *Engine) MetricsAddr() string {
	if e.metrics.srv == nil {
		return ""
	}
	return e.metrics.addr
}

func (e *Engine) stopMetrics() {
	liveInstances.Delete(e.instance)
	if e.metrics.srv == nil {
		return
	}
	e.metrics.srv.Close()
	<-e.metrics.done
}

// The metrics listener's connection bounds: a scraper needs one or two; a
// flood of idle connections must not take the process's descriptors.
const (
	metricsMaxConns   = 64
	metricsMaxPerHost = 8
)

// cappedListener closes, at accept, a connection over its limiter's
// bounds; the others give their slot back when closed.
type cappedListener struct {
	net.Listener
	lim *connlimit.Limiter
}

func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		release, err := l.lim.Admit(c.RemoteAddr())
		if err != nil {
			c.Close()
			continue
		}
		return &releasingConn{Conn: c, release: release}, nil
	}
}

type releasingConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *releasingConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
