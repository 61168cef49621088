package engine

import (
	"sync"
	"time"

	"github.com/tecache/te/engine/errs"
)

// reaper ends tasks that outlive the transfer timeout. Every submit gets the
// same timeout, so deadlines arrive in submission order and a FIFO queue
// scanned by one goroutine replaces a timer per submit (which cost more than
// the submit itself).
type reaper struct {
	mu   sync.Mutex
	q    []*submitGroup
	head int
}

func (r *reaper) add(g *submitGroup, timeout time.Duration) {
	g.deadline = time.Now().Add(timeout)
	r.mu.Lock()
	r.q = append(r.q, g)
	r.mu.Unlock()
}

// expired pops the groups whose deadline passed.
func (r *reaper) expired(now time.Time) []*submitGroup {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*submitGroup
	for r.head < len(r.q) {
		g := r.q[r.head]
		if g.remaining.Load() > 0 && g.deadline.After(now) {
			break
		}
		r.q[r.head] = nil
		r.head++
		if g.remaining.Load() > 0 {
			out = append(out, g)
		}
	}
	if r.head > 1024 && r.head*2 > len(r.q) { // compact
		r.q = append(r.q[:0], r.q[r.head:]...)
		r.head = 0
	}
	return out
}

// runReaper checks deadlines at a tenth of the timeout (1 ms to 100 ms), so a
// task ends TIMEOUT at most about 10% late.
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
			for _, g := range e.reaper.expired(now) {
				err := errs.New(errs.Timeout, "transfer", "not finished within %v", e.cfg.TransferTimeout)
				for _, tk := range g.tasks {
					g.b.finish(tk, Timeout, err)
				}
			}
		}
	}
}
