package engine

import "github.com/tecache/te/engine/transport"

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

// Topology returns Mooncake's topology matrix as the engine's transports use
// it: for every memory location ("cpu:N", "cuda:N"), the RDMA NICs near it
// and the others; nil when no installed transport places NICs (no rdma).
func (e *Engine) Topology() map[string][2][]string {
	for _, t := range e.transports {
		if tp, ok := t.(transport.TopologyReporter); ok {
			return tp.Topology()
		}
	}
	return nil
}
