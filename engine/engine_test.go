package engine_test

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

func newEngine(t testing.TB, mod ...func(*engine.Config)) *engine.Engine {
	t.Helper()
	cfg := engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"local", "hold"}}
	for _, m := range mod {
		m(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func alloc(t testing.TB, n int) []byte {
	t.Helper()
	b, err := mem.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Free(b) })
	return b
}

func code(t *testing.T, what string, err error, want errs.Code) {
	t.Helper()
	if got := errs.CodeOf(err); got != want {
		t.Fatalf("%s: got %v (%v), want %v", what, got, err, want)
	}
}

func TestNewDefaults(t *testing.T) {
	e := newEngine(t)
	if e.Name() != e.RPCAddr() || !strings.HasPrefix(e.Name(), "127.0.0.1:") || e.RPCPort() == 0 {
		t.Fatalf("name %q rpc %q port %d", e.Name(), e.RPCAddr(), e.RPCPort())
	}
	if got := e.Transports(); len(got) != 2 || got[0] != "local" {
		t.Fatalf("transports %v", got)
	}
	if c := e.Stats().Caps["local"]; !c.SameProcess || c.CrossHost || !c.HostMemory {
		t.Fatalf("local transport caps %+v", c)
	}
	d := e.Descriptor()
	if d.Instance == "" || d.Version == 0 || d.RPC != e.RPCAddr() || len(d.Buffers) != 0 {
		t.Fatalf("descriptor %+v", d)
	}
	// Port 0 twice gives two distinct ports: read back from the bound listener.
	e2 := newEngine(t)
	if e2.RPCPort() == e.RPCPort() {
		t.Fatal("two engines share a port")
	}
}

func TestNewErrors(t *testing.T) {
	_, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"nosuch"}})
	code(t, "unknown transport", err, errs.TransportUnavailable)
	_, err = engine.New(engine.Config{ListenAddr: "256.0.0.1:0"})
	code(t, "bad listen address", err, errs.InvalidArgument)
	_, err = engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Metadata: "nosuch://x"})
	code(t, "unknown metadata scheme", err, errs.NotSupported)
	_, err = engine.New(engine.Config{ListenAddr: "127.0.0.1:0", ForceTransport: "tcpx", Transports: []string{"local"}})
	code(t, "forced transport missing", err, errs.TransportUnavailable)
}

func TestCloseIdempotent(t *testing.T) {
	e := newEngine(t)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	buf := alloc(t, 4096)
	code(t, "register after close", e.RegisterMemory(mem.Addr(buf), 4096, "cpu", true), errs.Closed)
	_, err := e.AllocateBatch(1)
	code(t, "batch after close", err, errs.Closed)
	_, err = e.OpenSegment("127.0.0.1:1")
	code(t, "open after close", err, errs.Closed)
}

