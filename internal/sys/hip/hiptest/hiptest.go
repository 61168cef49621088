// Package hiptest builds and installs a fake HIP runtime for tests on
// machines without an AMD GPU, as cudatest does for CUDA, and tells tests
// which runtime they run against.
//
// The fake (testdata/fakehip.c) exports the runtime entry points package
// hip binds, with hip_runtime_api.h's signatures. Its "device memory" is
// mapped PROT_NONE at the address it hands out, so code that touches it
// from the CPU faults as it would on a GPU; copies check the direction they
// are told; IPC handles share memory between processes of one host; the
// dma-buf export gives the allocation's memory object. It proves te's logic
// and ABI use, not a real runtime's behaviour or speed. Its symbols do not
// collide with the fake CUDA driver's, so one process may load both.
package hiptest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ebitengine/purego"

	"github.com/tecache/te/internal/sys/hip"
)

// EnvReal, set to 1, makes Setup leave the real runtime in place (on a
// machine with an AMD GPU), so the same tests run against hardware.
const EnvReal = "TE_HIP_REAL"

// Setup chooses the runtime for this test process, before anything calls
// hip.Load: the real one when TE_HIP_REAL=1 or TE_HIP_LIBRARY is already
// set, else the fake, built with the C compiler into the temporary
// directory. It returns a description for logs, or an error when the fake
// cannot be built (tests that need a runtime then skip). Child processes
// inherit the choice through the environment.
func Setup() (string, error) {
	if os.Getenv(EnvReal) == "1" {
		return "real HIP runtime", nil
	}
	if p := os.Getenv(hip.EnvLibrary); p != "" {
		return "HIP runtime " + p, nil
	}
	p, err := BuildFake()
	if err != nil {
		return "", err
	}
	os.Setenv(hip.EnvLibrary, p)
	return "fake HIP runtime " + p, nil
}

// Fake reports whether this process uses the fake runtime.
func Fake() bool {
	p := os.Getenv(hip.EnvLibrary)
	if p == "" {
		return false
	}
	if filepath.Base(p) == "libfakehip.so" {
		return true
	}
	h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return false
	}
	sym, err := purego.Dlsym(h, "fakehip_open_handles")
	return err == nil && sym != 0
}

// BuildFake compiles the fake runtime once per source version and returns
// the path of the shared library.
func BuildFake() (string, error) {
	_, here, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(here), "testdata", "fakehip.c")
	b, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	dir := filepath.Join(os.TempDir(), "te-fakehip-"+hex.EncodeToString(sum[:8]))
	out := filepath.Join(dir, "libfakehip.so")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Build beside the target and rename: concurrent test binaries may race.
	tmp, err := os.CreateTemp(dir, "build-*.so")
	if err != nil {
		return "", err
	}
	tmp.Close()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	cmd := exec.Command(cc, "-O1", "-Wall", "-shared", "-fPIC", "-o", tmp.Name(), src)
	if msg, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp.Name())
		return "", &buildError{err: err, out: string(msg)}
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	return out, nil
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string {
	return "build the fake HIP runtime: " + e.err.Error() + ": " + e.out
}

// Counter reads one of the fake runtime's counters by symbol name
// (fakehip_open_handles, fakehip_streams).
func Counter(t testing.TB, name string) int64 {
	t.Helper()
	h, err := purego.Dlopen(os.Getenv(hip.EnvLibrary), purego.RTLD_NOW)
	if err != nil {
		t.Fatal(err)
	}
	sym, err := purego.Dlsym(h, name)
	if err != nil {
		t.Fatal(err)
	}
	var f func() int64
	purego.RegisterFunc(&f, sym)
	return f()
}
