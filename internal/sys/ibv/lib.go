package ibv

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"syscall"

	"github.com/ebitengine/purego"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/sigkeep"
)

// DefaultLibrary is the soname Load opens; the environment variable
// TE_IBV_LIBRARY names another file (a test build of rdma-core, say).
const DefaultLibrary = "libibverbs.so.1"

// Lib is an opened libibverbs. It is never closed: rdma-core keeps global
// state (the provider list, fork protection) that must outlive every context.
type Lib struct {
	Path string

	// Entry points that report failure by returning NULL and setting errno
	// are called with purego.SyscallN, which returns errno.
	getDeviceList     uintptr
	openDevice        uintptr
	allocPD           uintptr
	regMR             uintptr
	regMRIova2        uintptr // IBVERBS_1.8; 0 when absent
	regDmabufMR       uintptr // IBVERBS_1.12; 0 when absent
	createCompChannel uintptr
	createCQ          uintptr
	createQP          uintptr
	getCQEvent        uintptr
	errnoLocation     uintptr // libc's __errno_location

	// Entry points that return their error code are bound as Go functions.
	freeDeviceList     func(list uintptr)
	getDeviceName      func(dev uintptr) string
	closeDevice        func(ctx uintptr) int32
	queryDevice        func(ctx, attr uintptr) int32
	queryPortCompat    func(ctx uintptr, port uint8, attr uintptr) int32
	queryGID           func(ctx uintptr, port uint8, index int32, gid uintptr) int32
	deallocPD          func(pd uintptr) int32
	deregMR            func(mr uintptr) int32
	destroyCompChannel func(ch uintptr) int32
	destroyCQ          func(cq uintptr) int32
	ackCQEvents        func(cq uintptr, n uint32)
	modifyQP           func(qp, attr uintptr, mask int32) int32
	destroyQP          func(qp uintptr) int32
}

// Supported reports whether this platform's struct layouts were checked
// against rdma-core (LP64 Linux on amd64 or arm64).
func Supported() bool {
	return runtime.GOOS == "linux" && (runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64")
}

var (
	loadOnce sync.Once
	loaded   *Lib
	loadErr  error
)

// Load opens libibverbs once per process (TE_IBV_LIBRARY or DefaultLibrary)
// and returns it, or a NotSupported error that says why it cannot be used.
func Load() (*Lib, error) {
	loadOnce.Do(func() {
		path := os.Getenv("TE_IBV_LIBRARY")
		if path == "" {
			path = DefaultLibrary
		}
		loaded, loadErr = Open(path)
	})
	return loaded, loadErr
}

// Open loads the library at path and resolves every entry point te uses. A
// missing library or symbol is a NotSupported error naming it.
func Open(path string) (*Lib, error) {
	if !Supported() {
		return nil, errs.New(errs.NotSupported, "ibv", "verbs layouts are not checked for %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	h, err := sigkeep.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, errs.Wrap(errs.NotSupported, "ibv", err, "cannot load %s", path).
			WithHint("install rdma-core's libibverbs1 (Debian: apt-get install libibverbs1 ibverbs-providers)")
	}
	l := &Lib{Path: path}
	var missing []string
	sym := func(name string, optional bool) uintptr {
		a, err := purego.Dlsym(h, name)
		if err != nil || a == 0 {
			if !optional {
				missing = append(missing, name)
			}
			return 0
		}
		return a
	}
	bind := func(fptr any, name string) {
		if a := sym(name, false); a != 0 {
			purego.RegisterFunc(fptr, a)
		}
	}
	l.getDeviceList = sym("ibv_get_device_list", false)
	l.openDevice = sym("ibv_open_device", false)
	l.allocPD = sym("ibv_alloc_pd", false)
	l.regMR = sym("ibv_reg_mr", false)
	l.regMRIova2 = sym("ibv_reg_mr_iova2", true)
	l.regDmabufMR = sym("ibv_reg_dmabuf_mr", true)
	l.createCompChannel = sym("ibv_create_comp_channel", false)
	l.createCQ = sym("ibv_create_cq", false)
	l.createQP = sym("ibv_create_qp", false)
	l.getCQEvent = sym("ibv_get_cq_event", false)
	l.errnoLocation = sym("__errno_location", false)
	bind(&l.freeDeviceList, "ibv_free_device_list")
	bind(&l.getDeviceName, "ibv_get_device_name")
	bind(&l.closeDevice, "ibv_close_device")
	bind(&l.queryDevice, "ibv_query_device")
	bind(&l.queryPortCompat, "ibv_query_port")
	bind(&l.queryGID, "ibv_query_gid")
	bind(&l.deallocPD, "ibv_dealloc_pd")
	bind(&l.deregMR, "ibv_dereg_mr")
	bind(&l.destroyCompChannel, "ibv_destroy_comp_channel")
	bind(&l.destroyCQ, "ibv_destroy_cq")
	bind(&l.ackCQEvents, "ibv_ack_cq_events")
	bind(&l.modifyQP, "ibv_modify_qp")
	bind(&l.destroyQP, "ibv_destroy_qp")
	if len(missing) > 0 {
		return nil, errs.New(errs.NotSupported, "ibv", "%s lacks %v", path, missing).
			WithHint("rdma-core 28 or newer is needed")
	}
	return l, nil
}

// call calls fn and returns its result with the errno it left. purego does
// not capture errno on every platform, so the thread is locked for the call
// and errno is read through libc's __errno_location on the same thread.
func (l *Lib) call(fn uintptr, args ...uintptr) (uintptr, syscall.Errno) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	loc, _, _ := purego.SyscallN(l.errnoLocation)
	*at[int32](loc) = 0
	r, _, _ := purego.SyscallN(fn, args...)
	return r, syscall.Errno(*at[int32](loc))
}

// errnoError turns an errno from libibverbs into a te error with the code
// that says what the caller can do about it.
func errnoError(op string, e syscall.Errno, format string, args ...any) error {
	if e == 0 {
		// A provider that failed without setting errno.
		e = syscall.EIO
	}
	code := errs.Internal
	var hint string
	switch {
	case errors.Is(e, syscall.ENOMEM):
		code = errs.NoMemory
		hint = "raise RLIMIT_MEMLOCK (ulimit -l unlimited) if registering memory"
	case errors.Is(e, syscall.EINVAL):
		code = errs.InvalidArgument
	case errors.Is(e, syscall.EPERM), errors.Is(e, syscall.EACCES):
		code = errs.AccessDenied
	case errors.Is(e, syscall.EOPNOTSUPP), errors.Is(e, syscall.ENOSYS), errors.Is(e, syscall.EPROTONOSUPPORT):
		code = errs.NotSupported
	case errors.Is(e, syscall.EAGAIN), errors.Is(e, syscall.ENOSPC):
		code = errs.NoMemory
	}
	err := errs.Wrap(code, op, e, format, args...)
	if hint != "" {
		err = err.WithHint(hint)
	}
	return err
}
