package tebench

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/klauspost/cpuid/v2"
)

// Machine names the machine a figure holds for.
type Machine struct {
	CPU           string `json:"cpu"`
	LogicalCores  int    `json:"logical_cores"`
	PhysicalCores int    `json:"physical_cores"`
	GOMAXPROCS    int    `json:"gomaxprocs"`
	L1D           int    `json:"l1d_bytes"`
	L2            int    `json:"l2_bytes"`
	L3            int    `json:"l3_bytes"`
	Features      string `json:"features"`
}

// ThisMachine describes the machine the process runs on.
func ThisMachine() Machine {
	c := cpuid.CPU
	var feats []string
	for _, f := range []cpuid.FeatureID{cpuid.SSE4, cpuid.AVX, cpuid.AVX2, cpuid.AVX512F, cpuid.ERMS, cpuid.FSRM} {
		if c.Supports(f) {
			feats = append(feats, f.String())
		}
	}
	return Machine{
		CPU: strings.TrimSpace(c.BrandName), LogicalCores: runtime.NumCPU(), PhysicalCores: c.PhysicalCores,
		GOMAXPROCS: runtime.GOMAXPROCS(0), L1D: c.Cache.L1D, L2: c.Cache.L2, L3: c.Cache.L3,
		Features: strings.Join(feats, ","),
	}
}

func (m Machine) String() string {
	return fmt.Sprintf("%s, %d logical cores (%d physical), L1d %s, L2 %s, L3 %s, %s",
		m.CPU, m.LogicalCores, m.PhysicalCores, FormatSize(uint64(max(m.L1D, 0))),
		FormatSize(uint64(max(m.L2, 0))), FormatSize(uint64(max(m.L3, 0))), m.Features)
}

// FormatSize prints a byte count with the largest binary unit that divides it.
func FormatSize(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
