package cuda

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/sys/sigkeep"
)

// DefaultLibrary is the soname Load opens: the driver library, installed with
// the NVIDIA driver (not with the CUDA toolkit).
const DefaultLibrary = "libcuda.so.1"

// EnvLibrary names the environment variable that overrides DefaultLibrary.
const EnvLibrary = "TE_CUDA_LIBRARY"

// Lib is an opened driver library. It is never closed: the driver keeps
// process-wide state (contexts, mappings) that must outlive every user.
type Lib struct {
	Path string

	cuInit                 func(flags uint32) Result
	cuDriverGetVersion     func(out uintptr) Result
	cuDeviceGetCount       func(out uintptr) Result
	cuDeviceGet            func(out uintptr, ordinal int32) Result
	cuDeviceGetUuid        func(out uintptr, dev int32) Result // optional
	cuDevicePrimaryRetain  func(out uintptr, dev int32) Result
	cuDevicePrimaryRelease func(dev int32) Result
	cuCtxGetCurrent        func(out uintptr) Result
	cuCtxSetCurrent        func(ctx uintptr) Result
	cuPointerGetAttribute  func(out uintptr, attr uint32, ptr uint64) Result
	cuPointerGetAttributes func(n uint32, attrs, data uintptr, ptr uint64) Result
	cuMemGetAddressRange   func(base, size uintptr, ptr uint64) Result
	cuMemAlloc             func(out uintptr, n uintptr) Result
	cuMemFree              func(ptr uint64) Result
	cuMemHostAlloc         func(out uintptr, n uintptr, flags uint32) Result
	cuMemFreeHost          func(p uintptr) Result
	cuMemcpy               func(dst, src uint64, n uintptr) Result
	cuMemcpyHtoD           func(dst uint64, src uintptr, n uintptr) Result
	cuMemcpyDtoH           func(dst uintptr, src uint64, n uintptr) Result
	cuMemcpyDtoD           func(dst, src uint64, n uintptr) Result
	cuMemcpyAsync          func(dst, src uint64, n uintptr, s uintptr) Result
	cuMemcpyHtoDAsync      func(dst uint64, src uintptr, n uintptr, s uintptr) Result
	cuMemcpyDtoHAsync      func(dst uintptr, src uint64, n uintptr, s uintptr) Result
	cuMemcpyDtoDAsync      func(dst, src uint64, n uintptr, s uintptr) Result
	cuStreamCreate         func(out uintptr, flags uint32) Result
	cuStreamSynchronize    func(s uintptr) Result
	cuStreamDestroy        func(s uintptr) Result
	cuEventCreate          func(out uintptr, flags uint32) Result
	cuEventRecord          func(e, s uintptr) Result
	cuEventSynchronize     func(e uintptr) Result
	cuEventDestroy         func(e uintptr) Result
	cuIpcGetMemHandle      func(out uintptr, ptr uint64) Result
	cuIpcOpenMemHandle     func(out uintptr, h IPCMemHandle, flags uint32) Result
	cuIpcCloseMemHandle    func(ptr uint64) Result
	cuGetErrorName         func(r uint32, out uintptr) Result           // optional
	cuDeviceGetPCIBusId    func(out uintptr, n int32, dev int32) Result // optional
	// cuMemGetHandleForAddressRange (CUDA 11.7) exports device memory as a
	// dma-buf; optional.
	cuMemGetHandleForAddressRange func(out uintptr, ptr uint64, size uintptr, typ uint32, flags uint64) Result
	// Virtual memory management (CUDA 10.2) and fabric handles (CUDA
	// 12.3): optional, for multi-node NVLink (vmm.go).
	cuDeviceGetAttribute                   func(out uintptr, attr int32, dev int32) Result
	cuMemCreate                            func(out uintptr, size uintptr, prop uintptr, flags uint64) Result
	cuMemRelease                           func(h uint64) Result
	cuMemRetainAllocationHandle            func(out uintptr, addr uint64) Result
	cuMemGetAllocationPropertiesFromHandle func(out uintptr, h uint64) Result
	cuMemExportToShareableHandle           func(out uintptr, h uint64, typ uint32, flags uint64) Result
	cuMemImportFromShareableHandle         func(out uintptr, in uintptr, typ uint32) Result
	cuMemAddressReserve                    func(out uintptr, size, align uintptr, addr uint64, flags uint64) Result
	cuMemAddressFree                       func(ptr uint64, size uintptr) Result
	cuMemMap                               func(ptr uint64, size, off uintptr, h uint64, flags uint64) Result
	cuMemUnmap                             func(ptr uint64, size uintptr) Result
	cuMemSetAccess                         func(ptr uint64, size uintptr, desc uintptr, count uintptr) Result

	// Bound maps each C API name to the symbol actually bound, for tests and
	// diagnostics.
	Bound map[string]string

	slots chan uintptr // out-parameter slots in mmap memory
	arena []byte
}

