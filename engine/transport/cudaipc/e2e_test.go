package cudaipc_test

import (
	_ "github.com/tecache/te/engine/std"

	"bufio"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/cudaipc"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/cuda/cudatest"
	"github.com/tecache/te/internal/sys/gpu"
	"github.com/tecache/te/internal/sys/gpu/gputest"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/sys/nvml/nvmltest"
)

const envChild = "TE_CUDAIPC_CHILD"

var setupErr error

// cudaReady says why the CUDA runtime (real or fake) could not be set up.
func cudaReady() error {
	v, _ := gputest.Of("cuda")
	return v.Ready()
}

func TestMain(m *testing.M) {
	if os.Getenv(envChild) == "1" {
		os.Exit(runChild())
	}
	if os.Getenv(envFabricChild) == "1" {
		os.Exit(runFabricChild())
	}
	// The real runtimes where TE_CUDA_REAL=1 or TE_HIP_REAL=1, else the
	// fakes; child processes (this package's and the suite's peers) inherit
	// the choice.
	setupErr = gputest.Setup()
	// The fake NVML (TE_NVML_REAL=1 keeps the real one): engines with no
	// configured NVLink domain read it there.
	_ = nvmltest.Setup()
	transporttest.Main(m)
}

// forVendors runs f once per GPU runtime (cuda, hip), in a subtest named
// by its kind, with the child processes it starts allocating that
// runtime's memory.
func forVendors(t *testing.T, f func(t *testing.T, v gputest.Vendor)) {
	for _, v := range gputest.Vendors() {
		t.Run(v.Kind, func(t *testing.T) {
			if err := v.Ready(); err != nil {
				t.Skipf("no %s runtime and no fake: %v", v.Kind, err)
			}
			v.Driver(t)
			t.Setenv(gputest.EnvKind, v.Kind)
			f(t, v)
		})
	}
}

// TestConformance runs the shared suite over cudaipc, once per GPU runtime:
// the target is a child process whose buffer is GPU memory (the fake
// runtime's where there is no GPU, whose device memory faults on any CPU
// access), this side's memory is host memory, so every byte (up to 64 MiB
// per transfer) goes through the runtime's IPC and copies. cudaipc honours
// no window keys (the owner does not check each access), so the window
// cases check only what the engine does.
func TestConformance(t *testing.T) {
	forVendors(t, func(t *testing.T, v gputest.Vendor) {
		transporttest.Run(t, transporttest.Setup{Transport: cudaipc.Name, Process: true, GPU: true, GPUKind: v.Kind})
	})
}

// TestConformanceMNNVL runs the shared suite over cudaipc's fabric-handle
// path: the child's GPU buffer is fabric memory (cuMemCreate with
// CU_MEM_HANDLE_TYPE_FABRIC, cudatest.EnvFabric), which has no IPC handle,
// and both engines share an NVLink domain, so every byte goes through the
// imported fabric handle (on one host: the suite's child inherits this
// process's host identity).
func TestConformanceMNNVL(t *testing.T) {
	if err := cudaReady(); err != nil {
		t.Skipf("no CUDA runtime and no fake: %v", err)
	}
	if !cudatest.Fake() {
		t.Skip("on a GPU, the fabric path needs a domain (IMEX): run it across NVL72 nodes")
	}
	t.Setenv(cudatest.EnvFabric, "1")
	t.Setenv(cudaipc.EnvDomain, "suite-domain:1")
	t.Setenv("FAKECUDA_FABRIC_DOMAIN", "suite-domain")
	t.Setenv(gputest.EnvKind, "cuda")
	transporttest.Run(t, transporttest.Setup{Transport: cudaipc.Name, Process: true, GPU: true, GPUKind: "cuda"})
	if n := cudatest.Counter(t, "fakecuda_fabric_imports"); n != 0 {
		t.Fatalf("%d fabric imports left after the suite closed its engines", n)
	}
}

// size is the GPU buffer of each side: TE_CUDAIPC_SIZE bytes (the GPU check
// uses 1 GiB), 8 MiB by default.
func size() uint64 {
	if v, err := strconv.ParseUint(os.Getenv("TE_CUDAIPC_SIZE"), 10, 64); err == nil && v >= 1<<20 {
		return v
	}
	return 8 << 20
}

// gpuBuf is the shared device buffer of package gputest, filled with this
// package's pattern.
type gpuBuf struct {
	*gputest.Buffer
	addr, n uint64
}

