package topo_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/tecache/te/internal/sys/topo"
	"github.com/tecache/te/internal/sys/topo/topotest"
)

// The NICs near each memory location of a recorded HGX-style node.
func ExampleMachine_Near() {
	dir, _ := os.MkdirTemp("", "topo")
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "hgx8")
	if err := topo.MaterializeFile(topotest.Manifest("hgx8"), root); err != nil {
		panic(err)
	}
	m, _ := topo.Discover(topo.Options{Root: root, GPUs: topotest.BusIDs[:2]})
	fmt.Println(m.Near("cuda:0").Preferred, m.Near("cuda:1").Preferred)
	fmt.Println(m.Near("cpu:1").Preferred)
	// Output:
	// [mlx5_1] [mlx5_0]
	// [mlx5_4 mlx5_5 mlx5_6 mlx5_7]
}
