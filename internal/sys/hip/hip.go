package hip

import (
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/sys/sigkeep"
)

// EnvLibrary overrides the libraries tried (Libraries).
const EnvLibrary = "TE_HIP_LIBRARY"

// Libraries are tried in order when TE_HIP_LIBRARY is unset: the
// development link, then the runtimes of ROCm 6 and 5.
var Libraries = []string{"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"}

// Error is a hipError_t.
type Error int32

// The hipError_t values te tells apart.
const (
	Success         Error = 0
	ErrInvalidValue Error = 1
	ErrNoDevice     Error = 100
	ErrNoBinary     Error = 209
)

// hipMemcpyDefault lets the runtime infer the direction (unified addressing).
const memcpyDefault = 4

// hipHostMallocPortable: pinned memory usable from every device.
const hostMallocPortable = 0x1

// hipStreamNonBlocking.
const streamNonBlocking = 0x1

// hipIpcMemLazyEnablePeerAccess, as ROCm 5 and ROCm 6 define it: the
// runtime refuses (hipErrorInvalidValue) any flags but its own header's
// value, and ROCm 6 changed it from 0 to CUDA's 1.
const (
	rocm5IPCLazyEnablePeerAccess = 0x0
	rocm6IPCLazyEnablePeerAccess = 0x1
)

// ipcLazyEnablePeerAccess is hipIpcMemLazyEnablePeerAccess of the runtime's
// major version.
func ipcLazyEnablePeerAccess(major int) uint32 {
	if major >= 6 {
		return rocm6IPCLazyEnablePeerAccess
	}
	return rocm5IPCLazyEnablePeerAccess
}

// Pointer attribute layout (hipPointerAttribute_t, ROCm 5 and 6).
const (
	OffPointerType   = 0
	OffPointerDevice = 4
	PointerAttrSize  = 32
)

// Memory types as numbered by ROCm 5 and by ROCm 6 (hipMemoryType).
const (
	Rocm5Host, Rocm5Device = 0, 1
	Rocm6Host, Rocm6Device = 1, 2
)

// IPCMemHandle is hipIpcMemHandle_t, passed by value.
type IPCMemHandle struct {
	Reserved [64]byte
}

// Lib is a loaded HIP runtime.
type Lib struct {
	Path    string
	Version int // hipRuntimeGetVersion
	// Bound maps each API name to the symbol bound (all of them: HIP has
	// no versioned names te needs).
	Bound map[string]string

	hipRuntimeGetVersion     func(out uintptr) Error
	hipGetDeviceCount        func(out uintptr) Error
	hipSetDevice             func(dev int32) Error
	hipDeviceGetPCIBusId     func(out uintptr, n int32, dev int32) Error
	hipPointerGetAttributes  func(out uintptr, ptr uint64) Error
	hipHostMalloc            func(out uintptr, n uintptr, flags uint32) Error
	hipHostFree              func(p uint64) Error
	hipMalloc                func(out uintptr, n uintptr) Error
	hipFree                  func(p uint64) Error
	hipMemcpy                func(dst, src uint64, n uintptr, kind int32) Error
	hipMemcpyAsync           func(dst, src uint64, n uintptr, kind int32, s uintptr) Error
	hipStreamCreateWithFlags func(out uintptr, flags uint32) Error
	hipStreamSynchronize     func(s uintptr) Error
	hipStreamDestroy         func(s uintptr) Error
	hipIpcGetMemHandle       func(out uintptr, ptr uint64) Error
	hipIpcOpenMemHandle      func(out uintptr, h IPCMemHandle, flags uint32) Error
	hipIpcCloseMemHandle     func(ptr uint64) Error
	hipGetErrorName          func(e Error) string
	hipMemGetAddressRange    func(base, size uintptr, ptr uint64) Error
	hipDeviceGetUuid         func(out uintptr, dev int32) Error
	// hsa_amd_portable_export_dmabuf(ptr, size, int *fd, uint64 *offset);
	// optional.
	hsaExportDmabuf func(ptr uint64, size uintptr, fd, off uintptr) int32

	mu   sync.Mutex // one out-parameter page
	page []byte
}

