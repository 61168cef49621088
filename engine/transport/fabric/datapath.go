package fabric

import (
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

var (
	errCanceled error = errs.New(errs.Canceled, "fabric", "canceled")
	// errTornDown ends operations of other requests on an endpoint closed
	// to flush a canceled one: they go again on a new endpoint.
	errTornDown error = errs.New(errs.Canceled, "fabric", "endpoint closed to flush canceled operations")
)

// maxTries bounds how often an operation goes again after its endpoint was
// torn down under it.
const maxTries = 3

// request is a transport.Request in flight: its slices are operations.
type request struct {
	tk       transport.Ticket
	left     atomic.Int32
	err      atomic.Pointer[error]
	canceled atomic.Bool
	pe       atomic.Pointer[peerEP]
	d        *segment.Desc
	li, ri   int
}

// op is one fi_write or fi_read of a request.
type op struct {
	q      *request
	pe     *peerEP
	write  bool
	local  uint64
	remote uint64 // in the owner's addressing: virtual, or offset in its region
	n      uint64
	key    uint64
	desc   uintptr
	slot   int32
	tries  int
}

func (o *op) kind() string {
	if o.write {
		return "write"
	}
	return "read"
}

// Submit cuts each request into operations of at most fabric.slice bytes
// and hands them to the endpoint to the peer; the NIC's poller posts them.
func (t *Transport) Submit(reqs []transport.Request) {
	for i := range reqs {
		if err := t.submit(&reqs[i]); err != nil {
			reqs[i].Complete(err)
		}
	}
}

func (t *Transport) submit(r *transport.Request) error {
	if t.closing.Load() {
		return errs.New(errs.Closed, "fabric", "transport closed")
	}
	nd, err := parseEndpoint(r.Peer)
	if err != nil {
		return err
	}
	li, ri, err := t.pair(r.Peer, nd)
	if err != nil {
		return err
	}
	key, err := bufferKey(r.Buffer, ri)
	if err != nil {
		return errs.Wrap(errs.StaleDescriptor, "fabric", err, "segment %q", r.Peer.Name)
	}
	n := t.nics[li]
	desc, ok := t.localDesc(r.Region, li)
	if !ok {
		return errs.New(errs.AddressNotRegistered, "fabric", "local memory [%#x,+%d) is not registered with %s", r.Local, r.Length, n.name)
	}
	remote := r.Remote
	if !nd[ri].Virt {
		remote -= r.Buffer.Addr
	}
	pe, err := t.endpointFor(r.Peer, li, ri, nd[ri].Name)
	if err != nil {
		return err
	}
	q := &request{tk: r.Ticket(), d: r.Peer, li: li, ri: ri}
	q.pe.Store(pe)
	slice := t.opt.Slice
	count := (r.Length + slice - 1) / slice
	ops := make([]*op, 0, count)
	for off := uint64(0); off < r.Length; off += slice {
		ops = append(ops, &op{q: q, pe: pe, write: r.Op == transport.Write, local: r.Local + off, remote: remote + off,
			n: min(slice, r.Length-off), key: key, desc: desc, slot: -1})
	}
	q.left.Store(int32(len(ops)))
	r.Priv = q
	if !pe.send(ops) {
		// It died between the lookup and now: one more try on a new one.
		for _, o := range ops {
			t.retry(o, errTornDown)
		}
	}
	return nil
}

// bufferKey returns the key of the owner's NIC ri for buf.
func bufferKey(buf *segment.BufferDesc, ri int) (uint64, error) {
	s := buf.Extra[ExtraKeys]
	for i := 0; i < ri && s != ""; i++ {
		_, s, _ = strings.Cut(s, ",")
	}
	k, _, _ := strings.Cut(s, ",")
	v, err := strconv.ParseUint(k, 16, 64)
	if err != nil || k == "" {
		return 0, errs.New(errs.StaleDescriptor, "fabric", "buffer [%#x,+%d) has no fabric key for NIC %d", buf.Addr, buf.Length, ri)
	}
	return v, nil
}

// opDone ends one operation; the last one ends its request with the
// first error any of them had.
func (t *Transport) opDone(o *op, err error) {
	q := o.q
	if err != nil {
		q.err.CompareAndSwap(nil, &err)
	}
	if q.left.Add(-1) != 0 {
		return
	}
	var out error
	if p := q.err.Load(); p != nil {
		out = *p
	}
	q.tk.Complete(out)
}

// retry sends an operation whose endpoint died under it again on a new
// endpoint to the same peer NIC, a bounded number of times; a canceled
// request's operation ends instead. Operations are idempotent (the same
// bytes to the same place), so one that ran before the flush may run again.
func (t *Transport) retry(o *op, why error) {
	if o.q.canceled.Load() {
		t.opDone(o, errCanceled)
		return
	}
	o.tries++
	if o.tries > maxTries || t.closing.Load() {
		t.opDone(o, why)
		return
	}
	t.st.retries.Add(1)
	pe, err := t.endpointFor(o.q.d, o.q.li, o.q.ri, o.pe.rnic)
	if err != nil {
		t.opDone(o, err)
		return
	}
	o.pe = pe
	o.q.pe.Store(pe)
	if !pe.send([]*op{o}) {
		t.opDone(o, why)
	}
}

// Cancel ends requests early: operations not yet posted end at once;
// posted ones end at their completion, and if one is still posted after
// fabric's cancel grace its endpoint is closed, the flush after which the
// provider touches none of its memory (the other requests' operations on
// it go again on a new endpoint). Cancel does not wait.
func (t *Transport) Cancel(reqs []*transport.Request) {
	deadline := time.Now().Add(t.opt.CancelGrace)
	for _, r := range reqs {
		q, ok := r.Priv.(*request)
		if !ok || q == nil {
			continue
		}
		q.canceled.Store(true)
		pe := q.pe.Load()
		if pe == nil {
			continue
		}
		pe.mu.Lock()
		var drop []*op
		if !pe.ready {
			keep := pe.pending[:0]
			for _, o := range pe.pending {
				if o.q == q {
					drop = append(drop, o)
				} else {
					keep = append(keep, o)
				}
			}
			pe.pending = keep
		}
		pe.mu.Unlock()
		for _, o := range drop {
			t.opDone(o, errCanceled)
		}
		n := pe.n
		n.mu.Lock()
		n.cancels = append(n.cancels, cancelReq{pe: pe, deadline: deadline})
		n.mu.Unlock()
		n.wake()
	}
}
