package cxl_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	_ "github.com/tecache/te/engine/std"
	"github.com/tecache/te/engine/transport/cxl"
	"github.com/tecache/te/engine/transport/transporttest"
)

// devSize is the size of the file in /dev/shm that stands in for the DAX
// device: the suite's 65 MiB target buffer and room for the tests' own.
const devSize = 128 << 20

// TestMain makes the stand-in device (peer processes inherit TE_CXL_DEVICE
// and map the same file), runs the tests under goleak and removes it.
func TestMain(m *testing.M) {
	if os.Getenv("TE_TRANSPORTTEST_PEER") != "" {
		transporttest.Main(m) // a peer process of the suite
		return
	}
	f, err := os.CreateTemp("/dev/shm", "te-cxl-test-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cxl test device:", err)
		os.Exit(1)
	}
	path := f.Name()
	err = f.Truncate(devSize)
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cxl test device:", err)
		os.Remove(path)
		os.Exit(1)
	}
	os.Setenv(cxl.EnvDevice, path)
	code := m.Run()
	os.Remove(path)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestConformance runs the suite with both engines in this process, which
// share one mapping of the device: every request is forced onto cxl.
func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.Setup{Transport: "cxl", Shared: true})
}

// TestConformanceProcess runs it with the target in a child process that
// maps the same file at its own address: the offsets in the descriptor
// carry the buffer across.
func TestConformanceProcess(t *testing.T) {
	transporttest.Run(t, transporttest.Setup{Transport: "cxl", Shared: true, Process: true})
}
