package transporttest

import (
	"flag"
	"fmt"
	"hash/crc32"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// The fence torture. Goroutines drive random interleavings of everything a
// fence has to survive, against one peer, for a bounded time:
//
//   - submitters fill batches (one or two Submits each), Cancel them, Wait
//     with short timeouts, read task statuses, then Reset and resubmit or
//     Free and allocate again;
//   - a cycler submits small reads, waits, resets and frees as fast as it
//     can, and pollers read TaskStatus and Status of its batch, the
//     submitters' and recent (freed) ones, racing every Reset and Free;
//   - an unregisterer unregisters local memory under the submitters' tasks
//     and registers it again;
//   - the peer grants and revokes windows and re-registers its buffer
//     (which kills the windows over it); a Mooncake peer (Setup.Mooncake)
//     has no windows, so there it only re-registers;
//   - at the end the engine is closed with all of it in flight.
//
// Memory is fenced the moment te says nothing touches it: a task's local
// block once the task is terminal, a whole slab once UnregisterMemory
// returned (everything after Close returned), a window's slots in the peer
// once RevokeWindow returned or the peer's unregistration did. Fenced memory
// is made inaccessible (mprotect PROT_NONE: a late copy in this process
// faults and kills the test, a late system call fails) or filled with a
// canary that is checked before the memory is used again. Every byte the
// submitters write into the peer is the byte the peer already holds there
// (a pattern that changes only when the peer re-registers), so reads can be
// checked and a late write of a canary shows up in the peer. A request
// under a revoked window, or outside its window, must never complete.
//
// Over Mooncake's framing (Setup.Mooncake) requests carry an address and
// no key, so one submitted before the peer re-registers may rightly land in
// the new registration: there the pattern stays the same across
// re-registrations, and the peer's fence is checked instead by filling its
// memory with the canary while it is unregistered.
//
// The run is bounded by -torture.time (or TE_TORTURE_TIME; default 2 s) and
// seeded by -torture.seed (or TE_TORTURE_SEED; default: the clock). The seed
// is logged; each goroutine draws its choices from a generator seeded from
// it, so a seed replays the same choices (the interleaving itself is the
// scheduler's).

var (
	flagTortureSeed = flag.Int64("torture.seed", 0, "seed of the fence torture (0: "+envTortureSeed+", else the clock)")
	flagTortureTime = flag.Duration("torture.time", 0, "how long the fence torture runs per transport (0: "+envTortureTime+", else 2s)")
)

// Environment variables that set the torture's seed and duration where the
// flags cannot be given (a go test of several packages).
const (
	envTortureSeed = "TE_TORTURE_SEED"
	envTortureTime = "TE_TORTURE_TIME"
)

// DefaultTortureTime is the torture's budget per transport in make test.
const DefaultTortureTime = 2 * time.Second

func tortureParams(t *testing.T) (int64, time.Duration) {
	seed := *flagTortureSeed
	if seed == 0 {
		if v := os.Getenv(envTortureSeed); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s=%q is not an integer", envTortureSeed, v)
			}
			seed = n
		}
	}
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	d := *flagTortureTime
	if d == 0 {
		if v := os.Getenv(envTortureTime); v != "" {
			var err error
			if d, err = time.ParseDuration(v); err != nil || d <= 0 {
				t.Fatalf("%s=%q is not a positive duration", envTortureTime, v)
			}
		}
	}
	if d == 0 {
		d = DefaultTortureTime
	}
	return seed, d
}

// Pattern is the byte the suite keeps at offset off of a peer buffer filled
// with seed: position-dependent with no short period, so a byte at the
// wrong offset or from another seed shows.
func Pattern(seed, off uint64) byte {
	x := (off+1)*0x9E3779B97F4A7C15 ^ seed*0xD1B54A32D192ED03
	x ^= x >> 31
	return byte(x ^ x>>17)
}

func fillPattern(b []byte, seed, off uint64) {
	for i := range b {
		b[i] = Pattern(seed, off+uint64(i))
	}
}

// The torture's shapes.
const (
	tBlock      = 16 << 10 // one task's local memory: whole pages
	tSlabBlocks = 48       // blocks per separately registered slab
	tSlabs      = 3
	tSubmitters = 3
	tPollers    = 2
	tZone       = 6 << 20 // peer [0, tZone): the pattern
	tSlot       = 16 << 10
	tSlots      = 64 // window slots above the pattern
	tPeerSize   = tZone + tSlots*tSlot
	tQuarantine = 20 * time.Millisecond
	tCanary     = 0xC3
	tGrace      = 50 * time.Millisecond
	// tSettle bounds how long a batch may take to settle: the transfer
	// timeout plus the transports' progress bounds, with room for a
	// loaded machine.
	tSettle = 60 * time.Second
)

// Kinds of requests.
const (
	kZone    = iota // inside the pattern, under the buffer's key
	kWindow         // inside a live window's slot, under its key
	kOutside        // a live window's key outside its ranges: must fail
	kRetired        // a revoked or dead window's key: must fail
)

type tslab struct {
	mu    sync.RWMutex // R: touching the bytes; W: changing registration or protection
	mem   []byte
	live  bool   // registered and accessible
	epoch uint64 // bumped on every change of registration or protection
}

type lblock struct {
	s     *tslab
	off   uint64
	busy  bool
	quar  bool // fenced, waiting to be checked
	prot  bool // fenced with PROT_NONE (else a canary)
	epoch uint64
	at    time.Time
}

func (b *lblock) bytes() []byte { return b.s.mem[b.off : b.off+tBlock] }

type twin struct {
	key     uint64
	slots   []int
	retired atomic.Bool
}

