package rdma

import (
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv"
	"github.com/tecache/te/internal/sys/mem"
)

// memReg is one NIC's memory region of a buffer.
type memReg interface {
	Keys() (lkey, rkey uint32)
	Dereg() error
}

// registrar registers memory on one NIC (a real device, or a fake in tests).
type registrar interface {
	Name() string
	RegMR(addr, length uint64, access int) (memReg, error)
	// RegDmabuf registers length bytes at offset of a dma-buf, seen at
	// iova (GPU memory exported by its driver).
	RegDmabuf(offset, length, iova uint64, fd int, access int) (memReg, error)
}

// keyTable is the per-buffer, per-NIC bookkeeping: for every registered
// region, one memory region on each NIC, in NIC order; the region's
// descriptor carries their keys as lkey[i]/rkey[i]. GPU regions the NICs
// refused are kept apart: they have no keys and move by staging.
type keyTable struct {
	mu      sync.Mutex
	regs    map[*segment.Region][]memReg
	refused map[*segment.Region]error
	// With rdma.mr_cache=on, host regions (and GPU regions exported as a
	// dma-buf) take the keys of a window of their mapping (allocation)
	// that the cache registered once for all of them.
	cache  *mrCache
	shared map[*segment.Region]*sharedMR
}

func newKeyTable() *keyTable {
	return &keyTable{regs: map[*segment.Region][]memReg{}, refused: map[*segment.Region]error{}, shared: map[*segment.Region]*sharedMR{}}
}

// dmabufSource exports the GPU memory at [addr, addr+length) of device dev
// as a dma-buf: the fd (the caller closes it) and the region's offset in it.
type dmabufSource func(addr, length uint64, dev int) (fd int, offset uint64, err error)

// How GPU memory reached the NICs.
const (
	viaDmabuf  = "dmabuf"  // ibv_reg_dmabuf_mr on the driver's dma-buf
	viaPeermem = "peermem" // ibv_reg_mr on the device pointer (nvidia-peermem)
)

// registerDevice registers GPU memory on every NIC: through a dma-buf of
// the allocation where the driver exports one and the provider takes it,
// else by its device address, which the kernel's peer-memory module
// (nvidia-peermem) resolves. On failure nothing stays registered and the
// error says what each way answered.
func (k *keyTable) registerDevice(r *segment.Region, nics []registrar, src dmabufSource) (string, error) {
	if len(nics) == 0 {
		return "", errs.New(errs.TransportUnavailable, "rdma", "no NIC to register [%#x,+%d) on", r.Addr, r.Length)
	}
	k.mu.Lock()
	_, dup := k.regs[r]
	_, dupShared := k.shared[r]
	k.mu.Unlock()
	if dup || dupShared {
		return "", nil
	}
	access := ibv.AccessLocalWrite
	if r.Remote {
		access |= ibv.AccessRemoteRead | ibv.AccessRemoteWrite
	}
	fd, off, how := -1, uint64(0), viaPeermem
	var dmabufWhy error
	if src != nil {
		var err error
		if fd, off, err = src(r.Addr, r.Length, r.Location.Index); err == nil {
			how = viaDmabuf
			defer unix.Close(fd)
		} else {
			fd, dmabufWhy = -1, err
		}
	}
	if how == viaDmabuf && k.cache != nil {
		if e := k.cache.acquireDevice(r.Addr, r.Length, r.Location.Index, fd, off, access, nics); e != nil {
			k.setShared(r, e)
			return how, nil
		}
	}
	if limit := maxMRSize(nics); r.Length > limit {
		// Longer than a NIC registers at once: several regions, through
		// the dma-buf (at their offsets in it) or by address.
		mrs, err := regSplit(r, nics, limit, func(n registrar, o, length uint64) (memReg, error) {
			if how == viaDmabuf {
				return n.RegDmabuf(off+o, length, r.Addr+o, fd, access)
			}
			return n.RegMR(r.Addr+o, length, access)
		})
		if err != nil && how == viaDmabuf && errs.CodeOf(err) == errs.NotSupported {
			how, dmabufWhy = viaPeermem, err
			mrs, err = regSplit(r, nics, limit, func(n registrar, o, length uint64) (memReg, error) {
				return n.RegMR(r.Addr+o, length, access)
			})
		}
		if err != nil {
			if dmabufWhy != nil {
				return "", errs.Wrap(errs.CodeOf(err), "rdma", err, "GPU memory [%#x,+%d) by address (dma-buf: %v)",
					r.Addr, r.Length, dmabufWhy).WithHint("load nvidia-peermem, or use a driver and rdma-core with dma-buf (CUDA 11.7, driver 515, rdma-core 34, Linux 5.12)")
			}
			return "", err
		}
		k.mu.Lock()
		k.regs[r] = mrs
		k.mu.Unlock()
		return how, nil
	}
	mrs := make([]memReg, 0, len(nics))
	rollback := func() {
		for _, m := range mrs {
			_ = m.Dereg()
		}
	}
	for i, n := range nics {
		var m memReg
		var err error
		if how == viaDmabuf {
			m, err = n.RegDmabuf(off, r.Length, r.Addr, fd, access)
			if err != nil && i == 0 && errs.CodeOf(err) == errs.NotSupported {
				// The provider has no dma-buf registration: the device
				// address, for every NIC.
				how, dmabufWhy = viaPeermem, err
			}
		}
		if how == viaPeermem {
			m, err = n.RegMR(r.Addr, r.Length, access)
		}
		if err != nil {
			rollback()
			if dmabufWhy != nil {
				return "", errs.Wrap(errs.CodeOf(err), "rdma", err, "%s refused GPU memory [%#x,+%d) by address (dma-buf: %v)",
					n.Name(), r.Addr, r.Length, dmabufWhy).WithHint("load nvidia-peermem, or use a driver and rdma-core with dma-buf (CUDA 11.7, driver 515, rdma-core 34, Linux 5.12)")
			}
			return "", errs.Wrap(errs.CodeOf(err), "rdma", err, "%s refused GPU memory [%#x,+%d) through %s", n.Name(), r.Addr, r.Length, how)
		}
		mrs = append(mrs, m)
	}
	r.Desc.Lkey = make([]uint32, len(mrs))
	r.Desc.Rkey = make([]uint32, len(mrs))
	for i, m := range mrs {
		r.Desc.Lkey[i], r.Desc.Rkey[i] = m.Keys()
	}
	k.mu.Lock()
	k.regs[r] = mrs
	k.mu.Unlock()
	return how, nil
}

