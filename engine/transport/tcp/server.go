package tcp

import (
	"bufio"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/internal/pipe"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/session"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

const (
	// readBufSize is the bufio size on both sides: it gathers many small
	// frames per read syscall (a 4 KiB READ's completion and payload come
	// 15 to a read); payloads of pipe.DirectRead or more bypass it, so a
	// large payload is copied through it for at most one buffer's worth.
	readBufSize = 64 << 10
	// firstReadSize is the buffer a connection's first bytes are read
	// with, before its dialect is known, and a Mooncake connection's: it
	// holds a header and a small payload (one read syscall for a 4 KiB
	// WRITE), and no more than pipe.DirectRead of a large one, whose rest
	// is read straight into memory, so at most that much is copied.
	firstReadSize = pipe.DirectRead
	// maxServerQueue bounds the completions a target holds for one
	// connection; past it the reader stops reading, so an initiator that
	// does not read its completions only stalls its own connection.
	maxServerQueue = 8192
	// drainChunk is the scratch buffer a refused WRITE's payload is read
	// into and discarded.
	drainChunk = 64 << 10
)

func (t *Transport) acceptLoop(ln net.Listener) {
	defer t.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			t.mu.Lock()
			closed := t.closed
			t.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of fds or similar: back off instead of spinning.
			t.logf("te: tcp accept: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		release, err := t.limiter.Admit(nc.RemoteAddr())
		if err != nil {
			// Told why (a few bytes into an empty socket buffer never
			// block for long), then dropped without reading anything.
			peerauth.Refuse(nc, time.Now().Add(100*time.Millisecond))
			nc.Close()
			continue
		}
		// Accepted TCP connections come with TCP_NODELAY set already.
		s := &serverConn{t: t, nc: nc, release: release}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			nc.Close()
			release()
			return
		}
		t.served[s] = struct{}{}
		t.mu.Unlock()
		if !t.hand(s) {
			s.end()
			return
		}
	}
}

// serverIdle is how long a server goroutine waits for the next accepted
// connection before it exits.
const serverIdle = 2 * time.Second

// server is a goroutine serving accepted connections one after the other,
// with its read buffer and frame writer. An initiator that opens a
// connection per request (Mooncake's default) then costs no goroutine
// start, no stack growth and no buffer per connection.
type server struct {
	first, br *bufio.Reader // firstReadSize, readBufSize
	w         frameWriter
}

// hand gives s to an idle server goroutine, or starts one; false once the
// transport is closed.
func (t *Transport) hand(s *serverConn) bool {
	select {
	case t.idle <- s:
		return true
	default:
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return false
	}
	t.wg.Add(1)
	t.mu.Unlock()
	go t.serveLoop(s)
	return true
}

func (t *Transport) serveLoop(s *serverConn) {
	defer t.wg.Done()
	sv := &server{first: bufio.NewReaderSize(nil, firstReadSize), br: bufio.NewReaderSize(nil, readBufSize)}
	idle := time.NewTimer(serverIdle)
	defer idle.Stop()
	for {
		s.serve(sv)
		idle.Reset(serverIdle)
		select {
		case s = <-t.idle:
		case <-idle.C:
			return
		case <-t.quit:
			return
		}
	}
}

func tune(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
}

// response is one completion queued for the writer; region is held (acquired)
// for a READ until its payload is written.
type response struct {
	comp   wire.Completion
	addr   uint64
	region *segment.Region
	stg    *staged // file I/O of a storage region's request (server_file.go)
}

