package cudaipc_test

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/cudaipc"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/cuda/cudatest"
	"github.com/tecache/te/internal/sys/ibv/ibvtest"
)

// The multi-node NVLink tests run two processes of this machine as engines
// of two hosts: each gives the transport another boot id (TE_CUDAIPC_BOOT_ID),
// so IPC handles are out of reach and only fabric handles can serve. The
// fake driver shares fabric memory between processes of one
// FAKECUDA_FABRIC_DOMAIN.
const (
	envFabricChild = "TE_CUDAIPC_FABRIC_CHILD"
	envFabricAlloc = "TE_CUDAIPC_FABRIC_ALLOC" // "fabric" (cuMemCreate) or "plain" (cuMemAlloc)
	envBootID      = "TE_CUDAIPC_BOOT_ID"
	envFakeDomain  = "FAKECUDA_FABRIC_DOMAIN"
	envMNNVLReal   = "TE_MNNVL_REAL" // run TestMNNVLNode on the real driver
	fabricSize     = 4 << 20
)

// devMem is device memory of GPU 0 made either way (cudatest.Buffer), with
// the fills and CRCs these tests compare.
type devMem struct {
	*cudatest.Buffer
	addr, n uint64
}

func newDevMem(n uint64, fabric bool) (*devMem, error) {
	g, err := cudatest.NewBufferOf(n, fabric)
	if err != nil {
		return nil, err
	}
	return &devMem{Buffer: g, addr: g.Addr, n: g.N}, nil
}

func (m *devMem) fill(seed byte) error {
	return m.Fill(func(i uint64) byte { return byte(i*13) ^ seed })
}

func (m *devMem) crc(off, n uint64) (uint32, error) {
	b, err := m.Download(off, n)
	return crc32.ChecksumIEEE(b), err
}

func (m *devMem) free() { m.Free() }

// runFabricChild is the owner on "another host": GPU memory made as
// TE_CUDAIPC_FABRIC_ALLOC says, registered as cuda:0, then commands.
func runFabricChild() int {
	fail := func(err error) int { fmt.Println("ERR", err); return 1 }
	m, err := newDevMem(fabricSize, os.Getenv(envFabricAlloc) == "fabric")
	if err != nil {
		return fail(err)
	}
	defer m.free()
	if err := m.fill(0x3c); err != nil {
		return fail(err)
	}
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1"})
	if err != nil {
		return fail(err)
	}
	defer e.Close()
	if err := e.RegisterMemory(m.addr, m.n, "cuda:0", true); err != nil {
		return fail(err)
	}
	b := e.Descriptor().Buffers[0]
	fmt.Printf("READY %s %d %d %t\n", e.Name(), m.addr, m.n, b.Extra[cudaipc.ExtraFabric] != "")
	return serveOwner(e, m.addr, m.crc)
}

// writeAll fills this side's buffer from seed, writes all of it into the
// child's, checks the child holds it and returns the transport it took.
func (p *fabricPair) writeAll(t *testing.T, seed byte) string {
	t.Helper()
	if err := p.local.fill(seed); err != nil {
		t.Fatal(err)
	}
	want, _ := p.local.crc(0, p.n)
	st, tr, err := p.do(t, engine.Write, p.local.addr, p.addr, p.n)
	if err != nil || st.State != engine.Completed {
		t.Fatalf("write: %+v %v", st, err)
	}
	if got := p.childCRC(t, 0, p.n); got != fmt.Sprintf("CRC %d <nil>", want) {
		t.Fatalf("child after write over %s: %s, want CRC %d", tr, got, want)
	}
	return tr
}

