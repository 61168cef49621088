package pipe

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/internal/errs"
)

// Pool is a set of peers, each with its striped connections, in one dialect.
// It is safe for concurrent use.
//
// Lock order: a Peer's mu, then the Pool's mu, then a connection's mu; none
// is held while an item is settled.
type Pool[T Item] struct {
	d      Dialect[T]
	o      Options
	ctx    context.Context // canceled by Close: aborts dials
	cancel context.CancelFunc

	mu     sync.Mutex
	peers  map[string]*Peer[T]
	closed error // once closed, what new items fail with
	wg     sync.WaitGroup

	pruned atomic.Uint64
}

// New returns a pool speaking d. With Options.PeerIdle it runs a janitor
// goroutine until Close.
func New[T Item](d Dialect[T], o Options) *Pool[T] {
	o.fill()
	p := &Pool[T]{d: d, o: o, peers: map[string]*Peer[T]{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	if o.PeerIdle > 0 {
		p.wg.Add(1)
		go p.janitor()
	}
	return p
}

// Pruned returns how many idle connections the janitor closed.
func (p *Pool[T]) Pruned() uint64 { return p.pruned.Load() }

// Live returns the peers the pool holds and their connections alive now
// (dialing, opening or open).
func (p *Pool[T]) Live() (peers, conns int) {
	p.mu.Lock()
	list := p.peerList()
	p.mu.Unlock()
	for _, pe := range list {
		for _, c := range pe.all() {
			if c.alive() {
				conns++
			}
		}
	}
	return len(list), conns
}

// peerList returns the peers held now; the caller holds p.mu.
func (p *Pool[T]) peerList() []*Peer[T] {
	list := make([]*Peer[T], 0, len(p.peers))
	for _, pe := range p.peers {
		list = append(list, pe)
	}
	return list
}

// Peer returns the peer at addr, made on first use, and marks it used now.
func (p *Pool[T]) Peer(addr string) (*Peer[T], error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed != nil {
		return nil, p.closed
	}
	pe := p.peers[addr]
	if pe == nil {
		pe = &Peer[T]{pool: p, addr: addr, conns: make([]*conn[T], p.o.Conns)}
		p.peers[addr] = pe
	}
	// Under p.mu, so the janitor never prunes a peer a caller just chose.
	pe.lastUsed.Store(time.Now().UnixNano())
	return pe, nil
}

// Close fails every item queued or in flight with err (errs.Closed, say),
// makes later ones fail with it, and returns once every goroutine of the
// pool has exited and every item it held is settled.
func (p *Pool[T]) Close(err error) {
	p.mu.Lock()
	if p.closed != nil {
		p.mu.Unlock()
		p.wg.Wait()
		return
	}
	p.closed = err
	p.cancel()
	peers := p.peerList()
	p.mu.Unlock()
	// A connection made before closed was set is in its peer's list by
	// now (newConn runs under the peer's lock); none is made after.
	for _, pe := range peers {
		for _, c := range pe.all() {
			c.cut(err, false)
		}
	}
	p.wg.Wait()
}

// janitor prunes peers that had no item for PeerIdle.
func (p *Pool[T]) janitor() {
	defer p.wg.Done()
	tk := time.NewTicker(min(max(p.o.PeerIdle/4, 10*time.Millisecond), 30*time.Second))
	defer tk.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case now := <-tk.C:
			p.Prune(now)
		}
	}
}

// Prune drops the peers with nothing queued or in flight that had no item
// for PeerIdle before now, or whose connections are all dead. An item that
// meets a pruned connection (its caller chose the peer just before) goes to
// the peer's replacement.
func (p *Pool[T]) Prune(now time.Time) {
	p.mu.Lock()
	peers := make([]*Peer[T], 0, len(p.peers))
	for _, pe := range p.peers {
		peers = append(peers, pe)
	}
	p.mu.Unlock()
	idleFor := int64(p.o.PeerIdle)
	var drop []*conn[T]
	for _, pe := range peers {
		idle := idleFor > 0 && now.UnixNano()-pe.lastUsed.Load() > idleFor
		pe.mu.Lock()
		busy, alive := false, false
		for _, c := range pe.conns {
			if c != nil {
				b, a := c.state()
				busy, alive = busy || b, alive || a
			}
		}
		if !busy && (idle || !alive) && !pe.gone {
			p.mu.Lock()
			// A caller that chose pe since it was listed moved lastUsed
			// under p.mu: it is not idle after all.
			recent := now.UnixNano()-pe.lastUsed.Load() <= idleFor && alive
			if p.peers[pe.addr] == pe && !recent {
				delete(p.peers, pe.addr)
				pe.gone = true
			}
			p.mu.Unlock()
			if pe.gone {
				for _, c := range pe.conns {
					if c != nil {
						drop = append(drop, c)
					}
				}
			}
		}
		pe.mu.Unlock()
	}
	var n uint64
	for _, c := range drop {
		if c.cut(errs.New(errs.Closed, p.o.Component, "idle connection to %s%s pruned", p.o.Label, c.pe.addr), true) {
			n++
		}
	}
	p.pruned.Add(n)
}

