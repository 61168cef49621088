//go:build ignore

// gentrees writes the recorded sysfs trees the topo tests (and the fake
// libibverbs and CUDA driver, through TE_SYSFS_ROOT) read, as manifests in
// the format topo.Materialize reads (Record writes the same from a real
// machine): only what topo reads, the PCI hierarchy as directories and the
// kernel's relative symlinks. The trees are not checked in as directories:
// sysfs names hold ':', which a Go module zip refuses. Run from this
// directory: go run gentrees.go
//
//	hgx8.tree       two sockets, 8 GPUs and 8 NICs; each GPU shares a PCIe
//	                switch with one NIC (NIC names deliberately not in GPU
//	                order: GPU k is beside mlx5_{1,0,3,2,5,4,7,6}[k])
//	nic1socket.tree two sockets, 4 GPUs on their own root ports, both NICs
//	                on socket 0
//	box1.tree       one socket, one GPU and one NIC on different root
//	                ports, numa_node -1 as on single-socket machines
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type tree struct {
	name  string
	lines map[string]string // path -> manifest line
}

func (t *tree) dir(p string) {
	for d := p; d != "." && d != "/"; d = filepath.Dir(d) {
		if _, ok := t.lines[d]; !ok {
			t.lines[d] = "d " + d
		}
	}
}

func (t *tree) file(p, body string) {
	t.dir(filepath.Dir(p))
	t.lines[p] = "f " + p + " " + body
}

// link makes p a symlink to target (both relative to the root), written
// relative as the kernel writes them.
func (t *tree) link(target, p string) {
	t.dir(filepath.Dir(p))
	rel, err := filepath.Rel(filepath.Dir(p), target)
	if err != nil {
		panic(err)
	}
	t.lines[p] = "l " + p + " " + rel
}

func (t *tree) write(comment string) {
	var out []string
	for _, l := range t.lines {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return strings.Fields(out[i])[1] < strings.Fields(out[j])[1] })
	body := "# " + comment + "\n# Written by gentrees.go; topo.Materialize builds it (d dir, f file value, l link target).\n" +
		strings.Join(out, "\n") + "\n"
	if err := os.WriteFile(t.name+".tree", []byte(body), 0o644); err != nil {
		panic(err)
	}
}

// fn is one PCI function: its path under devices/ and what it is.
func (t *tree) fn(path, vendor, class string, numa int) {
	t.dir(path)
	t.file(path+"/vendor", vendor)
	t.file(path+"/class", class)
	t.file(path+"/numa_node", fmt.Sprint(numa))
	t.link(path, "bus/pci/devices/"+filepath.Base(path))
}

const (
	nvidia   = "0x10de"
	mellanox = "0x15b3"
	bridge   = "0x060400"
	gpu      = "0x030200" // 3D controller
	ib       = "0x020700" // InfiniBand controller
)

func (t *tree) nic(path, name string, numa int) {
	t.fn(path, mellanox, ib, numa)
	t.link(path, "class/infiniband/"+name+"/device")
}

func (t *tree) nodes(n int) {
	for i := 0; i < n; i++ {
		t.dir(fmt.Sprintf("devices/system/node/node%d", i))
	}
	t.file("devices/system/node/possible", fmt.Sprintf("0-%d", n-1))
}

func hgx8() {
	t := &tree{"hgx8", map[string]string{}}
	t.nodes(2)
	// Switch k hangs off its own root complex; GPU k and one NIC share it.
	nicOf := []int{1, 0, 3, 2, 5, 4, 7, 6}
	for k := 0; k < 8; k++ {
		base := 0x10 + 0x20*k
		numa := k / 4
		rc := fmt.Sprintf("devices/pci0000:%02x", base)
		rp := fmt.Sprintf("%s/0000:%02x:01.0", rc, base)
		up := fmt.Sprintf("%s/0000:%02x:00.0", rp, base+1)
		t.fn(rp, "0x8086", bridge, numa)
		t.fn(up, "0x1000", bridge, numa) // the switch's upstream port
		d0 := fmt.Sprintf("%s/0000:%02x:00.0", up, base+2)
		d1 := fmt.Sprintf("%s/0000:%02x:01.0", up, base+2)
		t.fn(d0, "0x1000", bridge, numa)
		t.fn(d1, "0x1000", bridge, numa)
		t.fn(fmt.Sprintf("%s/0000:%02x:00.0", d0, base+3), nvidia, gpu, numa)
		t.nic(fmt.Sprintf("%s/0000:%02x:00.0", d1, base+4), fmt.Sprintf("mlx5_%d", nicOf[k]), numa)
	}
	t.write("hgx8: two sockets, 8 GPUs, 8 NICs; GPU k shares a PCIe switch with mlx5_{1,0,3,2,5,4,7,6}[k]")
}

func nic1socket() {
	t := &tree{"nic1socket", map[string]string{}}
	t.nodes(2)
	for k := 0; k < 4; k++ {
		base := 0x20 + 0x40*k
		numa := k / 2
		rp := fmt.Sprintf("devices/pci0000:%02x/0000:%02x:01.0", base, base)
		t.fn(rp, "0x8086", bridge, numa)
		t.fn(fmt.Sprintf("%s/0000:%02x:00.0", rp, base+1), nvidia, gpu, numa)
	}
	for k := 0; k < 2; k++ {
		rp := fmt.Sprintf("devices/pci0000:00/0000:00:%02x.0", 2+k)
		t.fn(rp, "0x8086", bridge, 0)
		t.nic(fmt.Sprintf("%s/0000:%02x:00.0", rp, 0x05+k), fmt.Sprintf("mlx5_%d", k), 0)
	}
	t.write("nic1socket: two sockets, 4 GPUs on their own root ports (2 per socket), both NICs on socket 0")
}

func box1() {
	t := &tree{"box1", map[string]string{}}
	t.nodes(1)
	t.fn("devices/pci0000:00/0000:00:01.0", "0x8086", bridge, -1)
	t.fn("devices/pci0000:00/0000:00:01.0/0000:01:00.0", nvidia, "0x030000", -1)
	t.fn("devices/pci0000:00/0000:00:1c.0", "0x8086", bridge, -1)
	t.nic("devices/pci0000:00/0000:00:1c.0/0000:02:00.0", "mlx5_0", -1)
	t.write("box1: one socket, one GPU and one NIC on different root ports, numa_node -1")
}

func main() {
	hgx8()
	nic1socket()
	box1()
}
