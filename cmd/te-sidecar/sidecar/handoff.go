package sidecar

import "github.com/tecache/te/cmd/te-sidecar/rendezvous"

// mountHandoff installs the prefill-to-decode handoff rendezvous
// (/handoff/...) with its metrics in this server's registry.
func mountHandoff(s *Server) {
	s.handoff = rendezvous.Mount(s, handoffMetrics{s.metrics}, s.cfg.Handoff)
}

// handoffMaxBody is the body limit of the handoff routes.
func (s *Server) handoffMaxBody() int {
	if s.cfg.Handoff.MaxBody > 0 {
		return s.cfg.Handoff.MaxBody
	}
	return rendezvous.DefaultMaxBody
}

// Handoff returns the handoff rendezvous the server serves.
func (s *Server) Handoff() *rendezvous.Service { return s.handoff }

// handoffMetrics adapts Metrics to rendezvous.Registry.
type handoffMetrics struct{ m *Metrics }

func (h handoffMetrics) Counter(name, help string, labels ...string) rendezvous.Adder {
	return h.m.Counter(name, help, labels...)
}

func (h handoffMetrics) Gauge(name, help string, labels ...string) rendezvous.Adder {
	return h.m.Gauge(name, help, labels...)
}

func (h handoffMetrics) Histogram(name, help string, buckets []float64, labels ...string) rendezvous.Observer {
	return h.m.Histogram(name, help, buckets, labels...)
}

func (h handoffMetrics) GaugeFunc(name, help string, f func() float64) { h.m.GaugeFunc(name, help, f) }
