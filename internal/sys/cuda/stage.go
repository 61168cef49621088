package cuda

import (
	"sync"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// Stager moves GPU memory through a ring of pinned host chunks, for
// transports that can only read and write host memory (tcp, shm): copy chunk
// i+1 on the stream while chunk i is on the wire. Each chunk has an event,
// so waiting for one chunk does not wait for the others. A Stager is not
// safe for concurrent use; use one per connection or worker.
type Stager struct {
	l      *Lib
	dev    Device
	ctx    Context
	stream Stream
	chunk  uint64
	bufs   []uint64 // pinned host memory, one chunk each
	events []Event
}

// NewStager retains the primary context of device ordinal and allocates
// depth pinned chunks of chunk bytes, a stream and an event per chunk.
func NewStager(l *Lib, ordinal int, chunk uint64, depth int) (*Stager, error) {
	if chunk == 0 || depth < 1 || depth > 64 {
		return nil, errs.New(errs.InvalidArgument, "cuda", "stager of %d chunks of %d bytes", depth, chunk)
	}
	dev, err := l.DeviceGet(ordinal)
	if err != nil {
		return nil, err
	}
	ctx, err := l.PrimaryCtxRetain(dev)
	if err != nil {
		return nil, err
	}
	s := &Stager{l: l, dev: dev, ctx: ctx, chunk: chunk}
	err = l.With(ctx, func() (err error) {
		if s.stream, err = l.StreamCreate(StreamNonBlocking); err != nil {
			return err
		}
		for i := 0; i < depth; i++ {
			b, err := l.MemHostAlloc(chunk, HostAllocPortable)
			if err != nil {
				return err
			}
			s.bufs = append(s.bufs, b)
			e, err := l.EventCreate(EventDisableTiming)
			if err != nil {
				return err
			}
			s.events = append(s.events, e)
		}
		return nil
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Depth is the number of chunks.
func (s *Stager) Depth() int { return len(s.bufs) }

// ChunkSize is the size of one chunk.
func (s *Stager) ChunkSize() uint64 { return s.chunk }

// Chunk returns the pinned host memory of chunk i.
func (s *Stager) Chunk(i int) []byte { return mem.Bytes(s.bufs[i], s.chunk) }

func (s *Stager) check(i int, n uint64) error {
	if i < 0 || i >= len(s.bufs) || n == 0 || n > s.chunk {
		return errs.New(errs.InvalidArgument, "cuda", "chunk %d of %d bytes in a stager of %d chunks of %d", i, n, len(s.bufs), s.chunk)
	}
	return nil
}

// ToHost starts copying n bytes of device memory at src into chunk i and
// returns at once; Wait(i) waits for it.
func (s *Stager) ToHost(i int, src, n uint64) error {
	if err := s.check(i, n); err != nil {
		return err
	}
	return s.l.With(s.ctx, func() error {
		if err := s.l.CopyDtoHAsync(s.bufs[i], src, n, s.stream); err != nil {
			return err
		}
		return s.l.EventRecord(s.events[i], s.stream)
	})
}

// ToDevice starts copying the first n bytes of chunk i to device memory at
// dst and returns at once; Wait(i) waits for it (then the chunk is free).
func (s *Stager) ToDevice(i int, dst, n uint64) error {
	if err := s.check(i, n); err != nil {
		return err
	}
	return s.l.With(s.ctx, func() error {
		if err := s.l.CopyHtoDAsync(dst, s.bufs[i], n, s.stream); err != nil {
			return err
		}
		return s.l.EventRecord(s.events[i], s.stream)
	})
}

// Wait waits for the last copy started on chunk i.
func (s *Stager) Wait(i int) error {
	if err := s.check(i, 1); err != nil {
		return err
	}
	return s.l.With(s.ctx, func() error { return s.l.EventSynchronize(s.events[i]) })
}

// Close waits for the stream and frees everything.
func (s *Stager) Close() error {
	if s.ctx == 0 {
		return nil
	}
	err := s.l.With(s.ctx, func() error {
		var first error
		keep := func(err error) {
			if err != nil && first == nil {
				first = err
			}
		}
		if s.stream != 0 {
			keep(s.l.StreamSynchronize(s.stream))
			keep(s.l.StreamDestroy(s.stream))
		}
		for _, e := range s.events {
			keep(s.l.EventDestroy(e))
		}
		for _, b := range s.bufs {
			keep(s.l.MemFreeHost(b))
		}
		return first
	})
	s.l.PrimaryCtxRelease(s.dev)
	s.ctx, s.stream, s.bufs, s.events = 0, 0, nil, nil
	return err
}

// StagerPool keeps rings between the requests of a transport, by device
// ordinal, so pinned memory is allocated once per ring and not per request.
// The zero value is ready; it is safe for concurrent use.
type StagerPool struct {
	mu     sync.Mutex
	closed bool
	free   map[int][]*Stager
}

// Take returns a ring of device dev from the pool, or a new one
// the pool has none (alloc); once the pool is closed it fails with Closed.
func (p *StagerPool) Take(dev int, alloc func() (*Stager, error)) (*Stager, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errs.New(errs.Closed, "cuda", "staging pool closed")
	}
	if f := p.free[dev]; len(f) > 0 {
		s := f[len(f)-1]
		p.free[dev] = f[:len(f)-1]
		p.mu.Unlock()
		return s, nil
	}
	p.mu.Unlock()
	return alloc()
}

// Put gives back a ring whose copies have all ended. A ring whose copies
// failed (ok false), or one given back after Close, is freed instead.
func (p *StagerPool) Put(dev int, s *Stager, ok bool) {
	p.mu.Lock()
	if ok && !p.closed {
		if p.free == nil {
			p.free = map[int][]*Stager{}
		}
		p.free[dev] = append(p.free[dev], s)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	s.Close()
}

// Close frees the pooled rings; rings taken before are freed when put back.
func (p *StagerPool) Close() {
	p.mu.Lock()
	p.closed = true
	free := p.free
	p.free = nil
	p.mu.Unlock()
	for _, f := range free {
		for _, s := range f {
			s.Close()
		}
	}
}
