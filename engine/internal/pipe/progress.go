package pipe

import (
	"bufio"
	"io"
	"net"
	"time"
)

// ProgressChunk is the amount of payload that must move within one progress
// timeout. A peer that stops reading or writing mid-payload, or trickles it
// a byte at a time, is cut off instead of holding the goroutine and the
// registered memory it touches: a deadline pushed out on every byte would
// never fire for a trickle.
const ProgressChunk = 4 << 20

// DirectRead is the size from which a payload's remainder is read straight
// from the socket into its destination rather than through the buffer, so a
// large payload is copied through the buffer for at most one buffer's worth.
const DirectRead = 16 << 10

// WriteProgress writes bufs to nc; each ProgressChunk of it must go out
// within d. chunk is scratch for the pieces of one write, returned for reuse
// with the number of bytes that reached the socket.
func WriteProgress(nc net.Conn, bufs, chunk net.Buffers, d time.Duration) (int64, net.Buffers, error) {
	var total int64
	for len(bufs) > 0 {
		chunk = chunk[:0]
		var n int
		for len(bufs) > 0 && n < ProgressChunk {
			b := bufs[0]
			if room := ProgressChunk - n; len(b) > room {
				chunk = append(chunk, b[:room])
				bufs[0] = b[room:]
				n += room
				break
			}
			chunk = append(chunk, b)
			n += len(b)
			bufs = bufs[1:]
		}
		nc.SetWriteDeadline(time.Now().Add(d))
		w := chunk // WriteTo consumes its receiver
		k, err := w.WriteTo(nc)
		total += k
		clear(chunk)
		if err != nil {
			return total, chunk[:0], err
		}
	}
	return total, chunk[:0], nil
}

// ProgressWriter is a net.Conn whose every Write gets a fresh deadline: for
// writers that write one bounded piece at a time (GPU staging chunks).
type ProgressWriter struct {
	Conn    net.Conn
	Timeout time.Duration
}

func (w ProgressWriter) Write(b []byte) (int, error) {
	w.Conn.SetWriteDeadline(time.Now().Add(w.Timeout))
	return w.Conn.Write(b)
}

// ReadProgress fills dst: first from what br already buffered, then each
// ProgressChunk of the rest must arrive within d (straight from the socket
// for remainders of DirectRead or more, with no copy through br).
func ReadProgress(br *bufio.Reader, nc net.Conn, dst []byte, d time.Duration) error {
	if n := br.Buffered(); n > 0 {
		k, _ := br.Read(dst[:min(n, len(dst))])
		dst = dst[k:]
	}
	for len(dst) > 0 {
		q := dst[:min(len(dst), ProgressChunk)]
		nc.SetReadDeadline(time.Now().Add(d))
		var err error
		if len(q) >= DirectRead {
			_, err = io.ReadFull(nc, q)
		} else {
			_, err = io.ReadFull(br, q)
		}
		if err != nil {
			return err
		}
		dst = dst[len(q):]
	}
	return nil
}

// DrainProgress reads and drops n bytes through scratch, under the progress
// rule of ReadProgress.
func DrainProgress(br *bufio.Reader, nc net.Conn, n uint64, scratch []byte, d time.Duration) error {
	for n > 0 {
		k := min(n, uint64(len(scratch)))
		if err := ReadProgress(br, nc, scratch[:k], d); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
