package tcp

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/sys/cuda"
	"github.com/tecache/te/internal/sys/gpu"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

type noCUDAHost struct{ reg *segment.Registry }

func (h noCUDAHost) SegmentName() string             { return "target" }
func (h noCUDAHost) Instance() string                { return "target-1" }
func (h noCUDAHost) Registry() *segment.Registry     { return h.reg }
func (h noCUDAHost) Control() transport.Control      { return nil }
func (h noCUDAHost) Logf(string, ...any)             {}
func (h noCUDAHost) Param(key string) (string, bool) { return "", false }
func noCUDA(kind string) (gpu.Driver, bool, error) {
	return nil, true, errs.New(errs.NotSupported, kind, "no driver in this test")
}

func mustMmap(t *testing.T, n, prot int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, prot, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// TestGPURegionWithoutCUDA: a target whose registry holds a cuda region but
// that cannot load CUDA refuses READs and WRITEs of it with NotSupported,
// drains the refused payload (the next request on the connection works) and
// never touches the memory: it is mapped PROT_NONE, so a CPU access would
// crash the test. The initiator side refuses a local cuda region the same
// way, and does not offer to move GPU memory.
func TestGPURegionWithoutCUDA(t *testing.T) {
	saved := gpuLoad
	gpuLoad = noCUDA
	defer func() { gpuLoad = saved }()

	const n = 1 << 20
	dev := mustMmap(t, n, unix.PROT_NONE) // as the fake driver maps device memory
	host := mustMmap(t, 4096, unix.PROT_READ|unix.PROT_WRITE)
	reg := segment.NewRegistry()
	gr, err := segment.NewRegion(mem.Addr(dev), n, "cuda:0", true)
	if err != nil {
		t.Fatal(err)
	}
	hr, _ := segment.NewRegion(mem.Addr(host), 4096, "cpu", true)
	if _, _, err := reg.Add(gr, hr); err != nil {
		t.Fatal(err)
	}
	tr := New()
	if err := tr.Start(noCUDAHost{reg}); err != nil {
		t.Fatal(err)
	}
	defer tr.Close()

	nc, err := net.Dial("tcp", tr.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write([]byte(wire.DataPreface)); err != nil {
		t.Fatal(err)
	}
	if _, err := peerauth.Client(nc, nil, "raw-initiator", time.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	var out []byte
	out = wire.AppendDataRequest(out, wire.DataRequest{Kind: wire.DataWrite, ID: 1, Addr: gr.Addr + 5, Length: 100003, Key: gr.Desc.Key})
	out = append(out, make([]byte, 100003)...)
	out = wire.AppendDataRequest(out, wire.DataRequest{Kind: wire.DataRead, ID: 2, Addr: gr.Addr, Length: 4096, Key: gr.Desc.Key})
	out = wire.AppendDataRequest(out, wire.DataRequest{Kind: wire.DataWrite, ID: 3, Addr: hr.Addr, Length: 3, Key: hr.Desc.Key})
	out = append(out, 'a', 'b', 'c')
	if _, err := nc.Write(out); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	want := map[uint64]errs.Code{1: errs.NotSupported, 2: errs.NotSupported, 3: errs.OK}
	for range 3 {
		var h [wire.CompHeaderSize]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			t.Fatal(err)
		}
		c, err := wire.DecodeCompletion(h[:])
		if err != nil {
			t.Fatal(err)
		}
		if c.Status != want[c.ID] || c.Length != 0 {
			t.Errorf("request %d: status %v length %d, want %v", c.ID, c.Status, c.Length, want[c.ID])
		}
		delete(want, c.ID)
	}
	if string(host[:3]) != "abc" {
		t.Fatalf("the host write after the refused ones wrote %q", host[:3])
	}

	// Initiator side: a request from local GPU memory fails at once.
	d := &segment.Desc{Name: "target", Endpoints: map[string]string{Name: tr.Addr().String()}}
	if tr.DeviceMemory(d, &hr.Desc, gr) {
		t.Error("DeviceMemory offers to move local GPU memory without CUDA")
	}
	if !tr.DeviceMemory(d, &gr.Desc, hr) {
		t.Error("DeviceMemory refuses host memory to a remote GPU buffer (the target stages it)")
	}
	done := make(chan error, 1)
	tr.Submit([]transport.Request{{Op: transport.Write, Local: gr.Addr, Remote: hr.Addr, Length: 8, Peer: d, Buffer: &hr.Desc, Key: hr.Desc.Key, Region: gr,
		Owner: transport.DoneFunc(func(err error) { done <- err })}})
	select {
	case err := <-done:
		if !errors.Is(err, errs.ErrNotSupported) {
			t.Fatalf("write from GPU memory without CUDA: %v, want NotSupported", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no completion")
	}
}

// TestGPUCopyFailures: with CUDA loaded, copies that the driver refuses (a
// region said to be cuda:0 that the driver does not know as device memory)
// fail the request, never hang it, and leave the connection usable where
// the stream is still in step: a refused copy into the device drains the
// payload; a refused copy out of it, with the header already promised,
// closes the connection, and the region is released either way.
func TestGPUCopyFailures(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("CUDA not available (no fake driver either): %v", err)
	}
	// Host memory, but registered as device memory: the driver refuses to
	// copy to or from it as device memory, and nothing else touches it.
	fake := mustMmap(t, 1<<20, unix.PROT_READ|unix.PROT_WRITE)
	host := mustMmap(t, 1<<20, unix.PROT_READ|unix.PROT_WRITE)
	reg := segment.NewRegistry()
	gr, _ := segment.NewRegion(mem.Addr(fake), 1<<20, "cuda:0", true)
	hr, _ := segment.NewRegion(mem.Addr(host), 1<<20, "cpu", true)
	if _, _, err := reg.Add(gr, hr); err != nil {
		t.Fatal(err)
	}
	tr := New()
	if err := tr.Start(noCUDAHost{reg}); err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	d := &segment.Desc{Name: "self", Endpoints: map[string]string{Name: tr.Addr().String()}}
	run := func(op transport.Opcode, local, remote uint64, buf *segment.BufferDesc, n uint64) error {
		t.Helper()
		done := make(chan error, 1)
		g, _ := reg.Lookup(local, n)
		tr.Submit([]transport.Request{{Op: op, Local: local, Remote: remote, Length: n, Peer: d, Buffer: buf, Key: buf.Key, Region: g,
			Owner: transport.DoneFunc(func(err error) { done <- err })}})
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("no completion")
			return nil
		}
	}
	for i := range host {
		host[i] = byte(i)
	}
	// Target side, WRITE into "device" memory: refused after the payload.
	if err := run(transport.Write, hr.Addr, gr.Addr, &gr.Desc, 300000); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("write into a region the driver refuses: %v, want InvalidArgument", err)
	}
	// Initiator side, READ into "device" memory: the payload is drained.
	if err := run(transport.Read, gr.Addr, hr.Addr, &hr.Desc, 300000); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("read into a region the driver refuses: %v, want InvalidArgument", err)
	}
	// Target side, READ from "device" memory; initiator side, WRITE from
	// it: the connection is dropped.
	if err := run(transport.Read, hr.Addr, gr.Addr, &gr.Desc, 300000); err == nil {
		t.Fatal("read from a region the driver refuses succeeded")
	}
	if err := run(transport.Write, gr.Addr, hr.Addr, &hr.Desc, 300000); err == nil {
		t.Fatal("write from a region the driver refuses succeeded")
	}
	// Every connection still works or reconnects, and every access ended.
	for i := 0; i < 2*tr.Options().Conns; i++ {
		if err := run(transport.Write, hr.Addr, hr.Addr+(1<<19), &hr.Desc, 4096); err != nil {
			t.Fatalf("host write %d after the failures: %v", i, err)
		}
	}
	if host[1<<19+4095] != host[4095] {
		t.Fatal("host write did not land")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := gr.WaitIdle(ctx); err != nil {
		t.Fatalf("the refused region is still held: %v", err)
	}
}
