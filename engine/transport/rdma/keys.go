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
}

// keyTable is the per-buffer, per-NIC bookkeeping: for every registered
// region, one memory region on each NIC, in NIC order; the region's
// descriptor carries their keys as lkey[i]/rkey[i].
type keyTable struct {
	mu   sync.Mutex
	regs map[*segment.Region][]memReg
}

func newKeyTable() *keyTable { return &keyTable{regs: map[*segment.Region][]memReg{}} }

// register registers r on every NIC and fills r.Desc.Lkey/Rkey. On failure
// nothing stays registered.
func (k *keyTable) register(r *segment.Region, nics []registrar, parallelMin uint64) error {
	if len(nics) == 0 {
		return errs.New(errs.TransportUnavailable, "rdma", "no NIC to register [%#x,+%d) on", r.Addr, r.Length)
	}
	k.mu.Lock()
	_, dup := k.regs[r]
	k.mu.Unlock()
	if dup {
		return nil
	}
	plan := planRegistration(r.Length, r.Location, len(nics), parallelMin)
	if plan.preTouch {
		preTouch(r.Addr, r.Length)
	}
	access := ibv.AccessLocalWrite
	if r.Remote {
		access |= ibv.AccessRemoteRead | ibv.AccessRemoteWrite
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

// unregister deregisters r's regions on every NIC; their keys stop working
// at once, so a peer still holding the old descriptor gets a remote access
// error rather than reaching memory that may be reused.
func (k *keyTable) unregister(r *segment.Region) error {
	k.mu.Lock()
	mrs, ok := k.regs[r]
	delete(k.regs, r)
	k.mu.Unlock()
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
	return len(k.regs)
}

// closeAll deregisters everything.
func (k *keyTable) closeAll() {
	k.mu.Lock()
	regs := k.regs
	k.regs = map[*segment.Region][]memReg{}
	k.mu.Unlock()
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
