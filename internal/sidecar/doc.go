// Package sidecar is te-sidecar, the per-pod daemon, as a library: a
// fasthttp server that serves Mooncake's HTTP metadata protocol from memory
// (GET, PUT and DELETE /metadata?key=K), /healthz and Prometheus /metrics.
// Other features (the prefill-to-decode handoff rendezvous) add their routes
// with Server.Handle and their metrics through Server.Metrics.
//
// cmd/te-sidecar is a thin main around Main, which reads flags and
// environment variables, logs with log/slog, sets GOMAXPROCS from the cgroup
// CPU quota and shuts down gracefully when its context ends (SIGTERM).
package sidecar
