package tcp_test

import (
	_ "github.com/tecache/te/engine/std" // the engines these tests build install every standard transport

	"os"
	"testing"

	"github.com/tecache/te/engine"

	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/sys/gpu/gputest"
)

func TestMain(m *testing.M) {
	if os.Getenv(envGPUChild) == "1" {
		os.Exit(runGPUChild())
	}
	// The real runtimes where TE_CUDA_REAL=1 or TE_HIP_REAL=1, else the
	// fakes (gpu_test.go); child processes inherit the choice.
	// A vendor that could not be set up skips its own cases (Vendor.Ready).
	_ = gputest.Setup()
	transporttest.Main(m)
}

// TestConformance runs the shared suite with the target in a child process,
// so every byte crosses a real socket between two processes.
func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.Setup{Transport: "tcp", Process: true})
}

// TestConformanceInProcess runs it again with both engines in this process
// (tcp forced), with small slices and the minimum of connections, so large
// transfers are cut into many slices striped over both connections.
func TestConformanceInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	transporttest.Run(t, transporttest.Setup{Transport: "tcp", Config: func(c *engine.Config) {
		c.Transports = []string{"tcp"}
		c.Params = map[string]string{"tcp.conns": "2", "tcp.slice": "64KiB"}
	}})
}

// TestConformanceRails runs it with both engines publishing an endpoint on
// each of two loopback addresses, small slices: large transfers stripe over
// both rails, and cancellation, fences, windows and refusals hold there as
// on one connection pool.
func TestConformanceRails(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	transporttest.Run(t, transporttest.Setup{Transport: "tcp", Config: func(c *engine.Config) {
		c.Transports = []string{"tcp"}
		c.Params = map[string]string{"tcp.conns": "2", "tcp.slice": "64KiB", "tcp.devices": twoNICs}
	}})
}

// sessionSecret is the cluster secret of the session setups.
const sessionSecret = "conformance-cluster-secret-0123456789"

// TestConformanceSession runs the suite between two processes that hold a
// cluster secret (from the environment, which the child inherits): every
// control and data frame travels in an integrity session.
func TestConformanceSession(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	t.Setenv("TE_AUTH_SECRET", sessionSecret)
	transporttest.Run(t, transporttest.Setup{Transport: "tcp", Process: true})
}

// TestConformanceEncrypted runs it with a secret and encryption, both
// engines in this process, small slices over two connections: payloads
// travel as sealed records, many per request and per write.
func TestConformanceEncrypted(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	transporttest.Run(t, transporttest.Setup{Transport: "tcp", Config: func(c *engine.Config) {
		c.Transports = []string{"tcp"}
		c.AuthSecret, c.Encrypt = sessionSecret, true
		c.Params = map[string]string{"tcp.conns": "2", "tcp.slice": "64KiB"}
	}})
}

// TestConformanceGPU runs the suite with the target's buffer in GPU memory
// of each runtime (cuda, hip), in a child process: transfers of up to 64
// MiB between two processes, staged through pinned rings on the target's
// side.
func TestConformanceGPU(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	forVendors(t, func(t *testing.T, v gputest.Vendor) {
		transporttest.Run(t, transporttest.Setup{Transport: "tcp", Process: true, GPU: true, GPUKind: v.Kind})
	})
}
