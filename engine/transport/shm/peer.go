package shm

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// owner is, on the initiator side, another process whose memory this engine
// accesses: the session it attached, the lease it holds, and the buffers it
// was told of (by key).
type owner struct {
	name, inst, rpc string
	pid             int
	desc            *segment.Desc // as first seen: the medium's probe reads it

	attachMu sync.Mutex // one attach at a time
	retryAt  time.Time  // after a failed attach; guarded by attachMu
	lastErr  error      // guarded by attachMu

	mu         sync.Mutex
	session    uint64 // 0: not attached
	lease      time.Duration
	leaseUntil time.Time
	allowed    map[uint64]*entry // by key
	seq        uint64            // revocations received
	probed     bool
	refused    error // the kernel refused: final for this owner instance

	// dead is set once shm can no longer serve this owner (refused, or its
	// process is gone), for Reachable's lock-free path.
	dead atomic.Bool
	// pidfd+1 of the owner's process (0: none), opened at the first attach
	// where Spec.WatchOwner asks for it; closed when the owner is
	// collected, so a job that still holds the owner never polls a
	// closed (or reused) descriptor.
	pidfd atomic.Int64
}

// watch opens a pidfd of the owner's process, once, if it runs on this
// host. Called after an attach succeeded: the owner answered, so the pid
// is still its own.
func (o *owner) watch(self segment.HostID) {
	h := o.desc.Host
	if o.pidfd.Load() != 0 || h == nil || h.BootID != self.BootID || h.PidNS != self.PidNS || o.pid <= 0 {
		return
	}
	fd, err := unix.PidfdOpen(o.pid, 0)
	if err != nil {
		return // an older kernel: the lease renewal notices instead
	}
	if !o.pidfd.CompareAndSwap(0, int64(fd)+1) {
		unix.Close(fd)
		return
	}
	runtime.AddCleanup(o, func(fd int) { unix.Close(fd) }, fd)
}

// exited reports whether the owner's watched process has exited.
func (o *owner) exited() bool {
	v := o.pidfd.Load()
	return v != 0 && pidfdExited(int(v-1))
}

// refuse records that the kernel refused us this owner.
func (o *owner) refuse(err error) {
	o.mu.Lock()
	if o.refused == nil {
		o.refused = err
	}
	o.mu.Unlock()
	o.dead.Store(true)
}

// entry is one buffer of an owner this engine may access: the registered
// span, and the accesses in flight that a revocation waits for.
type entry struct {
	addr, len uint64
	// more holds further spans granted under the same key: a window's
	// key covers several ranges, each granted when first used.
	more     [][2]uint64
	inflight atomic.Int64
	revoked  atomic.Bool
}

// covers reports whether [addr, addr+n) lies inside a span granted to e.
// Called with the owner's mu held (more grows under it).
func (e *entry) covers(addr, n uint64) bool {
	if addr+n < addr {
		return false
	}
	if addr >= e.addr && addr+n <= e.addr+e.len {
		return true
	}
	for _, s := range e.more {
		if addr >= s[0] && addr+n <= s[0]+s[1] {
			return true
		}
	}
	return false
}

func (e *entry) acquire() bool {
	// Count first, then look: with revoke setting the flag before it reads
	// the count, one of the two always sees the other.
	e.inflight.Add(1)
	if e.revoked.Load() {
		e.inflight.Add(-1)
		return false
	}
	return true
}

func (e *entry) release() { e.inflight.Add(-1) }

// ownerFor returns the state for the engine instance d describes.
func (t *Transport) ownerFor(d *segment.Desc) *owner {
	t.omu.Lock()
	defer t.omu.Unlock()
	o := t.owners[d.Instance]
	if o == nil {
		o = &owner{name: d.Name, inst: d.Instance, rpc: d.RPC, desc: d}
		if d.Host != nil {
			o.pid = d.Host.Pid
		}
		// A new instance at a known control address is a restarted
		// engine: the old one's state goes.
		for inst, old := range t.owners {
			if old.rpc == d.RPC {
				old.dead.Store(true)
				delete(t.owners, inst)
			}
		}
		t.owners[d.Instance] = o
	}
	return o
}

// errRaced says a revocation overtook a validation; the caller asks again.
var errRaced = errs.New(errs.StaleDescriptor, "shm", "a revocation raced the validation")

