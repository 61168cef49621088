// Package tcp is te's transport over TCP: the data path of every deployment
// without RDMA.
//
// Each engine opens a data listener next to its RPC listener and publishes it
// as the "tcp" endpoint of its segment. An initiator keeps several persistent
// connections per peer ("tcp.conns"), cuts large requests into slices
// ("tcp.slice") striped over them, and keeps many requests in flight on each
// connection: one writer goroutine gathers queued requests into one writev,
// one reader goroutine matches completions by request id. The pooling is
// engine/internal/pipe's; this package is two framings plugged into it, te's
// (framing.go) and Mooncake's (mooncake.go), and the target side. Payloads are
// written from registered memory by writev and read into it straight from
// the socket; only payloads under 16 KiB, which arrive in the same read
// syscall as their headers (a 64 KiB read buffer holds about fifteen 4 KiB
// frames), are copied once out of that buffer: one memcpy instead of one
// syscall per request.
//
// Every connection opens with a preface and the peer authentication exchange
// (internal/peerauth): with a cluster secret, both ends prove they hold it
// before any request, so a party without it neither reads nor writes, and an
// initiator sends nothing to an endpoint that cannot prove it.
//
// The target validates every request against its registry (range inside one
// registered, remote-accessible buffer; capability key equal to the buffer's
// current key, or a window's) before it touches memory, drains the payload
// of a refused WRITE, and acknowledges a WRITE only once its bytes are in
// memory. The frames are specified in internal/wire/spec.md.
//
// Nothing a peer does holds the target's resources without a bound: the
// listener admits Limits.MaxConns connections, MaxConnsPerHost per address;
// a header must complete within the handshake timeout once started, an idle
// connection closes after the idle timeout, and every payload must move
// 4 MiB per progress timeout, so a stalled or trickling peer is cut off and
// the access it held ends. Quiesce (a buffer being unregistered, a window
// being revoked) cuts only the connections that hold an access to it: one
// moving its bytes, or holding it for a READ queued for the writer or
// waiting for room in that queue (a peer that does not read its
// completions).
//
// A request canceled by the engine (timeout, Batch.Cancel, unregister) is
// completed as soon as no goroutine can touch its memory: queued slices are
// dropped, sent ones are forgotten and their late completions read and
// discarded (a READ's payload into scratch), a WRITE being written is
// released when that write ends. Other requests on the connection go on.
//
// A completion is accepted only for bytes already sent: one that comes for a
// WRITE whose payload the writer is still sending (a target that answers
// before it read, by design or by bug) is held until the writer is past it,
// and the request fails with errs.Protocol if its payload never left. A
// completion for an id not in flight, or a second one, ends the connection
// with errs.Protocol. So te never reports COMPLETED while it still reads the
// request's memory, whatever the peer says.
//
// GPU memory (a region registered as cuda:N) is never touched by the CPU:
// each side stages its own device memory through rings of pinned host
// chunks (internal/sys/gpu.Stager), so the wire format is unchanged and a
// peer cannot tell. Sending, chunk k+depth is copied device to host on a
// stream while chunk k is on the wire, across the requests of one writev
// batch; receiving, chunk k is read from the socket while chunk k-1 is
// copied to the device, and a WRITE is acknowledged only after its last
// copy ended. Chunks are at most a quarter slice, so one slice's chunks
// overlap. A ring is taken from a pool per transport the first time a
// connection's reader or writer meets device memory, returned when it
// exits and freed by Close; a target that cannot load CUDA refuses a cuda
// region with NotSupported without touching it. The engine routes GPU
// requests here (transport.DeviceMover) when cudaipc cannot reach the
// peer or tcp is forced.
//
// Mooncake Transfer Engine peers are spoken to in their own tcp framing
// (version 2, acknowledged; mooncake.go): a descriptor without te's fields
// is such a peer, reached at its RPC host and tcp_data_port, with slices
// pipelined in order on persistent connections (its framing has no request
// ids, so a canceled slice in flight cuts its connection and the others go
// on another). The data listener tells a Mooncake initiator's first bytes
// from te's preface and, when the engine accepts Mooncake peers, serves it
// with the same owner-side checks and in-flight accounting, key aside; see
// "Mooncake interop" in internal/wire/spec.md. Then the listener belongs to
// one goroutine with its own epoll set (mcloop.go): it accepts every
// connection and serves Mooncake's READs and WRITEs of registered host memory
// on non-blocking sockets itself, since Mooncake's initiator opens a
// connection per request and the netpoller's wake-ups and goroutine
// hand-offs around each one cost more than the request; te's connections,
// and every Mooncake request it refuses, go to the goroutine path with the
// bytes read so far. Connection limits, timeouts, unregister fences and
// Close hold there as on the goroutine path.
//
// Several NICs (rails.go, devices.go). An engine whose tcp.devices names
// several NICs publishes an endpoint on each under te_endpoints["tcp.rails"]
// (primary first; te_endpoints["tcp"] stays the primary, so a peer that
// knows one endpoint reads it as before). A data listener bound to one
// address gets a listener of its own on each other NIC, on the same port
// where it is free; one on the wildcard address covers them all. An
// initiator makes one rail per endpoint of such a peer, dialing from its
// own NIC with that address or on that subnet (bound to it, so the route
// is that NIC's), and spreads each request's slices over the rails by
// measured rate and backlog (engine/transport/internal/rails). A slice
// lost with its connection (reset, refused, or silent for tcp.timeout)
// cools its rail down (1s, doubling to 30s while it keeps failing; then one
// slice probes it) and goes to another rail; it counts only once the
// target acknowledged it, and fails with the usual error when no rail is
// left.
//
// Parameters (engine.Config.Params):
//
//	tcp.conns         connections per peer (default: core count, at least 2)
//	tcp.slice         slice size, e.g. 512KiB (default: from the L2 cache size)
//	tcp.listen        data listener address (default: the RPC listener's IP, port 0)
//	tcp.devices       NICs (interface names or addresses) to publish a data
//	                  endpoint for and stripe over (default: every interface
//	                  that is up, loopback left out when there are others,
//	                  when the data listener is on the wildcard address; else
//	                  the listener's address alone)
//	tcp.dial_timeout  connect timeout (default 5s, at most tcp.timeout)
//	tcp.timeout       fail a connection whose peer sent nothing for this long
//	                  while requests are in flight (default: the engine's
//	                  ProgressTimeout, TE_PROGRESS_TIMEOUT, 10s)
//	tcp.gpu_staging   pinned host memory per connection for GPU payloads,
//	                  half per direction (default 4MiB, 64KiB to 1GiB)
//
// The connection bounds come from the engine's Config.Limits (MaxConns,
// MaxConnsPerHost, IdleTimeout, HandshakeTimeout, ProgressTimeout,
// PeerIdleTimeout), read as "limits.*" parameters.
package tcp