// treq is what a submitter remembers of one request.
type treq struct {
	blk        *lblock
	op         engine.Opcode
	lo, n      uint64 // inside the block
	remote     uint64 // offset in the peer
	kind       int
	seed       uint64 // the peer's pattern when submitted
	key        uint64 // the window's key (window kinds)
	slabEpoch  uint64
	b          *engine.Batch
	i          int
	slab, slot int
}

type tcounts struct {
	submits, submitErrs, tasks, completed, failed, canceled, timedOut    atomic.Int64
	readsChecked, mustFail, cancels, waits, statuses, resets, frees      atomic.Int64
	unregisters, reregisters, grants, revokes, protects, canaries, batch atomic.Int64
	cycles, cycled                                                       atomic.Int64
}

type torture struct {
	t       *testing.T
	s       Setup
	seed    int64
	e       *engine.Engine
	peer    Peer
	front   *mcFront // the Mooncake handshake listener (Setup.Mooncake)
	seg     *engine.Segment
	desc    *segment.Desc // the initiator's descriptor of seg, as opened
	windows bool          // the transport honours window keys
	protect bool          // the peer's memory can be protected

	slabs [tSlabs]*tslab

	peerMu sync.RWMutex // R: submits; W: the peer re-registering and refilling
	epoch  uint64       // the peer's pattern generation (under peerMu)

	wmu     sync.Mutex
	open    []*twin // published windows
	retired []*twin // the last revoked or dead ones

	bmu     sync.Mutex
	batches []*engine.Batch                               // recent batches, freed ones included, for the pollers
	cur     [tSubmitters + 1]atomic.Pointer[engine.Batch] // each submitter's batch now, and the cycler's
	cyc     []byte                                        // the cycler's local memory

	imu      sync.Mutex
	inflight [tSlabs]map[*treq]struct{}

	stop    atomic.Bool
	closing atomic.Bool // the engine is being closed: API errors are expected
	closed  bool        // the engine closed (under every slab's W lock)
	nfail   atomic.Int64
	n       tcounts
}

func (x *torture) fail(format string, args ...any) {
	if x.nfail.Add(1) <= 10 {
		x.t.Errorf("fence torture (seed %d): "+format, append([]any{x.seed}, args...)...)
	}
}

// peerFail reports a failed call on the peer, unless this engine is closing:
// an owner's unregistration or revocation then cannot hear from it, and may
// rightly refuse to say nothing touches the memory any more.
func (x *torture) peerFail(format string, args ...any) {
	if !x.closing.Load() {
		x.fail(format, args...)
	}
}

func (x *torture) patternSeed(epoch uint64) uint64 { return uint64(x.seed)<<8 ^ epoch }

// TortureResult is what a run of the fence torture leaves for its caller to
// check beyond the torture's own checks.
type TortureResult struct {
	// Desc is the initiator's descriptor of the peer's segment as opened
	// (a Mooncake one with Setup.Mooncake), and Last as it was when the
	// engine closed (refreshed after the peer re-registered).
	Desc, Last *segment.Desc
	// Target is the in-process peer engine's Stats after the run; nil for
	// a peer in a child process.
	Target *engine.Stats
	// Completed is the number of the submitters' tasks that completed.
	Completed int64
	// Metadata is the number of Metadata requests the Mooncake handshake
	// listener answered, Refused the te openings it closed unanswered
	// (Setup.Mooncake).
	Metadata, Refused int64
}

// RunTorture runs only the fence torture over s, the part of the suite that
// runs with Setup.Mooncake.
func RunTorture(t *testing.T, s Setup) TortureResult { return testTorture(t, s) }

// testTorture runs the fence torture over s.
func testTorture(t *testing.T, s Setup) TortureResult {
	seed, budget := tortureParams(t)
	t.Logf("seed %d, %v (replay the choices with -torture.seed=%d or %s=%d; run longer with -torture.time or %s)",
		seed, budget, seed, envTortureSeed, seed, envTortureTime)
	if s.Mooncake {
		t.Logf("Mooncake's framing through a Mooncake handshake listener: no window grants, revokes or requests (Mooncake peers have no keys)")
	}
	x := &torture{t: t, s: s, seed: seed, epoch: 1}
	x.start()
	return x.run(budget)
}

