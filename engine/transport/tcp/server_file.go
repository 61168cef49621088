package tcp

import (
	"bufio"
	"net"
	"sync"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/session"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// Storage regions (registered files) on the target side. Their addresses are
// reserved and never mapped, so the server never touches them: a WRITE's
// payload is read from the socket into staging buffers the storage lends
// (aligned, registered with its I/O rings) and written to the file from
// there; a READ reads the file into staging buffers, and the writer sends
// them once the read ended. Either way the completion's status is the file
// I/O's (NoSpace, IO, ...), and the region stays acquired until the I/O has
// ended, so unregistering the file waits for it. The wire format does not
// change: to the initiator a file is memory that answers a little later.
//
// Staging is bounded: a connection takes buffers from the storage's pool and
// waits at most the progress timeout for one (then the request is refused
// with ResourceExhausted); a READ needing more than half the pool is refused
// with TooLarge (the initiator's tcp.slice, 1 MiB at most by default, keeps
// requests far below that).

// staged is the file I/O of one request: its buffers and outcome.
type staged struct {
	st   segment.Storage
	bufs []uint64
	size uint64 // bytes of each buffer
	n    uint64 // bytes of the request

	wg  sync.WaitGroup // moves in flight
	mu  sync.Mutex
	err error
}

func (g *staged) start(write bool, off uint64, i int, k uint64) {
	g.wg.Add(1)
	g.st.Move(write, off, g.bufs[i], k, func(err error) {
		if err != nil {
			g.mu.Lock()
			if g.err == nil {
				g.err = err
			}
			g.mu.Unlock()
		}
		g.wg.Done()
	})
}

// wait returns once no move runs, with the first error.
func (g *staged) wait() error {
	g.wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// free returns the buffers; only once wait returned.
func (g *staged) free() {
	for _, b := range g.bufs {
		g.st.Unstage(b)
	}
	g.bufs = nil
}

// payload appends the READ's bytes, buffer by buffer.
func (g *staged) payload(bufs [][]byte) [][]byte {
	left := g.n
	for _, b := range g.bufs {
		k := min(left, g.size)
		bufs = append(bufs, mem.Bytes(b, k))
		left -= k
	}
	return bufs
}

// drop ends a response that will not be sent: its I/O is waited for, then
// its buffers and region are released.
func (r *response) drop() {
	if r.stg != nil {
		r.stg.wait()
		r.stg.free()
		r.stg = nil
	}
	if r.region != nil {
		r.region.Release()
		r.region = nil
	}
}

// settleStaged waits for a staged response's file I/O before the writer
// encodes it: a failure becomes its status, with no payload.
func (r *response) settleStaged() {
	if r.stg == nil {
		return
	}
	if err := r.stg.wait(); err != nil {
		r.comp.Status, r.comp.Length = errs.CodeOf(err), 0
	}
}

// stageAbort is closed when the writer is gone or the progress timeout
// passes: how long a request may wait for a staging buffer.
func (s *serverConn) stageAbort() (<-chan struct{}, func()) {
	ch := make(chan struct{})
	tm := time.AfterFunc(s.t.opt.Progress, func() { close(ch) })
	stop := make(chan struct{})
	go func() {
		select {
		case <-s.done:
			if tm.Stop() {
				close(ch)
			}
		case <-stop:
		}
	}()
	return ch, func() { tm.Stop(); close(stop) }
}

// closedCh is closed: a Stage that must not wait.
var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// stage takes a staging buffer, waiting (see stageAbort) only when none is
// free at once.
func (s *serverConn) stage(st segment.Storage) (uint64, bool) {
	if b, ok := st.Stage(closedCh); ok {
		return b, true
	}
	abort, stop := s.stageAbort()
	defer stop()
	return st.Stage(abort)
}

// serveStorage serves one request on a storage region (acquired); it
// reports false when the connection must close.
func (s *serverConn) serveStorage(br *bufio.Reader, nc net.Conn, op *session.Opener, req wire.DataRequest, region *segment.Region) bool {
	st := segment.StorageOf(region)
	base := region.Addr
	if p := region.Parent(); p != nil {
		base = p.Addr
	}
	off := req.Addr - base
	size := st.StageSize()
	g := &staged{st: st, size: size, n: req.Length}
	refuse := func(code errs.Code) bool {
		region.Release()
		if req.Kind == wire.DataWrite {
			if err := dropPayload(br, nc, op, req.Length, make([]byte, drainChunk), s.t.opt.Progress); err != nil {
				s.t.cut(err)
				return false
			}
		}
		return s.push(response{comp: wire.Completion{Status: code, ID: req.ID}})
	}
	if req.Kind != wire.DataWrite {
		chunks := (req.Length + size - 1) / size
		if chunks > 1 && chunks > s.t.stageHalf(st) {
			return refuse(errs.TooLarge)
		}
		for i := uint64(0); i < chunks; i++ {
			b, ok := s.stage(st)
			if !ok {
				g.free()
				return refuse(errs.ResourceExhausted)
			}
			g.bufs = append(g.bufs, b)
		}
		for i := range g.bufs {
			at := uint64(i) * size
			g.start(false, off+at, i, min(size, req.Length-at))
		}
		return s.push(response{comp: wire.Completion{Status: errs.OK, ID: req.ID, Length: req.Length}, region: region, stg: g})
	}
	// WRITE: one buffer, chunk by chunk; the last chunk's write runs on
	// while the next request is read, and the writer waits for it.
	b, ok := s.stage(st)
	if !ok {
		return refuse(errs.ResourceExhausted)
	}
	g.bufs = []uint64{b}
	s.cur.Store(region)
	defer s.cur.Store(nil)
	startPayload(op, req.Length)
	for at := uint64(0); at < req.Length; at += size {
		k := min(size, req.Length-at)
		if at > 0 {
			g.wait() // the buffer's previous chunk is on its way to the file
		}
		if err := readPiece(br, nc, op, mem.Bytes(b, k), s.t.opt.Progress); err != nil {
			g.wait()
			g.free()
			region.Release()
			s.t.cut(err)
			return false
		}
		g.mu.Lock()
		failed := g.err != nil
		g.mu.Unlock()
		if !failed { // after a failure the rest is read and dropped
			g.start(true, off+at, 0, k)
		}
	}
	return s.push(response{comp: wire.Completion{Status: errs.OK, ID: req.ID}, region: region, stg: g})
}

// stageHalf is how many buffers one READ may take: half the storage's pool.
func (t *Transport) stageHalf(st segment.Storage) uint64 {
	if p, ok := st.(interface{ StageCount() int }); ok {
		return uint64(max(1, p.StageCount()/2))
	}
	return 1
}
