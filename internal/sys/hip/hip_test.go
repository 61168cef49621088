package hip_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
	"github.com/tecache/te/internal/sys/hip"
)

// realRuntime is Debian's libamdhip64 (package libamdhip64-5, in
// .ci/deps.d/hip.pkgs): the test needs it, it is not optional.
const realRuntime = "libamdhip64.so.5"

// TestRealRuntime loads the real HIP runtime, resolves every symbol te uses
// (hsa_amd_portable_export_dmabuf only where ROCm has it), reads its
// version, and on a machine without an AMD GPU finds none: Load is
// NotSupported naming the cause, and nothing crashes.
func TestRealRuntime(t *testing.T) {
	l, err := hip.Open(realRuntime)
	if err != nil {
		t.Fatalf("the HIP runtime from Debian (libamdhip64-5) must load: %v", err)
	}
	for _, s := range hip.Symbols() {
		if s == "hsa_amd_portable_export_dmabuf" {
			continue
		}
		if l.Bound[s] == "" {
			t.Errorf("%s not bound", s)
		}
	}
	if l.Major() < 5 {
		t.Fatalf("runtime version %d: not ROCm 5 or later", l.Version)
	}
	t.Logf("%s: version %d (ROCm %d), dma-buf export %v", l.Path, l.Version, l.Major(), l.Bound["hsa_amd_portable_export_dmabuf"] != "")
	if _, err := os.Stat("/dev/kfd"); err == nil {
		t.Skip("/dev/kfd exists: this machine may have an AMD GPU")
	}
	t.Setenv(hip.EnvLibrary, realRuntime)
	d, known, err := gpu.Load("hip")
	if !known {
		t.Fatal("hip is not registered with package gpu")
	}
	if err == nil {
		t.Fatalf("no /dev/kfd, yet HIP loaded: %v", d)
	}
	if errs.CodeOf(err) != errs.NotSupported || !strings.Contains(err.Error(), "AMD GPU") {
		t.Fatalf("want NotSupported naming the missing AMD GPU, got %v", err)
	}
	t.Logf("refused: %v", err)
}

// TestMissingLibrary: a library that is not there is NotSupported with the
// hint to install ROCm.
func TestMissingLibrary(t *testing.T) {
	_, err := hip.Open("libamdhip64-does-not-exist.so")
	var e *errs.Error
	if !errors.As(err, &e) || e.Code != errs.NotSupported || !strings.Contains(err.Error(), "cannot load") {
		t.Fatalf("%v", err)
	}
}

// TestPointerTypeNumbering: ROCm 6 renumbered hipMemoryType; the decoding
// follows the runtime's major version.
func TestPointerTypeNumbering(t *testing.T) {
	for _, c := range []struct {
		major     int
		typ       uint32
		dev, host bool
	}{
		{5, 0, false, true}, {5, 1, true, false}, {5, 2, false, false},
		{6, 0, false, false}, {6, 1, false, true}, {6, 2, true, false}, {7, 2, true, false},
	} {
		if dev, host := hip.PointerType(c.major, c.typ); dev != c.dev || host != c.host {
			t.Errorf("ROCm %d type %d: device %v host %v", c.major, c.typ, dev, host)
		}
	}
}