// serverConn is the target side of one data connection: the reader executes
// requests in order, the writer sends their completions.
type serverConn struct {
	t       *Transport
	nc      net.Conn
	release func()          // the connection's slot in the listener's limiter
	seal    *session.Sealer // the session's writing half (nil: none), the writer's
	// openBy is when the preface and the exchange must both be done: one
	// deadline from the first read to the session (spec.md).
	openBy time.Time
	// pre is what the Mooncake loop read before it handed the connection
	// over (at most firstReadSize bytes), read before the socket.
	pre []byte

	// cur is the region the reader is writing a payload into, if any;
	// pushing the one a READ holds while push waits for room in the queue.
	cur, pushing atomic.Pointer[segment.Region]

	mu      sync.Mutex
	writing []response // the writer's current batch, until it releases it
	queue   []response
	closing bool          // reader finished: flush the queue, then close
	wake    chan struct{} // queue not empty or closing
	space   chan struct{} // queue drained below maxServerQueue
	done    chan struct{} // writer gone
	writer  sync.WaitGroup
}

// startWriter starts the completion writer, once the connection turned out
// to be te's: a Mooncake connection (often one per request) needs none, nor
// its channels.
func (s *serverConn) startWriter() {
	s.wake, s.space, s.done = make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	s.writer.Add(1)
	go func() {
		defer s.writer.Done()
		s.writeLoop()
	}()
}

func (s *serverConn) serve(sv *server) {
	s.readLoop(sv)
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.signal()
	s.writer.Wait()
	s.end()
}

// end closes the connection and gives back what it held.
func (s *serverConn) end() {
	s.nc.Close()
	// Whatever the writer could not send still holds regions.
	s.mu.Lock()
	rest := s.queue
	s.queue = nil
	s.mu.Unlock()
	for i := range rest {
		rest[i].drop()
	}
	s.t.mu.Lock()
	delete(s.t.served, s)
	s.t.mu.Unlock()
	s.release()
}

func (s *serverConn) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// push queues a completion, waiting while the queue is full. It reports false
// once the writer is gone. While it waits, the region r holds is in pushing,
// where Quiesce sees it: a peer that does not read its completions cannot
// hold a region being unregistered.
func (s *serverConn) push(r response) bool {
	for {
		s.mu.Lock()
		if len(s.queue) < maxServerQueue {
			s.queue = append(s.queue, r)
			s.mu.Unlock()
			s.pushing.Store(nil)
			// The wake channel holds one token: pushes made while the
			// writer is busy coalesce into its next writev.
			s.signal()
			return true
		}
		s.mu.Unlock()
		s.pushing.Store(r.region)
		select {
		case <-s.space:
		case <-s.done:
			s.pushing.Store(nil)
			r.drop()
			return false
		}
	}
}

// readHeader reads the next request header. A connection may sit idle
// between requests for the idle timeout; once a header's first byte came, the
// rest must follow within the header timeout. Bytes already buffered need no
// deadline (and no system call).
func (s *serverConn) readHeader(br *bufio.Reader, op *session.Opener, buf []byte, n int) ([]byte, error) {
	if size := int(op.Size(uint64(n))); br.Buffered() < size {
		o := &s.t.opt
		if o.Idle > 0 {
			s.nc.SetReadDeadline(time.Now().Add(o.Idle))
		} else {
			s.nc.SetReadDeadline(time.Time{})
		}
		if _, err := br.Peek(1); err != nil {
			return nil, err
		}
		if br.Buffered() < size {
			s.nc.SetReadDeadline(time.Now().Add(o.Header))
		}
	}
	return readFrame(br, op, buf, n)
}

func (s *serverConn) readLoop(sv *server) {
	br := sv.first
	if s.pre != nil {
		// Handed over by the loop (mcloop.go): what it read comes
		// first, all of it into the buffer's first fill.
		br.Reset(&prefixed{pre: s.pre, Conn: s.nc})
	} else {
		br.Reset(s.nc)
	}
	defer br.Reset(nil)
	var h [wire.DataPrefaceSize]byte
	if s.openBy.IsZero() {
		s.openBy = time.Now().Add(s.t.opt.Header)
	}
	s.nc.SetReadDeadline(s.openBy)
	if _, err := readFrame(br, nil, h[:], len(h)); err != nil {
		return
	}
	// The first bytes say the dialect: te's preface, or a Mooncake
	// initiator's first request header (mooncake.go).
	serve := s.serveTe
	if wire.LooksLikeMooncake(h[:]) {
		serve = s.serveMooncake
	}
	serve(sv, h[:])
}