// attach starts a session with the owner unless one is active, and on the
// first success proves with a 16-byte process_vm_readv of the owner's probe
// token that the kernel lets this process at the owner's memory.
func (o *owner) attach(t *Transport) error {
	o.mu.Lock()
	refused, attached := o.refused, o.session != 0
	o.mu.Unlock()
	if refused != nil {
		return refused
	}
	if attached {
		return nil
	}
	o.attachMu.Lock()
	defer o.attachMu.Unlock()
	o.mu.Lock()
	refused, attached = o.refused, o.session != 0
	o.mu.Unlock()
	if refused != nil {
		return refused
	}
	if attached {
		return nil
	}
	if time.Now().Before(o.retryAt) {
		return o.lastErr
	}
	rpc := t.rpc.Load()
	if rpc == nil {
		return errs.New(errs.TransportUnavailable, "shm", "this engine has no control address yet")
	}
	req := attachReq{Pid: uint32(t.self.Pid), BootID: t.self.BootID, PidNS: t.self.PidNS, Instance: t.h.Instance(), RPC: *rpc}
	ctx, cancel := context.WithTimeout(t.ctx, t.opt.CallTimeout)
	defer cancel()
	sent := time.Now()
	b, err := t.call(ctx, o.rpc, req.encode())
	var rep attachRep
	if err == nil {
		rep, err = decodeAttachRep(b)
	}
	if err == nil && (rep.Session == 0 || rep.LeaseNS == 0) {
		err = errs.New(errs.Protocol, "shm", "attach reply without session or lease")
	}
	if err != nil {
		t.st.attachFailed.Add(1)
		o.lastErr = errs.Wrap(errs.TransportUnavailable, "shm", err, "attach to segment %q", o.name)
		o.retryAt = time.Now().Add(time.Second)
		t.h.Logf("te: shm: cannot attach to segment %s (pid %d): %v; using the next transport", o.name, o.pid, err)
		return o.lastErr
	}
	o.mu.Lock()
	probed := o.probed
	o.mu.Unlock()
	if !probed {
		if err := t.spec.Medium.Probe(o.desc, rep.Probe, rep.Token); err != nil {
			t.st.probeRefused.Add(1)
			err = errs.Wrap(errs.TransportUnavailable, "shm", err, "segment %q (pid %d)", o.name, o.pid)
			o.refuse(err)
			t.h.Logf("te: %v; using the next transport", err)
			t.detach(o.rpc, rep.Session)
			return err
		}
	}
	if t.spec.WatchOwner {
		o.watch(t.self)
	}
	o.mu.Lock()
	o.probed = true
	o.session = rep.Session
	o.lease = time.Duration(rep.LeaseNS)
	o.leaseUntil = sent.Add(o.lease)
	o.allowed = map[uint64]*entry{}
	o.mu.Unlock()
	t.st.attached.Add(1)
	t.st.sessionsOpen.Add(1)
	if t.shut.Load() {
		// Close ran meanwhile and may have missed this session: end it
		// here, or the owner would wait on us at its next Unregister.
		o.reset(t, rep.Session)
		t.detach(o.rpc, rep.Session)
		return errs.New(errs.Closed, "shm", "engine closed")
	}
	return nil
}

// probe reads the owner's token: EPERM (ptrace rules), ESRCH (no such pid
// here) or a different token (the pid is another process) all mean no.
func probe(pid int, addr uint64, token [tokenLen]byte) error {
	got := make([]byte, tokenLen)
	buf, err := mem.Alloc(4096) // the read lands outside the Go heap
	if err != nil {
		return err
	}
	defer mem.Free(buf)
	local := []unix.Iovec{{Base: &buf[0]}}
	local[0].SetLen(tokenLen)
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: tokenLen}}
	n, err := unix.ProcessVMReadv(pid, local, remote, 0)
	if err != nil {
		return vmError(err, pid, addr, false)
	}
	copy(got, buf[:tokenLen])
	if n != tokenLen || !bytes.Equal(got, token[:]) {
		return errs.New(errs.TransportUnavailable, "shm", "pid %d does not hold the probe token: not the segment's process", pid)
	}
	return nil
}

// reset drops a session the owner no longer knows (cut off or restarted):
// the next request attaches again and revalidates every key.
func (o *owner) reset(t *Transport, session uint64) {
	o.mu.Lock()
	if o.session == session && session != 0 {
		o.session = 0
		o.allowed = nil
		t.st.sessionsOpen.Add(-1)
	}
	o.mu.Unlock()
}

