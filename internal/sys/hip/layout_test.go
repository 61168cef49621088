package hip

import (
	"testing"
	"unsafe"

	lt "github.com/tecache/te/internal/sys/layouttest"
)

// header is what the layout program includes: hip_runtime_api.h compiles
// only with a platform chosen, as hipcc chooses it.
const header = "__HIP_PLATFORM_AMD__=1 hip/hip_runtime_api.h"

// goFacts is what the Go side claims about HIP's structs and constants. The
// headers compared with are ROCm 5's (Debian's libamdhip64-dev 5.2.3), so
// the values that ROCm 6 renumbered are checked as ROCm 5 has them.
func goFacts() []lt.Fact {
	const pa = "hipPointerAttribute_t"
	return []lt.Fact{
		lt.Size(pa, PointerAttrSize),
		lt.Member(pa, "memoryType", OffPointerType, 4),
		lt.Member(pa, "device", OffPointerDevice, 4),
		lt.Size("hipIpcMemHandle_t", unsafe.Sizeof(IPCMemHandle{})),
		lt.Const("hipSuccess", uint64(Success)),
		lt.Const("hipErrorInvalidValue", uint64(ErrInvalidValue)),
		lt.Const("hipErrorNoDevice", uint64(ErrNoDevice)),
		lt.Const("hipErrorNoBinaryForGpu", uint64(ErrNoBinary)),
		lt.Const("hipMemcpyDefault", memcpyDefault),
		lt.Const("hipHostMallocPortable", hostMallocPortable),
		lt.Const("hipStreamNonBlocking", streamNonBlocking),
		lt.Const("hipIpcMemLazyEnablePeerAccess", uint64(ipcLazyEnablePeerAccess(5))),
		lt.Const("hipMemoryTypeHost", Rocm5Host),
		lt.Const("hipMemoryTypeDevice", Rocm5Device),
	}
}

// TestLayoutMatchesHeaders compares the mirrored struct layouts and
// constants with hip_runtime_api.h (libamdhip64-dev, .ci/deps.d/hip.pkgs)
// and always with the golden file of this architecture.
func TestLayoutMatchesHeaders(t *testing.T) {
	lt.Check(t, header, "offsetof/sizeof from hip_runtime_api.h (Debian libamdhip64-dev 5.2.3-8), written by TestLayoutMatchesHeaders", goFacts())
}

// TestLayoutArm64 checks testdata/layout_arm64.golden against the same
// header built for arm64 (the cross compiler, its program under qemu-user);
// the arm64 build's mirrors meet that file in make test-arm64.
func TestLayoutArm64(t *testing.T) {
	lt.CheckArch(t, "arm64", header, goFacts())
}

// TestIPCFlagsFollowTheRuntime: hipIpcOpenMemHandle accepts only its own
// header's hipIpcMemLazyEnablePeerAccess, 0 up to ROCm 5 and 1 from ROCm 6.
func TestIPCFlagsFollowTheRuntime(t *testing.T) {
	for major, want := range map[int]uint32{5: 0, 6: 1, 7: 1} {
		if got := ipcLazyEnablePeerAccess(major); got != want {
			t.Errorf("ROCm %d: flags %d, want %d", major, got, want)
		}
	}
}