func newGPU(v gputest.Vendor, n uint64) (*gpuBuf, error) {
	b, err := v.NewBuffer(n)
	if err != nil {
		return nil, err
	}
	return &gpuBuf{Buffer: b, addr: b.Addr, n: n}, nil
}

func (g *gpuBuf) fill(seed byte) error {
	return g.Fill(func(i uint64) byte { return byte(i*7) ^ seed })
}

func (g *gpuBuf) crc(off, n uint64) (uint32, error) {
	b, err := g.Download(off, n)
	return crc32.ChecksumIEEE(b), err
}

func (g *gpuBuf) free() { g.Free() }

// copyDtoD copies n bytes device to device on a stream of device 0 of d and
// waits for it.
func copyDtoD(d gpu.Driver, dst, src, n uint64) error {
	s, err := d.StreamCreate(0)
	if err != nil {
		return err
	}
	defer d.StreamDestroy(s)
	if err := d.CopyAsync(dst, src, n, gpu.DeviceToDevice, s); err != nil {
		return err
	}
	return d.StreamSync(s)
}

// runChild is the owner process: a GPU buffer registered with "*" (so the
// engine must recognise it), then commands on stdin.
func runChild() int {
	fail := func(err error) int { fmt.Println("ERR", err); return 1 }
	g, err := newGPU(gputest.FromEnv(), size())
	if err != nil {
		return fail(err)
	}
	defer g.free()
	if err := g.fill(0x5a); err != nil {
		return fail(err)
	}
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1"})
	if err != nil {
		return fail(err)
	}
	defer e.Close()
	if err := e.RegisterMemory(g.addr, g.n, "*", true); err != nil {
		return fail(err)
	}
	b := e.Descriptor().Buffers[0]
	fmt.Printf("READY %s %d %d %s\n", e.Name(), g.addr, g.n, b.Name)
	return serveOwner(e, g.addr, g.crc)
}

// serveOwner answers the parent's commands on stdin about the owner's
// buffer registered at addr: "crc OFF N" (its CRC there) and "unreg";
// anything else ends it.
func serveOwner(e *engine.Engine, addr uint64, crc func(off, n uint64) (uint32, error)) int {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 3 && f[0] == "crc":
			off, _ := strconv.ParseUint(f[1], 10, 64)
			n, _ := strconv.ParseUint(f[2], 10, 64)
			c, err := crc(off, n)
			fmt.Println("CRC", c, err)
		case len(f) == 1 && f[0] == "unreg":
			fmt.Println("UNREG", e.UnregisterMemory(addr))
		default:
			return 0
		}
	}
	return 0
}

type child struct {
	*cudatest.Child
	name string
	addr uint64
	n    uint64
	loc  string
}

func startChild(t testing.TB) *child {
	c := &child{Child: cudatest.StartChild(t, envChild, 5)}
	f := c.Ready
	c.name, c.loc = f[0], f[3]
	c.addr, _ = strconv.ParseUint(f[1], 10, 64)
	c.n, _ = strconv.ParseUint(f[2], 10, 64)
	return c
}