// slotSize bounds one call's out-parameters (an IPC handle is the largest).
const slotSize = 256

const numSlots = 128

// Supported reports whether this platform can call the driver through purego
// with the layouts in this package (LP64 Linux on amd64 or arm64).
func Supported() bool {
	return runtime.GOOS == "linux" && (runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64")
}

var (
	loadOnce sync.Once
	loaded   *Lib
	loadErr  error
)

// Load opens the driver once per process (TE_CUDA_LIBRARY or DefaultLibrary)
// and initialises it with cuInit. It returns a NotSupported error that says
// why CUDA cannot be used: the library is missing, lacks a symbol, or the
// driver found no device.
func Load() (*Lib, error) {
	loadOnce.Do(func() {
		path := os.Getenv(EnvLibrary)
		if path == "" {
			path = DefaultLibrary
		}
		l, err := Open(path)
		if err == nil {
			err = l.Init()
		}
		if err != nil {
			loadErr = err
			return
		}
		loaded = l
	})
	return loaded, loadErr
}

// Available returns nil when Load succeeds, else why CUDA cannot be used.
func Available() error {
	_, err := Load()
	return err
}

// symbol is one entry point: the names tried in order (the versioned name
// cuda.h maps to first), and whether te works without it.
type symbol struct {
	api      string // the name a C program writes (cuda.h may map it)
	fn       any
	names    []string
	optional bool
}

func (l *Lib) symbols() []symbol {
	return []symbol{
		{"cuInit", &l.cuInit, []string{"cuInit"}, false},
		{"cuDriverGetVersion", &l.cuDriverGetVersion, []string{"cuDriverGetVersion"}, false},
		{"cuDeviceGetCount", &l.cuDeviceGetCount, []string{"cuDeviceGetCount"}, false},
		{"cuDeviceGet", &l.cuDeviceGet, []string{"cuDeviceGet"}, false},
		// cuDeviceGetUuid_v2 (CUDA 11.4) and cuDeviceGetUuid share a
		// signature; v2 also reports MIG instances' own UUIDs.
		{"cuDeviceGetUuid", &l.cuDeviceGetUuid, []string{"cuDeviceGetUuid_v2", "cuDeviceGetUuid"}, true},
		{"cuDevicePrimaryCtxRetain", &l.cuDevicePrimaryRetain, []string{"cuDevicePrimaryCtxRetain"}, false},
		// cuda.h: #define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
		// (CUDA 11); the older symbol has the same signature.
		{"cuDevicePrimaryCtxRelease", &l.cuDevicePrimaryRelease, []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}, false},
		{"cuCtxGetCurrent", &l.cuCtxGetCurrent, []string{"cuCtxGetCurrent"}, false},
		{"cuCtxSetCurrent", &l.cuCtxSetCurrent, []string{"cuCtxSetCurrent"}, false},
		{"cuPointerGetAttribute", &l.cuPointerGetAttribute, []string{"cuPointerGetAttribute"}, false},
		{"cuPointerGetAttributes", &l.cuPointerGetAttributes, []string{"cuPointerGetAttributes"}, false},
		{"cuMemGetAddressRange", &l.cuMemGetAddressRange, []string{"cuMemGetAddressRange_v2"}, false},
		{"cuMemAlloc", &l.cuMemAlloc, []string{"cuMemAlloc_v2"}, false},
		{"cuMemFree", &l.cuMemFree, []string{"cuMemFree_v2"}, false},
		{"cuMemHostAlloc", &l.cuMemHostAlloc, []string{"cuMemHostAlloc"}, false},
		{"cuMemFreeHost", &l.cuMemFreeHost, []string{"cuMemFreeHost"}, false},
		{"cuMemcpy", &l.cuMemcpy, []string{"cuMemcpy"}, false},
		{"cuMemcpyHtoD", &l.cuMemcpyHtoD, []string{"cuMemcpyHtoD_v2"}, false},
		{"cuMemcpyDtoH", &l.cuMemcpyDtoH, []string{"cuMemcpyDtoH_v2"}, false},
		{"cuMemcpyDtoD", &l.cuMemcpyDtoD, []string{"cuMemcpyDtoD_v2"}, false},
		{"cuMemcpyAsync", &l.cuMemcpyAsync, []string{"cuMemcpyAsync"}, false},
		{"cuMemcpyHtoDAsync", &l.cuMemcpyHtoDAsync, []string{"cuMemcpyHtoDAsync_v2"}, false},
		{"cuMemcpyDtoHAsync", &l.cuMemcpyDtoHAsync, []string{"cuMemcpyDtoHAsync_v2"}, false},
		{"cuMemcpyDtoDAsync", &l.cuMemcpyDtoDAsync, []string{"cuMemcpyDtoDAsync_v2"}, false},
		{"cuStreamCreate", &l.cuStreamCreate, []string{"cuStreamCreate"}, false},
		{"cuStreamSynchronize", &l.cuStreamSynchronize, []string{"cuStreamSynchronize"}, false},
		{"cuStreamDestroy", &l.cuStreamDestroy, []string{"cuStreamDestroy_v2"}, false},
		{"cuEventCreate", &l.cuEventCreate, []string{"cuEventCreate"}, false},
		{"cuEventRecord", &l.cuEventRecord, []string{"cuEventRecord"}, false},
		{"cuEventSynchronize", &l.cuEventSynchronize, []string{"cuEventSynchronize"}, false},
		{"cuEventDestroy", &l.cuEventDestroy, []string{"cuEventDestroy_v2"}, false},
		{"cuIpcGetMemHandle", &l.cuIpcGetMemHandle, []string{"cuIpcGetMemHandle"}, false},
		// cuda.h: #define cuIpcOpenMemHandle cuIpcOpenMemHandle_v2 (CUDA 11);
		// the old symbol takes the same arguments.
		{"cuIpcOpenMemHandle", &l.cuIpcOpenMemHandle, []string{"cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"}, false},
		{"cuIpcCloseMemHandle", &l.cuIpcCloseMemHandle, []string{"cuIpcCloseMemHandle"}, false},
		{"cuGetErrorName", &l.cuGetErrorName, []string{"cuGetErrorName"}, true},
		{"cuDeviceGetPCIBusId", &l.cuDeviceGetPCIBusId, []string{"cuDeviceGetPCIBusId"}, true},
		{"cuMemGetHandleForAddressRange", &l.cuMemGetHandleForAddressRange, []string{"cuMemGetHandleForAddressRange"}, true},
		{"cuDeviceGetAttribute", &l.cuDeviceGetAttribute, []string{"cuDeviceGetAttribute"}, true},
		{"cuMemCreate", &l.cuMemCreate, []string{"cuMemCreate"}, true},
		{"cuMemRelease", &l.cuMemRelease, []string{"cuMemRelease"}, true},
		{"cuMemRetainAllocationHandle", &l.cuMemRetainAllocationHandle, []string{"cuMemRetainAllocationHandle"}, true},
		{"cuMemGetAllocationPropertiesFromHandle", &l.cuMemGetAllocationPropertiesFromHandle, []string{"cuMemGetAllocationPropertiesFromHandle"}, true},
		{"cuMemExportToShareableHandle", &l.cuMemExportToShareableHandle, []string{"cuMemExportToShareableHandle"}, true},
		{"cuMemImportFromShareableHandle", &l.cuMemImportFromShareableHandle, []string{"cuMemImportFromShareableHandle"}, true},
		{"cuMemAddressReserve", &l.cuMemAddressReserve, []string{"cuMemAddressReserve"}, true},
		{"cuMemAddressFree", &l.cuMemAddressFree, []string{"cuMemAddressFree"}, true},
		{"cuMemMap", &l.cuMemMap, []string{"cuMemMap"}, true},
		{"cuMemUnmap", &l.cuMemUnmap, []string{"cuMemUnmap"}, true},
		{"cuMemSetAccess", &l.cuMemSetAccess, []string{"cuMemSetAccess"}, true},
	}
}