func (x *torture) start() {
	t, s := x.t, x.s
	if s.Mooncake && (s.Process || s.GPU) {
		t.Fatal("Setup.Mooncake runs an in-process peer in host memory: Process and GPU do not apply")
	}
	if s.Mooncake && s.Transport != "tcp" {
		t.Fatalf("Setup.Mooncake: Mooncake peers are reached over tcp, not %q", s.Transport)
	}
	if s.Mooncake {
		// Mooncake peers cannot authenticate: no secret on either side.
		cfg := s.config()
		cfg.UnregisterGrace = tGrace
		cfg.AcceptMooncakePeers, cfg.AuthSecret, cfg.Encrypt = true, "", false
		p, err := newInproc(tPeerSize, cfg, "")
		if err != nil {
			t.Fatal(err)
		}
		x.peer = p
		x.front = newMcFront(t, p)
	} else if s.Process {
		env := []string{envGrace + "=" + tGrace.String()}
		if s.GPU {
			env = append(env, envGPU+"="+s.gpuKind())
		}
		if s.Shared {
			env = append(env, envShared+"=1")
		}
		x.peer = NewChildPeer(t, tPeerSize, env...)
	} else {
		cfg := s.config()
		cfg.UnregisterGrace = tGrace
		p, err := newInprocMem(tPeerSize, cfg, s.gpuKind(), s.Shared)
		if err != nil {
			t.Fatal(err)
		}
		x.peer = p
	}
	t.Cleanup(x.peer.Close)
	cfg := s.config()
	cfg.ForceTransport = s.Transport
	cfg.UnregisterGrace = tGrace
	if s.Mooncake {
		cfg.AuthSecret, cfg.Encrypt = "", false
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	x.e = e
	t.Cleanup(func() { e.Close() })
	x.windows = e.Stats().Caps[s.Transport].Windows && !s.Mooncake
	for i := range x.slabs {
		m, err := mem.Alloc(tSlabBlocks * tBlock)
		if err != nil {
			t.Fatal(err)
		}
		sl := &tslab{mem: m, live: true}
		x.slabs[i] = sl
		t.Cleanup(func() {
			unix.Mprotect(m, unix.PROT_READ|unix.PROT_WRITE)
			mem.Free(m)
		})
		if err := e.RegisterMemory(mem.Addr(m), uint64(len(m)), "cpu:0", false); err != nil {
			t.Fatal(err)
		}
		x.inflight[i] = map[*treq]struct{}{}
	}
	if err := x.peer.FillPattern(0, tZone, x.patternSeed(x.epoch)); err != nil {
		t.Fatal(err)
	}
	if err := x.peer.FillRange(tZone, tSlots*tSlot, tCanary); err != nil {
		t.Fatal(err)
	}
	err = x.peer.Protect(tZone, tSlot, false)
	x.protect = err == nil
	if err != nil && errs.CodeOf(err) != errs.NotSupported {
		t.Fatal(err)
	}
	name := x.peer.Segment()
	if x.front != nil {
		name = x.front.name()
	}
	if x.seg, err = e.OpenSegment(name); err != nil {
		t.Fatal(err)
	}
	if x.desc, err = x.seg.Descriptor(); err != nil {
		t.Fatal(err)
	}
	if x.cyc, err = mem.Alloc(4 * tBlock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Free(x.cyc) })
	if err := e.RegisterMemory(mem.Addr(x.cyc), uint64(len(x.cyc)), "cpu:0", false); err != nil {
		t.Fatal(err)
	}
}

// cycler reads small blocks (their bytes are not checked) through one batch
// after another, resetting each three times, as fast as the transport lets
// it: the pollers read statuses of this batch while it is reset and freed.
func (x *torture) cycler() {
	r := rand.New(rand.NewSource(x.seed + 17))
	for !x.stop.Load() && x.nfail.Load() == 0 {
		b, err := x.e.AllocateBatch(4)
		if err != nil {
			if !closedErr(err) && !x.closing.Load() {
				x.fail("allocate batch: %v", err)
			}
			return
		}
		x.note(b)
		x.cur[tSubmitters].Store(b)
		for k := 0; k < 4 && !x.stop.Load(); k++ {
			reqs := make([]engine.Request, 1+r.Intn(4))
			for i := range reqs {
				n := uint64(1 + r.Intn(4096))
				reqs[i] = engine.Request{Op: engine.Read, Local: mem.Addr(x.cyc) + uint64(i)*tBlock, Segment: x.seg,
					Remote: x.peer.Addr() + uint64(r.Int63n(tZone-int64(n))), Length: n}
			}
			if err := b.Submit(reqs...); err != nil {
				if closedErr(err) || x.closing.Load() {
					break
				}
				continue // the peer re-registering: a stale descriptor
			}
			x.n.cycled.Add(int64(len(reqs)))
			if _, err := b.Wait(tSettle); err != nil {
				x.fail("a batch did not settle within %v: %+v", tSettle, b.Status())
				return
			}
			if err := b.Reset(); err != nil && !x.closing.Load() {
				x.fail("reset of a settled batch: %v", err)
			}
			x.n.cycles.Add(1)
		}
		if _, err := b.Wait(tSettle); err != nil {
			x.fail("a batch did not settle within %v: %+v", tSettle, b.Status())
			return
		}
		if err := b.Free(); err != nil && !x.closing.Load() {
			x.fail("free of a settled batch: %v", err)
		}
		x.n.cycles.Add(1)
	}
}

