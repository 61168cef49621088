package engine

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/tecache/te/engine/internal/ctrl"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/wire"
)

// Notification is a (name, message) pair sent by a peer with SendNotify.
type Notification struct {
	Name string
	Msg  string
	// From and FromInstance are the sending engine's segment name and
	// instance id as its authenticated session proved them: a receiver
	// that acts on who sent a notification (the NIXL listener binds an
	// agent's metadata to its engine) checks these, never Name or Msg.
	// Both are empty where nothing is proven: without a cluster secret,
	// and from Mooncake peers; From is empty for a sender that has no
	// segment.
	From, FromInstance string
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
	seen    *notifySeen       // ids of NotifyOnce calls queued lately (notifyseen.go)
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
	return e.reserveNotifyBytes(sender, bodyLen-min(bodyLen, notifyFixed))
}

// reserveNotifyOnce is reserveNotify for KindNotifyOnce, whose body also
// holds the id.
func (e *Engine) reserveNotifyOnce(sender string, bodyLen uint64) (uint64, error) {
	return e.reserveNotifyBytes(sender, bodyLen-min(bodyLen, notifyFixed+wire.NotifyIDSize))
}

func (e *Engine) reserveNotifyBytes(sender string, n uint64) (uint64, error) {
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
// A nil error means queued once: a notification whose reply was lost with
// its connection is sent again with the same id, which the receiver dedups
// (an engine that predates NotifyOnce gets no id: there the lost reply is
// PeerUnreachable, and the notification may have been queued).
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

// A te sender gives each notification a random id and sends it as
// NotifyOnce, which the receiver dedups (handleNotifyOnce), so it may go
// again after a lost reply (internal/ctrl resends it once, same id): one
// success is one delivery. An older te has no NotifyOnce handler and
// answers NotSupported, having queued nothing; it gets Notify, which is
// never resent once written. Which peers take NotifyOnce is remembered per
// address for a while.
const (
	// maxNotifyPeers bounds the addresses remembered; over it the table
	// starts over (each peer then costs one NotSupported more).
	maxNotifyPeers = 4096
	// notifyPeerTTL is how long an answer holds: an older te upgraded in
	// place under the same address is then given NotifyOnce again.
	notifyPeerTTL = time.Minute
)

// notifyPeers says, per RPC address, whether the peer took NotifyOnce.
type notifyPeers struct {
	mu sync.Mutex
	m  map[string]notifyPeer
}

type notifyPeer struct {
	once bool
	at   time.Time
}

func (p *notifyPeers) get(addr string, now time.Time) (once, known bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	np, ok := p.m[addr]
	if !ok || now.Sub(np.at) > notifyPeerTTL {
		return false, false
	}
	return np.once, true
}

func (p *notifyPeers) set(addr string, once bool, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil || len(p.m) >= maxNotifyPeers {
		p.m = map[string]notifyPeer{}
	}
	p.m[addr] = notifyPeer{once, now}
}

// notifyTe sends (name, msg) to a te peer: NotifyOnce where it is taken,
// else Notify.
func (e *Engine) notifyTe(ctx context.Context, t ctrl.Target, name, msg string) error {
	now := time.Now()
	once, known := e.np.get(t.Addr, now)
	if !known {
		once = true
		if wire.NotifyIDSize+2+len(name)+4+len(msg) > wire.MaxSmallPayload {
			// An older te refuses a frame of a kind it does not know
			// over 64 KiB by closing the connection, which would read
			// as a lost reply: it is asked first (its Probe answer
			// lacks notify_ids). If the probe fails, so would the
			// notification, or it goes to a Mooncake peer: Notify.
			once, known = e.probeNotifyOnce(ctx, t)
			if known {
				e.np.set(t.Addr, once, now)
			}
		}
	}
	if once {
		_, err := e.ctrl.CallTo(ctx, t, wire.KindNotifyOnce, wire.AppendNotifyOnce(nil, rand.Uint64(), []byte(name), []byte(msg)))
		switch errs.CodeOf(err) {
		case errs.OK:
			e.np.set(t.Addr, true, now)
			return nil
		case errs.NotSupported, errs.TooLarge:
			// An older te: NotifyOnce is a kind it does not know (or,
			// over 64 KiB, does not admit); nothing was queued.
			e.np.set(t.Addr, false, now)
		default:
			return err
		}
	}
	_, err := e.ctrl.CallTo(ctx, t, wire.KindNotify, wire.AppendNotify(nil, []byte(name), []byte(msg)))
	return err
}

// probeNotifyOnce asks the peer whether it takes NotifyOnce; known is false
// when the probe failed.
func (e *Engine) probeNotifyOnce(ctx context.Context, t ctrl.Target) (once, known bool) {
	b, err := e.ctrl.CallTo(ctx, t, wire.KindProbe, nil)
	if err != nil {
		return false, false
	}
	var p probeReply
	if json.Unmarshal(b, &p) != nil {
		return false, false
	}
	return p.NotifyIDs, true
}

func (e *Engine) handleNotify(ctx context.Context, body []byte) ([]byte, error) {
	name, msg, err := wire.ParseNotify(body)
	if err != nil {
		return nil, err
	}
	return nil, e.queueNotify(ctx, name, msg, false, 0)
}

// handleNotifyOnce queues a notification the sender gave an id, unless
// that sender's notification of that id was queued lately: it was sent
// again because the reply to the first was lost, and is answered ok again.
// The sender is the instance its connection proved (with a secret; the
// address without one), never a field of the body, so a peer cannot
// silence another's notifications by sending their ids first.
func (e *Engine) handleNotifyOnce(ctx context.Context, body []byte) ([]byte, error) {
	id, name, msg, err := wire.ParseNotifyOnce(body)
	if err != nil {
		return nil, err
	}
	return nil, e.queueNotify(ctx, name, msg, true, id)
}

// queueNotify queues (name, msg), charged to the reservation the control
// plane made for its call; with dedup, once per the sender's id.
func (e *Engine) queueNotify(ctx context.Context, name, msg []byte, dedup bool, id uint64) error {
	ci := ctrl.Info(ctx)
	n := uint64(len(name) + len(msg))
	if ci == nil || ci.Reserved < n {
		// Every notify reaches here through the control plane, which
		// reserved the bytes its frame could hold.
		return errs.New(errs.Internal, "notify", "notification of %d bytes arrived without its reservation", n)
	}
	q := &e.nq
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	if dedup {
		if q.seen == nil {
			q.seen = newNotifySeen(seenWindow, seenTotal, seenPerSender)
		}
		// Checked and remembered under q.mu with the queueing: a second
		// attempt that arrives while the first is being served waits
		// for it here, and sees it.
		if q.seen.has(ci.Sender, id, now) {
			e.stats.notifiesDuplicate.Add(1)
			return nil // ci.Kept stays 0: the plane releases the reservation
		}
	}
	if len(q.items) >= e.cfg.MaxNotifies {
		e.ctrl.RefusedNotify()
		return errs.New(errs.ResourceExhausted, "notify", "receiver's queue of %d notifications is full", e.cfg.MaxNotifies).
			WithHint("the receiver drains them with Notifies (get_notifies); retry later")
	}
	q.items = append(q.items, Notification{Name: string(name), Msg: string(msg), From: ci.PeerName, FromInstance: ci.PeerInstance})
	q.charges = append(q.charges, notifyCharge{ci.Sender, n})
	if dedup {
		// Only once queued: a refused notification sent again gets
		// another chance.
		q.seen.add(ci.Sender, id, now)
	}
	ci.Kept = n
	e.stats.notifiesReceived.Add(1)
	return nil
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
