package file_test

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu/gputest"
)

// TestGPUMemoryToFileAndBack moves device memory into a registered file and
// back into other device memory through the pinned staging rings, once per
// GPU runtime (cuda, hip). On the fake runtimes device memory faults on any
// CPU access and makes pread/pwrite fail with EFAULT, so a pass means every
// byte was staged. TE_CUDA_REAL=1 (TE_HIP_REAL=1) runs it against a GPU.
func TestGPUMemoryToFileAndBack(t *testing.T) {
	for _, v := range gputest.Vendors() {
		t.Run(v.Kind, func(t *testing.T) {
			if err := v.Ready(); err != nil {
				t.Skipf("no %s runtime and no fake one (needs gcc): %v", v.Kind, err)
			}
			v.Driver(t)
			testGPUFile(t, v)
		})
	}
}

func testGPUFile(t *testing.T, v gputest.Vendor) {
	const n = 6<<20 + 12345 // several staging chunks and a ragged end
	src, err := v.NewBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Free()
	dst, err := v.NewBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	fill(src.Host, 77)
	if err := src.Upload(0, n); err != nil {
		t.Fatal(err)
	}
	host := append([]byte(nil), src.Host...)

	e := newEngine(t, nil)
	if !e.Stats().Caps["file"].GPUMemory {
		t.Fatalf("caps %+v", e.Stats().Caps["file"])
	}
	if err := e.RegisterMemory(src.Addr, n, v.Location(0), false); err != nil {
		t.Fatal(err)
	}
	if err := e.RegisterMemory(dst.Addr, n, v.Location(0), false); err != nil {
		t.Fatal(err)
	}
	fa, err := e.RegisterFile(filepath.Join(directDir(t), "gpu"), 0, 8<<20, engine.FileOptions{Remote: true, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	seg, _ := e.OpenSegment(e.Name())
	for _, bs := range []uint64{n, 1 << 20} {
		if st := transfer(t, e, seg, engine.Write, src.Addr, fa, n, bs); st.State != engine.Completed {
			t.Fatalf("GPU -> file: %+v", st)
		}
		if st := transfer(t, e, seg, engine.Read, dst.Addr, fa, n, bs); st.State != engine.Completed {
			t.Fatalf("file -> GPU: %+v", st)
		}
		got, err := dst.Download(0, n)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, host) {
			t.Fatalf("bs %d: GPU -> file -> GPU differs", bs)
		}
	}
	// Canceled before it starts: CANCELED or COMPLETED, never half.
	b, _ := e.AllocateBatch(1)
	defer b.Free()
	b.Submit(engine.Request{Op: engine.Read, Local: dst.Addr, Segment: seg, Remote: fa, Length: n})
	b.Cancel()
	st, _ := b.Wait(-1)
	if st.State != engine.Completed && st.State != engine.Canceled {
		t.Fatalf("canceled GPU task: %+v", st)
	}
	if st.State == engine.Canceled && errs.CodeOf(st.Err) != errs.Canceled {
		t.Fatalf("canceled GPU task error: %v", st.Err)
	}
}
