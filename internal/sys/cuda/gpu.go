package cuda

import (
	"encoding/hex"
	"sync"

	"github.com/tecache/te/internal/sys/gpu"
)

// streamCtx maps a stream made by Driver.StreamCreate to its device's
// primary context: the copies and syncs on it run with that current.
var streamCtx sync.Map // gpu.Stream -> streamOwner

type streamOwner struct {
	dev Device
	ctx Context
}

func init() {
	gpu.Register("cuda", func() (gpu.Driver, error) {
		l, err := Load()
		if err != nil {
			return nil, err
		}
		return Driver{l}, nil
	})
}

// Driver is the CUDA driver as a gpu.Driver. Calls that need a context run
// under the device's primary context.
type Driver struct{ L *Lib }

var (
	_ gpu.Driver  = Driver{}
	_ gpu.Fabric  = Driver{}
	_ gpu.Batcher = Driver{}
)

// Kind returns "cuda".
func (Driver) Kind() string { return "cuda" }

// DeviceCount returns cuDeviceGetCount.
func (d Driver) DeviceCount() (int, error) { return d.L.DeviceCount() }

// PointerDevice asks cuPointerGetAttributes.
func (d Driver) PointerDevice(ptr uint64) (int, bool, error) {
	pi, err := d.L.PointerInfo(ptr)
	if err != nil {
		return -1, false, err
	}
	if pi.Type != MemoryDevice {
		return -1, false, nil
	}
	return pi.Device, true, nil
}

// PCIBusID returns device dev's bus id, normalised.
func (d Driver) PCIBusID(dev int) (string, error) {
	id, err := d.L.DevicePCIBusID(Device(dev))
	return NormalizeBusID(id), err
}

func (d Driver) onDevice(dev int, fn func() error) error {
	c, err := d.L.PrimaryCtxRetain(Device(dev))
	if err != nil {
		return err
	}
	defer d.L.PrimaryCtxRelease(Device(dev))
	return d.L.With(c, fn)
}

// HostAlloc returns pinned, portable host memory (cuMemHostAlloc).
func (d Driver) HostAlloc(n uint64) (p uint64, err error) {
	err = d.onDevice(0, func() error {
		p, err = d.L.MemHostAlloc(n, HostAllocPortable)
		return err
	})
	return p, err
}

// HostFree frees HostAlloc's memory.
func (d Driver) HostFree(p uint64) error {
	return d.onDevice(0, func() error { return d.L.MemFreeHost(p) })
}

// StreamCreate makes a non-blocking stream in dev's primary context, which
// it keeps retained until StreamDestroy.
func (d Driver) StreamCreate(dev int) (gpu.Stream, error) {
	c, err := d.L.PrimaryCtxRetain(Device(dev))
	if err != nil {
		return 0, err
	}
	var st Stream
	err = d.L.With(c, func() (err error) {
		st, err = d.L.StreamCreate(StreamNonBlocking)
		return err
	})
	if err != nil {
		d.L.PrimaryCtxRelease(Device(dev))
		return 0, err
	}
	streamCtx.Store(gpu.Stream(st), streamOwner{Device(dev), c})
	return gpu.Stream(st), nil
}

// onStream runs fn with s's context current.
func (d Driver) onStream(s gpu.Stream, fn func() error) error {
	o, ok := streamCtx.Load(s)
	if !ok {
		return fn() // the default stream, or one made elsewhere
	}
	return d.L.With(o.(streamOwner).ctx, fn)
}

// StreamDestroy ends a stream and releases its context.
func (d Driver) StreamDestroy(s gpu.Stream) error {
	err := d.onStream(s, func() error { return d.L.StreamDestroy(Stream(s)) })
	if o, ok := streamCtx.LoadAndDelete(s); ok {
		d.L.PrimaryCtxRelease(o.(streamOwner).dev)
	}
	return err
}

// CopyAsync is cuMemcpyHtoDAsync, DtoH, DtoD or cuMemcpyAsync (Default).
func (d Driver) CopyAsync(dst, src, n uint64, dir gpu.Dir, s gpu.Stream) error {
	return d.onStream(s, func() error { return d.copy(dst, src, n, dir, s) })
}

