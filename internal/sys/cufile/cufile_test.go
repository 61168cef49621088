package cufile

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/tecache/te/internal/errs"
)

// TestLoad loads the library where it is installed and otherwise checks
// that the refusal is a clean NotSupported with a reason; this machine
// class has no GDS, so the second is what runs here.
func TestLoad(t *testing.T) {
	l, err := Load()
	if err != nil {
		if errs.CodeOf(err) != errs.NotSupported || !strings.Contains(err.Error(), "libcufile") && !strings.Contains(err.Error(), "cuFile") {
			t.Fatalf("refusal: %v", err)
		}
		t.Skipf("no GPUDirect Storage here: %v", err)
	}
	if l.Path == "" {
		t.Fatal("loaded without a path")
	}
}

// TestDescrLayout compares CUfileDescr_t with cufile.h where the header is
// installed (the CUDA toolkit's GDS package); skipped elsewhere.
func TestDescrLayout(t *testing.T) {
	var hdr string
	for _, p := range []string{"/usr/local/cuda/include/cufile.h", "/usr/include/cufile.h"} {
		if _, err := os.Stat(p); err == nil {
			hdr = p
		}
	}
	cc, err := exec.LookPath("cc")
	if hdr == "" || err != nil {
		t.Skip("no cufile.h (or no C compiler) here")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "l.c")
	os.WriteFile(src, []byte(`#include <stddef.h>
#include <stdio.h>
#include <cufile.h>
int main(void) { printf("%zu %zu %zu %zu\n", sizeof(CUfileDescr_t), offsetof(CUfileDescr_t, type),
  offsetof(CUfileDescr_t, handle), offsetof(CUfileDescr_t, fs_ops)); return 0; }
`), 0o644)
	bin := filepath.Join(dir, "l")
	if out, err := exec.Command(cc, "-I"+filepath.Dir(hdr), "-I/usr/local/cuda/include", src, "-o", bin).CombinedOutput(); err != nil {
		t.Skipf("cufile.h does not compile here: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	var d descr
	want := []uintptr{unsafe.Sizeof(d), unsafe.Offsetof(d.typ), unsafe.Offsetof(d.fd), unsafe.Offsetof(d.fsOps)}
	for i, f := range strings.Fields(string(out)) {
		if n, _ := strconv.Atoi(f); uintptr(n) != want[i] {
			t.Fatalf("CUfileDescr_t: C says %s, Go %v", out, want)
		}
	}
}
