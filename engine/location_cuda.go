package engine

import (
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/cuda"
	"github.com/tecache/te/internal/sys/gpu"
)

// GPU memory in the engine: registration recognises it and requests that
// touch it go only to transports that can move it. The CPU transports read
// and write registered memory with the CPU, which faults (or fails with
// EFAULT) on device memory, so they must never be handed a GPU range.

// cudaLoad is cuda.Load, replaceable in tests.
var cudaLoad = cuda.Load

// resolveLocations checks the regions that name a GPU ("cuda:N") against the
// driver and recognises GPU memory among those registered with "*", so the
// published BufferDesc says cuda:N for every device buffer. Without CUDA a
// "cuda:N" region is refused (NotSupported, with the reason) and "*" means
// host memory: no device memory can exist in a process without a driver.
func resolveLocations(rs []*segment.Region) error {
	for _, r := range rs {
		if k := r.Location.Kind; k != "cuda" && k != "cpu" && k != "*" && k != "file" {
			if err := otherGPU(r); err != nil {
				return err
			}
			continue
		}
		switch r.Location.Kind {
		case "cuda":
			l, err := cudaLoad()
			if err != nil {
				return errs.Wrap(errs.NotSupported, "register", err,
					"[%#x,+%d) is at %s but CUDA is not available", r.Addr, r.Length, r.Location)
			}
			if err := checkDevice(l, r, r.Location.Index); err != nil {
				return err
			}
		case "*":
			// Host memory unless the driver says otherwise; publish what was
			// found, as Mooncake does, never "*".
			host := segment.Location{Kind: "cpu", Index: -1}
			l, err := cudaLoad()
			if err != nil {
				r.Location, r.Desc.Name = host, host.String()
				continue
			}
			pi, err := l.PointerInfo(r.Addr)
			if err != nil || pi.Type != cuda.MemoryDevice {
				r.Location, r.Desc.Name = host, host.String()
				continue
			}
			if err := checkDevice(l, r, pi.Device); err != nil {
				return err
			}
			r.Location = segment.Location{Kind: "cuda", Index: pi.Device}
			r.Desc.Name = r.Location.String()
		}
	}
	return nil
}

// otherGPU answers for device memory of a runtime other than CUDA (hip:N):
// the runtime registered under the location's kind must load and own the
// range, and even then no transport moves such memory yet, so the region is
// refused with NotSupported naming the cause rather than handed to
// transports that would touch it with the CPU.
func otherGPU(r *segment.Region) error {
	kind := r.Location.Kind
	d, known, err := gpu.Load(kind)
	switch {
	case !known:
		return errs.New(errs.NotSupported, "register", "[%#x,+%d) is at %s: no %s runtime is built in", r.Addr, r.Length, r.Location, kind)
	case err != nil:
		return errs.Wrap(errs.NotSupported, "register", err, "[%#x,+%d) is at %s but the %s runtime is not available", r.Addr, r.Length, r.Location, kind)
	}
	dev, isDev, err := d.PointerDevice(r.Addr)
	if err != nil {
		return errs.Wrap(errs.CodeOf(err), "register", err, "query the %s runtime about %#x", kind, r.Addr)
	}
	if !isDev || dev != r.Location.Index {
		return errs.New(errs.InvalidArgument, "register", "[%#x,+%d) registered as %s, but the %s runtime says it is not that device's memory", r.Addr, r.Length, r.Location, kind)
	}
	return errs.New(errs.NotSupported, "register", "[%#x,+%d) is %s memory, which no transport moves yet", r.Addr, r.Length, r.Location).
		WithHint("HIP GPU IPC, rdma by dma-buf and staging are not built yet; use cuda:N or host memory")
}

// checkDevice verifies that both ends of r are device memory of device dev.
func checkDevice(l *cuda.Lib, r *segment.Region, dev int) error {
	for _, p := range []uint64{r.Addr, r.End() - 1} {
		pi, err := l.PointerInfo(p)
		if err != nil {
			return errs.Wrap(errs.CodeOf(err), "register", err, "query the driver about %#x", p)
		}
		if pi.Type != cuda.MemoryDevice || pi.Device != dev {
			return errs.New(errs.InvalidArgument, "register",
				"[%#x,+%d) registered as cuda:%d, but the driver says %#x is %s memory (device %d)",
				r.Addr, r.Length, dev, p, pi.Type, pi.Device)
		}
	}
	return nil
}
