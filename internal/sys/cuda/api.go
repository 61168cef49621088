package cuda

import (
	"runtime"
	"strings"

	"github.com/tecache/te/internal/errs"
)

// Device is a CUdevice.
type Device int32

// Context is a CUcontext (0 is none).
type Context uintptr

// Stream is a CUstream (0 is the legacy default stream).
type Stream uintptr

// Event is a CUevent.
type Event uintptr

// DriverVersion returns the driver's CUDA version (e.g. 12040 for 12.4).
func (l *Lib) DriverVersion() (int, error) {
	s := l.slot()
	defer l.put(s)
	if r := l.cuDriverGetVersion(s); r != Success {
		return 0, l.err(r, "cuDriverGetVersion", "driver version")
	}
	return int(load[int32](s)), nil
}

// DeviceCount returns the number of visible devices.
func (l *Lib) DeviceCount() (int, error) {
	s := l.slot()
	defer l.put(s)
	if r := l.cuDeviceGetCount(s); r != Success {
		return 0, l.err(r, "cuDeviceGetCount", "count devices")
	}
	return int(load[int32](s)), nil
}

// DeviceGet returns the device with the given ordinal.
func (l *Lib) DeviceGet(ordinal int) (Device, error) {
	if ordinal < 0 || ordinal >= 1<<16 {
		return 0, errs.New(errs.InvalidArgument, "cuda", "device ordinal %d", ordinal)
	}
	s := l.slot()
	defer l.put(s)
	if r := l.cuDeviceGet(s, int32(ordinal)); r != Success {
		return 0, l.err(r, "cuDeviceGet", "device %d", ordinal)
	}
	return Device(load[int32](s)), nil
}

// DeviceUUID returns the device's UUID, the same in every process whatever
// CUDA_VISIBLE_DEVICES says; NotSupported when the driver lacks the call.
func (l *Lib) DeviceUUID(d Device) (UUID, error) {
	if l.cuDeviceGetUuid == nil {
		return UUID{}, errs.New(errs.NotSupported, "cuda", "%s has no cuDeviceGetUuid", l.Path)
	}
	s := l.slot()
	defer l.put(s)
	if r := l.cuDeviceGetUuid(s, int32(d)); r != Success {
		return UUID{}, l.err(r, "cuDeviceGetUuid", "uuid of device %d", d)
	}
	return load[UUID](s), nil
}

// DevicePCIBusID returns the device's PCI address as sysfs names it: lower
// case with a four-digit domain ("0000:1a:00.0"), from cuDeviceGetPCIBusId
// (which writes "0000:1A:00.0", or an eight-digit domain on some drivers).
func (l *Lib) DevicePCIBusID(d Device) (string, error) {
	if l.cuDeviceGetPCIBusId == nil {
		return "", errs.New(errs.NotSupported, "cuda", "%s has no cuDeviceGetPCIBusId", l.Path)
	}
	s := l.slot()
	defer l.put(s)
	if r := l.cuDeviceGetPCIBusId(s, 64, int32(d)); r != Success {
		return "", l.err(r, "cuDeviceGetPCIBusId", "PCI address of device %d", d)
	}
	return NormalizeBusID(cstring(s, 64)), nil
}

// NormalizeBusID writes a PCI address as sysfs does: lower case, the domain
// as four hex digits ("00000000:1A:00.0" -> "0000:1a:00.0").
func NormalizeBusID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	dom, rest, ok := strings.Cut(id, ":")
	if !ok || !strings.Contains(rest, ":") {
		return id
	}
	if len(dom) > 4 {
		dom = dom[len(dom)-4:]
	}
	for len(dom) < 4 {
		dom = "0" + dom
	}
	return dom + ":" + rest
}

// MemRangeHandleDmabufFD is CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD (cuda.h of
// CUDA 11.7 and later).
const MemRangeHandleDmabufFD = 1

