package cudaipc

import (
	"sync"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
)

// gpuDriver is one GPU runtime through gpu.Driver: copy streams per device,
// taken on first use. The first stream of a device is made before anything
// else is asked of it and lives until release: CUDA's driver keeps the
// device's primary context retained while a stream of it exists, and the
// handles opened in that context must outlive every call.
type gpuDriver struct {
	d    gpu.Driver
	mu   sync.Mutex
	devs []*devState
}

type devState struct {
	uuid    string
	streams []gpu.Stream // idle streams (guarded by gpuDriver.mu)
	all     []gpu.Stream // every stream created, destroyed by release
}

func newGPUDriver(d gpu.Driver) (*gpuDriver, error) {
	n, err := d.DeviceCount()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, errs.New(errs.NotSupported, "cudaipc", "the %s runtime sees no device", d.Kind())
	}
	g := &gpuDriver{d: d}
	for i := 0; i < n; i++ {
		s := &devState{}
		if u, err := d.DeviceUUID(i); err == nil {
			s.uuid = u
		}
		g.devs = append(g.devs, s)
	}
	return g, nil
}

func (g *gpuDriver) kind() string { return g.d.Kind() }

func (g *gpuDriver) devices() int { return len(g.devs) }

func (g *gpuDriver) uuid(dev int) string {
	if dev < 0 || dev >= len(g.devs) {
		return ""
	}
	return g.devs[dev].uuid
}

// state returns dev's state once it holds a stream (see gpuDriver).
func (g *gpuDriver) state(dev int) (*devState, error) {
	if dev < 0 || dev >= len(g.devs) {
		return nil, errs.New(errs.InvalidArgument, "cudaipc", "%s device %d is not visible to this process (%d devices)", g.d.Kind(), dev, len(g.devs))
	}
	s := g.devs[dev]
	g.mu.Lock()
	held := len(s.all) > 0
	g.mu.Unlock()
	if held {
		return s, nil
	}
	st, err := g.d.StreamCreate(dev)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	s.all = append(s.all, st)
	s.streams = append(s.streams, st)
	g.mu.Unlock()
	return s, nil
}

// stream takes an idle stream of dev (creating one when none is idle), so
// concurrent batches do not wait for each other's copies.
func (g *gpuDriver) stream(dev int, s *devState) (gpu.Stream, error) {
	g.mu.Lock()
	if n := len(s.streams); n > 0 {
		st := s.streams[n-1]
		s.streams = s.streams[:n-1]
		g.mu.Unlock()
		return st, nil
	}
	g.mu.Unlock()
	st, err := g.d.StreamCreate(dev)
	if err != nil {
		return 0, err
	}
	g.mu.Lock()
	s.all = append(s.all, st)
	g.mu.Unlock()
	return st, nil
}

func (g *gpuDriver) putStream(s *devState, st gpu.Stream) {
	g.mu.Lock()
	s.streams = append(s.streams, st)
	g.mu.Unlock()
}

func (g *gpuDriver) export(dev int, addr, length uint64) (export, error) {
	s, err := g.state(dev)
	if err != nil {
		return export{}, err
	}
	base, size, err := g.d.AllocRange(dev, addr)
	if err != nil {
		return export{}, err
	}
	if addr < base || addr+length > base+size {
		return export{}, errs.New(errs.NotSupported, "cudaipc", "[%#x,+%d) spans more than the allocation [%#x,+%d); register each allocation on its own",
			addr, length, base, size)
	}
	h, err := g.d.IPCExport(dev, base)
	if err != nil {
		return export{}, err
	}
	return export{Handle: h, Offset: addr - base, UUID: s.uuid}, nil
}

func (g *gpuDriver) open(dev int, h gpu.IPCHandle) (uint64, error) {
	if _, err := g.state(dev); err != nil {
		return 0, err
	}
	return g.d.IPCImport(dev, h)
}

func (g *gpuDriver) close(dev int, base uint64) error {
	if _, err := g.state(dev); err != nil {
		return err
	}
	return g.d.IPCClose(dev, base)
}

