package transporttest

import (
	"bytes"
	"errors"
	"hash/crc32"
	"math/rand"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// Main runs a transport package's tests: as the peer process when the suite
// re-executed the test binary for one, else the tests under goleak.
func Main(m *testing.M) {
	if os.Getenv(envPeer) != "" {
		os.Exit(runPeer())
	}
	goleak.VerifyTestMain(m)
}

// Setup says what to run the suite over.
type Setup struct {
	// Transport is forced on every request ("local", "tcp", ...).
	Transport string
	// Process puts the target engine in a child process.
	Process bool
	// Config adjusts the engines' configuration (both sides in process).
	Config func(*engine.Config)
	// GPU puts the target's buffer in GPU memory (GPU 0 of the runtime
	// gputest.Setup chose; the package's TestMain calls it): the GPU leg
	// of a transport that moves device memory. Local memory stays host
	// memory, so the suite's checks of it hold as they are.
	GPU bool
	// GPUKind is the runtime of that memory ("cuda" when empty, "hip").
	GPUKind string
	// Mooncake makes the target an in-process engine that accepts
	// Mooncake peers (Config.AcceptMooncakePeers; no cluster secret on
	// either side: Mooncake peers cannot authenticate), and opens its
	// segment through a Mooncake handshake listener the suite runs in
	// front of it, which answers each Metadata request with the peer's
	// current descriptor in Mooncake's JSON. The initiator then holds a
	// Mooncake descriptor and speaks Mooncake's tcp data framing; Transport
	// must be "tcp". Only the fence torture runs (RunTorture; Run runs
	// nothing else), without windows, which Mooncake peers do not have.
	Mooncake bool
	// Shared puts the target's buffer in the shared memory the target
	// engine maps (Engine.CXLMemory: the cxl transport's device), at its
	// start; the initiator's own buffers stay private memory, which the
	// shared-memory transport copies from and into without registering.
	Shared bool
}

// The largest transfer the suite makes and the peer buffer that holds it.
const (
	maxSize  = 64 << 20
	peerSize = maxSize + 1<<20
)

type env struct {
	t    *testing.T
	s    Setup
	e    *engine.Engine
	peer Peer
	seg  *engine.Segment
	src  []byte // local buffers, registered
	dst  []byte
}

func (s Setup) config() engine.Config {
	c := engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", TransferTimeout: 10 * time.Second}
	if s.Config != nil {
		s.Config(&c)
	}
	return c
}

// gpuKind is the runtime of the target's buffer, "" for host memory.
func (s Setup) gpuKind() string {
	switch {
	case !s.GPU:
		return ""
	case s.GPUKind == "":
		return "cuda"
	}
	return s.GPUKind
}

func (s Setup) start(t *testing.T) *env { return s.startWith(t, nil) }

// startWith starts the suite's engines, adjusting the initiator's config.
func (s Setup) startWith(t *testing.T, adjust func(*engine.Config)) *env {
	t.Helper()
	var p Peer
	if s.Process {
		var env []string
		if s.GPU {
			env = append(env, envGPU+"="+s.gpuKind())
		}
		if s.Shared {
			env = append(env, envShared+"=1")
		}
		p = NewChildPeer(t, peerSize, env...)
	} else {
		ip, err := newInprocMem(peerSize, s.config(), s.gpuKind(), s.Shared)
		if err != nil {
			t.Fatal(err)
		}
		p = ip
	}
	t.Cleanup(p.Close)
	v := &env{t: t, s: s, peer: p}
	var err error
	v.src, err = mem.Alloc(peerSize)
	if err != nil {
		t.Fatal(err)
	}
	v.dst, err = mem.Alloc(peerSize)
	if err != nil {
		mem.Free(v.src)
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: the engine closes (its transports let
	// go of every task) before the memory its tasks use is unmapped, also
	// when a test ends early with transfers in flight.
	t.Cleanup(func() { mem.Free(v.src); mem.Free(v.dst) })
	cfg := s.config()
	cfg.ForceTransport = s.Transport
	if adjust != nil {
		adjust(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	v.e = e
	if err := e.RegisterMemoryBatch([]engine.MemoryRegion{
		{Addr: mem.Addr(v.src), Length: peerSize, Location: "cpu:0"},
		{Addr: mem.Addr(v.dst), Length: peerSize, Location: "cpu:0"},
	}); err != nil {
		t.Fatal(err)
	}
	v.seg, err = e.OpenSegment(p.Segment())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.CloseSegment(v.seg) })
	return v
}

// run submits reqs in one batch, waits, and returns the final status.
func (v *env) run(reqs ...engine.Request) engine.BatchStatus {
	v.t.Helper()
	b, err := v.e.AllocateBatch(len(reqs))
	if err != nil {
		v.t.Fatal(err)
	}
	defer func() {
		if err := b.Free(); err != nil {
			v.t.Errorf("free batch: %v", err)
		}
	}()
	if err := b.Submit(reqs...); err != nil {
		v.t.Fatalf("submit: %v", err)
	}
	st, err := b.Wait(30 * time.Second)
	if err != nil {
		v.t.Fatalf("wait: %v (status %+v)", err, st)
	}
	return st
}

func (v *env) req(op engine.Opcode, local, remoteOff, n uint64) engine.Request {
	return engine.Request{Op: op, Local: local, Segment: v.seg, Remote: v.peer.Addr() + remoteOff, Length: n}
}

// Run runs the conformance suite. Every transport passes it.
func Run(t *testing.T, s Setup) {
	if s.Mooncake {
		t.Run("Torture", func(t *testing.T) { testTorture(t, s) })
		return
	}
	t.Run("Sizes", func(t *testing.T) { testSizes(t, s) })
	t.Run("ManySmall", func(t *testing.T) { testManySmall(t, s) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, s) })
	t.Run("Invalid", func(t *testing.T) { testInvalid(t, s) })
	t.Run("StaleDescriptor", func(t *testing.T) { testStale(t, s) })
	t.Run("PeerVanishes", func(t *testing.T) { testVanish(t, s) })
	t.Run("Cancel", func(t *testing.T) { testCancel(t, s) })
	t.Run("CloseInFlight", func(t *testing.T) { testCloseInFlight(t, s) })
	t.Run("SubmitDoesNotWait", func(t *testing.T) { testSubmitLatency(t, s) })
	t.Run("TimeoutIsAFence", func(t *testing.T) { testTimeout(t, s) })
	t.Run("UnregisterInFlight", func(t *testing.T) { testUnregisterLocal(t, s) })
	t.Run("Window", func(t *testing.T) { testWindow(t, s) })
	t.Run("Torture", func(t *testing.T) { testTorture(t, s) })
}

func fillRandom(b []byte, seed int64) {
	r := rand.New(rand.NewSource(seed))
	r.Read(b)
}

// testSizes writes and reads back sizes from 1 B to 64 MiB at unaligned
// addresses on both sides, checking the target's bytes and the read-back.
func testSizes(t *testing.T, s Setup) {
	v := s.start(t)
	sizes := []uint64{1, 7, 4096, 4097, 65536 + 3, 1 << 20, 4<<20 + 1, maxSize}
	for i, n := range sizes {
		lo, ro := uint64(3+i), uint64(5+2*i)
		if n == maxSize {
			lo, ro = 1, 3
		}
		fillRandom(v.src[lo:lo+n], int64(n))
		if st := v.run(v.req(engine.Write, mem.Addr(v.src)+lo, ro, n)); st.State != engine.Completed || st.Transferred != n {
			t.Fatalf("write %d: %+v", n, st)
		}
		got, err := v.peer.CRC(ro, n)
		if err != nil {
			t.Fatal(err)
		}
		if want := crc32.ChecksumIEEE(v.src[lo : lo+n]); got != want {
			t.Fatalf("write %d: target crc %08x, want %08x", n, got, want)
		}
		clear(v.dst[lo-1 : lo+n+1])
		v.dst[lo-1], v.dst[lo+n] = 0x5A, 0x5A // guards
		if st := v.run(v.req(engine.Read, mem.Addr(v.dst)+lo, ro, n)); st.State != engine.Completed || st.Transferred != n {
			t.Fatalf("read %d: %+v", n, st)
		}
		if !bytes.Equal(v.dst[lo:lo+n], v.src[lo:lo+n]) {
			t.Fatalf("read %d: bytes differ", n)
		}
		if v.dst[lo-1] != 0x5A || v.dst[lo+n] != 0x5A {
			t.Fatalf("read %d wrote outside its range", n)
		}
	}
}

// testManySmall moves 512 scattered 4 KiB blocks in one batch each way.
func testManySmall(t *testing.T, s Setup) {
	v := s.start(t)
	const n, bs = 512, 4096
	perm := rand.New(rand.NewSource(1)).Perm(n)
	fillRandom(v.src[:n*bs], 2)
	var w, r []engine.Request
	for i := 0; i < n; i++ {
		lo, ro := uint64(i*bs), uint64(perm[i]*bs)
		w = append(w, v.req(engine.Write, mem.Addr(v.src)+lo, ro, bs))
		r = append(r, v.req(engine.Read, mem.Addr(v.dst)+lo, ro, bs))
	}
	if st := v.run(w...); st.State != engine.Completed || st.Completed != n {
		t.Fatalf("write: %+v", st)
	}
	clear(v.dst[:n*bs])
	if st := v.run(r...); st.State != engine.Completed || st.Transferred != n*bs {
		t.Fatalf("read: %+v", st)
	}
	if !bytes.Equal(v.dst[:n*bs], v.src[:n*bs]) {
		t.Fatal("bytes differ after round trip")
	}
}

// testConcurrent runs hundreds of batches from several goroutines, each on its
// own region, and checks every byte.
func testConcurrent(t *testing.T, s Setup) {
	v := s.start(t)
	const workers, batches, per, bs = 8, 40, 16, 16 << 10
	region := uint64(per * bs)
	fillRandom(v.src[:workers*region], 3)
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			base := uint64(w) * region
			for k := 0; k < batches; k++ {
				op := engine.Write
				if k%2 == 1 {
					op = engine.Read
				}
				b, err := v.e.AllocateBatch(per)
				if err != nil {
					errc <- err
					return
				}
				reqs := make([]engine.Request, per)
				for i := range reqs {
					off := base + uint64(i*bs)
					local := mem.Addr(v.src) + off
					if op == engine.Read {
						local = mem.Addr(v.dst) + off
					}
					reqs[i] = v.req(op, local, off, bs)
				}
				if err := b.Submit(reqs...); err != nil {
					errc <- err
					return
				}
				st, err := b.Wait(30 * time.Second)
				if err == nil && st.State != engine.Completed {
					err = st.Err
				}
				if err != nil {
					errc <- err
					return
				}
				if err := b.Free(); err != nil {
					errc <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if !bytes.Equal(v.dst[:workers*region], v.src[:workers*region]) {
		t.Fatal("bytes differ after concurrent round trips")
	}
}

func wantCode(t *testing.T, what string, err error, code errs.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %v", what, code)
	}
	if errs.CodeOf(err) != code {
		t.Fatalf("%s: %v, want code %v", what, err, code)
	}
}

// testInvalid checks that bad requests are refused before anything moves.
func testInvalid(t *testing.T, s Setup) {
	v := s.start(t)
	b, err := v.e.AllocateBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	src := mem.Addr(v.src)
	L := v.peer.Len()
	wantCode(t, "target past the buffer", b.Submit(v.req(engine.Write, src, L-10, 11)), errs.AddressNotRegistered)
	wantCode(t, "target outside any buffer", b.Submit(engine.Request{Op: engine.Write, Local: src, Segment: v.seg, Remote: v.peer.Addr() + L + 4096, Length: 8}), errs.AddressNotRegistered)
	wantCode(t, "zero length", b.Submit(v.req(engine.Write, src, 0, 0)), errs.InvalidArgument)
	// Past both local buffers: right after src may be dst, where mmap
	// places mappings upwards (qemu-user does).
	unregistered := max(src, mem.Addr(v.dst)) + peerSize
	wantCode(t, "local unregistered", b.Submit(v.req(engine.Write, unregistered, 0, 8)), errs.AddressNotRegistered)
	wantCode(t, "remote overflow", b.Submit(engine.Request{Op: engine.Read, Local: src, Segment: v.seg, Remote: ^uint64(0) - 2, Length: 8}), errs.InvalidArgument)
	wantCode(t, "bad opcode", b.Submit(engine.Request{Op: 7, Local: src, Segment: v.seg, Remote: v.peer.Addr(), Length: 8}), errs.InvalidArgument)
	wantCode(t, "over capacity", b.Submit(v.req(engine.Write, src, 0, 8), v.req(engine.Write, src, 8, 8), v.req(engine.Write, src, 16, 8)), errs.InvalidArgument)
	wantCode(t, "nil segment", b.Submit(engine.Request{Op: engine.Write, Local: src, Remote: v.peer.Addr(), Length: 8}), errs.InvalidArgument)
	if st := b.Status(); st.Tasks != 0 {
		t.Fatalf("refused submits left %d tasks", st.Tasks)
	}
	// A valid request still goes through on the same batch.
	if err := b.Submit(v.req(engine.Write, src, 0, 8)); err != nil {
		t.Fatal(err)
	}
	if st, err := b.Wait(10 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("%+v %v", st, err)
	}
}

// testStale re-registers the target buffer (new key): a request built on the
// old descriptor must fail without writing, and the next one must succeed on
// the refreshed descriptor.
func testStale(t *testing.T, s Setup) {
	v := s.start(t)
	const n = 64 << 10
	if err := v.peer.Fill(0xAA); err != nil {
		t.Fatal(err)
	}
	before, _ := v.peer.CRC(0, n)
	if err := v.peer.Rereg(); err != nil {
		t.Fatal(err)
	}
	fillRandom(v.src[:n], 4)
	st := v.run(v.req(engine.Write, mem.Addr(v.src), 0, n))
	if st.State == engine.Completed {
		// Transports whose descriptor is refreshed before the access (the
		// peer told them) may complete on the new key; then the bytes must
		// be there.
		t.Logf("the stale write completed on the refreshed registration")
		got, _ := v.peer.CRC(0, n)
		if got != crc32.ChecksumIEEE(v.src[:n]) {
			t.Fatal("completed write left wrong bytes")
		}
		return
	}
	if c := errs.CodeOf(st.Err); c != errs.StaleDescriptor && c != errs.AddressNotRegistered {
		t.Fatalf("stale write failed with %v, want StaleDescriptor", st.Err)
	}
	if got, _ := v.peer.CRC(0, n); got != before {
		t.Fatal("a write refused as stale changed the target's bytes")
	}
	st = v.run(v.req(engine.Write, mem.Addr(v.src), 0, n))
	if st.State != engine.Completed {
		t.Fatalf("write after refresh: %+v", st)
	}
	if got, _ := v.peer.CRC(0, n); got != crc32.ChecksumIEEE(v.src[:n]) {
		t.Fatal("write after refresh left wrong bytes")
	}
}

// testVanish kills the peer while a large batch runs: every task must finish
// (FAILED or COMPLETED) within the transfer timeout and nothing may hang.
func testVanish(t *testing.T, s Setup) {
	v := s.start(t)
	const per, bs = 64, 1 << 20
	b := v.submitBlocks(engine.Write, per, bs)
	v.peer.Kill()
	st, err := b.Wait(15 * time.Second)
	if err != nil {
		t.Fatalf("batch did not finish after the peer vanished: %v %+v", err, st)
	}
	if st.State == engine.Pending {
		t.Fatalf("tasks still pending: %+v", st)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	// New work to the vanished peer fails cleanly: at submit or as FAILED.
	b2, _ := v.e.AllocateBatch(1)
	defer b2.Free()
	err = b2.Submit(v.req(engine.Write, mem.Addr(v.src), 0, 4096))
	if err == nil {
		st, err := b2.Wait(15 * time.Second)
		if err != nil {
			t.Fatalf("request to a vanished peer hung: %v", err)
		}
		if st.State == engine.Completed {
			t.Fatal("request to a vanished peer completed")
		}
	} else if !errors.Is(err, errs.ErrPeerUnreachable) && !errors.Is(err, errs.ErrSegmentNotFound) &&
		!errors.Is(err, errs.ErrTransportUnavailable) {
		t.Fatalf("submit to a vanished peer: %v", err)
	}
}