// forgetDead drops pe once every connection it made has ended with nothing
// queued or in flight: a peer that went (closed, died, or came back at
// another address, as a restarted engine's data endpoint does) costs the
// pool nothing from then on, rather than until the janitor's next round (or
// for ever without PeerIdle). An item for pe after that goes to a new peer
// at its address, as after Prune.
func (p *Pool[T]) forgetDead(pe *Peer[T]) {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if pe.gone {
		return
	}
	for _, c := range pe.conns {
		if c != nil {
			if busy, alive := c.state(); busy || alive {
				return
			}
		}
	}
	p.mu.Lock()
	if p.peers[pe.addr] == pe {
		delete(p.peers, pe.addr)
		pe.gone = true
	}
	p.mu.Unlock()
}

// Peer is the set of connections to one address.
type Peer[T Item] struct {
	pool     *Pool[T]
	addr     string
	rr       atomic.Uint64 // striping start
	lastUsed atomic.Int64  // unix nanoseconds of the last Pool.Peer
	mu       sync.Mutex
	conns    []*conn[T]
	gone     bool // pruned: items go to the peer's replacement
}

// Conns returns the number of connections items are striped over.
func (pe *Peer[T]) Conns() int { return len(pe.conns) }

// Stripe returns the connection a run of items starts on, rotating, so runs
// from many callers spread over every connection.
func (pe *Peer[T]) Stripe() int { return int((pe.rr.Add(1) - 1) % uint64(len(pe.conns))) }

// Send queues items on connection i (modulo Conns), connecting it first if
// need be. It does not block on the network; items on a connection that
// failed are settled with its error.
func (pe *Peer[T]) Send(i int, items ...T) {
	pe.get(i%len(pe.conns)).enqueue(items, nil)
}

// Cancel settles or releases every item of this peer whose Canceled reports
// true (see the package comment); the connections stay up for the others,
// unless the dialect is Ordered and one was in flight.
func (pe *Peer[T]) Cancel() {
	for _, c := range pe.all() {
		c.cancel()
	}
	pe.mu.Lock()
	gone := pe.gone
	pe.mu.Unlock()
	if gone {
		// Items may have moved to the replacement since.
		pe.pool.mu.Lock()
		q := pe.pool.peers[pe.addr]
		pe.pool.mu.Unlock()
		if q != nil && q != pe {
			for _, c := range q.all() {
				c.cancel()
			}
		}
	}
}

func (pe *Peer[T]) all() []*conn[T] {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	out := make([]*conn[T], 0, len(pe.conns))
	for _, c := range pe.conns {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// get returns connection i, replacing a dead one: the first item after a
// connection's loss reconnects.
func (pe *Peer[T]) get(i int) *conn[T] {
	pe.mu.Lock()
	if pe.gone {
		// Pruned since the caller chose it: the replacement, looked up
		// without pe.mu held.
		pe.mu.Unlock()
		q, err := pe.pool.Peer(pe.addr)
		if err != nil {
			return deadConn(pe, err)
		}
		return q.get(i)
	}
	defer pe.mu.Unlock()
	c := pe.conns[i]
	if c != nil && c.alive() {
		return c
	}
	c = pe.pool.newConn(pe)
	pe.conns[i] = c
	return c
}

// Addr is the address the peer's connections dial.
func (pe *Peer[T]) Addr() string { return pe.addr }

// Warm makes every connection of the peer (dial and opening exchange) that
// is not up yet, and returns once each is open: nil, or the error of the
// first that failed, or ctx's end. Connections already open cost nothing,
// so a later item to the peer dials nothing.
func (pe *Peer[T]) Warm(ctx context.Context) error {
	cs := make([]*conn[T], len(pe.conns))
	for i := range cs {
		cs[i] = pe.get(i)
	}
	for _, c := range cs {
		select {
		case <-c.opened:
			continue
		default:
		}
		select {
		case <-c.opened:
		case <-c.down:
			c.mu.Lock()
			err := c.err
			c.mu.Unlock()
			return err
		case <-ctx.Done():
			return errs.Wrap(ctxCode(ctx), pe.pool.o.Component, ctx.Err(), "connect to %s%s", pe.pool.o.Label, pe.addr)
		}
	}
	return nil
}

// ctxCode is the code of an ended context: Timeout past its deadline,
// Canceled when its owner canceled it.
func ctxCode(ctx context.Context) errs.Code {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errs.Timeout
	}
	return errs.Canceled
}

// retry sends items again, spread over the peer's connections; those
// canceled end, those sent more than Retries times fail with err.
func (pe *Peer[T]) retry(es []entry[T], err error) {
	keep := es[:0]
	for _, e := range es {
		switch {
		case e.item.Canceled():
			e.item.Done(pe.pool.o.canceled())
		case int(e.tries) > pe.pool.o.Retries:
			e.item.Done(err)
		default:
			keep = append(keep, e)
		}
	}
	if len(keep) == 0 {
		return
	}
	n := len(pe.conns)
	start := pe.Stripe()
	groups := make([][]entry[T], n)
	for k, e := range keep {
		i := (start + k) % n
		groups[i] = append(groups[i], e)
	}
	for i, g := range groups {
		if len(g) > 0 {
			pe.get(i).enqueue(nil, g)
		}
	}
}