type symbol struct {
	name     string
	fn       any
	optional bool
}

func (l *Lib) symbols() []symbol {
	return []symbol{
		{"hipRuntimeGetVersion", &l.hipRuntimeGetVersion, false},
		{"hipGetDeviceCount", &l.hipGetDeviceCount, false},
		{"hipSetDevice", &l.hipSetDevice, false},
		{"hipDeviceGetPCIBusId", &l.hipDeviceGetPCIBusId, false},
		{"hipPointerGetAttributes", &l.hipPointerGetAttributes, false},
		{"hipHostMalloc", &l.hipHostMalloc, false},
		{"hipHostFree", &l.hipHostFree, false},
		{"hipMalloc", &l.hipMalloc, false},
		{"hipFree", &l.hipFree, false},
		{"hipMemcpy", &l.hipMemcpy, false},
		{"hipMemcpyAsync", &l.hipMemcpyAsync, false},
		{"hipStreamCreateWithFlags", &l.hipStreamCreateWithFlags, false},
		{"hipStreamSynchronize", &l.hipStreamSynchronize, false},
		{"hipStreamDestroy", &l.hipStreamDestroy, false},
		{"hipIpcGetMemHandle", &l.hipIpcGetMemHandle, false},
		{"hipIpcOpenMemHandle", &l.hipIpcOpenMemHandle, false},
		{"hipIpcCloseMemHandle", &l.hipIpcCloseMemHandle, false},
		{"hipGetErrorName", &l.hipGetErrorName, false},
		{"hipMemGetAddressRange", &l.hipMemGetAddressRange, false},
		{"hipDeviceGetUuid", &l.hipDeviceGetUuid, false},
		{"hsa_amd_portable_export_dmabuf", &l.hsaExportDmabuf, true},
	}
}

// Symbols lists the entry points te binds (the optional ones too).
func Symbols() []string {
	var out []string
	for _, s := range (&Lib{}).symbols() {
		out = append(out, s.name)
	}
	return out
}

// Open loads the HIP runtime at path and binds every symbol te uses; a
// missing library or symbol is NotSupported naming it. It does not touch a
// device.
func Open(path string) (l *Lib, err error) {
	if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
		return nil, errs.New(errs.NotSupported, "hip", "HIP bindings are not checked for %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	h, derr := sigkeep.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if derr != nil {
		return nil, errs.Wrap(errs.NotSupported, "hip", derr, "cannot load %s", path).
			WithHint("install ROCm's HIP runtime (libamdhip64) or set " + EnvLibrary)
	}
	defer func() {
		if p := recover(); p != nil {
			l, err = nil, errs.New(errs.Internal, "hip", "binding %s: %v", path, p)
		}
	}()
	l = &Lib{Path: path, Bound: map[string]string{}}
	var missing []string
	for _, s := range l.symbols() {
		sym, serr := purego.Dlsym(h, s.name)
		if serr != nil || sym == 0 {
			if !s.optional {
				missing = append(missing, s.name)
			}
			continue
		}
		purego.RegisterFunc(s.fn, sym)
		l.Bound[s.name] = s.name
	}
	if len(missing) > 0 {
		return nil, errs.New(errs.NotSupported, "hip", "%s lacks %s", path, strings.Join(missing, ", "))
	}
	if l.page, err = mem.Alloc(4096); err != nil {
		return nil, err
	}
	p := l.out()
	if r := l.hipRuntimeGetVersion(p); r != Success {
		l.done()
		return nil, l.err(r, "hipRuntimeGetVersion", "runtime version")
	}
	l.Version = int(*(*int32)(ptr(p)))
	l.done()
	return l, nil
}

// Major returns the ROCm major version of the runtime (5, 6, ...).
func (l *Lib) Major() int { return l.Version / 10000000 }

func ptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// out locks the out-parameter page (cleared) and returns its address; done
// unlocks it.
func (l *Lib) out() uintptr {
	l.mu.Lock()
	clear(l.page[:512])
	return uintptr(mem.Addr(l.page))
}

func (l *Lib) done() { l.mu.Unlock() }

