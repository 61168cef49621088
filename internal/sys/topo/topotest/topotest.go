// Package topotest builds the recorded sysfs trees of package topo
// (testdata/*.tree) for tests: hgx8 (two sockets, 8 GPUs, 8 NICs, each GPU
// behind a PCIe switch with one NIC), nic1socket (4 GPUs, both NICs on
// socket 0) and box1 (one GPU, one NIC). Point TE_SYSFS_ROOT at one and
// topo, the fake libibverbs and the fake CUDA driver all see that machine.
package topotest

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/tecache/te/internal/sys/topo"
)

// Trees are the recorded trees.
var Trees = []string{"hgx8", "nic1socket", "box1"}

// NearNIC is, on hgx8, the NIC behind the same PCIe switch as GPU k.
var NearNIC = []string{"mlx5_1", "mlx5_0", "mlx5_3", "mlx5_2", "mlx5_5", "mlx5_4", "mlx5_7", "mlx5_6"}

// BusIDs are hgx8's GPU addresses in CUDA (bus) order.
var BusIDs = []string{"0000:13:00.0", "0000:33:00.0", "0000:53:00.0", "0000:73:00.0",
	"0000:93:00.0", "0000:b3:00.0", "0000:d3:00.0", "0000:f3:00.0"}

// Manifest returns the path of a tree's manifest: beside this package's
// source, or (in a binary built with -trimpath, run from inside the
// repository) found from the working directory up.
func Manifest(name string) string {
	rel := filepath.Join("internal", "sys", "topo", "testdata", name+".tree")
	_, here, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(here), "..", "testdata", name+".tree")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if dir, err := os.Getwd(); err == nil {
		for ; ; dir = filepath.Dir(dir) {
			if _, err := os.Stat(filepath.Join(dir, rel)); err == nil {
				return filepath.Join(dir, rel)
			}
			if dir == filepath.Dir(dir) {
				break
			}
		}
	}
	return p
}

// Tree builds the named tree in a temporary directory of t and returns its
// root (what TE_SYSFS_ROOT names).
func Tree(t testing.TB, name string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := topo.MaterializeFile(Manifest(name), dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TreeIn builds the named tree under dir (for a test process's TestMain,
// which has no t) and returns its root.
func TreeIn(dir, name string) (string, error) {
	root := filepath.Join(dir, name)
	if _, err := os.Stat(root); err == nil {
		return root, nil
	}
	return root, topo.MaterializeFile(Manifest(name), root)
}
