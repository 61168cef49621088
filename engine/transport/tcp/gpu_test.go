package tcp_test

import (
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
	"github.com/tecache/te/engine/transport/tcp"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/cuda/cudatest"
	"github.com/tecache/te/internal/sys/gpu/gputest"
	"github.com/tecache/te/internal/sys/mem"
)

// GPU memory over tcp, end to end: this process and a child, each with a
// GPU buffer and a host buffer, forced over tcp, once per GPU runtime
// (cuda, hip). With the fake runtimes (cudatest, hiptest) device memory
// faults on any CPU access, so a passing run proves every device byte went
// through the pinned staging rings.

const envGPUChild = "TE_TCP_GPU_CHILD"

// gpuSize is each buffer: the largest transfer (16 MiB) plus room for
// unaligned offsets.
const gpuSize = 16<<20 + 64<<10

// forVendors runs f once per GPU runtime, in a subtest named by its kind,
// with the child processes it starts allocating that runtime's memory.
func forVendors(t *testing.T, f func(t *testing.T, v gputest.Vendor)) {
	for _, v := range gputest.Vendors() {
		t.Run(v.Kind, func(t *testing.T) {
			if err := v.Ready(); err != nil {
				t.Skipf("no %s runtime and no fake (needs gcc): %v", v.Kind, err)
			}
			v.Driver(t)
			t.Setenv(gputest.EnvKind, v.Kind)
			f(t, v)
		})
	}
}

// pattern is the content of a buffer filled with seed: position-dependent
// with no short period, so a chunk landing at the wrong offset is caught.
func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte((uint64(i)*0x9E3779B97F4A7C15)>>56) ^ seed
	}
}

// gpuBuf is the shared device buffer of package gputest, filled with this
// file's pattern.
type gpuBuf struct {
	*gputest.Buffer
	addr uint64
}

func newGPUBuf(v gputest.Vendor, n int) (*gpuBuf, error) {
	b, err := v.NewBuffer(uint64(n))
	if err != nil {
		return nil, err
	}
	return &gpuBuf{Buffer: b, addr: b.Addr}, nil
}

func (g *gpuBuf) fill(seed byte) error {
	pattern(g.Host, seed)
	return g.Upload(0, g.N)
}

// bytes downloads the whole device buffer (into g.Host).
func (g *gpuBuf) bytes() ([]byte, error) { return g.Download(0, g.N) }

func (g *gpuBuf) free() { g.Free() }

// runGPUChild is the target process: a GPU buffer (registered with "*", so
// the engine must recognise it) and a host buffer, then commands on stdin:
// "fill gpu|host SEED" and "crc gpu|host" (of the whole buffer).
func runGPUChild() int {
	fail := func(err error) int { fmt.Println("ERR", err); return 1 }
	g, err := newGPUBuf(gputest.FromEnv(), gpuSize)
	if err != nil {
		return fail(err)
	}
	defer g.free()
	host, err := mem.Alloc(gpuSize)
	if err != nil {
		return fail(err)
	}
	defer mem.Free(host)
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"}, ForceTransport: "tcp"})
	if err != nil {
		return fail(err)
	}
	defer e.Close()
	if err := e.RegisterMemoryBatch([]engine.MemoryRegion{
		{Addr: g.addr, Length: gpuSize, Location: "*", Remote: true},
		{Addr: mem.Addr(host), Length: gpuSize, Location: "cpu", Remote: true},
	}); err != nil {
		return fail(err)
	}
	loc := ""
	for _, b := range e.Descriptor().Buffers {
		if b.Addr == g.addr {
			loc = b.Name
		}
	}
	fmt.Printf("READY %s %d %d %s\n", e.Name(), g.addr, mem.Addr(host), loc)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 3 && f[0] == "fill":
			seed, _ := strconv.Atoi(f[2])
			err := error(nil)
			if f[1] == "gpu" {
				err = g.fill(byte(seed))
			} else {
				pattern(host, byte(seed))
			}
			fmt.Println("OK", err)
		case len(f) == 2 && f[0] == "crc":
			b, err := host, error(nil)
			if f[1] == "gpu" {
				b, err = g.bytes()
			}
			fmt.Println("CRC", crc32.ChecksumIEEE(b), err)
		default:
			return 0
		}
	}
	return 0
}

type gpuChild struct {
	*cudatest.Child
	name     string
	gpu, cpu uint64
	loc      string
}

