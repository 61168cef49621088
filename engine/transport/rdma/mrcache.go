package rdma

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
)

// vma is one mapping of /proc/self/maps. Two registrations may share a
// memory region only if the mapping they lie in is the same one the region
// was registered for: a mapping that was unmapped and mapped again (other
// bounds, another file or offset) is not served by a region that pins the
// old pages.
type vma struct {
	start, end, off, inode uint64
	dev, perms             string
}

// mappingOf returns the mapping holding all of [addr, addr+n), or false
// when the range is not inside one mapping (or /proc is unreadable): such a
// region is registered on its own.
func mappingOf(addr, n uint64) (vma, bool) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return vma{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// start-end perms offset dev inode [path]
		fl := bytes.Fields(sc.Bytes())
		if len(fl) < 5 {
			continue
		}
		se := bytes.IndexByte(fl[0], '-')
		if se < 0 {
			continue
		}
		s, err1 := strconv.ParseUint(string(fl[0][:se]), 16, 64)
		e, err2 := strconv.ParseUint(string(fl[0][se+1:]), 16, 64)
		if err1 != nil || err2 != nil || e <= addr {
			continue
		}
		if s > addr || addr+n > e {
			return vma{}, false
		}
		off, _ := strconv.ParseUint(string(fl[2]), 16, 64)
		ino, _ := strconv.ParseUint(string(fl[4]), 10, 64)
		return vma{start: s, end: e, off: off, inode: ino, dev: string(fl[3]), perms: string(fl[1])}, true
	}
	return vma{}, false
}

// sharedMR is one window of a mapping registered on every NIC, in NIC
// order, shared by the registered regions inside it.
type sharedMR struct {
	lo, hi uint64
	vma    vma
	access int
	mrs    []memReg
	refs   int
}

// mrCache is the range cache of rdma.mr_cache=on: a region inside a
// mapping already registered (with at least the access it needs) takes
// the covering memory region's keys instead of a memory region of its own,
// so the many tensors of one allocation cost one region per NIC per
// max_mr_size of the allocation, as NIXL and Mooncake register. A window
// is deregistered when its last region is.
type mrCache struct {
	mu      sync.Mutex // held across registration: two regions of one allocation must not both register it
	entries []*sharedMR
	created uint64 // windows registered
	reused  uint64 // regions served by a window already registered
}

// mrParallel bounds the NICs registered at once.
const mrParallel = 8

// acquire returns the window covering [addr, addr+n) with access, taking a
// reference, registering it on every NIC if there is none. It returns nil
// (no error) for a range not inside one mapping: the caller registers it
// on its own.
func (c *mrCache) acquire(addr, n uint64, access int, nics []registrar) (*sharedMR, error) {
	v, ok := mappingOf(addr, n)
	if !ok {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.vma == v && e.lo <= addr && addr+n <= e.hi && e.access&access == access {
			e.refs++
			c.reused++
			return e, nil
		}
	}
	limit := maxMRSize(nics)
	if n > limit {
		return nil, errs.New(errs.InvalidArgument, "rdma", "region [%#x,+%d) is longer than the NICs' max_mr_size (%d): one memory region per NIC cannot cover it",
			addr, n, limit).WithHint("register it as several regions of at most max_mr_size bytes")
	}
	lo, hi := v.start, v.end
	if hi-lo > limit {
		// The mapping needs several windows: start this one at the region
		// (a page down), so the regions that follow in address order share it.
		page := uint64(unix.Getpagesize())
		lo = max(v.start, min(addr&^(page-1), v.end-limit))
		hi = lo + limit
		if addr+n > hi {
			lo, hi = addr, addr+n
		}
	}
	mrs, err := regAll(nics, lo, hi-lo, access)
	if err != nil {
		return nil, err
	}
	e := &sharedMR{lo: lo, hi: hi, vma: v, access: access, mrs: mrs, refs: 1}
	c.entries = append(c.entries, e)
	c.created++
	return e, nil
}

// release drops a reference; the last one deregisters the window on every
// NIC, so no key of it outlives the regions that use it.
func (c *mrCache) release(e *sharedMR) error {
	c.mu.Lock()
	e.refs--
	if e.refs > 0 {
		c.mu.Unlock()
		return nil
	}
	for i, x := range c.entries {
		if x == e {
			c.entries = append(c.entries[:i], c.entries[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	var first error
	for _, m := range e.mrs {
		if err := m.Dereg(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// counts returns the windows registered and the regions served by one
// already registered.
func (c *mrCache) counts() (created, reused uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.created, c.reused
}

// maxMRSize is the smallest max_mr_size of the NICs (unbounded if none
// says).
func maxMRSize(nics []registrar) uint64 {
	limit := ^uint64(0)
	for _, n := range nics {
		if m, ok := n.(interface{ maxMRSize() uint64 }); ok && m.maxMRSize() > 0 {
			limit = min(limit, m.maxMRSize())
		}
	}
	return limit
}

// regAll registers [addr, addr+n) on every NIC, at most mrParallel at once
// (registration pins pages in the kernel, which scales across NICs). On
// failure nothing stays registered.
func regAll(nics []registrar, addr, n uint64, access int) ([]memReg, error) {
	mrs := make([]memReg, len(nics))
	errv := make([]error, len(nics))
	if len(nics) == 1 {
		mrs[0], errv[0] = nics[0].RegMR(addr, n, access)
	} else {
		sem := make(chan struct{}, mrParallel)
		var wg sync.WaitGroup
		for i := range nics {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				mrs[i], errv[i] = nics[i].RegMR(addr, n, access)
			}()
		}
		wg.Wait()
	}
	for i, err := range errv {
		if err != nil {
			for _, m := range mrs {
				if m != nil {
					_ = m.Dereg()
				}
			}
			return nil, errs.Wrap(errs.CodeOf(err), "rdma", err, "registering [%#x,+%d) on %s", addr, n, nics[i].Name())
		}
	}
	return mrs, nil
}
