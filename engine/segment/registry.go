package segment

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
)

// Location is where registered memory lives.
type Location struct {
	Kind  string // "cpu", a GPU runtime ("cuda", "hip"), "file" (a storage region) or "*" (detect)
	Index int    // device or NUMA node; -1 when unspecified
}

func (l Location) String() string {
	if l.Kind == "*" {
		return "*"
	}
	if l.Index < 0 {
		return l.Kind
	}
	return l.Kind + ":" + strconv.Itoa(l.Index)
}

// ParseLocation parses "cpu", "cpu:N", "cuda:N", "hip:N" (or KIND:N of any
// runtime registered with package gpu) or "*" (an empty string means
// "cpu"). Other strings are an invalid argument.
func ParseLocation(s string) (Location, error) {
	switch s {
	case "", "cpu":
		return Location{Kind: "cpu", Index: -1}, nil
	case "*":
		return Location{Kind: "*", Index: -1}, nil
	}
	kind, idx, ok := strings.Cut(s, ":")
	// hip:N is AMD device memory, named as Mooncake's ROCm builds name it.
	if ok && (kind == "cpu" || kind == "cuda" || kind == "hip" || gpu.Known(kind)) {
		n, err := strconv.Atoi(idx)
		if err == nil && n >= 0 && n < 1<<16 {
			return Location{Kind: kind, Index: n}, nil
		}
	}
	return Location{}, errs.New(errs.InvalidArgument, "register", "location %q is not cpu, cpu:N, cuda:N, hip:N or *", s)
}

// Region is one registered range of local memory.
type Region struct {
	Addr     uint64
	Length   uint64
	Location Location
	Remote   bool // remote-accessible: published in the descriptor
	// Desc is what the descriptor publishes for this region; transports add
	// their keys to it while registering.
	Desc BufferDesc
	// Storage is set on a storage region (a registered file range): its
	// address range is reserved but never mapped, so the CPU must never
	// touch it; its bytes move through Storage. nil for memory.
	Storage Storage

	inflight atomic.Int64
	closing  atomic.Bool
	// parent is set on a window's region: an access through the window
	// counts on the registered region it lies in as well.
	parent *Region
}

// End returns Addr+Length.
func (r *Region) End() uint64 { return r.Addr + r.Length }

// Storage moves the bytes of a storage region: the owner's servers call it
// for accesses to the region instead of touching its (unmapped) addresses.
type Storage interface {
	// Move starts moving n bytes between host memory [buf, buf+n) and the
	// region at offset off from its start (write: memory to storage) and
	// returns; done is called exactly once, when nothing touches buf any
	// more. It must not block.
	Move(write bool, off, buf, n uint64, done func(error))
	// Stage lends a host buffer of StageSize bytes that Move serves best
	// (aligned, registered with the I/O rings), waiting while none is
	// free until abort is closed; ok is false then.
	Stage(abort <-chan struct{}) (addr uint64, ok bool)
	// Unstage returns a buffer from Stage once no Move uses it.
	Unstage(addr uint64)
	// StageSize is the size of a staged buffer.
	StageSize() uint64
	// Close waits for the moves in flight and releases the storage.
	Close() error
}

// StorageOf returns the storage behind r (a window's region answers for
// the region it lies in), or nil for memory.
func StorageOf(r *Region) Storage {
	if r == nil {
		return nil
	}
	if r.parent != nil {
		return r.parent.Storage
	}
	return r.Storage
}

// Release ends an access begun by Registry.Acquire or Retain.
func (r *Region) Release() {
	r.inflight.Add(-1)
	if r.parent != nil {
		r.parent.inflight.Add(-1)
	}
}

// ReleaseN ends n accesses at once.
func (r *Region) ReleaseN(n int64) {
	r.inflight.Add(-n)
	if r.parent != nil {
		r.parent.inflight.Add(-n)
	}
}

// Parent returns the registered region a window's region lies in (nil for a
// registered region itself).
func (r *Region) Parent() *Region { return r.parent }

// Within reports whether an access holding r touches x: r is x, or r is a
// window's region inside x. Transports use it to find what holds a region
// being unregistered.
func (r *Region) Within(x *Region) bool { return r == x || (r != nil && r.parent == x) }

// Closing reports whether the region is being unregistered.
func (r *Region) Closing() bool { return r.closing.Load() }

// WaitIdle waits until no access to r is in flight or ctx ends. It backs off from a spin
// to a millisecond sleep: unregistering is rare and accesses are short.
func (r *Region) WaitIdle(ctx context.Context) error {
	for d := time.Microsecond; r.inflight.Load() > 0; {
		select {
		case <-ctx.Done():
			return errs.Wrap(errs.Timeout, "unregister", ctx.Err(), "accesses to [%#x,+%d) still in flight", r.Addr, r.Length)
		case <-time.After(d):
		}
		if d < time.Millisecond {
			d *= 2
		}
	}
	return nil
}

