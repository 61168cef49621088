package topo

import (
	"github.com/tecache/te/internal/sys/cuda"
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
	ProbeGPUs = func() []string {
		l, err := cuda.Load()
		if err != nil {
			return nil
		}
		n, err := l.DeviceCount()
		if err != nil {
			return nil
		}
		out := make([]string, n)
		for i := range out {
			if d, err := l.DeviceGet(i); err == nil {
				out[i], _ = l.DevicePCIBusID(d)
			}
		}
		return out
	}
)

// Local describes this machine as te sees it: the NICs libibverbs lists
// (those in allow, when it is not empty) and the GPUs the CUDA driver
// reports, placed in the sysfs tree at Root().
func Local(allow []string) (*Machine, error) {
	return Discover(Options{NICs: ProbeNICs(), Allow: allow, GPUs: ProbeGPUs()})
}
