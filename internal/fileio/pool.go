package fileio

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// pool is the back end without io_uring: threads doing pread/pwrite, one
// chunk each at a time. One lock guards the queue and the ops' state.
type pool struct {
	x  *Executor
	mu sync.Mutex
	cv *sync.Cond
	q  []*Op            // ops with chunks not yet handed out
	on map[*Op]struct{} // ops not finished
	// closing: threads finish the queue (failed) and exit.
	closing bool
	wg      sync.WaitGroup
}

func newPool(x *Executor, n int) *pool {
	p := &pool{x: x, on: map[*Op]struct{}{}}
	p.cv = sync.NewCond(&p.mu)
	p.wg.Add(n)
	for i := 0; i < n; i++ {
		go p.thread()
	}
	return p
}

func (p *pool) submit(ops []*Op) {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		for _, op := range ops {
			op.err = errs.New(errs.Closed, "file", "executor closed")
			p.x.finish(op)
		}
		return
	}
	for _, op := range ops {
		p.on[op] = struct{}{}
	}
	p.q = append(p.q, ops...)
	p.mu.Unlock()
	if len(ops) == 1 && ops[0].Len <= p.x.cfg.Chunk {
		p.cv.Signal()
	} else {
		p.cv.Broadcast()
	}
}

// cancel hands out no more of ops; their chunks in pread/pwrite end on their
// own (a blocking system call is not interrupted), and then the op ends.
func (p *pool) cancel(ops []*Op) {
	var fin []*Op
	p.mu.Lock()
	for _, op := range ops {
		if _, ok := p.on[op]; !ok || op.canceled {
			continue
		}
		op.canceled = true
		if p.stop(op) {
			fin = append(fin, op)
		}
	}
	p.mu.Unlock()
	for _, op := range fin {
		p.x.finish(op)
	}
}

// stop hands out no more of op and reports whether it is over (nothing in
// flight): then the caller finishes it, outside the lock.
func (p *pool) stop(op *Op) bool {
	if op.issued < op.Len {
		op.issued = op.Len
		for i, q := range p.q {
			if q == op {
				p.q = append(p.q[:i], p.q[i+1:]...)
				break
			}
		}
	}
	if op.inflight == 0 {
		delete(p.on, op)
		return true
	}
	return false
}

func (p *pool) thread() {
	defer p.wg.Done()
	chunk := p.x.cfg.Chunk
	p.mu.Lock()
	for {
		for len(p.q) == 0 && !p.closing {
			p.cv.Wait()
		}
		if len(p.q) == 0 {
			p.mu.Unlock()
			return
		}
		op := p.q[0]
		if p.closing {
			op.err = errs.New(errs.Closed, "file", "executor closed")
			if p.stop(op) {
				p.mu.Unlock()
				p.x.finish(op)
				p.mu.Lock()
			}
			continue
		}
		n := min(chunk, op.Len-op.issued)
		addr, off := op.Addr+op.issued, op.Off+op.issued
		op.issued += n
		op.inflight++
		if op.issued >= op.Len {
			p.q = p.q[1:]
		}
		p.mu.Unlock()
		k, err := p.do(op, addr, off, n)
		p.mu.Lock()
		op.moved += k
		op.inflight--
		if err != nil && op.err == nil {
			op.err = err
		}
		if (op.err != nil || op.issued >= op.Len) && p.stop(op) {
			p.mu.Unlock()
			p.x.finish(op)
			p.mu.Lock()
		}
	}
}

// do moves one chunk, continuing short transfers.
func (p *pool) do(op *Op, addr, off, n uint64) (moved uint64, err error) {
	f := op.File
	st := &p.x.st
	for n > 0 {
		fd, direct := f.fdFor(addr, off, n)
		if direct {
			st.direct.Add(1)
		} else {
			st.buffered.Add(1)
		}
		b := mem.Bytes(addr, n)
		var k int
		for tries := 0; ; tries++ {
			if op.Write {
				k, err = unix.Pwrite(fd, b, int64(f.base+off))
			} else {
				k, err = unix.Pread(fd, b, int64(f.base+off))
			}
			if (errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN)) && tries < maxRetries {
				continue
			}
			break
		}
		switch {
		case err != nil:
			return moved, ioError(op, off, err)
		case k == 0 && op.Write:
			return moved, errs.New(errs.IO, "file", "write of %s at offset %d wrote nothing", f.path, off)
		case k == 0:
			return moved, errShort(op, off)
		case uint64(k) < n:
			st.short.Add(1)
		}
		addr, off, n = addr+uint64(k), off+uint64(k), n-uint64(k)
		moved += uint64(k)
	}
	return moved, nil
}

func (p *pool) close() {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	p.cv.Broadcast()
	p.wg.Wait()
}

// setFixed: pread/pwrite pin pages per call; there is no table to keep.
func (p *pool) setFixed([]fixedRange) error { return nil }