func (x *torture) run(budget time.Duration) TortureResult {
	t := x.t
	var wg sync.WaitGroup
	var peerDone = make(chan *peerActor, 1)
	for i := 0; i < tSubmitters; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); x.submitter(i) }()
	}
	for i := 0; i < tPollers; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); x.poller(i) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); x.cycler() }()
	wg.Add(2)
	go func() { defer wg.Done(); x.unregisterer() }()
	go func() { defer wg.Done(); peerDone <- x.peerActor() }()

	for end := time.Now().Add(budget); time.Now().Before(end) && x.nfail.Load() == 0; {
		time.Sleep(min(10*time.Millisecond, time.Until(end)))
	}
	// Close with everything in flight; from the moment it returns, nothing
	// may touch the local memory: it is made inaccessible at once.
	x.closing.Store(true)
	res := TortureResult{Desc: x.desc}
	res.Last, _ = x.seg.Descriptor()
	for _, s := range x.slabs {
		s.mu.Lock()
	}
	t0 := time.Now()
	x.e.Close()
	closeTook := time.Since(t0)
	for _, s := range x.slabs {
		if err := unix.Mprotect(s.mem, unix.PROT_NONE); err != nil {
			t.Error(err)
		}
		s.live = false
		s.epoch++
	}
	x.closed = true
	for _, s := range x.slabs {
		s.mu.Unlock()
	}
	x.stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * tSettle):
		t.Fatalf("fence torture (seed %d): goroutines still running %v after the engine closed", x.seed, 2*tSettle)
	}
	pa := <-peerDone

	x.bmu.Lock()
	for _, b := range x.batches {
		if st := b.Status(); st.State == engine.Pending {
			x.fail("a batch still PENDING after Close returned: %+v", st)
		}
	}
	x.bmu.Unlock()
	if n := x.e.Stats().StrayCompletions; n != 0 {
		x.fail("the transport completed %d requests that were not pending under the generation it named", n)
	}
	// Late bytes: give them time to land, then look.
	time.Sleep(4 * tQuarantine)
	want := make([]byte, tZone)
	fillPattern(want, x.patternSeed(x.epoch), 0)
	if got, err := x.peer.CRC(0, tZone); err != nil {
		x.fail("peer crc: %v", err)
	} else if got != crc32.ChecksumIEEE(want) {
		x.fail("the peer's memory holds bytes no write of this epoch carried (a late write of a fenced block, or a stray one)")
	}
	pa.recycle(true)

	n := &x.n
	res.Completed = n.completed.Load()
	if p, ok := x.peer.(*inproc); ok {
		p.mu.Lock()
		if p.e != nil {
			st := p.e.Stats()
			res.Target = &st
		}
		p.mu.Unlock()
	}
	label := x.s.Transport
	if x.front != nil {
		res.Metadata, res.Refused = x.front.metadata.Load(), x.front.refused.Load()
		label += fmt.Sprintf(" (Mooncake's framing; %d Metadata requests answered)", res.Metadata)
	}
	ops := n.submits.Load() + n.cancels.Load() + n.waits.Load() + n.statuses.Load() + n.resets.Load() + n.frees.Load() +
		n.unregisters.Load() + n.reregisters.Load() + n.grants.Load() + n.revokes.Load() + n.batch.Load() + 3*n.cycles.Load()
	t.Logf("%s: %d operations in %v. Submitters: %d submits (%d refused), %d tasks (%d completed, %d failed, %d canceled, "+
		"%d timed out; %d reads checked, %d refused as they must be), %d cancels, %d waits, %d resets, %d frees; "+
		"cycler: %d submit-wait-reset/free cycles of %d tasks; %d batches in all, %d statuses read; "+
		"%d local unregisters, %d peer re-registrations, %d windows granted, %d revoked; %d fences by protection, %d by canary; "+
		"close took %v",
		label, ops, budget, n.submits.Load(), n.submitErrs.Load(), n.tasks.Load(), n.completed.Load(),
		n.failed.Load(), n.canceled.Load(), n.timedOut.Load(), n.readsChecked.Load(), n.mustFail.Load(), n.cancels.Load(),
		n.waits.Load(), n.resets.Load(), n.frees.Load(), n.cycles.Load(), n.cycled.Load(), n.batch.Load(), n.statuses.Load(),
		n.unregisters.Load(), n.reregisters.Load(), n.grants.Load(), n.revokes.Load(), n.protects.Load(), n.canaries.Load(),
		closeTook.Round(time.Millisecond))
	if n.completed.Load() == 0 {
		x.fail("no task completed: the torture tested nothing")
	}
	return res
}

// sleep waits a random time in [lo, hi) and reports whether to stop.
func (x *torture) sleep(r *rand.Rand, lo, hi time.Duration) bool {
	d := lo + time.Duration(r.Int63n(int64(hi-lo)))
	for end := time.Now().Add(d); time.Now().Before(end); {
		if x.stop.Load() || x.nfail.Load() > 0 {
			return true
		}
		time.Sleep(min(time.Millisecond, time.Until(end)))
	}
	return x.stop.Load() || x.nfail.Load() > 0
}

func (x *torture) note(b *engine.Batch) {
	x.n.batch.Add(1)
	x.bmu.Lock()
	defer x.bmu.Unlock()
	if len(x.batches) < 64 {
		x.batches = append(x.batches, b)
		return
	}
	x.batches[rand.Intn(len(x.batches))] = b
}

// closedErr reports whether err says the engine is closed (the end).
func closedErr(err error) bool { return errs.CodeOf(err) == errs.Closed }

// ---- submitters -----------------------------------------------------------

func (x *torture) submitter(id int) {
	r := rand.New(rand.NewSource(x.seed + int64(id+1)*7919))
	var own []*lblock
	for si, s := range x.slabs {
		for k := 0; k < tSlabBlocks; k++ {
			if (si*tSlabBlocks+k)%tSubmitters == id {
				own = append(own, &lblock{s: s, off: uint64(k * tBlock)})
			}
		}
	}
	var b *engine.Batch
	var recs []*treq
	finish := func() {
		if b == nil || !x.settle(r, b) {
			return
		}
		x.check(r, b, recs)
		b.Free()
		b = nil
	}
	defer finish()
	for !x.stop.Load() && x.nfail.Load() == 0 {
		x.recycle(own, false)
		if b == nil {
			nb, err := x.e.AllocateBatch(1 + r.Intn(8))
			if err != nil {
				if !closedErr(err) && !x.closing.Load() {
					x.fail("allocate batch: %v", err)
				}
				return
			}
			b, recs = nb, recs[:0]
			x.note(b)
			x.cur[id].Store(b)
		}
		for k := 1 + r.Intn(2); k > 0 && len(recs) < b.Capacity(); k-- {
			if !x.submit(r, b, own, &recs, 1+r.Intn(b.Capacity()-len(recs))) {
				return
			}
		}
		if len(recs) == 0 {
			b.Free()
			b = nil
			x.n.frees.Add(1)
			time.Sleep(time.Millisecond) // every block busy or fenced: let the others move
			continue
		}
		if !x.settle(r, b) {
			b = nil // still touched: never reuse its memory
			return
		}
		x.check(r, b, recs)
		recs = recs[:0]
		if r.Intn(2) == 0 {
			if err := b.Reset(); err != nil && !x.closing.Load() {
				x.fail("reset of a settled batch: %v", err)
			}
			x.n.resets.Add(1)
		} else {
			if err := b.Free(); err != nil && !x.closing.Load() {
				x.fail("free of a settled batch: %v", err)
			}
			b = nil
			x.n.frees.Add(1)
		}
	}
}

