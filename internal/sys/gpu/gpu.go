package gpu

import (
	"sort"
	"sync"
)

// Stream is a runtime's stream handle (0 is the default stream).
type Stream uintptr

// Dir is the direction of a copy. An explicit one lets the runtime refuse
// an address that is not the memory the caller said (a host range registered
// as device memory), where Default would copy whatever it finds.
type Dir int

// Copy directions.
const (
	Default Dir = iota // inferred from the addresses (unified addressing)
	HostToDevice
	DeviceToHost
	DeviceToDevice
)

// IPCHandle is an exported device allocation: cudaIpcMemHandle_t and
// hipIpcMemHandle_t are both 64 opaque bytes.
type IPCHandle [64]byte

// Driver is a loaded GPU runtime. Its methods are safe for concurrent use.
type Driver interface {
	// Kind is the location kind of the runtime's device memory ("cuda",
	// "hip"): device N's memory is registered as Kind():N.
	Kind() string
	// DeviceCount returns how many devices the runtime sees.
	DeviceCount() (int, error)
	// PointerDevice says whether ptr is device memory of this runtime,
	// and of which device; host or unknown memory is (−1, false, nil).
	PointerDevice(ptr uint64) (dev int, device bool, err error)
	// PCIBusID returns device dev's PCI address, normalised to
	// dddd:bb:dd.f in lower case (as sysfs names it).
	PCIBusID(dev int) (string, error)
	// HostAlloc returns n bytes of pinned host memory; HostFree frees it.
	HostAlloc(n uint64) (uint64, error)
	HostFree(p uint64) error
	// StreamCreate makes a stream on device dev; StreamDestroy ends it.
	StreamCreate(dev int) (Stream, error)
	StreamDestroy(s Stream) error
	// CopyAsync queues a copy of n bytes in direction dir; StreamSync
	// waits for s.
	CopyAsync(dst, src, n uint64, dir Dir, s Stream) error
	StreamSync(s Stream) error
	// AllocRange returns the allocation holding device memory at ptr on
	// device dev: IPC exports and dma-bufs are of whole allocations.
	AllocRange(dev int, ptr uint64) (base, size uint64, err error)
	// DeviceUUID returns device dev's UUID in hex (32 digits), the same in
	// every process whatever the visible-devices numbering; "" with an
	// error where the runtime cannot tell.
	DeviceUUID(dev int) (string, error)
	// IPCExport exports the allocation whose base is ptr, on device dev,
	// for another process; IPCImport maps a peer's export on device dev
	// here and IPCClose unmaps it.
	IPCExport(dev int, ptr uint64) (IPCHandle, error)
	IPCImport(dev int, h IPCHandle) (uint64, error)
	IPCClose(dev int, ptr uint64) error
	// DmabufFD exports [ptr, ptr+size) of device dev, ptr the base of an
	// allocation and size page aligned, as a dma-buf (for NIC
	// registration); NotSupported where the runtime cannot.
	DmabufFD(dev int, ptr, size uint64) (int, error)
}

var (
	mu      sync.Mutex
	loaders = map[string]func() (Driver, error){}
)

// Register makes the runtime that load opens available under kind; vendor
// packages call it from init.
func Register(kind string, load func() (Driver, error)) {
	mu.Lock()
	defer mu.Unlock()
	loaders[kind] = load
}

// Known reports whether a runtime registered kind (whether or not it loads).
func Known(kind string) bool {
	mu.Lock()
	defer mu.Unlock()
	_, ok := loaders[kind]
	return ok
}

// Kinds lists the registered kinds, sorted.
func Kinds() []string {
	mu.Lock()
	defer mu.Unlock()
	var out []string
	for k := range loaders {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Load opens the runtime registered under kind (each loads once per
// process); ok is false when no runtime registered kind.
func Load(kind string) (d Driver, ok bool, err error) {
	mu.Lock()
	load := loaders[kind]
	mu.Unlock()
	if load == nil {
		return nil, false, nil
	}
	d, err = load()
	return d, true, err
}

// Find asks every runtime that loads which one owns ptr: the driver and
// device of device memory, or ok false for host memory.
func Find(ptr uint64) (d Driver, dev int, ok bool) {
	for _, k := range Kinds() {
		drv, _, err := Load(k)
		if err != nil {
			continue
		}
		if n, isDev, err := drv.PointerDevice(ptr); err == nil && isDev {
			return drv, n, true
		}
	}
	return nil, -1, false
}

// IsDevice reports whether a location kind is device memory of a GPU
// runtime: anything but host memory ("cpu"), detection ("*") and storage
// ("file"). The runtime need not be built in: "hip:0" is device memory
// whether or not this process can reach it.
func IsDevice(kind string) bool {
	switch kind {
	case "", "cpu", "*", "file":
		return false
	}
	return true
}

// Copy is one copy of N bytes from Src to Dst in direction Dir.
type Copy struct {
	Dst, Src, N uint64
	Dir         Dir
}

// Batcher is implemented by runtimes that queue several copies on a stream
// for less than one CopyAsync each (CUDA makes the stream's context
// current once for all of them, not once per copy). CopiesAsync queues
// cs[i] and sets errs[i] (len(errs) == len(cs)) to how queueing it ended.
type Batcher interface {
	CopiesAsync(cs []Copy, s Stream, errs []error)
}

// FabricHandle is an exported allocation that GPUs of other hosts in the
// same NVLink domain map (CUDA's CUmemFabricHandle: 64 opaque bytes).
type FabricHandle [64]byte

// Fabric is what a runtime with multi-node NVLink offers besides Driver:
// export of an allocation made fabric-capable (CUDA: cuMemCreate with
// CU_MEM_HANDLE_TYPE_FABRIC) and its import on a peer, wherever in the
// domain the peer runs. Callers type-assert a Driver to it.
type Fabric interface {
	// FabricSupported reports whether device dev exports and imports
	// fabric handles.
	FabricSupported(dev int) bool
	// FabricExport exports the allocation whose base is ptr, on device
	// dev; NotSupported (saying why) for memory without a fabric handle.
	FabricExport(dev int, ptr uint64) (FabricHandle, error)
	// FabricImport maps a peer's export of an allocation of size bytes
	// for device dev; FabricClose unmaps it.
	FabricImport(dev int, h FabricHandle, size uint64) (uint64, error)
	FabricClose(dev int, ptr, size uint64) error
}
