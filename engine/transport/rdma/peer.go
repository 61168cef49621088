package rdma

import (
	"sync/atomic"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
)

// peerInfo is what the transport derives from one peer descriptor: its NICs,
// the NIC pairs requests use and the endpoint of each pair. It is built once
// per descriptor the engine hands over (a descriptor is immutable; a new
// version is a new one), so requests neither parse nor allocate for it.
type peerInfo struct {
	desc  *segment.Desc
	nics  []nicInfo
	pairs [][2]int // (local NIC, peer NIC) indexes
	err   error    // why the descriptor is unusable
	// eps caches the endpoint of each pair; the map in Transport under mu
	// stays the authority and is consulted only when this one is empty or
	// failed.
	eps []atomic.Pointer[endpoint]
}

// peerOf returns the parsed form of d, from the cache when d is the
// descriptor last seen for its segment.
func (t *Transport) peerOf(d *segment.Desc) *peerInfo {
	if d == nil {
		return &peerInfo{err: errs.New(errs.InvalidArgument, "rdma", "request without a peer descriptor")}
	}
	if v, ok := t.peers.Load(d.Name); ok {
		if pi := v.(*peerInfo); pi.desc == d {
			return pi
		}
	}
	pi := &peerInfo{desc: d}
	pi.nics, pi.err = peerNICs(d)
	if pi.err == nil {
		pi.pairs = pairNICs(t.local, pi.nics)
		if len(pi.pairs) == 0 {
			pi.err = errs.New(errs.TransportUnavailable, "rdma", "no NIC here shares a link layer with %q (%s vs %s)",
				d.Name, endpointString(t.local), endpointString(pi.nics))
		}
	}
	pi.eps = make([]atomic.Pointer[endpoint], len(pi.pairs))
	t.peers.Store(d.Name, pi)
	return pi
}
