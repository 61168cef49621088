package cxl_test

import (
	"strings"
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

func newEngine(t *testing.T, transports ...string) *engine.Engine {
	t.Helper()
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: transports})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestRegisterOutsideMapping: with cxl alone, memory outside the device is
// refused with NotSupported naming the mapping; with tcp beside it, the
// range registers (tcp serves it) and a request forced onto cxl for it is
// refused before anything moves, while one inside the mapping goes.
func TestRegisterOutsideMapping(t *testing.T) {
	priv, err := mem.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free(priv)

	alone := newEngine(t, "cxl")
	err = alone.RegisterMemory(mem.Addr(priv), uint64(len(priv)), "cpu:0", true)
	if errs.CodeOf(err) != errs.NotSupported || !strings.Contains(err.Error(), "outside the CXL mapping") {
		t.Fatalf("cxl alone registered private memory: %v", err)
	}
	base, size, err := alone.CXLMemory()
	if err != nil || size != devSize {
		t.Fatalf("CXLMemory = %#x, %d, %v", base, size, err)
	}
	// Straddling the end of the mapping is outside too.
	err = alone.RegisterMemory(base+size-4096, 8192, "cpu:0", true)
	if errs.CodeOf(err) != errs.NotSupported {
		t.Fatalf("a range across the mapping's end: %v", err)
	}
	if err := alone.RegisterMemory(base+size-4096, 4096, "cpu:0", true); err != nil {
		t.Fatalf("the mapping's last page: %v", err)
	}

	owner := newEngine(t, "cxl", "tcp")
	if err := owner.RegisterMemory(mem.Addr(priv), uint64(len(priv)), "cpu:0", true); err != nil {
		t.Fatalf("with tcp beside cxl, private memory must register: %v", err)
	}
	if err := owner.RegisterMemory(base, 1<<16, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	init := newEngine(t, "cxl", "tcp")
	local, err := mem.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free(local)
	if err := init.RegisterMemory(mem.Addr(local), uint64(len(local)), "cpu:0", false); err != nil {
		t.Fatal(err)
	}
	seg, err := init.OpenSegment(owner.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer init.CloseSegment(seg)
	b, err := init.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	err = b.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(local), Segment: seg, Remote: mem.Addr(priv), Length: 4096, Transport: "cxl"})
	if err == nil {
		st, _ := b.Wait(10e9)
		if st.State == engine.Completed {
			t.Fatal("cxl served a range outside the owner's mapping")
		}
	}
	// Unforced, the private range goes over tcp and the shared one over cxl.
	copy(mem.Bytes(base, 4096), strings.Repeat("x", 4096))
	for _, remote := range []uint64{mem.Addr(priv), base} {
		b2, _ := init.AllocateBatch(1)
		if err := b2.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(local), Segment: seg, Remote: remote, Length: 4096}); err != nil {
			t.Fatal(err)
		}
		if st, err := b2.Wait(10e9); err != nil || st.State != engine.Completed {
			t.Fatalf("read of %#x: %+v %v", remote, st, err)
		}
		b2.Free()
	}
	if got := init.TransportStats()["cxl"]["bytes_read"]; got != 4096 {
		t.Fatalf("cxl read %d bytes, want 4096 (the shared range only)", got)
	}
}
