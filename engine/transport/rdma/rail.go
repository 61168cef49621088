package rdma

import "github.com/tecache/te/engine/transport/internal/rails"

// A rail is one path to one peer engine: a local NIC and one of the peer's
// NICs. Its endpoint (queue pairs) may fail and be replaced; the rail
// outlives it and remembers how fast it moved bytes and how often it
// failed, which decide how much of a request it gets: that state and its
// policy are the shared rails.Rail's, measured over short windows
// (rails.Steady: a NIC completes work requests one by one) and cooled by
// the transport's Health (a number of endpoint failures within a window).
type rail struct {
	key   epKey
	local int    // local NIC index
	lname string // local NIC name
	rname string // peer NIC name
	rails.Rail
}

func newRail(key epKey, local int, lname, rname string) *rail {
	r := &rail{key: key, local: local, lname: lname, rname: rname}
	r.Measure(&rails.Steady)
	return r
}

// railTotals sums the counters of rails by NIC names.
type railTotals map[string]*[4]uint64

func (rt *railTotals) add(r *rail) {
	if *rt == nil {
		*rt = railTotals{}
	}
	k := r.lname + ":" + r.rname
	v := (*rt)[k]
	if v == nil {
		v = new([4]uint64)
		(*rt)[k] = v
	}
	c := r.Counters()
	v[0] += c.Bytes
	v[1] += c.Errors
	v[2] += c.Retries
	v[3] += c.Cooldowns
}
