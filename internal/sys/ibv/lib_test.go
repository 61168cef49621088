package ibv

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/ebitengine/purego"

	"github.com/tecache/te/internal/errs"
)

func TestOpenMissingLibrary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libibverbs.so.1")
	_, err := Open(path)
	if !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("Open(%s) = %v, want a NotSupported error", path, err)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "libibverbs1") {
		t.Fatalf("error %q does not name the file and the package to install", err)
	}
}

func TestOpenNotVerbs(t *testing.T) {
	// libc loads but has none of the verbs: every missing entry point is named.
	_, err := Open("libc.so.6")
	if !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("Open(libc.so.6) = %v, want NotSupported", err)
	}
	for _, sym := range []string{"ibv_get_device_list", "ibv_reg_mr", "ibv_modify_qp"} {
		if !strings.Contains(err.Error(), sym) {
			t.Errorf("error %q does not name %s", err, sym)
		}
	}
}

// libraryInstalled reports whether libibverbs.so.1 of this architecture is
// in a standard library directory, so a failure to load it is a bug rather
// than a missing package. Only this GOARCH's multiarch directory counts: an
// arm64 test binary under qemu-user on x86-64 (make test-arm64) cannot load
// the x86-64 library installed there.
func libraryInstalled() bool {
	dirs := []string{"/usr/lib64", "/usr/lib", "/lib64"}
	if d, ok := map[string]string{"amd64": "/usr/lib/x86_64-linux-gnu", "arm64": "/usr/lib/aarch64-linux-gnu"}[runtime.GOARCH]; ok {
		dirs = append(dirs, d)
	}
	if prefix := os.Getenv("QEMU_LD_PREFIX"); prefix != "" {
		// Under qemu-user the target's libraries are under its prefix.
		dirs = []string{filepath.Join(prefix, "lib"), filepath.Join(prefix, "usr/lib")}
	}
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, DefaultLibrary)); err == nil {
			return true
		}
	}
	return false
}

// TestLoad exercises the real load path: with rdma-core installed (CI
// installs libibverbs1) the library loads and lists devices, possibly none.
func TestLoad(t *testing.T) {
	l, err := Load()
	if err != nil {
		if errors.Is(err, errs.ErrNotSupported) && !libraryInstalled() && os.Getenv("TE_IBV_LIBRARY") == "" {
			t.Skipf("libibverbs is not installed: %v", err)
		}
		t.Fatalf("Load: %v", err)
	}
	d, err := l.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	defer d.Free()
	t.Logf("%s: %d device(s)", l.Path, d.Len())
	for i := 0; i < d.Len(); i++ {
		if d.Name(i) == "" {
			t.Errorf("device %d has no name", i)
		}
	}
	names, err := Probe()
	switch {
	case d.Len() == 0 && !errors.Is(err, errs.ErrNotSupported):
		t.Fatalf("Probe with no device = %v, %v; want NotSupported", names, err)
	case d.Len() == 0 && !strings.Contains(err.Error(), "rdma link add"):
		t.Fatalf("Probe error %q lacks the Soft-RoCE hint", err)
	case d.Len() > 0 && (err != nil || len(names) != d.Len()):
		t.Fatalf("Probe = %v, %v; want %d names", names, err, d.Len())
	}
}

func TestWRBatch(t *testing.T) {
	b, err := NewWRBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if !b.Add(7, WRRDMAWrite, 0x1000, 4096, 0x11, 0x9000, 0x22, SendSignaled) ||
		!b.Add(8, WRRDMARead, 0x2000, 512, 0x33, 0xa000, 0x44, 0) {
		t.Fatal("batch of 2 refused an entry")
	}
	if b.Add(9, WRRDMARead, 0, 1, 0, 0, 0, 0) {
		t.Fatal("full batch accepted a third entry")
	}
	wr, sge := b.WR(1)
	if wr.WRID != 8 || wr.Opcode != WRRDMARead || wr.NumSge != 1 || wr.RemoteAddr != 0xa000 || wr.Rkey != 0x44 {
		t.Fatalf("wr = %+v", wr)
	}
	if wr.SgList != b.sgeAddr(1) || sge != (Sge{Addr: 0x2000, Length: 512, Lkey: 0x33}) {
		t.Fatalf("sge = %+v at %#x", sge, wr.SgList)
	}
	if b.Len() != 2 {
		t.Fatalf("Len = %d", b.Len())
	}
	b.Reset()
	if b.Len() != 0 {
		t.Fatal("Reset left entries")
	}
}

func TestWCStatusString(t *testing.T) {
	if WCStatusString(WCRemAccessErr) != "remote access error" || WCStatusString(WCWRFlushErr) != "WR flushed" || WCStatusString(999) != "unknown" {
		t.Fatal("status names do not follow ibv_wc_status_str")
	}
	if MTUBytes(MTU4096) != 4096 || MTUBytes(MTU256) != 256 || MTUBytes(0) != 0 {
		t.Fatal("MTUBytes")
	}
}

// TestCallErrno checks the errno path every NULL-returning verb relies on:
// close(-1) fails with EBADF.
func TestCallErrno(t *testing.T) {
	l, err := Load()
	if err != nil {
		t.Skipf("libibverbs not loadable: %v", err)
	}
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW)
	if err != nil {
		t.Fatal(err)
	}
	closeFn, err := purego.Dlsym(h, "close")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		r, e := l.call(closeFn, ^uintptr(0))
		if int32(r) != -1 || e != syscall.EBADF {
			t.Fatalf("close(-1) = %d, errno %v; want -1, EBADF", int32(r), e)
		}
	}
}
