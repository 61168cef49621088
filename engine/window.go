package engine

import (
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

// Range is [Addr, Addr+Length) of registered memory.
type Range = segment.Range

// GrantWindow grants peers access to ranges of this engine's registered,
// remote-accessible memory under a key of their own, and returns the key. A
// peer puts it in Request.Window; the engine then checks every access against
// the ranges, and RevokeWindow ends the grant: the handoff grants one per
// transfer over its blocks, so that once the transfer is over no late byte of
// it lands in blocks that went to another request, while the memory stays
// registered. Each range must lie inside one registered region.
//
// The key is a bearer capability: any engine that learns it may use it.
// GrantWindowTo binds a window to the one engine it is meant for;
// GrantWindowToFirst to the first engine that uses it.
//
// Windows are honoured only by transports whose owner checks each access
// (Caps.Windows: local, shm, cxl, tcp); a request under a window never goes
// over the others (an RDMA NIC checks the buffer's rkey, not the window):
// selection passes them over, and with none left the request fails with
// NotSupported.
func (e *Engine) GrantWindow(ranges []Range) (uint64, error) {
	return e.GrantWindowTo("", ranges)
}

// GrantWindowTo is GrantWindow for one engine: peer is the segment name of
// the engine that may use the window (the grantee), and an access under it
// from any other engine is refused with AccessDenied, naming the window and
// that engine, and lands nothing. An empty peer grants to whoever holds the
// key, as GrantWindow.
//
// The owner checks the accessing engine's identity as the connection or
// session it arrives on proved it: with the cluster secret, the segment name
// each session's exchange proved (tcp's data connections, the control
// sessions of shm and cxl); in this process (local), the engine's own name.
// Without a secret nothing is proven about a remote peer (te trusts the
// network by design then) and a bound window is honoured for any engine
// holding its key over tcp, shm and cxl: binding protects only with a
// secret.
func (e *Engine) GrantWindowTo(peer string, ranges []Range) (uint64, error) {
	if err := e.live("grant window"); err != nil {
		return 0, err
	}
	w, err := e.reg.GrantWindowTo(peer, ranges)
	if err != nil {
		return 0, err
	}
	e.stats.windowsGranted.Add(1)
	return w.Key, nil
}

// GrantWindowToFirst is GrantWindow for the first engine that uses the
// window, for an owner that does not know yet which engine that will be
// (the handoff before te-sidecar pairs the transfer): the first access
// under it by an engine the owner knows (as GrantWindowTo knows its
// grantee) binds it to that engine's segment and instance, atomically,
// and from then on an access from any other engine is refused with
// AccessDenied, naming the window and both engines, and lands nothing.
// Nothing is added to the first access: the binding is one atomic
// operation in the check every access under a window already gets.
//
// Once the owner learns which engine should use the window, BindWindow
// binds it to that engine if nobody used it yet, and tells it when
// another engine used it first: the owner then fails what the window was
// for rather than reporting it done. Without a cluster secret no remote
// access is known (see GrantWindowTo), so over tcp, shm and cxl none
// binds the window and it stays a bearer key; in this process (local) the
// binding holds.
func (e *Engine) GrantWindowToFirst(ranges []Range) (uint64, error) {
	if err := e.live("grant window"); err != nil {
		return 0, err
	}
	w, err := e.reg.GrantWindowToFirst(ranges)
	if err != nil {
		return 0, err
	}
	e.stats.windowsGranted.Add(1)
	return w.Key, nil
}

// BindWindow binds the window granted as key with GrantWindowToFirst to
// the engine whose segment is named peer, unless an engine used it first.
// It returns nil when the window is now bound to peer, or was already
// (by peer's first access, or granted to it with GrantWindowTo); an
// AccessDenied error naming the engine that used it first when that is
// another one; NotFound when no open window has key; InvalidArgument for
// a bearer window (GrantWindow), which cannot be bound after the fact.
// It does not block.
func (e *Engine) BindWindow(key uint64, peer string) error {
	w, ok := e.reg.Window(key)
	if !ok {
		return errs.New(errs.NotFound, "bind window", "no window %#x", key)
	}
	return w.Bind(peer)
}

// WindowPeer returns the segment name of the engine the window granted as
// key is granted or bound to: "" for a bearer window, and for one granted
// with GrantWindowToFirst that nobody has used or bound yet.
func (e *Engine) WindowPeer(key uint64) (string, error) {
	w, ok := e.reg.Window(key)
	if !ok {
		return "", errs.New(errs.NotFound, "window peer", "no window %#x", key)
	}
	return w.Peer(), nil
}

// RevokeWindow ends the window granted as key: accesses under it are refused
// at once, those in flight get Config.UnregisterGrace, then the transports cut
// what still holds them. It returns nil once no access under the window can
// touch memory any more; on an error the window stays revoked-but-known, and
// calling RevokeWindow again retries.
func (e *Engine) RevokeWindow(key uint64) error {
	w, err := e.reg.CloseWindow(key)
	if err != nil {
		return err
	}
	if err := e.quiesce(w.Regions()); err != nil {
		return err
	}
	for _, t := range e.transports {
		wr, ok := t.(transport.WindowRevoker)
		if !ok {
			continue
		}
		for _, r := range w.Regions() {
			if err := wr.RevokeWindow(r); err != nil {
				return errs.Wrap(errs.CodeOf(err), "revoke window", err, "transport %s", t.Name())
			}
		}
	}
	e.reg.DropWindow(w)
	e.stats.windowsRevoked.Add(1)
	return nil
}
