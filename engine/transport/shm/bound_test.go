package shm_test

import (
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

const boundSecret = "cluster secret for bound windows"

// TestWindowBoundToGrantee: the owner (another process) grants a window to
// engine B alone. Engine C, which holds the cluster secret and learned the
// key, is refused over shm (the owner checks the segment its control
// session proved before it grants the range) and nothing lands; B writes;
// once the window is revoked B is refused too and nothing lands.
func TestWindowBoundToGrantee(t *testing.T) {
	const size, bs = 1 << 20, 64 << 10
	p := transporttest.NewChildPeer(t, size, "TE_AUTH_SECRET="+boundSecret)
	defer p.Close()
	newE := func() *engine.Engine {
		e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", ForceTransport: "shm",
			AuthSecret: boundSecret, TransferTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	b, c := newE(), newE()
	key, err := p.GrantTo(b.Name(), [2]uint64{0, 4 * bs})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Fill(0); err != nil {
		t.Fatal(err)
	}
	zero, _ := p.CRC(0, 4*bs)
	write := func(e *engine.Engine, v byte) engine.BatchStatus {
		t.Helper()
		src := mem.MustAlloc(bs)
		defer mem.Free(src)
		for i := range src {
			src[i] = v
		}
		if err := e.RegisterMemory(mem.Addr(src), bs, "cpu", false); err != nil {
			t.Fatal(err)
		}
		defer e.UnregisterMemory(mem.Addr(src))
		seg, err := e.OpenSegment(p.Segment())
		if err != nil {
			t.Fatal(err)
		}
		defer e.CloseSegment(seg)
		bt, err := e.AllocateBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		defer bt.Free()
		if err := bt.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(src), Segment: seg, Remote: p.Addr() + bs, Length: bs, Window: key}); err != nil {
			return engine.BatchStatus{State: engine.Failed, Err: err}
		}
		st, err := bt.Wait(20 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := write(c, 0xEE)
	if st.State != engine.Failed || errs.CodeOf(st.Err) != errs.AccessDenied {
		t.Fatalf("another engine wrote under a window granted to %q: %+v", b.Name(), st)
	}
	if got, _ := p.CRC(0, 4*bs); got != zero {
		t.Fatal("a refused write landed")
	}
	t.Logf("refused: %v", st.Err)
	if st := write(b, 0x5A); st.State != engine.Completed {
		t.Fatalf("the grantee's write: %+v", st)
	}
	if got, _ := p.CRC(0, 4*bs); got == zero {
		t.Fatal("the grantee's write did not land")
	}
	if err := p.Revoke(key); err != nil {
		t.Fatal(err)
	}
	if err := p.Fill(0); err != nil {
		t.Fatal(err)
	}
	if st := write(b, 0x77); st.State != engine.Failed || errs.CodeOf(st.Err) != errs.AccessDenied {
		t.Fatalf("the grantee wrote after the revoke (or was told something other than AccessDenied): %+v", st)
	}
	if got, _ := p.CRC(0, 4*bs); got != zero {
		t.Fatal("a write after the revoke landed")
	}
}
