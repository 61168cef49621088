package cuda

import (
	"unsafe"

	"github.com/tecache/te/internal/errs"
)

// Facts of cuda.h (CUDA 12.3 and later, where fabric handles appeared; the
// virtual memory management calls date from CUDA 10.2), checked against
// the public headers:
//
//	CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 128
//	CU_MEM_HANDLE_TYPE_FABRIC                        = 0x8
//	CU_MEM_ALLOCATION_TYPE_PINNED                    = 0x1
//	CU_MEM_LOCATION_TYPE_DEVICE                      = 0x1
//	CU_MEM_ACCESS_FLAGS_PROT_READWRITE               = 0x3
//	typedef struct { unsigned char data[64]; } CUmemFabricHandle;
//	typedef struct {                        // CUmemAllocationProp, 32 bytes
//	    CUmemAllocationType type;           // 0
//	    CUmemAllocationHandleType requestedHandleTypes; // 4
//	    CUmemLocation location;             // 8: { int type; int id; }
//	    void *win32HandleMetaData;          // 16
//	    struct { unsigned char compressionType, gpuDirectRDMACapable;
//	             unsigned short usage; unsigned char reserved[4]; } allocFlags; // 24
//	} CUmemAllocationProp;
//	typedef struct { CUmemLocation location; CUmemAccess_flags flags; } CUmemAccessDesc; // 12 bytes
const (
	AttrHandleTypeFabricSupported = 128
	MemHandleTypeFabric           = 0x8
	memAllocationTypePinned       = 1
	memLocationTypeDevice         = 1
	memAccessProtReadWrite        = 3
)

// FabricHandle is a CUmemFabricHandle: 64 opaque bytes that name an
// allocation across every GPU of one NVLink domain.
type FabricHandle [64]byte

// MemAllocationProp is CUmemAllocationProp (the fields te sets or reads).
type MemAllocationProp struct {
	Type                 int32
	RequestedHandleTypes uint32
	LocationType         int32
	LocationID           int32
	Win32HandleMetaData  uintptr
	AllocFlags           [8]byte
}

type memAccessDesc struct {
	LocationType int32
	LocationID   int32
	Flags        int32
}

// Compile-time checks of the C layouts.
var (
	_ [32 - unsafe.Sizeof(MemAllocationProp{})]struct{}
	_ [unsafe.Sizeof(MemAllocationProp{}) - 32]struct{}
	_ [12 - unsafe.Sizeof(memAccessDesc{})]struct{}
	_ [unsafe.Sizeof(memAccessDesc{}) - 12]struct{}
)

func (l *Lib) vmm(call string) error {
	if l.cuMemCreate == nil || l.cuMemRetainAllocationHandle == nil || l.cuMemGetAllocationPropertiesFromHandle == nil ||
		l.cuMemExportToShareableHandle == nil || l.cuMemImportFromShareableHandle == nil || l.cuMemAddressReserve == nil ||
		l.cuMemAddressFree == nil || l.cuMemMap == nil || l.cuMemUnmap == nil || l.cuMemSetAccess == nil || l.cuMemRelease == nil {
		return errs.New(errs.NotSupported, "cuda", "%s lacks the virtual memory management calls (%s)", l.Path, call).
			WithHint("fabric handles need CUDA 12.3 or newer")
	}
	return nil
}

// FabricSupported reports whether device d can export and import fabric
// handles (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED).
func (l *Lib) FabricSupported(d Device) bool {
	if l.cuDeviceGetAttribute == nil || l.vmm("cuDeviceGetAttribute") != nil {
		return false
	}
	s := l.slot()
	defer l.put(s)
	return l.cuDeviceGetAttribute(s, AttrHandleTypeFabricSupported, int32(d)) == Success && load[int32](s) != 0
}

// MemCreate allocates n bytes on device dev with the given shareable
// handle types and maps them read-write for dev at a fresh address: what an
// application does to get fabric-exportable memory. Free it with
// MemDestroy.
func (l *Lib) MemCreate(dev int, n uint64, handleTypes uint32) (uint64, error) {
	if err := l.vmm("cuMemCreate"); err != nil {
		return 0, err
	}
	s := l.slot()
	defer l.put(s)
	*(*MemAllocationProp)(cptr(s)) = MemAllocationProp{Type: memAllocationTypePinned, RequestedHandleTypes: handleTypes,
		LocationType: memLocationTypeDevice, LocationID: int32(dev)}
	if r := l.cuMemCreate(s+64, uintptr(n), s, 0); r != Success {
		return 0, l.err(r, "cuMemCreate", "%d bytes on device %d", n, dev)
	}
	h := load[uint64](s + 64)
	defer l.cuMemRelease(h) // the mapping keeps the allocation
	return l.mapHandle(dev, h, n)
}