// setShared gives r the keys of the cache's window e.
func (k *keyTable) setShared(r *segment.Region, e *sharedMR) {
	r.Desc.Lkey = make([]uint32, len(e.mrs))
	r.Desc.Rkey = make([]uint32, len(e.mrs))
	for i, m := range e.mrs {
		r.Desc.Lkey[i], r.Desc.Rkey[i] = m.Keys()
	}
	k.mu.Lock()
	k.shared[r] = e
	k.mu.Unlock()
}

// refuse records a GPU region the NICs refused.
func (k *keyTable) refuse(r *segment.Region, why error) {
	k.mu.Lock()
	k.refused[r] = why
	k.mu.Unlock()
}

// register registers r on every NIC and fills r.Desc.Lkey/Rkey. On failure
// nothing stays registered.
func (k *keyTable) register(r *segment.Region, nics []registrar, parallelMin uint64) error {
	if len(nics) == 0 {
		return errs.New(errs.TransportUnavailable, "rdma", "no NIC to register [%#x,+%d) on", r.Addr, r.Length)
	}
	k.mu.Lock()
	_, dup := k.regs[r]
	_, dupShared := k.shared[r]
	k.mu.Unlock()
	if dup || dupShared {
		return nil
	}
	access := ibv.AccessLocalWrite
	if r.Remote {
		access |= ibv.AccessRemoteRead | ibv.AccessRemoteWrite
	}
	if k.cache != nil {
		e, err := k.cache.acquire(r.Addr, r.Length, access, nics, parallelMin)
		if err != nil {
			return err
		}
		if e != nil {
			k.setShared(r, e)
			return nil
		}
	}
	plan := planRegistration(r.Length, r.Location, len(nics), parallelMin)
	if plan.preTouch {
		preTouch(r.Addr, r.Length)
	}
	if limit := maxMRSize(nics); r.Length > limit {
		mrs, err := regSplit(r, nics, limit, func(n registrar, off, length uint64) (memReg, error) {
			return n.RegMR(r.Addr+off, length, access)
		})
		if err != nil {
			return err
		}
		k.mu.Lock()
		k.regs[r] = mrs
		k.mu.Unlock()
		return nil
	}
	mrs := make([]memReg, len(nics))
	errv := make([]error, len(nics))
	reg := func(i int) { mrs[i], errv[i] = nics[i].RegMR(r.Addr, r.Length, access) }
	if plan.parallel {
		var wg sync.WaitGroup
		for i := range nics {
			wg.Add(1)
			go func() { defer wg.Done(); reg(i) }()
		}
		wg.Wait()
	} else {
		for i := range nics {
			if reg(i); errv[i] != nil {
				break
			}
		}
	}
	for i, err := range errv {
		if err != nil {
			for _, m := range mrs {
				if m != nil {
					_ = m.Dereg()
				}
			}
			return errs.Wrap(errs.CodeOf(err), "rdma", err, "registering [%#x,+%d) on %s", r.Addr, r.Length, nics[i].Name())
		}
	}
	r.Desc.Lkey = make([]uint32, len(mrs))
	r.Desc.Rkey = make([]uint32, len(mrs))
	for i, m := range mrs {
		r.Desc.Lkey[i], r.Desc.Rkey[i] = m.Keys()
	}
	k.mu.Lock()
	k.regs[r] = mrs
	k.mu.Unlock()
	return nil
}

// maxMROverlap bounds how much neighbouring memory regions of a split
// buffer overlap: enough for any slice up to the largest default, little
// next to a max_mr_size of gigabytes (the overlap is pinned twice).
const maxMROverlap = 64 << 20

