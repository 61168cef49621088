package cxl

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/topo"
)

// TestDeviceSizeFromSysfs reads a DAX device's size under TE_SYSFS_ROOT: a
// character device named daxX.Y (here a link to /dev/null, the one
// character device a test can name) and a recorded sysfs tree.
func TestDeviceSizeFromSysfs(t *testing.T) {
	dir := t.TempDir()
	sys := filepath.Join(dir, "sys")
	if err := os.MkdirAll(filepath.Join(sys, "bus/dax/devices/dax3.1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sys, "bus/dax/devices/dax3.1/size"), []byte("68719476736\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(topo.EnvSysfsRoot, sys)
	dev := filepath.Join(dir, "dax3.1")
	if err := os.Symlink("/dev/null", dev); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	n, err := deviceSize(dev, &st)
	if err != nil || n != 64<<30 {
		t.Fatalf("size %d, %v; want 64 GiB", n, err)
	}
	// A character device with no daxX.Y name, and one sysfs does not know.
	if _, err := deviceSize("/dev/null", &st); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("/dev/null: %v", err)
	}
	other := filepath.Join(dir, "dax9.9")
	os.Symlink("/dev/null", other)
	if _, err := deviceSize(other, &st); errs.CodeOf(err) != errs.NotSupported {
		t.Fatalf("unknown dax device: %v", err)
	}
}

// TestOpenRefuses: no device, a file shorter than the size asked, a size of
// zero; and Mooncake's variables name the device when te's are unset.
func TestOpenRefuses(t *testing.T) {
	if _, err := open(Config{}); errs.CodeOf(err) != errs.NotSupported {
		t.Fatalf("no device: %v", err)
	}
	f := filepath.Join(t.TempDir(), "dev")
	if err := os.WriteFile(f, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := open(Config{Path: f, Size: 1 << 20}); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("file shorter than the size: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o600)
	if _, err := open(Config{Path: empty}); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("empty file: %v", err)
	}
	m, err := open(Config{Path: f})
	if err != nil || m.size != 8192 {
		t.Fatalf("open %s: %v", f, err)
	}
	m2, err := open(Config{Path: f})
	if err != nil || m2 != m || m.refs != 2 {
		t.Fatalf("a second open shares the mapping: %v", err)
	}
	m2.release()
	m.release()

	t.Setenv(EnvDevice, "")
	t.Setenv(EnvSize, "")
	t.Setenv(EnvMCDevice, f)
	t.Setenv(EnvMCSize, "4096")
	if c := FromEnv(); c.Path != f || c.Size != 4096 {
		t.Fatalf("Mooncake's variables: %+v", c)
	}
}
