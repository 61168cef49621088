package shm_test

import (
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/sys/mem"
)

// TestWindowDiesWithItsMemory: a peer that wrote through a window (so holds
// the window's grant) must lose it when the owner unregisters the memory
// under the window, even though nobody revoked the window itself. The owner
// then registers the same range again and fills it with a canary: a write
// under the old window's key must be refused and the canary must survive.
// A grant that outlived the unregistration would let the peer's
// process_vm_writev land in memory the owner freed or gave to someone else.
func TestWindowDiesWithItsMemory(t *testing.T) {
	const size, bs = 1 << 20, 64 << 10
	p := transporttest.NewChildPeer(t, size)
	defer p.Close()
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", ForceTransport: "shm",
		TransferTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	src := mem.MustAlloc(bs)
	defer mem.Free(src)
	for i := range src {
		src[i] = byte(i*13 + 1)
	}
	if err := e.RegisterMemory(mem.Addr(src), bs, "cpu", false); err != nil {
		t.Fatal(err)
	}
	seg, err := e.OpenSegment(p.Segment())
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseSegment(seg)
	key, err := p.Grant([2]uint64{0, 4 * bs})
	if err != nil {
		t.Fatal(err)
	}
	write := func() engine.BatchStatus {
		t.Helper()
		b, err := e.AllocateBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		if err := b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(src), Segment: seg, Remote: p.Addr() + bs, Length: bs, Window: key}); err != nil {
			return engine.BatchStatus{State: engine.Failed, Err: err}
		}
		st, err := b.Wait(20 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := write(); st.State != engine.Completed {
		t.Fatalf("write under the window: %+v", st)
	}
	if err := p.Rereg(); err != nil { // the window is never revoked
		t.Fatal(err)
	}
	if err := p.Fill(0xC3); err != nil {
		t.Fatal(err)
	}
	want, _ := p.CRC(0, 4*bs)
	st := write()
	if got, _ := p.CRC(0, 4*bs); got != want {
		t.Fatalf("a write under a window over unregistered memory landed in the memory registered again (%+v)", st)
	}
	if st.State == engine.Completed {
		t.Fatalf("a write under a window over unregistered memory completed: %+v", st)
	}
	t.Logf("refused: %v", st.Err)
}
