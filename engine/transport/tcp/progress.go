package tcp

import (
	"bufio"
	"errors"
	"io"
	"net"
	"time"
)

// progressChunk is the amount of payload that must move within one progress
// timeout. A peer that stops reading or writing mid-payload, or trickles it
// a byte at a time, is cut off instead of holding the goroutine and the
// registered memory it touches: a deadline pushed out on every byte would
// never fire for a trickle.
const progressChunk = 4 << 20

// writeProgress writes bufs to nc; each progressChunk bytes of it must go out
// within d. chunk is scratch for the pieces of one write, returned for reuse.
func writeProgress(nc net.Conn, bufs, chunk net.Buffers, d time.Duration) (net.Buffers, error) {
	for len(bufs) > 0 {
		chunk = chunk[:0]
		var n int
		for len(bufs) > 0 && n < progressChunk {
			b := bufs[0]
			if room := progressChunk - n; len(b) > room {
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
		if _, err := w.WriteTo(nc); err != nil {
			clear(chunk)
			return chunk[:0], err
		}
		clear(chunk)
	}
	return chunk[:0], nil
}

// progressWriter is a net.Conn whose every Write gets a fresh deadline: for
// the GPU staging path, which writes one staged chunk (at most a quarter
// slice) at a time.
type progressWriter struct {
	nc net.Conn
	d  time.Duration
}

func (w progressWriter) Write(b []byte) (int, error) {
	w.nc.SetWriteDeadline(time.Now().Add(w.d))
	return w.nc.Write(b)
}

// readProgress fills dst: first from what br already buffered, then each
// progressChunk of the rest must arrive within d (straight from the socket
// for large remainders, with no copy through br).
func readProgress(br *bufio.Reader, nc net.Conn, dst []byte, d time.Duration) error {
	if n := br.Buffered(); n > 0 {
		k, _ := br.Read(dst[:min(n, len(dst))])
		dst = dst[k:]
	}
	for len(dst) > 0 {
		q := dst[:min(len(dst), progressChunk)]
		nc.SetReadDeadline(time.Now().Add(d))
		var err error
		if len(q) >= directRead {
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

// cut counts a connection ended by one of its deadlines (a stalled or
// trickling peer) and passes err through.
func (t *Transport) cut(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.slowClosed.Add(1)
	}
	return err
}