// mrLayout cuts a buffer of n bytes into memory regions of at most limit
// bytes (segment.BufferDesc's MRStep and MRSpan): region k starts at
// k*step and is span long (the last one shorter), neighbours overlap by
// min(span/2, maxMROverlap) so a slice never has to be cut at an edge.
func mrLayout(n, limit uint64) (step, span uint64, err error) {
	page := uint64(unix.Getpagesize())
	span = limit &^ (page - 1)
	overlap := min(span/2, maxMROverlap) &^ (page - 1)
	if overlap < page {
		return 0, 0, errs.New(errs.InvalidArgument, "rdma", "region of %d bytes is longer than the NICs' max_mr_size (%d), too small to split", n, limit)
	}
	step = span - overlap
	if n/step >= segment.MaxMRs {
		return 0, 0, errs.New(errs.InvalidArgument, "rdma", "region of %d bytes needs more than %d memory regions of the NICs' max_mr_size (%d)",
			n, segment.MaxMRs, limit).WithHint("register it as several regions")
	}
	return step, span, nil
}

// regSplit registers r, longer than limit, as overlapping memory regions
// of at most limit bytes on every NIC (reg registers length bytes at
// offset off of r on one NIC) and fills r.Desc's keys and layout. The
// memory regions come back region-major: region k's on NIC i at
// k*len(nics)+i. On failure nothing stays registered.
func regSplit(r *segment.Region, nics []registrar, limit uint64, reg func(n registrar, off, length uint64) (memReg, error)) ([]memReg, error) {
	step, span, err := mrLayout(r.Length, limit)
	if err != nil {
		return nil, err
	}
	count := segment.MRCount(r.Length, step, span)
	all := make([]memReg, 0, count*len(nics))
	for k := range count {
		off := uint64(k) * step
		length := min(span, r.Length-off)
		mrs, err := regEach(nics, r.Addr+off, length, func(n registrar) (memReg, error) { return reg(n, off, length) })
		if err != nil {
			for _, m := range all {
				_ = m.Dereg()
			}
			return nil, err
		}
		all = append(all, mrs...)
	}
	keys := func(k int) (l, rk []uint32) {
		l, rk = make([]uint32, len(nics)), make([]uint32, len(nics))
		for i, m := range all[k*len(nics) : (k+1)*len(nics)] {
			l[i], rk[i] = m.Keys()
		}
		return l, rk
	}
	r.Desc.Lkey, r.Desc.Rkey = keys(0)
	r.Desc.MoreLkey, r.Desc.MoreRkey = make([][]uint32, count-1), make([][]uint32, count-1)
	for k := 1; k < count; k++ {
		r.Desc.MoreLkey[k-1], r.Desc.MoreRkey[k-1] = keys(k)
	}
	r.Desc.MRStep, r.Desc.MRSpan = step, span
	return all, nil
}

// unregister deregisters r's regions on every NIC; their keys stop working
// at once, so a peer still holding the old descriptor gets a remote access
// error rather than reaching memory that may be reused.
func (k *keyTable) unregister(r *segment.Region) error {
	k.mu.Lock()
	mrs, ok := k.regs[r]
	e, isShared := k.shared[r]
	delete(k.regs, r)
	delete(k.shared, r)
	delete(k.refused, r)
	k.mu.Unlock()
	if isShared {
		// The window's keys work until its last region is unregistered.
		return k.cache.release(e)
	}
	if !ok {
		return nil
	}
	var first error
	for _, m := range mrs {
		if err := m.Dereg(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// len returns the number of registered regions.
func (k *keyTable) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.regs) + len(k.shared)
}

// closeAll deregisters everything.
func (k *keyTable) closeAll() {
	k.mu.Lock()
	regs, shared := k.regs, k.shared
	k.regs = map[*segment.Region][]memReg{}
	k.shared = map[*segment.Region]*sharedMR{}
	k.refused = map[*segment.Region]error{}
	k.mu.Unlock()
	for _, e := range shared {
		_ = k.cache.release(e)
	}
	if k.cache != nil {
		k.cache.close()
	}
	for _, mrs := range regs {
		for _, m := range mrs {
			_ = m.Dereg()
		}
	}
}

// preTouch faults in [addr, addr+n) in parallel without changing its
// contents: MADV_POPULATE_WRITE (Linux 5.14) where the kernel has it, else a
// read of every page.
func preTouch(addr, n uint64) {
	page := uint64(unix.Getpagesize())
	start := addr &^ (page - 1)
	end := addr + n
	workers := max(1, runtime.NumCPU())
	chunk := ((end-start)/uint64(workers) + page - 1) &^ (page - 1)
	if chunk < 64<<20 {
		chunk = 64 << 20
	}
	var wg sync.WaitGroup
	for off := start; off < end; off += chunk {
		lo, hi := off, min(off+chunk, end)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if unix.Madvise(mem.Bytes(lo, hi-lo), unix.MADV_POPULATE_WRITE) == nil {
				return
			}
			b := mem.Bytes(lo, hi-lo)
			var sink byte
			for i := uint64(0); i < uint64(len(b)); i += page {
				sink += b[i]
			}
			_ = sink
		}()
	}
	wg.Wait()
}