func TestRegistry(t *testing.T) {
	e := newEngine(t)
	buf := alloc(t, 1<<20)
	a := mem.Addr(buf)
	v0 := e.Descriptor().Version

	code(t, "zero length", e.RegisterMemory(a, 0, "cpu", true), errs.InvalidArgument)
	code(t, "bad location", e.RegisterMemory(a, 4096, "gpu:0", true), errs.InvalidArgument)
	code(t, "null address", e.RegisterMemory(0, 4096, "cpu", true), errs.InvalidArgument)
	code(t, "overflow", e.RegisterMemory(^uint64(0)-10, 4096, "cpu", true), errs.InvalidArgument)

	if err := e.RegisterMemory(a, 4096, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	key := e.Descriptor().Buffers[0].Key
	// Identical re-registration succeeds and changes nothing (same key).
	if err := e.RegisterMemory(a, 4096, "cpu:0", true); err != nil {
		t.Fatalf("identical re-registration: %v", err)
	}
	if d := e.Descriptor(); len(d.Buffers) != 1 || d.Buffers[0].Key != key {
		t.Fatalf("re-registration changed the descriptor: %+v", d.Buffers)
	}
	code(t, "overlap start", e.RegisterMemory(a+100, 4096, "cpu:0", true), errs.AddressOverlapped)
	code(t, "overlap before", e.RegisterMemory(a-100+4096*2, 4096, "cpu:0", true), errs.OK)
	code(t, "overlap containing", e.RegisterMemory(a, 1<<20, "cpu:0", true), errs.AddressOverlapped)
	code(t, "same start other length", e.RegisterMemory(a, 8192, "cpu:0", true), errs.AddressOverlapped)

	code(t, "unregister unknown", e.UnregisterMemory(a+1), errs.AddressNotRegistered)
	if err := e.UnregisterMemory(a); err != nil {
		t.Fatal(err)
	}
	code(t, "unregister twice", e.UnregisterMemory(a), errs.AddressNotRegistered)

	// A private buffer is registered but not published.
	if err := e.RegisterMemory(a+512<<10, 4096, "cpu", false); err != nil {
		t.Fatal(err)
	}
	for _, b := range e.Descriptor().Buffers {
		if b.Addr == a+512<<10 {
			t.Fatal("a buffer registered as not remote-accessible was published")
		}
	}

	// A batch publishes once, all or none.
	v1 := e.Descriptor().Version
	rs := []engine.MemoryRegion{
		{Addr: a + 600<<10, Length: 4096, Location: "cpu", Remote: true},
		{Addr: a + 700<<10, Length: 4096, Location: "*", Remote: true},
		{Addr: a + 800<<10, Length: 4096, Location: "cpu:1", Remote: true},
	}
	if err := e.RegisterMemoryBatch(rs); err != nil {
		t.Fatal(err)
	}
	if v := e.Descriptor().Version; v != v1+1 {
		t.Fatalf("batch registration published %d times", v-v1)
	}
	for _, b := range e.Descriptor().Buffers {
		if b.Addr == a+700<<10 && b.Name != "cpu" {
			t.Fatalf("host memory registered at \"*\" published as %q", b.Name)
		}
	}
	// "*" resolves the same way again: an identical re-registration.
	if err := e.RegisterMemory(a+700<<10, 4096, "*", true); err != nil {
		t.Fatal(err)
	}
	bad := []engine.MemoryRegion{{Addr: a + 900<<10, Length: 4096}, {Addr: a + 600<<10 + 1, Length: 10}}
	code(t, "batch with an overlap", e.RegisterMemoryBatch(bad), errs.AddressOverlapped)
	code(t, "batch overlapping itself", e.RegisterMemoryBatch([]engine.MemoryRegion{{Addr: a + 950<<10, Length: 8192}, {Addr: a + 951<<10, Length: 10}}), errs.AddressOverlapped)
	if st := e.Stats(); st.Buffers != 5 {
		t.Fatalf("failed batch left buffers behind: %d", st.Buffers)
	}
	v2 := e.Descriptor().Version
	if err := e.UnregisterMemoryBatch([]uint64{a + 600<<10, a + 700<<10, a + 800<<10}); err != nil {
		t.Fatal(err)
	}
	if v := e.Descriptor().Version; v != v2+1 {
		t.Fatalf("batch unregistration published %d times", v-v2)
	}
	code(t, "unregister batch with unknown", e.UnregisterMemoryBatch([]uint64{a + 512<<10, a + 3}), errs.AddressNotRegistered)
	if e.Stats().Buffers != 2 {
		t.Fatal("failed batch unregistration removed buffers")
	}
	_ = v0
}

// TestTwoEnginesOneProcess opens each other's segments over peer-to-peer
// metadata and moves bytes with the local transport.
func TestTwoEnginesOneProcess(t *testing.T) {
	a, b := newEngine(t), newEngine(t)
	ba, bb := alloc(t, 1<<20), alloc(t, 1<<20)
	for i := range ba {
		ba[i] = byte(i * 7)
	}
	if err := a.RegisterMemory(mem.Addr(ba), 1<<20, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterMemory(mem.Addr(bb), 1<<20, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	sb, err := a.OpenSegment(b.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer a.CloseSegment(sb)
	sa, err := b.OpenSegment(a.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer b.CloseSegment(sa)

	batch, _ := a.AllocateBatch(8)
	if err := batch.SubmitWithNotify(b.Name(), "kv", "done-1",
		engine.Request{Op: engine.Write, Local: mem.Addr(ba), Segment: sb, Remote: mem.Addr(bb), Length: 1 << 19, Transport: "local"},
		engine.Request{Op: engine.Write, Local: mem.Addr(ba) + 1<<19, Segment: sb, Remote: mem.Addr(bb) + 1<<19, Length: 1 << 19, Transport: "local"},
	); err != nil {
		t.Fatal(err)
	}
	st, err := batch.Wait(5 * time.Second)
	if err != nil || st.State != engine.Completed || st.Transferred != 1<<20 {
		t.Fatalf("%+v %v", st, err)
	}
	ts, _ := batch.TaskStatus(1)
	if ts.State != engine.Completed || ts.Transport != "local" {
		t.Fatalf("task %+v", ts)
	}
	if !bytes.Equal(ba, bb) {
		t.Fatal("bytes differ")
	}
	if err := batch.Free(); err != nil {
		t.Fatal(err)
	}
	code(t, "free twice", batch.Free(), errs.InvalidArgument)

	// The batch's notify arrives once it completes.
	waitNotify(t, b, engine.Notification{Name: "kv", Msg: "done-1"})
	if err := b.SendNotify(a.Name(), "back", "hello"); err != nil {
		t.Fatal(err)
	}
	waitNotify(t, a, engine.Notification{Name: "back", Msg: "hello"})

	p, err := a.Probe(b.Name())
	if err != nil || p.Instance != b.Instance() || p.Name != b.Name() {
		t.Fatalf("probe %+v %v", p, err)
	}
	// Opening one's own segment works and sees registrations live.
	self, err := a.OpenSegment(a.Name())
	if err != nil {
		t.Fatal(err)
	}
	d, _ := self.Descriptor()
	if len(d.Buffers) != 1 {
		t.Fatalf("own segment: %+v", d)
	}
	code(t, "close segment", a.CloseSegment(self), errs.OK)
	code(t, "close segment twice", a.CloseSegment(self), errs.InvalidArgument)
}

// waitNotify waits for want; its sender fields are checked only where set.
func waitNotify(t *testing.T, e *engine.Engine, want engine.Notification) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range e.Notifies() {
			if want.From == "" {
				n.From = ""
			}
			if want.FromInstance == "" {
				n.FromInstance = ""
			}
			if n == want {
				return
			}
			t.Fatalf("unexpected notification %+v", n)
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("notification %+v did not arrive", want)
}

func TestOpenSegmentErrors(t *testing.T) {
	e := newEngine(t)
	_, err := e.OpenSegment("")
	code(t, "empty name", err, errs.InvalidArgument)
	_, err = e.OpenSegment("no-port")
	code(t, "not host:port", err, errs.InvalidArgument)
	// A port nobody listens on: closed at once, so a clear SegmentNotFound.
	_, err = e.OpenSegment("127.0.0.1:1")
	code(t, "nobody there", err, errs.SegmentNotFound)
	_, err = e.Probe("127.0.0.1:1")
	code(t, "probe nobody", err, errs.PeerUnreachable)
	code(t, "notify nobody", e.SendNotify("127.0.0.1:1", "a", "b"), errs.PeerUnreachable)
	code(t, "notify too large", e.SendNotify(e.Name(), strings.Repeat("x", 5000), ""), errs.TooLarge)
	// A descriptor asked of the wrong engine is refused.
	other := newEngine(t)
	_, err = e.OpenSegment(other.Name())
	code(t, "right engine", err, errs.OK)
}

// holdOf returns the hold transport of engine e.
func holdOf(e *engine.Engine) *hold {
	holdMu.Lock()
	defer holdMu.Unlock()
	return holdPeers[e.Instance()]
}

// pair returns an initiator and a target with one registered buffer each and
// the target's segment opened by the initiator.
func pair(t testing.TB, mod ...func(*engine.Config)) (*engine.Engine, *engine.Engine, *engine.Segment, uint64, uint64) {
	a, b := newEngine(t, mod...), newEngine(t, mod...)
	ba, bb := alloc(t, 1<<20), alloc(t, 1<<20)
	if err := a.RegisterMemory(mem.Addr(ba), 1<<20, "cpu", true); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterMemory(mem.Addr(bb), 1<<20, "cpu", true); err != nil {
		t.Fatal(err)
	}
	s, err := a.OpenSegment(b.Name())
	if err != nil {
		t.Fatal(err)
	}
	return a, b, s, mem.Addr(ba), mem.Addr(bb)
}

func TestBatchLifecycle(t *testing.T) {
	a, b, s, la, rb := pair(t)
	h := holdOf(a)
	batch, err := a.AllocateBatch(4)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.AllocateBatch(0)
	code(t, "capacity 0", err, errs.InvalidArgument)
	if st := batch.Status(); st.State != engine.Waiting || st.Tasks != 0 {
		t.Fatalf("empty batch %+v", st)
	}
	req := engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 4096, Transport: "hold"}
	if err := batch.Submit(req, req); err != nil {
		t.Fatal(err)
	}
	if ts, _ := batch.TaskStatus(0); ts.State != engine.Pending {
		t.Fatalf("task %+v", ts)
	}
	_, err = batch.TaskStatus(2)
	code(t, "task out of range", err, errs.InvalidArgument)
	code(t, "free while pending", batch.Free(), errs.BatchBusy)
	if _, err := batch.Wait(20 * time.Millisecond); errs.CodeOf(err) != errs.Timeout {
		t.Fatalf("wait on held tasks: %v", err)
	}
	// The local range is held in flight: unregistering it waits.
	unreg := make(chan error, 1)
	go func() { unreg <- a.UnregisterMemory(la) }()
	select {
	case err := <-unreg:
		t.Fatalf("unregister returned while a transfer used the range: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	h.release(nil)
	if err := <-unreg; err != nil {
		t.Fatal(err)
	}
	st, err := batch.Wait(time.Second)
	if err != nil || st.State != engine.Completed || st.Transferred != 8192 || st.Completed != 2 {
		t.Fatalf("%+v %v", st, err)
	}
	// Unregistered local memory is refused before anything moves.
	code(t, "local range unregistered", batch.Submit(req), errs.AddressNotRegistered)
	if err := batch.Free(); err != nil {
		t.Fatal(err)
	}
	code(t, "submit after free", batch.Submit(req), errs.InvalidArgument)
	_ = b
}

func TestTaskFailureAndTimeout(t *testing.T) {
	a, _, s, la, rb := pair(t, func(c *engine.Config) { c.TransferTimeout = 100 * time.Millisecond })
	h := holdOf(a)
	batch, _ := a.AllocateBatch(2)
	req := engine.Request{Op: engine.Read, Local: la, Segment: s, Remote: rb, Length: 100, Transport: "hold"}
	if err := batch.Submit(req); err != nil {
		t.Fatal(err)
	}
	<-h.arrived
	h.release(errs.New(errs.Protocol, "test", "broken"))
	st, _ := batch.Wait(time.Second)
	if st.State != engine.Failed || st.Failed != 1 || errs.CodeOf(st.Err) != errs.Protocol {
		t.Fatalf("%+v", st)
	}
	// Never released: the transfer timeout ends it as TIMEOUT.
	if err := batch.Submit(req); err != nil {
		t.Fatal(err)
	}
	st, err := batch.Wait(5 * time.Second)
	if err != nil || st.State != engine.Failed {
		t.Fatalf("%+v %v", st, err)
	}
	if ts, _ := batch.TaskStatus(1); ts.State != engine.Timeout || errs.CodeOf(ts.Err) != errs.Timeout {
		t.Fatalf("task %+v", ts)
	}
	// A late completion after the timeout changes nothing.
	h.release(nil)
	if ts, _ := batch.TaskStatus(1); ts.State != engine.Timeout {
		t.Fatalf("late completion changed a timed-out task: %+v", ts)
	}
	if err := batch.Free(); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.TasksFailed != 1 || st.TasksTimedOut != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCloseFailsInFlight(t *testing.T) {
	a, _, s, la, rb := pair(t, func(c *engine.Config) { c.TransferTimeout = -1 })
	batch, _ := a.AllocateBatch(16)
	var reqs []engine.Request
	for i := 0; i < 16; i++ {
		reqs = append(reqs, engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 64, Transport: "hold"})
	}
	if err := batch.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	done := make(chan engine.BatchStatus)
	go func() { st, _ := batch.Wait(-1); done <- st }()
	a.Close()
	select {
	case st := <-done:
		if st.State != engine.Failed || st.Failed != 16 || !errors.Is(st.Err, errs.ErrClosed) {
			t.Fatalf("%+v", st)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("close left tasks pending")
	}
}

func TestSubmitValidation(t *testing.T) {
	a, _, s, la, rb := pair(t)
	batch, _ := a.AllocateBatch(4)
	defer batch.Free()
	ok := engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 16}
	cases := []struct {
		name string
		mod  func(*engine.Request)
		code errs.Code
	}{
		{"zero length", func(r *engine.Request) { r.Length = 0 }, errs.InvalidArgument},
		{"local overflow", func(r *engine.Request) { r.Local = ^uint64(0) - 4 }, errs.InvalidArgument},
		{"local unregistered", func(r *engine.Request) { r.Local = la + 2<<20 }, errs.AddressNotRegistered},
		{"local straddles end", func(r *engine.Request) { r.Local = la + 1<<20 - 8 }, errs.AddressNotRegistered},
		{"remote outside", func(r *engine.Request) { r.Remote = rb - 16 }, errs.AddressNotRegistered},
		{"remote straddles end", func(r *engine.Request) { r.Remote = rb + 1<<20 - 8 }, errs.AddressNotRegistered},
		{"unknown transport", func(r *engine.Request) { r.Transport = "carrier-pigeon" }, errs.TransportUnavailable},
		{"nil segment", func(r *engine.Request) { r.Segment = nil }, errs.InvalidArgument},
	}
	for _, c := range cases {
		r := ok
		c.mod(&r)
		code(t, c.name, batch.Submit(ok, r), c.code)
	}
	if st := batch.Status(); st.Tasks != 0 {
		t.Fatal("a refused submit left tasks")
	}
	// The first, valid request of a refused submit did not hold its range.
	if err := a.UnregisterMemory(la); err != nil {
		t.Fatal(err)
	}
}

func TestNotifyQueueBound(t *testing.T) {
	a := newEngine(t)
	b := newEngine(t, func(c *engine.Config) { c.MaxNotifies = 3 })
	for i := 0; i < 3; i++ {
		if err := a.SendNotify(b.Name(), "n", "m"); err != nil {
			t.Fatal(err)
		}
	}
	code(t, "queue full", a.SendNotify(b.Name(), "n", "m"), errs.ResourceExhausted)
	if n := len(b.Notifies()); n != 3 {
		t.Fatalf("drained %d", n)
	}
	if n := len(b.Notifies()); n != 0 {
		t.Fatalf("second drain %d", n)
	}
	if err := a.SendNotify(b.Name(), "n", "m"); err != nil {
		t.Fatal(err)
	}
}

// TestPeerRestartRefreshesDescriptor restarts a target under the same name
// (its port): the cached descriptor is refused by the new owner and the next
// submit uses the fresh one.
func TestPeerRestartRefreshesDescriptor(t *testing.T) {
	a := newEngine(t)
	b := newEngine(t)
	addr := b.RPCAddr()
	la, rb := alloc(t, 4096), alloc(t, 4096)
	a.RegisterMemory(mem.Addr(la), 4096, "cpu", true)
	b.RegisterMemory(mem.Addr(rb), 4096, "cpu", true)
	s, err := a.OpenSegment(b.Name())
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	b2 := newEngine(t, func(c *engine.Config) { c.ListenAddr = addr })
	if err := b2.RegisterMemory(mem.Addr(rb), 4096, "cpu", true); err != nil {
		t.Fatal(err)
	}
	req := engine.Request{Op: engine.Write, Local: mem.Addr(la), Segment: s, Remote: mem.Addr(rb), Length: 4096}
	run := func() engine.BatchStatus {
		batch, _ := a.AllocateBatch(1)
		defer batch.Free()
		if err := batch.Submit(req); err != nil {
			t.Fatal(err)
		}
		st, err := batch.Wait(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	// The cached descriptor names the dead instance: the engine looks the
	// segment up again and the request goes to the new one.
	if st := run(); st.State != engine.Completed {
		t.Fatalf("request after the peer restarted: %+v", st)
	}
	d, _ := s.Descriptor()
	if d.Instance != b2.Instance() {
		t.Fatal("descriptor not refreshed")
	}
}

func TestConcurrentRegisterAndTransfer(t *testing.T) {
	a, b := newEngine(t), newEngine(t)
	buf := alloc(t, 8<<20)
	rbuf := alloc(t, 1<<20)
	b.RegisterMemory(mem.Addr(rbuf), 1<<20, "cpu", true)
	s, err := a.OpenSegment(b.Name())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			base := mem.Addr(buf) + uint64(g)<<20
			for i := 0; i < 50; i++ {
				if err := a.RegisterMemory(base, 1<<20, "cpu", false); err != nil {
					t.Error(err)
					return
				}
				batch, _ := a.AllocateBatch(1)
				if err := batch.Submit(engine.Request{Op: engine.Write, Local: base, Segment: s, Remote: mem.Addr(rbuf), Length: 4096, Transport: "local"}); err != nil {
					t.Error(err)
					return
				}
				if st, err := batch.Wait(time.Second); err != nil || st.State != engine.Completed {
					t.Error(st, err)
					return
				}
				batch.Free()
				if err := a.UnregisterMemory(base); err != nil {
					t.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
}

func TestBatchEventFD(t *testing.T) {
	a, _, s, la, rb := pair(t)
	h := holdOf(a)
	batch, _ := a.AllocateBatch(2)
	fd, err := batch.EventFD()
	if err != nil {
		t.Fatal(err)
	}
	readable := func() bool {
		var b [8]byte
		n, _ := unix.Read(fd, b[:])
		return n == 8
	}
	if readable() {
		t.Fatal("eventfd readable before any task")
	}
	if err := batch.Submit(engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 8, Transport: "hold"}); err != nil {
		t.Fatal(err)
	}
	<-h.arrived
	if readable() {
		t.Fatal("eventfd readable while a task is pending")
	}
	h.release(nil)
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(pfd, 2000); err != nil || n != 1 {
		t.Fatalf("eventfd not readable after completion: %d %v", n, err)
	}
	if !readable() || readable() {
		t.Fatal("eventfd did not reset after a read")
	}
	if err := batch.Free(); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
		t.Fatal("Free left the eventfd open")
	}
	_, err = batch.EventFD()
	code(t, "eventfd after free", err, errs.InvalidArgument)
}
