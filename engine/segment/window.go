package segment

import (
	"sort"
	"strconv"
	"sync/atomic"

	"github.com/tecache/te/internal/errs"
)

// A window is a grant over parts of registered, remote-accessible memory under
// a key of its own, in the spirit of an RDMA memory window: a peer presents
// the window's key instead of the buffer's, the owner checks that each access
// lies inside one of the window's ranges, and revoking the window refuses new
// accesses under it and lets the owner wait for (or cut) those in flight
// without unregistering the memory. The handoff grants one per transfer over
// that transfer's blocks, so once a transfer is over no late byte of it can
// land in blocks already handed to another request.
//
// Each registered region the window's ranges lie in gets a region of the
// window's own (its Parent is the registered one): accesses are counted on
// both, so revoking waits for the window's accesses and unregistering the
// memory still waits for everyone's.

// Range is [Addr, Addr+Length).
type Range struct{ Addr, Length uint64 }

// Caller is the engine an access comes from, as the owner knows it: Name
// is its segment name and Instance its instance id. Known says the owner
// knows them: the engine is in this process (local, file), or the session
// the access arrives on proved them with the cluster secret. Without a
// secret nothing about a remote peer is known (te trusts the network by
// design then): a window granted to a grantee is honoured for any caller,
// as a bearer key, and a bindable one is never bound by such an access.
type Caller struct {
	Name, Instance string
	Known          bool
}

// Anyone is the caller of an access whose origin the owner does not know.
var Anyone = Caller{}

// Window is a granted window.
type Window struct {
	Key uint64
	// Grantee is the segment name of the only engine that may use the
	// window ("": anyone holding the key, a bearer grant, unless
	// Bindable).
	Grantee string
	// Bindable says the window was granted to the first engine that uses
	// it (GrantWindowToFirst): the first access by a known caller binds
	// it to that caller's segment and instance, or the owner binds it to
	// a segment first (Bind); every other known caller is refused after.
	Bindable bool
	bound    atomic.Pointer[Caller]
	starts   []uint64 // sorted, merged ranges
	ends     []uint64
	owner    []int     // index into regions for each range
	regions  []*Region // one per registered region the ranges lie in
	closing  atomic.Bool
}

// Regions returns the window's own regions (one per registered region its
// ranges lie in).
func (w *Window) Regions() []*Region { return w.regions }

// Bytes is the total length of the window's ranges.
func (w *Window) Bytes() uint64 {
	var n uint64
	for i := range w.starts {
		n += w.ends[i] - w.starts[i]
	}
	return n
}

// MaxWindows bounds the windows an engine holds at once: each costs memory
// for its ranges, and peers cause them to be granted.
const MaxWindows = 1 << 16

// MaxWindowRanges bounds the ranges of one window (after merging).
const MaxWindowRanges = 1 << 20

// GrantWindow grants a window over ranges, each of which must lie inside one
// registered, remote-accessible region that is not being unregistered.
// Adjacent and overlapping ranges are merged. Whoever holds the key may use
// it (GrantWindowTo binds it to one engine).
func (g *Registry) GrantWindow(ranges []Range) (*Window, error) {
	return g.GrantWindowTo("", ranges)
}

// MaxGranteeLen bounds a grantee's name (a segment name).
const MaxGranteeLen = 4096

// GrantWindowTo is GrantWindow for the engine whose segment is named
// grantee alone: an access under the window from a known caller of another
// name is refused (Caller). An empty grantee grants to anyone.
func (g *Registry) GrantWindowTo(grantee string, ranges []Range) (*Window, error) {
	return g.grant(grantee, false, ranges)
}

// GrantWindowToFirst is GrantWindow for the first engine that uses the
// window, whoever that is: its first access by a known caller binds it to
// that caller (Window.Admits), unless the owner bound it first
// (Window.Bind). For an owner that does not know yet which engine will
// use the window, and learns it later (the handoff, once the sidecar
// pairs the transfer): it checks, with Bind, that the one it learns of is
// the one that used it.
func (g *Registry) GrantWindowToFirst(ranges []Range) (*Window, error) {
	return g.grant("", true, ranges)
}