// MemDestroy unmaps memory from MemCreate or FabricImport and frees its
// address range.
func (l *Lib) MemDestroy(ptr, n uint64) error {
	if err := l.vmm("cuMemUnmap"); err != nil {
		return err
	}
	if r := l.cuMemUnmap(ptr, uintptr(n)); r != Success {
		return l.err(r, "cuMemUnmap", "[%#x,+%d)", ptr, n)
	}
	if r := l.cuMemAddressFree(ptr, uintptr(n)); r != Success {
		return l.err(r, "cuMemAddressFree", "[%#x,+%d)", ptr, n)
	}
	return nil
}

// mapHandle reserves n bytes of address space, maps allocation h there and
// lets device dev read and write it.
func (l *Lib) mapHandle(dev int, h, n uint64) (uint64, error) {
	s := l.slot()
	defer l.put(s)
	if r := l.cuMemAddressReserve(s, uintptr(n), 0, 0, 0); r != Success {
		return 0, l.err(r, "cuMemAddressReserve", "%d bytes", n)
	}
	p := load[uint64](s)
	if r := l.cuMemMap(p, uintptr(n), 0, h, 0); r != Success {
		l.cuMemAddressFree(p, uintptr(n))
		return 0, l.err(r, "cuMemMap", "%d bytes at %#x", n, p)
	}
	*(*memAccessDesc)(cptr(s + 16)) = memAccessDesc{LocationType: memLocationTypeDevice, LocationID: int32(dev), Flags: memAccessProtReadWrite}
	if r := l.cuMemSetAccess(p, uintptr(n), s+16, 1); r != Success {
		l.cuMemUnmap(p, uintptr(n))
		l.cuMemAddressFree(p, uintptr(n))
		return 0, l.err(r, "cuMemSetAccess", "[%#x,+%d) for device %d", p, n, dev)
	}
	return p, nil
}

// FabricExport exports the allocation that holds ptr as a fabric handle.
// Memory from cuMemAlloc (no allocation handle) or from cuMemCreate without
// CU_MEM_HANDLE_TYPE_FABRIC has none: NotSupported, saying which.
func (l *Lib) FabricExport(ptr uint64) (FabricHandle, error) {
	if err := l.vmm("cuMemExportToShareableHandle"); err != nil {
		return FabricHandle{}, err
	}
	s := l.slot()
	defer l.put(s)
	if r := l.cuMemRetainAllocationHandle(s, ptr); r != Success {
		return FabricHandle{}, errs.Wrap(errs.NotSupported, "cuda", &ResultError{Call: "cuMemRetainAllocationHandle", Result: r},
			"%#x is not memory of cuMemCreate (cuMemAlloc memory has no fabric handle)", ptr)
	}
	h := load[uint64](s)
	defer l.cuMemRelease(h)
	if r := l.cuMemGetAllocationPropertiesFromHandle(s, h); r != Success {
		return FabricHandle{}, l.err(r, "cuMemGetAllocationPropertiesFromHandle", "%#x", ptr)
	}
	if p := load[MemAllocationProp](s); p.RequestedHandleTypes&MemHandleTypeFabric == 0 {
		return FabricHandle{}, errs.New(errs.NotSupported, "cuda",
			"the allocation holding %#x was made without CU_MEM_HANDLE_TYPE_FABRIC (handle types %#x)", ptr, p.RequestedHandleTypes)
	}
	if r := l.cuMemExportToShareableHandle(s+64, h, MemHandleTypeFabric, 0); r != Success {
		return FabricHandle{}, l.err(r, "cuMemExportToShareableHandle", "fabric handle of %#x", ptr)
	}
	return load[FabricHandle](s + 64), nil
}

// FabricImport maps another process's fabric handle (an allocation of n
// bytes) read-write for device dev and returns its address here; unmap it
// with MemDestroy.
func (l *Lib) FabricImport(dev int, fh FabricHandle, n uint64) (uint64, error) {
	if err := l.vmm("cuMemImportFromShareableHandle"); err != nil {
		return 0, err
	}
	s := l.slot()
	defer l.put(s)
	*(*FabricHandle)(cptr(s + 64)) = fh
	if r := l.cuMemImportFromShareableHandle(s, s+64, MemHandleTypeFabric); r != Success {
		if r == ErrNotPermitted {
			return 0, errs.Wrap(errs.AccessDenied, "cuda", &ResultError{Call: "cuMemImportFromShareableHandle", Result: r},
				"import a peer's fabric handle").
				WithHint("the handle comes from another NVLink domain (or IMEX does not share it with this node)")
		}
		return 0, l.err(r, "cuMemImportFromShareableHandle", "import a peer's fabric handle")
	}
	h := load[uint64](s)
	defer l.cuMemRelease(h)
	return l.mapHandle(dev, h, n)
}
