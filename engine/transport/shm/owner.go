package shm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// peer is, on the owner side, one attached session of another process that
// may access this engine's memory with process_vm_readv/writev.
type peer struct {
	session  uint64
	instance string
	rpc      string
	pid      int
	pidfd    int                 // -1 when the kernel gave none
	grants   map[uint64]struct{} // keys of the buffers this peer was told of
	// lastGrant is when this owner last confirmed the session; the peer's
	// lease ends at most Lease after it. Guarded by Transport.pmu.
	lastGrant time.Time
	fdOnce    sync.Once
}

func (p *peer) closeFd() {
	p.fdOnce.Do(func() {
		if p.pidfd >= 0 {
			unix.Close(p.pidfd)
		}
	})
}

func newSession() uint64 {
	var b [8]byte
	for {
		rand.Read(b[:])
		if s := binary.LittleEndian.Uint64(b[:]); s != 0 {
			return s
		}
	}
}

// handleAttach starts a session for a peer on this host. Before it answers it
// calls the peer back: a peer this owner cannot reach could not be told to
// stop, so it must not start.
func (t *Transport) handleAttach(ctx context.Context, body []byte) ([]byte, error) {
	m, err := decodeAttachReq(body)
	if err != nil {
		return nil, err
	}
	local, err := t.spec.Medium.Admit(t.self, m.BootID, m.PidNS, int(m.Pid))
	if err != nil {
		return nil, err
	}
	if m.RPC == "" || m.Instance == "" {
		return nil, errs.New(errs.InvalidArgument, "shm attach", "peer gave no control address or instance")
	}
	// The session is keyed by the instance the body names (a new one of
	// that instance replaces the old): with a secret it must be the one
	// the control session proved, or an engine holding the secret could
	// end another's session or attach in its name.
	by := transport.CallerOf(ctx)
	if by.Known && by.Instance != m.Instance {
		return nil, errs.New(errs.Unauthenticated, "shm attach",
			"attach names instance %s, but its session proved instance %s (segment %q)", m.Instance, by.Instance, by.Name)
	}
	cctx, cancel := context.WithTimeout(ctx, t.opt.RevokeTimeout)
	rep, err := t.call(cctx, m.RPC, (&revokeReq{Owner: t.h.Instance()}).encode())
	cancel()
	if err == nil {
		err = checkAck(rep, opRevoke)
	}
	if err != nil {
		return nil, errs.Wrap(errs.PeerUnreachable, "shm attach", err, "cannot call the peer back at %s", m.RPC)
	}
	fd := -1
	if local {
		// Watching the peer exit ends its lease early; a pid of another
		// host names nothing here.
		if f, ferr := unix.PidfdOpen(int(m.Pid), 0); ferr == nil {
			fd = f
		}
	}
	p := &peer{
		session: newSession(), instance: m.Instance, rpc: m.RPC, pid: int(m.Pid), pidfd: fd,
		grants: map[uint64]struct{}{}, lastGrant: time.Now(),
	}
	var gone []*peer
	t.pmu.Lock()
	if t.peers == nil { // closed meanwhile
		t.pmu.Unlock()
		p.closeFd()
		return nil, errs.New(errs.Closed, "shm attach", "engine closed")
	}
	for s, q := range t.peers {
		// A new session of the same peer replaces the old one (the peer
		// dropped it), and sessions of exited processes go.
		if q.instance == m.Instance || pidfdExited(q.pidfd) {
			delete(t.peers, s)
			gone = append(gone, q)
		}
	}
	for t.peers[p.session] != nil {
		p.session = newSession()
	}
	t.peers[p.session] = p
	t.pmu.Unlock()
	for _, q := range gone {
		q.closeFd()
	}
	return (&attachRep{Session: p.session, LeaseNS: uint64(t.opt.Lease), Probe: mem.Addr(t.probe), Token: t.token}).encode(), nil
}