// DmabufFD exports [ptr, ptr+size) of device memory as a dma-buf file
// descriptor (cuMemGetHandleForAddressRange), which a NIC registers with
// ibv_reg_dmabuf_mr; ptr and size must be aligned to the host page size.
// The caller closes the fd. NotSupported when the driver cannot (before
// CUDA 11.7 / driver 515, or without kernel support).
func (l *Lib) DmabufFD(ptr, size uint64) (int, error) {
	if l.cuMemGetHandleForAddressRange == nil {
		return -1, errs.New(errs.NotSupported, "cuda", "%s has no cuMemGetHandleForAddressRange", l.Path).
			WithHint("dma-buf export needs CUDA 11.7 and driver 515 or newer")
	}
	s := l.slot()
	defer l.put(s)
	if r := l.cuMemGetHandleForAddressRange(s, ptr, uintptr(size), MemRangeHandleDmabufFD, 0); r != Success {
		return -1, l.err(r, "cuMemGetHandleForAddressRange", "dma-buf of [%#x,+%d)", ptr, size)
	}
	return int(load[int32](s)), nil
}

// PrimaryCtxRetain retains the device's primary context, the one the CUDA
// runtime (and so PyTorch) uses; release it with PrimaryCtxRelease.
func (l *Lib) PrimaryCtxRetain(d Device) (Context, error) {
	s := l.slot()
	defer l.put(s)
	if r := l.cuDevicePrimaryRetain(s, int32(d)); r != Success {
		return 0, l.err(r, "cuDevicePrimaryCtxRetain", "primary context of device %d", d)
	}
	return Context(load[uintptr](s)), nil
}

// PrimaryCtxRelease releases a reference taken by PrimaryCtxRetain.
func (l *Lib) PrimaryCtxRelease(d Device) error {
	if r := l.cuDevicePrimaryRelease(int32(d)); r != Success {
		return l.err(r, "cuDevicePrimaryCtxRelease", "device %d", d)
	}
	return nil
}

// CtxGetCurrent returns the calling thread's current context (0 if none).
// Call it with the goroutine locked to its thread (see With).
func (l *Lib) CtxGetCurrent() (Context, error) {
	s := l.slot()
	defer l.put(s)
	if r := l.cuCtxGetCurrent(s); r != Success {
		return 0, l.err(r, "cuCtxGetCurrent", "current context")
	}
	return Context(load[uintptr](s)), nil
}

// CtxSetCurrent makes c current on the calling thread. Call it with the
// goroutine locked to its thread (see With).
func (l *Lib) CtxSetCurrent(c Context) error {
	if r := l.cuCtxSetCurrent(uintptr(c)); r != Success {
		return l.err(r, "cuCtxSetCurrent", "context %#x", uintptr(c))
	}
	return nil
}

// With runs fn on one OS thread with c current, and restores the thread's
// previous context afterwards: the thread may belong to the application that
// loaded te, and its context is not ours to change.
func (l *Lib) With(c Context, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prev, err := l.CtxGetCurrent()
	if err != nil {
		return err
	}
	if prev != c {
		if err := l.CtxSetCurrent(c); err != nil {
			return err
		}
		defer l.CtxSetCurrent(prev)
	}
	return fn()
}

// PointerInfo is what the driver knows about an address.
type PointerInfo struct {
	Type    MemoryType // MemoryUnknown when the driver does not know it
	Device  int        // device ordinal (meaningful for device memory)
	Context Context
}

