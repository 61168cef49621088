package rdma

import (
	"bytes"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
)

// vma is one mapping of /proc/self/maps. Two registrations may share a
// memory region only if the mapping they lie in is the same one the region
// was registered for (sharedMR.sameMapping): a range that was unmapped and
// mapped again (another file or offset, other permissions, a split) is not
// served by a region that pins the old pages.
type vma struct {
	start, end, off, inode uint64
	dev                    uint64 // major<<32 | minor
	perms                  uint64 // procmapRead|Write|Exec|Shared
}

// struct procmap_query of <linux/fs.h> (Linux 6.11), and its ioctl: the
// mapping at one address without reading the whole of /proc/self/maps.
type procmapQuery struct {
	size, flags, addr     uint64
	start, end, vmaFlags  uint64
	pageSize, off, inode  uint64
	devMajor, devMinor    uint32
	nameSize, buildIDSize uint32
	nameAddr, buildIDAddr uint64
}

const (
	procmapQueryIoctl = 0xC0686611 // _IOWR('f', 17, struct procmap_query)
	procmapRead       = 1
	procmapWrite      = 2
	procmapExec       = 4
	procmapShared     = 8
)

// queryMapping asks the kernel for the mapping holding addr: ok false when
// the ioctl is missing (an older kernel) and the maps must be read, found
// false when no mapping holds addr.
func queryMapping(fd int, addr uint64) (v vma, found, ok bool) {
	q := procmapQuery{addr: addr}
	q.size = uint64(unsafe.Sizeof(q))
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), procmapQueryIoctl, uintptr(unsafe.Pointer(&q)))
	switch e {
	case 0:
		return vma{start: q.start, end: q.end, off: q.off, inode: q.inode, dev: uint64(q.devMajor)<<32 | uint64(q.devMinor),
			perms: q.vmaFlags & (procmapRead | procmapWrite | procmapExec | procmapShared)}, true, true
	case unix.ENOENT:
		return vma{}, false, true
	}
	return vma{}, false, false
}

// mappingOf returns the mapping holding all of [addr, addr+n), or false
// when the range is not inside one mapping (or /proc is unreadable): such a
// region is registered on its own. buf is the caller's scratch space (the
// cache's, under its lock): a registration reads the maps once, and reading
// them is most of what the cache costs per region.
func mappingOf(addr, n uint64, buf []byte) (vma, bool) {
	fd, err := unix.Open("/proc/self/maps", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return vma{}, false
	}
	defer unix.Close(fd)
	if v, found, ok := queryMapping(fd, addr); ok {
		return v, found && addr+n <= v.end
	}
	return readMaps(fd, addr, n, buf)
}

// lookup is mappingOf through the cache's descriptor of /proc/self/maps,
// kept open while the kernel answers PROCMAP_QUERY on it (opening the file
// is most of a lookup's cost); c.mu is held.
func (c *mrCache) lookup(addr, n uint64) (vma, bool) {
	if c.buf == nil {
		c.buf = make([]byte, 64<<10)
		c.mapsFD = -1
		if fd, err := unix.Open("/proc/self/maps", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			if _, _, ok := queryMapping(fd, addr); ok {
				c.mapsFD = fd
			} else {
				unix.Close(fd)
			}
		}
	}
	if c.mapsFD >= 0 {
		if v, found, ok := queryMapping(c.mapsFD, addr); ok {
			return v, found && addr+n <= v.end
		}
	}
	return mappingOf(addr, n, c.buf)
}

// close releases the descriptor lookup keeps.
func (c *mrCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.buf != nil && c.mapsFD >= 0 {
		unix.Close(c.mapsFD)
	}
	c.buf, c.mapsFD = nil, -1
}

