// Package nvmltest builds the fake management library (testdata/fakenvml.c)
// and points package nvml at it, as cudatest does for the CUDA driver.
package nvmltest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/tecache/te/internal/sys/nvml"
)

// EnvReal, set to 1, makes Setup leave the real library in place.
const EnvReal = "TE_NVML_REAL"

// Setup makes this process and its children load the fake (unless
// TE_NVML_REAL=1 or TE_NVML_LIBRARY is set): it must run before anything
// calls nvml.Load.
func Setup() error {
	if os.Getenv(EnvReal) == "1" || os.Getenv(nvml.EnvLibrary) != "" {
		return nil
	}
	p, err := BuildFake()
	if err != nil {
		return err
	}
	return os.Setenv(nvml.EnvLibrary, p)
}

// BuildFake compiles the fake once per source version and flags (-D...)
// and returns the shared library's path.
func BuildFake(flags ...string) (string, error) {
	_, here, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(here), "testdata", "fakenvml.c")
	b, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write(b)
	for _, f := range flags {
		h.Write([]byte("\x00" + f))
	}
	dir := filepath.Join(os.TempDir(), "te-fakenvml-"+hex.EncodeToString(h.Sum(nil)[:8]))
	out := filepath.Join(dir, "libnvidia-ml.so.1")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Built beside the target and renamed: test binaries may race.
	tmp, err := os.CreateTemp(dir, "build-*.so")
	if err != nil {
		return "", err
	}
	tmp.Close()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	args := append([]string{"-O1", "-Wall", "-shared", "-fPIC", "-o", tmp.Name()}, flags...)
	if msg, err := exec.Command(cc, append(args, src)...).CombinedOutput(); err != nil {
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

func (e *buildError) Error() string { return "build the fake NVML: " + e.err.Error() + ": " + e.out }
