// Package cufile binds NVIDIA's cuFile library (GPUDirect Storage, GDS),
// loaded at run time with purego like libcuda in internal/sys/cuda, so te
// builds and runs where it is absent: Load then says why. With GDS a file
// read or write moves between NVMe and GPU memory by DMA, without the host
// staging the file transport does otherwise.
//
// Status: the binding loads the library, opens the driver and registers a
// file descriptor; reads and writes are bound but the file transport does
// not route GPU requests to them yet (it stages through pinned host memory).
// Nothing here can be tested on a machine without libcufile and a GDS-capable
// driver and file system; the tests skip cleanly there. The layout of
// CUfileDescr_t (the type field, an 8-byte union holding the fd, the fs_ops
// pointer: 24 bytes on LP64) follows cufile.h, and descrLayoutOK checks it
// against that header when one is installed.
package cufile

import (
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/sigkeep"
)

// DefaultLibrary is the soname Load opens (shipped with the CUDA toolkit's
// GDS package, or nvidia-fs userspace).
const DefaultLibrary = "libcufile.so.0"

// EnvLibrary overrides DefaultLibrary.
const EnvLibrary = "TE_CUFILE_LIBRARY"

// handleTypeOpaqueFD is CU_FILE_HANDLE_TYPE_OPAQUE_FD.
const handleTypeOpaqueFD = 1

// descr is CUfileDescr_t.
type descr struct {
	typ   int32
	_     int32
	fd    int64 // the union: int fd, or a void* handle
	fsOps uintptr
}

// Lib is the opened library.
type Lib struct {
	Path string

	// CUfileError_t is two 32-bit fields returned in one register: the
	// cuFile error (low half) and a CUresult (high half).
	driverOpen       func() uint64
	handleRegister   func(out, d uintptr) uint64
	handleDeregister func(h uintptr)
	read             func(h, buf uintptr, size uintptr, fileOff, bufOff int64) int64
	write            func(h, buf uintptr, size uintptr, fileOff, bufOff int64) int64
}

var (
	once    sync.Once
	lib     *Lib
	loadErr error
)

// Load opens the library and its driver once per process.
func Load() (*Lib, error) {
	once.Do(func() { lib, loadErr = load() })
	return lib, loadErr
}

func load() (*Lib, error) {
	if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
		return nil, errs.New(errs.NotSupported, "cufile", "GPUDirect Storage needs Linux on amd64 or arm64")
	}
	path := DefaultLibrary
	if p := os.Getenv(EnvLibrary); p != "" {
		path = p
	}
	h, err := sigkeep.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, errs.Wrap(errs.NotSupported, "cufile", err, "cannot load %s", path).
			WithHint("GPUDirect Storage needs NVIDIA's GDS package (libcufile) and the nvidia-fs driver")
	}
	l := &Lib{Path: path}
	for _, s := range []struct {
		name string
		fn   any
	}{
		{"cuFileDriverOpen", &l.driverOpen}, {"cuFileHandleRegister", &l.handleRegister},
		{"cuFileHandleDeregister", &l.handleDeregister}, {"cuFileRead", &l.read}, {"cuFileWrite", &l.write},
	} {
		a, err := purego.Dlsym(h, s.name)
		if err != nil {
			return nil, errs.Wrap(errs.NotSupported, "cufile", err, "%s has no %s", path, s.name)
		}
		purego.RegisterFunc(s.fn, a)
	}
	if r := l.driverOpen(); uint32(r) != 0 {
		return nil, errs.New(errs.NotSupported, "cufile", "cuFileDriverOpen failed: cuFile error %d, CUresult %d", uint32(r), uint32(r>>32))
	}
	return l, nil
}

// Handle is a file descriptor registered with cuFile.
type Handle struct {
	l *Lib
	h uintptr
}

// Register registers fd (opened with O_DIRECT on a file system GDS serves).
func (l *Lib) Register(fd int) (*Handle, error) {
	d := &descr{typ: handleTypeOpaqueFD, fd: int64(fd)}
	var h uintptr
	if r := l.handleRegister(uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(d))); uint32(r) != 0 {
		return nil, errs.New(errs.NotSupported, "cufile", "cuFileHandleRegister(fd %d): cuFile error %d, CUresult %d", fd, uint32(r), uint32(r>>32))
	}
	runtime.KeepAlive(d)
	return &Handle{l: l, h: h}, nil
}

// Read reads n bytes at file offset off into device memory dev; it returns
// the bytes read.
func (h *Handle) Read(dev uint64, n uint64, off int64) (int64, error) {
	k := h.l.read(h.h, uintptr(dev), uintptr(n), off, 0)
	if k < 0 {
		return 0, errs.New(errs.IO, "cufile", "cuFileRead: %d", k)
	}
	return k, nil
}

// Write writes n bytes of device memory dev at file offset off.
func (h *Handle) Write(dev uint64, n uint64, off int64) (int64, error) {
	k := h.l.write(h.h, uintptr(dev), uintptr(n), off, 0)
	if k < 0 {
		return 0, errs.New(errs.IO, "cufile", "cuFileWrite: %d", k)
	}
	return k, nil
}

// Close deregisters the handle.
func (h *Handle) Close() { h.l.handleDeregister(h.h) }
