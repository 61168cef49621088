package hiptest_test

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
	"github.com/tecache/te/internal/sys/hip/hiptest"
	"github.com/tecache/te/internal/sys/mem"
)

func TestMain(m *testing.M) {
	if _, err := hiptest.Setup(); err != nil {
		os.Stderr.WriteString("hiptest: " + err.Error() + "\n")
	}
	os.Exit(m.Run())
}

func load(t *testing.T) gpu.Driver {
	t.Helper()
	d, known, err := gpu.Load("hip")
	if !known {
		t.Fatal("hip is not registered with package gpu")
	}
	if err != nil {
		t.Skipf("no HIP runtime, not even the fake: %v", err)
	}
	return d
}

// TestDriverOnFake runs the HIP gpu.Driver against the fake runtime: device
// memory is recognised by device, the bus id is normalised, the allocation
// range and UUID are answered, host memory is not device memory, and a
// pinned stager moves 3 MiB host -> device -> host byte for byte.
func TestDriverOnFake(t *testing.T) {
	d := load(t)
	if n, err := d.DeviceCount(); err != nil || n < 1 {
		t.Fatalf("DeviceCount = %d, %v", n, err)
	}
	const n, chunk = 3 << 20, 1 << 20
	buf, err := hiptest.NewBuffer(0, n)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	if dev, isDev, err := d.PointerDevice(buf.Addr + 100); err != nil || !isDev || dev != 0 {
		t.Fatalf("PointerDevice(device) = %d %v %v", dev, isDev, err)
	}
	if _, isDev, err := d.PointerDevice(mem.Addr(buf.Host)); err != nil || isDev {
		t.Fatalf("PointerDevice(host) = %v %v", isDev, err)
	}
	if base, size, err := d.AllocRange(0, buf.Addr+4096); err != nil || base != buf.Addr || size != n {
		t.Fatalf("AllocRange = %#x %d %v, want %#x %d", base, size, err, buf.Addr, n)
	}
	if u, err := d.DeviceUUID(0); err != nil || len(u) != 32 {
		t.Fatalf("DeviceUUID = %q %v", u, err)
	}
	if id, err := d.PCIBusID(0); err != nil || id != "0000:40:00.0" {
		t.Fatalf("PCIBusID = %q %v", id, err)
	}
	s, err := gpu.NewStager(d, 0, chunk, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i * 13)
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
	for i := 0; i < 2; i++ {
		s.Wait(i)
	}
	got, err := buf.Download(0, n)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("device contents differ after staging up (%v)", err)
	}
	// A copy that names host memory as device memory is refused.
	if err := d.CopyAsync(mem.Addr(buf.Host), mem.Addr(buf.Host), 1, gpu.DeviceToHost, 0); err == nil {
		t.Fatal("DeviceToHost from host memory succeeded")
	}
}

// TestDmabufOnFake: the dma-buf of an allocation maps to the same bytes,
// and one that would start inside an allocation is refused.
func TestDmabufOnFake(t *testing.T) {
	d := load(t)
	if !hiptest.Fake() {
		t.Skip("dma-buf contents are checked on the fake only")
	}
	const n = 1 << 20
	buf, err := hiptest.NewBuffer(0, n)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	if err := buf.Fill(func(i uint64) byte { return byte(i>>12) + 1 }); err != nil {
		t.Fatal(err)
	}
	fd, err := d.DmabufFD(0, buf.Addr, n)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	m, err := unix.Mmap(fd, 0, n, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	if !bytes.Equal(m, buf.Host) {
		t.Fatal("dma-buf contents differ from the device buffer")
	}
	if _, err := d.DmabufFD(0, buf.Addr+4096, 4096); !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("dma-buf from inside an allocation: %v, want NotSupported", err)
	}
}

// TestIPCSameProcessRefused: as with a real runtime, a process cannot open
// its own export (cudaipc copies inside one engine directly).
func TestIPCSameProcessRefused(t *testing.T) {
	d := load(t)
	buf, err := hiptest.NewBuffer(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	h, err := d.IPCExport(0, buf.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := d.IPCImport(0, h); err == nil {
		d.IPCClose(0, p)
		t.Fatal("opened its own IPC handle")
	}
	if hiptest.Fake() && hiptest.Counter(t, "fakehip_open_handles") != 0 {
		t.Fatal("handles left open")
	}
}
