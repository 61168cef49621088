package rdma_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/rdma"
	"github.com/tecache/te/internal/sys/ibv/ibvtest"
	"github.com/tecache/te/internal/sys/mem"
)

// The suite's stalled-peer cases need a peer process to stop; the software
// provider's fabric lives in one process, so these run them with the
// provider stalled instead: work requests wait as for a peer that stopped
// answering, and a queue pair moved to the error state flushes its own at
// once, as a NIC's does.

func stalledPair(t *testing.T, adjust func(*engine.Config)) (*ibvtest.Lib, *engine.Engine, *engine.Segment, []byte) {
	t.Helper()
	lib := ibvtest.Build(t)
	fake := ibvtest.Open(t, lib)
	conf := cfg()
	conf.Transports = []string{rdma.Name}
	conf.Params = map[string]string{"rdma.library": lib}
	target, err := engine.New(conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	conf.ForceTransport = rdma.Name
	if adjust != nil {
		adjust(&conf)
	}
	init, err := engine.New(conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { init.Close() })
	remote := mem.MustAlloc(32 << 20)
	t.Cleanup(func() { mem.Free(remote) })
	for i := range remote {
		remote[i] = 0x5A
	}
	if err := target.RegisterMemory(mem.Addr(remote), uint64(len(remote)), "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	seg, err := init.OpenSegment(target.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { init.CloseSegment(seg) })
	t.Cleanup(func() { fake.Set(ibvtest.SetStall, 0) })
	return fake, init, seg, remote
}

func canaried(b []byte) {
	for i := range b {
		b[i] = 0xC3
	}
}

// READs under a stalled peer time out; once Wait reported it, nothing lands
// in local memory when the peer comes back.
func TestFakeVerbsTimeoutIsAFence(t *testing.T) {
	fake, e, seg, remote := stalledPair(t, func(c *engine.Config) { c.TransferTimeout = time.Second })
	const per, bs = 32, 1 << 20
	dst := mem.MustAlloc(per * bs)
	defer mem.Free(dst)
	if err := e.RegisterMemory(mem.Addr(dst), per*bs, "cpu:0", false); err != nil {
		t.Fatal(err)
	}
	b, err := e.AllocateBatch(per)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	req := func(i int) engine.Request {
		return engine.Request{Op: engine.Read, Local: mem.Addr(dst) + uint64(i*bs), Segment: seg, Remote: mem.Addr(remote) + uint64(i*bs), Length: bs}
	}
	if err := b.Submit(req(0)); err != nil { // connects the endpoints
		t.Fatal(err)
	}
	if st, err := b.Wait(10 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("%+v %v", st, err)
	}
	if err := b.Reset(); err != nil {
		t.Fatal(err)
	}
	fake.Set(ibvtest.SetStall, 1)
	var reqs []engine.Request
	for i := 0; i < per; i++ {
		reqs = append(reqs, req(i))
	}
	t0 := time.Now()
	if err := b.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	st, err := b.Wait(30 * time.Second)
	if err != nil || st.State != engine.Timeout {
		t.Fatalf("batch under a stalled peer: %+v %v, want TIMEOUT", st, err)
	}
	t.Logf("ended %v after %v", st.State, time.Since(t0))
	canaried(dst)
	fake.Set(ibvtest.SetStall, 0)
	time.Sleep(300 * time.Millisecond)
	if !bytes.Equal(dst, bytes.Repeat([]byte{0xC3}, len(dst))) {
		t.Fatal("a read landed after its task timed out")
	}
}

// Unregistering local memory under a stalled peer returns once nothing can
// touch it; the memory is then unmapped (a late access would fault), and
// the engine still works when the peer comes back.
func TestFakeVerbsUnregisterStalled(t *testing.T) {
	fake, e, seg, remote := stalledPair(t, func(c *engine.Config) { c.UnregisterGrace = 200 * time.Millisecond })
	const per, bs = 8, 1 << 20
	src, dst := mem.MustAlloc(per*bs), mem.MustAlloc(per*bs)
	if err := e.RegisterMemoryBatch([]engine.MemoryRegion{
		{Addr: mem.Addr(src), Length: per * bs, Location: "cpu:0"},
		{Addr: mem.Addr(dst), Length: per * bs, Location: "cpu:0"},
	}); err != nil {
		t.Fatal(err)
	}
	b, err := e.AllocateBatch(2 * per)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(dst), Segment: seg, Remote: mem.Addr(remote), Length: 4096}); err != nil {
		t.Fatal(err)
	}
	if st, err := b.Wait(10 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("%+v %v", st, err)
	}
	if err := b.Reset(); err != nil {
		t.Fatal(err)
	}
	fake.Set(ibvtest.SetStall, 1)
	var reqs []engine.Request
	for i := 0; i < per; i++ {
		off := uint64(i * bs)
		reqs = append(reqs,
			engine.Request{Op: engine.Write, Local: mem.Addr(src) + off, Segment: seg, Remote: mem.Addr(remote) + off, Length: bs},
			engine.Request{Op: engine.Read, Local: mem.Addr(dst) + off, Segment: seg, Remote: mem.Addr(remote) + 16<<20 + off, Length: bs})
	}
	if err := b.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := e.UnregisterMemoryBatch([]uint64{mem.Addr(src), mem.Addr(dst)}); err != nil {
		t.Fatalf("unregister under a stalled peer: %v", err)
	}
	t.Logf("unregister returned after %v", time.Since(t0))
	st, err := b.Wait(0)
	if err != nil || st.State == engine.Pending {
		t.Fatalf("tasks on unregistered memory still pending: %v %+v", err, st)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	mem.Free(src)
	mem.Free(dst)
	fake.Set(ibvtest.SetStall, 0)
	time.Sleep(300 * time.Millisecond)
	// Still alive: nothing touched the unmapped memory. The engine works.
	local := mem.MustAlloc(4096)
	defer mem.Free(local)
	if err := e.RegisterMemory(mem.Addr(local), 4096, "cpu:0", false); err != nil {
		t.Fatal(err)
	}
	b2, err := e.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Free()
	if err := b2.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(local), Segment: seg, Remote: mem.Addr(remote), Length: 4096}); err != nil {
		t.Fatal(err)
	}
	if st, err := b2.Wait(10 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("write after the peer came back: %+v %v", st, err)
	}
}
