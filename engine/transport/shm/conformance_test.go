package shm_test

import (
	"os"
	"testing"

	"github.com/tecache/te/engine/transport/transporttest"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		os.Exit(runRole(role))
	}
	transporttest.Main(m)
}

// TestConformance runs the suite with the target engine in a child process:
// shm is forced on every request, so each one crosses processes with
// process_vm_readv/writev.
func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.Setup{Transport: "shm", Process: true})
}