// WindowKeyBit marks a window's key: buffer keys have it clear, window keys
// set. An owner that meets a key with the bit set that it holds no window
// for then knows the window is gone (revoked, or never granted here) and
// refuses the access as AccessDenied, where a buffer key that does not match
// is a descriptor out of date (StaleDescriptor, which makes the initiator
// refresh and retry). 63 random bits stay in every key.
const WindowKeyBit = 1 << 63

// NewKey returns a random non-zero capability key for a buffer.
func NewKey() uint64 { return randomKey() &^ WindowKeyBit }

// newWindowKey returns a random capability key for a window.
func newWindowKey() uint64 { return randomKey() | WindowKeyBit }

func randomKey() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			// crypto/rand does not fail on Linux; keep a non-zero fallback.
			return uint64(time.Now().UnixNano()) | 1
		}
		if k := binary.LittleEndian.Uint64(b[:]); k&^WindowKeyBit != 0 {
			return k
		}
	}
}

// keyRefusal is why an access presenting key, which is not r's, is refused:
// a window key this registry holds no window for (AccessDenied), or a stale
// buffer key.
func keyRefusal(r *Region, key uint64) error {
	if key&WindowKeyBit != 0 {
		return errs.New(errs.AccessDenied, "access", "window %#x is not open here (revoked, or never granted by this engine)", key)
	}
	return errs.New(errs.StaleDescriptor, "access", "key for buffer at %#x does not match its registration", r.Addr)
}

// Registry is the set of registered local memory. Lookups are lock-free and
// O(log n): they read an immutable sorted snapshot that writers replace.
type Registry struct {
	mu      sync.Mutex // serialises writers
	snap    atomic.Pointer[snapshot]
	windows sync.Map // key -> *Window
	nwin    atomic.Int64
}

// snapshot is the sorted regions and, beside them, their start addresses: a
// binary search over the addresses touches one dense array instead of a
// region per probe.
type snapshot struct {
	rs    []*Region
	addrs []uint64
}

func newSnapshot(rs []*Region) *snapshot {
	a := make([]uint64, len(rs))
	for i, r := range rs {
		a[i] = r.Addr
	}
	return &snapshot{rs: rs, addrs: a}
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	r := &Registry{}
	r.snap.Store(newSnapshot([]*Region{}))
	return r
}

// NewRegion validates a registration request and returns a region with a fresh
// capability key.
func NewRegion(addr, length uint64, location string, remote bool) (*Region, error) {
	if length == 0 {
		return nil, errs.New(errs.InvalidArgument, "register", "zero length at %#x", addr)
	}
	if addr == 0 {
		return nil, errs.New(errs.InvalidArgument, "register", "null address")
	}
	if addr+length < addr {
		return nil, errs.New(errs.InvalidArgument, "register", "range [%#x,+%d) overflows", addr, length)
	}
	loc, err := ParseLocation(location)
	if err != nil {
		return nil, err
	}
	key := NewKey()
	return &Region{
		Addr: addr, Length: length, Location: loc, Remote: remote,
		Desc: BufferDesc{Name: loc.String(), Addr: addr, Length: length, Key: key, Rkey: []uint32{}, Lkey: []uint32{}},
	}, nil
}

// Regions returns the current snapshot, sorted by address. Do not modify it.
func (g *Registry) Regions() []*Region { return g.snap.Load().rs }

func find(s []*Region, addr uint64) int {
	return sort.Search(len(s), func(i int) bool { return s[i].Addr > addr }) - 1
}

// search returns the index of the last address <= addr, or -1.
func search(a []uint64, addr uint64) int {
	lo, hi := 0, len(a)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if a[m] <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo - 1
}

// Lookup returns the region holding [addr, addr+n) entirely.
func (g *Registry) Lookup(addr, n uint64) (*Region, bool) {
	s := g.snap.Load()
	i := search(s.addrs, addr)
	if i < 0 || n == 0 || addr+n < addr || addr+n > s.rs[i].End() {
		return nil, false
	}
	return s.rs[i], true
}

// Acquire validates a remote access by by to [addr, addr+n) under
// capability key and, when it is allowed, counts it in flight until
// Release. A key of 0 skips the key check (local accesses). A window's key
// is good for the window's ranges, and for its grantee alone when it has
// one (Window.Admits). Unregister waits for every access counted.
func (g *Registry) Acquire(addr, n, key uint64, remote bool, by Caller) (*Region, error) {
	if n == 0 {
		return nil, errs.New(errs.InvalidArgument, "access", "zero length")
	}
	if addr+n < addr {
		return nil, errs.New(errs.InvalidArgument, "access", "range [%#x,+%d) overflows", addr, n)
	}
	r, ok := g.Lookup(addr, n)
	if !ok {
		return nil, errs.New(errs.AddressNotRegistered, "access", "[%#x,+%d) is not inside one registered buffer", addr, n)
	}
	if remote && !r.Remote {
		return nil, errs.New(errs.AccessDenied, "access", "buffer at %#x is not remote-accessible", r.Addr)
	}
	if key != 0 && key != r.Desc.Key {
		if w := g.window(key); w != nil {
			return w.acquire(addr, n, by)
		}
		return nil, keyRefusal(r, key)
	}
	// Count first, then check closing: with Close setting closing before it
	// reads the count, one of the two always sees the other.
	r.inflight.Add(1)
	if r.closing.Load() {
		r.inflight.Add(-1)
		return nil, errs.New(errs.AddressNotRegistered, "access", "buffer at %#x is being unregistered", r.Addr)
	}
	return r, nil
}