// validate asks the owner about keys (none: only renew the lease). Grants go
// into allowed unless a revocation arrived meanwhile (errRaced).
func (o *owner) validate(t *Transport, items []item) ([]grant, error) {
	o.mu.Lock()
	session, seq := o.session, o.seq
	o.mu.Unlock()
	if session == 0 {
		return nil, errs.New(errs.AccessDenied, "shm", "not attached to segment %q", o.name)
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.opt.CallTimeout)
	defer cancel()
	sent := time.Now()
	b, err := t.call(ctx, o.rpc, (&validateReq{Session: session, Items: items}).encode())
	var rep validateRep
	if err == nil {
		rep, err = decodeValidateRep(b)
	}
	if err == nil && len(rep.Grants) != len(items) {
		err = errs.New(errs.Protocol, "shm", "validate reply has %d answers for %d questions", len(rep.Grants), len(items))
	}
	if err != nil {
		if errs.CodeOf(err) == errs.AccessDenied {
			o.reset(t, session) // cut off: start over
		}
		return nil, err
	}
	if len(items) == 0 {
		t.st.renewals.Add(1)
	} else {
		t.st.validations.Add(1)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.session != session {
		return nil, errRaced
	}
	if u := sent.Add(time.Duration(rep.LeaseNS)); u.After(o.leaseUntil) {
		o.lease, o.leaseUntil = time.Duration(rep.LeaseNS), u
	}
	if o.seq != seq && len(items) > 0 {
		return nil, errRaced
	}
	for i, g := range rep.Grants {
		if g.Code != 0 {
			continue
		}
		// Keep an existing entry: accesses in flight are counted there.
		if e := o.allowed[items[i].Key]; e == nil {
			o.allowed[items[i].Key] = &entry{addr: g.Addr, len: g.Len}
		} else if !e.covers(g.Addr, g.Len) {
			e.more = append(e.more, [2]uint64{g.Addr, g.Len})
		}
	}
	return rep.Grants, nil
}

// ready makes sure a session is attached and its lease has at least half its
// length left, renewing it otherwise. No entry is held meanwhile, so a
// revocation never waits for a control call.
func (o *owner) ready(t *Transport) error {
	if err := o.attach(t); err != nil {
		return err
	}
	o.mu.Lock()
	left, lease := time.Until(o.leaseUntil), o.lease
	o.mu.Unlock()
	if left >= lease/2 {
		return nil
	}
	_, err := o.validate(t, nil)
	if err == errRaced {
		err = nil
	}
	if err != nil && errs.CodeOf(err) == errs.AccessDenied {
		// Cut off: attach again (a new session, every key revalidated).
		if err = o.attach(t); err == nil {
			_, err = o.validate(t, nil)
		}
	}
	return err
}

// fresh reports whether the owner can be used without a control call: a
// session is attached and its lease has at least half its length left.
func (o *owner) fresh() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.session != 0 && o.refused == nil && time.Until(o.leaseUntil) >= o.lease/2
}

// leaseLeft returns how long the lease still runs (negative: lapsed).
func (o *owner) leaseLeft() time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.session == 0 {
		return -1
	}
	return time.Until(o.leaseUntil)
}

// handleRevoke is the initiator side of a revocation: refuse new accesses to
// the buffers named, wait for the ones in flight, then acknowledge. An
// empty revocation is the owner checking that it can call us.
func (t *Transport) handleRevoke(ctx context.Context, body []byte) ([]byte, error) {
	m, err := decodeRevokeReq(body)
	if err != nil {
		return nil, err
	}
	// The owner named decides whose grants end: with a secret it must be
	// the engine the session proved, or an engine holding the secret
	// could revoke another owner's grants here.
	if by := transport.CallerOf(ctx); by.Known && by.Instance != m.Owner {
		return nil, errs.New(errs.Unauthenticated, "shm revoke",
			"revocation names owner %s, but its session proved instance %s (segment %q)", m.Owner, by.Instance, by.Name)
	}
	if len(m.Items) == 0 {
		return ackReply(opRevoke), nil
	}
	t.st.revokesReceived.Add(1)
	t.omu.Lock()
	o := t.owners[m.Owner]
	t.omu.Unlock()
	if o == nil {
		return ackReply(opRevoke), nil
	}
	var wait []*entry
	o.mu.Lock()
	if o.session == m.Session {
		o.seq++
		for _, it := range m.Items {
			if e := o.allowed[it.Key]; e != nil {
				delete(o.allowed, it.Key)
				e.revoked.Store(true)
				wait = append(wait, e)
			}
		}
	}
	o.mu.Unlock()
	for _, e := range wait {
		for d := time.Microsecond; e.inflight.Load() > 0; {
			select {
			case <-ctx.Done():
				return nil, errs.New(errs.Closed, "shm revoke", "engine closed")
			case <-time.After(d):
			}
			d = min(2*d, time.Millisecond)
		}
	}
	return ackReply(opRevoke), nil
}

func (t *Transport) detach(rpc string, session uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	t.call(ctx, rpc, (&detachReq{Session: session}).encode())
}

// detachAll ends every session this engine holds (best effort, in parallel).
func (t *Transport) detachAll() {
	var wg sync.WaitGroup
	t.omu.Lock()
	for _, o := range t.owners {
		o.mu.Lock()
		s := o.session
		o.session, o.allowed = 0, nil
		o.mu.Unlock()
		if s != 0 {
			t.st.sessionsOpen.Add(-1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				t.detach(o.rpc, s)
			}()
		}
	}
	for _, o := range t.owners {
		o.dead.Store(true)
	}
	t.owners = map[string]*owner{}
	t.omu.Unlock()
	wg.Wait()
}
