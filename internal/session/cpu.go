package session

import (
	"runtime"
	"strings"

	"github.com/klauspost/cpuid/v2"
)

// HardwareAES reports whether this CPU computes AES-GCM in hardware (AES
// and carry-less multiply instructions, which Go's crypto/aes uses): with
// them a record costs a few hundred nanoseconds, without them Go falls back
// to constant-time software at a small fraction of the speed. An engine
// that encrypts says so in its log.
func HardwareAES() bool {
	switch runtime.GOARCH {
	case "amd64":
		return cpuid.CPU.Supports(cpuid.AESNI, cpuid.CLMUL)
	case "arm64":
		return cpuid.CPU.Supports(cpuid.AESARM, cpuid.PMULL)
	}
	return false
}

// CPUFeatures names the crypto features of this CPU that sessions and the
// exchange can use (AES, carry-less multiply, their vector forms, SHA),
// for a log line or a benchmark's header.
func CPUFeatures() string {
	var have []string
	for _, f := range []cpuid.FeatureID{cpuid.AESNI, cpuid.CLMUL, cpuid.VAES, cpuid.VPCLMULQDQ, cpuid.SHA, cpuid.AESARM, cpuid.PMULL, cpuid.SHA2} {
		if cpuid.CPU.Supports(f) {
			have = append(have, f.String())
		}
	}
	if len(have) == 0 {
		return "none"
	}
	return strings.Join(have, ",")
}
