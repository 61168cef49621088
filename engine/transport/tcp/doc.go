// Package tcp is te's transport over TCP: the data path of every deployment
// without RDMA.
//
// Each engine opens a data listener next to its RPC listener and publishes it
// as the "tcp" endpoint of its segment. An initiator keeps several persistent
// connections per peer ("tcp.conns"), cuts large requests into slices
// ("tcp.slice") striped over them, and keeps many requests in flight on each
// connection: one writer goroutine gathers queued requests into one writev,
// one reader goroutine matches completions by request id. Payloads are
// written from registered memory by writev and read into it straight from
// the socket; only payloads under 16 KiB, which arrive in the same read
// syscall as their headers (a 64 KiB read buffer holds about fifteen 4 KiB
// frames), are copied once out of that buffer: one memcpy instead of one
// syscall per request.
//
// The target validates every request against its registry (range inside one
// registered, remote-accessible buffer; capability key equal to the buffer's
// current key) before it touches memory, drains the payload of a refused
// WRITE, and acknowledges a WRITE only once its bytes are in memory. The
// frames are specified in engine/wire/spec.md.
//
// Parameters (engine.Config.Params):
//
//	tcp.conns         connections per peer (default: core count, at least 2)
//	tcp.slice         slice size, e.g. 512KiB (default: from the L2 cache size)
//	tcp.listen        data listener address (default: the RPC listener's IP, port 0)
//	tcp.dial_timeout  connect timeout (default 5s)
//	tcp.timeout       fail a connection whose peer sent nothing for this long
//	                  while requests are in flight (default 30s)
package tcp