// readMaps finds the mapping in the text of /proc/self/maps open at fd.
func readMaps(fd int, addr, n uint64, buf []byte) (vma, bool) {
	have := 0
	for {
		k, err := unix.Read(fd, buf[have:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || k <= 0 {
			return vma{}, false
		}
		have += k
		lines := buf[:have]
		for {
			nl := bytes.IndexByte(lines, '\n')
			if nl < 0 {
				break
			}
			v, state := parseMapsLine(lines[:nl], addr, n)
			if state != 0 {
				return v, state > 0
			}
			lines = lines[nl+1:]
		}
		// Keep the partial line; one longer than buf (a path near
		// PATH_MAX) cannot be ours to judge: give up and register alone.
		have = copy(buf, lines)
		if have == len(buf) {
			return vma{}, false
		}
	}
}

// parseMapsLine reads "start-end perms offset dev inode [path]": 0 when the
// mapping ends at or before addr (read on), 1 with the mapping when it
// holds [addr, addr+n), -1 when the range is not inside one mapping.
func parseMapsLine(l []byte, addr, n uint64) (vma, int) {
	fl := bytes.Fields(l)
	if len(fl) < 5 {
		return vma{}, 0
	}
	se := bytes.IndexByte(fl[0], '-')
	if se < 0 {
		return vma{}, 0
	}
	s, err1 := strconv.ParseUint(string(fl[0][:se]), 16, 64)
	e, err2 := strconv.ParseUint(string(fl[0][se+1:]), 16, 64)
	if err1 != nil || err2 != nil || e <= addr {
		return vma{}, 0
	}
	if s > addr || addr+n > e {
		return vma{}, -1
	}
	off, _ := strconv.ParseUint(string(fl[2]), 16, 64)
	ino, _ := strconv.ParseUint(string(fl[4]), 10, 64)
	v := vma{start: s, end: e, off: off, inode: ino}
	if maj, mnr, ok := bytes.Cut(fl[3], []byte{':'}); ok {
		a, _ := strconv.ParseUint(string(maj), 16, 32)
		b, _ := strconv.ParseUint(string(mnr), 16, 32)
		v.dev = a<<32 | b
	}
	for i, bit := range []uint64{procmapRead, procmapWrite, procmapExec, procmapShared} {
		if i < len(fl[1]) && fl[1][i] != '-' && fl[1][i] != 'p' {
			v.perms |= bit
		}
	}
	return v, 1
}

// sameMapping reports whether the window still lies in the mapping it was
// registered for, as v (the mapping now holding the region) says: inside
// it, the same file at the same offset (or anonymous memory), the same
// permissions. The bounds themselves may have changed: the kernel merges
// anonymous mappings with new neighbours, and that must not defeat the
// cache. Anonymous memory unmapped and mapped again at the same address
// looks the same; a file mapped there does not.
func (e *sharedMR) sameMapping(v vma) bool {
	return v.start <= e.lo && e.hi <= v.end && v.dev == e.vma.dev && v.inode == e.vma.inode && v.perms == e.vma.perms &&
		v.offAt(e.lo) == e.vma.offAt(e.lo)
}

// offAt is the file offset mapped at addr (0 for anonymous memory, whose
// offset the kernel does not report).
func (v vma) offAt(addr uint64) uint64 {
	if v.inode == 0 && v.dev == 0 {
		return 0
	}
	return v.off + (addr - v.start)
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
	buf     []byte     // scratch for /proc/self/maps; nil until the first lookup
	mapsFD  int        // /proc/self/maps, open while it answers PROCMAP_QUERY; -1 if not
	entries []*sharedMR
	created uint64 // windows registered
	reused  uint64 // regions served by a window already registered
}

// mrParallel bounds the NICs registered at once.
const mrParallel = 8

// acquire returns the window covering [addr, addr+n) with access, taking a
// reference, registering it on every NIC if there is none (pre-faulted
// from parallelMin bytes). It returns nil
// (no error) for a range not inside one mapping: the caller registers it
// on its own.
func (c *mrCache) acquire(addr, n uint64, access int, nics []registrar, parallelMin uint64) (*sharedMR, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.lookup(addr, n)
	if !ok {
		return nil, nil
	}
	for _, e := range c.entries {
		if e.lo <= addr && addr+n <= e.hi && e.access&access == access && e.sameMapping(v) {
			e.refs++
			c.reused++
			return e, nil
		}
	}
	limit := maxMRSize(nics)
	if n > limit {
		// No window can hold it: the caller splits it into memory regions
		// of its own.
		return nil, nil
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
	if hi-lo >= parallelMin {
		// As for a region this long (rdma.parallel_reg_min): faulting the
		// pages in parallel beats faulting them inside ibv_reg_mr.
		preTouch(lo, hi-lo)
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

// acquireDevice is acquire for GPU memory exported as the dma-buf fd of
// its whole allocation, the region at offset off in it: the window is the
// allocation (its size is the dma-buf's), registered once on every NIC
// through that one fd. It returns nil (no error) where the cache cannot
// serve the region (the fd has no size, the allocation is longer than
// max_mr_size, or a NIC refused the dma-buf): the caller registers the
// region on its own, with its fallbacks and their errors.
func (c *mrCache) acquireDevice(addr, n uint64, dev, fd int, off uint64, access int, nics []registrar) *sharedMR {
	size, err := unix.Seek(fd, 0, 2 /* SEEK_END: a dma-buf's size */)
	if err != nil || size <= 0 || off > addr || off+n > uint64(size) {
		return nil
	}
	base := addr - off
	// A GPU allocation is known by its device, base and size; dev's top
	// bit keeps it apart from any host mapping.
	v := vma{start: base, end: base + uint64(size), dev: 1<<63 | uint64(dev)}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.vma == v && e.access&access == access {
			e.refs++
			c.reused++
			return e
		}
	}
	if uint64(size) > maxMRSize(nics) {
		return nil
	}
	mrs, err := regEach(nics, base, uint64(size), func(r registrar) (memReg, error) {
		return r.RegDmabuf(0, uint64(size), base, fd, access)
	})
	if err != nil {
		return nil
	}
	e := &sharedMR{lo: base, hi: base + uint64(size), vma: v, access: access, mrs: mrs, refs: 1}
	c.entries = append(c.entries, e)
	c.created++
	return e
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
	return regEach(nics, addr, n, func(r registrar) (memReg, error) { return r.RegMR(addr, n, access) })
}

// regEach registers with reg on every NIC, as regAll does.
func regEach(nics []registrar, addr, n uint64, reg func(registrar) (memReg, error)) ([]memReg, error) {
	mrs := make([]memReg, len(nics))
	errv := make([]error, len(nics))
	if len(nics) == 1 {
		mrs[0], errv[0] = reg(nics[0])
	} else {
		sem := make(chan struct{}, mrParallel)
		var wg sync.WaitGroup
		for i := range nics {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				mrs[i], errv[i] = reg(nics[i])
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
