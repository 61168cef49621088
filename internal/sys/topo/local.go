package topo

import (
	"github.com/tecache/te/internal/sys/gpu"
	// Links the GPU runtimes, so their devices are placed.
	_ "github.com/tecache/te/internal/sys/gpu/runtimes"
	"github.com/tecache/te/internal/sys/ibv"
)

// Probes of the devices this process sees; variables so tests can describe
// a machine.
var (
	// ProbeNICs lists the RDMA devices libibverbs reports (none when it
	// does not load).
	ProbeNICs = func() []string {
		names, err := ibv.Probe()
		if err != nil {
			return []string{}
		}
		return names
	}
	// ProbeGPUs lists the PCI addresses of the CUDA devices by ordinal
	// (none without a driver; "" for a device whose address the driver
	// does not give).
	ProbeGPUs = func() []string { return probeKind("cuda") }
	// ProbeGPUsByKind lists them for every runtime that loads, by
	// location kind.
	ProbeGPUsByKind = func() map[string][]string {
		out := map[string][]string{}
		for _, k := range gpu.Kinds() {
			if ids := probeKind(k); len(ids) > 0 {
				out[k] = ids
			}
		}
		return out
	}
)

// probeKind asks runtime kind for its devices' PCI addresses.
func probeKind(kind string) []string {
	d, _, err := gpu.Load(kind)
	if err != nil || d == nil {
		return nil
	}
	n, err := d.DeviceCount()
	if err != nil {
		return nil
	}
	out := make([]string, n)
	for i := range out {
		out[i], _ = d.PCIBusID(i)
	}
	return out
}

// Local describes this machine as te sees it: the NICs libibverbs lists
// (those in allow, when it is not empty) and the GPUs every runtime
// reports, placed in the sysfs tree at Root() (ProbeGPUs answers for CUDA,
// so a test that replaces it describes the machine's CUDA devices).
func Local(allow []string) (*Machine, error) {
	return Discover(Options{NICs: ProbeNICs(), Allow: allow, GPUs: ProbeGPUs(), GPUsByKind: ProbeGPUsByKind()})
}