// PointerInfo asks the driver about ptr with cuPointerGetAttributes, which,
// unlike cuPointerGetAttribute, succeeds for memory the driver does not know
// and reports it as MemoryUnknown.
func (l *Lib) PointerInfo(ptr uint64) (PointerInfo, error) {
	s := l.slot()
	defer l.put(s)
	// Slot layout: attrs[3] u32 at 0, data[3] pointers at 16, values at 48
	// (context, 8 bytes), 56 (memory type, u32) and 64 (ordinal, i32).
	attrs := (*[3]uint32)(cptr(s))
	attrs[0], attrs[1], attrs[2] = uint32(AttrContext), uint32(AttrMemoryType), uint32(AttrDeviceOrdinal)
	data := (*[3]uintptr)(cptr(s + 16))
	data[0], data[1], data[2] = s+48, s+56, s+64
	*(*int32)(cptr(s + 64)) = -1
	r := l.cuPointerGetAttributes(3, s, s+16, ptr)
	if r == ErrInvalidContext {
		// Pointer queries are meant to work without a context; should a
		// driver want one, ask again under device 0's primary context.
		r = l.withPrimary(func() Result { return l.cuPointerGetAttributes(3, s, s+16, ptr) })
	}
	if r != Success {
		return PointerInfo{}, l.err(r, "cuPointerGetAttributes", "attributes of %#x", ptr)
	}
	return PointerInfo{
		Context: Context(load[uintptr](s + 48)),
		Type:    MemoryType(load[uint32](s + 56)),
		Device:  int(load[int32](s + 64)),
	}, nil
}

// withPrimary runs fn with device 0's primary context current.
func (l *Lib) withPrimary(fn func() Result) Result {
	d, err := l.DeviceGet(0)
	if err != nil {
		return ErrInvalidContext
	}
	ctx, err := l.PrimaryCtxRetain(d)
	if err != nil {
		return ErrInvalidContext
	}
	defer l.PrimaryCtxRelease(d)
	r := ErrInvalidContext
	l.With(ctx, func() error { r = fn(); return nil })
	return r
}

// PointerAttribute returns one attribute of ptr with cuPointerGetAttribute;
// the value is widened to 64 bits (attributes are 4 or 8 bytes, little end
// first).
func (l *Lib) PointerAttribute(a PointerAttribute, ptr uint64) (uint64, error) {
	s := l.slot()
	defer l.put(s)
	if r := l.cuPointerGetAttribute(s, uint32(a), ptr); r != Success {
		return 0, l.err(r, "cuPointerGetAttribute", "attribute %d of %#x", a, ptr)
	}
	v := load[uint64](s)
	switch a {
	case AttrMemoryType, AttrDeviceOrdinal, AttrIsManaged, AttrIsLegacyIPC, AttrMapped, AttrGPUDirectRDMACap, AttrAllowedHandles:
		v = uint64(uint32(v)) // 4-byte attributes: the slot's high half is zero anyway
	}
	return v, nil
}

// MemGetAddressRange returns the allocation that holds ptr: its base and
// size. It needs ptr's context current (see With).
func (l *Lib) MemGetAddressRange(ptr uint64) (base, size uint64, err error) {
	s := l.slot()
	defer l.put(s)
	if r := l.cuMemGetAddressRange(s, s+8, ptr); r != Success {
		return 0, 0, l.err(r, "cuMemGetAddressRange", "allocation holding %#x", ptr)
	}
	return load[uint64](s), uint64(load[uintptr](s + 8)), nil
}

// MemAlloc allocates n bytes of device memory in the current context.
func (l *Lib) MemAlloc(n uint64) (uint64, error) {
	if n == 0 {
		return 0, errs.New(errs.InvalidArgument, "cuda", "allocate 0 bytes")
	}
	s := l.slot()
	defer l.put(s)
	if r := l.cuMemAlloc(s, uintptr(n)); r != Success {
		return 0, l.err(r, "cuMemAlloc", "%d bytes", n)
	}
	return load[uint64](s), nil
}

// MemFree frees device memory from MemAlloc.
func (l *Lib) MemFree(p uint64) error {
	if r := l.cuMemFree(p); r != Success {
		return l.err(r, "cuMemFree", "%#x", p)
	}
	return nil
}

// MemHostAlloc allocates n bytes of pinned (page-locked) host memory, the
// bounce buffers that let copies to and from the device run asynchronously.
func (l *Lib) MemHostAlloc(n uint64, flags uint32) (uint64, error) {
	if n == 0 {
		return 0, errs.New(errs.InvalidArgument, "cuda", "allocate 0 bytes")
	}
	s := l.slot()
	defer l.put(s)
	if r := l.cuMemHostAlloc(s, uintptr(n), flags); r != Success {
		return 0, l.err(r, "cuMemHostAlloc", "%d pinned bytes", n)
	}
	return uint64(load[uintptr](s)), nil
}

