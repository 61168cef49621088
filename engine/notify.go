package engine

import (
	"context"
	"sync"

	"github.com/tecache/te/engine/internal/ctrl"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/wire"
)

// Notification is a (name, message) pair sent by a peer with SendNotify.
type Notification struct {
	Name string
	Msg  string
}

// notifyQueue holds received notifications until Notifies drains them, and
// the byte budget (Limits.NotifyBytes, NotifyBytesPerSender) they and the
// ones still arriving count against. A notification is charged the bytes
// of its name and message.
type notifyQueue struct {
	mu      sync.Mutex
	items   []Notification
	charges []notifyCharge
	total   uint64            // bytes charged: queued and arriving
	per     map[string]uint64 // the same, per sender
}

type notifyCharge struct {
	sender string
	n      uint64
}

// notifyFixed is what a Notify body holds besides the name and message.
const notifyFixed = wire.CallHeaderSize + 2 + 4

// reserveNotify is the control plane's reserver for KindNotify: it charges
// the name and message a body of bodyLen bytes can hold before the body is
// read, or refuses the notification (ResourceExhausted) so that it is never
// stored, let alone dropped later without the sender knowing.
func (e *Engine) reserveNotify(sender string, bodyLen uint64) (uint64, error) {
	n := bodyLen - min(bodyLen, notifyFixed)
	lim := e.cfg.Limits
	q := &e.nq
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.per == nil {
		q.per = map[string]uint64{}
	}
	if q.total+n > lim.NotifyBytes {
		e.ctrl.RefusedNotify()
		return 0, errs.New(errs.ResourceExhausted, "notify",
			"the receiver holds %d bytes of undrained notifications; %d more would pass its budget of %d", q.total, n, lim.NotifyBytes).
			WithHint("the receiver drains them with Notifies (get_notifies); retry later")
	}
	if q.per[sender]+n > lim.NotifyBytesPerSender {
		e.ctrl.RefusedNotify()
		return 0, errs.New(errs.ResourceExhausted, "notify",
			"the receiver holds %d bytes of undrained notifications from this sender; %d more would pass the budget of %d per sender", q.per[sender], n, lim.NotifyBytesPerSender).
			WithHint("the receiver drains them with Notifies (get_notifies); retry later")
	}
	q.total += n
	q.per[sender] += n
	return n, nil
}

func (e *Engine) releaseNotify(sender string, n uint64) {
	q := &e.nq
	q.mu.Lock()
	q.release(sender, n)
	q.mu.Unlock()
}

func (q *notifyQueue) release(sender string, n uint64) {
	q.total -= n
	if q.per[sender] -= n; q.per[sender] == 0 {
		delete(q.per, sender)
	}
}

// SendNotify delivers (name, msg) to the named segment's engine and waits for
// it to be queued there. Blocks up to the RPC timeout. A receiver over its
// notification budget refuses with ResourceExhausted: nothing was queued.
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
	if err := e.sendNotify(ctx, segment, addr, name, msg); err != nil { // te's, or Mooncake's (mooncake.go)
		return err
	}
	e.stats.notifiesSent.Add(1)
	return nil
}

func (e *Engine) handleNotify(ctx context.Context, body []byte) ([]byte, error) {
	name, msg, err := wire.ParseNotify(body)
	if err != nil {
		return nil, err
	}
	ci := ctrl.Info(ctx)
	n := uint64(len(name) + len(msg))
	if ci == nil || ci.Reserved < n {
		// Every notify reaches here through the control plane, which
		// reserved the bytes its frame could hold.
		return nil, errs.New(errs.Internal, "notify", "notification of %d bytes arrived without its reservation", n)
	}
	q := &e.nq
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) >= e.cfg.MaxNotifies {
		e.ctrl.RefusedNotify()
		return nil, errs.New(errs.ResourceExhausted, "notify", "receiver's queue of %d notifications is full", e.cfg.MaxNotifies).
			WithHint("the receiver drains them with Notifies (get_notifies); retry later")
	}
	q.items = append(q.items, Notification{Name: string(name), Msg: string(msg)})
	q.charges = append(q.charges, notifyCharge{ci.Sender, n})
	ci.Kept = n
	e.stats.notifiesReceived.Add(1)
	return nil, nil
}

// Notifies drains and returns the notifications received so far, oldest
// first, freeing their bytes in the budget.
func (e *Engine) Notifies() []Notification {
	q := &e.nq
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.items
	for _, c := range q.charges {
		q.release(c.sender, c.n)
	}
	q.items, q.charges = nil, nil
	return out
}
