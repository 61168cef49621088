// Package sidecar is te-sidecar, the per-pod daemon, as a library: a
// fasthttp server that serves Mooncake's HTTP metadata protocol from memory
// (GET, PUT and DELETE /metadata?key=K), the prefill-to-decode handoff
// rendezvous (/handoff/..., package rendezvous), /healthz and Prometheus
// /metrics. Other features add their routes with Server.Handle and their
// metrics through Server.Metrics.
//
// # Authentication
//
// With a cluster secret (Config.Secret; te-sidecar's -auth-secret-file,
// TE_AUTH_SECRET_FILE or TE_AUTH_SECRET) every route but /healthz and
// /metrics needs "Authorization: Bearer <token>", where token is the
// lowercase hex of HMAC-SHA256(key = secret, message = "te-sidecar-token
// v1") (package authsecret); during a rotation the previous secret's token
// is accepted too, and tokens are compared in constant time. Without a
// secret, /metadata needs the Mooncake metadata token when one is set
// (-metadata-token, MC_METADATA_HTTP_TOKEN; with a secret it is accepted on
// /metadata as well), and te-sidecar listens on loopback only unless
// -insecure says to trust the network. A Mooncake engine without the token
// therefore cannot use a te-sidecar that has a secret, unless the sidecar
// also has a metadata token that the engine is given.
//
// # Bounds
//
// Request bodies are read by the handlers with a limit per route (the
// metadata value limit, the handoff body limit): a larger body gets a 413
// the client can read, and a client that sends "Expect: 100-continue" is
// refused before it sends the body. The bytes of bodies read at once, the
// connections, the metadata keys and bytes, and the handoff declarations
// (per client and in total) are bounded; every refusal is counted in
// te_sidecar_refused_total or te_handoff_rejected_total.
//
// cmd/te-sidecar is a thin main around Main, which reads flags and
// environment variables, logs with log/slog, sets GOMAXPROCS from the cgroup
// CPU quota and shuts down gracefully when its context ends (SIGTERM).
package sidecar
