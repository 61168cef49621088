package engine

import (
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

// TransportStats returns, by transport name, the counters of the installed
// transports that keep their own (for shm: attachments, probes the kernel
// refused, revocations sent, acknowledged and cut off).
func (e *Engine) TransportStats() map[string]map[string]uint64 {
	out := map[string]map[string]uint64{}
	for _, t := range e.transports {
		if s, ok := t.(transport.StatsReporter); ok {
			out[t.Name()] = s.Stats()
		}
	}
	return out
}

// LiveTransports returns, by transport name, what the installed transports
// that hold per-peer resources hold now (transport.Live): peers,
// connections, endpoints, queue pairs.
func (e *Engine) LiveTransports() map[string]transport.Live {
	out := map[string]transport.Live{}
	for _, t := range e.transports {
		if l, ok := t.(transport.LiveReporter); ok {
			out[t.Name()] = l.Live()
		}
	}
	return out
}

// Topology returns Mooncake's topology matrix as the engine's transports use
// it: for every memory location ("cpu:N", "cuda:N", "hip:N"), the RDMA NICs near it
// and the others; nil when no installed transport places NICs (no rdma).
func (e *Engine) Topology() map[string][2][]string {
	for _, t := range e.transports {
		if tp, ok := t.(transport.TopologyReporter); ok {
			return tp.Topology()
		}
	}
	return nil
}

// CXLMemory returns where the shared memory device (the cxl transport's
// DAX mapping) lies in this process and its size. Buffers allocated from it
// and registered are reached by every engine that maps the same device with
// a memcpy; the engine keeps the mapping until it closes (the last engine of
// the process naming the device unmaps it), so the caller must stop using
// it by then. NotSupported when no installed transport maps such memory.
func (e *Engine) CXLMemory() (addr, size uint64, err error) {
	if err := e.live("cxl memory"); err != nil {
		return 0, 0, err
	}
	for _, t := range e.transports {
		if sm, ok := t.(transport.SharedMemory); ok {
			if a, n := sm.Memory(); n > 0 {
				return a, n, nil
			}
		}
	}
	return 0, 0, errs.New(errs.NotSupported, "cxl memory", "no shared memory device is mapped").
		WithHint("set TE_CXL_DEVICE (or MC_CXL_DEV_PATH) to the DAX device and install the cxl transport")
}