// fabricPair is this process's engine and the child owner, on two
// "hosts", with the domains given: te's (TE_MNNVL_DOMAIN; "" reads it from
// the fake NVML, which reports the fake driver's fabric) and the fake
// driver's (FAKECUDA_FABRIC_DOMAIN), for the child and for this side.
type fabricPair struct {
	e       *engine.Engine
	c       *cudatest.Child
	local   *devMem
	seg     *engine.Segment
	addr, n uint64
	exports bool // the child's buffer carries a fabric handle
	logs    *syncBuf
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func startFabricPair(t *testing.T, params map[string]string, alloc, childDom, childFake, dom, fake string, env ...string) *fabricPair {
	t.Helper()
	if err := cudaReady(); err != nil {
		t.Skipf("no CUDA runtime and no fake: %v", err)
	}
	if !cudatest.Fake() && os.Getenv(envMNNVLReal) != "1" {
		t.Skip("two hosts are played on the fake driver; on an NVL72 node TE_MNNVL_REAL=1 runs TestMNNVLNode on the real one")
	}
	t.Setenv(envFabricAlloc, alloc)
	t.Setenv(cudaipc.EnvDomain, childDom)
	t.Setenv(envFakeDomain, childFake)
	t.Setenv(envBootID, "host-b")
	c := cudatest.StartChild(t, envFabricChild, 5)
	p := &fabricPair{c: c, logs: &syncBuf{}}
	p.addr, _ = strconv.ParseUint(c.Ready[1], 10, 64)
	p.n, _ = strconv.ParseUint(c.Ready[2], 10, 64)
	p.exports = c.Ready[3] == "true"
	t.Setenv(cudaipc.EnvDomain, dom)
	t.Setenv(envFakeDomain, fake)
	t.Setenv(envBootID, "host-a")
	// Whatever this side alone sees differently (env: K=V pairs).
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	var err error
	p.e, err = engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1",
		Params: params, Logger: slog.New(slog.NewTextHandler(p.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.e.Close() })
	// This side's GPU memory is plain cuMemAlloc memory: its registration
	// finds no fabric handle, which is fine for the side that copies.
	if p.local, err = newDevMem(fabricSize, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.local.free)
	if err := p.e.RegisterMemory(p.local.addr, p.local.n, "cuda:0", true); err != nil {
		t.Fatal(err)
	}
	if p.seg, err = p.e.OpenSegment(c.Ready[0]); err != nil {
		t.Fatal(err)
	}
	return p
}

// do runs one request and returns its state, error and transport.
func (p *fabricPair) do(t *testing.T, op engine.Opcode, local, remote, n uint64) (engine.BatchStatus, string, error) {
	t.Helper()
	b, err := p.e.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if err := b.Submit(engine.Request{Op: op, Local: local, Segment: p.seg, Remote: remote, Length: n}); err != nil {
		return engine.BatchStatus{}, "", err
	}
	st, err := b.Wait(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ts, _ := b.TaskStatus(0)
	return st, ts.Transport, nil
}

func (p *fabricPair) childCRC(t *testing.T, off, n uint64) string {
	return p.c.Do(t, fmt.Sprintf("crc %d %d", off, n))
}

// TestMNNVLWriteRead: engines of two hosts in one NVLink domain move GPU
// memory GPU to GPU through the owner's fabric handle (cudaipc, chosen over
// tcp, which also reaches the peer), byte-exact both ways; the mapping is
// made once and the owner's Unregister returns only after this side
// unmapped it; a write after that fails.
func TestMNNVLWriteRead(t *testing.T) {
	p := startFabricPair(t, nil, "fabric", "nvl72-a:7", "nvl72-a", "nvl72-a:7", "nvl72-a")
	if !p.exports {
		t.Fatal("the child's cuMemCreate(FABRIC) buffer carries no fabric handle")
	}
	if tr := p.writeAll(t, 0x71); tr != cudaipc.Name {
		t.Fatalf("write went over %q, want cudaipc through the fabric handle", tr)
	}
	// The child's second half now holds our second half; read its first
	// quarter into our second half, at an offset inside the allocation.
	q := p.n / 4
	st, tr, err := p.do(t, engine.Read, p.local.addr+p.n/2, p.addr+q, q)
	if err != nil || st.State != engine.Completed || tr != cudaipc.Name {
		t.Fatalf("read: %+v over %q, %v", st, tr, err)
	}
	got, _ := p.local.crc(p.n/2, q)
	if line := p.childCRC(t, q, q); line != fmt.Sprintf("CRC %d <nil>", got) {
		t.Fatalf("read back CRC %d, child has %s", got, line)
	}
	if n := cudatest.Counter(t, "fakecuda_fabric_imports"); n != 1 {
		t.Fatalf("%d fabric imports live, want 1 (mapped once, cached)", n)
	}
	if st := p.e.TransportStats()["cudaipc"]; st["fabric_opened"] != 1 || st["opened"] != 1 {
		t.Fatalf("TransportStats()[cudaipc] = %v, want one fabric mapping opened", st)
	}
	if line := p.c.Do(t, "unreg"); line != "UNREG <nil>" {
		t.Fatalf("child unregister: %s", line)
	}
	if n := cudatest.Counter(t, "fakecuda_fabric_imports"); n != 0 {
		t.Fatal("the owner's Unregister returned while this process still mapped its fabric memory")
	}
	if st, _, err := p.do(t, engine.Write, p.local.addr, p.addr, 4096); err == nil && st.State == engine.Completed {
		t.Fatal("write to an unregistered fabric buffer completed")
	}
}

// TestMNNVLDomainFromNVML: with no domain configured, each engine reads it
// from NVML (the cluster UUID and clique id of its GPUs' fabric
// registration): two hosts in one clique of one cluster pair over fabric
// handles; in two cliques of it, or where this side's registration is not
// finished, they do not.
func TestMNNVLDomainFromNVML(t *testing.T) {
	const dom = "6e766c37322d61000000000000000000:7" // "nvl72-a", clique 7
	t.Setenv("FAKENVML_CLIQUE", "7")
	t.Run("same clique", func(t *testing.T) {
		p := startFabricPair(t, nil, "fabric", "", "nvl72-a", "", "nvl72-a")
		if !strings.Contains(p.logs.String(), "NVLink domain "+dom+" (from NVML)") {
			t.Fatalf("no domain read from NVML: %s", p.logs.String())
		}
		if tr := p.writeAll(t, 0x5e); tr != cudaipc.Name {
			t.Fatalf("write went over %q, want cudaipc through the fabric handle", tr)
		}
	})
	t.Run("other clique", func(t *testing.T) {
		p := startFabricPair(t, nil, "fabric", "", "nvl72-a", "", "nvl72-a", "FAKENVML_CLIQUE=8")
		if tr := p.writeAll(t, 0x5f); tr == cudaipc.Name {
			t.Fatal("a request between two cliques went over cudaipc")
		}
	})
	t.Run("registration in progress", func(t *testing.T) {
		p := startFabricPair(t, nil, "fabric", "", "nvl72-a", "", "nvl72-a", "FAKENVML_STATE=2")
		if l := p.logs.String(); !strings.Contains(l, "no NVLink domain") || !strings.Contains(l, "has not finished") {
			t.Fatalf("no logged reason for the missing domain: %s", l)
		}
		if tr := p.writeAll(t, 0x60); tr == cudaipc.Name {
			t.Fatal("an engine without a domain went over cudaipc across hosts")
		}
	})
}

// TestMNNVLNode is the multi-node NVLink path as one node of an NVL72 rack
// can check it: two processes of this node as engines of two hosts (other
// boot ids, so IPC handles are out of reach), each reading its domain from
// NVML, the owner's cuMemCreate(FABRIC) memory imported through its fabric
// handle and copied into both ways, byte-exact, and the owner's Unregister
// a fence. Here it runs on the fake driver and NVML; TE_MNNVL_REAL=1 runs
// it on the real ones (bench/gpu/check.sh), where it skips, saying why, on
// a node without a registered fabric.
func TestMNNVLNode(t *testing.T) {
	if !cudatest.Fake() && os.Getenv(envMNNVLReal) != "1" {
		t.Skip("TE_MNNVL_REAL=1 runs it on the real driver")
	}
	p := startFabricPair(t, nil, "fabric", "", "nvl72-n", "", "nvl72-n")
	if !strings.Contains(p.logs.String(), "NVLink domain ") {
		if !cudatest.Fake() {
			t.Skipf("no NVLink domain on this node: %s", p.logs.String())
		}
		t.Fatalf("no domain read from the fake NVML: %s", p.logs.String())
	}
	if !p.exports {
		t.Fatal("the owner's cuMemCreate(FABRIC) buffer carries no fabric handle")
	}
	if tr := p.writeAll(t, 0x3d); tr != cudaipc.Name {
		t.Fatalf("write went over %q, want cudaipc through the fabric handle", tr)
	}
	st, tr, err := p.do(t, engine.Read, p.local.addr, p.addr+p.n/2, p.n/2)
	if err != nil || st.State != engine.Completed || tr != cudaipc.Name {
		t.Fatalf("read: %+v over %q, %v", st, tr, err)
	}
	got, _ := p.local.crc(0, p.n/2)
	if line := p.childCRC(t, p.n/2, p.n/2); line != fmt.Sprintf("CRC %d <nil>", got) {
		t.Fatalf("read back CRC %d, child has %s", got, line)
	}
	if st := p.e.TransportStats()["cudaipc"]; st["fabric_opened"] != 1 {
		t.Fatalf("TransportStats()[cudaipc] = %v, want one fabric mapping opened", st)
	}
	if line := p.c.Do(t, "unreg"); line != "UNREG <nil>" {
		t.Fatalf("owner unregister: %s", line)
	}
	if st, _, err := p.do(t, engine.Write, p.local.addr, p.addr, 4096); err == nil && st.State == engine.Completed {
		t.Fatal("write to an unregistered fabric buffer completed")
	}
}

// TestMNNVLOtherDomain: engines of two hosts in different NVLink domains
// never pair over fabric handles: the request goes over tcp, byte-exact.
func TestMNNVLOtherDomain(t *testing.T) {
	p := startFabricPair(t, nil, "fabric", "nvl72-a:7", "nvl72-a", "nvl72-b:3", "nvl72-b")
	if tr := p.writeAll(t, 0x29); tr == cudaipc.Name {
		t.Fatal("a request between two NVLink domains went over cudaipc")
	}
	if n := cudatest.Counter(t, "fakecuda_fabric_imports"); n != 0 {
		t.Fatalf("%d fabric handles imported across domains", n)
	}
}

// TestMNNVLPlainAlloc: cuMemAlloc memory has no fabric handle: the owner
// publishes none and logs why, and a peer on another host of the domain
// moves it over another transport. This side's own cuMemAlloc buffer logs
// the same reason.
func TestMNNVLPlainAlloc(t *testing.T) {
	p := startFabricPair(t, nil, "plain", "nvl72-a:7", "nvl72-a", "nvl72-a:7", "nvl72-a")
	if p.exports {
		t.Fatal("a cuMemAlloc buffer published a fabric handle")
	}
	if l := p.logs.String(); !strings.Contains(l, "has no fabric handle") || !strings.Contains(l, "cuMemAlloc memory has no fabric handle") {
		t.Fatalf("no logged reason for this side's cuMemAlloc buffer: %s", l)
	}
	if tr := p.writeAll(t, 0x44); tr == cudaipc.Name {
		t.Fatal("a buffer without a fabric handle went over cudaipc across hosts")
	}
}

// TestMNNVLForeignHandle: both engines claim one domain, but the driver
// (the IMEX fabric) refuses the handle as another domain's: the request
// fails with AccessDenied and the driver's reason, nothing stays mapped,
// and the process carries on.
func TestMNNVLForeignHandle(t *testing.T) {
	p := startFabricPair(t, nil, "fabric", "nvl72-a:7", "nvl72-a", "nvl72-a:7", "nvl72-z")
	st, tr, err := p.do(t, engine.Write, p.local.addr, p.addr, 4096)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	if st.State == engine.Completed {
		t.Fatal("a write through a foreign fabric handle completed")
	}
	if tr != cudaipc.Name {
		t.Fatalf("went over %q, want cudaipc (the handle is only refused by the driver)", tr)
	}
	b, _ := p.e.AllocateBatch(1)
	defer b.Free()
	b.Submit(engine.Request{Op: engine.Write, Local: p.local.addr, Segment: p.seg, Remote: p.addr, Length: 4096})
	b.Wait(30 * time.Second)
	ts, _ := b.TaskStatus(0)
	if errs.CodeOf(ts.Err) != errs.AccessDenied || !strings.Contains(fmt.Sprint(ts.Err), "cuMemImportFromShareableHandle") {
		t.Fatalf("error %v, want AccessDenied from cuMemImportFromShareableHandle", ts.Err)
	}
	if n := cudatest.Counter(t, "fakecuda_fabric_imports"); n != 0 {
		t.Fatalf("%d fabric imports left after a refused import", n)
	}
}

// TestMNNVLRankedOverRDMA: with rdma installed on both sides too (the fake
// verbs, one fabric for both processes, GPU memory registered by
// dma-buf), a peer of the same NVLink domain goes over cudaipc's fabric
// handle, and a peer of another domain over rdma; both byte-exact.
func TestMNNVLRankedOverRDMA(t *testing.T) {
	lib := ibvtest.Build(t)
	t.Setenv("TE_IBV_LIBRARY", lib) // the child's rdma loads it too
	t.Setenv(ibvtest.EnvFabric, t.TempDir())
	for _, c := range []struct{ name, dom, fake, want string }{
		{"same-domain", "nvl72-a:7", "nvl72-a", cudaipc.Name},
		{"other-domain", "nvl72-b:3", "nvl72-b", "rdma"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startFabricPair(t, map[string]string{"rdma.library": lib}, "fabric", "nvl72-a:7", "nvl72-a", c.dom, c.fake)
			if !slices.Contains(p.e.Transports(), "rdma") {
				t.Fatalf("rdma is not installed on the fake verbs: %v", p.e.Transports())
			}
			if tr := p.writeAll(t, 0x5e); tr != c.want {
				t.Fatalf("write went over %q, want %s", tr, c.want)
			}
			st, tr, err := p.do(t, engine.Read, p.local.addr, p.addr+p.n/2, p.n/2)
			if err != nil || st.State != engine.Completed || tr != c.want {
				t.Fatalf("read: %+v over %q, %v", st, tr, err)
			}
			got, _ := p.local.crc(0, p.n/2)
			if line := p.childCRC(t, p.n/2, p.n/2); line != fmt.Sprintf("CRC %d <nil>", got) {
				t.Fatalf("read back CRC %d, child has %s", got, line)
			}
		})
	}
}

// TestMNNVLUnregisterFence: the owner on "another host" unregisters while
// this side's copy into its fabric memory is in flight (the fake makes each
// copy take 300 ms): its Unregister returns only after the copy ended and
// the mapping is gone, so the owner reads every written byte right after
// it, and no byte lands later. The delay is read once per process, so the
// case runs in a process of its own.
func TestMNNVLUnregisterFence(t *testing.T) {
	if os.Getenv("TE_MNNVL_FENCE_INNER") != "1" {
		if cudaReady() != nil || !cudatest.Fake() {
			t.Skip("needs the fake driver's copy delay")
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestMNNVLUnregisterFence$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "TE_MNNVL_FENCE_INNER=1", "FAKECUDA_COPY_DELAY_US=300000")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestMNNVLUnregisterFence") {
			t.Fatalf("the case failed (%v):\n%s", err, tail(string(out), 4000))
		}
		return
	}
	p := startFabricPair(t, nil, "fabric", "nvl72-a:7", "nvl72-a", "nvl72-a:7", "nvl72-a")
	if err := p.local.fill(0x6b); err != nil {
		t.Fatal(err)
	}
	want, _ := p.local.crc(0, p.n)
	// Map the handle first, so the next write is a copy from its start.
	if st, tr, err := p.do(t, engine.Write, p.local.addr, p.addr, 4096); err != nil || st.State != engine.Completed || tr != cudaipc.Name {
		t.Fatalf("first write: %+v over %q, %v", st, tr, err)
	}
	b, err := p.e.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if err := b.Submit(engine.Request{Op: engine.Write, Local: p.local.addr, Segment: p.seg, Remote: p.addr, Length: p.n}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(80 * time.Millisecond) // the copy is in flight
	t0 := time.Now()
	if line := p.c.Do(t, "unreg"); line != "UNREG <nil>" {
		t.Fatalf("child unregister: %s", line)
	}
	took := time.Since(t0)
	if got := p.childCRC(t, 0, p.n); got != fmt.Sprintf("CRC %d <nil>", want) {
		t.Fatalf("the owner's Unregister returned before the copy into it ended: child has %s, want CRC %d", got, want)
	}
	if n := cudatest.Counter(t, "fakecuda_fabric_imports"); n != 0 {
		t.Fatalf("%d fabric imports live after the owner's Unregister returned", n)
	}
	st, err := b.Wait(30 * time.Second)
	if err != nil || st.State != engine.Completed {
		t.Fatalf("the write in flight: %+v %v", st, err)
	}
	t.Logf("Unregister waited %v for the copy in flight", took)
	if took < 100*time.Millisecond {
		t.Fatalf("Unregister returned after %v, before the 300 ms copy could end", took)
	}
}
