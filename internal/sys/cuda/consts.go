package cuda

// Values from cuda.h (checked in consts_test.go against the header's text).

// Result is a CUresult.
type Result uint32

// CUresult values te tells apart.
const (
	Success              Result = 0   // CUDA_SUCCESS
	ErrInvalidValue      Result = 1   // CUDA_ERROR_INVALID_VALUE
	ErrOutOfMemory       Result = 2   // CUDA_ERROR_OUT_OF_MEMORY
	ErrNotInitialized    Result = 3   // CUDA_ERROR_NOT_INITIALIZED
	ErrDeinitialized     Result = 4   // CUDA_ERROR_DEINITIALIZED
	ErrStubLibrary       Result = 34  // CUDA_ERROR_STUB_LIBRARY
	ErrInsufficientDrv   Result = 35  // CUDA_ERROR_INSUFFICIENT_DRIVER
	ErrNoDevice          Result = 100 // CUDA_ERROR_NO_DEVICE
	ErrInvalidDevice     Result = 101 // CUDA_ERROR_INVALID_DEVICE
	ErrInvalidContext    Result = 201 // CUDA_ERROR_INVALID_CONTEXT
	ErrMapFailed         Result = 205 // CUDA_ERROR_MAP_FAILED
	ErrAlreadyMapped     Result = 208 // CUDA_ERROR_ALREADY_MAPPED
	ErrPeerAccessUnsupp  Result = 217 // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
	ErrOperatingSystem   Result = 304 // CUDA_ERROR_OPERATING_SYSTEM
	ErrInvalidHandle     Result = 400 // CUDA_ERROR_INVALID_HANDLE
	ErrNotFound          Result = 500 // CUDA_ERROR_NOT_FOUND
	ErrNotReady          Result = 600 // CUDA_ERROR_NOT_READY
	ErrIllegalAddress    Result = 700 // CUDA_ERROR_ILLEGAL_ADDRESS
	ErrPeerAccessEnabled Result = 704 // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
	ErrNotPermitted      Result = 800 // CUDA_ERROR_NOT_PERMITTED
	ErrNotSupported      Result = 801 // CUDA_ERROR_NOT_SUPPORTED
	ErrUnknown           Result = 999 // CUDA_ERROR_UNKNOWN
)

var resultNames = map[Result]string{
	Success:              "CUDA_SUCCESS",
	ErrInvalidValue:      "CUDA_ERROR_INVALID_VALUE",
	ErrOutOfMemory:       "CUDA_ERROR_OUT_OF_MEMORY",
	ErrNotInitialized:    "CUDA_ERROR_NOT_INITIALIZED",
	ErrDeinitialized:     "CUDA_ERROR_DEINITIALIZED",
	ErrStubLibrary:       "CUDA_ERROR_STUB_LIBRARY",
	ErrInsufficientDrv:   "CUDA_ERROR_INSUFFICIENT_DRIVER",
	ErrNoDevice:          "CUDA_ERROR_NO_DEVICE",
	ErrInvalidDevice:     "CUDA_ERROR_INVALID_DEVICE",
	ErrInvalidContext:    "CUDA_ERROR_INVALID_CONTEXT",
	ErrMapFailed:         "CUDA_ERROR_MAP_FAILED",
	ErrAlreadyMapped:     "CUDA_ERROR_ALREADY_MAPPED",
	ErrPeerAccessUnsupp:  "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	ErrOperatingSystem:   "CUDA_ERROR_OPERATING_SYSTEM",
	ErrInvalidHandle:     "CUDA_ERROR_INVALID_HANDLE",
	ErrNotFound:          "CUDA_ERROR_NOT_FOUND",
	ErrNotReady:          "CUDA_ERROR_NOT_READY",
	ErrIllegalAddress:    "CUDA_ERROR_ILLEGAL_ADDRESS",
	ErrPeerAccessEnabled: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	ErrNotPermitted:      "CUDA_ERROR_NOT_PERMITTED",
	ErrNotSupported:      "CUDA_ERROR_NOT_SUPPORTED",
	ErrUnknown:           "CUDA_ERROR_UNKNOWN",
}

// PointerAttribute is a CUpointer_attribute.
type PointerAttribute uint32

// CUpointer_attribute values.
const (
	AttrContext          PointerAttribute = 1  // CU_POINTER_ATTRIBUTE_CONTEXT
	AttrMemoryType       PointerAttribute = 2  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
	AttrDevicePointer    PointerAttribute = 3  // CU_POINTER_ATTRIBUTE_DEVICE_POINTER
	AttrHostPointer      PointerAttribute = 4  // CU_POINTER_ATTRIBUTE_HOST_POINTER
	AttrBufferID         PointerAttribute = 7  // CU_POINTER_ATTRIBUTE_BUFFER_ID
	AttrIsManaged        PointerAttribute = 8  // CU_POINTER_ATTRIBUTE_IS_MANAGED
	AttrDeviceOrdinal    PointerAttribute = 9  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
	AttrIsLegacyIPC      PointerAttribute = 10 // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
	AttrRangeStartAddr   PointerAttribute = 11 // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
	AttrRangeSize        PointerAttribute = 12 // CU_POINTER_ATTRIBUTE_RANGE_SIZE
	AttrMapped           PointerAttribute = 13 // CU_POINTER_ATTRIBUTE_MAPPED
	AttrAllowedHandles   PointerAttribute = 14 // CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
	AttrGPUDirectRDMACap PointerAttribute = 15 // CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE
)

// MemoryType is a CUmemorytype; 0 means the driver does not know the pointer.
type MemoryType uint32

// CUmemorytype values.
const (
	MemoryUnknown MemoryType = 0
	MemoryHost    MemoryType = 1 // CU_MEMORYTYPE_HOST
	MemoryDevice  MemoryType = 2 // CU_MEMORYTYPE_DEVICE
	MemoryArray   MemoryType = 3 // CU_MEMORYTYPE_ARRAY
	MemoryUnified MemoryType = 4 // CU_MEMORYTYPE_UNIFIED
)

func (m MemoryType) String() string {
	switch m {
	case MemoryHost:
		return "host"
	case MemoryDevice:
		return "device"
	case MemoryArray:
		return "array"
	case MemoryUnified:
		return "unified"
	}
	return "unknown"
}

// IPCHandleSize is CU_IPC_HANDLE_SIZE.
const IPCHandleSize = 64

// IPCMemHandle is CUipcMemHandle: 64 opaque bytes, passed by value.
type IPCMemHandle struct {
	Reserved [IPCHandleSize]byte
}

// UUID is CUuuid.
type UUID struct {
	Bytes [16]byte
}

// Flags.
const (
	IPCLazyEnablePeerAccess uint32 = 0x1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

	HostAllocPortable      uint32 = 0x1 // CU_MEMHOSTALLOC_PORTABLE
	HostAllocDeviceMap     uint32 = 0x2 // CU_MEMHOSTALLOC_DEVICEMAP
	HostAllocWriteCombined uint32 = 0x4 // CU_MEMHOSTALLOC_WRITECOMBINED

	StreamDefault     uint32 = 0x0 // CU_STREAM_DEFAULT
	StreamNonBlocking uint32 = 0x1 // CU_STREAM_NON_BLOCKING

	EventDefault       uint32 = 0x0 // CU_EVENT_DEFAULT
	EventBlockingSync  uint32 = 0x1 // CU_EVENT_BLOCKING_SYNC
	EventDisableTiming uint32 = 0x2 // CU_EVENT_DISABLE_TIMING
	EventInterprocess  uint32 = 0x4 // CU_EVENT_INTERPROCESS
)