func transfer(t *testing.T, e *engine.Engine, reqs ...engine.Request) (engine.BatchStatus, time.Duration) {
	t.Helper()
	b, err := e.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	t0 := time.Now()
	if err := b.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	st, err := b.Wait(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return st, time.Since(t0)
}

// TestGPUToGPU is the GPU conformance case for cudaipc, once per runtime:
// two processes, a GPU buffer each; writes and reads in both directions
// check their bytes; the owner's Unregister closes the peer's mapping
// before it returns. With the fake runtimes it checks te's logic; with
// TE_CUDA_REAL=1 (TE_HIP_REAL=1) on a GPU machine it is the real thing.
func TestGPUToGPU(t *testing.T) { forVendors(t, testGPUToGPU) }

func testGPUToGPU(t *testing.T, v gputest.Vendor) {
	loc := v.Location(0)
	handleKey, _, _ := cudaipc.ExtraKeys(v.Kind)
	n := size()
	g, err := newGPU(v, n)
	if err != nil {
		t.Fatal(err)
	}
	defer g.free()
	force := os.Getenv("TE_GPU_TRANSPORT") // the GPU check runs this over tcp too
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", ForceTransport: force})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.RegisterMemory(g.addr, n, loc, true); err != nil {
		t.Fatal(err)
	}
	if b := e.Descriptor().Buffers[0]; b.Name != loc || b.Extra[handleKey] == "" {
		t.Fatalf("published buffer %+v lacks %s or its IPC handle (%s)", b, loc, handleKey)
	}
	c := startChild(t)
	if c.loc != loc {
		t.Fatalf("child registered its GPU buffer with \"*\" and published %q, want %s", c.loc, loc)
	}
	seg, err := e.OpenSegment(c.name)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.fill(0x11); err != nil {
		t.Fatal(err)
	}
	want, _ := g.crc(0, n)
	if force != "" {
		b, _ := e.AllocateBatch(1)
		err := b.Submit(engine.Request{Op: engine.Write, Local: g.addr, Segment: seg, Remote: c.addr, Length: n})
		if errors.Is(err, errs.ErrNotSupported) {
			t.Skipf("transport %s cannot move GPU memory yet: %v", force, err)
		}
		b.Wait(30 * time.Second)
		b.Free()
	}
	st, _ := transfer(t, e, engine.Request{Op: engine.Write, Local: g.addr, Segment: seg, Remote: c.addr, Length: n})
	if st.State != engine.Completed {
		t.Fatalf("write: %+v", st)
	}
	// The physical reference: the same bytes copied device to device in
	// this process, in the same run.
	ref, err := newGPU(v, n)
	if err != nil {
		t.Fatal(err)
	}
	var refTook time.Duration
	drv := v.Driver(t)
	// Once to warm up (first touch), then timed.
	err = copyDtoD(drv, ref.addr, g.addr, n)
	if err == nil {
		t0 := time.Now()
		err = copyDtoD(drv, ref.addr, g.addr, n)
		refTook = time.Since(t0)
	}
	ref.free()
	if err != nil {
		t.Fatal(err)
	}
	st, took := transfer(t, e, engine.Request{Op: engine.Write, Local: g.addr, Segment: seg, Remote: c.addr, Length: n})
	if st.State != engine.Completed {
		t.Fatalf("write: %+v", st)
	}
	t.Logf("write %d MiB GPU->GPU over %s: %.2f GB/s; device-to-device copy in one process: %.2f GB/s; ratio %.2f",
		n>>20, ts0(force), float64(n)/took.Seconds()/1e9, float64(n)/refTook.Seconds()/1e9, refTook.Seconds()/took.Seconds())
	if got := c.Do(t, "crc 0 "+strconv.FormatUint(n, 10)); got != fmt.Sprintf("CRC %d <nil>", want) {
		t.Fatalf("child after write: %s, want CRC %d", got, want)
	}
	// Read back half of the child's buffer into the second half of ours.
	half := n / 2
	st, took = transfer(t, e, engine.Request{Op: engine.Read, Local: g.addr + half, Segment: seg, Remote: c.addr, Length: half})
	if st.State != engine.Completed {
		t.Fatalf("read: %+v", st)
	}
	got, _ := g.crc(half, half)
	if line := c.Do(t, "crc 0 "+strconv.FormatUint(half, 10)); line != fmt.Sprintf("CRC %d <nil>", got) {
		t.Fatalf("read back %d, child has %s", got, line)
	}
	t.Logf("read %d MiB GPU->GPU over %s: %.2f GB/s", half>>20, ts0(force), float64(half)/took.Seconds()/1e9)
	b, _ := e.AllocateBatch(1)
	b.Submit(engine.Request{Op: engine.Write, Local: g.addr, Segment: seg, Remote: c.addr, Length: 4096})
	b.Wait(10 * time.Second)
	if ts, _ := b.TaskStatus(0); ts.Transport != ts0(force) {
		t.Fatalf("GPU request went over %q, want cudaipc", ts.Transport)
	}
	b.Free()

	if force != "" && force != "cudaipc" {
		return
	}
	if v.Fake() && v.Counter(t, "open_handles") != 1 {
		t.Fatalf("%d handles open, want 1 (opened once, cached)", v.Counter(t, "open_handles"))
	}
	if line := c.Do(t, "unreg"); line != "UNREG <nil>" {
		t.Fatalf("child unregister: %s", line)
	}
	if v.Fake() && v.Counter(t, "open_handles") != 0 {
		t.Fatal("the owner's Unregister returned while this process still mapped its memory")
	}
	st, _ = transfer(t, e, engine.Request{Op: engine.Write, Local: g.addr, Segment: seg, Remote: c.addr, Length: 4096})
	if st.State == engine.Completed {
		t.Fatal("write to an unregistered GPU buffer completed")
	}
}