func (g *Registry) grant(grantee string, bindable bool, ranges []Range) (*Window, error) {
	if len(grantee) > MaxGranteeLen {
		return nil, errs.New(errs.InvalidArgument, "grant window", "grantee name of %d bytes, more than %d", len(grantee), MaxGranteeLen)
	}
	if len(ranges) == 0 {
		return nil, errs.New(errs.InvalidArgument, "grant window", "no ranges")
	}
	rs := append([]Range(nil), ranges...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].Addr < rs[j].Addr })
	w := &Window{Key: newWindowKey(), Grantee: grantee, Bindable: bindable}
	byParent := map[*Region]int{}
	// A range may run over several registered buffers that follow each
	// other (one per layer, say): it is cut at their boundaries.
	var parts []Range
	for _, r := range rs {
		if r.Length == 0 || r.Addr+r.Length < r.Addr {
			return nil, errs.New(errs.InvalidArgument, "grant window", "range [%#x,+%d) is empty or overflows", r.Addr, r.Length)
		}
		for a, end := r.Addr, r.Addr+r.Length; a < end; {
			p, ok := g.Lookup(a, 1)
			if !ok || p.Closing() {
				return nil, errs.New(errs.AddressNotRegistered, "grant window", "[%#x,+%d) is not inside registered buffers", r.Addr, r.Length)
			}
			n := min(end, p.End()) - a
			parts = append(parts, Range{a, n})
			a += n
		}
	}
	for _, r := range parts {
		p, _ := g.Lookup(r.Addr, r.Length)
		if !p.Remote {
			return nil, errs.New(errs.AccessDenied, "grant window", "buffer at %#x is not remote-accessible", p.Addr)
		}
		k, ok := byParent[p]
		if !ok {
			k = len(w.regions)
			byParent[p] = k
			w.regions = append(w.regions, &Region{
				Addr: p.Addr, Length: p.Length, Location: p.Location, Remote: true, parent: p,
				Desc: BufferDesc{Name: p.Desc.Name, Addr: p.Addr, Length: p.Length, Key: w.Key},
			})
		}
		if n := len(w.starts); n > 0 && w.owner[n-1] == k && r.Addr <= w.ends[n-1] {
			w.ends[n-1] = max(w.ends[n-1], r.Addr+r.Length)
			continue
		}
		w.starts = append(w.starts, r.Addr)
		w.ends = append(w.ends, r.Addr+r.Length)
		w.owner = append(w.owner, k)
	}
	if len(w.starts) > MaxWindowRanges {
		return nil, errs.New(errs.TooLarge, "grant window", "%d ranges, more than %d", len(w.starts), MaxWindowRanges)
	}
	if g.nwin.Add(1) > MaxWindows {
		g.nwin.Add(-1)
		return nil, errs.New(errs.ResourceExhausted, "grant window", "%d windows granted already", MaxWindows)
	}
	g.windows.Store(w.Key, w)
	return w, nil
}

func (g *Registry) window(key uint64) *Window {
	if v, ok := g.windows.Load(key); ok {
		return v.(*Window)
	}
	return nil
}

// Window returns the window granted under key, if any.
func (g *Registry) Window(key uint64) (*Window, bool) {
	w := g.window(key)
	return w, w != nil
}

// Admits says whether by may use the window: nil, or an AccessDenied error
// naming the window, its grantee and the caller. A bindable window that
// no known caller used yet, nor its owner bound, is bound to by here,
// atomically: the first of two callers racing for it wins, the other is
// refused. Callers check everything else about the access first, so that
// only an access that would go ahead binds.
func (w *Window) Admits(by Caller) error {
	if !by.Known {
		return nil
	}
	if w.Grantee != "" {
		if by.Name == w.Grantee {
			return nil
		}
		return errs.New(errs.AccessDenied, "access", "window %#x is granted to segment %q; %s may not use it", w.Key, w.Grantee, by.describe())
	}
	if !w.Bindable {
		return nil
	}
	b := w.bound.Load()
	if b == nil {
		c := by
		if w.bound.CompareAndSwap(nil, &c) {
			return nil
		}
		b = w.bound.Load()
	}
	if b.Name == by.Name && (b.Instance == "" || b.Instance == by.Instance) {
		return nil
	}
	return errs.New(errs.AccessDenied, "access", "window %#x is bound to %s; %s may not use it", w.Key, b.describe(), by.describe())
}

// describe names a caller in an error.
func (c Caller) describe() string {
	switch {
	case c.Name == "":
		return "an engine without a segment, instance " + c.Instance
	case c.Instance == "":
		return strconv.Quote(c.Name)
	}
	return strconv.Quote(c.Name) + " (instance " + c.Instance + ")"
}

