package engine

import "time"

// The ids of notifications received with an id (wire.KindNotifyOnce) are
// remembered for a while, per sender, so that the same notification sent
// again after its reply was lost is answered ok and not queued twice.
// A sender retries within its RPC timeout (5 s by default); the window
// and the counts below leave it far more than that while bounding what
// any number of peers can make the table hold.
const (
	// seenWindow is how long an id is remembered.
	seenWindow = 10 * time.Minute
	// seenPerSender bounds the ids remembered per sender: a sender's
	// flood evicts its own oldest ids, not another sender's.
	seenPerSender = 4096
	// seenTotal bounds the ids remembered in all (about 16 MiB at most,
	// every id from another sender, their names included; about 100
	// bytes an id from few senders);
	// over it the oldest id of any sender goes first.
	seenTotal = 1 << 16
)

// notifySeen is the table of (sender, id) pairs received lately: entries
// in a slab of at most total, linked twice, oldest first, once over all
// senders (time and total eviction) and once per sender (per-sender
// eviction). The caller serialises access (notifyQueue.mu).
type notifySeen struct {
	window           time.Duration
	total, perSender int

	senders    map[string]*seenSender
	ids        map[seenKey]int32 // the entry of each (sender, id)
	slab       []seenEntry
	free       int32 // a free slot of slab, chained by next; -1: none
	head, tail int32 // the oldest and newest entries; -1: none
	n          int   // entries in use
}

type seenSender struct {
	key        string // the sender (CallInfo.Sender)
	n          int    // its entries
	head, tail int32  // its oldest and newest entries
}

type seenKey struct {
	s  *seenSender
	id uint64
}

type seenEntry struct {
	s            *seenSender
	id           uint64
	at           int64 // unix nanoseconds it was remembered
	prev, next   int32 // all senders' order
	sprev, snext int32 // its sender's order
}

func newNotifySeen(window time.Duration, total, perSender int) *notifySeen {
	return &notifySeen{window: window, total: max(total, 1), perSender: max(perSender, 1),
		senders: map[string]*seenSender{}, ids: map[seenKey]int32{}, free: -1, head: -1, tail: -1}
}

// has reports whether sender's id is remembered.
func (t *notifySeen) has(sender string, id uint64, now time.Time) bool {
	t.expire(now)
	s := t.senders[sender]
	if s == nil {
		return false
	}
	_, ok := t.ids[seenKey{s, id}]
	return ok
}

// add remembers sender's id (not already remembered), evicting the
// sender's oldest id at its bound and the oldest of all at the total one.
func (t *notifySeen) add(sender string, id uint64, now time.Time) {
	t.expire(now)
	if s := t.senders[sender]; s != nil && s.n >= t.perSender {
		t.remove(s.head)
	}
	if t.n >= t.total {
		t.remove(t.head)
	}
	s := t.senders[sender]
	if s == nil {
		s = &seenSender{key: sender, head: -1, tail: -1}
		t.senders[sender] = s
	}
	i := t.free
	if i >= 0 {
		t.free = t.slab[i].next
	} else {
		i = int32(len(t.slab))
		t.slab = append(t.slab, seenEntry{})
	}
	t.slab[i] = seenEntry{s: s, id: id, at: now.UnixNano(), prev: t.tail, next: -1, sprev: s.tail, snext: -1}
	if t.tail >= 0 {
		t.slab[t.tail].next = i
	} else {
		t.head = i
	}
	t.tail = i
	if s.tail >= 0 {
		t.slab[s.tail].snext = i
	} else {
		s.head = i
	}
	s.tail = i
	s.n++
	t.ids[seenKey{s, id}] = i
	t.n++
}

// expire forgets the ids older than the window.
func (t *notifySeen) expire(now time.Time) {
	old := now.Add(-t.window).UnixNano()
	for t.head >= 0 && t.slab[t.head].at < old {
		t.remove(t.head)
	}
}

// remove unlinks entry i, frees its slot, and forgets a sender left with
// no id.
func (t *notifySeen) remove(i int32) {
	e := &t.slab[i]
	s := e.s
	if e.prev >= 0 {
		t.slab[e.prev].next = e.next
	} else {
		t.head = e.next
	}
	if e.next >= 0 {
		t.slab[e.next].prev = e.prev
	} else {
		t.tail = e.prev
	}
	if e.sprev >= 0 {
		t.slab[e.sprev].snext = e.snext
	} else {
		s.head = e.snext
	}
	if e.snext >= 0 {
		t.slab[e.snext].sprev = e.sprev
	} else {
		s.tail = e.sprev
	}
	delete(t.ids, seenKey{s, e.id})
	if s.n--; s.n == 0 {
		delete(t.senders, s.key)
	}
	*e = seenEntry{next: t.free}
	t.free = i
	t.n--
}

// len returns the ids remembered and the senders they are of.
func (t *notifySeen) len() (ids, senders int) { return t.n, len(t.senders) }
