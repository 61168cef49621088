package cudatest

import (
	"os"

	"github.com/tecache/te/internal/sys/cuda"
	"github.com/tecache/te/internal/sys/mem"
)

// Buffer is device memory on GPU 0 and a host buffer of the same size that
// its contents are filled from and read back into: the device side of the
// GPU tests of several packages (cudaipc, tcp's staging, the transporttest
// suite's GPU peer). The host buffer is outside the Go heap.
type Buffer struct {
	l      *cuda.Lib
	fabric bool
	ctx    cuda.Context
	Addr   uint64 // device address
	N      uint64
	Host   []byte // staging for fills and reads
}

// EnvFabric, set to 1, makes NewBuffer allocate fabric-capable memory
// (cuMemCreate with CU_MEM_HANDLE_TYPE_FABRIC, mapped for GPU 0) instead of
// cuMemAlloc memory: a child process of a test inherits it, so suites that
// allocate through NewBuffer run over multi-node NVLink's fabric handles.
const EnvFabric = "TE_CUDATEST_FABRIC"

// NewBuffer allocates n bytes of device memory (the driver Setup chose):
// cuMemAlloc memory, or fabric memory with EnvFabric=1.
func NewBuffer(n uint64) (*Buffer, error) { return NewBufferOf(n, os.Getenv(EnvFabric) == "1") }

// NewBufferOf allocates n bytes of device memory, fabric memory if fabric
// is set, else cuMemAlloc memory.
func NewBufferOf(n uint64, fabric bool) (*Buffer, error) {
	l, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	d, err := l.DeviceGet(0)
	if err != nil {
		return nil, err
	}
	ctx, err := l.PrimaryCtxRetain(d)
	if err != nil {
		return nil, err
	}
	g := &Buffer{l: l, ctx: ctx, N: n, fabric: fabric}
	if g.Host, err = mem.Alloc(int(n)); err != nil {
		return nil, err
	}
	if err := l.With(ctx, func() (err error) {
		if g.fabric {
			g.Addr, err = l.MemCreate(0, n, cuda.MemHandleTypeFabric)
		} else {
			g.Addr, err = l.MemAlloc(n)
		}
		return
	}); err != nil {
		mem.Free(g.Host)
		return nil, err
	}
	return g, nil
}

// Upload copies Host[off:off+n] to the same range of device memory.
func (g *Buffer) Upload(off, n uint64) error {
	return g.l.With(g.ctx, func() error { return g.l.CopyHtoD(g.Addr+off, mem.Addr(g.Host)+off, n) })
}

// Download copies device [off, off+n) into Host[off:off+n] and returns it.
func (g *Buffer) Download(off, n uint64) ([]byte, error) {
	err := g.l.With(g.ctx, func() error { return g.l.CopyDtoH(mem.Addr(g.Host)+off, g.Addr+off, n) })
	return g.Host[off : off+n], err
}

// Fill sets the whole device buffer to f(i) for each offset i.
func (g *Buffer) Fill(f func(i uint64) byte) error {
	for i := range g.Host {
		g.Host[i] = f(uint64(i))
	}
	return g.Upload(0, g.N)
}

// Free releases the device memory and the host buffer.
func (g *Buffer) Free() {
	g.l.With(g.ctx, func() error {
		if g.fabric {
			return g.l.MemDestroy(g.Addr, g.N)
		}
		return g.l.MemFree(g.Addr)
	})
	mem.Free(g.Host)
}

// Lib returns the driver the buffer was allocated with.
func (g *Buffer) Lib() *cuda.Lib { return g.l }

// With runs fn with the buffer's context current on the calling thread.
func (g *Buffer) With(fn func() error) error { return g.l.With(g.ctx, fn) }
