package glue

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tecache/te/internal/sys/cuda"
	"github.com/tecache/te/internal/sys/ibv"
)

// SysRoot is where LocalTopology reads sysfs and procfs ("/" in
// production; tests point it at a fake tree).
const SysRoot = "/"

// Topology is Mooncake's topology JSON: each memory location ("cpu:N" for a
// NUMA node, "cuda:N" for a GPU) maps to [preferred NICs, other NICs].
type Topology map[string][2][]string

// Probes of the devices te would use: the RDMA NICs libibverbs lists and the
// UUIDs of the GPUs the CUDA driver reports, in ordinal order. Variables so
// that tests can describe a machine.
var (
	probeNICs = func() []string {
		names, err := ibv.Probe()
		if err != nil {
			return nil
		}
		return names
	}
	probeGPUs = func() []string {
		l, err := cuda.Load()
		if err != nil {
			return nil
		}
		n, err := l.DeviceCount()
		if err != nil {
			return nil
		}
		uuids := make([]string, n)
		for i := range uuids {
			if d, err := l.DeviceGet(i); err == nil {
				if u, err := l.DeviceUUID(d); err == nil {
					uuids[i] = formatUUID(u.Bytes)
				}
			}
		}
		return uuids
	}
)

// formatUUID writes a GPU UUID the way the NVIDIA driver's procfs does.
func formatUUID(b [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// LocalTopology describes this machine under root: every NUMA node and GPU
// with the NICs (those in filter, when it is not empty) that are near it. A
// NIC on a node's NUMA node is preferred for it; for a GPU, the NICs closest
// on the PCI tree (as Mooncake measures it) are. A GPU whose PCI address is
// unknown gets every NIC as "other".
func LocalTopology(root string, filter []string) Topology {
	var nics []nicInfo
	for _, name := range probeNICs() {
		if len(filter) > 0 && !slices.Contains(filter, name) {
			continue
		}
		dev := filepath.Join(root, "sys/class/infiniband", name, "device")
		nics = append(nics, nicInfo{name: name, numa: readInt(filepath.Join(dev, "numa_node"), -1), pci: realPath(dev)})
	}
	t := Topology{}
	for _, node := range numaNodes(root) {
		var pref, other []string
		for _, n := range nics {
			if n.numa == node {
				pref = append(pref, n.name)
			} else {
				other = append(other, n.name)
			}
		}
		t["cpu:"+strconv.Itoa(node)] = [2][]string{nonNil(pref), nonNil(other)}
	}
	buses := gpuBuses(root)
	for i, uuid := range probeGPUs() {
		pci := ""
		if bus, ok := buses[strings.ToLower(uuid)]; ok && uuid != "" {
			pci = realPath(filepath.Join(root, "sys/bus/pci/devices", bus))
		}
		t["cuda:"+strconv.Itoa(i)] = nearest(pci, nics)
	}
	return t
}

type nicInfo struct {
	name string
	numa int
	pci  string // resolved sysfs path of the NIC's PCI function, "" if unknown
}

// nearest splits nics into those at the least PCI distance from the device
// at path pci and the rest.
func nearest(pci string, nics []nicInfo) [2][]string {
	best := -1
	dist := make([]int, len(nics))
	for i, n := range nics {
		dist[i] = -1
		if pci != "" && n.pci != "" {
			dist[i] = pciDistance(pci, n.pci)
			if best < 0 || dist[i] < best {
				best = dist[i]
			}
		}
	}
	var pref, other []string
	for i, n := range nics {
		if best >= 0 && dist[i] == best {
			pref = append(pref, n.name)
		} else {
			other = append(other, n.name)
		}
	}
	return [2][]string{nonNil(pref), nonNil(other)}
}

// pciDistance counts the path components of a and b below their common
// prefix: the hops between two devices through the PCI tree.
func pciDistance(a, b string) int {
	as := strings.Split(strings.Trim(a, "/"), "/")
	bs := strings.Split(strings.Trim(b, "/"), "/")
	i := 0
	for i < len(as) && i < len(bs) && as[i] == bs[i] {
		i++
	}
	return len(as) - i + len(bs) - i
}

// numaNodes lists the NUMA node numbers under root, in order.
func numaNodes(root string) []int {
	ents, err := os.ReadDir(filepath.Join(root, "sys/devices/system/node"))
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		if n, ok := strings.CutPrefix(e.Name(), "node"); ok && e.IsDir() {
			if v, err := strconv.Atoi(n); err == nil {
				out = append(out, v)
			}
		}
	}
	slices.Sort(out)
	return out
}

// gpuBuses maps lower-case GPU UUIDs to PCI addresses from the NVIDIA
// driver's /proc/driver/nvidia/gpus/<PCI address>/information.
func gpuBuses(root string) map[string]string {
	out := map[string]string{}
	files, _ := filepath.Glob(filepath.Join(root, "proc/driver/nvidia/gpus/*/information"))
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		var uuid string
		bus := strings.ToLower(filepath.Base(filepath.Dir(f)))
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "GPU UUID" {
				uuid = strings.ToLower(strings.TrimSpace(v))
			}
		}
		fh.Close()
		if uuid != "" {
			out[uuid] = bus
		}
	}
	return out
}

func readInt(path string, def int) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return def
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return def
	}
	return v
}

func realPath(p string) string {
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		return ""
	}
	return r
}

// nonNil makes an empty list encode as [] rather than null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
