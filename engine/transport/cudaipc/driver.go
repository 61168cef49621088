package cudaipc

import (
	"sync"

	"github.com/tecache/te/internal/errs"
	cu "github.com/tecache/te/internal/sys/cuda"
)

// cudaDriver is the driver through internal/sys/cuda: one primary context
// and one copy stream per device, taken on first use.
type cudaDriver struct {
	l    *cu.Lib
	mu   sync.Mutex
	devs []*devState
}

type devState struct {
	dev     cu.Device
	uuid    string
	ctx     cu.Context  // 0 until first use
	streams []cu.Stream // idle streams (guarded by cudaDriver.mu)
	all     []cu.Stream // every stream created, destroyed by release
}

func newCUDADriver(l *cu.Lib) (*cudaDriver, error) {
	n, err := l.DeviceCount()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, errs.New(errs.NotSupported, "cudaipc", "the driver sees no device")
	}
	d := &cudaDriver{l: l}
	for i := 0; i < n; i++ {
		dev, err := l.DeviceGet(i)
		if err != nil {
			return nil, err
		}
		s := &devState{dev: dev}
		if u, err := l.DeviceUUID(dev); err == nil {
			s.uuid = uuidHex(u)
		}
		d.devs = append(d.devs, s)
	}
	return d, nil
}

func (d *cudaDriver) devices() int { return len(d.devs) }

func (d *cudaDriver) uuid(dev int) string {
	if dev < 0 || dev >= len(d.devs) {
		return ""
	}
	return d.devs[dev].uuid
}

// state returns dev's primary context and stream, retaining the context and
// creating the stream on first use.
func (d *cudaDriver) state(dev int) (*devState, error) {
	if dev < 0 || dev >= len(d.devs) {
		return nil, errs.New(errs.InvalidArgument, "cudaipc", "device %d is not visible to this process (%d devices)", dev, len(d.devs))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.devs[dev]
	if s.ctx != 0 {
		return s, nil
	}
	ctx, err := d.l.PrimaryCtxRetain(s.dev)
	if err != nil {
		return nil, err
	}
	s.ctx = ctx
	return s, nil
}

// stream takes an idle stream of s (creating one when none is idle), so
// concurrent batches do not wait for each other's copies.
func (d *cudaDriver) stream(s *devState) (cu.Stream, error) {
	d.mu.Lock()
	if n := len(s.streams); n > 0 {
		st := s.streams[n-1]
		s.streams = s.streams[:n-1]
		d.mu.Unlock()
		return st, nil
	}
	d.mu.Unlock()
	var st cu.Stream
	err := d.l.With(s.ctx, func() (err error) {
		st, err = d.l.StreamCreate(cu.StreamNonBlocking)
		return
	})
	if err != nil {
		return 0, err
	}
	d.mu.Lock()
	s.all = append(s.all, st)
	d.mu.Unlock()
	return st, nil
}

func (d *cudaDriver) putStream(s *devState, st cu.Stream) {
	d.mu.Lock()
	s.streams = append(s.streams, st)
	d.mu.Unlock()
}

func (d *cudaDriver) export(dev int, addr, length uint64) (export, error) {
	s, err := d.state(dev)
	if err != nil {
		return export{}, err
	}
	var e export
	err = d.l.With(s.ctx, func() error {
		base, size, err := d.l.MemGetAddressRange(addr)
		if err != nil {
			return err
		}
		if addr+length > base+size {
			return errs.New(errs.NotSupported, "cudaipc", "[%#x,+%d) spans more than the allocation [%#x,+%d); register each allocation on its own",
				addr, length, base, size)
		}
		h, err := d.l.IPCGetMemHandle(base)
		if err != nil {
			return err
		}
		e = export{Handle: h, Offset: addr - base, UUID: s.uuid}
		return nil
	})
	return e, err
}

func (d *cudaDriver) open(dev int, h cu.IPCMemHandle) (uint64, error) {
	s, err := d.state(dev)
	if err != nil {
		return 0, err
	}
	var p uint64
	err = d.l.With(s.ctx, func() (err error) {
		p, err = d.l.IPCOpenMemHandle(h, cu.IPCLazyEnablePeerAccess)
		return
	})
	return p, err
}

func (d *cudaDriver) close(dev int, base uint64) error {
	s, err := d.state(dev)
	if err != nil {
		return err
	}
	return d.l.With(s.ctx, func() error { return d.l.IPCCloseMemHandle(base) })
}

// copies enqueues every span on one stream and waits once: unified
// addressing lets cuMemcpyAsync serve host and device memory in either
// direction.
func (d *cudaDriver) copies(dev int, spans []span) []error {
	errl := make([]error, len(spans))
	fill := func(err error) []error {
		for i := range errl {
			if errl[i] == nil {
				errl[i] = err
			}
		}
		return errl
	}
	s, err := d.state(dev)
	if err != nil {
		return fill(err)
	}
	st, err := d.stream(s)
	if err != nil {
		return fill(err)
	}
	err = d.l.With(s.ctx, func() error {
		for i, sp := range spans {
			errl[i] = d.l.CopyAsync(sp.dst, sp.src, sp.n, st)
		}
		return d.l.StreamSynchronize(st)
	})
	if err != nil {
		// A failed synchronisation leaves the stream's state unknown: drop
		// it (release destroys it) and fail every copy.
		return fill(err)
	}
	d.putStream(s, st)
	return errl
}

func (d *cudaDriver) release() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.devs {
		if s.ctx == 0 {
			continue
		}
		d.l.With(s.ctx, func() error {
			for _, st := range s.all {
				d.l.StreamDestroy(st)
			}
			return nil
		})
		d.l.PrimaryCtxRelease(s.dev)
		s.ctx, s.streams, s.all = 0, nil, nil
	}
}