func startGPUChild(t testing.TB) *gpuChild {
	t.Helper()
	c := &gpuChild{Child: cudatest.StartChild(t, envGPUChild, 5)}
	f := c.Ready
	c.name, c.loc = f[0], f[3]
	c.gpu, _ = strconv.ParseUint(f[1], 10, 64)
	c.cpu, _ = strconv.ParseUint(f[2], 10, 64)
	return c
}

// TestGPUStaged moves GPU memory over tcp between two processes: GPU to GPU,
// GPU to host and host to GPU, READ and WRITE, sizes from 1 byte to 16 MiB
// at unaligned offsets. Both sides keep a model of all four buffers; after
// every transfer the whole destination buffer is compared with its model,
// so a stray byte anywhere fails the test. This side stages through small
// rings (many chunks per slice, wrapping often), the child through the
// default ones.
func TestGPUStaged(t *testing.T) { forVendors(t, testGPUStaged) }

func testGPUStaged(t *testing.T, v gputest.Vendor) {
	lg, err := newGPUBuf(v, gpuSize)
	if err != nil {
		t.Fatal(err)
	}
	defer lg.free()
	lh := alloc(t, gpuSize)
	e, err := engine.New(engine.Config{
		ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"}, ForceTransport: "tcp",
		Params:          map[string]string{"tcp.slice": "256KiB", "tcp.gpu_staging": "512KiB", "tcp.conns": "3"},
		TransferTimeout: 20 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			e.Close()
		}
	}()
	if err := e.RegisterMemory(lg.addr, gpuSize, v.Location(0), false); err != nil {
		t.Fatal(err)
	}
	if err := e.RegisterMemory(mem.Addr(lh), gpuSize, "cpu", false); err != nil {
		t.Fatal(err)
	}
	c := startGPUChild(t)
	if c.loc != v.Location(0) {
		t.Fatalf("child published its GPU buffer as %q, want %s", c.loc, v.Location(0))
	}
	seg, err := e.OpenSegment(c.name)
	if err != nil {
		t.Fatal(err)
	}

	// The four buffers and their models.
	type buf struct {
		name  string
		local bool
		gpu   bool
		addr  uint64
		model []byte
	}
	bufs := map[string]*buf{
		"lgpu": {"local GPU", true, true, lg.addr, make([]byte, gpuSize)},
		"lcpu": {"local host", true, false, mem.Addr(lh), make([]byte, gpuSize)},
		"rgpu": {"remote GPU", false, true, c.gpu, make([]byte, gpuSize)},
		"rcpu": {"remote host", false, false, c.cpu, make([]byte, gpuSize)},
	}
	pattern(bufs["lgpu"].model, 0x11)
	pattern(bufs["lcpu"].model, 0x22)
	pattern(bufs["rgpu"].model, 0x33)
	pattern(bufs["rcpu"].model, 0x44)
	if err := lg.fill(0x11); err != nil {
		t.Fatal(err)
	}
	pattern(lh, 0x22)
	if got := c.Do(t, fmt.Sprintf("fill gpu %d", 0x33)); got != "OK <nil>" {
		t.Fatal(got)
	}
	if got := c.Do(t, fmt.Sprintf("fill host %d", 0x44)); got != "OK <nil>" {
		t.Fatal(got)
	}
	check := func(b *buf, what string) {
		t.Helper()
		want := crc32.ChecksumIEEE(b.model)
		if !b.local {
			kind := "host"
			if b.gpu {
				kind = "gpu"
			}
			if got := c.Do(t, "crc "+kind); got != fmt.Sprintf("CRC %d <nil>", want) {
				t.Fatalf("%s: %s differs from its model: %s, want CRC %d", what, b.name, got, want)
			}
			return
		}
		var got []byte = lh
		if b.gpu {
			if got, err = lg.bytes(); err != nil {
				t.Fatal(err)
			}
		}
		if crc32.ChecksumIEEE(got) != want {
			for i := range got {
				if got[i] != b.model[i] {
					t.Fatalf("%s: %s byte %d is %#x, want %#x", what, b.name, i, got[i], b.model[i])
				}
			}
		}
	}

	sizes := []uint64{1, 7, 4095, 65537, 300001, 1<<20 + 3, 16 << 20}
	pairs := [][2]string{{"lgpu", "rgpu"}, {"lgpu", "rcpu"}, {"lcpu", "rgpu"}}
	k := 0
	for _, n := range sizes {
		for _, p := range pairs {
			for _, op := range []engine.Opcode{engine.Write, engine.Read} {
				k++
				loc, rem := bufs[p[0]], bufs[p[1]]
				loff, roff := uint64(k*4099+1)%(64<<10), uint64(k*8191+3)%(64<<10)
				what := fmt.Sprintf("%v of %d bytes %s+%d <-> %s+%d", op, n, loc.name, loff, rem.name, roff)
				b, err := e.AllocateBatch(1)
				if err != nil {
					t.Fatal(err)
				}
				if err := b.Submit(engine.Request{Op: op, Local: loc.addr + loff, Segment: seg, Remote: rem.addr + roff, Length: n}); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				st, err := b.Wait(30 * time.Second)
				if err != nil || st.State != engine.Completed {
					t.Fatalf("%s: %+v %v", what, st, err)
				}
				if ts, _ := b.TaskStatus(0); ts.Transport != "tcp" {
					t.Fatalf("%s went over %q", what, ts.Transport)
				}
				b.Free()
				dst := rem
				if op == engine.Write {
					copy(rem.model[roff:roff+n], loc.model[loff:loff+n])
				} else {
					copy(loc.model[loff:loff+n], rem.model[roff:roff+n])
					dst = loc
				}
				check(dst, what)
			}
		}
	}
	if v.Fake() {
		if v.Counter(t, "streams") == 0 {
			t.Fatal("no staging stream exists after GPU transfers over tcp")
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		closed = true
		// Close freed every ring: each has a stream per chunk.
		if n, m := v.Counter(t, "streams"), v.Counter(t, "events"); n != 0 || m != 0 {
			t.Fatalf("after Close %d streams and %d events remain", n, m)
		}
	}
}

// TestGPUBatchMixed submits one batch mixing GPU and host memory, READs and
// WRITEs, many requests per connection, so the writers stage device
// payloads of several requests in one pipeline.
func TestGPUBatchMixed(t *testing.T) { forVendors(t, testGPUBatchMixed) }

func testGPUBatchMixed(t *testing.T, v gputest.Vendor) {
	lg, err := newGPUBuf(v, gpuSize)
	if err != nil {
		t.Fatal(err)
	}
	defer lg.free()
	lh := alloc(t, gpuSize)
	e := newEngine(t, "", map[string]string{"tcp.conns": "2", "tcp.slice": "64KiB", "tcp.gpu_staging": "256KiB"})
	if err := e.RegisterMemory(lg.addr, gpuSize, "*", false); err != nil {
		t.Fatal(err)
	}
	if err := e.RegisterMemory(mem.Addr(lh), gpuSize, "cpu", false); err != nil {
		t.Fatal(err)
	}
	c := startGPUChild(t)
	seg, err := e.OpenSegment(c.name)
	if err != nil {
		t.Fatal(err)
	}
	if err := lg.fill(0x5); err != nil {
		t.Fatal(err)
	}
	pattern(lh, 0x6)
	// Blocks of 40 KiB + 1: GPU i -> remote GPU, host i -> remote host
	// (writes); remote GPU -> local host, remote host -> local GPU at the
	// second half (reads of the bytes the child was filled with).
	c.Do(t, "fill gpu 7")
	c.Do(t, "fill host 8")
	const blk, nb = 40<<10 + 1, 64
	half := uint64(8 << 20)
	var reqs []engine.Request
	for i := uint64(0); i < nb; i++ {
		o := i * blk
		reqs = append(reqs,
			engine.Request{Op: engine.Write, Local: lg.addr + o, Segment: seg, Remote: c.gpu + o, Length: blk},
			engine.Request{Op: engine.Write, Local: mem.Addr(lh) + o, Segment: seg, Remote: c.cpu + o, Length: blk},
			engine.Request{Op: engine.Read, Local: mem.Addr(lh) + half + o, Segment: seg, Remote: c.gpu + half + o, Length: blk},
			engine.Request{Op: engine.Read, Local: lg.addr + half + o, Segment: seg, Remote: c.cpu + half + o, Length: blk})
	}
	b, err := e.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if err := b.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	if st, err := b.Wait(30 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("%+v %v", st, err)
	}
	// Models of the four buffers.
	mg, mh, rg, rh := make([]byte, gpuSize), make([]byte, gpuSize), make([]byte, gpuSize), make([]byte, gpuSize)
	pattern(mg, 0x5)
	pattern(mh, 0x6)
	pattern(rg, 7)
	pattern(rh, 8)
	copy(rg[:nb*blk], mg[:nb*blk])
	copy(rh[:nb*blk], mh[:nb*blk])
	copy(mh[half:half+nb*blk], rg[half:half+nb*blk])
	copy(mg[half:half+nb*blk], rh[half:half+nb*blk])
	got, err := lg.bytes()
	if err != nil {
		t.Fatal(err)
	}
	if crc32.ChecksumIEEE(got) != crc32.ChecksumIEEE(mg) {
		t.Error("local GPU buffer differs from its model")
	}
	if crc32.ChecksumIEEE(lh) != crc32.ChecksumIEEE(mh) {
		t.Error("local host buffer differs from its model")
	}
	if line := c.Do(t, "crc gpu"); line != fmt.Sprintf("CRC %d <nil>", crc32.ChecksumIEEE(rg)) {
		t.Errorf("remote GPU buffer differs from its model: %s", line)
	}
	if line := c.Do(t, "crc host"); line != fmt.Sprintf("CRC %d <nil>", crc32.ChecksumIEEE(rh)) {
		t.Errorf("remote host buffer differs from its model: %s", line)
	}
}

// TestGPUStagingParam: a staging budget out of range is refused when the
// engine starts.
func TestGPUStagingParam(t *testing.T) {
	for _, v := range []string{"1KiB", "2GiB", "lots"} {
		_, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"},
			Params: map[string]string{"tcp.gpu_staging": v}})
		if !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("tcp.gpu_staging=%s: %v, want InvalidArgument", v, err)
		}
	}
}

