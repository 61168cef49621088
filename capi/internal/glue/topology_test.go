package glue

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// fakeMachine writes a sysfs/procfs tree under a temporary root: two NUMA
// nodes; NICs mlx5_0 (node 0, beside GPU 0 under one PCI switch), mlx5_1
// (node 1, beside GPU 1) and mlx5_2 (node 1, on another root port); GPU 1's
// procfs entry is missing, so its position is unknown.
func fakeMachine(t *testing.T) string {
	root := t.TempDir()
	mk := func(p string) {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		mk(filepath.Dir(p))
		if err := os.WriteFile(filepath.Join(root, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, p string) {
		mk(filepath.Dir(p))
		if err := os.Symlink(filepath.Join(root, target), filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	mk("sys/devices/system/node/node0")
	mk("sys/devices/system/node/node1")
	write("sys/devices/system/node/possible", "0-1\n") // a file, not a node
	sw0 := "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
	pcis := map[string]string{
		"0000:02:00.0": sw0 + "/0000:02:00.0",                              // GPU 0
		"0000:03:00.0": sw0 + "/0000:03:00.0",                              // mlx5_0
		"0000:81:00.0": "sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", // GPU 1
		"0000:82:00.0": "sys/devices/pci0000:80/0000:80:01.0/0000:82:00.0", // mlx5_1
		"0000:c1:00.0": "sys/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0", // mlx5_2
	}
	for bus, p := range pcis {
		mk(p)
		link(p, "sys/bus/pci/devices/"+bus)
	}
	for nic, bus := range map[string]string{"mlx5_0": "0000:03:00.0", "mlx5_1": "0000:82:00.0", "mlx5_2": "0000:c1:00.0"} {
		link(pcis[bus], "sys/class/infiniband/"+nic+"/device")
	}
	write(pcis["0000:03:00.0"]+"/numa_node", "0\n")
	write(pcis["0000:82:00.0"]+"/numa_node", "1\n")
	write(pcis["0000:c1:00.0"]+"/numa_node", "1\n")
	write("proc/driver/nvidia/gpus/0000:02:00.0/information",
		"Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-0a0b0c0d-1111-2222-3333-444455556666\nBus Location: \t 0000:02:00.0\n")
	return root
}

func withDevices(t *testing.T, nics, gpus []string) {
	pn, pg := probeNICs, probeGPUs
	probeNICs = func() []string { return nics }
	probeGPUs = func() []string { return gpus }
	t.Cleanup(func() { probeNICs, probeGPUs = pn, pg })
}

func TestLocalTopology(t *testing.T) {
	root := fakeMachine(t)
	withDevices(t, []string{"mlx5_0", "mlx5_1", "mlx5_2"},
		[]string{"GPU-0A0B0C0D-1111-2222-3333-444455556666", "GPU-ffffffff-1111-2222-3333-444455556666"})
	got := LocalTopology(root, nil)
	want := Topology{
		"cpu:0":  {{"mlx5_0"}, {"mlx5_1", "mlx5_2"}},
		"cpu:1":  {{"mlx5_1", "mlx5_2"}, {"mlx5_0"}},
		"cuda:0": {{"mlx5_0"}, {"mlx5_1", "mlx5_2"}},
		"cuda:1": {{}, {"mlx5_0", "mlx5_1", "mlx5_2"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	// Mooncake's JSON: lists, never null.
	b, err := json.Marshal(LocalTopology(root, []string{"mlx5_2"}))
	if err != nil {
		t.Fatal(err)
	}
	const wantJSON = `{"cpu:0":[[],["mlx5_2"]],"cpu:1":[["mlx5_2"],[]],"cuda:0":[["mlx5_2"],[]],"cuda:1":[[],["mlx5_2"]]}`
	if string(b) != wantJSON {
		t.Fatalf("filtered: %s\nwant       %s", b, wantJSON)
	}
}

func TestLocalTopologyBareMachine(t *testing.T) {
	root := t.TempDir()
	withDevices(t, nil, nil)
	b, _ := json.Marshal(LocalTopology(root, nil))
	if string(b) != `{}` {
		t.Fatalf("no sysfs, no devices: %s", b)
	}
	if err := os.MkdirAll(filepath.Join(root, "sys/devices/system/node/node0"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(LocalTopology(root, nil))
	if string(b) != `{"cpu:0":[[],[]]}` {
		t.Fatalf("one node, no NIC: %s", b)
	}
}

func TestPCIDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0", "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.0", 2},
		{"/sys/devices/pci0000:00/0000:00:01.0", "/sys/devices/pci0000:80/0000:80:01.0", 4},
		{"/a/b", "/a/b", 0},
	} {
		if got := pciDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("pciDistance(%s, %s) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestFormatUUID(t *testing.T) {
	b := [16]byte{0x0a, 0x0b, 0x0c, 0x0d, 0x11, 0x11, 0x22, 0x22, 0x33, 0x33, 0x44, 0x44, 0x55, 0x55, 0x66, 0x66}
	if got := formatUUID(b); got != "GPU-0a0b0c0d-1111-2222-3333-444455556666" {
		t.Fatal(got)
	}
}
