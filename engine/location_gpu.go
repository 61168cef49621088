package engine

import (
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
	// Links the GPU runtimes te has, so their location kinds resolve.
	_ "github.com/tecache/te/internal/sys/gpu/runtimes"
)

// GPU memory in the engine: registration recognises it and requests that
// touch it go only to transports that can move it. The CPU transports read
// and write registered memory with the CPU, which faults (or fails with
// EFAULT) on device memory, so they must never be handed a GPU range. The
// engine names no GPU runtime: a location's kind ("cuda", "hip") picks the
// gpu.Driver registered under it.

// gpuLoad is gpu.Load, replaceable in tests.
var gpuLoad = gpu.Load

// resolveLocations checks the regions that name a GPU (KIND:N) against that
// runtime and recognises GPU memory among those registered with "*", so the
// published BufferDesc names the device of every device buffer. Without the
// runtime a KIND:N region is refused (NotSupported, with the reason) and
// "*" means host memory unless a runtime that loads claims it: no device
// memory can exist in a process without its runtime.
func resolveLocations(rs []*segment.Region) error {
	for _, r := range rs {
		switch kind := r.Location.Kind; {
		case kind == "*":
			// Host memory unless a runtime says otherwise; publish what was
			// found, as Mooncake does, never "*".
			r.Location = segment.Location{Kind: "cpu", Index: -1}
			if d, dev, ok := gpu.Find(r.Addr); ok {
				if err := checkDevice(d, r, dev); err != nil {
					return err
				}
				r.Location = segment.Location{Kind: d.Kind(), Index: dev}
			}
			r.Desc.Name = r.Location.String()
		case gpu.IsDevice(kind):
			d, known, err := gpuLoad(kind)
			switch {
			case !known:
				return errs.New(errs.NotSupported, "register", "[%#x,+%d) is at %s: no %s runtime is built in", r.Addr, r.Length, r.Location, kind)
			case err != nil:
				return errs.Wrap(errs.NotSupported, "register", err,
					"[%#x,+%d) is at %s but the %s runtime is not available", r.Addr, r.Length, r.Location, kind)
			}
			if err := checkDevice(d, r, r.Location.Index); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkDevice verifies that both ends of r are device memory of device dev
// of d.
func checkDevice(d gpu.Driver, r *segment.Region, dev int) error {
	for _, p := range []uint64{r.Addr, r.End() - 1} {
		n, isDev, err := d.PointerDevice(p)
		if err != nil {
			return errs.Wrap(errs.CodeOf(err), "register", err, "query the %s runtime about %#x", d.Kind(), p)
		}
		if !isDev || n != dev {
			what := "host or unknown"
			if isDev {
				what = segment.Location{Kind: d.Kind(), Index: n}.String()
			}
			return errs.New(errs.InvalidArgument, "register",
				"[%#x,+%d) registered as %s:%d, but the %s runtime says %#x is %s memory",
				r.Addr, r.Length, d.Kind(), dev, d.Kind(), p, what)
		}
	}
	return nil
}