// Open loads the library at path and binds every entry point te uses. A
// missing library or symbol is a NotSupported error naming it. Open does not
// call cuInit (see Init).
func Open(path string) (l *Lib, err error) {
	if !Supported() {
		return nil, errs.New(errs.NotSupported, "cuda", "driver bindings are not checked for %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	h, derr := sigkeep.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if derr != nil {
		return nil, errs.Wrap(errs.NotSupported, "cuda", derr, "cannot load %s", path).
			WithHint("install the NVIDIA driver (it ships libcuda.so.1) or set " + EnvLibrary)
	}
	defer func() {
		// purego panics on a function type it cannot call; that is a bug in
		// this package, reported as an error rather than a crash.
		if p := recover(); p != nil {
			l, err = nil, errs.New(errs.Internal, "cuda", "binding %s: %v", path, p)
		}
	}()
	l = &Lib{Path: path, Bound: map[string]string{}}
	var missing []string
	for _, s := range l.symbols() {
		bound := false
		for _, n := range s.names {
			a, err := purego.Dlsym(h, n)
			if err != nil || a == 0 {
				continue
			}
			purego.RegisterFunc(s.fn, a)
			l.Bound[s.api] = n
			bound = true
			break
		}
		if !bound && !s.optional {
			missing = append(missing, s.names[0])
		}
	}
	if len(missing) > 0 {
		return nil, errs.New(errs.NotSupported, "cuda", "%s lacks %s", path, strings.Join(missing, ", ")).
			WithHint("a driver for CUDA 11.0 or newer is needed")
	}
	arena, aerr := mem.Alloc(slotSize * numSlots)
	if aerr != nil {
		return nil, aerr
	}
	l.arena = arena
	l.slots = make(chan uintptr, numSlots)
	base := uintptr(mem.Addr(arena))
	for i := 0; i < numSlots; i++ {
		l.slots <- base + uintptr(i*slotSize)
	}
	return l, nil
}

// Init calls cuInit(0). No device, a stub library or a driver older than the
// library is NotSupported: te then runs without CUDA.
func (l *Lib) Init() error {
	if r := l.cuInit(0); r != Success {
		return l.err(r, "cuInit", "initialise the driver from %s", l.Path)
	}
	return nil
}

// slot takes an out-parameter slot (zeroed); put returns it.
func (l *Lib) slot() uintptr { return <-l.slots }

func (l *Lib) put(s uintptr) {
	clear(unsafe.Slice((*byte)(cptr(s)), slotSize))
	l.slots <- s
}

// cptr turns the address of C memory into an unsafe.Pointer (as package mem
// does): the memory is not a Go object, so there is nothing for the garbage
// collector to track.
func cptr(addr uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&addr)) }

