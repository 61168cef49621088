package tcp_test

import (
	_ "github.com/tecache/te/engine/std" // the engines these tests build install every standard transport

	"os"
	"testing"

	"github.com/tecache/te/engine"

	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/sys/cuda/cudatest"
)

func TestMain(m *testing.M) {
	if os.Getenv(envGPUChild) == "1" {
		os.Exit(runGPUChild())
	}
	// The real driver where TE_CUDA_REAL=1, else the fake one (gpu_test.go);
	// child processes inherit the choice.
	_, gpuSetupErr = cudatest.Setup()
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
