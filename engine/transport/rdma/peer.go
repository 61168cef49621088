package rdma

import (
	"github.com/tecache/te/engine/transport/internal/rails"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
)

// peerInfo is what the transport derives from one peer descriptor: its NICs,
// the rails (NIC pairs) to it and the endpoint of each, and the routing plan
// of each pair of memory locations. It is built once per descriptor the
// engine hands over (a descriptor is immutable; a new version is a new one),
// so requests neither parse nor allocate for it.
type peerInfo struct {
	desc   *segment.Desc
	nics   []nicInfo
	rails  []*rail   // every (local NIC, peer NIC) pair of one link layer
	rix    []int     // rix[x]: rails[x]'s NIC index in nics
	at     [][]int32 // at[local][peer NIC]: index in rails, or -1
	health *rails.Peer
	err    error // why the descriptor is unusable
	// eps caches the endpoint of each rail; the map in Transport under mu
	// stays the authority and is consulted only when this one is empty or
	// failed.
	eps   []atomic.Pointer[endpoint]
	plans sync.Map // planKey -> *plan
}

// planKey names a routing plan: the local memory location and the NICs the
// target buffer says are near it.
type planKey struct {
	local segment.Location
	near  string
}

// plan is where requests between two memory locations go: tier 0 (the
// local location's preferred NICs paired with the target buffer's) carries
// them; tier 1 (every other rail, those with one near end first) takes
// what fails there.
type plan struct {
	tier0, tier1 []int32
}

// peerOf returns the parsed form of d, from the cache when d is the
// descriptor last seen for its segment.
func (t *Transport) peerOf(d *segment.Desc) *peerInfo {
	if d == nil {
		return &peerInfo{err: errs.New(errs.InvalidArgument, "rdma", "request without a peer descriptor")}
	}
	if pi := t.lastPeer.Load(); pi != nil && pi.desc == d {
		return pi // no hashing of the name for every request to one peer
	}
	if v, ok := t.peers.Load(d.Name); ok {
		if pi := v.(*peerInfo); pi.desc == d {
			t.lastPeer.Store(pi)
			return pi
		}
	}
	pi := &peerInfo{desc: d}
	if t.isGone(d.Instance) {
		// A descriptor of an incarnation that restarted since (a request
		// submitted with it before the engine refreshed it): no rails
		// for it, and the rails of its successor stay.
		pi.err = errGone(d)
		return pi
	}
	pi.nics, pi.err = peerNICs(d)
	if pi.err == nil {
		t.buildRails(pi)
		if len(pi.rails) == 0 {
			pi.err = errs.New(errs.TransportUnavailable, "rdma", "no NIC here shares a link layer with %q (%s vs %s)",
				d.Name, endpointString(t.local), endpointString(pi.nics))
		}
	}
	pi.eps = make([]atomic.Pointer[endpoint], len(pi.rails))
	t.mu.Lock()
	if _, gone := t.gone[d.Instance]; gone {
		// Its successor came while the rails were built: retire drops
		// them again.
		t.mu.Unlock()
		t.retire(d.Name, d.Instance)
		return &peerInfo{desc: d, err: errGone(d)}
	}
	retired := ""
	if old, ok := t.peers.Swap(d.Name, pi); ok {
		if o := old.(*peerInfo); o.desc != nil && o.desc.Instance != d.Instance {
			retired = o.desc.Instance
			t.markGoneLocked(retired)
		}
	}
	t.mu.Unlock()
	if retired != "" {
		t.retire(d.Name, retired)
	}
	t.lastPeer.Store(pi)
	return pi
}

// maxGone bounds the restarted peer instances the transport remembers, to
// refuse their late descriptors.
const maxGone = 1024

// markGoneLocked remembers that instance restarted; t.mu is held. A peer
// without an instance id (a Mooncake engine) is not remembered: the id is
// shared by every such peer.
func (t *Transport) markGoneLocked(instance string) {
	if _, ok := t.gone[instance]; ok || instance == "" {
		return
	}
	if len(t.goneOrder) >= maxGone {
		delete(t.gone, t.goneOrder[0])
		t.goneOrder = t.goneOrder[1:]
	}
	t.gone[instance] = struct{}{}
	t.goneOrder = append(t.goneOrder, instance)
}

func (t *Transport) isGone(instance string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.gone[instance]
	return ok
}

// errGone is why a request with the descriptor of a restarted peer
// instance is refused: the engine looks the segment up again.
func errGone(d *segment.Desc) error {
	return errs.New(errs.StaleDescriptor, "rdma", "segment %q restarted: instance %s is gone", d.Name, d.Instance)
}

