package rdma_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/rdma"
	_ "github.com/tecache/te/engine/transport/tcp"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv/ibvtest"
	"github.com/tecache/te/internal/sys/mem"
)

// TestWindowNotCarriedOverRDMA: an RDMA NIC checks the buffer's rkey, never
// the owner's window, so a request under a window does not go over rdma
// (the software provider counts no work request for it): selection picks
// tcp, which enforces windows, and the bytes land; with rdma forced the
// request fails with NotSupported naming the window, rather than going
// under the buffer's rkey.
func TestWindowNotCarriedOverRDMA(t *testing.T) {
	lib := ibvtest.Build(t)
	fake := ibvtest.Open(t, lib)
	conf := cfg()
	conf.Transports = []string{rdma.Name, "tcp"}
	conf.Params = map[string]string{"rdma.library": lib}
	newE := func() *engine.Engine {
		e, err := engine.New(conf)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	owner, init := newE(), newE()
	const n = 64 << 10
	src, dst := mem.MustAlloc(n), mem.MustAlloc(n)
	t.Cleanup(func() { mem.Free(src); mem.Free(dst) })
	for i := range src {
		src[i] = 0x5A
	}
	if err := init.RegisterMemory(mem.Addr(src), n, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	if err := owner.RegisterMemory(mem.Addr(dst), n, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	key, err := owner.GrantWindowTo(init.Name(), []engine.Range{{Addr: mem.Addr(dst), Length: n}})
	if err != nil {
		t.Fatal(err)
	}
	seg, err := init.OpenSegment(owner.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer init.CloseSegment(seg)
	write := func(tr string, window uint64) engine.BatchStatus {
		t.Helper()
		b, err := init.AllocateBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		if err := b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(src), Segment: seg, Remote: mem.Addr(dst),
			Length: n, Transport: tr, Window: window}); err != nil {
			return engine.BatchStatus{State: engine.Failed, Err: err}
		}
		st, err := b.Wait(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	// Without a window rdma serves: the setup does reach over the fake.
	if st := write("", 0); st.State != engine.Completed {
		t.Fatalf("without a window: %+v", st)
	}
	posted := fake.Stat(ibvtest.StatPosted)
	if posted == 0 {
		t.Fatal("rdma did not serve the request without a window")
	}
	clear(dst)
	if st := write("", key); st.State != engine.Completed || !bytes.Equal(dst, src) {
		t.Fatalf("under the window: %+v", st)
	}
	if got := fake.Stat(ibvtest.StatPosted); got != posted {
		t.Fatalf("%d work requests went over rdma under a window", got-posted)
	}
	st := write(rdma.Name, key)
	if st.State != engine.Failed || errs.CodeOf(st.Err) != errs.NotSupported || !strings.Contains(st.Err.Error(), "window") {
		t.Fatalf("under the window with rdma forced: %+v", st)
	}
	if got := fake.Stat(ibvtest.StatPosted); got != posted {
		t.Fatalf("%d work requests went over rdma under a window", got-posted)
	}
}
