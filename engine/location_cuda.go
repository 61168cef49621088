package engine

import (
	"strings"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/cuda"
)

// GPU memory in the engine: registration recognises it and requests that
// touch it go only to transports that can move it. The CPU transports read
// and write registered memory with the CPU, which faults (or fails with
// EFAULT) on device memory, so they must never be handed a GPU range.

// DeviceTransport is implemented by transports that can move GPU memory.
// DeviceMemory reports whether the transport can serve a request whose local
// range is (or is not) device memory, to buf of the segment d. A transport
// that stages through host memory answers true for every peer it reaches.
type DeviceTransport interface {
	DeviceMemory(d *segment.Desc, buf *segment.BufferDesc, localDevice bool) bool
}

// cudaLoad is cuda.Load, replaceable in tests.
var cudaLoad = cuda.Load

// resolveLocations checks the regions that name a GPU ("cuda:N") against the
// driver and recognises GPU memory among those registered with "*", so the
// published BufferDesc says cuda:N for every device buffer. Without CUDA a
// "cuda:N" region is refused (NotSupported, with the reason) and "*" means
// host memory: no device memory can exist in a process without a driver.
func resolveLocations(rs []*segment.Region) error {
	for _, r := range rs {
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

func isDevice(name string) bool { return strings.HasPrefix(name, "cuda") }

// routeDevice adjusts the transport chosen for a segment to the memory a
// request touches: a request on GPU memory goes to the most preferred
// transport that says it can move it (cudaipc on one host), and a request on
// host memory never goes to a GPU-only transport.
func (e *Engine) routeDevice(d *segment.Desc, buf *segment.BufferDesc, r *Request, local *segment.Region, t transport.Transport) (transport.Transport, error) {
	localDev := local.Location.Kind == "cuda"
	if !localDev && !isDevice(buf.Name) {
		if t.Name() != "cudaipc" {
			return t, nil
		}
		// cudaipc moves only GPU memory: take the next transport.
		for _, u := range e.transports {
			if u.Name() != "cudaipc" && d.HasTransport(u.Name()) && u.Reachable(d) == nil {
				return u, nil
			}
		}
		return nil, errs.New(errs.TransportUnavailable, "submit", "no transport for host memory reaches segment %q", d.Name)
	}
	serves := func(u transport.Transport) bool {
		dt, ok := u.(DeviceTransport)
		return ok && dt.DeviceMemory(d, buf, localDev)
	}
	if r.Transport != "" || e.cfg.ForceTransport != "" {
		if !serves(t) {
			return nil, errs.New(errs.NotSupported, "submit", "transport %s cannot move GPU memory (local %#x, remote %s at %#x)",
				t.Name(), r.Local, buf.Name, r.Remote)
		}
		return t, nil
	}
	for _, u := range e.transports {
		if d.HasTransport(u.Name()) && serves(u) && u.Reachable(d) == nil {
			return u, nil
		}
	}
	return nil, errs.New(errs.NotSupported, "submit",
		"no installed transport moves GPU memory between this engine and segment %q (local %#x, remote %s)", d.Name, r.Local, buf.Name).
		WithHint("cudaipc needs both engines on one host with CUDA; tcp stages GPU memory through pinned host buffers when CUDA loads on both sides")
}
