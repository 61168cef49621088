package file_test

import (
	_ "github.com/tecache/te/engine/std" // the engines of these tests install every standard transport

	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/tecache/te/internal/sys/gpu/gputest"
)

func TestMain(m *testing.M) {
	if os.Getenv("TE_FILE_CHILD") != "" {
		// A storage node for a test in the parent process.
		os.Exit(m.Run())
	}
	// The real runtimes where TE_CUDA_REAL=1 or TE_HIP_REAL=1, else the
	// fakes.
	// A vendor that could not be set up skips its own cases (Vendor.Ready).
	_ = gputest.Setup()
	goleak.VerifyTestMain(m)
}
