package file_test

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/cuda"
	"github.com/tecache/te/internal/sys/mem"
)

// gpuSetupErr says why no CUDA driver, real or fake, could be set up.
var gpuSetupErr error

// TestGPUMemoryToFileAndBack moves device memory into a registered file and
// back into other device memory through the pinned staging rings. On the
// fake driver (cudatest) device memory faults on any CPU access and makes
// pread/pwrite fail with EFAULT, so a pass means every byte was staged.
// TE_CUDA_REAL=1 runs it against a real GPU.
func TestGPUMemoryToFileAndBack(t *testing.T) {
	if gpuSetupErr != nil {
		t.Skipf("no CUDA driver and no fake one (needs gcc): %v", gpuSetupErr)
	}
	if err := cuda.Available(); err != nil {
		t.Skipf("CUDA not available: %v", err)
	}
	l, err := cuda.Load()
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := l.DeviceGet(0)
	ctx, err := l.PrimaryCtxRetain(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer l.PrimaryCtxRelease(dev)
	const n = 6<<20 + 12345 // several staging chunks and a ragged end
	var src, dst uint64
	if err := l.With(ctx, func() (err error) {
		if src, err = l.MemAlloc(n); err != nil {
			return err
		}
		dst, err = l.MemAlloc(n)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer l.With(ctx, func() error { l.MemFree(src); return l.MemFree(dst) })
	host := alloc(t, n)
	fill(host, 77)
	if err := l.With(ctx, func() error { return l.CopyHtoD(src, mem.Addr(host), n) }); err != nil {
		t.Fatal(err)
	}

	e := newEngine(t, nil)
	if !e.Stats().Caps["file"].GPUMemory {
		t.Fatalf("caps %+v", e.Stats().Caps["file"])
	}
	if err := e.RegisterMemory(src, n, "cuda:0", false); err != nil {
		t.Fatal(err)
	}
	if err := e.RegisterMemory(dst, n, "cuda:0", false); err != nil {
		t.Fatal(err)
	}
	fa, err := e.RegisterFile(filepath.Join(directDir(t), "gpu"), 0, 8<<20, engine.FileOptions{Remote: true, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	seg, _ := e.OpenSegment(e.Name())
	for _, bs := range []uint64{n, 1 << 20} {
		if st := transfer(t, e, seg, engine.Write, src, fa, n, bs); st.State != engine.Completed {
			t.Fatalf("GPU -> file: %+v", st)
		}
		if st := transfer(t, e, seg, engine.Read, dst, fa, n, bs); st.State != engine.Completed {
			t.Fatalf("file -> GPU: %+v", st)
		}
		got := alloc(t, n)
		if err := l.With(ctx, func() error { return l.CopyDtoH(mem.Addr(got), dst, n) }); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, host) {
			t.Fatalf("bs %d: GPU -> file -> GPU differs", bs)
		}
	}
	// Canceled before it starts: CANCELED or COMPLETED, never half.
	b, _ := e.AllocateBatch(1)
	defer b.Free()
	b.Submit(engine.Request{Op: engine.Read, Local: dst, Segment: seg, Remote: fa, Length: n})
	b.Cancel()
	st, _ := b.Wait(-1)
	if st.State != engine.Completed && st.State != engine.Canceled {
		t.Fatalf("canceled GPU task: %+v", st)
	}
	if st.State == engine.Canceled && errs.CodeOf(st.Err) != errs.Canceled {
		t.Fatalf("canceled GPU task error: %v", st.Err)
	}
}