func load[T any](addr uintptr) T { return *(*T)(cptr(addr)) }

// Name returns the CUresult's name (CUDA_ERROR_...).
func (r Result) Name() string {
	if s, ok := resultNames[r]; ok {
		return s
	}
	return fmt.Sprintf("CUresult(%d)", uint32(r))
}

// Code maps a CUresult to the te error code that says what a caller can do.
func (r Result) Code() errs.Code {
	switch r {
	case Success:
		return errs.OK
	case ErrInvalidValue, ErrInvalidHandle, ErrInvalidDevice, ErrIllegalAddress:
		return errs.InvalidArgument
	case ErrOutOfMemory:
		return errs.NoMemory
	case ErrNoDevice, ErrStubLibrary, ErrInsufficientDrv, ErrNotSupported, ErrPeerAccessUnsupp, ErrNotInitialized, ErrDeinitialized:
		return errs.NotSupported
	case ErrNotPermitted:
		return errs.AccessDenied
	case ErrNotFound:
		return errs.NotFound
	}
	return errs.Internal
}

// ResultError is the cause inside te errors from the driver: the call and the
// CUresult it returned.
type ResultError struct {
	Call   string
	Result Result
}

func (e *ResultError) Error() string { return e.Call + ": " + e.Result.Name() }

// err builds the te error for a failed call.
func (l *Lib) err(r Result, call, format string, args ...any) error {
	e := errs.Wrap(r.Code(), "cuda", &ResultError{Call: call, Result: r}, format, args...)
	switch r {
	case ErrNoDevice:
		e = e.WithHint("no GPU is visible to this process (check CUDA_VISIBLE_DEVICES and the driver)")
	case ErrStubLibrary:
		e = e.WithHint(l.Path + " is the toolkit's stub, not the driver")
	case ErrInsufficientDrv:
		e = e.WithHint("the NVIDIA driver is older than this CUDA library")
	}
	return e
}

// ResultOf returns the CUresult inside err, and whether there was one.
func ResultOf(err error) (Result, bool) {
	for err != nil {
		if re, ok := err.(*ResultError); ok {
			return re.Result, true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return 0, false
		}
		err = u.Unwrap()
	}
	return 0, false
}

// Symbols maps each C API name te uses to the symbols Open tries, in order.
func Symbols() map[string][]string {
	m := map[string][]string{}
	for _, s := range (&Lib{}).symbols() {
		m[s.api] = append([]string(nil), s.names...)
	}
	return m
}
