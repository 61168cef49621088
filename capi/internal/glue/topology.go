package glue

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/tecache/te/internal/sys/topo"
)

// SysRoot is the filesystem root LocalTopology reads sysfs under ("/" in
// production, where TE_SYSFS_ROOT may replace /sys; tests name a tree).
const SysRoot = "/"

// Topology is Mooncake's topology JSON: each memory location ("cpu:N" for a
// NUMA node, "cuda:N" for a GPU) maps to [preferred NICs, other NICs].
type Topology = topo.Matrix

// LocalTopology describes this machine through package topo: every NUMA
// node and GPU with the NICs libibverbs lists (those in filter, else those
// TE_RDMA_DEVICES or MC_TE_FILTERS allow, as the rdma transport does),
// split into the ones near it and the others.
func LocalTopology(root string, filter []string) Topology {
	if len(filter) == 0 {
		for _, env := range []string{"TE_RDMA_DEVICES", "MC_TE_FILTERS"} {
			if v := os.Getenv(env); v != "" {
				filter = strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == ';' })
				break
			}
		}
	}
	sys := topo.Root()
	if root != SysRoot {
		sys = filepath.Join(root, "sys")
	}
	m, err := topo.Discover(topo.Options{Root: sys, NICs: topo.ProbeNICs(), Allow: filter, GPUs: topo.ProbeGPUs(), GPUsByKind: topo.ProbeGPUsByKind()})
	if err != nil {
		return Topology{}
	}
	return m.Matrix()
}