// handleValidate checks the keys a peer is about to use against the current
// registrations, records what it granted (so Unregister knows whom to tell)
// and renews the peer's lease. A session that is unknown (cut off, detached,
// or never attached) is refused as a whole with AccessDenied; with a secret,
// one the calling engine did not attach is refused with Unauthenticated. A
// window's key is granted only to the engine the window is bound to, as the
// control session proved it (segment.Window.Admits).
func (t *Transport) handleValidate(ctx context.Context, body []byte) ([]byte, error) {
	m, err := decodeValidateReq(body)
	if err != nil {
		return nil, err
	}
	by := transport.CallerOf(ctx)
	rep := validateRep{LeaseNS: uint64(t.opt.Lease), Grants: make([]grant, len(m.Items))}
	reg := t.h.Registry()
	t.pmu.Lock()
	defer t.pmu.Unlock()
	p := t.peers[m.Session]
	if p == nil {
		return nil, errs.New(errs.AccessDenied, "shm validate", "session %#x is not attached (cut off or detached)", m.Session)
	}
	if by.Known && by.Instance != p.instance {
		return nil, errs.New(errs.Unauthenticated, "shm validate",
			"session %#x belongs to instance %s, but the call's session proved instance %s (segment %q)", m.Session, p.instance, by.Instance, by.Name)
	}
	// Checking the registry and recording the grant under pmu orders this
	// against Unregister, which collects the holders under pmu after the
	// registry has dropped the region.
	p.lastGrant = time.Now()
	for i, it := range m.Items {
		r, ok := reg.Lookup(it.Addr, it.Len)
		if ok && it.Key != 0 && r.Desc.Key != it.Key {
			// A window's key: good for the window's ranges only, and
			// revoked on its own (RevokeWindow). The grant is the range
			// that holds the item; the peer asks again for another.
			w, start, end, ok, werr := reg.WindowFor(it.Key, it.Addr, it.Len, by)
			if werr != nil {
				// A window bound to another engine: nothing granted.
				t.h.Logf("te: %s: %v", t.spec.Name, werr)
				rep.Grants[i].Code = errs.CodeOf(werr)
				continue
			}
			if ok && w.Parent() == r {
				p.grants[it.Key] = struct{}{}
				rep.Grants[i] = grant{Addr: start, Len: end - start}
				continue
			}
		}
		switch {
		case !ok || r.Closing():
			rep.Grants[i].Code = errs.AddressNotRegistered
		case it.Key&segment.WindowKeyBit != 0:
			// A window key with no open window over the item: revoked,
			// never granted, or not covering it. Refused, not stale.
			rep.Grants[i].Code = errs.AccessDenied
		case r.Desc.Key != it.Key || it.Key == 0:
			rep.Grants[i].Code = errs.StaleDescriptor
		case !r.Remote:
			rep.Grants[i].Code = errs.AccessDenied
		default:
			p.grants[it.Key] = struct{}{}
			rep.Grants[i] = grant{Addr: r.Addr, Len: r.Length}
		}
	}
	return rep.encode(), nil
}

func (t *Transport) handleDetach(ctx context.Context, body []byte) ([]byte, error) {
	m, err := decodeDetachReq(body)
	if err != nil {
		return nil, err
	}
	by := transport.CallerOf(ctx)
	t.pmu.Lock()
	p := t.peers[m.Session]
	if p != nil && by.Known && by.Instance != p.instance {
		t.pmu.Unlock()
		return nil, errs.New(errs.Unauthenticated, "shm detach",
			"session %#x belongs to instance %s, but the call's session proved instance %s", m.Session, p.instance, by.Instance)
	}
	delete(t.peers, m.Session)
	t.pmu.Unlock()
	if p != nil {
		p.closeFd()
	}
	return ackReply(opDetach), nil
}

// revokeAll tells each peer to stop using the items what(p) names and waits,
// in parallel, until every one has acknowledged, exited, or been cut off with
// its lease lapsed.
func (t *Transport) revokeAll(ps []*peer, what func(*peer) []item) {
	var wg sync.WaitGroup
	for _, p := range ps {
		items := what(p)
		if len(items) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.revoke(p, items)
		}()
	}
	wg.Wait()
}

func (t *Transport) revoke(p *peer, items []item) {
	t.st.revokesSent.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), t.opt.RevokeTimeout)
	rep, err := t.call(ctx, p.rpc, (&revokeReq{Owner: t.h.Instance(), Session: p.session, Items: items}).encode())
	cancel()
	if err == nil {
		if err = checkAck(rep, opRevoke); err == nil {
			t.st.revokesAcked.Add(1)
			return
		}
	}
	// No acknowledgement. Cut the session off: from now on its lease is not
	// renewed and its keys are not validated, so a peer that follows the
	// protocol stops by itself once the lease it holds runs out.
	t.pmu.Lock()
	if t.peers[p.session] == p {
		delete(t.peers, p.session)
	}
	end := p.lastGrant.Add(t.opt.Lease + leaseSlack)
	t.pmu.Unlock()
	if pidfdExited(p.pidfd) {
		p.closeFd()
		return
	}
	t.st.peersCutOff.Add(1)
	t.h.Logf("te: shm: peer pid %d (%s) did not acknowledge the revocation of [%#x,+%d): %v; cut off, waiting %v for its lease to lapse",
		p.pid, p.rpc, items[0].Addr, items[0].Len, err, time.Until(end).Round(time.Millisecond))
	for time.Now().Before(end) && !pidfdExited(p.pidfd) {
		time.Sleep(min(10*time.Millisecond, time.Until(end)))
	}
	p.closeFd()
}
