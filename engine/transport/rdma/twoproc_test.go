package rdma_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/rdma"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/sys/gpu/gputest"
	"github.com/tecache/te/internal/sys/ibv/ibvtest"
	"github.com/tecache/te/internal/sys/topo/topotest"
)

// railBytes sums "rail.L:R.bytes" counters by local and by peer NIC.
func railBytes(d map[string]uint64) (local, peer map[string]uint64) {
	local, peer = map[string]uint64{}, map[string]uint64{}
	for k, v := range d {
		name, ok := strings.CutSuffix(strings.TrimPrefix(k, "rail."), ".bytes")
		if !ok || !strings.HasPrefix(k, "rail.") {
			continue
		}
		l, r, _ := strings.Cut(name, ":")
		local[l] += v
		peer[r] += v
	}
	return local, peer
}

// transfer runs one batch of blocks requests on n and checks that it
// completed over want, with the bytes at the target equal to the source's.
func transfer(t *testing.T, n, peer *node, op string, local, remote, size uint64, blocks int, want string) {
	t.Helper()
	r := n.wait(n.do("submit %s %s %d %d %d %d", op, peer.name, local, remote, size, blocks))
	if r.State != "COMPLETED" || !slices.Equal(r.Transports, []string{want}) {
		t.Fatalf("%s of %d bytes: %+v, want COMPLETED over %s", op, size, r, want)
	}
	src, dst := n, peer
	sa, da := local, remote
	if op == "read" {
		src, dst, sa, da = peer, n, remote, local
	}
	if a, b := src.do("crc %d %d", sa, size), dst.do("crc %d %d", da, size); a != b {
		t.Fatalf("%s of %d bytes: CRC %s at the target, %s at the source", op, size, b, a)
	}
}

// GPU to GPU, GPU to host and host to GPU between two processes on the
// recorded HGX node: every request goes over rdma, through the NIC behind
// each GPU's PCIe switch (or the local socket's NICs for host memory), and
// every byte arrives. It runs on each runtime: on hip, the fake HIP runtime
// takes the tree's GPUs as its own (FAKEHIP_PCI_VENDOR), so locality comes
// from hipDeviceGetPCIBusId and the dma-buf from the HSA export.
func TestTwoProcessGPU(t *testing.T) {
	for _, kind := range []string{"cuda", "hip"} {
		t.Run(kind, func(t *testing.T) { testTwoProcessGPU(t, kind) })
	}
}

func testTwoProcessGPU(t *testing.T, kind string) {
	f := newFabricSetup(t, "hgx8")
	var extra []string
	if kind == "hip" {
		if f.hip == "" {
			t.Skip("the fake HIP runtime does not build here")
		}
		extra = append(extra, "FAKEHIP_PCI_VENDOR=0x10de")
	}
	a, b := f.startNode(extra...), f.startNode(extra...)
	const size = 8 << 20
	ag := a.addr("alloc %s 3 %d", kind, size)
	ah := a.addr("alloc cpu %d", size)
	bg := b.addr("alloc %s 5 %d", kind, size)
	bh := b.addr("alloc cpu %d", size)
	a.do("reg %d %d %s:3", ag, size, kind)
	a.do("reg %d %d cpu:1", ah, size)
	b.do("reg %d %d %s:5", bg, size, kind)
	b.do("reg %d %d cpu:0", bh, size)
	a.do("fill %d %d 1", ag, size)
	a.do("fill %d %d 2", ah, size)
	b.do("fill %d %d 3", bg, size)
	a.do("open %s", b.name)
	if s := a.stats(); s["gpu_dmabuf"] != 1 || s["gpu_refused"] != 0 {
		t.Fatalf("GPU registration: %v", s)
	}
	near3, near5 := topotest.NearNIC[3], topotest.NearNIC[5]
	socket0, socket1 := []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}, []string{"mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"}
	for _, c := range []struct {
		name                 string
		op                   string
		local, remote, n     uint64
		localNICs, peerNICs  []string
		exactLocal, exactRem bool
	}{
		// Read first: b's GPU memory holds seed 3 in its first half.
		{"GPU<-GPU read", "read", ag + size/2, bg, size / 2, []string{near3}, []string{near5}, true, true},
		{"GPU->GPU write", "write", ag, bg + size/2, size / 2, []string{near3}, []string{near5}, true, true},
		{"GPU->host write", "write", ag, bh, size, []string{near3}, socket0, true, false},
		{"host->GPU write", "write", ah, bg, size, socket1, []string{near5}, false, true},
	} {
		before := a.stats()
		transfer(t, a, b, c.op, c.local, c.remote, c.n, 4, "rdma")
		l, p := railBytes(diff(before, a.stats()))
		var sum uint64
		for nic, v := range l {
			sum += v
			if !slices.Contains(c.localNICs, nic) {
				t.Errorf("%s: %d bytes through local %s, want only %v (all: %v)", c.name, v, nic, c.localNICs, l)
			}
		}
		for nic := range p {
			if !slices.Contains(c.peerNICs, nic) {
				t.Errorf("%s: bytes through peer %s, want only %v (all: %v)", c.name, nic, c.peerNICs, p)
			}
		}
		if sum != c.n {
			t.Errorf("%s: rails counted %d bytes, want %d", c.name, sum, c.n)
		}
		t.Logf("%s: local %v, peer %v", c.name, l, p)
	}
}