func (d Driver) copy(dst, src, n uint64, dir gpu.Dir, s gpu.Stream) error {
	switch dir {
	case gpu.HostToDevice:
		return d.L.CopyHtoDAsync(dst, src, n, Stream(s))
	case gpu.DeviceToHost:
		return d.L.CopyDtoHAsync(dst, src, n, Stream(s))
	case gpu.DeviceToDevice:
		return d.L.CopyDtoDAsync(dst, src, n, Stream(s))
	}
	return d.L.CopyAsync(dst, src, n, Stream(s))
}

// CopiesAsync queues every copy of cs on s under one switch to the
// stream's context (gpu.Batcher): with a copy per request, the three
// driver calls of that switch cost more than the copy's own.
func (d Driver) CopiesAsync(cs []gpu.Copy, s gpu.Stream, errl []error) {
	err := d.onStream(s, func() error {
		for i, c := range cs {
			errl[i] = d.copy(c.Dst, c.Src, c.N, c.Dir, s)
		}
		return nil
	})
	if err != nil {
		for i := range errl {
			errl[i] = err
		}
	}
}

// StreamSync is cuStreamSynchronize.
func (d Driver) StreamSync(s gpu.Stream) error {
	return d.onStream(s, func() error { return d.L.StreamSynchronize(Stream(s)) })
}

// AllocRange is cuMemGetAddressRange in dev's primary context.
func (d Driver) AllocRange(dev int, ptr uint64) (base, size uint64, err error) {
	err = d.onDevice(dev, func() (err error) {
		base, size, err = d.L.MemGetAddressRange(ptr)
		return err
	})
	return base, size, err
}

// DeviceUUID is cuDeviceGetUuid, in hex.
func (d Driver) DeviceUUID(dev int) (string, error) {
	dv, err := d.L.DeviceGet(dev)
	if err != nil {
		return "", err
	}
	u, err := d.L.DeviceUUID(dv)
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(u.Bytes[:]), nil
}

// IPCExport is cuIpcGetMemHandle in dev's primary context.
func (d Driver) IPCExport(dev int, ptr uint64) (h gpu.IPCHandle, err error) {
	err = d.onDevice(dev, func() error {
		x, err := d.L.IPCGetMemHandle(ptr)
		h = gpu.IPCHandle(x.Reserved)
		return err
	})
	return h, err
}

// IPCImport is cuIpcOpenMemHandle (lazy peer access) in dev's primary
// context.
func (d Driver) IPCImport(dev int, h gpu.IPCHandle) (p uint64, err error) {
	err = d.onDevice(dev, func() (err error) {
		p, err = d.L.IPCOpenMemHandle(IPCMemHandle{Reserved: h}, IPCLazyEnablePeerAccess)
		return err
	})
	return p, err
}

// IPCClose is cuIpcCloseMemHandle in dev's primary context.
func (d Driver) IPCClose(dev int, ptr uint64) error {
	return d.onDevice(dev, func() error { return d.L.IPCCloseMemHandle(ptr) })
}

// DmabufFD is cuMemGetHandleForAddressRange in dev's primary context.
func (d Driver) DmabufFD(dev int, ptr, size uint64) (fd int, err error) {
	fd = -1
	err = d.onDevice(dev, func() (err error) {
		fd, err = d.L.DmabufFD(ptr, size)
		return err
	})
	return fd, err
}

// FabricSupported is CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED.
func (d Driver) FabricSupported(dev int) bool {
	dv, err := d.L.DeviceGet(dev)
	return err == nil && d.L.FabricSupported(dv)
}

// FabricExport exports the fabric handle of the allocation at ptr in dev's
// primary context.
func (d Driver) FabricExport(dev int, ptr uint64) (h gpu.FabricHandle, err error) {
	err = d.onDevice(dev, func() error {
		x, err := d.L.FabricExport(ptr)
		h = gpu.FabricHandle(x)
		return err
	})
	return h, err
}

// FabricImport imports and maps a peer's fabric handle in dev's primary
// context.
func (d Driver) FabricImport(dev int, h gpu.FabricHandle, size uint64) (p uint64, err error) {
	err = d.onDevice(dev, func() (err error) {
		p, err = d.L.FabricImport(dev, FabricHandle(h), size)
		return err
	})
	return p, err
}

// FabricClose unmaps memory from FabricImport.
func (d Driver) FabricClose(dev int, ptr, size uint64) error {
	return d.onDevice(dev, func() error { return d.L.MemDestroy(ptr, size) })
}