// copies enqueues every span on one stream and waits once: unified
// addressing lets the runtime's default-direction copy serve host and
// device memory either way.
func (g *gpuDriver) copies(dev int, spans []span) []error {
	errl := make([]error, len(spans))
	fill := func(err error) []error {
		for i := range errl {
			if errl[i] == nil {
				errl[i] = err
			}
		}
		return errl
	}
	s, err := g.state(dev)
	if err != nil {
		return fill(err)
	}
	st, err := g.stream(dev, s)
	if err != nil {
		return fill(err)
	}
	if b, ok := g.d.(gpu.Batcher); ok && len(spans) > 1 {
		cs := make([]gpu.Copy, len(spans))
		for i, sp := range spans {
			cs[i] = gpu.Copy{Dst: sp.dst, Src: sp.src, N: sp.n, Dir: gpu.Default}
		}
		b.CopiesAsync(cs, st, errl)
	} else {
		for i, sp := range spans {
			errl[i] = g.d.CopyAsync(sp.dst, sp.src, sp.n, gpu.Default, st)
		}
	}
	if err := g.d.StreamSync(st); err != nil {
		// A failed synchronisation leaves the stream's state unknown: drop
		// it (release destroys it) and fail every copy.
		return fill(err)
	}
	g.putStream(s, st)
	return errl
}

func (g *gpuDriver) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.devs {
		for _, st := range s.all {
			g.d.StreamDestroy(st)
		}
		s.streams, s.all = nil, nil
	}
}

// fabricDriver is a runtime with multi-node NVLink fabric handles
// (gpuDriver over a gpu.Fabric).
type fabricDriver interface {
	fabricSupported(dev int) bool
	exportFabric(dev int, addr, length uint64) (export, error)
	openFabric(dev int, h gpu.IPCHandle, size uint64) (uint64, error)
	closeFabric(dev int, base, size uint64) error
}

func (g *gpuDriver) fabric() (gpu.Fabric, error) {
	f, ok := g.d.(gpu.Fabric)
	if !ok {
		return nil, errs.New(errs.NotSupported, "cudaipc", "the %s runtime has no fabric handles", g.d.Kind())
	}
	return f, nil
}

func (g *gpuDriver) fabricSupported(dev int) bool {
	f, err := g.fabric()
	return err == nil && f.FabricSupported(dev)
}

func (g *gpuDriver) exportFabric(dev int, addr, length uint64) (export, error) {
	f, err := g.fabric()
	if err != nil {
		return export{}, err
	}
	s, err := g.state(dev)
	if err != nil {
		return export{}, err
	}
	if !f.FabricSupported(dev) {
		return export{}, errs.New(errs.NotSupported, "cudaipc", "%s device %d does not support fabric handles", g.d.Kind(), dev)
	}
	base, size, err := g.d.AllocRange(dev, addr)
	if err != nil {
		return export{}, err
	}
	if addr < base || addr+length > base+size {
		return export{}, errs.New(errs.NotSupported, "cudaipc", "[%#x,+%d) spans more than the allocation [%#x,+%d)", addr, length, base, size)
	}
	h, err := f.FabricExport(dev, base)
	if err != nil {
		return export{}, err
	}
	return export{Handle: gpu.IPCHandle(h), Offset: addr - base, UUID: s.uuid, Fabric: true, Size: size}, nil
}

func (g *gpuDriver) openFabric(dev int, h gpu.IPCHandle, size uint64) (uint64, error) {
	f, err := g.fabric()
	if err != nil {
		return 0, err
	}
	if _, err := g.state(dev); err != nil {
		return 0, err
	}
	return f.FabricImport(dev, gpu.FabricHandle(h), size)
}

func (g *gpuDriver) closeFabric(dev int, base, size uint64) error {
	f, err := g.fabric()
	if err != nil {
		return err
	}
	if _, err := g.state(dev); err != nil {
		return err
	}
	return f.FabricClose(dev, base, size)
}