// Bind binds a bindable window to the engine whose segment is named peer,
// if no known caller used it yet: from then on only that engine may use
// it. It returns nil when the window is bound (or granted) to peer, now
// or already; an AccessDenied error naming the engine it is bound to when
// that is another (one that used it first); InvalidArgument for a bearer
// window (GrantWindow), which cannot be bound after the fact, or a bad
// name.
func (w *Window) Bind(peer string) error {
	if peer == "" || len(peer) > MaxGranteeLen {
		return errs.New(errs.InvalidArgument, "bind window", "peer name of %d bytes, want 1..%d", len(peer), MaxGranteeLen)
	}
	if w.Grantee != "" {
		if w.Grantee == peer {
			return nil
		}
		return errs.New(errs.AccessDenied, "bind window", "window %#x is granted to segment %q, not %q", w.Key, w.Grantee, peer)
	}
	if !w.Bindable {
		return errs.New(errs.InvalidArgument, "bind window", "window %#x is a bearer grant (GrantWindow): only a window granted to the first engine that uses it (GrantWindowToFirst) can be bound", w.Key)
	}
	if w.bound.CompareAndSwap(nil, &Caller{Name: peer, Known: true}) {
		return nil
	}
	if b := w.bound.Load(); b.Name != peer {
		return errs.New(errs.AccessDenied, "bind window", "window %#x was bound to %s, which used it first, not to %q", w.Key, b.describe(), peer)
	}
	return nil
}

// Peer returns the segment name of the engine the window is granted or
// bound to ("" for a bearer window and a bindable one not bound yet).
func (w *Window) Peer() string {
	if w.Grantee != "" {
		return w.Grantee
	}
	if b := w.bound.Load(); b != nil {
		return b.Name
	}
	return ""
}

// acquire counts an access by by to [addr, addr+n) under the window, on its
// region and on the registered one. The range must lie inside one of its
// ranges.
func (w *Window) acquire(addr, n uint64, by Caller) (*Region, error) {
	i := sort.Search(len(w.starts), func(i int) bool { return w.starts[i] > addr }) - 1
	if i < 0 || addr+n > w.ends[i] {
		return nil, errs.New(errs.AccessDenied, "access", "[%#x,+%d) is outside the window granted", addr, n)
	}
	if err := w.Admits(by); err != nil {
		return nil, err
	}
	r := w.regions[w.owner[i]]
	if !r.Retain(1) {
		return nil, errs.New(errs.AccessDenied, "access", "the window over [%#x,+%d) was revoked", addr, n)
	}
	if !r.parent.Retain(1) {
		r.inflight.Add(-1)
		return nil, errs.New(errs.AddressNotRegistered, "access", "buffer at %#x is being unregistered", r.parent.Addr)
	}
	return r, nil
}

// WindowFor returns the region of the open window granted as key that holds
// [addr, addr+n) in one of its ranges, and that range: for a transport whose
// peers access memory on their own once told a key is good (shm), the
// owner's check at grant time. A window that does not admit by (Admits)
// returns its refusal, with ok false.
func (g *Registry) WindowFor(key, addr, n uint64, by Caller) (r *Region, start, end uint64, ok bool, err error) {
	w := g.window(key)
	if w == nil || w.closing.Load() || n == 0 || addr+n < addr {
		return nil, 0, 0, false, nil
	}
	i := sort.Search(len(w.starts), func(i int) bool { return w.starts[i] > addr }) - 1
	if i < 0 || addr+n > w.ends[i] {
		return nil, 0, 0, false, nil
	}
	r = w.regions[w.owner[i]]
	if r.parent.Closing() {
		return nil, 0, 0, false, nil
	}
	if err := w.Admits(by); err != nil {
		return nil, 0, 0, false, err
	}
	return r, w.starts[i], w.ends[i], true, nil
}

// CloseWindow refuses new accesses under the window granted as key and
// returns it; the caller waits for its regions to be idle, then drops it.
func (g *Registry) CloseWindow(key uint64) (*Window, error) {
	w := g.window(key)
	if w == nil {
		return nil, errs.New(errs.NotFound, "revoke window", "no window %#x", key)
	}
	w.closing.Store(true)
	for _, r := range w.regions {
		r.closing.Store(true)
	}
	return w, nil
}

// WindowsOver returns the regions of the windows that lie in the registered
// region r (one per window at most). A transport revoking r (shm) revokes
// these with it: a window dies with the memory under it.
func (g *Registry) WindowsOver(r *Region) []*Region {
	var out []*Region
	g.windows.Range(func(_, v any) bool {
		for _, wr := range v.(*Window).regions {
			if wr.parent == r {
				out = append(out, wr)
			}
		}
		return true
	})
	return out
}

// CloseWindowsOver refuses every access under the windows' regions that lie
// in rs (which are being unregistered) and returns those regions. The
// windows stay known: their other regions still serve, and RevokeWindow
// still ends them.
func (g *Registry) CloseWindowsOver(rs []*Region) []*Region {
	var out []*Region
	for _, r := range rs {
		for _, wr := range g.WindowsOver(r) {
			wr.closing.Store(true)
			out = append(out, wr)
		}
	}
	return out
}

// DropWindow forgets a closed window.
func (g *Registry) DropWindow(w *Window) {
	if _, ok := g.windows.LoadAndDelete(w.Key); ok {
		g.nwin.Add(-1)
	}
}
