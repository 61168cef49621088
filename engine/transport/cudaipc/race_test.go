package cudaipc_test

import (
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/gpu/gputest"
	"github.com/tecache/te/internal/sys/mem"
)

// TestCancelResetReuse cancels GPU copies right after Submit, waits, resets
// the batch and submits again, as fast as it can: the slots Cancel ended are
// rewritten by Reset and the next Submit while the goroutine that Submit
// started may not have run yet. That goroutine must touch a request only
// through the transport's own state, claimed first: a read of a reset slot
// is a data race (-race) or a nil Priv, and a panic in a transport
// goroutine ends the whole serving process.
func TestCancelResetReuse(t *testing.T) {
	forVendors(t, func(t *testing.T, v gputest.Vendor) { testCancelResetReuse(t, v) })
}

func testCancelResetReuse(t *testing.T, v gputest.Vendor) {
	const per, bs = 16, 4096
	g, err := newGPU(v, per*bs)
	if err != nil {
		t.Fatal(err)
	}
	defer g.free()
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	host := mem.MustAlloc(per * bs)
	defer mem.Free(host)
	if err := e.RegisterMemoryBatch([]engine.MemoryRegion{
		{Addr: g.addr, Length: per * bs, Location: v.Location(0), Remote: true},
		{Addr: mem.Addr(host), Length: per * bs, Location: "cpu"},
	}); err != nil {
		t.Fatal(err)
	}
	seg, err := e.OpenSegment(e.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseSegment(seg)
	reqs := make([]engine.Request, per)
	for i := range reqs {
		off := uint64(i * bs)
		reqs[i] = engine.Request{Op: engine.Write, Local: mem.Addr(host) + off, Segment: seg, Remote: g.addr + off, Length: bs, Transport: "cudaipc"}
	}
	b, err := e.AllocateBatch(per)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	canceled, rounds := 0, 0
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); rounds++ {
		if err := b.Submit(reqs...); err != nil {
			t.Fatal(err)
		}
		if err := b.Cancel(); err != nil {
			t.Fatal(err)
		}
		st, err := b.Wait(10 * time.Second)
		if err != nil || st.State == engine.Pending {
			t.Fatalf("round %d: %+v %v", rounds, st, err)
		}
		if st.State == engine.Canceled {
			canceled++
		}
		if err := b.Reset(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d rounds, %d ended canceled", rounds, canceled)
}
