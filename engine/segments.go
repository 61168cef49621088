package engine

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
)

// segState is the cached state of one opened remote segment, shared by every
// handle to it.
type segState struct {
	name  string
	local bool // this engine's own segment: always the live descriptor
	refs  int  // guarded by Engine.segMu

	desc  atomic.Pointer[segment.Desc]
	stale atomic.Bool // set when a transfer says the descriptor is out of date
	// pick caches the transport chosen for host memory under one
	// descriptor, [0] for requests without a window and [1] for those
	// under one (which only some transports carry); route is what served
	// each memory class last (stats).
	pick  [2]atomic.Pointer[pickCache]
	route [numMemClasses]atomic.Pointer[route]

	// One refresh at a time per segment; callers wait on its channel, not
	// on a lock, so a slow peer stalls only the submits that need it.
	mu      sync.Mutex
	flight  *refreshCall
	fetched time.Time // when desc was last fetched
}

type refreshCall struct {
	done chan struct{}
	d    *segment.Desc
	err  error
}

// Segment is an open handle to a (usually remote) segment. It stays valid
// until CloseSegment; the descriptor behind it is refreshed when the peer
// restarts or re-registers.
type Segment struct {
	e      *Engine
	st     *segState
	closed atomic.Bool
}

// Name returns the segment's name.
func (s *Segment) Name() string { return s.st.name }

// Descriptor returns the segment's current descriptor (refreshed first if a
// transfer found it stale).
func (s *Segment) Descriptor() (*segment.Desc, error) {
	d, err := s.e.current(s.st)
	if err != nil {
		return nil, err
	}
	return d.Clone(), nil
}

// OpenSegment returns a handle to the named segment, fetching its descriptor
// (from the peer itself in peer-to-peer mode, else from the store) unless a
// handle to it is already open. Blocks up to the RPC timeout.
func (e *Engine) OpenSegment(name string) (*Segment, error) {
	if err := e.live("open segment"); err != nil {
		return nil, err
	}
	if name == "" {
		return nil, errs.New(errs.InvalidArgument, "open segment", "empty segment name")
	}
	start := time.Now()
	e.segMu.Lock()
	if st := e.segs[name]; st != nil {
		st.refs++
		e.segMu.Unlock()
		// A cached entry a watch or a failed transfer marked stale is
		// looked up again, so an open never hands out a descriptor known
		// to be out of date (or a segment that is gone).
		if _, err := e.current(st); err != nil {
			e.segMu.Lock()
			st.refs--
			if st.refs == 0 && e.segs[name] == st {
				delete(e.segs, name)
			}
			e.segMu.Unlock()
			return nil, err
		}
		e.logSegmentOpened(st, start, true)
		return &Segment{e: e, st: st}, nil
	}
	e.segMu.Unlock()

	st := &segState{name: name, local: name == e.name}
	if !st.local {
		d, err := e.fetch(name)
		if err != nil {
			return nil, err
		}
		st.desc.Store(d)
		st.fetched = time.Now()
	}
	e.segMu.Lock()
	defer e.segMu.Unlock()
	if cur := e.segs[name]; cur != nil { // lost a race with another open
		cur.refs++
		return &Segment{e: e, st: cur}, nil
	}
	st.refs = 1
	e.segs[name] = st
	e.logSegmentOpened(st, start, false)
	return &Segment{e: e, st: st}, nil
}

// CloseSegment releases a handle; the cached descriptor goes with the last one.
// Closing a handle twice is an InvalidArgument error.
func (e *Engine) CloseSegment(s *Segment) error {
	if s == nil || s.e != e {
		return errs.New(errs.InvalidArgument, "close segment", "not a segment of this engine")
	}
	if !s.closed.CompareAndSwap(false, true) {
		return errs.New(errs.InvalidArgument, "close segment", "segment %q already closed", s.st.name)
	}
	e.segMu.Lock()
	defer e.segMu.Unlock()
	s.st.refs--
	if s.st.refs == 0 && e.segs[s.st.name] == s.st {
		delete(e.segs, s.st.name)
	}
	return nil
}

// fetch reads a peer's descriptor: from the peer's RPC listener in
// peer-to-peer mode, else from the metadata store.
func (e *Engine) fetch(name string) (*segment.Desc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RPCTimeout)
	defer cancel()
	var b []byte
	var addr string // the peer's RPC address, in peer-to-peer mode
	if e.p2p {
		var err error
		addr, err = e.rpcAddrOf(name)
		if err != nil {
			return nil, err
		}
		b, err = e.describe(ctx, addr, name) // te's, or Mooncake's (mooncake.go)
		if err != nil {
			if c := errs.CodeOf(err); c == errs.PeerUnreachable || c == errs.Timeout {
				return nil, errs.Wrap(errs.SegmentNotFound, "open segment", err, "segment %q did not answer", name)
			}
			return nil, err
		}
	} else {
		var err error
		b, err = e.store.Get(ctx, meta.KeyRAM(name))
		if err != nil {
			if errs.CodeOf(err) == errs.NotFound {
				return nil, errs.New(errs.SegmentNotFound, "open segment", "no segment %q in the metadata store", name)
			}
			return nil, errs.Wrap(errs.Metadata, "open segment", err, "segment %q", name)
		}
		if b, err = e.verifyRecord(meta.KeyRAM(name), name, b); err != nil {
			return nil, err
		}
	}
	d, err := segment.Decode(b)
	if err != nil {
		return nil, err
	}
	if err := e.adoptMooncake(d, addr, name); err != nil {
		return nil, err
	}
	if d.Name != name && d.RPC != name {
		return nil, errs.New(errs.Metadata, "open segment", "asked for %q, got the descriptor of %q", name, d.Name)
	}
	return d, nil
}