// buildRails lists the rails to the peer: every local NIC with every peer
// NIC of its link layer, sharing the transport's rail and health state for
// the peer instance.
func (t *Transport) buildRails(pi *peerInfo) {
	inst := pi.desc.Instance
	t.mu.Lock()
	defer t.mu.Unlock()
	pi.health = t.peerH[inst]
	if pi.health == nil {
		pi.health = &rails.Peer{}
		t.peerH[inst] = pi.health
	}
	pi.at = make([][]int32, len(t.local))
	for i, l := range t.local {
		pi.at[i] = make([]int32, len(pi.nics))
		for j, r := range pi.nics {
			pi.at[i][j] = -1
			if l.link != r.link {
				continue
			}
			key := epKey{instance: inst, local: i, remote: r.name}
			rl := t.rails[key]
			if rl == nil {
				rl = newRail(key, i, l.name, r.name)
				t.rails[key] = rl
			}
			pi.at[i][j] = int32(len(pi.rails))
			pi.rails = append(pi.rails, rl)
			pi.rix = append(pi.rix, j)
		}
	}
}

// retire forgets a peer instance that restarted: the rails' counters go to
// the totals, their health does not carry over, and its endpoints fail, so
// that their queue pairs are destroyed once nothing is posted on them. The
// engine may learn of the restart from a fresh descriptor without a request
// ever failing on those endpoints (a store's watch, a segment opened
// again): idle, they would hold their queue pairs for good, one set per
// restart (Mooncake's deployments ran out of queue pairs so).
func (t *Transport) retire(name, instance string) {
	t.mu.Lock()
	for k, r := range t.rails {
		if k.instance == instance {
			t.retired.add(r)
			delete(t.rails, k)
		}
	}
	delete(t.peerH, instance)
	var eps []*endpoint
	for k, ep := range t.eps {
		if k.instance == instance && ep.peer.name == name {
			eps = append(eps, ep)
		}
	}
	t.mu.Unlock()
	// Outside t.mu: an endpoint's lock comes first.
	for _, ep := range eps {
		ep.fail(errs.New(errs.StaleDescriptor, "rdma", "segment %q restarted: instance %s is gone", name, instance))
	}
}

// plan returns the routing plan for requests from local memory at loc to a
// buffer whose near NICs are near (ExtraNear).
func (pi *peerInfo) plan(t *Transport, loc segment.Location, near string) *plan {
	k := planKey{loc, near}
	if v, ok := pi.plans.Load(k); ok {
		return v.(*plan)
	}
	lt := t.loc.tiers(loc)
	v, _ := pi.plans.LoadOrStore(k, pi.buildPlan(lt, parseNear(near, len(pi.nics))))
	return v.(*plan)
}

// buildPlan pairs the local location's preferred NICs with the buffer's
// (each list cycled to the longer's length, so every near NIC on either side
// carries a share) for tier 0, and ranks every other rail for tier 1.
func (pi *peerInfo) buildPlan(lt *localTiers, near []int) *plan {
	lp := lt.pref
	if len(lp) == 0 {
		lp = append(append([]int(nil), lt.pref...), lt.other...)
	}
	rp := near
	if len(rp) == 0 {
		rp = make([]int, len(pi.nics))
		for i := range rp {
			rp[i] = i
		}
	}
	p := &plan{}
	in0 := map[int32]bool{}
	for i := 0; i < max(len(lp), len(rp)); i++ {
		l := lp[i%len(lp)]
		// The i-th near peer NIC, or the next one this NIC can talk to.
		for k := 0; k < len(rp); k++ {
			if x := pi.at[l][rp[(i+k)%len(rp)]]; x >= 0 {
				if !in0[x] {
					in0[x] = true
					p.tier0 = append(p.tier0, x)
				}
				break
			}
		}
	}
	nearL := map[int]bool{}
	for _, l := range lp {
		nearL[l] = true
	}
	nearR := map[int]bool{}
	for _, r := range rp {
		nearR[r] = true
	}
	score := func(x int32) int {
		s := 0
		if nearL[pi.rails[x].local] {
			s++
		}
		if nearR[pi.rix[x]] {
			s++
		}
		return s
	}
	for x := range pi.rails {
		if !in0[int32(x)] {
			p.tier1 = append(p.tier1, int32(x))
		}
	}
	slices.SortStableFunc(p.tier1, func(a, b int32) int { return score(b) - score(a) })
	return p
}

// remoteIndex is rail x's NIC index in the peer's devices.
func (pi *peerInfo) remoteIndex(x int32) int { return pi.rix[x] }
