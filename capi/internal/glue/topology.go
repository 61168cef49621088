package glue

import (
	"path/filepath"

	"github.com/tecache/te/internal/sys/topo"
)

// SysRoot is the filesystem root LocalTopology reads sysfs under ("/" in
// production, where TE_SYSFS_ROOT may replace /sys; tests name a tree).
const SysRoot = "/"

// Topology is Mooncake's topology JSON: each memory location ("cpu:N" for a
// NUMA node, "cuda:N" for a GPU) maps to [preferred NICs, other NICs].
type Topology = topo.Matrix

// LocalTopology describes this machine through package topo: every NUMA
// node and GPU with the NICs libibverbs lists (those in filter, when it is
// not empty), split into the ones near it and the others.
func LocalTopology(root string, filter []string) Topology {
	sys := topo.Root()
	if root != SysRoot {
		sys = filepath.Join(root, "sys")
	}
	m, err := topo.Discover(topo.Options{Root: sys, NICs: topo.ProbeNICs(), Allow: filter, GPUs: topo.ProbeGPUs()})
	if err != nil {
		return Topology{}
	}
	return m.Matrix()
}