// AcquireIn is Acquire for a caller that already holds a candidate region
// (the last one it used): it checks [addr, addr+n) against r alone, and falls
// back to a lookup when r does not hold the range.
func (g *Registry) AcquireIn(r *Region, addr, n, key uint64, remote bool, by Caller) (*Region, error) {
	if r == nil || r.parent != nil || n == 0 || addr < r.Addr || addr+n < addr || addr+n > r.End() || r.Closing() {
		// A window's region spans its buffer but grants only its
		// ranges: every access under a window is checked in full.
		return g.Acquire(addr, n, key, remote, by)
	}
	if remote && !r.Remote {
		return nil, errs.New(errs.AccessDenied, "access", "buffer at %#x is not remote-accessible", r.Addr)
	}
	if key != 0 && key != r.Desc.Key {
		return g.Acquire(addr, n, key, remote, by) // may be a window; the lookup decides
	}
	if !r.Retain(1) {
		return nil, errs.New(errs.AddressNotRegistered, "access", "buffer at %#x is being unregistered", r.Addr)
	}
	return r, nil
}

// Add inserts regions atomically: all or none. A region identical to one
// already registered (same address, length, location and flag) is skipped and
// the existing region is returned in its place; any other overlap is an
// AddressOverlapped error. The returned slice says which regions are new.
func (g *Registry) Add(regions ...*Region) (out []*Region, added []bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := g.snap.Load().rs
	next := append([]*Region(nil), cur...)
	out = make([]*Region, len(regions))
	added = make([]bool, len(regions))
	for i, r := range regions {
		j := find(next, r.Addr)
		if j >= 0 && next[j].Addr == r.Addr && next[j].Length == r.Length &&
			next[j].Location == r.Location && next[j].Remote == r.Remote {
			if next[j].Closing() {
				return nil, nil, errs.New(errs.AddressOverlapped, "register",
					"[%#x,+%d) is being unregistered", r.Addr, r.Length)
			}
			out[i] = next[j]
			continue
		}
		if (j >= 0 && next[j].End() > r.Addr) || (j+1 < len(next) && next[j+1].Addr < r.End()) {
			return nil, nil, errs.New(errs.AddressOverlapped, "register",
				"[%#x,+%d) overlaps a registered buffer", r.Addr, r.Length)
		}
		next = append(next, nil)
		copy(next[j+2:], next[j+1:])
		next[j+1] = r
		out[i], added[i] = r, true
	}
	g.snap.Store(newSnapshot(next))
	return out, added, nil
}

// Close marks the regions starting at addrs as being unregistered: from here
// on new accesses are refused, while the regions stay in the registry (and
// keep their range) until Drop, so the range cannot be registered again while
// accesses may still be in flight and a failed unregistration can be retried.
// All or none: an unknown address is an AddressNotRegistered error; a region
// already closing is returned again.
func (g *Registry) Close(addrs ...uint64) ([]*Region, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := g.snap.Load().rs
	out := make([]*Region, 0, len(addrs))
	for _, a := range addrs {
		j := find(cur, a)
		if j < 0 || cur[j].Addr != a {
			return nil, errs.New(errs.AddressNotRegistered, "unregister", "no buffer registered at %#x", a)
		}
		dup := false
		for _, r := range out {
			dup = dup || r == cur[j]
		}
		if !dup {
			out = append(out, cur[j])
		}
	}
	for _, r := range out {
		r.closing.Store(true)
	}
	return out, nil
}

// Drop removes closed regions from the registry once nothing can touch them.
func (g *Registry) Drop(rs ...*Region) {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := g.snap.Load().rs
	next := make([]*Region, 0, len(cur))
	for _, r := range cur {
		gone := false
		for _, x := range rs {
			gone = gone || x == r
		}
		if !gone {
			next = append(next, r)
		}
	}
	g.snap.Store(newSnapshot(next))
}

// Idle reports whether no access to r is in flight.
func (r *Region) Idle() bool { return r.inflight.Load() <= 0 }

// Retain counts n more accesses to r, already looked up by the caller; it
// fails (counting nothing) once r is closing. Each access ends with Release.
func (r *Region) Retain(n int64) bool {
	r.inflight.Add(n)
	if r.closing.Load() {
		r.inflight.Add(-n)
		return false
	}
	return true
}
