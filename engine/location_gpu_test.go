package engine_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/cuda"
	"github.com/tecache/te/internal/sys/mem"
)

// Without CUDA, memory declared as cuda:N is refused with NotSupported and
// the reason, the whole batch is rolled back, and "*" means host memory.
func TestRegisterCUDAWithoutDriver(t *testing.T) {
	if err := cuda.Available(); err == nil {
		t.Skip("CUDA is available here; this test is for machines without it")
	}
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, n := range e.Transports() {
		if n == "cudaipc" {
			t.Fatal("cudaipc installed without CUDA")
		}
	}
	buf := mem.MustAlloc(1 << 16)
	defer mem.Free(buf)
	a := mem.Addr(buf)
	err = e.RegisterMemoryBatch([]engine.MemoryRegion{
		{Addr: a, Length: 4096, Location: "cpu", Remote: true},
		{Addr: a + 8192, Length: 4096, Location: "cuda:0", Remote: true},
	})
	if !errors.Is(err, errs.ErrNotSupported) || !strings.Contains(err.Error(), "cuda:0") || !strings.Contains(err.Error(), "cuda runtime is not available") {
		t.Fatalf("register cuda:0 without CUDA = %v, want NotSupported naming the location and the reason", err)
	}
	if d := e.Descriptor(); len(d.Buffers) != 0 {
		t.Fatalf("failed batch left %d buffers published", len(d.Buffers))
	}
	// The host range of the failed batch is free: registering it alone works.
	if err := e.RegisterMemory(a, 4096, "cpu", true); err != nil {
		t.Fatalf("host range after the failed batch: %v", err)
	}
	// "*" without CUDA is host memory and keeps its name.
	if err := e.RegisterMemory(a+16384, 4096, "*", true); err != nil {
		t.Fatal(err)
	}
	for _, b := range e.Descriptor().Buffers {
		if strings.HasPrefix(b.Name, "cuda") {
			t.Fatalf("buffer %+v named as GPU memory without CUDA", b)
		}
	}
	if err := e.RegisterMemory(a+32768, 4096, "cuda:x", true); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("location cuda:x = %v, want InvalidArgument", err)
	}
}
