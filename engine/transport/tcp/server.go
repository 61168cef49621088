package tcp

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/wire"
	"github.com/tecache/te/internal/sys/mem"
)

const (
	// readBufSize is the bufio size on both sides: it gathers many small
	// frames per read syscall (a 4 KiB READ's completion and payload come
	// 15 to a read); payloads of directRead or more bypass it, so a large
	// payload is copied through it for at most one buffer's worth.
	readBufSize = 64 << 10
	directRead  = 16 << 10
	// maxServerQueue bounds the completions a target holds for one
	// connection; past it the reader stops reading, so an initiator that
	// does not read its completions only stalls its own connection.
	maxServerQueue = 8192
	// prefaceTimeout bounds how long an accepted connection may stay silent.
	prefaceTimeout = 10 * time.Second
	// drainChunk is the scratch buffer a refused WRITE's payload is read
	// into and discarded.
	drainChunk = 64 << 10
)

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	for {
		nc, err := t.ln.Accept()
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
		tune(nc)
		s := &serverConn{t: t, nc: nc, wake: make(chan struct{}, 1), space: make(chan struct{}, 1), done: make(chan struct{})}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			nc.Close()
			return
		}
		t.served[s] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go s.serve()
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
}

// serverConn is the target side of one data connection: the reader executes
// requests in order, the writer sends their completions.
type serverConn struct {
	t  *Transport
	nc net.Conn

	mu      sync.Mutex
	queue   []response
	closing bool          // reader finished: flush the queue, then close
	wake    chan struct{} // queue not empty or closing
	space   chan struct{} // queue drained below maxServerQueue
	done    chan struct{} // writer gone
}

func (s *serverConn) serve() {
	defer s.t.wg.Done()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.writeLoop()
	}()
	s.readLoop()
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.signal()
	wg.Wait()
	s.nc.Close()
	// Whatever the writer could not send still holds regions.
	s.mu.Lock()
	rest := s.queue
	s.queue = nil
	s.mu.Unlock()
	for _, r := range rest {
		if r.region != nil {
			r.region.Release()
		}
	}
	s.t.mu.Lock()
	delete(s.t.served, s)
	s.t.mu.Unlock()
}

func (s *serverConn) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// push queues a completion, waiting while the queue is full. It reports false
// once the writer is gone.
func (s *serverConn) push(r response) bool {
	for {
		s.mu.Lock()
		if len(s.queue) < maxServerQueue {
			s.queue = append(s.queue, r)
			s.mu.Unlock()
			// The wake channel holds one token: pushes made while the
			// writer is busy coalesce into its next writev.
			s.signal()
			return true
		}
		s.mu.Unlock()
		select {
		case <-s.space:
		case <-s.done:
			if r.region != nil {
				r.region.Release()
			}
			return false
		}
	}
}

func (s *serverConn) readLoop() {
	br := bufio.NewReaderSize(s.nc, readBufSize)
	var h [wire.ReqHeaderSize]byte
	s.nc.SetReadDeadline(time.Now().Add(prefaceTimeout))
	if _, err := io.ReadFull(br, h[:wire.DataPrefaceSize]); err != nil {
		return
	}
	if err := wire.CheckDataPreface(h[:wire.DataPrefaceSize]); err != nil {
		return
	}
	s.nc.SetReadDeadline(time.Time{})
	st := s.t.newStage()
	defer st.release()
	var scratch []byte
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return
		}
		req, err := wire.DecodeDataRequest(h[:])
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
			region, err = s.t.reg.Acquire(req.Addr, req.Length, req.Key, true)
			status = errs.CodeOf(err)
			if isDevice(region) {
				// The CPU never touches device memory: without CUDA
				// there is no way to move it.
				if _, err := cudaLoad(); err != nil {
					region.Release()
					region, status = nil, errs.NotSupported
				}
			}
		}
		if req.Kind == wire.DataWrite {
			if status != errs.OK {
				// Never written: the payload goes through a scratch
				// buffer and is dropped.
				if scratch == nil {
					scratch = make([]byte, drainChunk)
				}
				if err := drain(br, req.Length, scratch); err != nil {
					return
				}
			} else if isDevice(region) {
				copyErr, ioErr := st.recv(br, s.nc, region.Location.Index, req.Addr, req.Length)
				region.Release()
				if ioErr != nil {
					return
				}
				status = errs.CodeOf(copyErr)
			} else {
				err := readFull(br, s.nc, mem.Bytes(req.Addr, req.Length))
				region.Release()
				if err != nil {
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

func drain(br *bufio.Reader, n uint64, scratch []byte) error {
	for n > 0 {
		k := min(n, uint64(len(scratch)))
		if _, err := io.ReadFull(br, scratch[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// readFull fills dst: first from what br already buffered, then straight
// from the socket for large remainders (no copy through br), else through br.
func readFull(br *bufio.Reader, nc net.Conn, dst []byte) error {
	if n := br.Buffered(); n > 0 {
		k, _ := br.Read(dst[:min(n, len(dst))])
		dst = dst[k:]
	}
	if len(dst) == 0 {
		return nil
	}
	var err error
	if len(dst) >= directRead {
		_, err = io.ReadFull(nc, dst)
	} else {
		_, err = io.ReadFull(br, dst)
	}
	return err
}

func (s *serverConn) writeLoop() {
	defer close(s.done)
	st := s.t.newStage()
	defer st.release()
	var spare []response
	var hdrs []byte
	var bufs net.Buffers
	var devs []devPiece
	for {
		<-s.wake
		s.mu.Lock()
		batch := s.queue
		if len(batch) > 0 {
			s.queue = spare[:0]
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
		hdrs = grow(hdrs, len(batch)*wire.CompHeaderSize)
		bufs, devs = bufs[:0], devs[:0]
		start := 0
		for i := range batch {
			off := i * wire.CompHeaderSize
			wire.PutCompletion(hdrs[off:], batch[i].comp)
			if g := batch[i].region; isDevice(g) {
				bufs = append(bufs, hdrs[start:off+wire.CompHeaderSize])
				devs = append(devs, devPiece{at: len(bufs), dev: g.Location.Index, addr: batch[i].addr, n: batch[i].comp.Length})
				start = off + wire.CompHeaderSize
			} else if batch[i].region != nil {
				bufs = append(bufs, hdrs[start:off+wire.CompHeaderSize], mem.Bytes(batch[i].addr, batch[i].comp.Length))
				start = off + wire.CompHeaderSize
			}
		}
		if end := len(batch) * wire.CompHeaderSize; start < end {
			bufs = append(bufs, hdrs[start:end])
		}
		var err error
		if len(devs) > 0 {
			// Copies from device memory end before its region is released.
			err = st.write(s.nc, bufs, devs)
		} else {
			w := bufs // WriteTo consumes its receiver
			_, err = w.WriteTo(s.nc)
		}
		for i := range batch {
			if batch[i].region != nil {
				batch[i].region.Release()
			}
			batch[i] = response{}
		}
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

// grow returns b resized to n bytes, reallocating only when it is too small.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n, n+n/2)
	}
	return b[:n]
}
