package fabric_test

import (
	"hash/crc32"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/fabric"
	"github.com/tecache/te/engine/transport/tcp"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/sys/gpu/gputest"
	"github.com/tecache/te/internal/sys/mem"
)

// TestGPUMemoryHMEM asks the provider for FI_HMEM (fabric.hmem=on) and
// moves GPU memory of each runtime to and from a child process. Here the
// provider is libfabric's shm (the one that offers FI_HMEM in Debian's
// build), built without CUDA and ROCr support, so the real library refuses
// the registration: the region must stay off the NICs (gpu_staged, no
// keys), requests on it must go to tcp's staging and land byte-exact, and
// host memory must still move over fabric on the same endpoints (shm with
// FI_HMEM copies through its bounce buffers, cross-memory attach off).
// With the fake runtimes device memory faults on any CPU access, so a
// provider that copied it as host memory would crash the test.
//
// The EFA device check (bench/efa/check.sh) runs it with
// TE_FABRIC_TEST_PROVIDER=efa, the real CUDA runtime and
// TE_FABRIC_TEST_HMEM=1: there the NIC must register the GPU region
// (gpu_hmem) and move it itself.
func TestGPUMemoryHMEM(t *testing.T) {
	prov := os.Getenv("TE_FABRIC_TEST_PROVIDER")
	if prov == "" {
		prov = "shm"
	}
	hmem := os.Getenv("TE_FABRIC_TEST_HMEM") == "1"
	p := requireProvider(t, prov)
	p["fabric.hmem"] = "on"
	const size = 4 << 20
	for _, v := range gputest.Vendors() {
		t.Run(v.Kind, func(t *testing.T) {
			if err := v.Ready(); err != nil {
				t.Skipf("no %s runtime and no fake (needs gcc): %v", v.Kind, err)
			}
			v.Driver(t)
			t.Setenv(gputest.EnvKind, v.Kind)
			peer := transporttest.NewChildPeer(t, size, "TE_PARAM_fabric_provider="+prov, "TE_PARAM_fabric_hmem=on")
			defer peer.Close()
			e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1",
				Transports: []string{fabric.Name, tcp.Name}, TransferTimeout: 20 * time.Second, Params: p})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			g, err := v.NewBuffer(size)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Free()
			if err := g.Fill(func(i uint64) byte { return byte(i*7 + i>>12) }); err != nil {
				t.Fatal(err)
			}
			host := mem.MustAlloc(size)
			defer mem.Free(host)
			for i := range host {
				host[i] = byte(i>>10) ^ 0x5a
			}
			if err := e.RegisterMemory(g.Addr, size, v.Location(0), false); err != nil {
				t.Fatal(err)
			}
			if err := e.RegisterMemory(mem.Addr(host), size, "cpu:0", false); err != nil {
				t.Fatal(err)
			}
			st := e.TransportStats()[fabric.Name]
			if st["nics_hmem"] == 0 {
				t.Fatalf("fabric opened no NIC with FI_HMEM (fabric.hmem=on, provider %s offers it)", prov)
			}
			gpuBy := tcp.Name
			if hmem {
				gpuBy = fabric.Name
				if st["gpu_hmem"] != 1 || st["gpu_staged"] != 0 {
					t.Fatalf("fabric stats after registering %s memory: gpu_hmem %d gpu_staged %d, want 1 and 0", v.Kind, st["gpu_hmem"], st["gpu_staged"])
				}
			} else if st["gpu_staged"] != 1 || st["gpu_hmem"] != 0 {
				t.Fatalf("fabric stats after registering %s memory: gpu_staged %d gpu_hmem %d, want 1 and 0 (libfabric here has no %s support)",
					v.Kind, st["gpu_staged"], st["gpu_hmem"], v.Kind)
			}
			seg, err := e.OpenSegment(peer.Segment())
			if err != nil {
				t.Fatal(err)
			}
			defer e.CloseSegment(seg)
			move := func(op engine.Opcode, local uint64, want string) {
				t.Helper()
				b, err := e.AllocateBatch(1)
				if err != nil {
					t.Fatal(err)
				}
				defer b.Free()
				if err := b.Submit(engine.Request{Op: op, Local: local, Segment: seg, Remote: peer.Addr(), Length: size}); err != nil {
					t.Fatal(err)
				}
				if st, err := b.Wait(20 * time.Second); err != nil || st.State != engine.Completed {
					t.Fatalf("%v at %#x: %+v %v", op, local, st, err)
				}
				if ts, err := b.TaskStatus(0); err != nil || ts.Transport != want {
					t.Fatalf("%v at %#x served by %q (%v), want %s", op, local, ts.Transport, err, want)
				}
			}
			crc := func(what string, want uint32) {
				t.Helper()
				if got, err := peer.CRC(0, size); err != nil || got != want {
					t.Fatalf("peer after %s: crc %08x (%v), want %08x", what, got, err, want)
				}
			}
			move(engine.Write, g.Addr, gpuBy)
			dev, err := g.Download(0, size)
			if err != nil {
				t.Fatal(err)
			}
			crc("the GPU write", crc32.ChecksumIEEE(dev))
			move(engine.Write, mem.Addr(host), fabric.Name)
			crc("the host write", crc32.ChecksumIEEE(host))
			// Back into GPU memory: the host pattern must arrive whole.
			move(engine.Read, g.Addr, gpuBy)
			if dev, err = g.Download(0, size); err != nil {
				t.Fatal(err)
			}
			if crc32.ChecksumIEEE(dev) != crc32.ChecksumIEEE(host) {
				t.Fatalf("GPU buffer after the read differs from the peer's bytes")
			}
		})
	}
}

// TestHMEMAskedWhereWanted checks fabric.hmem: by default shm is opened
// without FI_HMEM (with it, libfabric's shm gives up cross-memory attach),
// "on" asks it of shm too, "off" of none; a bad value is refused by name.
// Over tcp, which has no FI_HMEM in this libfabric, the default falls back
// to the offer without it (every other tcp test runs through that too).
func TestHMEMAskedWhereWanted(t *testing.T) {
	for _, c := range []struct {
		prov, hmem string
		want       uint64
	}{{"shm", "", 0}, {"shm", "on", 1}, {"shm", "off", 0}, {"tcp", "", 0}, {"tcp", "on", 0}} {
		t.Run(c.prov+"/"+c.hmem, func(t *testing.T) {
			p := requireProvider(t, c.prov)
			if c.hmem != "" {
				p["fabric.hmem"] = c.hmem
			}
			e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{fabric.Name}, Params: p})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if got := e.TransportStats()[fabric.Name]["nics_hmem"]; got != c.want {
				t.Fatalf("nics_hmem %d, want %d", got, c.want)
			}
		})
	}
	_, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{fabric.Name},
		Params: map[string]string{"fabric.provider": "tcp", "fabric.hmem": "maybe"}})
	if err == nil || !strings.Contains(err.Error(), "fabric.hmem") {
		t.Fatalf("fabric.hmem=maybe: %v, want a refusal naming the parameter", err)
	}
}
