package sidecar

import "github.com/tecache/te/internal/sidecar/rendezvous"

// mountHandoff installs the prefill-to-decode handoff rendezvous
// (/handoff/...) with its metrics in this server's registry.
func mountHandoff(s *Server) {
	rendezvous.Mount(s, handoffMetrics{s.metrics}, rendezvous.Config{})
}

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
