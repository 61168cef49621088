package engine

import (
	"sync"
	"time"
)

// reaper times tasks out. Every submit gets the same timeout, so deadlines
// arrive in submission order and a FIFO queue scanned by one goroutine
// replaces a timer per submit (which cost more than the submit itself). An
// entry names the submit's slots by batch generation, so a batch that was
// reset or freed since voids its entries; entries are values, so adding one
// allocates nothing once the queue has grown.
type reaper struct {
	mu   sync.Mutex
	q    []reapEntry
	head int
}

type reapEntry struct {
	b        *Batch
	gen      uint32
	lo, hi   int
	deadline time.Time
}

func (r *reaper) add(b *Batch, gen uint32, lo, hi int, deadline time.Time) {
	e := reapEntry{b: b, gen: gen, lo: lo, hi: hi, deadline: deadline}
	r.mu.Lock()
	// Settled entries at the head go now rather than at the next tick, so
	// a steady stream of fast batches keeps the queue short.
	for k := 0; k < 4 && r.head < len(r.q) && !r.q[r.head].live(); k++ {
		r.q[r.head] = reapEntry{}
		r.head++
	}
	if r.head > 0 && r.head == len(r.q) { // drained: start over in place
		r.q, r.head = r.q[:0], 0
	}
	r.q = append(r.q, e)
	r.mu.Unlock()
}

// live reports whether some task of the entry may still be pending.
func (e *reapEntry) live() bool {
	b := e.b
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gen == e.gen && !b.settled
}

// expired pops the entries whose deadline passed, and those at the head whose
// batch has settled since.
func (r *reaper) expired(now time.Time) []reapEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []reapEntry
	for r.head < len(r.q) {
		e := &r.q[r.head]
		if e.deadline.After(now) && e.live() {
			break
		}
		if !e.deadline.After(now) {
			out = append(out, *e)
		}
		r.q[r.head] = reapEntry{}
		r.head++
	}
	if r.head > 1024 && r.head*2 > len(r.q) { // compact
		n := copy(r.q, r.q[r.head:])
		clear(r.q[n:])
		r.q, r.head = r.q[:n], 0
	}
	return out
}

// runReaper checks deadlines at a tenth of the timeout (1 ms to 100 ms), so a
// task is canceled at most about 10% late. A timed-out task ends TIMEOUT once
// its transport confirms it let go of the task's memory.
func (e *Engine) runReaper() {
	defer e.wg.Done()
	tick := e.cfg.TransferTimeout / 10
	tick = min(max(tick, time.Millisecond), 100*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-e.done:
			return
		case now := <-t.C:
			for _, x := range e.reaper.expired(now) {
				if !x.live() {
					continue
				}
				// Off the reaper's goroutine: canceling waits for a
				// submit in progress on the same batch.
				x := x
				e.goTracked(func() { x.b.cancel(x.gen, x.lo, x.hi, whyTimeout) })
			}
		}
	}
}