func (l *Lib) name(r Error) string {
	if l.hipGetErrorName == nil {
		return fmt.Sprintf("hipError %d", r)
	}
	return l.hipGetErrorName(r)
}

func (l *Lib) err(r Error, call, format string, args ...any) error {
	code := errs.Internal
	switch r {
	case ErrNoDevice, ErrNoBinary:
		code = errs.NotSupported
	case ErrInvalidValue:
		code = errs.InvalidArgument
	}
	return errs.New(code, "hip", "%s: %s (%s %d)", fmt.Sprintf(format, args...), call, l.name(r), int32(r))
}

var (
	loadOnce sync.Once
	loaded   *Lib
	loadErr  error
)

// Load opens the runtime once per process (TE_HIP_LIBRARY, else the first
// of Libraries that loads) and checks that it sees a device: without one it
// is NotSupported saying so (a runtime with no AMD GPU, or no /dev/kfd in
// the container).
func Load() (*Lib, error) {
	loadOnce.Do(func() { loaded, loadErr = load() })
	return loaded, loadErr
}

func load() (*Lib, error) {
	paths := Libraries
	if p := os.Getenv(EnvLibrary); p != "" {
		paths = []string{p}
	}
	var l *Lib
	var first error
	for _, p := range paths {
		x, err := Open(p)
		if err == nil {
			l = x
			break
		}
		// A library that loaded but cannot be used says more than one
		// that is missing.
		if first == nil || strings.Contains(first.Error(), "cannot load") && !strings.Contains(err.Error(), "cannot load") {
			first = err
		}
	}
	if l == nil {
		return nil, first
	}
	n, err := l.DeviceCount()
	if err != nil {
		return nil, errs.Wrap(errs.NotSupported, "hip", err, "the HIP runtime %s (ROCm %d) finds no usable AMD GPU", l.Path, l.Major()).
			WithHint("an AMD GPU with the amdgpu driver, and /dev/kfd and /dev/dri passed to the container")
	}
	if n == 0 {
		return nil, errs.New(errs.NotSupported, "hip", "the HIP runtime %s (ROCm %d) sees no AMD GPU", l.Path, l.Major())
	}
	return l, nil
}

// DeviceCount is hipGetDeviceCount.
func (l *Lib) DeviceCount() (int, error) {
	p := l.out()
	defer l.done()
	if r := l.hipGetDeviceCount(p); r != Success {
		return 0, l.err(r, "hipGetDeviceCount", "count devices")
	}
	return int(*(*int32)(ptr(p))), nil
}

// PointerType decodes a hipPointerAttribute_t's memory type under the
// runtime's numbering: device reports device memory.
func PointerType(major int, typ uint32) (device, host bool) {
	if major >= 6 {
		return typ == Rocm6Device, typ == Rocm6Host
	}
	return typ == Rocm5Device, typ == Rocm5Host
}

// PointerDevice asks hipPointerGetAttributes; memory the runtime does not
// know is host memory (ROCm 5 fails the call for it, ROCm 6 answers 0).
func (l *Lib) PointerDevice(p uint64) (int, bool, error) {
	o := l.out()
	defer l.done()
	r := l.hipPointerGetAttributes(o, p)
	if r == ErrInvalidValue {
		return -1, false, nil
	}
	if r != Success {
		return -1, false, l.err(r, "hipPointerGetAttributes", "attributes of %#x", p)
	}
	typ := *(*uint32)(ptr(o + OffPointerType))
	dev := int(*(*int32)(ptr(o + OffPointerDevice)))
	if isDev, _ := PointerType(l.Major(), typ); isDev {
		return dev, true, nil
	}
	return -1, false, nil
}

// onDevice runs fn with dev current on a locked thread (hipSetDevice is per
// thread), then leaves the thread: te does not restore the application's
// device, so it never runs this on a thread it does not own.
func (l *Lib) onDevice(dev int, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := l.hipSetDevice(int32(dev)); r != Success {
		return l.err(r, "hipSetDevice", "device %d", dev)
	}
	return fn()
}

