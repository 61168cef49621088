package cudaipc_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu/gputest"
	"github.com/tecache/te/internal/sys/mem"
)

// TestRuntimesSideBySide: one process with both fake runtimes loaded, one
// engine. CUDA and HIP memory registered with "*" are told apart (published
// as cuda:0 and hip:0), memory of one runtime registered as the other's is
// refused, host memory moves to and from each over cudaipc with that
// runtime's copies, and a copy between the two runtimes' memory never goes
// to cudaipc (no runtime copies the other's memory): it is staged through
// host memory by tcp, byte for byte.
func TestRuntimesSideBySide(t *testing.T) {
	if setupErr != nil {
		t.Skipf("no fake runtimes: %v", setupErr)
	}
	cu, _ := gputest.Of("cuda")
	hp, _ := gputest.Of("hip")
	cu.Driver(t)
	hp.Driver(t)
	const n = 1 << 20
	cg, err := cu.NewBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Free()
	hg, err := hp.NewBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer hg.Free()
	host := mem.MustAlloc(n)
	defer mem.Free(host)
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", TransferTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.RegisterMemory(hg.Addr, n, "cuda:0", true); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("hip memory registered as cuda:0: %v, want InvalidArgument", err)
	}
	if err := e.RegisterMemory(cg.Addr, n, "hip:0", true); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("cuda memory registered as hip:0: %v, want InvalidArgument", err)
	}
	if err := e.RegisterMemoryBatch([]engine.MemoryRegion{
		{Addr: cg.Addr, Length: n, Location: "*", Remote: true},
		{Addr: hg.Addr, Length: n, Location: "*", Remote: true},
		{Addr: mem.Addr(host), Length: n, Location: "cpu", Remote: true},
	}); err != nil {
		t.Fatal(err)
	}
	names := map[uint64]string{}
	for _, b := range e.Descriptor().Buffers {
		names[b.Addr] = b.Name
	}
	if names[cg.Addr] != "cuda:0" || names[hg.Addr] != "hip:0" {
		t.Fatalf("published %v, want cuda:0 and hip:0", names)
	}
	seg, err := e.OpenSegment(e.Name())
	if err != nil {
		t.Fatal(err)
	}
	for i := range host {
		host[i] = byte(i*13 + 1)
	}
	run := func(what string, req engine.Request, want func(string) bool) {
		t.Helper()
		b, err := e.AllocateBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		if err := b.Submit(req); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		st, err := b.Wait(20 * time.Second)
		if err != nil || st.State != engine.Completed {
			t.Fatalf("%s: %+v %v", what, st, err)
		}
		ts, _ := b.TaskStatus(0)
		if !want(ts.Transport) {
			t.Fatalf("%s went over %q", what, ts.Transport)
		}
		t.Logf("%s: %s", what, ts.Transport)
	}
	viaIPC := func(s string) bool { return s == "cudaipc" }
	run("host -> cuda", engine.Request{Op: engine.Write, Local: mem.Addr(host), Segment: seg, Remote: cg.Addr, Length: n}, viaIPC)
	run("cuda -> hip", engine.Request{Op: engine.Read, Local: hg.Addr, Segment: seg, Remote: cg.Addr, Length: n},
		func(s string) bool { return s != "cudaipc" })
	clear(host)
	run("hip -> host", engine.Request{Op: engine.Read, Local: mem.Addr(host), Segment: seg, Remote: hg.Addr, Length: n}, viaIPC)
	got, err := cg.Download(0, n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range host {
		if host[i] != byte(i*13+1) || got[i] != host[i] {
			t.Fatalf("byte %d: host %#x, cuda %#x, want %#x", i, host[i], got[i], byte(i*13+1))
		}
	}
}