// The three ways GPU memory reaches the NIC: a dma-buf (above), by address
// when the provider has no dma-buf (nvidia-peermem), and not at all when
// the NIC refuses it, in which case the buffer moves by staging over tcp
// and host memory of the same engine still moves over rdma.
func TestTwoProcessGPURegistration(t *testing.T) {
	f := newFabricSetup(t, "hgx8")
	peermem := f.startNode("FAKEVERBS_DMABUF=0")
	refusing := f.startNode("FAKEVERBS_DMABUF=0", "FAKEVERBS_PEERMEM=0")
	const size = 4 << 20
	pg := peermem.addr("alloc cuda 0 %d", size)
	peermem.do("reg %d %d cuda:0", pg, size)
	rg := refusing.addr("alloc cuda 1 %d", size)
	refusing.do("reg %d %d cuda:1", rg, size)
	rh := refusing.addr("alloc cpu %d", size)
	refusing.do("reg %d %d cpu:0", rh, size)
	if s := peermem.stats(); s["gpu_peermem"] != 1 || s["gpu_dmabuf"] != 0 {
		t.Fatalf("peer-memory registration: %v", s)
	}
	if s := refusing.stats(); s["gpu_refused"] != 1 {
		t.Fatalf("refused registration: %v", s)
	}
	peermem.do("fill %d %d 7", pg, size)
	refusing.do("fill %d %d 8", rg, size)
	refusing.do("fill %d %d 9", rh, size)
	peermem.do("open %s", refusing.name)
	refusing.do("open %s", peermem.name)
	transfer(t, peermem, refusing, "write", pg, rg, size, 2, "tcp")  // to a refused buffer: staged
	transfer(t, refusing, peermem, "read", rg, pg, size, 2, "tcp")   // from one: staged
	transfer(t, refusing, peermem, "write", rh, pg, size, 2, "rdma") // host memory there still rdma
	transfer(t, peermem, refusing, "read", pg, rh, size, 2, "rdma")
}

// A NIC that dies in the middle of a transfer: its slices fail over to the
// other rails and every byte arrives; the errors and retries are counted.
func TestTwoProcessNICFails(t *testing.T) {
	f := newFabricSetup(t, "hgx8")
	params := envParams + "=rdma.cooldown=200ms,rdma.error_window=5s"
	a, b := f.startNode(params), f.startNode(params)
	f.control("* rate 100000000") // 100 MB/s a NIC: the transfer takes a while
	const size = 96 << 20
	src := a.addr("alloc cpu %d", size)
	dst := b.addr("alloc cpu %d", size)
	a.do("reg %d %d cpu:0", src, size)
	b.do("reg %d %d cpu:0", dst, size)
	a.do("fill %d %d 11", src, size)
	a.do("open %s", b.name)
	id := a.do("submit write %s %d %d %d %d", b.name, src, dst, size, 24)
	time.Sleep(200 * time.Millisecond) // the rails are busy
	f.control("* rate 100000000", "mlx5_1 fail")
	r := a.wait(id)
	if r.State != "COMPLETED" {
		t.Fatalf("transfer with a NIC failing: %+v", r)
	}
	if x, y := a.do("crc %d %d", src, size), b.do("crc %d %d", dst, size); x != y {
		t.Fatalf("CRC %s at the target, %s at the source", y, x)
	}
	s := a.stats()
	if s["nic.mlx5_1.errors"] == 0 || s["retries"] == 0 {
		t.Fatalf("no errors or retries counted on the failed NIC: %v", s)
	}
	for _, nic := range []string{"mlx5_0", "mlx5_2", "mlx5_3"} {
		if s["nic."+nic+".bytes"] == 0 {
			t.Errorf("%s moved nothing: %v", nic, s)
		}
	}
	t.Logf("mlx5_1: %d bytes, %d errors, %d retries away from it; all retries %d",
		s["nic.mlx5_1.bytes"], s["nic.mlx5_1.errors"], s["nic.mlx5_1.retries"], s["retries"])
}

