package tcp

import (
	"bufio"
	"context"
	"io"
	"net"
	"time"

	"github.com/tecache/te/engine/internal/pipe"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// te's data framing (internal/wire/spec.md, "Data connection"): requests
// with ids, answered by completions in any order. Every frame te writes goes
// out through a frameWriter, every frame header it reads comes in through
// readFrame and every payload through readPayload (or dropPayload), on
// either side and in either framing (mooncake.go): sealing and opening
// frames (a MAC over each header, payloads encrypted) is a change to these
// four, not to the pooling (internal/pipe) or the owner-side checks
// (server.go). GPU payloads are staged through them too (gpu.go).

// frameWriter gathers frames (a header, and maybe a payload in registered
// host or device memory) into one writev.
type frameWriter struct {
	hdrs    []byte
	bufs    net.Buffers
	devs    []devPiece
	chunk   net.Buffers
	start   int   // headers before start are in bufs already
	counted int   // headers before counted are in end
	end     int64 // bytes of the frames added so far
}

// begin starts a write of up to n frames with headers of size bytes and
// returns the header space: frame i's header is at [i*size, (i+1)*size).
func (w *frameWriter) begin(n, size int) []byte {
	w.hdrs = grow(w.hdrs, n*size)
	w.bufs, w.devs = w.bufs[:0], w.devs[:0]
	w.start, w.counted, w.end = 0, 0, 0
	return w.hdrs
}

// frame adds the frame whose header ends at hdrEnd in the header space,
// followed by payload (nil: none), and returns where it ends in the write.
func (w *frameWriter) frame(hdrEnd int, payload []byte) int64 {
	w.end += int64(hdrEnd - w.counted)
	w.counted = hdrEnd
	if payload != nil {
		w.bufs = append(w.bufs, w.hdrs[w.start:hdrEnd], payload)
		w.start = hdrEnd
		w.end += int64(len(payload))
	}
	return w.end
}

// deviceFrame adds a frame whose payload is n bytes of device dev's memory
// at addr, staged through host memory as it is sent.
func (w *frameWriter) deviceFrame(hdrEnd, dev int, addr, n uint64) int64 {
	w.end += int64(hdrEnd-w.counted) + int64(n)
	w.counted = hdrEnd
	w.bufs = append(w.bufs, w.hdrs[w.start:hdrEnd])
	w.devs = append(w.devs, devPiece{at: len(w.bufs), dev: dev, addr: addr, n: n})
	w.start = hdrEnd
	return w.end
}

// stagedFrame adds a frame whose payload is a storage READ's staging
// buffers (server_file.go), in order.
func (w *frameWriter) stagedFrame(hdrEnd int, g *staged) int64 {
	w.end += int64(hdrEnd-w.counted) + int64(g.n)
	w.counted = hdrEnd
	w.bufs = append(w.bufs, w.hdrs[w.start:hdrEnd])
	w.bufs = g.payload(w.bufs)
	w.start = hdrEnd
	return w.end
}

// send writes the frames added, each 4 MiB within d, and returns how many
// bytes reached the socket. It returns only once no payload is read any
// more (device copies included).
func (w *frameWriter) send(nc net.Conn, st *stage, hdrEnd int, d time.Duration) (int64, error) {
	if w.start < hdrEnd {
		w.bufs = append(w.bufs, w.hdrs[w.start:hdrEnd])
	}
	var n int64
	var err error
	if len(w.devs) > 0 {
		n, err = st.write(pipe.ProgressWriter{Conn: nc, Timeout: d}, w.bufs, w.devs)
	} else {
		n, w.chunk, err = pipe.WriteProgress(nc, w.bufs, w.chunk, d)
	}
	clear(w.bufs)
	return n, err
}

// readFrame reads a frame header into h.
func readFrame(r io.Reader, h []byte) error {
	_, err := io.ReadFull(r, h)
	return err
}

// readPayload reads a frame's payload into dst, each 4 MiB within d: first
// what br buffered, then large remainders straight from the socket.
func readPayload(br *bufio.Reader, nc net.Conn, dst []byte, d time.Duration) error {
	return pipe.ReadProgress(br, nc, dst, d)
}

// dropPayload reads a frame's n payload bytes through scratch and drops
// them (a refused WRITE's, a canceled READ's), under the same bound.
func dropPayload(br *bufio.Reader, nc net.Conn, n uint64, scratch []byte, d time.Duration) error {
	return pipe.DrainProgress(br, nc, n, scratch, d)
}

// grow returns b resized to n bytes, reallocating only when it is too small.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n, n+n/2)
	}
	return b[:n]
}

// teDialect is te's framing on the initiator side.
type teDialect struct{ t *Transport }

func (d teDialect) Dial(ctx context.Context, addr string) (net.Conn, error) {
	return d.t.dial(ctx, addr, "")
}

// Open sends the preface and runs the authentication exchange; the peer's
// proven instance decides which requests may go on the connection.
func (d teDialect) Open(nc net.Conn, addr string) (pipe.Encoder[item], pipe.Decoder[item], error) {
	inst, err := d.t.clientHello(nc, addr)
	if err != nil {
		return nil, nil, err
	}
	admit := func(it item) error {
		// The endpoint may serve another engine now (it restarted, or
		// the descriptor was rewritten): a request built for the old
		// one is refused.
		if it.op.inst != "" && it.op.inst != inst {
			return errs.New(errs.StaleDescriptor, "tcp", "%s is now engine %s, not %s", addr, inst, it.op.inst)
		}
		return nil
	}
	return &requests{t: d.t, size: wire.ReqHeaderSize, put: putTeRequest, admit: admit, st: d.t.newStage()},
		&teCompletions{t: d.t, st: d.t.newStage()}, nil
}