// ts0 is the transport a GPU request should take.
func ts0(force string) string {
	if force != "" {
		return force
	}
	return "cudaipc"
}

// TestKVHandoff moves a vLLM-shaped KV cache selection GPU to GPU: per layer
// K and V planes of [num_blocks][block_size*heads*head_dim] fp16, a list of
// scattered block ids written as one batch of one request per (layer, K/V,
// block), then read back into a second local region and compared.
func TestKVHandoff(t *testing.T) { forVendors(t, testKVHandoff) }

func testKVHandoff(t *testing.T, v gputest.Vendor) {
	const layers, blockSize, heads, headDim = 8, 16, 8, 128
	const blockBytes = blockSize * heads * headDim * 2 // fp16
	n := size()
	numBlocks := n / 2 / (layers * 2 * blockBytes) // local half: source; other half: read-back
	if numBlocks < 8 {
		t.Skip("buffer too small for the KV layout")
	}
	g, err := newGPU(v, n)
	if err != nil {
		t.Fatal(err)
	}
	defer g.free()
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.RegisterMemory(g.addr, n, "*", true); err != nil {
		t.Fatal(err)
	}
	c := startChild(t)
	seg, err := e.OpenSegment(c.name)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.fill(0x33); err != nil {
		t.Fatal(err)
	}
	plane := numBlocks * blockBytes
	off := func(layer, kv int, block uint64) uint64 { return uint64(layer*2+kv)*plane + block*blockBytes }
	var src, dst []uint64 // prefill block ids -> decode block ids
	for i := uint64(0); i < numBlocks/2; i += 3 {
		src, dst = append(src, i), append(dst, numBlocks-1-i)
	}
	var w, r []engine.Request
	for l := 0; l < layers; l++ {
		for kv := 0; kv < 2; kv++ {
			for i := range src {
				w = append(w, engine.Request{Op: engine.Write, Local: g.addr + off(l, kv, src[i]), Segment: seg,
					Remote: c.addr + off(l, kv, dst[i]), Length: blockBytes})
				r = append(r, engine.Request{Op: engine.Read, Local: g.addr + n/2 + off(l, kv, src[i]), Segment: seg,
					Remote: c.addr + off(l, kv, dst[i]), Length: blockBytes})
			}
		}
	}
	st, took := transfer(t, e, w...)
	if st.State != engine.Completed {
		t.Fatalf("handoff: %+v", st)
	}
	t.Logf("KV handoff: %d blocks of %d KiB in one batch: %.2f GB/s", len(w), blockBytes>>10, float64(len(w)*blockBytes)/took.Seconds()/1e9)
	if st, _ = transfer(t, e, r...); st.State != engine.Completed {
		t.Fatalf("read back: %+v", st)
	}
	for _, q := range w[:min(len(w), 64)] {
		a, _ := g.crc(q.Local-g.addr, blockBytes)
		b, _ := g.crc(q.Local-g.addr+n/2, blockBytes)
		if a != b {
			t.Fatalf("block at %#x differs after the round trip", q.Local)
		}
	}
}

// TestRegisterChecksDevice: a location that does not match what the driver
// says about the memory is refused, and nothing is registered.
func TestRegisterChecksDevice(t *testing.T) { forVendors(t, testRegisterChecksDevice) }

func testRegisterChecksDevice(t *testing.T, v gputest.Vendor) {
	g, err := newGPU(v, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer g.free()
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	host := mem.MustAlloc(1 << 16)
	defer mem.Free(host)
	n, _ := v.Driver(t).DeviceCount()
	for _, c := range []struct {
		addr uint64
		loc  string
	}{{mem.Addr(host), v.Location(0)}, {g.addr, v.Location(n)}} {
		if err := e.RegisterMemory(c.addr, 4096, c.loc, true); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("register %#x as %s = %v, want InvalidArgument", c.addr, c.loc, err)
		}
	}
	if len(e.Descriptor().Buffers) != 0 {
		t.Fatal("refused registrations were published")
	}
}

// TestSameEngineGPU: GPU memory inside one engine goes over cudaipc (plain
// copies; a process cannot open its own handles), host memory stays on the
// local transport.
func TestSameEngineGPU(t *testing.T) { forVendors(t, testSameEngineGPU) }