// Malloc is hipMalloc on device dev (tests, and tools).
func (l *Lib) Malloc(dev int, n uint64) (p uint64, err error) {
	err = l.onDevice(dev, func() error {
		o := l.out()
		defer l.done()
		if r := l.hipMalloc(o, uintptr(n)); r != Success {
			return l.err(r, "hipMalloc", "%d bytes", n)
		}
		p = *(*uint64)(ptr(o))
		return nil
	})
	return p, err
}

// Free is hipFree.
func (l *Lib) Free(p uint64) error {
	if r := l.hipFree(p); r != Success {
		return l.err(r, "hipFree", "%#x", p)
	}
	return nil
}

// Memcpy is a synchronous hipMemcpy, direction inferred.
func (l *Lib) Memcpy(dst, src, n uint64) error {
	if r := l.hipMemcpy(dst, src, uintptr(n), memcpyDefault); r != Success {
		return l.err(r, "hipMemcpy", "%d bytes", n)
	}
	return nil
}

// Driver is the HIP runtime as a gpu.Driver.
type Driver struct{ L *Lib }

var _ gpu.Driver = Driver{}

func init() {
	gpu.Register("hip", func() (gpu.Driver, error) {
		l, err := Load()
		if err != nil {
			return nil, err
		}
		return Driver{l}, nil
	})
}

// Kind returns "hip".
func (Driver) Kind() string { return "hip" }

// DeviceCount is hipGetDeviceCount.
func (d Driver) DeviceCount() (int, error) { return d.L.DeviceCount() }

// PointerDevice is hipPointerGetAttributes.
func (d Driver) PointerDevice(p uint64) (int, bool, error) { return d.L.PointerDevice(p) }

// PCIBusID is hipDeviceGetPCIBusId, lower-cased.
func (d Driver) PCIBusID(dev int) (string, error) {
	o := d.L.out()
	defer d.L.done()
	if r := d.L.hipDeviceGetPCIBusId(o, 64, int32(dev)); r != Success {
		return "", d.L.err(r, "hipDeviceGetPCIBusId", "device %d", dev)
	}
	b := mem.Bytes(uint64(o), 64)
	n := 0
	for n < len(b) && b[n] != 0 {
		n++
	}
	return strings.ToLower(string(b[:n])), nil
}

// HostAlloc is hipHostMalloc (portable).
func (d Driver) HostAlloc(n uint64) (uint64, error) {
	o := d.L.out()
	defer d.L.done()
	if r := d.L.hipHostMalloc(o, uintptr(n), hostMallocPortable); r != Success {
		return 0, d.L.err(r, "hipHostMalloc", "%d bytes", n)
	}
	return *(*uint64)(ptr(o)), nil
}

// HostFree is hipHostFree.
func (d Driver) HostFree(p uint64) error {
	if r := d.L.hipHostFree(p); r != Success {
		return d.L.err(r, "hipHostFree", "%#x", p)
	}
	return nil
}

// StreamCreate is hipStreamCreateWithFlags(non-blocking) on dev.
func (d Driver) StreamCreate(dev int) (s gpu.Stream, err error) {
	err = d.L.onDevice(dev, func() error {
		o := d.L.out()
		defer d.L.done()
		if r := d.L.hipStreamCreateWithFlags(o, streamNonBlocking); r != Success {
			return d.L.err(r, "hipStreamCreateWithFlags", "device %d", dev)
		}
		s = gpu.Stream(*(*uintptr)(ptr(o)))
		return nil
	})
	return s, err
}

// StreamDestroy is hipStreamDestroy.
func (d Driver) StreamDestroy(s gpu.Stream) error {
	if r := d.L.hipStreamDestroy(uintptr(s)); r != Success {
		return d.L.err(r, "hipStreamDestroy", "stream")
	}
	return nil
}

// CopyAsync is hipMemcpyAsync, its hipMemcpyKind the direction
// (hipMemcpyHostToDevice 1, DeviceToHost 2, DeviceToDevice 3, Default 4).
func (d Driver) CopyAsync(dst, src, n uint64, dir gpu.Dir, s gpu.Stream) error {
	kind := int32(memcpyDefault)
	switch dir {
	case gpu.HostToDevice:
		kind = 1
	case gpu.DeviceToHost:
		kind = 2
	case gpu.DeviceToDevice:
		kind = 3
	}
	if r := d.L.hipMemcpyAsync(dst, src, uintptr(n), kind, uintptr(s)); r != Success {
		return d.L.err(r, "hipMemcpyAsync", "%d bytes", n)
	}
	return nil
}