func putTeRequest(h []byte, id uint64, it item) {
	kind := wire.DataRead
	if it.op.write {
		kind = wire.DataWrite
	}
	wire.PutDataRequest(h, wire.DataRequest{Kind: kind, ID: id, Addr: it.op.remote + it.off, Length: it.n, Key: it.op.key})
}

// requests writes request frames of one framing (its header size and put),
// each WRITE's followed by its payload from local memory.
type requests struct {
	t     *Transport
	size  int
	put   func(h []byte, id uint64, it item)
	admit func(it item) error
	st    *stage
	w     frameWriter
}

func (e *requests) Admit(it item) error {
	if e.admit == nil {
		return nil
	}
	return e.admit(it)
}

func (e *requests) Encode(nc net.Conn, out []pipe.Out[item]) (int64, error) {
	hdrs := e.w.begin(len(out), e.size)
	for i := range out {
		it := out[i].Item
		local := it.op.local + it.off
		end := (i + 1) * e.size
		e.put(hdrs[end-e.size:end], out[i].ID, it)
		switch {
		case !it.op.write:
			out[i].End = e.w.frame(end, nil)
		case it.op.gpu > 0:
			out[i].End = e.w.deviceFrame(end, it.op.gpu-1, local, it.n)
		default:
			out[i].End = e.w.frame(end, mem.Bytes(local, it.n))
		}
	}
	return e.w.send(nc, e.st, len(out)*e.size, e.t.opt.Progress)
}

func (e *requests) Close() {
	if e.st != nil {
		e.st.release()
	}
}

// teCompletions reads completion frames and READ payloads.
type teCompletions struct {
	t       *Transport
	st      *stage
	h       [wire.CompHeaderSize]byte
	scratch []byte
}

func (d *teCompletions) Decode(r *pipe.Reader[item]) error {
	if err := readFrame(r.Buf(), d.h[:]); err != nil {
		return r.Lost(err)
	}
	comp, err := wire.DecodeCompletion(d.h[:])
	if err != nil {
		return errs.Wrap(errs.Protocol, "tcp", err, "from %s", r.Addr())
	}
	s, err := r.Take(comp.ID)
	if err != nil {
		return err
	}
	it := s.Item
	o := it.op
	want := uint64(0)
	if !o.write && comp.Status == errs.OK {
		want = it.n
	}
	if comp.Length != want {
		err := errs.New(errs.Protocol, "tcp", "%s answered %d bytes for a request of %d", r.Addr(), comp.Length, it.n)
		r.Done(s, err)
		return err
	}
	progress := d.t.opt.Progress
	if s.Released() {
		// Canceled: its completion is dropped, its payload read into
		// scratch.
		if want > 0 {
			if d.scratch == nil {
				d.scratch = make([]byte, drainChunk)
			}
			r.Moved()
			if err := dropPayload(r.Buf(), r.Conn(), want, d.scratch, progress); err != nil {
				return r.Lost(err)
			}
		}
		return nil
	}
	if comp.Status != errs.OK {
		r.Done(s, errs.New(comp.Status, "tcp", "%s refused %v of [%#x,+%d)", r.Addr(), o.opcode(), o.remote+it.off, it.n))
		return nil
	}
	if want > 0 && o.gpu > 0 {
		copyErr, ioErr := d.st.recv(r.Buf(), r.Conn(), o.gpu-1, o.local+it.off, want)
		r.Moved()
		if ioErr != nil {
			return r.Lost(ioErr)
		}
		if copyErr != nil {
			r.Done(s, errs.Wrap(errs.CodeOf(copyErr), "tcp", copyErr, "stage %d bytes into GPU memory at %#x", want, o.local+it.off))
			return nil
		}
	} else if want > 0 {
		r.Moved()
		if err := readPayload(r.Buf(), r.Conn(), mem.Bytes(o.local+it.off, want), progress); err != nil {
			return r.Lost(err)
		}
	}
	r.Done(s, nil)
	return nil
}

func (d *teCompletions) Close() { d.st.release() }

// writeCompletions is the target's side: it writes completions, each READ's
// followed by its payload, and returns once no payload is read any more.
func (w *frameWriter) writeCompletions(nc net.Conn, st *stage, batch []response, d time.Duration) error {
	hdrs := w.begin(len(batch), wire.CompHeaderSize)
	for i := range batch {
		end := (i + 1) * wire.CompHeaderSize
		batch[i].settleStaged() // a storage READ's file I/O: its status, maybe a failure
		wire.PutCompletion(hdrs[end-wire.CompHeaderSize:], batch[i].comp)
		switch g := batch[i].region; {
		case batch[i].stg != nil:
			if batch[i].comp.Status == errs.OK && batch[i].comp.Length > 0 {
				w.stagedFrame(end, batch[i].stg)
			} else {
				w.frame(end, nil)
			}
		case g == nil:
			w.frame(end, nil)
		case isDevice(g):
			w.deviceFrame(end, g.Location.Index, batch[i].addr, batch[i].comp.Length)
		default:
			w.frame(end, mem.Bytes(batch[i].addr, batch[i].comp.Length))
		}
	}
	_, err := w.send(nc, st, len(batch)*wire.CompHeaderSize, d)
	return err
}
