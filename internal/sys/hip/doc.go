// Package hip binds the HIP runtime (ROCm's libamdhip64) through purego, as
// package cuda binds libcuda: no cgo, the library found at run time
// (TE_HIP_LIBRARY, else libamdhip64.so, libamdhip64.so.6, libamdhip64.so.5),
// every symbol te uses resolved at load, and a machine without an AMD GPU
// told apart (NotSupported naming the cause) from one where HIP works. It
// implements gpu.Driver for device memory registered as "hip:N", the name
// Mooncake's ROCm builds use.
//
// ROCm 5 and 6 differ where te looks: hipPointerAttribute_t keeps its layout
// (memory type u32 at 0, device i32 at 4, device and host pointers at 8 and
// 16, isManaged at 24, allocationFlags at 28) but ROCm 6 renumbered
// hipMemoryType to match CUDA (Host 0 -> 1, Device 1 -> 2) and reports
// unregistered memory as type 0 instead of failing with
// hipErrorInvalidValue. ROCm 6 also changed hipIpcMemLazyEnablePeerAccess
// from 0 to 1, and hipIpcOpenMemHandle refuses any other flags than its own
// header's. The runtime version (hipRuntimeGetVersion, major = version /
// 10000000) picks the numbering and the flags. IPC handles are 64 bytes in
// both.
//
// Besides the calls behind the gpu.Driver methods it binds
// hipMemGetAddressRange (IPC exports and dma-bufs are of whole
// allocations) and hipDeviceGetUuid (peers match devices by UUID), both in
// ROCm 5 and 6. Package hiptest has a fake runtime for tests without an AMD
// GPU.
//
// dma-buf export goes through hsa_amd_portable_export_dmabuf (ROCm 5.6 and
// later, in libhsa-runtime64, which libamdhip64 loads), looked up where
// present; without it DmabufFD is NotSupported.
package hip
