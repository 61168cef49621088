package gpu

import (
	"errors"
	"sync"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// Stager moves device memory of any runtime through a ring of pinned host
// chunks, for transports that read and write only host memory (tcp, file):
// chunk i+1 is copied while chunk i is on the wire. Each chunk has its own
// stream, so waiting for one chunk does not wait for the others (the
// interface has streams, not events). A Stager is not safe for concurrent
// use; use one per connection or worker.
type Stager struct {
	d       Driver
	chunk   uint64
	bufs    []uint64
	streams []Stream
}

// NewStager allocates depth pinned chunks of chunk bytes and a stream per
// chunk on device dev of d.
func NewStager(d Driver, dev int, chunk uint64, depth int) (*Stager, error) {
	if chunk == 0 || depth < 1 || depth > 64 {
		return nil, errs.New(errs.InvalidArgument, "gpu", "stager of %d chunks of %d bytes", depth, chunk)
	}
	s := &Stager{d: d, chunk: chunk}
	for i := 0; i < depth; i++ {
		b, err := d.HostAlloc(chunk)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.bufs = append(s.bufs, b)
		st, err := d.StreamCreate(dev)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.streams = append(s.streams, st)
	}
	return s, nil
}

// Depth is the number of chunks; ChunkSize the size of one.
func (s *Stager) Depth() int { return len(s.bufs) }

// ChunkSize is the size of one chunk.
func (s *Stager) ChunkSize() uint64 { return s.chunk }

// Chunk returns the pinned host memory of chunk i.
func (s *Stager) Chunk(i int) []byte { return mem.Bytes(s.bufs[i], s.chunk) }

func (s *Stager) check(i int, n uint64) error {
	if i < 0 || i >= len(s.bufs) || n == 0 || n > s.chunk {
		return errs.New(errs.InvalidArgument, "gpu", "chunk %d of %d bytes in a stager of %d chunks of %d", i, n, len(s.bufs), s.chunk)
	}
	return nil
}

// ToHost starts copying n bytes of device memory at src into chunk i.
func (s *Stager) ToHost(i int, src, n uint64) error {
	if err := s.check(i, n); err != nil {
		return err
	}
	return s.d.CopyAsync(s.bufs[i], src, n, DeviceToHost, s.streams[i])
}

// ToDevice starts copying the first n bytes of chunk i to dst.
func (s *Stager) ToDevice(i int, dst, n uint64) error {
	if err := s.check(i, n); err != nil {
		return err
	}
	return s.d.CopyAsync(dst, s.bufs[i], n, HostToDevice, s.streams[i])
}

// Wait waits for the copies started on chunk i.
func (s *Stager) Wait(i int) error {
	if err := s.check(i, 1); err != nil {
		return err
	}
	return s.d.StreamSync(s.streams[i])
}

// Close waits for every stream and frees the chunks and streams.
func (s *Stager) Close() error {
	var all []error
	for _, st := range s.streams {
		all = append(all, s.d.StreamSync(st), s.d.StreamDestroy(st))
	}
	for _, b := range s.bufs {
		all = append(all, s.d.HostFree(b))
	}
	s.streams, s.bufs = nil, nil
	return errors.Join(all...)
}

// StagerPool keeps rings between the requests of a transport, by device,
// so pinned memory is allocated once per ring and not per request. The zero
// value is ready; it is safe for concurrent use.
type StagerPool struct {
	mu     sync.Mutex
	closed bool
	free   map[int][]*Stager
}

// Take returns a ring of device dev from the pool, or a new one (alloc)
// when it has none; once the pool is closed it fails with Closed.
func (p *StagerPool) Take(dev int, alloc func() (*Stager, error)) (*Stager, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errs.New(errs.Closed, "gpu", "staging pool closed")
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
