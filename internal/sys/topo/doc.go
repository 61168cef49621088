// Package topo describes where a machine's GPUs and RDMA NICs sit: their
// PCIe ancestry and NUMA nodes, read from sysfs, and which NICs are near
// each memory location.
//
// Every memory location ("cpu:N" for NUMA node N, "cuda:N" for CUDA device
// N) gets two tiers of NICs: preferred ones and the others. For a GPU the
// preferred NICs are those behind the same PCIe switch, else those on its
// NUMA node, else those under its PCI root complex, else all; for a NUMA
// node, the NICs attached to it. The rdma transport spreads a request over
// its location's preferred NICs and falls back to the others; Matrix is the
// same in Mooncake's topology JSON ({"cpu:0": [[preferred...], [others...]]}),
// which te_local_topology and Python's te.local_topology return.
//
// Sysfs is read under Root: TE_SYSFS_ROOT replaces /sys, so tests (and the
// fake libibverbs and CUDA driver, which list the same devices) run on
// recorded trees. Those are kept as manifests (testdata/*.tree; Materialize
// builds one, Record writes one from a live machine): sysfs names hold ':',
// which a Go module zip does not allow in file names.
//
// The package is ground floor: it reads files and, in Local only, asks
// libibverbs and the CUDA driver (internal/sys/ibv, internal/sys/cuda) which
// NICs and GPUs this process sees.
package topo
