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
// GrantWindowTo binds a window to the one engine it is meant for.
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
