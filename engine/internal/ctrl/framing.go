package ctrl

import (
	"bufio"
	"encoding/binary"
	"time"

	"github.com/tecache/te/internal/wire"
)

// The control framing (internal/wire/spec.md, "Frame" and "Call"): a frame
// header (length, kind) and a call header (id, flags) before each payload,
// requests and replies alike. Calls and replies are put on the wire with
// putCallHeader and read with readFrameHeader and readBody, on both sides:
// sealing frames later is a change here. Mooncake's handshake frames
// (mooncake.go) have the frame header only.

// callFrameHeader is the size of the headers before a call's payload.
const callFrameHeader = wire.FrameHeaderSize + wire.CallHeaderSize

// putCallHeader writes into h the headers of a call of kind with id, flags
// and a payload of n bytes.
func putCallHeader(h []byte, kind uint8, id uint64, flags uint8, n int) {
	_ = h[callFrameHeader-1]
	binary.LittleEndian.PutUint64(h[wire.OffFrameLength:], uint64(1+wire.CallHeaderSize+n))
	h[wire.OffFrameKind] = kind
	binary.LittleEndian.PutUint64(h[wire.FrameHeaderSize+wire.OffCallID:], id)
	h[wire.FrameHeaderSize+wire.OffCallFlags] = flags
}

// readFrameHeader reads a frame header; once its first byte came, the rest
// must follow within d (bytes already buffered need no deadline).
func readFrameHeader(br *bufio.Reader, dl deadliner, d time.Duration) (uint8, uint64, error) {
	if br.Buffered() < wire.FrameHeaderSize {
		dl.SetReadDeadline(time.Now().Add(d))
	}
	return wire.ReadFrameHeader(br)
}

// readBody reads an n-byte body, each BodyChunk of it within d.
func readBody(br *bufio.Reader, dl deadliner, n uint64, d time.Duration) ([]byte, error) {
	return wire.ReadBody(br, n, func(size int) {
		if br.Buffered() < size {
			dl.SetReadDeadline(time.Now().Add(d))
		}
	})
}

type deadliner interface{ SetReadDeadline(time.Time) error }