// verifyRecord checks the MAC of a record read from the store under key
// for segment name (spec.md, "Authenticated store records") and returns
// the record without it. Without a secret records are taken as they are
// (trusted peers). With one, an unsigned record is taken only if it is a
// Mooncake engine's (which signs nothing): a Mooncake descriptor, which
// adoptMooncake then refuses unless Mooncake peers may be reached
// (AllowMooncakeWithSecret, no encryption), or an rpc_meta record where
// they may. Anything else that fails is refused, naming the segment and why.
func (e *Engine) verifyRecord(key, name string, b []byte) ([]byte, error) {
	out, err := e.secret.VerifyRecord(key, b)
	if err == nil {
		return out, nil
	}
	if !bytes.Contains(b, []byte(`"`+peerauth.RecordField+`"`)) {
		if d, derr := segment.Decode(b); key == meta.KeyRAM(name) && derr == nil && d.IsMooncake() {
			return b, nil // adoptMooncake decides, and says why
		}
		if key == meta.KeyRPC(name) && e.mc.call {
			return b, nil // a Mooncake engine's; each control call still checks whom it reached
		}
	}
	e.stats.refusedRecords.Add(1)
	return nil, errs.Wrap(errs.Unauthenticated, "open segment", err, "segment %q refused", name)
}

// current returns the descriptor to validate a request against, refreshing it
// first when a transfer marked it stale.
func (e *Engine) current(st *segState) (*segment.Desc, error) {
	if st.local {
		return e.own.Load(), nil
	}
	d := st.desc.Load()
	if !st.stale.Load() {
		return d, nil
	}
	return e.refresh(st, d)
}

// minRefetch is the least time between two refreshes a request for an
// address the descriptor lacks may cause: a caller with bad addresses must
// not turn every submit into a descriptor fetch.
const minRefetch = 100 * time.Millisecond

// mayRefresh says whether a request that failed validation with err (an
// address the descriptor lacks, no transport reaching the instance it names)
// should look at a fresh descriptor before it is refused.
func (e *Engine) mayRefresh(st *segState, err error) bool {
	if st.stale.Load() {
		return true
	}
	switch errs.CodeOf(err) {
	case errs.InvalidArgument:
		return false
	case errs.AddressNotRegistered:
	default:
		return true // the peer as a whole changed (restart, transports)
	}
	st.mu.Lock()
	recent := time.Since(st.fetched) < minRefetch
	st.mu.Unlock()
	return !recent
}

// refresh fetches the segment's descriptor again, unless a refresh that began
// after seen was loaded is running or done: concurrent callers share one
// fetch and wait for it without holding a lock anyone else needs.
func (e *Engine) refresh(st *segState, seen *segment.Desc) (*segment.Desc, error) {
	st.mu.Lock()
	if cur := st.desc.Load(); cur != seen && !st.stale.Load() {
		st.mu.Unlock()
		return cur, nil // someone refreshed since the caller looked
	}
	c := st.flight
	if c == nil {
		c = &refreshCall{done: make(chan struct{})}
		st.flight = c
		started := e.goTracked(func() {
			d, err := e.fetch(st.name)
			st.mu.Lock()
			if err == nil {
				if old := st.desc.Load(); old.Instance != d.Instance {
					e.cfg.Logger.Info("te: peer restarted", "segment", st.name)
				}
				st.desc.Store(d)
				st.stale.Store(false)
				st.fetched = time.Now()
			}
			c.d, c.err = d, err
			st.flight = nil
			st.mu.Unlock()
			close(c.done)
		})
		if !started {
			c.err = errs.New(errs.Closed, "open segment", "engine closed")
			st.flight = nil
			close(c.done)
		}
	}
	st.mu.Unlock()
	<-c.done
	return c.d, c.err
}

// invalidate marks a segment's descriptor stale after a failure that suggests
// the peer changed (restart, re-registration, lost connection).
func (e *Engine) invalidate(st *segState, err error) {
	if st.local {
		return
	}
	switch errs.CodeOf(err) {
	case errs.StaleDescriptor, errs.AddressNotRegistered, errs.AccessDenied, errs.PeerUnreachable, errs.SegmentNotFound:
		st.stale.Store(true)
	}
}
