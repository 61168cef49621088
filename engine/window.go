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
// registered. Each range must lie inside one registered region. Windows are
// honoured by transports whose owner checks each access (local, tcp, shm;
// Caps.Windows); over the others a peer's request carries the buffer's key.
func (e *Engine) GrantWindow(ranges []Range) (uint64, error) {
	if err := e.live("grant window"); err != nil {
		return 0, err
	}
	w, err := e.reg.GrantWindow(ranges)
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
