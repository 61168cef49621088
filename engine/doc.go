// Package engine is te's public Go API: a KV-cache transfer engine in the
// spirit of Mooncake's Transfer Engine.
//
// An Engine registers local memory, publishes it as a segment (a descriptor
// with Mooncake's field names), opens peers' segments and moves bytes between
// them in batches of READ and WRITE requests, with per-task status, a blocking
// Wait, notifications, and probes.
//
// Metadata is peer-to-peer by default (Config.Metadata "P2PHANDSHAKE"): a
// segment is named host:port after its engine's RPC listener and descriptors
// are fetched from the peer itself, so no server is needed. Stores such as
// etcd register their schemes in package meta.
//
// Package engine names no transport or store: each registers itself from its
// own package, and a program links the standard set with
//
//	import _ "github.com/tecache/te/engine/std"
//
// Each request goes over the best-ranked transport (transport.Caps.Rank:
// local, file, shm, cudaipc, rdma, tcp) that both sides have, that moves the
// memory at both ends (host, GPU, or a registered file: RegisterFile, moved
// by transports with Caps.FileMemory) and that reaches the peer, unless the engine or
// the request forces one; Stats().Routes says which one served each open
// segment and why the others were passed over. The memory owner checks every remote access against
// its registry, so a stale descriptor is refused rather than honoured.
//
// A terminal task state is a fence: a task is COMPLETED, FAILED, TIMEOUT or
// CANCELED only once its transport will never touch its memory again, so
// Wait, Free and Close inherit the guarantee; a timeout or Batch.Cancel asks
// the transport to let go and the task ends when it has. UnregisterMemory
// returns only once nothing can touch the range (in-flight accesses get
// Config.UnregisterGrace, then the transports cut the connections that hold
// them). GrantWindow and RevokeWindow give the same fence for part of the
// memory, per transfer, without unregistering it.
//
// A reused batch (Batch.Reset) allocates nothing per request; the engine's
// own cost per request is tens of nanoseconds (BenchmarkSubmitWait4KiB).
//
// Peers authenticate: with a cluster secret (Config.AuthSecret,
// AuthSecretFile, or TE_AUTH_SECRET_FILE / TE_AUTH_SECRET), every connection
// opens with a mutual challenge-response, and a peer without the secret
// learns and touches nothing (Unauthenticated). Without one the engine trusts
// the network and says so in its log. An engine binds the host it
// advertises unless ListenAddr names another. Config.Limits bounds what any
// peer can make it hold; refusals are counted in Stats().Control.
// SECURITY.md has the threat model.
//
// Mooncake Transfer Engine peers interoperate over tcp: the RPC listener
// answers Mooncake's handshake (Metadata, Notify, Probe), peer-to-peer
// opens fall back to it when a peer turns out to be Mooncake's (never with
// a cluster secret: no downgrade to an unauthenticated exchange), and a
// Mooncake peer's memory is reached in its own data framing. Serving
// Mooncake initiators' data requests, which carry no key and cannot
// authenticate, is opt-in (Config.AcceptMooncakePeers,
// TE_ACCEPT_MOONCAKE_PEERS=1) and trusts the network.
//
// Every Config field has an environment variable (TE_MAX_CONNS,
// TE_PARAM_tcp_conns, ...: the Env constants), which New reads for the
// fields the caller left unset, so users of the C library and the Python
// drop-ins reach every setting; a value that does not parse makes New fail,
// naming the variable.
//
// WriteMetrics writes the engine's counters in Prometheus's text format
// (Config.MetricsAddr serves them at /metrics), and Version names the build.
// The engine logs through Config.Logger, else in te's style on stderr at
// the level and in the format TE_LOG_LEVEL and TE_LOG_FORMAT set (info,
// text by default); at debug level it logs each segment opened and each
// batch's outcome. Pass slog.Default() as Config.Logger to log through the
// application's default logger instead.
//
// Every error is an *Error with a stable Code; errors.Is matches the
// sentinels (ErrTimeout, ...). No method panics on bad input or blocks
// without a bound.
package engine