func testSameEngineGPU(t *testing.T, v gputest.Vendor) {
	g, err := newGPU(v, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer g.free()
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	host := mem.MustAlloc(1 << 20)
	defer mem.Free(host)
	if err := e.RegisterMemoryBatch([]engine.MemoryRegion{
		{Addr: g.addr, Length: 1 << 20, Location: "*", Remote: true},
		{Addr: mem.Addr(host), Length: 1 << 20, Location: "cpu", Remote: true},
	}); err != nil {
		t.Fatal(err)
	}
	seg, err := e.OpenSegment(e.Name())
	if err != nil {
		t.Fatal(err)
	}
	for i := range host {
		host[i] = byte(i * 31)
	}
	want := crc32.ChecksumIEEE(host[:4096])
	b, _ := e.AllocateBatch(2)
	defer b.Free()
	if err := b.Submit(
		engine.Request{Op: engine.Write, Local: mem.Addr(host), Segment: seg, Remote: g.addr + 8192, Length: 4096},
		engine.Request{Op: engine.Write, Local: mem.Addr(host), Segment: seg, Remote: mem.Addr(host) + 65536, Length: 4096},
	); err != nil {
		t.Fatal(err)
	}
	if st, err := b.Wait(10 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("%+v %v", st, err)
	}
	for i, w := range []string{"cudaipc", "local"} {
		if ts, _ := b.TaskStatus(i); ts.Transport != w {
			t.Errorf("request %d went over %q, want %q", i, ts.Transport, w)
		}
	}
	if got, _ := g.crc(8192, 4096); got != want {
		t.Fatal("GPU bytes differ after a same-engine write")
	}
	if crc32.ChecksumIEEE(host[65536:65536+4096]) != want {
		t.Fatal("host bytes differ after a local write")
	}
}

// TestGPUCancelAndClose: a batch of GPU writes canceled right after Submit,
// then a batch in flight when the engine closes. Every task ends (canceled
// ones only before their copy was enqueued), and once the batch or Close
// reported that, a change of the source no longer reaches the owner.
func TestGPUCancelAndClose(t *testing.T) { forVendors(t, testGPUCancelAndClose) }

func testGPUCancelAndClose(t *testing.T, v gputest.Vendor) {
	const per, bs = 512, 16 << 10
	n := uint64(per * bs)
	g, err := newGPU(v, n)
	if err != nil {
		t.Fatal(err)
	}
	defer g.free()
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.RegisterMemory(g.addr, n, v.Location(0), true); err != nil {
		t.Fatal(err)
	}
	c := startChild(t)
	if c.n < n {
		t.Skipf("owner buffer of %d bytes, want %d", c.n, n)
	}
	seg, err := e.OpenSegment(c.name)
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]engine.Request, per)
	for i := range reqs {
		off := uint64(i * bs)
		reqs[i] = engine.Request{Op: engine.Write, Local: g.addr + off, Segment: seg, Remote: c.addr + off, Length: bs}
	}
	stable := func(what string) {
		t.Helper()
		if err := g.fill(0x77); err != nil { // what a late copy would carry
			t.Fatal(err)
		}
		before := c.Do(t, "crc 0 "+strconv.FormatUint(n, 10))
		time.Sleep(300 * time.Millisecond)
		if after := c.Do(t, "crc 0 "+strconv.FormatUint(n, 10)); after != before {
			t.Fatalf("%s: the owner's bytes changed after the tasks had ended (%s -> %s)", what, before, after)
		}
	}
	if err := g.fill(0x21); err != nil {
		t.Fatal(err)
	}
	b, err := e.AllocateBatch(per)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Submit(reqs[:1]...); err != nil { // maps the owner's buffer
		t.Fatal(err)
	}
	if st, err := b.Wait(10 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("%+v %v", st, err)
	}
	if err := b.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := b.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	if err := b.Cancel(); err != nil {
		t.Fatal(err)
	}
	st, err := b.Wait(30 * time.Second)
	if err != nil || st.State == engine.Pending {
		t.Fatalf("canceled batch: %+v %v", st, err)
	}
	canceled := 0
	for i := 0; i < per; i++ {
		ts, _ := b.TaskStatus(i)
		switch ts.State {
		case engine.Completed:
		case engine.Canceled:
			canceled++
		default:
			t.Fatalf("task %d: %v %v", i, ts.State, ts.Err)
		}
	}
	t.Logf("%d of %d writes canceled", canceled, per)
	stable("canceled batch")
	if err := b.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := b.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	e.Close()
	if st := b.Status(); st.State == engine.Pending {
		t.Fatalf("tasks pending after Close returned: %+v", st)
	}
	stable("closed engine")
}