// BenchmarkGPUStagedWrite writes 16 MiB from GPU memory into the child's GPU
// buffer over tcp (staged on both sides) and reports it against the same
// write between the two host buffers in the same run: the ratio is what
// staging costs (with the fake driver the copies are memmoves; on a GPU
// machine, TE_CUDA_REAL=1, they are the real thing). TE_TEST_GPU_KIND=hip
// runs it on HIP.
func BenchmarkGPUStagedWrite(b *testing.B) {
	v, ok := gputest.Of(os.Getenv(gputest.EnvKind))
	if !ok {
		v = gputest.Vendors()[0]
	}
	if err := v.Available(); v.Ready() != nil || err != nil {
		b.Skipf("%s not available: %v %v", v.Kind, v.Ready(), err)
	}
	const n = 16 << 20
	lg, err := newGPUBuf(v, gpuSize)
	if err != nil {
		b.Fatal(err)
	}
	defer lg.free()
	lh, err := mem.Alloc(gpuSize)
	if err != nil {
		b.Fatal(err)
	}
	defer mem.Free(lh)
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"}, ForceTransport: "tcp"})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	if err := e.RegisterMemory(lg.addr, gpuSize, v.Location(0), false); err != nil {
		b.Fatal(err)
	}
	if err := e.RegisterMemory(mem.Addr(lh), gpuSize, "cpu", false); err != nil {
		b.Fatal(err)
	}
	c := startGPUChild(b)
	seg, err := e.OpenSegment(c.name)
	if err != nil {
		b.Fatal(err)
	}
	write := func(local, remote uint64) time.Duration {
		bt, err := e.AllocateBatch(1)
		if err != nil {
			b.Fatal(err)
		}
		defer bt.Free()
		t0 := time.Now()
		if err := bt.Submit(engine.Request{Op: engine.Write, Local: local, Segment: seg, Remote: remote, Length: n}); err != nil {
			b.Fatal(err)
		}
		if st, err := bt.Wait(30 * time.Second); err != nil || st.State != engine.Completed {
			b.Fatalf("%+v %v", st, err)
		}
		return time.Since(t0)
	}
	write(lg.addr, c.gpu) // connections, rings and first touch
	write(mem.Addr(lh), c.cpu)
	var gpu, host time.Duration
	b.SetBytes(n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		gpu += write(lg.addr, c.gpu)
		b.StopTimer()
		host += write(mem.Addr(lh), c.cpu)
		b.StartTimer()
	}
	b.ReportMetric(float64(n)*float64(b.N)/gpu.Seconds()/1e9, "GB/s")
	b.ReportMetric(float64(n)*float64(b.N)/host.Seconds()/1e9, "host-GB/s")
	b.ReportMetric(host.Seconds()/gpu.Seconds(), "ratio-to-host")
}

// GPU payloads are staged through pinned host memory, bounded per
// connection by the engine parameter tcp.gpu_staging.
func ExampleDefaultOptions() {
	fmt.Println(tcp.DefaultOptions().GPUStaging>>20, "MiB per connection")
	// Output: 4 MiB per connection
}
