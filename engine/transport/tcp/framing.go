package tcp

import (
	"bufio"
	"context"
	"io"
	"net"
	"time"

	"github.com/tecache/te/engine/internal/pipe"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/session"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// te's data framing (internal/wire/spec.md, "Data connection"): requests
// with ids, answered by completions in any order. Every frame te writes goes
// out through a frameWriter, every frame header it reads comes in through
// readFrame and every payload through readPayload, readPiece or dropPayload,
// on either side and in either framing (mooncake.go). Between two engines
// with a secret they seal and open frames as the connection's session says
// ("Frames in a session"): each header one record, payloads as records in
// Integrity and Encryption modes and in the clear in Headers mode. A nil Sealer or Opener
// (no secret, a Mooncake peer) passes bytes through. GPU payloads are staged
// through them too (gpu.go).

// frameWriter gathers frames (a header, and maybe a payload in registered
// host or device memory) into one writev. Without encryption, headers are
// sealed (or not) as the frames are added, and the write is the headers and
// payloads as they are; with it, everything is sealed in wire order while
// it is sent, through one buffered writer (sendSealed).
type frameWriter struct {
	seal    *session.Sealer // nil: no session
	hdrs    []byte
	plain   []byte // a header being built, in a session without encryption
	size    int    // a header's plaintext size
	stride  int    // its size in hdrs: sealed, or plaintext for sendSealed
	n       int    // frames in this write
	bufs    net.Buffers
	devs    []devPiece
	frames  []sealedFrame // with encryption: the frames to seal and send
	chunk   net.Buffers
	start   int   // headers before start are in bufs already
	counted int   // headers before counted are in end
	end     int64 // bytes of the frames added so far, as on the wire
	err     error // a header that failed to seal

	// With encryption.
	cw  countWriter
	bw  *bufio.Writer
	rec [64]byte
	one [1]devPiece

	// In Integrity mode, a host payload in one piece goes out from where
	// it lies: its sealed header, then each record and its tag, gathered
	// into iov (sendTagged).
	iov    net.Buffers
	sealed []byte                             // the write's sealed headers (room for all, so iov's slices stay put)
	tags   [taggedTags * session.TagSize]byte // the tags in iov
	ntags  int                                // tags in iov
	queued int                                // payload bytes in iov
}

// A tagged write (sendTagged) goes out in writevs of about taggedChunk
// payload bytes, or taggedTags records: each record's tag is computed just
// before the record is handed to the kernel, which copies it while it is
// still in cache.
const (
	taggedChunk = 256 << 10
	taggedTags  = 256
)

// sealedFrame is a frame of an encrypted write: its payload is bufs[from:to]
// (host memory) or, when dev >= 0, devs[dev].
type sealedFrame struct{ from, to, dev int }

// sealedWriteBuf is the buffer an encrypted write goes out through: small
// frames share a system call, a payload goes out seven 64 KiB records at a
// time, sealed together.
const sealedWriteBuf = 512 << 10

// encrypting reports whether payloads go out as records (sealed in wire
// order through sendSealed): in Integrity and Encryption modes.
func (w *frameWriter) encrypting() bool { return w.seal.Mode().SealsPayload() }

// begin starts a write of up to n frames with headers of size bytes. Frame
// i's header is written into header(i), then added with frame(i, ...),
// deviceFrame or stagedFrame, in order.
func (w *frameWriter) begin(n, size int) {
	w.size, w.n, w.stride = size, n, size
	if w.seal != nil && !w.encrypting() {
		w.stride = int(w.seal.Size(uint64(size)))
	}
	w.hdrs = grow(w.hdrs, n*w.stride)
	w.bufs, w.devs, w.frames = w.bufs[:0], w.devs[:0], w.frames[:0]
	w.start, w.counted, w.end, w.err = 0, 0, 0, nil
}

// header returns where frame i's plaintext header goes.
func (w *frameWriter) header(i int) []byte {
	if w.stride != w.size {
		w.plain = grow(w.plain, w.size)
		return w.plain
	}
	return w.hdrs[i*w.size : (i+1)*w.size]
}

// place seals frame i's header into its slot (in a session without
// encryption) and returns where the slot ends.
func (w *frameWriter) place(i int) int {
	if w.stride != w.size {
		if _, err := w.seal.Seal(w.hdrs[i*w.stride:i*w.stride], w.plain); err != nil && w.err == nil {
			w.err = err
		}
	}
	return (i + 1) * w.stride
}

// sealedHdr is a header's wire size in an encrypted write.
func (w *frameWriter) sealedHdr() int64 { return int64(w.size + session.TagSize) }

// frame adds frame i, followed by payload (nil: none), and returns where it
// ends in the write.
func (w *frameWriter) frame(i int, payload []byte) int64 {
	if w.encrypting() {
		f := sealedFrame{from: len(w.bufs), dev: -1}
		if len(payload) > 0 {
			w.bufs = append(w.bufs, payload)
		}
		f.to = len(w.bufs)
		w.frames = append(w.frames, f)
		w.end += w.sealedHdr() + int64(session.SealedSize(uint64(len(payload))))
		return w.end
	}
	hdrEnd := w.place(i)
	w.end += int64(hdrEnd - w.counted)
	w.counted = hdrEnd
	if payload != nil {
		w.bufs = append(w.bufs, w.hdrs[w.start:hdrEnd], payload)
		w.start = hdrEnd
		w.end += int64(len(payload))
	}
	return w.end
}

// deviceFrame adds frame i, whose payload is n bytes of device dev's memory
// at addr, staged through host memory as it is sent.
func (w *frameWriter) deviceFrame(i int, dev devLoc, addr, n uint64) int64 {
	if w.encrypting() {
		w.frames = append(w.frames, sealedFrame{from: len(w.bufs), to: len(w.bufs), dev: len(w.devs)})
		w.devs = append(w.devs, devPiece{dev: dev, addr: addr, n: n})
		w.end += w.sealedHdr() + int64(session.SealedSize(n))
		return w.end
	}
	hdrEnd := w.place(i)
	w.end += int64(hdrEnd-w.counted) + int64(n)
	w.counted = hdrEnd
	w.bufs = append(w.bufs, w.hdrs[w.start:hdrEnd])
	w.devs = append(w.devs, devPiece{at: len(w.bufs), dev: dev, addr: addr, n: n})
	w.start = hdrEnd
	return w.end
}

// stagedFrame adds frame i, whose payload is a storage READ's staging
// buffers (server_file.go), in order.
func (w *frameWriter) stagedFrame(i int, g *staged) int64 {
	if w.encrypting() {
		f := sealedFrame{from: len(w.bufs), dev: -1}
		w.bufs = g.payload(w.bufs)
		f.to = len(w.bufs)
		w.frames = append(w.frames, f)
		w.end += w.sealedHdr() + int64(session.SealedSize(g.n))
		return w.end
	}
	hdrEnd := w.place(i)
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
func (w *frameWriter) send(nc net.Conn, st *stage, d time.Duration) (int64, error) {
	if w.err != nil {
		clear(w.bufs)
		return 0, w.err
	}
	if w.encrypting() {
		return w.sendSealed(nc, st, d)
	}
	hdrEnd := w.counted
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

// sendSealed writes an encrypted write: each frame's header sealed into one
// record, then its payload as records, sealed from registered memory into
// the writer's buffer (a device payload through the staging ring, then
// sealed piece by piece). Every write to the socket gets d.
func (w *frameWriter) sendSealed(nc net.Conn, st *stage, d time.Duration) (int64, error) {
	w.cw = countWriter{nc: nc, d: d}
	if w.bw == nil {
		w.bw = bufio.NewWriterSize(&w.cw, sealedWriteBuf)
	} else {
		w.bw.Reset(&w.cw)
	}
	defer clear(w.bufs)
	defer w.dropTagged()
	tagged := w.seal.Mode() == session.Integrity
	if tagged {
		w.sealed = grow(w.sealed, len(w.frames)*int(w.sealedHdr()))[:0]
	}
	for i, f := range w.frames {
		hdr := w.hdrs[i*w.size : (i+1)*w.size]
		if tagged && f.dev < 0 && f.to-f.from == 1 {
			if err := w.sendTagged(hdr, w.bufs[f.from]); err != nil {
				return w.cw.n, err
			}
			continue
		}
		// Through the buffered writer, after what sendTagged gathered.
		if err := w.flushTagged(); err != nil {
			return w.cw.n, err
		}
		rec, err := w.seal.Seal(w.rec[:0], hdr)
		if err != nil {
			return w.cw.n, err
		}
		if _, err := w.bw.Write(rec); err != nil {
			return w.cw.n, err
		}
		switch {
		case f.dev >= 0:
			p := w.devs[f.dev]
			w.seal.StartPayload(p.n)
			w.one[0] = p
			if _, err := st.write(pieceWriter{w.seal, w.bw}, nil, w.one[:]); err != nil {
				return w.cw.n, err
			}
		case f.to-f.from == 1:
			// One piece: sealed straight into the buffer, as many records
			// at a time as fit (Seal may spread them over cores).
			for p := w.bufs[f.from]; len(p) > 0; {
				if w.bw.Available() < min(len(p), session.RecordSize)+session.TagSize {
					if err := w.bw.Flush(); err != nil {
						return w.cw.n, err
					}
				}
				k := min(len(p), w.bw.Available()/(session.RecordSize+session.TagSize)*session.RecordSize)
				if k == 0 {
					k = len(p) // a last record shorter than RecordSize, which fits
				}
				out, err := w.seal.Seal(w.bw.AvailableBuffer(), p[:k])
				if err != nil {
					return w.cw.n, err
				}
				if _, err := w.bw.Write(out); err != nil {
					return w.cw.n, err
				}
				p = p[k:]
			}
		case f.to > f.from:
			var n uint64
			for _, b := range w.bufs[f.from:f.to] {
				n += uint64(len(b))
			}
			w.seal.StartPayload(n)
			for _, b := range w.bufs[f.from:f.to] {
				if err := w.seal.WritePiece(w.bw, b, nil); err != nil {
					return w.cw.n, err
				}
			}
		}
	}
	if err := w.flushTagged(); err != nil {
		return w.cw.n, err
	}
	err := w.bw.Flush()
	w.bw.Reset(nil)
	return w.cw.n, err
}

// sendTagged adds an Integrity frame whose payload p is one piece of host
// memory: its header sealed into w.sealed, then each record of p as it is,
// followed by its tag. Nothing is copied: the kernel reads the payload
// from registered memory, where it is read for the tag too.
func (w *frameWriter) sendTagged(hdr, p []byte) error {
	if w.bw.Buffered() > 0 {
		// Earlier frames went through the buffered writer: they go first.
		if err := w.bw.Flush(); err != nil {
			return err
		}
	}
	at := len(w.sealed)
	var err error
	if w.sealed, err = w.seal.Seal(w.sealed, hdr); err != nil {
		return err
	}
	w.iov = append(w.iov, w.sealed[at:])
	for len(p) > 0 {
		// The next run of records: what fits in this writev.
		k := min(len(p), taggedChunk-w.queued, (taggedTags-w.ntags)*session.RecordSize)
		if k <= 0 {
			if err := w.flushTagged(); err != nil {
				return err
			}
			continue
		}
		if k < len(p) {
			k -= k % session.RecordSize // a run ends at a record's end
			if k == 0 {
				if err := w.flushTagged(); err != nil {
					return err
				}
				continue
			}
		}
		at := w.ntags * session.TagSize
		tags, err := w.seal.Tags(w.tags[at:at], p[:k])
		if err != nil {
			return err
		}
		for run := p[:k]; len(run) > 0; {
			r := min(len(run), session.RecordSize)
			w.iov = append(w.iov, run[:r], tags[:session.TagSize])
			run, tags = run[r:], tags[session.TagSize:]
			w.ntags++
		}
		w.queued += k
		p = p[k:]
		if w.queued >= taggedChunk {
			if err := w.flushTagged(); err != nil {
				return err
			}
		}
	}
	return nil
}

// flushTagged writes what sendTagged gathered with one writev, within d.
func (w *frameWriter) flushTagged() error {
	if len(w.iov) == 0 {
		return nil
	}
	w.cw.nc.SetWriteDeadline(time.Now().Add(w.cw.d))
	iov := w.iov // WriteTo consumes its receiver
	n, err := iov.WriteTo(w.cw.nc)
	w.cw.n += n
	w.dropTagged()
	return err
}

// dropTagged forgets what sendTagged gathered (sent, or the write failed).
func (w *frameWriter) dropTagged() {
	clear(w.iov)
	w.iov, w.ntags, w.queued = w.iov[:0], 0, 0
}

// countWriter writes to the socket, each write within d, and counts what
// reached it.
type countWriter struct {
	nc net.Conn
	d  time.Duration
	n  int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	c.nc.SetWriteDeadline(time.Now().Add(c.d))
	k, err := c.nc.Write(b)
	c.n += int64(k)
	return k, err
}

// pieceWriter seals a device payload's host chunks as they come out of the
// staging ring (Sealer.StartPayload was called).
type pieceWriter struct {
	s *session.Sealer
	w io.Writer
}

func (p pieceWriter) Write(b []byte) (int, error) {
	if err := p.s.WritePiece(p.w, b, nil); err != nil {
		return 0, err
	}
	return len(b), nil
}

// readFrame reads a frame header of n plaintext bytes into buf (which holds
// op.Size(n)) and returns it, opened in a session: no field of it is used
// before its record opened.
func readFrame(r io.Reader, op *session.Opener, buf []byte, n int) ([]byte, error) {
	return op.ReadRecord(r, buf, n)
}

// progress returns the hook that gives each next piece of a payload read
// through br d to arrive, unless it is buffered already.
func progress(br *bufio.Reader, nc net.Conn, d time.Duration) func(int) {
	return func(size int) {
		if br.Buffered() < size {
			nc.SetReadDeadline(time.Now().Add(d))
		}
	}
}

// readPayload reads a frame's payload into dst, each 4 MiB within d: first
// what br buffered, then large remainders straight from the socket. With
// encryption each record is read into the Opener's buffer and copied into
// dst only once it opened.
func readPayload(br *bufio.Reader, nc net.Conn, op *session.Opener, dst []byte, d time.Duration) error {
	if op.Mode().SealsPayload() {
		return op.ReadPayload(br, dst, progress(br, nc, d))
	}
	return pipe.ReadProgress(br, nc, dst, d)
}

// startPayload begins a payload of n bytes read with readPiece.
func startPayload(op *session.Opener, n uint64) {
	if op.Mode().SealsPayload() {
		op.StartPayload(n)
	}
}

// readPiece reads the next len(dst) bytes of a payload begun with
// startPayload (a payload read in chunks: staged for a GPU, a file).
func readPiece(br *bufio.Reader, nc net.Conn, op *session.Opener, dst []byte, d time.Duration) error {
	if op.Mode().SealsPayload() {
		return op.ReadPiece(br, dst, progress(br, nc, d))
	}
	return pipe.ReadProgress(br, nc, dst, d)
}

// dropPayload reads a frame's n payload bytes through scratch and drops
// them (a refused WRITE's, a canceled READ's), under the same bound; with
// encryption its records are opened all the same.
func dropPayload(br *bufio.Reader, nc net.Conn, op *session.Opener, n uint64, scratch []byte, d time.Duration) error {
	if op.Mode().SealsPayload() {
		return op.DiscardPayload(br, n, progress(br, nc, d))
	}
	return pipe.DrainProgress(br, nc, n, scratch, d)
}

// sessionErr reports whether err is the session's refusal of a record (or
// a malformed one): the connection fails with it as it is, not as lost.
func sessionErr(err error) bool {
	switch errs.CodeOf(err) {
	case errs.Unauthenticated, errs.Protocol:
		return true
	}
	return false
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
	inst, sess, err := d.t.clientHello(nc, addr)
	if err != nil {
		return nil, nil, err
	}
	seal, op := sess.Split()
	admit := func(it item) error {
		// The endpoint may serve another engine now (it restarted, or
		// the descriptor was rewritten): a request built for the old
		// one is refused.
		if it.op.inst != "" && it.op.inst != inst {
			return errs.Wrap(errs.StaleDescriptor, "tcp", errWrongEngine, "%s is now engine %s, not %s", addr, inst, it.op.inst)
		}
		return nil
	}
	return &requests{t: d.t, size: wire.ReqHeaderSize, put: putTeRequest, admit: admit, st: d.t.newStage(), w: frameWriter{seal: seal}},
		&teCompletions{t: d.t, st: d.t.newStage(), op: op}, nil
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
	e.w.begin(len(out), e.size)
	for i := range out {
		it := out[i].Item
		local := it.op.local + it.off
		e.put(e.w.header(i), out[i].ID, it)
		switch {
		case !it.op.write:
			out[i].End = e.w.frame(i, nil)
		case it.op.gpu.device():
			out[i].End = e.w.deviceFrame(i, it.op.gpu, local, it.n)
		default:
			out[i].End = e.w.frame(i, mem.Bytes(local, it.n))
		}
	}
	return e.w.send(nc, e.st, e.t.opt.Progress)
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
	op      *session.Opener // nil: no session
	h       [wire.CompHeaderSize + session.TagSize]byte
	scratch []byte
}

// fail is the error a read failure ends the connection with.
func (d *teCompletions) fail(r *pipe.Reader[item], err error) error {
	if sessionErr(err) {
		d.t.recordsRefused.Add(1)
		return errs.Wrap(errs.CodeOf(err), "tcp", err, "data connection to %s", r.Addr())
	}
	return r.Lost(err)
}

func (d *teCompletions) Decode(r *pipe.Reader[item]) error {
	h, err := readFrame(r.Buf(), d.op, d.h[:], wire.CompHeaderSize)
	if err != nil {
		return d.fail(r, err)
	}
	comp, err := wire.DecodeCompletion(h)
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
			if err := dropPayload(r.Buf(), r.Conn(), d.op, want, d.scratch, progress); err != nil {
				return d.fail(r, err)
			}
		}
		return nil
	}
	if comp.Status != errs.OK {
		if o.window && comp.Status == errs.AccessDenied {
			r.Done(s, errs.New(comp.Status, "tcp", "%s refused %v of [%#x,+%d) under window %#x: the window is bound to another engine, "+
				"does not cover the range, or was revoked", r.Addr(), o.opcode(), o.remote+it.off, it.n, o.key))
			return nil
		}
		r.Done(s, errs.New(comp.Status, "tcp", "%s refused %v of [%#x,+%d)", r.Addr(), o.opcode(), o.remote+it.off, it.n))
		return nil
	}
	if want > 0 && o.gpu.device() {
		copyErr, ioErr := d.st.recv(r.Buf(), r.Conn(), d.op, o.gpu, o.local+it.off, want)
		r.Moved()
		if ioErr != nil {
			return d.fail(r, ioErr)
		}
		if copyErr != nil {
			r.Done(s, errs.Wrap(errs.CodeOf(copyErr), "tcp", copyErr, "stage %d bytes into GPU memory at %#x", want, o.local+it.off))
			return nil
		}
	} else if want > 0 {
		r.Moved()
		if err := readPayload(r.Buf(), r.Conn(), d.op, mem.Bytes(o.local+it.off, want), progress); err != nil {
			return d.fail(r, err)
		}
	}
	r.Done(s, nil)
	return nil
}

func (d *teCompletions) Close() { d.st.release() }

// writeCompletions is the target's side: it writes completions, each READ's
// followed by its payload, and returns once no payload is read any more.
func (w *frameWriter) writeCompletions(nc net.Conn, st *stage, batch []response, d time.Duration) error {
	w.begin(len(batch), wire.CompHeaderSize)
	for i := range batch {
		batch[i].settleStaged() // a storage READ's file I/O: its status, maybe a failure
		wire.PutCompletion(w.header(i), batch[i].comp)
		switch g := batch[i].region; {
		case batch[i].stg != nil:
			if batch[i].comp.Status == errs.OK && batch[i].comp.Length > 0 {
				w.stagedFrame(i, batch[i].stg)
			} else {
				w.frame(i, nil)
			}
		case g == nil:
			w.frame(i, nil)
		case isDevice(g):
			w.deviceFrame(i, devOf(g), batch[i].addr, batch[i].comp.Length)
		default:
			w.frame(i, mem.Bytes(batch[i].addr, batch[i].comp.Length))
		}
	}
	_, err := w.send(nc, st, d)
	return err
}
