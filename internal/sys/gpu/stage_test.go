package gpu_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/tecache/te/internal/sys/cuda"
	"github.com/tecache/te/internal/sys/cuda/cudatest"
	"github.com/tecache/te/internal/sys/gpu"
)

func TestMain(m *testing.M) {
	// The fake CUDA driver (or the real one with TE_CUDA_REAL=1).
	if _, err := cudatest.Setup(); err != nil {
		os.Stderr.WriteString("cudatest: " + err.Error() + "\n")
	}
	os.Exit(m.Run())
}

// TestStagerRoundTrip moves 3 MiB through the runtime-neutral stager on the
// CUDA driver, host -> device and back in 1 MiB chunks, byte for byte.
func TestStagerRoundTrip(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA driver, not even the fake: %v", err)
	}
	d, known, err := gpu.Load("cuda")
	if !known || err != nil {
		t.Fatalf("cuda registered %v: %v", known, err)
	}
	const n, chunk = 3 << 20, 1 << 20
	buf, err := cudatest.NewBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	if dev, isDev, err := d.PointerDevice(buf.Addr); err != nil || !isDev || dev != 0 {
		t.Fatalf("PointerDevice(device buffer) = %d %v %v", dev, isDev, err)
	}
	s, err := gpu.NewStager(d, 0, chunk, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i * 7)
	}
	for off := 0; off < n; off += chunk {
		i := off / chunk % 2
		if err := s.Wait(i); err != nil {
			t.Fatal(err)
		}
		copy(s.Chunk(i), want[off:off+chunk])
		if err := s.ToDevice(i, buf.Addr+uint64(off), chunk); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, n)
	for off := 0; off < n; off += chunk {
		i := off / chunk % 2
		if err := s.ToHost(i, buf.Addr+uint64(off), chunk); err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(i); err != nil {
			t.Fatal(err)
		}
		copy(got[off:], s.Chunk(i))
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes differ after the round trip through the stager")
	}
	if err := s.ToHost(5, buf.Addr, 1); err == nil {
		t.Fatal("chunk 5 of 2 accepted")
	}
}
