package hiptest

import (
	"github.com/tecache/te/internal/sys/hip"
	"github.com/tecache/te/internal/sys/mem"
)

// Buffer is device memory on an AMD GPU and a host buffer of the same size
// that its contents are filled from and read back into, as cudatest.Buffer
// is for CUDA. The host buffer is outside the Go heap.
type Buffer struct {
	l    *hip.Lib
	Addr uint64 // device address
	N    uint64
	Host []byte
}

// NewBuffer allocates n bytes of device memory on device dev.
func NewBuffer(dev int, n uint64) (*Buffer, error) {
	l, err := hip.Load()
	if err != nil {
		return nil, err
	}
	g := &Buffer{l: l, N: n}
	if g.Host, err = mem.Alloc(int(n)); err != nil {
		return nil, err
	}
	if g.Addr, err = l.Malloc(dev, n); err != nil {
		mem.Free(g.Host)
		return nil, err
	}
	return g, nil
}

// Upload copies Host[off:off+n] to the same range of device memory.
func (g *Buffer) Upload(off, n uint64) error {
	return g.l.Memcpy(g.Addr+off, mem.Addr(g.Host)+off, n)
}

// Download copies device [off, off+n) into Host[off:off+n] and returns it.
func (g *Buffer) Download(off, n uint64) ([]byte, error) {
	err := g.l.Memcpy(mem.Addr(g.Host)+off, g.Addr+off, n)
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
	g.l.Free(g.Addr)
	mem.Free(g.Host)
}
