// Package cudatest builds and installs a fake CUDA driver for tests on
// machines without a GPU, and tells tests which driver they run against.
//
// The fake (testdata/fakecuda.c) exports the driver entry points te binds
// with cuda.h's signatures. Its "device memory" is mapped PROT_NONE at the
// address it hands out, so code that touches device memory from the CPU
// faults as it would on a GPU; copies need a current context on the calling
// thread; IPC handles really share memory between processes. It proves te's
// logic and ABI use, not its speed or a real driver's behaviour: the GPU
// checks in bench/gpu/check.sh do that.
package cudatest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/ebitengine/purego"

	"github.com/tecache/te/internal/sys/cuda"
)

// EnvReal, set to 1, makes Setup leave the real driver in place (on a GPU
// machine), so the same tests run against hardware.
const EnvReal = "TE_CUDA_REAL"

// Setup chooses the driver for this test process, before anything calls
// cuda.Load: the real one when TE_CUDA_REAL=1 or TE_CUDA_LIBRARY is already
// set, else the fake, built with the C compiler into the temporary
// directory. It returns a description for logs, or an error when the fake
// cannot be built (tests that need a driver then skip). Child processes
// inherit the choice through the environment.
func Setup() (string, error) {
	if os.Getenv(EnvReal) == "1" {
		return "real driver " + cuda.DefaultLibrary, nil
	}
	if p := os.Getenv(cuda.EnvLibrary); p != "" {
		return "driver " + p, nil
	}
	p, err := BuildFake()
	if err != nil {
		return "", err
	}
	os.Setenv(cuda.EnvLibrary, p)
	return "fake driver " + p, nil
}

// Fake reports whether this process uses the fake driver: the one
// BuildFake builds, or any library exporting the fake's probes (`make
// fakes` builds the same source as build/fake/libcuda.so.1).
func Fake() bool {
	p := os.Getenv(cuda.EnvLibrary)
	if p == "" {
		return false
	}
	if filepath.Base(p) == "libfakecuda.so" {
		return true
	}
	h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return false
	}
	sym, err := purego.Dlsym(h, "fakecuda_open_handles")
	return err == nil && sym != 0
}

// BuildFake compiles the fake driver once per source version and returns
// the path of the shared library.
func BuildFake() (string, error) {
	_, here, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(here), "testdata", "fakecuda.c")
	b, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	dir := filepath.Join(os.TempDir(), "te-fakecuda-"+hex.EncodeToString(sum[:8]))
	out := filepath.Join(dir, "libfakecuda.so")
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
	return "build the fake CUDA driver: " + e.err.Error() + ": " + e.out
}