// MemFreeHost frees memory from MemHostAlloc.
func (l *Lib) MemFreeHost(p uint64) error {
	if r := l.cuMemFreeHost(uintptr(p)); r != Success {
		return l.err(r, "cuMemFreeHost", "%#x", p)
	}
	return nil
}

// Copy copies n bytes with cuMemcpy: unified addressing tells host from
// device memory. It returns when the copy is done.
func (l *Lib) Copy(dst, src, n uint64) error {
	if r := l.cuMemcpy(dst, src, uintptr(n)); r != Success {
		return l.err(r, "cuMemcpy", "%d bytes %#x -> %#x", n, src, dst)
	}
	return nil
}

// CopyHtoD copies n bytes from host memory to device memory.
func (l *Lib) CopyHtoD(dst, src, n uint64) error {
	if r := l.cuMemcpyHtoD(dst, uintptr(src), uintptr(n)); r != Success {
		return l.err(r, "cuMemcpyHtoD", "%d bytes %#x -> %#x", n, src, dst)
	}
	return nil
}

// CopyDtoH copies n bytes from device memory to host memory.
func (l *Lib) CopyDtoH(dst, src, n uint64) error {
	if r := l.cuMemcpyDtoH(uintptr(dst), src, uintptr(n)); r != Success {
		return l.err(r, "cuMemcpyDtoH", "%d bytes %#x -> %#x", n, src, dst)
	}
	return nil
}

// CopyDtoD copies n bytes between device memory.
func (l *Lib) CopyDtoD(dst, src, n uint64) error {
	if r := l.cuMemcpyDtoD(dst, src, uintptr(n)); r != Success {
		return l.err(r, "cuMemcpyDtoD", "%d bytes %#x -> %#x", n, src, dst)
	}
	return nil
}

// CopyAsync enqueues a unified-addressing copy on s.
func (l *Lib) CopyAsync(dst, src, n uint64, s Stream) error {
	if r := l.cuMemcpyAsync(dst, src, uintptr(n), uintptr(s)); r != Success {
		return l.err(r, "cuMemcpyAsync", "%d bytes %#x -> %#x", n, src, dst)
	}
	return nil
}

// CopyHtoDAsync enqueues a host-to-device copy on s; src should be pinned
// (MemHostAlloc) for the copy to overlap with the caller.
func (l *Lib) CopyHtoDAsync(dst, src, n uint64, s Stream) error {
	if r := l.cuMemcpyHtoDAsync(dst, uintptr(src), uintptr(n), uintptr(s)); r != Success {
		return l.err(r, "cuMemcpyHtoDAsync", "%d bytes %#x -> %#x", n, src, dst)
	}
	return nil
}

// CopyDtoHAsync enqueues a device-to-host copy on s.
func (l *Lib) CopyDtoHAsync(dst, src, n uint64, s Stream) error {
	if r := l.cuMemcpyDtoHAsync(uintptr(dst), src, uintptr(n), uintptr(s)); r != Success {
		return l.err(r, "cuMemcpyDtoHAsync", "%d bytes %#x -> %#x", n, src, dst)
	}
	return nil
}

// CopyDtoDAsync enqueues a device-to-device copy on s.
func (l *Lib) CopyDtoDAsync(dst, src, n uint64, s Stream) error {
	if r := l.cuMemcpyDtoDAsync(dst, src, uintptr(n), uintptr(s)); r != Success {
		return l.err(r, "cuMemcpyDtoDAsync", "%d bytes %#x -> %#x", n, src, dst)
	}
	return nil
}

// StreamCreate creates a stream in the current context.
func (l *Lib) StreamCreate(flags uint32) (Stream, error) {
	s := l.slot()
	defer l.put(s)
	if r := l.cuStreamCreate(s, flags); r != Success {
		return 0, l.err(r, "cuStreamCreate", "flags %#x", flags)
	}
	return Stream(load[uintptr](s)), nil
}

