package engine

import (
	"context"

	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/engine/wire"
)

// Notification is a (name, message) pair sent by a peer with SendNotify.
type Notification struct {
	Name string
	Msg  string
}

// SendNotify delivers (name, msg) to the named segment's engine and waits for
// it to be queued there. Blocks up to the RPC timeout.
func (e *Engine) SendNotify(segment, name, msg string) error {
	if err := e.live("notify"); err != nil {
		return err
	}
	if len(name) > wire.MaxNotifyName || len(msg) > wire.MaxNotifyMsg {
		return errs.New(errs.TooLarge, "notify", "name of %d or message of %d bytes exceeds %d/%d",
			len(name), len(msg), wire.MaxNotifyName, wire.MaxNotifyMsg)
	}
	addr, err := e.rpcAddrOf(segment)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RPCTimeout)
	defer cancel()
	if err := e.sendNotify(ctx, addr, name, msg); err != nil { // te's, or Mooncake's (mooncake.go)
		return err
	}
	e.stats.notifiesSent.Add(1)
	return nil
}

func (e *Engine) handleNotify(_ context.Context, body []byte) ([]byte, error) {
	name, msg, err := wire.DecodeNotify(body)
	if err != nil {
		return nil, err
	}
	e.notifyMu.Lock()
	defer e.notifyMu.Unlock()
	if len(e.notifies) >= e.cfg.MaxNotifies {
		return nil, errs.New(errs.NoMemory, "notify", "receiver's queue of %d notifications is full", e.cfg.MaxNotifies)
	}
	e.notifies = append(e.notifies, Notification{Name: string(name), Msg: string(msg)})
	e.stats.notifiesReceived.Add(1)
	return nil, nil
}

// Notifies drains and returns the notifications received so far, oldest first.
func (e *Engine) Notifies() []Notification {
	e.notifyMu.Lock()
	defer e.notifyMu.Unlock()
	out := e.notifies
	e.notifies = nil
	return out
}
