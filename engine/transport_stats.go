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
