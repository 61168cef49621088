package tebench

import (
	_ "github.com/tecache/te/engine/std"

	"context"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/tecache/te/engine"
	enginetransport "github.com/tecache/te/engine/transport"
	"github.com/tecache/te/engine/transport/tcp"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// TargetInfo is what a target announces (one JSON line on stdout): where its
// buffer is and where its raw TCP reference listens.
type TargetInfo struct {
	Segment string `json:"segment"`
	Addr    uint64 `json:"addr"`
	Length  uint64 `json:"length"`
	Ref     string `json:"ref"`
	// FileAddr and FileLength are the target's file buffer (--file), if any.
	FileAddr   uint64 `json:"file_addr,omitempty"`
	FileLength uint64 `json:"file_length,omitempty"`
}

// TargetOptions configure a target.
type TargetOptions struct {
	Listen   string // RPC listener, host:port
	Metadata string // metadata connection string
	Buffer   uint64 // bytes of registered memory
	Params   map[string]string
	Secret   string // cluster secret ("": the environment's, if any)
	// AcceptMooncake serves Mooncake Transfer Engine initiators too
	// (their transfer_engine_bench, say).
	AcceptMooncake bool
	// File, if set, is registered too (created, Buffer bytes): a storage
	// buffer initiators reach over tcp. FileNoDirect keeps its I/O buffered.
	File         string
	FileNoDirect bool
}

// Target is a running target: an engine with one registered buffer, plus the
// raw TCP reference server.
type Target struct {
	Info TargetInfo
	e    *engine.Engine
	buf  []byte
	ref  *RefServer
	// shared: buf lies in the engine's CXL mapping, which the engine
	// unmaps; it is not freed here.
	shared bool
}

// StartTarget starts a target.
func StartTarget(o TargetOptions) (*Target, error) {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	if o.Buffer == 0 {
		o.Buffer = 256 << 20
	}
	e, err := engine.New(engine.Config{ListenAddr: o.Listen, Metadata: o.Metadata, Params: o.Params, AuthSecret: o.Secret,
		AcceptMooncakePeers: o.AcceptMooncake})
	if err != nil {
		return nil, err
	}
	t := &Target{e: e}
	if a, n, err := e.CXLMemory(); err == nil && n >= o.Buffer {
		// A shared CXL device is mapped: the buffer lies in it, so cxl
		// can serve it and every transport moves the same bytes.
		t.buf, t.shared = mem.Bytes(a, o.Buffer), true
	} else if t.buf, err = mem.Alloc(int(o.Buffer)); err != nil {
		e.Close()
		return nil, err
	}
	if err := e.RegisterMemory(mem.Addr(t.buf), o.Buffer, "cpu:0", true); err != nil {
		t.Close()
		return nil, err
	}
	host, _, _ := net.SplitHostPort(e.RPCAddr())
	if t.ref, err = NewRefServer(net.JoinHostPort(host, "0")); err != nil {
		t.Close()
		return nil, err
	}
	t.Info = TargetInfo{Segment: e.Name(), Addr: mem.Addr(t.buf), Length: o.Buffer, Ref: t.ref.Addr()}
	if o.File != "" {
		fa, err := e.RegisterFile(o.File, 0, o.Buffer, engine.FileOptions{Remote: true, Create: true, NoDirect: o.FileNoDirect})
		if err != nil {
			t.Close()
			return nil, err
		}
		t.Info.FileAddr, t.Info.FileLength = fa, o.Buffer
	}
	return t, nil
}

// Engine returns the target's engine.
func (t *Target) Engine() *engine.Engine { return t.e }

// Close stops the target.
func (t *Target) Close() {
	if t.ref != nil {
		t.ref.Close()
	}
	t.e.Close()
	if t.buf != nil && !t.shared {
		mem.Free(t.buf)
	}
}

// Options configure an initiator run.
type Options struct {
	Segment   string        // target segment name
	Ref       string        // raw TCP reference server; "" skips that reference
	Metadata  string        // metadata connection string
	Transport string        // tcp, shm, local or auto
	Op        string        // read or write
	Block     uint64        // bytes per request
	Batch     int           // requests per batch
	Threads   int           // initiator threads, each with its own batches
	Duration  time.Duration // measured time
	Params    map[string]string
	// RefDuration is how long each reference is measured (default: half of
	// Duration, at most 1s).
	RefDuration time.Duration
	// File runs against the target's file buffer instead of its memory.
	File bool
}

// Result is one run's numbers; Ratio* are te's throughput over the reference.
type Result struct {
	Transport     string  `json:"transport"`
	Op            string  `json:"op"`
	Block         uint64  `json:"block"`
	Batch         int     `json:"batch"`
	Threads       int     `json:"threads"`
	Conns         int     `json:"conns"`
	Slice         uint64  `json:"slice"`
	DurationS     float64 `json:"duration_s"`
	Bytes         uint64  `json:"bytes"`
	Requests      uint64  `json:"requests"`
	GBps          float64 `json:"gbps"`
	ReqPerS       float64 `json:"req_per_s"`
	P50us         float64 `json:"p50_us"`
	P99us         float64 `json:"p99_us"`
	RefTCPGBps    float64 `json:"ref_tcp_gbps"`
	RefMemcpyGBps float64 `json:"ref_memcpy_gbps"`
	// RefTCPHotGBps is raw TCP through one block-sized buffer per
	// connection (cache-hot): for information, the ratio uses RefTCPGBps.
	RefTCPHotGBps float64 `json:"ref_tcp_hot_gbps"`
	RatioTCP      float64 `json:"ratio_tcp"`
	RatioMemcpy   float64 `json:"ratio_memcpy"`
	// Secret says whether both engines held a cluster secret (every
	// connection authenticated).
	Secret bool `json:"secret"`
	// Encrypt says whether the sessions encrypted payloads too
	// (Config.Encrypt), and RefAESGCMGBps is one core's AES-128-GCM rate
	// over 64 KiB records, measured in the same run (RefAESGCM).
	Encrypt       bool    `json:"encrypt,omitempty"`
	RefAESGCMGBps float64 `json:"ref_aes_gcm_gbps,omitempty"`
	// RefMemcpyColdGBps is memcpy between two 512 MiB buffers (out of
	// cache), measured for same-host transports (shm, local).
	RefMemcpyColdGBps float64 `json:"ref_memcpy_cold_gbps,omitempty"`
	RatioMemcpyCold   float64 `json:"ratio_memcpy_cold,omitempty"`
	// Peer is the target's engine: "te", or "mooncake" for a Mooncake
	// Transfer Engine (moved in its tcp framing).
	Peer    string  `json:"peer"`
	Machine Machine `json:"machine"`
	// CPUusPerReq is this process's CPU time (user + system, every thread:
	// the engine, and for local the copies, for rdma over the fake
	// libibverbs its "NIC" threads too) over the measured rounds, per
	// request.
	CPUusPerReq float64 `json:"cpu_us_per_req"`
	// Stage*us are the initiator's mean times per batch in each stage
	// (engine.StageTimes): Submit's own work, hand-off to the last task's
	// end, and that end to the waiter running again.
	StageSubmitUS   float64 `json:"stage_submit_us"`
	StageTransferUS float64 `json:"stage_transfer_us"`
	StageWakeupUS   float64 `json:"stage_wakeup_us"`
	// DoorbellsPerSubmit is ibv_post_send calls per batch (rdma only).
	DoorbellsPerSubmit float64 `json:"doorbells_per_submit,omitempty"`
	// Over the fake libibverbs: FakeNICusPerReq is the part of CPUusPerReq
	// its "NIC" threads spent (process_vm_readv/writev, locks: a real NIC's
	// work), and CPUusPerReqNICMemcpy is CPUusPerReq with that part
	// replaced by what a memcpy of the request's bytes costs here
	// (block / RefMemcpyGBps): the figure to hold against local's.
	FakeNICusPerReq      float64 `json:"fake_nic_us_per_req,omitempty"`
	CPUusPerReqNICMemcpy float64 `json:"cpu_us_per_req_nic_as_memcpy,omitempty"`
	// Target is the target's buffer: "memory", or "file" (a storage
	// buffer: the target's tcp server reads and writes a file). For a file
	// run RatioMemory is its GB/s over the same run's memory GB/s.
	Target      string  `json:"target"`
	RatioMemory float64 `json:"ratio_memory,omitempty"`
}

// cpuTime is the process's CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// stages sums the initiator's stage times over its transports.
func (in *Initiator) stages() (t engine.StageTimes) {
	for _, s := range in.e.Stats().Stages {
		t.Submits += s.Submits
		t.SubmitNS += s.SubmitNS
		t.Transfers += s.Transfers
		t.TransferNS += s.TransferNS
		t.Wakeups += s.Wakeups
		t.WakeupNS += s.WakeupNS
	}
	return t
}

// doorbells is the rdma transport's ibv_post_send count.
func (in *Initiator) doorbells() uint64 { return in.e.TransportStats()["rdma"]["doorbells"] }

func (r Result) String() string {
	ref := "ref tcp n/a"
	if r.RefTCPGBps > 0 {
		ref = fmt.Sprintf("ref tcp %.2f GB/s (%.2fx, hot %.2f)", r.RefTCPGBps, r.RatioTCP, r.RefTCPHotGBps)
	}
	cold := ""
	if r.RefMemcpyColdGBps > 0 {
		cold = fmt.Sprintf(", 512MiB %.2f GB/s (%.3fx)", r.RefMemcpyColdGBps, r.RatioMemcpyCold)
	}
	auth := ""
	if r.Secret {
		auth = " secret"
	}
	if r.Encrypt {
		auth += fmt.Sprintf("+encryption (AES-GCM one core %.2f GB/s)", r.RefAESGCMGBps)
	}
	if r.Target == "file" {
		auth += fmt.Sprintf(" file (%.3fx memory)", r.RatioMemory)
	}
	db := ""
	if r.DoorbellsPerSubmit > 0 {
		db = fmt.Sprintf(", %.2f doorbells/submit", r.DoorbellsPerSubmit)
	}
	if r.FakeNICusPerReq > 0 {
		db += fmt.Sprintf(" (fake NIC %.2fus/req; with the NIC as a memcpy %.2fus/req)", r.FakeNICusPerReq, r.CPUusPerReqNICMemcpy)
	}
	if r.StageTransferUS > 0 {
		db += fmt.Sprintf("  stages submit %.1fus transfer %.1fus wakeup %.1fus", r.StageSubmitUS, r.StageTransferUS, r.StageWakeupUS)
	}
	return fmt.Sprintf("%-5s%s %-5s block %-6s batch %-4d threads %d: %7.3f GB/s %9.0f req/s  p50 %8.0fus p99 %8.0fus  %s  memcpy %.2f GB/s (%.3fx)%s  cpu %.2fus/req%s",
		r.Transport, auth, r.Op, FormatSize(r.Block), r.Batch, r.Threads, r.GBps, r.ReqPerS, r.P50us, r.P99us,
		ref, r.RefMemcpyGBps, r.RatioMemcpy, cold, r.CPUusPerReq, db)
}

// JSON returns r as one line of JSON.
func (r Result) JSON() string {
	b, _ := json.Marshal(r)
	return string(b)
}

func (o *Options) check() error {
	bad := func(f string, a ...any) error { return errs.New(errs.InvalidArgument, "te-bench", f, a...) }
	switch o.Op {
	case "read", "write":
	default:
		return bad("--op %q: want read or write", o.Op)
	}
	switch o.Transport {
	case "", "auto":
		o.Transport = "auto"
	case "tcp", "shm", "cxl", "local", "rdma", "fabric":
	default:
		return bad("--transport %q: want tcp, shm, cxl, local, rdma, fabric or auto", o.Transport)
	}
	if o.Block == 0 || o.Block > 1<<30 {
		return bad("--block %d: want 1B..1GiB", o.Block)
	}
	if o.Batch <= 0 || o.Batch > 1<<16 {
		return bad("--batch %d: want 1..65536", o.Batch)
	}
	if o.Threads <= 0 || o.Threads > 256 {
		return bad("--threads %d: want 1..256", o.Threads)
	}
	if o.Duration <= 0 {
		return bad("--duration %v: want a positive duration", o.Duration)
	}
	if o.RefDuration <= 0 {
		o.RefDuration = min(o.Duration/2, time.Second)
	}
	return nil
}

// Initiator is an engine opened on a target, reused across runs.
type Initiator struct {
	e     *engine.Engine
	seg   *engine.Segment
	rbase uint64
	rlen  uint64
	fbase uint64 // the target's file buffer (0: none)
	flen  uint64
	local []byte
	conns int
	slice uint64
	used  string // the transport the engine chose, learnt from the first batch
	peer  string // "te" or "mooncake"
}

// maxLocal bounds the initiator's registered memory; requests wrap around it
// (and around the target's buffer) when batch*block*threads is larger.
const maxLocal = 256 << 20

// NewInitiator starts an engine and opens the target segment. With transport
// "local" the target must be an engine of this process.
func NewInitiator(segment, metadata, transport string, params map[string]string) (*Initiator, error) {
	return NewInitiatorWith(segment, metadata, transport, params, "")
}

// NewInitiatorWith is NewInitiator with a cluster secret ("": the
// environment's, if any).
func NewInitiatorWith(segment, metadata, transport string, params map[string]string, secret string) (*Initiator, error) {
	return newInitiator(segment, metadata, transport, params, secret, false)
}

func newInitiator(segment, metadata, transport string, params map[string]string, secret string, encrypt bool) (*Initiator, error) {
	cfg := engine.Config{ListenAddr: "127.0.0.1:0", Metadata: metadata, Params: params, TransferTimeout: time.Minute,
		AuthSecret: secret, Encrypt: encrypt}
	if transport != "" && transport != "auto" {
		cfg.ForceTransport = transport
	}
	e, err := engine.New(cfg)
	if err != nil {
		return nil, err
	}
	in := &Initiator{e: e}
	if in.seg, err = e.OpenSegment(segment); err != nil {
		e.Close()
		return nil, err
	}
	d, err := in.seg.Descriptor()
	if err != nil {
		in.Close()
		return nil, err
	}
	in.peer = "te"
	if d.IsMooncake() {
		in.peer = "mooncake"
	}
	for _, b := range d.Buffers {
		if b.Name == engine.LocationFile {
			if b.Length > in.flen {
				in.fbase, in.flen = b.Addr, b.Length
			}
		} else if b.Length > in.rlen {
			in.rbase, in.rlen = b.Addr, b.Length
		}
	}
	if in.rlen == 0 {
		in.Close()
		return nil, errs.New(errs.AddressNotRegistered, "te-bench", "segment %q publishes no buffer", segment)
	}
	if in.local, err = mem.Alloc(maxLocal); err != nil {
		in.Close()
		return nil, err
	}
	if err := e.RegisterMemory(mem.Addr(in.local), maxLocal, "cpu:0", false); err != nil {
		in.Close()
		return nil, err
	}
	def := tcp.DefaultOptions()
	in.conns, in.slice = def.Conns, def.Slice
	if v, ok := params["tcp.conns"]; ok {
		in.conns, _ = strconv.Atoi(v)
	}
	if v, ok := params["tcp.slice"]; ok {
		in.slice, _ = enginetransport.ParseSize(v)
	}
	return in, nil
}

// Close stops the initiator's engine.
func (in *Initiator) Close() {
	in.e.Close()
	if in.local != nil {
		mem.Free(in.local)
	}
}

// Run measures one configuration. te and the raw TCP reference take turns
// in short rounds (te, then raw, then te...), so both see the same load when
// the machine is shared; memcpy is measured last.
func (in *Initiator) Run(ctx context.Context, o Options) (Result, error) {
	if err := o.check(); err != nil {
		return Result{}, err
	}
	rbase, rlen, target := in.rbase, in.rlen, "memory"
	if o.File {
		rbase, rlen, target = in.fbase, in.flen, "file"
		if rlen == 0 {
			return Result{}, errs.New(errs.InvalidArgument, "te-bench", "the target has no file buffer (te-bench target --file)")
		}
	}
	if o.Block > rlen || o.Block > maxLocal {
		return Result{}, errs.New(errs.InvalidArgument, "te-bench", "block %d exceeds the buffers (%d remote, %d local)", o.Block, rlen, maxLocal)
	}
	op := engine.Read
	if o.Op == "write" {
		op = engine.Write
	}
	// Request k of thread th goes to slot th*batch+k of the buffers,
	// wrapping where they are too small; span is the memory a run touches
	// on each side, and the raw reference touches as much.
	lslots, rslots := uint64(maxLocal)/o.Block, rlen/o.Block
	span := min(uint64(o.Threads*o.Batch), lslots, rslots) * o.Block
	reqs := make([][]engine.Request, o.Threads)
	for th := range reqs {
		reqs[th] = make([]engine.Request, o.Batch)
		for k := range reqs[th] {
			slot := uint64(th*o.Batch + k)
			reqs[th][k] = engine.Request{Op: op, Local: mem.Addr(in.local) + (slot%lslots)*o.Block, Segment: in.seg,
				Remote: rbase + (slot%rslots)*o.Block, Length: o.Block}
		}
	}
	// Every batch once, untimed: connections are set up and every page of
	// both buffers is faulted in before anything is measured.
	var slowest time.Duration
	for th := range reqs {
		lat, err := in.batch(reqs[th], true)
		if err != nil {
			return Result{}, err
		}
		slowest = max(slowest, lat)
	}
	var ref *RawRef
	if o.Ref != "" {
		var err error
		if ref, err = DialRawRef(o.Ref, o.Op, o.Block, span, in.conns); err != nil {
			return Result{}, err
		}
		defer ref.Close()
	}
	// Rounds are short, so te and the reference see the same load, but
	// long against a batch: a round ends when every thread's last batch
	// has, and a thread that finished first idles meanwhile.
	round := min(o.Duration, max(200*time.Millisecond, 8*slowest*time.Duration(o.Threads)))
	var (
		lats     []time.Duration
		requests uint64
		teTime   time.Duration
		teCPU    time.Duration
		nicCPU   int64
		bells    uint64
		stages   engine.StageTimes
		rawBytes uint64
		rawTime  time.Duration
		mu       sync.Mutex
		firstErr error
		rawEvery = max(time.Duration(float64(round)*float64(o.RefDuration)/float64(o.Duration)), 20*time.Millisecond)
	)
	for teTime < o.Duration && ctx.Err() == nil {
		d := min(round, o.Duration-teTime)
		cpu0, bell0, nic0, st0 := cpuTime(), in.doorbells(), fakeNICNanos(), in.stages()
		start := time.Now()
		stop := start.Add(d)
		var wg sync.WaitGroup
		for th := 0; th < o.Threads; th++ {
			wg.Add(1)
			go func(rs []engine.Request) {
				defer wg.Done()
				var my []time.Duration
				for time.Now().Before(stop) {
					lat, err := in.batch(rs, false)
					if err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						break
					}
					my = append(my, lat)
				}
				mu.Lock()
				lats = append(lats, my...)
				requests += uint64(len(my) * len(rs))
				mu.Unlock()
			}(reqs[th])
		}
		wg.Wait()
		teTime += time.Since(start)
		teCPU += cpuTime() - cpu0
		bells += in.doorbells() - bell0
		st1 := in.stages()
		stages.Submits += st1.Submits - st0.Submits
		stages.SubmitNS += st1.SubmitNS - st0.SubmitNS
		stages.Transfers += st1.Transfers - st0.Transfers
		stages.TransferNS += st1.TransferNS - st0.TransferNS
		stages.Wakeups += st1.Wakeups - st0.Wakeups
		stages.WakeupNS += st1.WakeupNS - st0.WakeupNS
		if nic0 >= 0 {
			nicCPU += fakeNICNanos() - nic0
		}
		if firstErr != nil {
			return Result{}, firstErr
		}
		if ref != nil {
			n, el, err := ref.Measure(rawEvery)
			if err != nil {
				return Result{}, err
			}
			rawBytes += n
			rawTime += el
		}
	}
	tr := o.Transport
	if tr == "auto" && in.used != "" {
		tr = "auto:" + in.used
	}
	r := Result{
		Transport: tr, Op: o.Op, Block: o.Block, Batch: o.Batch, Threads: o.Threads,
		Conns: in.conns, Slice: in.slice, DurationS: teTime.Seconds(), Requests: requests, Bytes: requests * o.Block,
		Machine: ThisMachine(), Peer: in.peer, Target: target,
	}
	r.GBps = float64(r.Bytes) / teTime.Seconds() / 1e9
	r.ReqPerS = float64(requests) / teTime.Seconds()
	if requests > 0 {
		r.CPUusPerReq = float64(teCPU.Nanoseconds()) / 1e3 / float64(requests)
		r.DoorbellsPerSubmit = float64(bells) / (float64(requests) / float64(o.Batch))
	}
	mean := func(ns, n uint64) float64 {
		if n == 0 {
			return 0
		}
		return float64(ns) / float64(n) / 1e3
	}
	r.StageSubmitUS, r.StageTransferUS, r.StageWakeupUS = mean(stages.SubmitNS, stages.Submits),
		mean(stages.TransferNS, stages.Transfers), mean(stages.WakeupNS, stages.Wakeups)
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	r.P50us, r.P99us = pct(lats, 0.50), pct(lats, 0.99)
	if rawTime > 0 {
		r.RefTCPGBps = float64(rawBytes) / rawTime.Seconds() / 1e9
		r.RatioTCP = r.GBps / r.RefTCPGBps
	}
	if o.Ref != "" {
		g, err := RawTCP(o.Ref, o.Op, o.Block, o.Block*uint64(in.conns), in.conns, min(o.RefDuration/2, 250*time.Millisecond))
		if err != nil {
			return r, err
		}
		r.RefTCPHotGBps = g
	}
	g, err := Memcpy(o.Block, min(o.RefDuration/2, 250*time.Millisecond))
	if err != nil {
		return r, err
	}
	r.RefMemcpyGBps, r.RatioMemcpy = g, r.GBps/g
	if nicCPU > 0 && requests > 0 {
		r.FakeNICusPerReq = float64(nicCPU) / 1e3 / float64(requests)
		r.CPUusPerReqNICMemcpy = r.CPUusPerReq - r.FakeNICusPerReq + float64(o.Block)/(g*1e3)
	}
	if r.Transport == "shm" || r.Transport == "local" {
		g, err := MemcpySpan(o.Block, ColdSpan, min(o.RefDuration/2, 500*time.Millisecond))
		if err != nil {
			return r, err
		}
		r.RefMemcpyColdGBps, r.RatioMemcpyCold = g, r.GBps/g
	}
	return r, nil
}

// batch runs one batch and returns its latency; with learn (untimed, one
// goroutine) it also records the transport the engine chose.
func (in *Initiator) batch(reqs []engine.Request, learn bool) (time.Duration, error) {
	t0 := time.Now()
	b, err := in.e.AllocateBatch(len(reqs))
	if err != nil {
		return 0, err
	}
	defer b.Free()
	if err := b.Submit(reqs...); err != nil {
		return 0, err
	}
	st, err := b.Wait(time.Minute)
	if err != nil {
		return 0, err
	}
	if st.State != engine.Completed {
		if st.Err != nil {
			return 0, st.Err
		}
		return 0, errs.New(errs.Internal, "te-bench", "batch ended %v", st.State)
	}
	lat := time.Since(t0)
	if learn {
		if ts, err := b.TaskStatus(0); err == nil {
			in.used = ts.Transport
		}
	}
	return lat, nil
}

func pct(s []time.Duration, p float64) float64 {
	if len(s) == 0 {
		return 0
	}
	i := int(float64(len(s)-1) * p)
	return float64(s[i].Nanoseconds()) / 1e3
}
