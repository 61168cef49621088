package cuda_test

import (
	"bytes"
	"testing"

	"github.com/tecache/te/internal/sys/cuda"
	"github.com/tecache/te/internal/sys/cuda/cudatest"
	"github.com/tecache/te/internal/sys/gpu"
	"github.com/tecache/te/internal/sys/mem"
)

// TestCopiesAsync queues a round trip through two device buffers in one
// CopiesAsync call (host to device, device to device, device to host) plus
// a copy the driver refuses: the bytes come back whole after the stream's
// synchronisation and only the refused copy reports an error.
func TestCopiesAsync(t *testing.T) {
	lib(t)
	const n = 1 << 16
	a, err := cudatest.NewBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Free()
	b, err := cudatest.NewBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	l, _ := cuda.Load()
	d := cuda.Driver{L: l}
	s, err := d.StreamCreate(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.StreamDestroy(s)
	host, back := mem.MustAlloc(n), mem.MustAlloc(n)
	defer mem.Free(host)
	defer mem.Free(back)
	for i := range host {
		host[i] = byte(i*31 + 7)
	}
	cs := []gpu.Copy{
		{Dst: a.Addr, Src: mem.Addr(host), N: n, Dir: gpu.HostToDevice},
		{Dst: b.Addr, Src: a.Addr, N: n, Dir: gpu.DeviceToDevice},
		{Dst: 0, Src: a.Addr, N: n, Dir: gpu.DeviceToDevice},
		{Dst: mem.Addr(back), Src: b.Addr, N: n, Dir: gpu.Default},
	}
	errl := make([]error, len(cs))
	d.CopiesAsync(cs, s, errl)
	if err := d.StreamSync(s); err != nil {
		t.Fatal(err)
	}
	for i, err := range errl {
		if (err != nil) != (i == 2) {
			t.Errorf("copy %d: %v", i, err)
		}
	}
	if !bytes.Equal(back, host) {
		t.Fatal("the round trip changed the bytes")
	}
}