// StreamSynchronize waits until everything enqueued on s has finished.
func (l *Lib) StreamSynchronize(s Stream) error {
	if r := l.cuStreamSynchronize(uintptr(s)); r != Success {
		return l.err(r, "cuStreamSynchronize", "stream %#x", uintptr(s))
	}
	return nil
}

// StreamDestroy destroys s.
func (l *Lib) StreamDestroy(s Stream) error {
	if r := l.cuStreamDestroy(uintptr(s)); r != Success {
		return l.err(r, "cuStreamDestroy", "stream %#x", uintptr(s))
	}
	return nil
}

// EventCreate creates an event in the current context.
func (l *Lib) EventCreate(flags uint32) (Event, error) {
	s := l.slot()
	defer l.put(s)
	if r := l.cuEventCreate(s, flags); r != Success {
		return 0, l.err(r, "cuEventCreate", "flags %#x", flags)
	}
	return Event(load[uintptr](s)), nil
}

// EventRecord records e on s.
func (l *Lib) EventRecord(e Event, s Stream) error {
	if r := l.cuEventRecord(uintptr(e), uintptr(s)); r != Success {
		return l.err(r, "cuEventRecord", "event %#x", uintptr(e))
	}
	return nil
}

// EventSynchronize waits until the work before e's record has finished.
func (l *Lib) EventSynchronize(e Event) error {
	if r := l.cuEventSynchronize(uintptr(e)); r != Success {
		return l.err(r, "cuEventSynchronize", "event %#x", uintptr(e))
	}
	return nil
}

// EventDestroy destroys e.
func (l *Lib) EventDestroy(e Event) error {
	if r := l.cuEventDestroy(uintptr(e)); r != Success {
		return l.err(r, "cuEventDestroy", "event %#x", uintptr(e))
	}
	return nil
}

// IPCGetMemHandle exports the allocation that holds ptr (which must be a
// cuMemAlloc allocation, not VMM memory) as a handle another process opens.
func (l *Lib) IPCGetMemHandle(ptr uint64) (IPCMemHandle, error) {
	s := l.slot()
	defer l.put(s)
	if r := l.cuIpcGetMemHandle(s, ptr); r != Success {
		return IPCMemHandle{}, l.err(r, "cuIpcGetMemHandle", "export %#x", ptr)
	}
	return load[IPCMemHandle](s), nil
}

// IPCOpenMemHandle maps another process's allocation into the current
// context and returns its base address here. A process cannot open its own
// handles.
func (l *Lib) IPCOpenMemHandle(h IPCMemHandle, flags uint32) (uint64, error) {
	s := l.slot()
	defer l.put(s)
	if r := l.cuIpcOpenMemHandle(s, h, flags); r != Success {
		return 0, l.err(r, "cuIpcOpenMemHandle", "open a peer's memory handle")
	}
	return load[uint64](s), nil
}

// IPCCloseMemHandle unmaps memory from IPCOpenMemHandle.
func (l *Lib) IPCCloseMemHandle(ptr uint64) error {
	if r := l.cuIpcCloseMemHandle(ptr); r != Success {
		return l.err(r, "cuIpcCloseMemHandle", "%#x", ptr)
	}
	return nil
}

// ErrorName asks the driver for r's name, falling back to this package's
// table.
func (l *Lib) ErrorName(r Result) string {
	if l.cuGetErrorName != nil {
		s := l.slot()
		defer l.put(s)
		if l.cuGetErrorName(uint32(r), s) == Success {
			if p := load[uintptr](s); p != 0 {
				return cstring(p, 128)
			}
		}
	}
	return r.Name()
}

// cstring reads a NUL-terminated string of at most max bytes at p, a byte
// at a time so it never reads past the terminator.
func cstring(p uintptr, max int) string {
	var b []byte
	for i := 0; i < max; i++ {
		c := *(*byte)(cptr(p + uintptr(i)))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}
