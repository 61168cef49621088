package fabric_test

import (
	"testing"

	_ "github.com/tecache/te/engine/std" // the engines these tests build install every standard transport

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/fabric"
	"github.com/tecache/te/engine/transport/transporttest"
)

func TestMain(m *testing.M) { transporttest.Main(m) }

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

// TestConformanceSHMInProcess runs it over shm with both engines here.
func TestConformanceSHMInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	p := requireProvider(t, "shm")
	runSHM(t, transporttest.Setup{Transport: fabric.Name, Config: func(c *engine.Config) { c.Params = p }})
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

// TestConformanceSHMEncrypted runs it over shm in one process with a
// secret and an encrypted control plane.
func TestConformanceSHMEncrypted(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	p := requireProvider(t, "shm")
	runSHM(t, transporttest.Setup{Transport: fabric.Name, Config: func(c *engine.Config) {
		c.AuthSecret, c.Encrypt = sessionSecret, true
		c.Params = p
	}})
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