// A link that goes down in the middle of a transfer: the NIC retransmits
// its work requests (no completion comes) until the queue pair's retry
// timer runs out, about half a second at the default ACK timeout. The stall
// watchdog fails the endpoint long before, since the other rails to the
// peer keep completing; its queue pairs flush, the slices go to the other
// rails and every byte arrives, without spending the slices' attempts.
// Without the watchdog the retry timer's errors do the same, later.
func TestTwoProcessLinkDown(t *testing.T) {
	for _, tc := range []struct {
		name, params string
		watchdog     bool
	}{
		{"watchdog", "", true},
		// The watchdog's verdict spends no attempt: with none to spend
		// the slices still go to the other rails.
		{"watchdog-no-retries", ",rdma.retries=0", true},
		{"retry-timer", ",rdma.stall_timeout=0", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFabricSetup(t, "hgx8")
			// One queue pair of 32 an endpoint: a completion every 16 work
			// requests (1 MiB), so the stall limit (8x what that takes at
			// the measured rate) stays well inside the retry timer even
			// when a loaded host moves a fraction of 100 MB/s.
			params := envParams + "=rdma.qps=1,rdma.depth=32,rdma.cooldown=200ms,rdma.error_window=5s" + tc.params
			a, b := f.startNode(params), f.startNode(params)
			f.control("* rate 100000000")
			const size = 96 << 20
			src := a.addr("alloc cpu %d", size)
			dst := b.addr("alloc cpu %d", size)
			a.do("reg %d %d cpu:0", src, size)
			b.do("reg %d %d cpu:0", dst, size)
			a.do("fill %d %d 13", src, size)
			a.do("open %s", b.name)
			id := a.do("submit write %s %d %d %d %d", b.name, src, dst, size, 24)
			time.Sleep(200 * time.Millisecond) // the rails are busy
			f.control("* rate 100000000", "mlx5_1 down")
			r := a.wait(id)
			if r.State != "COMPLETED" {
				t.Fatalf("transfer with a link going down: %+v", r)
			}
			if x, y := a.do("crc %d %d", src, size), b.do("crc %d %d", dst, size); x != y {
				t.Fatalf("CRC %s at the target, %s at the source", y, x)
			}
			s := a.stats()
			if s["nic.mlx5_1.errors"] == 0 {
				t.Fatalf("no error counted on the NIC whose link went down: %v", s)
			}
			if got := s["stalls"] > 0; got != tc.watchdog {
				t.Fatalf("%d stalls detected, want some: %v", s["stalls"], tc.watchdog)
			}
			t.Logf("mlx5_1: %d errors, %d retries away from it; stalls %d", s["nic.mlx5_1.errors"], s["nic.mlx5_1.retries"], s["stalls"])
		})
	}
}

// A NIC slowed to a tenth of the others gets a much smaller share.
func TestTwoProcessSlowNIC(t *testing.T) {
	f := newFabricSetup(t, "hgx8")
	a, b := f.startNode(), f.startNode()
	f.control("* rate 200000000", "mlx5_2 rate 20000000")
	const size = 64 << 20
	src := a.addr("alloc cpu %d", size)
	dst := b.addr("alloc cpu %d", size)
	a.do("reg %d %d cpu:0", src, size)
	b.do("reg %d %d cpu:0", dst, size)
	a.do("fill %d %d 5", src, size)
	a.do("open %s", b.name)
	// Rates are measured from the first transfers on.
	for i := 0; i < 2; i++ {
		transfer(t, a, b, "write", src, dst, size/4, 4, "rdma")
	}
	before := a.stats()
	transfer(t, a, b, "write", src, dst, size, 8, "rdma")
	l, _ := railBytes(diff(before, a.stats()))
	others := (l["mlx5_0"] + l["mlx5_1"] + l["mlx5_3"]) / 3
	t.Logf("bytes per NIC: %v", l)
	if others == 0 || l["mlx5_2"]*3 > others {
		t.Fatalf("the slowed NIC moved %d bytes, the others %d each: want at most a third of theirs", l["mlx5_2"], others)
	}
}

