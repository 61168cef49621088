// Package sidecar is te-sidecar, the per-pod daemon, as a library: a
// fasthttp server that serves Mooncake's HTTP metadata protocol from memory
// (GET, PUT and DELETE /metadata?key=K), the prefill-to-decode handoff
// rendezvous (/handoff/..., package rendezvous), /healthz and Prometheus
// /metrics, and its own OpenAPI 3 document at /openapi.json (also in the
// repository as docs/te-sidecar.openapi.json). Routes are api.Route values:
// the document is built from the same table the server serves, query
// parameters a route does not declare are refused, JSON bodies are decoded
// strictly (an unknown field is refused by name), and every refusal is a
// JSON proto.ErrorBody with a stable code. Other features add their routes
// with Server.Route (or Server.Handle) and their metrics through
// Server.Metrics.
//
// # Authentication
//
// With a cluster secret (Config.Secret; te-sidecar's -auth-secret-file,
// TE_AUTH_SECRET_FILE or TE_AUTH_SECRET) every route but /healthz, /metrics,
// /openapi.json and /metadata/proof needs "Authorization: Bearer <token>", where token is
// the lowercase hex of HMAC-SHA256(key = secret, message = "te-sidecar-token
// v1"), or a client's own token for the name it gives in X-Te-Client
// (authsecret.ClientToken); during a rotation the previous secret's tokens
// are accepted too, and tokens are compared in constant time. Without a
// secret, /metadata needs the Mooncake metadata token when one is set
// (-metadata-token, MC_METADATA_HTTP_TOKEN; with a secret it is accepted on
// /metadata as well), and te-sidecar listens on loopback only unless
// -insecure says to trust the network. A Mooncake engine without the token
// therefore cannot use a te-sidecar that has a secret, unless the sidecar
// also has a metadata token that the engine is given.
//
// GET /metadata/proof?nonce=N is how te's metadata client learns that the
// server holds the secret before it sends the token derived from it: the
// answer holds authsecret.Proof of the nonce and the sidecar's instance
// under each of its secrets, and reveals neither the secret nor the token.
//
// # Connections
//
// Connections are bounded before a byte is read (MaxConns, MaxConnsPerIP).
// A connection is pending until a request on it passes a route's access
// check (the token; without a secret, any route that is not open): pending
// connections share at most MaxConns-ReservedConns slots, at most
// MaxPendingConnsPerIP from one address, and each of their reads gets
// HeaderTimeout (2s). A newcomer that finds the pending share of its
// address taken closes that address's oldest pending connection, and one
// that finds the whole pending share or every slot taken closes the oldest
// pending connection of the address holding the most (for the shares, only
// once the victim has had HeaderTimeout/20 to send a request); when every
// slot is held by connections that authenticated, it is answered 503 and
// closed. So connections that idle or trickle, from any
// number of addresses, cannot take the slots of clients that send their
// token, and the ones that authenticated keep theirs.
//
// # Quotas
//
// The handoff's quotas are kept per client identity (Server.Client): the
// name a client token proves, else the source host (an IPv4 address, an
// IPv6 /64, or "local" for all of loopback). X-Te-Client alone is a label,
// never an identity, so a caller cannot spread its declarations over names.
//
// # Bounds
//
// Request bodies are read by the handlers with a limit per route (the
// metadata value limit, the handoff body limit): a larger body gets a 413
// the client can read, and a client that sends "Expect: 100-continue" is
// refused before it sends the body. The bytes of bodies read at once, the
// connections, the metadata keys and bytes, and the handoff declarations
// (per client and in total) are bounded; every refusal is counted in
// te_sidecar_refused_total, te_sidecar_connections_refused_total or
// te_handoff_rejected_total, and logged at info level (route, source,
// reason) at most Config.RefusalLogRate lines a second.
//
// cmd/te-sidecar is a thin main around Main, which reads flags and
// environment variables, prints its version (-version), logs with log/slog
// (text, or JSON with -log-format json or TE_LOG_FORMAT=json; durations as
// durations), sets GOMAXPROCS from the cgroup CPU quota and shuts down
// gracefully when its context ends (SIGTERM).
package sidecar
