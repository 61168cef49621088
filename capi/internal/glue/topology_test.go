package glue

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/tecache/te/internal/sys/topo"
	"github.com/tecache/te/internal/sys/topo/topotest"
)

func withDevices(t *testing.T, nics, gpus []string) {
	pn, pg := topo.ProbeNICs, topo.ProbeGPUs
	topo.ProbeNICs = func() []string { return nics }
	topo.ProbeGPUs = func() []string { return gpus }
	t.Cleanup(func() { topo.ProbeNICs, topo.ProbeGPUs = pn, pg })
}

// LocalTopology is package topo's matrix of the machine under root/sys, over
// the NICs libibverbs lists, filtered.
func TestLocalTopology(t *testing.T) {
	root := t.TempDir()
	if err := topo.MaterializeFile(topotest.Manifest("nic1socket"), filepath.Join(root, "sys")); err != nil {
		t.Fatal(err)
	}
	withDevices(t, []string{"mlx5_0", "mlx5_1"}, []string{"0000:21:00.0", "0000:a1:00.0"})
	b, _ := json.Marshal(LocalTopology(root, nil))
	const want = `{"cpu:0":[["mlx5_0","mlx5_1"],[]],"cpu:1":[[],["mlx5_0","mlx5_1"]],` +
		`"cuda:0":[["mlx5_0","mlx5_1"],[]],"cuda:1":[[],["mlx5_0","mlx5_1"]]}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	const only1 = `{"cpu:0":[["mlx5_1"],[]],"cpu:1":[[],["mlx5_1"]],"cuda:0":[["mlx5_1"],[]],"cuda:1":[[],["mlx5_1"]]}`
	b, _ = json.Marshal(LocalTopology(root, []string{"mlx5_1"}))
	if string(b) != only1 {
		t.Fatalf("filtered: %s", b)
	}
	// Without a filter, the rdma transport's allow-list from the environment.
	t.Setenv("TE_RDMA_DEVICES", "mlx5_1")
	b, _ = json.Marshal(LocalTopology(root, nil))
	if string(b) != only1 {
		t.Fatalf("TE_RDMA_DEVICES=mlx5_1: %s", b)
	}
}

func TestLocalTopologyBareMachine(t *testing.T) {
	root := t.TempDir()
	withDevices(t, nil, nil)
	b, _ := json.Marshal(LocalTopology(root, nil))
	if string(b) != `{}` {
		t.Fatalf("no sysfs: %s", b)
	}
	if err := os.MkdirAll(filepath.Join(root, "sys/devices/system/node/node0"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(LocalTopology(root, nil))
	if string(b) != `{"cpu:0":[[],[]]}` {
		t.Fatalf("one node, no NIC: %s", b)
	}
}