// A peer whose rdma endpoint is gone (every NIC of its process failed) is
// reported unreachable, and the engine moves the next transfers over tcp.
func TestTwoProcessPeerUnreachable(t *testing.T) {
	f := newFabricSetup(t, "box1")
	params := envParams + "=rdma.retries=1"
	a, b := f.startNode(params), f.startNode(params)
	const size = 1 << 20
	src := a.addr("alloc cpu %d", size)
	dst := b.addr("alloc cpu %d", size)
	a.do("reg %d %d cpu:0", src, size)
	b.do("reg %d %d cpu:0", dst, size)
	a.do("fill %d %d 3", src, size)
	a.do("open %s", b.name)
	transfer(t, a, b, "write", src, dst, size, 4, "rdma")
	f.control(fmt.Sprintf("*@%d fail", b.pid))
	var got []string
	for i := 0; i < 20 && !slices.Contains(got, "tcp"); i++ {
		r := a.wait(a.do("submit write %s %d %d %d %d", b.name, src, dst, size, 4))
		got = append(got, r.Transports...)
		if slices.Equal(r.Transports, []string{"tcp"}) && r.State != "COMPLETED" {
			t.Fatalf("over tcp: %+v", r)
		}
	}
	if !slices.Contains(got, "tcp") {
		t.Fatalf("transfers kept going to %v", got)
	}
	if x, y := a.do("crc %d %d", src, size), b.do("crc %d %d", dst, size); x != y {
		t.Fatal("bytes differ after the fallback")
	}
	if s := a.stats(); s["peers_unreachable"] == 0 {
		t.Fatalf("stats %v", s)
	}
	t.Logf("transports in order: %v", got)
}

// The conformance suite between two processes on the fake fabric: the
// target in a child process, so its stalled-peer cases stop a real peer
// (the fabric holds work requests to a stopped process back, as a peer
// that stopped answering) and its vanishing peer is killed.
func TestConformanceFakeFabric(t *testing.T) {
	lib := ibvtest.Build(t)
	dir := t.TempDir()
	// The child inherits these; this process's copy of the library reads
	// the fabric directory when it first lists devices.
	t.Setenv("TE_IBV_LIBRARY", lib)
	t.Setenv(ibvtest.EnvFabric, dir)
	transporttest.Run(t, transporttest.Setup{Transport: rdma.Name, Process: true, Config: func(c *engine.Config) {
		c.Params = map[string]string{"rdma.library": lib, "rdma.slice": "32KiB", "rdma.depth": "32"}
	}})
}

// TestGPUOverRDMAReal is the GPU check's rdma step (bench/gpu/check.sh, on a
// machine with a GPU and an RDMA NIC, TE_CUDA_REAL=1; on AMD TE_HIP_REAL=1
// and TE_TEST_GPU_KIND=hip): two processes, GPU memory on device 0 in
// each, GPU to GPU, GPU to host and host to GPU over rdma, every byte
// checked. A NIC that refuses GPU memory (no dma-buf and no peer memory
// module) is reported and skips the test, saying why.
func TestGPUOverRDMAReal(t *testing.T) {
	kind := "cuda"
	if os.Getenv(gputest.EnvKind) == "hip" {
		kind = "hip"
	}
	f := newRealSetup(t, kind)
	if _, err := rdma.Probe(); err != nil {
		t.Skipf("no RDMA NIC here: %v", err)
	}
	a, b := f.startNode(), f.startNode()
	size := uint64(64 << 20)
	ag, bg := a.addr("alloc %s 0 %d", kind, size), b.addr("alloc %s 0 %d", kind, size)
	ah, bh := a.addr("alloc cpu %d", size), b.addr("alloc cpu %d", size)
	a.do("reg %d %d %s:0", ag, size, kind)
	b.do("reg %d %d %s:0", bg, size, kind)
	a.do("reg %d %d cpu", ah, size)
	b.do("reg %d %d cpu", bh, size)
	sa, sb := a.stats(), b.stats()
	t.Logf("GPU registration: dma-buf %d/%d, peer memory %d/%d, refused %d/%d",
		sa["gpu_dmabuf"], sb["gpu_dmabuf"], sa["gpu_peermem"], sb["gpu_peermem"], sa["gpu_refused"], sb["gpu_refused"])
	if sa["gpu_refused"]+sb["gpu_refused"] > 0 {
		t.Skip("the NIC refused GPU memory (the nodes' logs say why): load nvidia-peermem or use dma-buf")
	}
	a.do("fill %d %d 1", ag, size)
	a.do("fill %d %d 2", ah, size)
	b.do("fill %d %d 3", bg, size)
	a.do("open %s", b.name)
	start := time.Now()
	transfer(t, a, b, "read", ag, bg, size/2, 16, "rdma")
	transfer(t, a, b, "write", ag+size/2, bg+size/2, size/2, 16, "rdma")
	transfer(t, a, b, "write", ag, bh, size, 16, "rdma")
	transfer(t, a, b, "write", ah, bg, size, 16, "rdma")
	t.Logf("%d MiB over rdma in %v; stats %v", 3*size>>20, time.Since(start), a.stats())
}