// submit builds up to k requests on free blocks of live slabs and submits
// them; it reports false once the engine is closed.
func (x *torture) submit(r *rand.Rand, b *engine.Batch, own []*lblock, recs *[]*treq, k int) bool {
	x.peerMu.RLock()
	defer x.peerMu.RUnlock()
	seed := x.patternSeed(x.epoch)
	var reqs []engine.Request
	var rs []*treq
	start := r.Intn(len(own))
	for j := 0; j < len(own) && len(reqs) < k; j++ {
		blk := own[(start+j)%len(own)]
		if blk.busy || blk.quar {
			continue
		}
		s := blk.s
		s.mu.RLock()
		if !s.live {
			s.mu.RUnlock()
			continue
		}
		q := x.choose(r, seed)
		q.blk, q.slabEpoch = blk, s.epoch
		q.slab = x.slabIndex(s)
		q.lo = uint64(r.Int63n(int64(tBlock - q.n + 1)))
		m := blk.bytes()
		if q.op == engine.Write {
			fillPattern(m[q.lo:q.lo+q.n], seed, q.remote)
		} else {
			for i := range m {
				m[i] = tCanary
			}
		}
		blk.busy = true
		s.mu.RUnlock()
		req := engine.Request{Op: q.op, Local: mem.Addr(s.mem) + blk.off + q.lo, Segment: x.seg,
			Remote: x.peer.Addr() + q.remote, Length: q.n}
		if q.kind != kZone {
			req.Window = q.key
		}
		reqs = append(reqs, req)
		rs = append(rs, q)
	}
	if len(reqs) == 0 {
		return true
	}
	lo := len(*recs)
	for i, q := range rs {
		q.b, q.i = b, lo+i
	}
	// Tracked before the submit: an unregistration that returns while
	// the submit is still running must find its tasks ended too.
	x.track(rs)
	err := b.Submit(reqs...)
	x.n.submits.Add(1)
	if err != nil {
		x.untrack(rs)
		for _, q := range rs {
			q.blk.busy = false
		}
		x.n.submitErrs.Add(1)
		switch {
		case closedErr(err) || x.closing.Load():
			return false
		case errs.CodeOf(err) == errs.InvalidArgument, errs.CodeOf(err) == errs.Internal, errs.CodeOf(err) == errs.BatchBusy:
			x.fail("submit of valid requests: %v", err)
		}
		return true
	}
	x.n.tasks.Add(int64(len(rs)))
	*recs = append(*recs, rs...)
	return true
}

func (x *torture) slabIndex(s *tslab) int {
	for i, y := range x.slabs {
		if y == s {
			return i
		}
	}
	return -1
}

