// Package ctrl is an engine's control plane: one listener serving the
// engine's and its transports' message kinds (descriptor fetch, notify,
// probe, handshakes), and calls to peers' listeners over pooled, pipelined
// connections (internal/pipe). The engine keeps the handlers; this package
// keeps the connections, their framing and their bounds.
//
// Every connection, accepted or dialled, opens with peerauth's exchange, and
// every resource a peer can make the plane hold is bounded
// (internal/wire/spec.md, "Resource bounds"): connections per listener and
// per address, the handshake and idle deadlines, each body's progress, calls
// in flight per connection and in all, frame sizes per kind, and bytes a
// handler keeps (a Reserver admits a body before it is read).
//
// A call that was handled is answered: Close stops reading new calls, lets
// those running reply, and only then closes the connections, so a peer is
// never told "connection lost" about a call (a notification, say) whose
// effect already happened.
//
// Mooncake Transfer Engine's peer-to-peer handshake is a second dialect of
// the same frames (mooncake.go): one exchange per connection, a JSON body,
// no call header. A connection that opens with one is served by the handler
// of its kind when Options.Mooncake allows it; ExchangeMooncake calls a
// Mooncake peer so.
package ctrl
