package fabric_test

import (
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/tecache/te/engine/std" // the engines these tests build install every standard transport

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/fabric"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/sys/gpu/gputest"
	"github.com/tecache/te/internal/sys/mem"
)

func TestMain(m *testing.M) {
	// The fake GPU runtimes (or the real ones, TE_CUDA_REAL=1 /
	// TE_HIP_REAL=1) for the GPU tests; child processes inherit the choice.
	_ = gputest.Setup()
	transporttest.Main(m)
}

// requireProvider skips, with one line saying why, where libfabric or the
// provider is not installed; it returns the engine parameters that select
// the provider.
func requireProvider(t *testing.T, prov string) map[string]string {
	t.Helper()
	// Not FI_PROVIDER: libfabric reads it once per process, and the
	// tests of one binary use several providers.
	if _, err := fabric.Probe("127.0.0.1", prov); err != nil {
		t.Skipf("fabric over %s unavailable: %v", prov, err)
	}
	return map[string]string{"fabric.provider": prov}
}

// TestConformanceTCPInProcess runs the shared suite over libfabric's tcp
// provider (RDM over ofi_rxm) with both engines in this process, small
// slices so large transfers are many operations.
func TestConformanceTCPInProcess(t *testing.T) {
	p := requireProvider(t, "tcp")
	p["fabric.slice"] = "256KiB"
	transporttest.Run(t, transporttest.Setup{Transport: fabric.Name, Config: func(c *engine.Config) {
		c.Params = p
	}})
}

// sessionSecret is the cluster secret of the session setups.
const sessionSecret = "fabric-conformance-cluster-secret-0123456789"

// processSetup selects the provider for this process and, through the
// environment, for the suite's child peer.
func processSetup(t *testing.T, prov string) transporttest.Setup {
	requireProvider(t, prov)
	t.Setenv("TE_PARAM_fabric_provider", prov)
	return transporttest.Setup{Transport: fabric.Name, Process: true}
}

// TestConformanceTCP runs the suite over the tcp provider with the target
// in a child process: every byte crosses the provider's sockets between
// two processes, and the stall tests (timeout, unregister in flight) run.
func TestConformanceTCP(t *testing.T) {
	s := processSetup(t, "tcp")
	transporttest.Run(t, s)
}

// TestConformanceProvider runs the suite between two processes over the
// provider TE_FABRIC_TEST_PROVIDER names (skipped when unset): the EFA
// device check (bench/efa/check.sh) runs it with efa.
func TestConformanceProvider(t *testing.T) {
	prov := os.Getenv("TE_FABRIC_TEST_PROVIDER")
	if prov == "" {
		t.Skip("TE_FABRIC_TEST_PROVIDER names no provider")
	}
	transporttest.Run(t, processSetup(t, prov))
}

// runSHM runs the suite over shm. libfabric 1.17's shm drops an access
// under a refused key without ever completing it: the stall watchdog
// (fabric.stall_timeout) is what ends those with StaleDescriptor here.
func runSHM(t *testing.T, s transporttest.Setup) {
	transporttest.Run(t, s)
}

// TestConformanceSHM runs it over the shm provider between two processes.
func TestConformanceSHM(t *testing.T) {
	runSHM(t, processSetup(t, "shm"))
}

// TestSHMRefusesSameProcessPeer: two engines of one process never pair
// over the shm provider (it would map the peer through the peer's own
// region, which dangles once that engine closes; this crashed fi_cq_read
// under the conformance suite): a request forced onto fabric is refused
// by name, and without forcing the engine takes the local transport.
func TestSHMRefusesSameProcessPeer(t *testing.T) {
	p := requireProvider(t, "shm")
	conf := func(force string) engine.Config {
		return engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Params: p, ForceTransport: force}
	}
	target, err := engine.New(conf(""))
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	buf := mem.MustAlloc(1 << 20)
	defer mem.Free(buf)
	if err := target.RegisterMemory(mem.Addr(buf), 1<<20, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	for _, force := range []string{fabric.Name, ""} {
		a, err := engine.New(conf(force))
		if err != nil {
			t.Fatal(err)
		}
		src := mem.MustAlloc(4096)
		if err := a.RegisterMemory(mem.Addr(src), 4096, "cpu:0", false); err != nil {
			t.Fatal(err)
		}
		seg, err := a.OpenSegment(target.Name())
		if err == nil {
			var b *engine.Batch
			if b, err = a.AllocateBatch(1); err == nil {
				err = b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(src), Segment: seg, Remote: mem.Addr(buf), Length: 4096})
				if err == nil {
					var st engine.BatchStatus
					st, err = b.Wait(10 * time.Second)
					if err == nil && st.State != engine.Completed {
						err = st.Err
					}
				}
				b.Free()
			}
		}
		switch {
		case force != "" && (err == nil || !strings.Contains(err.Error(), "engine of this process")):
			t.Errorf("forced onto fabric: %v, want a refusal naming the same process", err)
		case force == "" && err != nil:
			t.Errorf("not forced: %v, want the transfer over another transport", err)
		}
		a.Close()
		mem.Free(src)
	}
}

// TestConformanceTCPSession runs it between two processes that hold a
// cluster secret (the child inherits it): the endpoint exchange travels in
// authenticated sessions.
func TestConformanceTCPSession(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	s := processSetup(t, "tcp")
	t.Setenv("TE_AUTH_SECRET", sessionSecret)
	transporttest.Run(t, s)
}

// TestConformanceSHMEncrypted runs it over shm between two processes with
// a secret and an encrypted control plane.
func TestConformanceSHMEncrypted(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	s := processSetup(t, "shm")
	t.Setenv("TE_AUTH_SECRET", sessionSecret)
	t.Setenv("TE_ENCRYPT", "1")
	runSHM(t, s)
}

// TestConformanceTCPEncrypted runs it over tcp between two processes with
// a secret and an encrypted control plane.
func TestConformanceTCPEncrypted(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	s := processSetup(t, "tcp")
	t.Setenv("TE_AUTH_SECRET", sessionSecret)
	t.Setenv("TE_ENCRYPT", "1")
	transporttest.Run(t, s)
}