// choose draws a request: its kind, direction, target and length.
func (x *torture) choose(r *rand.Rand, seed uint64) *treq {
	q := &treq{op: engine.Read, kind: kZone}
	if r.Intn(2) == 0 {
		q.op = engine.Write
	}
	if x.windows && r.Intn(4) == 0 {
		// Windows: mostly inside a live one; sometimes a live one's key
		// outside its slots, or a retired one's key (retired before we
		// looked, so the submit comes after): those two must fail.
		kind := kWindow
		switch v := r.Intn(10); {
		case v >= 8:
			kind = kRetired
		case v >= 6:
			kind = kOutside
		}
		x.wmu.Lock()
		var w *twin
		if kind == kRetired && len(x.retired) > 0 {
			w = x.retired[r.Intn(len(x.retired))]
		} else if kind != kRetired && len(x.open) > 0 {
			w = x.open[r.Intn(len(x.open))]
		}
		x.wmu.Unlock()
		if w != nil {
			slot := w.slots[r.Intn(len(w.slots))]
			if kind == kOutside {
				slot = (slot + 1 + r.Intn(tSlots-1)) % tSlots
				for contains(w.slots, slot) {
					slot = (slot + 1) % tSlots
				}
			}
			q.kind, q.key, q.slot = kind, w.key, slot
			q.n = uint64(1 + r.Intn(tSlot))
			off := uint64(r.Int63n(int64(tSlot - q.n + 1)))
			q.remote = tZone + uint64(slot)*tSlot + off
			return q
		}
	}
	q.n = uint64(1 + r.Intn(tBlock))
	q.remote = uint64(r.Int63n(int64(tZone - q.n + 1)))
	q.seed = seed
	return q
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func (x *torture) track(rs []*treq) {
	x.imu.Lock()
	for _, q := range rs {
		x.inflight[q.slab][q] = struct{}{}
	}
	x.imu.Unlock()
}

func (x *torture) untrack(rs []*treq) {
	x.imu.Lock()
	for _, q := range rs {
		delete(x.inflight[q.slab], q)
	}
	x.imu.Unlock()
}

// settle cancels, waits and reads statuses in a random order until the
// batch has settled; false if it did not within tSettle.
func (x *torture) settle(r *rand.Rand, b *engine.Batch) bool {
	deadline := time.Now().Add(tSettle)
	for {
		switch r.Intn(8) {
		case 0:
			if err := b.Cancel(); err != nil && !x.closing.Load() {
				x.fail("cancel: %v", err)
			}
			x.n.cancels.Add(1)
		case 1, 2:
			i := r.Intn(b.Capacity())
			ts, err := b.TaskStatus(i)
			x.n.statuses.Add(1)
			if err == nil && ts.State != engine.Pending && ts.State != engine.Completed && ts.Err == nil {
				x.fail("task %d ended %v without an error", i, ts.State)
			}
		}
		_, err := b.Wait(time.Duration(r.Intn(2000)) * time.Microsecond)
		x.n.waits.Add(1)
		if err == nil {
			return true
		}
		if time.Now().After(deadline) {
			x.fail("a batch did not settle within %v: %+v", tSettle, b.Status())
			return false
		}
	}
}

// check verifies a settled batch's tasks and fences their blocks.
func (x *torture) check(r *rand.Rand, b *engine.Batch, recs []*treq) {
	defer x.untrack(recs)
	for i, q := range recs {
		ts, err := b.TaskStatus(i)
		if err != nil {
			x.fail("status of task %d of a settled batch: %v", i, err)
			continue
		}
		switch ts.State {
		case engine.Completed:
			x.n.completed.Add(1)
			if ts.Transferred != q.n {
				x.fail("task %d completed with %d of %d bytes", i, ts.Transferred, q.n)
			}
		case engine.Failed:
			x.n.failed.Add(1)
		case engine.Canceled:
			x.n.canceled.Add(1)
		case engine.Timeout:
			x.n.timedOut.Add(1)
		default:
			x.fail("task %d is %v after its batch settled", i, ts.State)
		}
		if q.kind == kOutside || q.kind == kRetired {
			if ts.State == engine.Completed {
				what := "outside its window"
				if q.kind == kRetired {
					what = "under a window already revoked"
				}
				x.fail("a %v %s completed (peer offset %#x, slot %d)", q.op, what, q.remote, q.slot)
			} else {
				x.n.mustFail.Add(1)
			}
		}
		blk := q.blk
		s := blk.s
		s.mu.RLock()
		same := s.live && s.epoch == q.slabEpoch
		m := blk.bytes()
		if same && ts.State == engine.Completed && q.op == engine.Read && q.kind == kZone {
			x.n.readsChecked.Add(1)
			for j := uint64(0); j < tBlock; j++ {
				want := byte(tCanary)
				if j >= q.lo && j < q.lo+q.n {
					want = Pattern(q.seed, q.remote+j-q.lo)
				}
				if m[j] != want {
					x.fail("a completed read of peer [%#x,+%d) left %#x at block byte %d, want %#x", q.remote, q.n, m[j], j, want)
					break
				}
			}
		}
		blk.busy = false
		if same {
			// The task is terminal: its transport never touches this
			// block again. Make sure of it.
			blk.quar, blk.at, blk.epoch = true, time.Now(), s.epoch
			if r.Intn(2) == 0 {
				blk.prot = true
				if err := unix.Mprotect(m, unix.PROT_NONE); err != nil {
					x.fail("mprotect: %v", err)
				}
				x.n.protects.Add(1)
			} else {
				blk.prot = false
				for j := range m {
					m[j] = tCanary
				}
				x.n.canaries.Add(1)
			}
		}
		s.mu.RUnlock()
	}
}

// recycle frees the fenced blocks whose quarantine is over, checking that
// their canaries are intact.
func (x *torture) recycle(own []*lblock, all bool) {
	for _, blk := range own {
		if !blk.quar || (!all && time.Since(blk.at) < tQuarantine) {
			continue
		}
		s := blk.s
		s.mu.RLock()
		if s.epoch == blk.epoch { // else the slab was reset wholesale meanwhile
			m := blk.bytes()
			if blk.prot {
				if err := unix.Mprotect(m, unix.PROT_READ|unix.PROT_WRITE); err != nil {
					x.fail("mprotect: %v", err)
				}
			} else {
				for j := range m {
					if m[j] != tCanary {
						x.fail("a byte landed in local memory %v after the task using it had ended (block byte %d: %#x)",
							time.Since(blk.at).Round(time.Millisecond), j, m[j])
						break
					}
				}
			}
		}
		blk.quar = false
		s.mu.RUnlock()
	}
}

// ---- pollers --------------------------------------------------------------

func (x *torture) poller(id int) {
	r := rand.New(rand.NewSource(x.seed + int64(id+1)*104729))
	valid := map[engine.TaskState]bool{engine.Pending: true, engine.Completed: true, engine.Failed: true,
		engine.Canceled: true, engine.Timeout: true}
	for !x.stop.Load() && x.nfail.Load() == 0 {
		// Mostly a batch a submitter is cycling right now (its Reset and
		// Free race the read), else a recent one, freed ones included.
		var b *engine.Batch
		switch v := r.Intn(4); {
		case v < 2:
			b = x.cur[tSubmitters].Load()
		case v == 2:
			b = x.cur[r.Intn(tSubmitters)].Load()
		default:
			x.bmu.Lock()
			if len(x.batches) > 0 {
				b = x.batches[r.Intn(len(x.batches))]
			}
			x.bmu.Unlock()
		}
		if b == nil {
			time.Sleep(time.Millisecond)
			continue
		}
		i := r.Intn(b.Capacity() + 1)
		func() {
			defer func() {
				if p := recover(); p != nil {
					x.fail("a status read of a batch being reset or freed panicked: %v", p)
				}
			}()
			ts, err := b.TaskStatus(i)
			switch {
			case err != nil:
				if ts.State != engine.Invalid || errs.CodeOf(err) != errs.InvalidArgument {
					x.fail("task status error %v with state %v", err, ts.State)
				}
			case !valid[ts.State]:
				x.fail("task %d in state %v", i, ts.State)
			case ts.Transport != x.s.Transport:
				x.fail("task %d carried by %q, not the forced %q: another batch's slot", i, ts.Transport, x.s.Transport)
			}
			st := b.Status()
			if st.Completed+st.Failed > st.Tasks ||
				(st.State != engine.Pending && st.State != engine.Waiting && st.Completed+st.Failed != st.Tasks) {
				x.fail("inconsistent batch status %+v", st)
			}
		}()
		if x.n.statuses.Add(1)%16 == 0 {
			time.Sleep(100 * time.Microsecond) // leave the CPUs to the transfers now and then
		}
	}
}

// ---- local unregistration -------------------------------------------------

func (x *torture) unregisterer() {
	r := rand.New(rand.NewSource(x.seed + 31))
	for !x.sleep(r, 10*time.Millisecond, 60*time.Millisecond) {
		si := r.Intn(tSlabs)
		s := x.slabs[si]
		addr := mem.Addr(s.mem)
		if err := x.e.UnregisterMemory(addr); err != nil {
			if !closedErr(err) && !x.closing.Load() {
				x.fail("unregister local memory with tasks on it: %v", err)
			}
			return
		}
		x.n.unregisters.Add(1)
		// Every task accepted on the slab has ended.
		x.imu.Lock()
		for q := range x.inflight[si] {
			if ts, err := q.b.TaskStatus(q.i); err == nil && ts.State == engine.Pending {
				x.fail("a task on local memory still PENDING after UnregisterMemory returned")
			}
		}
		x.imu.Unlock()
		s.mu.Lock()
		if x.closed {
			s.mu.Unlock()
			return
		}
		if err := unix.Mprotect(s.mem, unix.PROT_NONE); err != nil {
			x.fail("mprotect: %v", err)
		}
		s.live = false
		s.epoch++
		s.mu.Unlock()
		x.sleep(r, 2*time.Millisecond, 20*time.Millisecond)
		s.mu.Lock()
		if x.closed {
			s.mu.Unlock()
			return
		}
		if err := unix.Mprotect(s.mem, unix.PROT_READ|unix.PROT_WRITE); err != nil {
			x.fail("mprotect: %v", err)
		}
		s.epoch++
		err := x.e.RegisterMemory(addr, uint64(len(s.mem)), "cpu:0", false)
		s.live = err == nil
		s.mu.Unlock()
		if err != nil {
			if !closedErr(err) && !x.closing.Load() {
				x.fail("register local memory again: %v", err)
			}
			return
		}
	}
}

// ---- the peer: windows and re-registration --------------------------------

type qslots struct {
	slots  []int
	prot   bool
	at     time.Time
	revoke uint64 // a dead window still to revoke (it died with its memory)
}

type peerActor struct {
	x    *torture
	r    *rand.Rand
	free [tSlots]bool
	quar []qslots
}

func (x *torture) peerActor() *peerActor {
	p := &peerActor{x: x, r: rand.New(rand.NewSource(x.seed + 59))}
	for i := range p.free {
		p.free[i] = true
	}
	for !x.sleep(p.r, 2*time.Millisecond, 25*time.Millisecond) {
		p.recycle(false)
		x.wmu.Lock()
		nopen := len(x.open)
		x.wmu.Unlock()
		switch v := p.r.Intn(100); {
		case v < 8, x.s.Mooncake && v < 15:
			// No windows for a Mooncake peer: re-registration only,
			// more often, for the target's fence.
			p.rereg()
		case x.s.Mooncake:
		case v < 55 && nopen < 4:
			p.grant()
		case nopen > 0:
			p.revoke()
		}
	}
	return p
}

func (p *peerActor) grant() {
	x, r := p.x, p.r
	var slots []int
	var ranges [][2]uint64
	for k := 1 + r.Intn(3); k > 0; k-- {
		s := r.Intn(tSlots)
		for j := 0; j < tSlots && !p.free[s]; j++ {
			s = (s + 1) % tSlots
		}
		if !p.free[s] {
			break
		}
		p.free[s] = false
		slots = append(slots, s)
		ranges = append(ranges, [2]uint64{tZone + uint64(s)*tSlot, tSlot})
	}
	if len(slots) == 0 {
		return
	}
	key, err := x.peer.Grant(ranges...)
	if err != nil {
		x.peerFail("grant a window: %v", err)
		return
	}
	x.n.grants.Add(1)
	x.wmu.Lock()
	x.open = append(x.open, &twin{key: key, slots: slots})
	x.wmu.Unlock()
}

// retire takes w out of the published windows and marks it retired.
func (x *torture) retire(w *twin, r *rand.Rand) {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	for i, o := range x.open {
		if o == w {
			x.open = append(x.open[:i], x.open[i+1:]...)
			break
		}
	}
	w.retired.Store(true)
	if len(x.retired) < 16 {
		x.retired = append(x.retired, w)
	} else {
		x.retired[r.Intn(len(x.retired))] = w
	}
}

func (p *peerActor) revoke() {
	x, r := p.x, p.r
	x.wmu.Lock()
	w := x.open[r.Intn(len(x.open))]
	x.wmu.Unlock()
	if err := x.peer.Revoke(w.key); err != nil {
		x.peerFail("revoke a window: %v", err)
		return
	}
	x.n.revokes.Add(1)
	// Revoked: no access under the window touches its slots any more.
	x.retire(w, r)
	p.fence(w.slots, 0)
}

// fence makes slots inaccessible or fills them with the canary.
func (p *peerActor) fence(slots []int, revoke uint64) {
	x := p.x
	q := qslots{slots: slots, revoke: revoke, prot: x.protect && revoke == 0 && p.r.Intn(2) == 0}
	for _, s := range slots {
		off := tZone + uint64(s)*tSlot
		var err error
		if q.prot {
			err = x.peer.Protect(off, tSlot, true)
			x.n.protects.Add(1)
		} else {
			err = x.peer.FillRange(off, tSlot, tCanary)
			x.n.canaries.Add(1)
		}
		if err != nil {
			x.peerFail("fence the peer's window slot: %v", err)
		}
	}
	q.at = time.Now()
	p.quar = append(p.quar, q)
}

// rereg unregisters the peer's buffer and registers it again: every window
// over it dies, and the pattern changes.
func (p *peerActor) rereg() {
	x := p.x
	x.peerMu.Lock()
	defer x.peerMu.Unlock()
	if x.s.Mooncake {
		p.reregMooncake()
		return
	}
	// A NIC cannot pin pages without access (ibv_reg_mr fails with
	// EFAULT, as the fake fabric does): slots fenced by protection stay
	// fenced by the canary across the registration.
	for i := range p.quar {
		q := &p.quar[i]
		if !q.prot {
			continue
		}
		for _, s := range q.slots {
			off := tZone + uint64(s)*tSlot
			if err := x.peer.Protect(off, tSlot, false); err != nil {
				x.peerFail("unprotect: %v", err)
			}
			if err := x.peer.FillRange(off, tSlot, tCanary); err != nil {
				x.peerFail("fence the peer's window slot: %v", err)
			}
			x.n.canaries.Add(1)
		}
		q.prot = false
	}
	if err := x.peer.Rereg(); err != nil {
		x.peerFail("the peer re-registering its memory: %v", err)
		return
	}
	x.n.reregisters.Add(1)
	x.wmu.Lock()
	dead := append([]*twin(nil), x.open...)
	x.wmu.Unlock()
	for _, w := range dead {
		x.retire(w, p.r)
		p.fence(w.slots, w.key)
	}
	x.epoch++
	if err := x.peer.FillPattern(0, tZone, x.patternSeed(x.epoch)); err != nil {
		x.peerFail("refill the peer: %v", err)
	}
}

// recycle checks the fenced slots whose quarantine is over and frees them.
func (p *peerActor) recycle(all bool) {
	x := p.x
	canary := crc32.ChecksumIEEE(func() []byte {
		b := make([]byte, tSlot)
		for i := range b {
			b[i] = tCanary
		}
		return b
	}())
	keep := p.quar[:0]
	for _, q := range p.quar {
		if !all && time.Since(q.at) < tQuarantine {
			keep = append(keep, q)
			continue
		}
		if q.revoke != 0 {
			// It died with its memory; revoking it now still succeeds.
			if err := x.peer.Revoke(q.revoke); err != nil {
				x.peerFail("revoke a window that died with its memory: %v", err)
			}
			x.n.revokes.Add(1)
		}
		for _, s := range q.slots {
			off := tZone + uint64(s)*tSlot
			if q.prot {
				if err := x.peer.Protect(off, tSlot, false); err != nil {
					x.peerFail("unprotect: %v", err)
				}
			} else if got, err := x.peer.CRC(off, tSlot); err != nil {
				x.peerFail("peer crc: %v", err)
			} else if got != canary {
				x.fail("a byte landed in the peer's window slot %d %v after the window was revoked or died",
					s, time.Since(q.at).Round(time.Millisecond))
			}
			p.free[s] = true
		}
	}
	p.quar = keep
}

// reregMooncake re-registers a Mooncake peer's buffer. Mooncake's requests
// carry an address and no key, so one submitted before the re-registration
// and served after it lands in the new registration, as Mooncake's own
// target lets it: the pattern cannot change with the registration. What
// must hold is the target's fence: once UnregisterMemory returned, no
// request touches the buffer until it is registered again. So the pattern
// zone is filled with the canary while the buffer is unregistered and
// checked before it is refilled (with the same pattern) and registered: a
// late write shows there, a late read of the canary fails the submitters'
// check.
func (p *peerActor) reregMooncake() {
	x := p.x
	ip := x.peer.(*inproc)
	if err := ip.e.UnregisterMemory(ip.Addr()); err != nil {
		x.peerFail("the peer unregistering its memory: %v", err)
		return
	}
	if err := x.peer.FillRange(0, tZone, tCanary); err != nil {
		x.peerFail("fence the peer's memory: %v", err)
	}
	x.n.canaries.Add(1)
	at := time.Now()
	x.sleep(p.r, tQuarantine/4, tQuarantine)
	canary := make([]byte, tZone)
	for i := range canary {
		canary[i] = tCanary
	}
	if got, err := x.peer.CRC(0, tZone); err != nil {
		x.peerFail("peer crc: %v", err)
	} else if got != crc32.ChecksumIEEE(canary) {
		x.fail("a byte landed in the peer's memory %v after it was unregistered", time.Since(at).Round(time.Millisecond))
	}
	if err := x.peer.FillPattern(0, tZone, x.patternSeed(x.epoch)); err != nil {
		x.peerFail("refill the peer: %v", err)
	}
	if err := ip.e.RegisterMemory(ip.Addr(), ip.Len(), ip.buf.location(), true); err != nil {
		x.peerFail("the peer registering its memory again: %v", err)
		return
	}
	x.n.reregisters.Add(1)
}
