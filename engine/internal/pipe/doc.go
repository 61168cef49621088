// Package pipe is te's one pooled, pipelined connection: the initiator side
// of the tcp transport's data path (te's framing and Mooncake's) and of the
// engine's control calls.
//
// A Pool keeps, per peer address, several connections (Options.Conns) that
// callers stripe their items over. Each connection has one writer goroutine,
// which dials, runs the dialect's opening (preface, authentication) and then
// gathers whatever is queued into one write, and one reader goroutine, which
// reads replies and matches each to the item it answers: by the id the
// writer gave it, or, for an Ordered dialect (Mooncake's framing has no ids),
// to the oldest item in flight. What goes on the wire is the dialect's
// business (Encoder, Decoder): every frame of a dialect is written by its
// Encoder and read by its Decoder, nowhere else, so sealing frames is a
// change to those two and not to the pooling.
//
// The fence. An item is settled (Item.Done) exactly once, and only when
// nothing of the connection can touch its memory or send its bytes any more:
//
//   - An item whose write reads its owner's memory (Item.Holds: a WRITE's
//     payload) is the writer's while it is being written. A reply that comes
//     for it before the writer has handed all of its bytes to the socket is
//     held, not acted on: the item is settled with that reply once the
//     writer is past it, and fails with errs.Protocol if its payload never
//     left (a peer that answers a WRITE before reading it lies, or is
//     broken, and must not make te report COMPLETED while it still reads
//     local memory). A second reply for an item, or one for an id never
//     sent, ends the connection with errs.Protocol.
//   - Canceled items (Item.Canceled, then Peer.Cancel) still queued are
//     settled at once; one in flight is released: its late reply is read
//     and dropped (a payload into scratch). Where replies carry no id
//     (Ordered) an item in flight cannot be forgotten: its connection is cut
//     and the others it carried are sent again on another connection
//     (Options.Retries times at most).
//   - A reply's item is the reader's from Reader.Take to Reader.Done: a
//     payload is read into its memory by the reader only.
//   - The last of a connection's two goroutines to exit settles everything
//     still queued or in flight, after the dialect's Encoder and Decoder
//     released what they held (GPU staging rings).
//
// Bounds: at most Options.MaxInFlight items per connection are written
// before their replies come (the writer waits); a connection with items in
// flight whose peer says nothing for Options.Silence fails; a peer with no
// items for Options.PeerIdle is pruned with its connections. Frame sizes are
// the Decoder's to check before it allocates or reads a payload.
package pipe