// StreamSync is hipStreamSynchronize.
func (d Driver) StreamSync(s gpu.Stream) error {
	if r := d.L.hipStreamSynchronize(uintptr(s)); r != Success {
		return d.L.err(r, "hipStreamSynchronize", "stream")
	}
	return nil
}

// AllocRange is hipMemGetAddressRange.
func (d Driver) AllocRange(dev int, p uint64) (base, size uint64, err error) {
	o := d.L.out()
	defer d.L.done()
	if r := d.L.hipMemGetAddressRange(o, o+8, p); r != Success {
		return 0, 0, d.L.err(r, "hipMemGetAddressRange", "%#x", p)
	}
	return *(*uint64)(ptr(o)), *(*uint64)(ptr(o + 8)), nil
}

// DeviceUUID is hipDeviceGetUuid, in hex.
func (d Driver) DeviceUUID(dev int) (string, error) {
	o := d.L.out()
	defer d.L.done()
	if r := d.L.hipDeviceGetUuid(o, int32(dev)); r != Success {
		return "", d.L.err(r, "hipDeviceGetUuid", "device %d", dev)
	}
	return hex.EncodeToString(mem.Bytes(uint64(o), 16)), nil
}

// IPCExport is hipIpcGetMemHandle.
func (d Driver) IPCExport(dev int, p uint64) (h gpu.IPCHandle, err error) {
	err = d.L.onDevice(dev, func() error {
		o := d.L.out()
		defer d.L.done()
		if r := d.L.hipIpcGetMemHandle(o, p); r != Success {
			return d.L.err(r, "hipIpcGetMemHandle", "%#x", p)
		}
		h = *(*gpu.IPCHandle)(ptr(o))
		return nil
	})
	return h, err
}

// IPCImport is hipIpcOpenMemHandle (lazy peer access) with dev current.
func (d Driver) IPCImport(dev int, h gpu.IPCHandle) (p uint64, err error) {
	err = d.L.onDevice(dev, func() error {
		o := d.L.out()
		defer d.L.done()
		if r := d.L.hipIpcOpenMemHandle(o, IPCMemHandle{Reserved: h}, ipcLazyEnablePeerAccess(d.L.Major())); r != Success {
			return d.L.err(r, "hipIpcOpenMemHandle", "import")
		}
		p = *(*uint64)(ptr(o))
		return nil
	})
	return p, err
}

// IPCClose is hipIpcCloseMemHandle.
func (d Driver) IPCClose(dev int, p uint64) error {
	if r := d.L.hipIpcCloseMemHandle(p); r != Success {
		return d.L.err(r, "hipIpcCloseMemHandle", "%#x", p)
	}
	return nil
}

// DmabufFD is hsa_amd_portable_export_dmabuf where the runtime has it. The
// export starts at the allocation holding ptr; an offset other than 0
// (ptr inside an allocation) is refused, as NICs register from the fd's
// start.
func (d Driver) DmabufFD(dev int, p, size uint64) (int, error) {
	if d.L.hsaExportDmabuf == nil {
		return -1, errs.New(errs.NotSupported, "hip", "%s has no hsa_amd_portable_export_dmabuf (ROCm 5.6 or later)", d.L.Path)
	}
	o := d.L.out()
	defer d.L.done()
	if st := d.L.hsaExportDmabuf(p, uintptr(size), o, o+8); st != 0 {
		return -1, errs.New(errs.NotSupported, "hip", "hsa_amd_portable_export_dmabuf of [%#x,+%d): status %#x", p, size, st)
	}
	fd := int(*(*int32)(ptr(o)))
	if off := *(*uint64)(ptr(o + 8)); off != 0 {
		unix.Close(fd)
		return -1, errs.New(errs.NotSupported, "hip", "dma-buf of %#x starts %d bytes into its allocation", p, off)
	}
	return fd, nil
}