// prefixed reads pre, then the connection.
type prefixed struct {
	pre []byte
	net.Conn
}

func (p *prefixed) Read(b []byte) (int, error) {
	if len(p.pre) > 0 {
		n := copy(b, p.pre)
		p.pre = p.pre[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// afterFirst is the connection as read after its first bytes: what the
// first read buffered beyond them comes before the socket's next bytes.
type afterFirst struct {
	net.Conn
	first *bufio.Reader
}

func (a afterFirst) Read(p []byte) (int, error) {
	if a.first.Buffered() > 0 {
		return a.first.Read(p)
	}
	return a.Conn.Read(p)
}

// serveTe serves a te initiator: first holds its preface. Its requests are
// read with the larger buffer, which gathers many small ones per read.
func (s *serverConn) serveTe(sv *server, first []byte) {
	if err := wire.CheckDataPreface(first); err != nil {
		return
	}
	nc := afterFirst{s.nc, sv.first}
	br := sv.br
	br.Reset(nc)
	defer br.Reset(nil)
	var hb [wire.ReqHeaderSize + session.TagSize]byte
	o, err := peerauth.ServerSession(peerauth.WithReader(nc, br), s.t.secret, s.t.instance, s.openBy,
		s.t.sessionOptions())
	if err != nil {
		if errs.CodeOf(err) == errs.Unauthenticated {
			s.t.authRefused.Add(1)
		}
		return // told why, if at all; nothing was read or touched
	}
	// The engine on the other end, for windows bound to one engine: with
	// a secret, the segment and instance its exchange proved; without one
	// nothing is known (te trusts the network then).
	by := segment.Anyone
	if s.t.secret != nil {
		by = segment.Caller{Name: o.PeerName, Instance: o.PeerInstance, Known: true}
	}
	// From here every header is a record, opened before any field of it
	// is used; a record that does not open closes the connection, and
	// nothing more is read from it.
	var op *session.Opener
	s.seal, op = o.Session.Split()
	s.startWriter()
	st := s.t.newStage()
	defer st.release()
	var scratch []byte
	progress := s.t.opt.Progress
	for {
		h, err := s.readHeader(br, op, hb[:], wire.ReqHeaderSize)
		if err != nil {
			s.t.cutRead(err)
			return
		}
		req, err := wire.DecodeDataRequest(h)
		if err != nil {
			// The stream cannot be trusted past a bad header (a WRITE's
			// payload length is unknown): answer if the request is
			// named, then close.
			if errs.CodeOf(err) == errs.TooLarge {
				s.push(response{comp: wire.Completion{Status: errs.TooLarge, ID: req.ID}})
			}
			return
		}
		status := s.check(req)
		var region *segment.Region
		if status == errs.OK {
			var err error
			region, err = s.t.reg.Acquire(req.Addr, req.Length, req.Key, true, by)
			status = errs.CodeOf(err)
			if isDevice(region) {
				// The CPU never touches device memory: without its
				// runtime there is no way to move it.
				if _, err := driverFor(region.Location.Kind); err != nil {
					region.Release()
					region, status = nil, errs.NotSupported
				}
			}
		}
		if status == errs.OK && segment.StorageOf(region) != nil {
			if !s.serveStorage(br, nc, op, req, region) { // a registered file
				return
			}
			continue
		}
		if req.Kind == wire.DataWrite {
			if status != errs.OK {
				// Never written: the payload goes through a scratch
				// buffer and is dropped.
				if scratch == nil {
					scratch = make([]byte, drainChunk)
				}
				if err := dropPayload(br, nc, op, req.Length, scratch, progress); err != nil {
					s.t.cutRead(err)
					return
				}
			} else if isDevice(region) {
				s.cur.Store(region)
				copyErr, ioErr := st.recv(br, nc, op, devOf(region), req.Addr, req.Length)
				s.cur.Store(nil)
				region.Release()
				if ioErr != nil {
					s.t.cutRead(ioErr)
					return
				}
				status = errs.CodeOf(copyErr)
			} else {
				s.cur.Store(region)
				err := readPayload(br, nc, op, mem.Bytes(req.Addr, req.Length), progress)
				s.cur.Store(nil)
				region.Release()
				if err != nil {
					s.t.cutRead(err)
					return
				}
			}
			if !s.push(response{comp: wire.Completion{Status: status, ID: req.ID}}) {
				return
			}
			continue
		}
		r := response{comp: wire.Completion{Status: status, ID: req.ID}}
		if status == errs.OK {
			r.comp.Length, r.addr, r.region = req.Length, req.Addr, region
		}
		if !s.push(r) {
			return
		}
	}
}

// holds reports whether the connection is moving bytes of r or holds r for a
// READ it has yet to send.
func (s *serverConn) holds(r *segment.Region) bool {
	if s.cur.Load().Within(r) || s.pushing.Load().Within(r) {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.queue {
		if q.region.Within(r) {
			return true
		}
	}
	for _, q := range s.writing {
		if q.region.Within(r) {
			return true
		}
	}
	return false
}

// Quiesce cuts the served connections that hold accesses to r (r refuses new
// ones already) and returns once r is idle. Other connections, and other
// regions, carry on.
func (t *Transport) Quiesce(r *segment.Region) error {
	deadline := time.Now().Add(t.opt.Progress)
	for p := 50 * time.Microsecond; !r.Idle(); p = min(2*p, 5*time.Millisecond) {
		if time.Now().After(deadline) {
			return errs.New(errs.Timeout, "tcp", "accesses to [%#x,+%d) did not end", r.Addr, r.Length)
		}
		// Scanned again each round: an access acquired just before the
		// region began closing shows up a moment later.
		t.mu.Lock()
		var cut []*serverConn
		for s := range t.served {
			if s.holds(r) {
				cut = append(cut, s)
			}
		}
		t.mu.Unlock()
		for _, s := range cut {
			s.nc.Close()
		}
		if t.loop != nil {
			t.loop.cut(r)
		}
		time.Sleep(p)
	}
	return nil
}

// check refuses what the registry would not: key 0 means "no key check" to
// the registry (local accesses), so a remote request must carry a real key.
func (s *serverConn) check(req wire.DataRequest) errs.Code {
	if req.Length == 0 {
		return errs.InvalidArgument
	}
	if req.Key == 0 {
		return errs.AccessDenied
	}
	return errs.OK
}

func (s *serverConn) writeLoop() {
	defer close(s.done)
	st := s.t.newStage()
	defer st.release()
	var spare []response
	w := frameWriter{seal: s.seal}
	for {
		<-s.wake
		s.mu.Lock()
		batch := s.queue
		if len(batch) > 0 {
			s.queue = spare[:0]
			s.writing = batch
		}
		closing := s.closing
		s.mu.Unlock()
		select {
		case s.space <- struct{}{}:
		default:
		}
		if len(batch) == 0 {
			if closing {
				return
			}
			continue
		}
		// Copies from device memory, and a storage READ's file I/O, end
		// before the region is released.
		err := w.writeCompletions(s.nc, st, batch, s.t.opt.Progress)
		s.t.cut(err)
		for i := range batch {
			batch[i].drop()
		}
		s.mu.Lock()
		s.writing = nil
		s.mu.Unlock()
		clear(batch)
		spare = batch
		if err != nil {
			// The reader notices the closed socket and ends too.
			s.nc.Close()
			s.mu.Lock()
			s.closing = true
			s.mu.Unlock()
			return
		}
		if closing {
			s.mu.Lock()
			more := len(s.queue) > 0
			s.mu.Unlock()
			if !more {
				return
			}
			s.signal()
		}
	}
}

// cutRead is cut for a read that ended a served connection; a session
// record that did not open is counted too.
func (t *Transport) cutRead(err error) error {
	if sessionErr(err) {
		t.recordsRefused.Add(1)
	}
	return t.cut(err)
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
