package file

import (
	"sync"
	"sync/atomic"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
	"github.com/tecache/te/internal/sys/mem"
)

// GPU memory to and from files. The kernel cannot read a file into device
// memory (nor write one from it), so each request is moved through a ring of
// two pinned host chunks (gpu.Stager, over the runtime's interface): for a write, chunk k+1 is copied off
// the device while chunk k is being written to the file; for a read, chunk
// k+1 is read from the file while chunk k is copied up. Pinned chunks are
// page-aligned, so their file I/O goes O_DIRECT. The runtime is the one the
// region's location names ("cuda:0", "hip:0"), through gpu.Driver.

// gpuLoad is gpu.Load, replaceable in tests.
var gpuLoad = gpu.Load

// driverFor loads the runtime of device memory of kind (NotSupported
// without it).
func driverFor(kind string) (gpu.Driver, error) {
	d, known, err := gpuLoad(kind)
	if !known {
		return nil, errs.New(errs.NotSupported, "file", "no %s runtime is built in", kind)
	}
	if err != nil {
		return nil, errs.Wrap(errs.NotSupported, "file", err, "%s memory needs the %s runtime", kind, kind)
	}
	return d, nil
}

// stagerDepth is the chunks per ring: two overlap a copy with an I/O.
const stagerDepth = 2

// gpuJob is a GPU request's staging goroutine, for Cancel.
type gpuJob struct{ canceled atomic.Bool }

// gpuPool keeps the rings between requests, by runtime and device.
type gpuPool struct {
	mu    sync.Mutex
	rings map[string]*gpu.StagerPool
}

// available reports whether any GPU runtime loads.
func (g *gpuPool) available() bool {
	for _, k := range gpu.Kinds() {
		if _, _, err := gpuLoad(k); err == nil {
			return true
		}
	}
	return false
}

func (g *gpuPool) pool(kind string) *gpu.StagerPool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rings == nil {
		g.rings = map[string]*gpu.StagerPool{}
	}
	p := g.rings[kind]
	if p == nil {
		p = &gpu.StagerPool{}
		g.rings[kind] = p
	}
	return p
}

func (g *gpuPool) take(d gpu.Driver, dev int, chunk uint64) (*gpu.Stager, error) {
	return g.pool(d.Kind()).Take(dev, func() (*gpu.Stager, error) { return gpu.NewStager(d, dev, chunk, stagerDepth) })
}

// put keeps a ring whose copies all ended; a failed one is freed.
func (g *gpuPool) put(d gpu.Driver, dev int, s *gpu.Stager, ok bool) {
	g.pool(d.Kind()).Put(dev, s, ok)
}

func (g *gpuPool) close() {
	g.mu.Lock()
	pools := g.rings
	g.mu.Unlock()
	for _, p := range pools {
		p.Close()
	}
}

// DeviceMemory reports that GPU memory moves to and from this process's
// storage regions when its runtime loads (transport.DeviceMover).
func (t *Transport) DeviceMemory(d *segment.Desc, buf *segment.BufferDesc, local *segment.Region) bool {
	if buf.Name != "file" {
		return false
	}
	if !gpu.IsDevice(local.Location.Kind) {
		return true
	}
	_, err := driverFor(local.Location.Kind)
	return err == nil
}

// startGPU runs a request on device memory in its own goroutine; region (the
// target, acquired) is released when it ends.
func (t *Transport) startGPU(r *transport.Request, st *Storage, off uint64, region *segment.Region) error {
	l, err := driverFor(r.Region.Location.Kind)
	if err != nil {
		return err
	}
	job := &gpuJob{}
	r.Priv = job
	t.xmu.Lock()
	if t.closed.Load() {
		t.xmu.Unlock()
		return errs.New(errs.Closed, "file", "transport closed")
	}
	t.wg.Add(1)
	t.xmu.Unlock()
	// The goroutine is the only one that completes r (Cancel just flags
	// the job), so it may read r until it completes it through tk.
	tk := r.Ticket()
	go func() {
		defer t.wg.Done()
		err := t.runGPU(job, l, r, st, off)
		region.Release()
		tk.Complete(err)
	}()
	return nil
}

// runGPU moves r chunk by chunk; it returns only once no copy and no I/O of
// r is running, so the task's end is a fence for both memories.
func (t *Transport) runGPU(job *gpuJob, l gpu.Driver, r *transport.Request, st *Storage, off uint64) error {
	dev := r.Region.Location.Index
	s, err := t.gpu.take(l, dev, st.StageSize())
	if err != nil {
		return err
	}
	chunk := s.ChunkSize()
	write := r.Op == transport.Write
	type io struct {
		ch  chan error
		use bool
	}
	var ios [stagerDepth]io
	for i := range ios {
		ios[i].ch = make(chan error, 1)
	}
	// wait ends chunk i's file I/O, if one runs.
	wait := func(i int) error {
		if !ios[i].use {
			return nil
		}
		ios[i].use = false
		return <-ios[i].ch
	}
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	n := r.Length
	k := 0
	for done := uint64(0); done < n && first == nil; done += chunk {
		if job.canceled.Load() {
			keep(errs.New(errs.Canceled, "file", "canceled"))
			break
		}
		i := k % stagerDepth
		k++
		m := min(chunk, n-done)
		buf := mem.Addr(s.Chunk(i))
		keep(wait(i)) // the chunk's previous I/O
		if first != nil {
			break
		}
		if write {
			// Device -> chunk, then chunk -> file in the background.
			if err := s.ToHost(i, r.Local+done, m); err != nil {
				keep(err)
				break
			}
			if err := s.Wait(i); err != nil {
				keep(err)
				break
			}
			ios[i].use = true
			ch := ios[i].ch
			st.Move(true, off+done, buf, m, func(err error) { ch <- err })
			continue
		}
		// File -> chunk, then chunk -> device (waited for before the
		// chunk's next I/O, by Wait below or at the end).
		if err := s.Wait(i); err != nil {
			keep(err)
			break
		}
		ch := ios[i].ch
		st.Move(false, off+done, buf, m, func(err error) { ch <- err })
		if err := <-ch; err != nil {
			keep(err)
			break
		}
		keep(s.ToDevice(i, r.Local+done, m))
	}
	ok := true
	for i := range ios {
		keep(wait(i))
		if err := s.Wait(i); err != nil {
			keep(err)
			ok = false
		}
	}
	t.gpu.put(l, dev, s, ok)
	return first
}
