package shm

import (
	"sync/atomic"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

// reqState tracks one request cut into spans, possibly over several jobs. It
// is the request's Priv, which Cancel reads. The request itself is read only
// while one of its spans is held (so it is not complete yet); it completes
// through tk, kept from Submit.
type reqState struct {
	r        *transport.Request
	tk       transport.Ticket
	left     atomic.Int32
	err      atomic.Pointer[error]
	canceled atomic.Bool
}

func (s *reqState) failed() bool { return s.err.Load() != nil }

// end records one span's outcome; the last one completes the request with the first
// error.
func (s *reqState) end(err error) {
	if err != nil {
		e := err // only a failure pays for the pointer
		s.err.CompareAndSwap(nil, &e)
	}
	if s.left.Add(-1) == 0 {
		var e error
		if p := s.err.Load(); p != nil {
			e = *p
		}
		s.tk.Complete(e)
	}
}

var (
	errCanceled error = errs.New(errs.Canceled, "shm", "canceled")
	errClosed   error = errs.New(errs.Closed, "shm", "engine closed")
)

// cancel marks the request canceled: spans not yet copied are left out, and
// the request ends with Canceled unless it failed already.
func (s *reqState) cancel() {
	s.canceled.Store(true)
	err := errCanceled
	s.err.CompareAndSwap(nil, &err)
}

// job is what one worker moves in one go: spans of requests to one owner with
// one opcode, at most IOVMax of them and about JobBytes in all.
type job struct {
	d     *segment.Desc
	op    transport.Opcode
	spans []span
	rs    []*reqState // per span
	ents  []*entry    // per span, while held
	bytes uint64
}

func (j *job) failAll(err error) {
	for _, s := range j.rs {
		s.end(err)
	}
}

// dropCanceled takes the spans of canceled requests out of j and returns
// their states, one per span, for the caller to end (outside its locks).
func (j *job) dropCanceled(out []*reqState) []*reqState {
	k := 0
	for i, s := range j.rs {
		if s.canceled.Load() {
			out = append(out, s)
			j.bytes -= j.spans[i].N
			continue
		}
		j.spans[k], j.rs[k] = j.spans[i], s
		k++
	}
	clear(j.rs[k:])
	j.spans, j.rs = j.spans[:k], j.rs[:k]
	return out
}

// minSplit is the least a job carries when a batch is spread over workers:
// below it the hand-off costs more than the second core gains.
const minSplit = 128 << 10

// inlineBytes is the most Submit copies in the caller's goroutine instead of
// handing the job to a worker.
const inlineBytes = 64 << 10

// Submit cuts the requests into jobs (by owner and opcode) and queues them
// for the workers. A batch is spread over the workers in jobs of at least
// minSplit bytes and at most JobBytes bytes and IOVMax spans; a request may
// be cut between jobs. The queue is unbounded, so Submit never waits for a
// copy; one small job to an owner whose session and keys are in hand is
// copied here (no control call is ever made on the caller's goroutine).
func (t *Transport) Submit(reqs []transport.Request) {
	type key struct {
		inst string
		op   transport.Opcode
	}
	type group struct {
		key   key
		first int // index of the group's first request
		n     int
		bytes uint64
	}
	var small [4]group
	groups := small[:0]
	states := make([]reqState, len(reqs)) // one allocation for the batch
	next := make([]int32, len(reqs))      // the group's next request, -1 at the end
	last := make([]int32, 0, 4)           // per group: its last request
	for i := range reqs {
		r := &reqs[i]
		if r.Length == 0 || r.Peer == nil || r.Buffer == nil {
			r.Complete(errs.New(errs.InvalidArgument, "shm", "empty request"))
			continue
		}
		states[i].r, states[i].tk = r, r.Ticket()
		r.Priv = &states[i]
		next[i] = -1
		k := key{r.Peer.Instance, r.Op}
		g := -1
		for x := range groups {
			if groups[x].key == k {
				g = x
				break
			}
		}
		if g < 0 {
			groups = append(groups, group{key: k, first: i})
			last = append(last, int32(i))
			g = len(groups) - 1
		} else {
			next[last[g]] = int32(i)
			last[g] = int32(i)
		}
		groups[g].n++
		groups[g].bytes += r.Length
	}
	var out []*job
	for _, g := range groups {
		jobs := (g.bytes + t.opt.JobBytes - 1) / t.opt.JobBytes
		jobs = max(jobs, min(uint64(t.opt.Workers), g.bytes/minSplit), 1)
		size := (g.bytes + jobs - 1) / jobs
		var j *job
		for i := g.first; i >= 0; i = int(next[i]) {
			rs := &states[i]
			r := rs.r
			for off := uint64(0); off < r.Length; {
				if j == nil {
					// Room for the common cases (large requests: one or
					// two spans; small ones: many); append grows the rest.
					c := min(g.n, IOVMax, max(2, int(size/(g.bytes/uint64(g.n)+1))+1))
					j = &job{d: r.Peer, op: r.Op, spans: make([]span, 0, c), rs: make([]*reqState, 0, c)}
					out = append(out, j)
				}
				n := min(size-j.bytes, r.Length-off)
				j.spans = append(j.spans, span{Local: r.Local + off, Remote: r.Remote + off, N: n})
				j.rs = append(j.rs, rs)
				rs.left.Add(1)
				j.bytes += n
				off += n
				if len(j.spans) == IOVMax || j.bytes >= size {
					j = nil
				}
			}
		}
	}
	if len(out) == 1 && out[0].bytes <= inlineBytes && t.runInline(out[0]) {
		return
	}
	t.enqueue(out)
}

// runInline copies a small job on the caller's goroutine when that needs no
// control call (the owner is attached, its lease is fresh and every key is
// granted). Holding mu keeps Close waiting until the copy is done. It reports
// false, having touched nothing, when the job must go to a worker.
func (t *Transport) runInline(j *job) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed || t.sameHost(j.d) != nil {
		return false
	}
	o := t.ownerFor(j.d)
	if !o.fresh() {
		return false
	}
	if !t.holdGranted(o, j) {
		return false
	}
	v := t.vms.Get().(Mover)
	t.copyHeld(v, o, j)
	t.vms.Put(v)
	return true
}

// enqueue hands jobs to the workers; after Close they fail at once.
func (t *Transport) enqueue(jobs []*job) {
	t.qmu.Lock()
	if t.qclosed {
		t.qmu.Unlock()
		for _, j := range jobs {
			j.failAll(errClosed)
		}
		return
	}
	t.queue = append(t.queue, jobs...)
	t.qmu.Unlock()
	if len(jobs) == 1 {
		t.qcond.Signal()
	} else {
		t.qcond.Broadcast()
	}
}

// worker runs queued jobs until Close.
func (t *Transport) worker() {
	defer t.wg.Done()
	v := t.spec.Medium.NewMover()
	for {
		t.qmu.Lock()
		for len(t.queue) == 0 && !t.qclosed {
			t.qcond.Wait()
		}
		if len(t.queue) == 0 {
			t.qmu.Unlock()
			return
		}
		j := t.queue[0]
		t.queue[0] = nil
		t.queue = t.queue[1:]
		if len(t.queue) == 0 {
			t.queue = t.queue[:0:0] // let the drained array go
		}
		t.qmu.Unlock()
		t.run(v, j)
	}
}

// Cancel ends the canceled requests' spans still queued at once (Canceled);
// a job a worker holds leaves their spans out from its next system call on,
// and a span being copied ends when its call returns (a call moves at most
// a job's bytes). A job waiting for a control call (attach, validate) ends
// its canceled spans when the call returns, within CallTimeout.
func (t *Transport) Cancel(reqs []*transport.Request) {
	some := false
	for _, r := range reqs {
		if s, ok := r.Priv.(*reqState); ok && s != nil {
			s.cancel()
			some = true
		}
	}
	if !some {
		return
	}
	var out []*reqState
	t.qmu.Lock()
	keep := t.queue[:0]
	for _, j := range t.queue {
		out = j.dropCanceled(out)
		if len(j.spans) > 0 {
			keep = append(keep, j)
		}
	}
	clear(t.queue[len(keep):])
	t.queue = keep
	t.qmu.Unlock()
	for _, s := range out {
		s.end(errCanceled)
	}
}

// Quiesce has nothing to end: the accesses shm serves for peers are their
// own process_vm_readv/writev calls, which the owner does not count. The
// fence for them is the revocation protocol Unregister runs.
func (t *Transport) Quiesce(*segment.Region) error { return nil }

// run moves one job: attach and renew the lease if needed, make sure every
// key is one the owner granted, hold the buffers' entries (a revocation waits
// for them), then copy with as few syscalls as the kernel allows.
func (t *Transport) run(v Mover, j *job) {
	if t.shut.Load() {
		j.failAll(errClosed)
		return
	}
	if t.endCanceled(j) {
		return
	}
	if err := t.sameHost(j.d); err != nil {
		j.failAll(err)
		return
	}
	o := t.ownerFor(j.d)
	if err := o.ready(t); err != nil {
		j.failAll(err)
		return
	}
	if t.spec.WatchOwner && o.exited() {
		t.forget(o)
		j.failAll(errs.New(errs.PeerUnreachable, t.spec.Name, "segment %q: its process (pid %d) exited", o.name, o.pid))
		return
	}
	if t.endCanceled(j) {
		return
	}
	t.hold(o, j)
	t.copyHeld(v, o, j)
}

// endCanceled ends the spans of j whose requests were canceled and reports
// whether none is left.
func (t *Transport) endCanceled(j *job) bool {
	for _, s := range j.dropCanceled(nil) {
		s.end(errCanceled)
	}
	return len(j.spans) == 0
}

// copyHeld copies the spans of j whose entries are held (hold set them; the
// others ended already) and releases the entries.
func (t *Transport) copyHeld(v Mover, o *owner, j *job) {
	done := make([]bool, len(j.spans))
	fail := func(i int, err error) {
		if !done[i] {
			done[i] = true
			if e := j.ents[i]; e != nil {
				e.release()
				j.ents[i] = nil
			}
			if errs.CodeOf(err) == errs.PeerUnreachable {
				t.forget(o)
			} else if errs.CodeOf(err) == errs.AccessDenied {
				o.refuse(errs.Wrap(errs.TransportUnavailable, "shm", err, "segment %q", o.name))
			}
			j.rs[i].end(err)
		}
	}
	// Spans failed by hold are done already; the rest move now.
	for i := range j.spans {
		if j.ents[i] == nil {
			done[i] = true
		}
	}
	skip := func(i int) bool { return done[i] || j.rs[i].failed() }
	check := func() error {
		if t.shut.Load() {
			return errClosed
		}
		// The lease was renewed to at least half its length before the
		// entries were taken; a job runs for milliseconds. Should it ever
		// run out mid-job, stop: the owner no longer counts on us.
		if o.leaseLeft() <= 0 {
			return errs.New(errs.Timeout, "shm", "lease on segment %q ran out mid-transfer", o.name)
		}
		return nil
	}
	calls, short := v.Counts()
	v.Move(j.d, j.op == transport.Write, j.spans, skip, check, fail)
	calls2, short2 := v.Counts()
	t.st.syscalls.Add(calls2 - calls)
	t.st.shortSyscalls.Add(short2 - short)
	var moved int64
	for i := range j.spans {
		if done[i] {
			continue
		}
		j.ents[i].release()
		j.ents[i] = nil
		if !j.rs[i].failed() {
			moved += int64(j.spans[i].N)
		}
		// A span left out because its request failed (or was canceled)
		// elsewhere ends without an error of its own: the request carries
		// one already.
		j.rs[i].end(nil)
	}
	if j.op == transport.Write {
		t.st.bytesWritten.Add(moved)
	} else {
		t.st.bytesRead.Add(moved)
	}
}

// hold resolves every span's key to an entry the owner granted (asking the
// owner about unknown keys in one call) and takes the entries; spans that
// cannot be held end with their error and get a nil entry.
func (t *Transport) hold(o *owner, j *job) {
	j.ents = make([]*entry, len(j.spans))
	resolved := make([]bool, len(j.spans))
	failRest := func(err error) {
		for i := range j.spans {
			if !resolved[i] {
				resolved[i] = true
				j.rs[i].end(err)
			}
		}
	}
	for attempt := 0; ; attempt++ {
		var ask []item
		index := map[askKey]int{}
		o.mu.Lock()
		if o.session == 0 {
			o.mu.Unlock()
			failRest(errs.New(errs.AccessDenied, "shm", "session with segment %q ended", o.name))
			return
		}
		for i, s := range j.spans {
			if resolved[i] {
				continue
			}
			k := j.rs[i].r.Key
			if k == 0 {
				resolved[i] = true
				j.rs[i].end(errs.New(errs.StaleDescriptor, "shm", "buffer at %#x has no capability key", s.Remote))
				continue
			}
			if e := o.allowed[k]; e != nil && e.covers(s.Remote, s.N) {
				continue
			}
			if _, ok := index[askKey{k, s.Remote}]; !ok {
				index[askKey{k, s.Remote}] = len(ask)
				ask = append(ask, item{Key: k, Addr: s.Remote, Len: s.N})
			}
		}
		o.mu.Unlock()
		if len(ask) == 0 {
			break
		}
		grants, err := o.validate(t, ask)
		if err == errRaced && attempt < 8 {
			continue
		}
		if err != nil {
			failRest(err)
			return
		}
		for i := range j.spans {
			if resolved[i] {
				continue
			}
			if x, ok := index[askKey{j.rs[i].r.Key, j.spans[i].Remote}]; ok && grants[x].Code != 0 {
				resolved[i] = true
				t.st.staleRefused.Add(1)
				r := j.rs[i].r
				if r.Buffer != nil && r.Key != r.Buffer.Key && grants[x].Code == errs.AccessDenied {
					j.rs[i].end(errs.New(grants[x].Code, "shm", "segment %q refused [%#x,+%d) under window %#x: the window is bound to another engine, "+
						"does not cover the range, or was revoked", o.name, j.spans[i].Remote, j.spans[i].N, r.Key))
					continue
				}
				j.rs[i].end(errs.New(grants[x].Code, "shm", "owner refused [%#x,+%d): %v", j.spans[i].Remote, j.spans[i].N, grants[x].Code))
			}
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range j.spans {
		if !resolved[i] {
			t.acquireLocked(o, j, i)
		}
	}
}

// askKey names one question to the owner: a key, and where it is used (a
// window's key is granted range by range).
type askKey struct{ key, addr uint64 }

// holdGranted takes the entries of j when every key is granted already, in
// one critical section, so no revocation can slip between the check and
// the hold; it reports false, having touched nothing, when a key would have
// to be asked for.
func (t *Transport) holdGranted(o *owner, j *job) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.session == 0 {
		return false
	}
	for i := range j.spans {
		k := j.rs[i].r.Key
		if e := o.allowed[k]; k == 0 || e == nil || !e.covers(j.spans[i].Remote, j.spans[i].N) {
			return false
		}
	}
	j.ents = make([]*entry, len(j.spans))
	for i := range j.spans {
		t.acquireLocked(o, j, i)
	}
	return true
}

// acquireLocked holds span i's entry, or ends the span with the reason it
// cannot be held. Called with o.mu held.
func (t *Transport) acquireLocked(o *owner, j *job, i int) {
	s := j.spans[i]
	e := o.allowed[j.rs[i].r.Key]
	var err error
	switch {
	case e == nil:
		err = errs.New(errs.StaleDescriptor, "shm", "buffer at %#x was revoked", s.Remote)
	case !e.covers(s.Remote, s.N):
		err = errs.New(errs.AccessDenied, "shm", "[%#x,+%d) is outside the buffer the owner granted", s.Remote, s.N)
	case !e.acquire():
		err = errs.New(errs.StaleDescriptor, "shm", "buffer at %#x was revoked", s.Remote)
	}
	if err != nil {
		t.st.staleRefused.Add(1)
		j.rs[i].end(err)
		return
	}
	j.ents[i] = e
}

// forget drops an owner whose process is gone.
func (t *Transport) forget(o *owner) {
	o.reset(t, o.sessionID())
	o.dead.Store(true)
	t.omu.Lock()
	if t.owners[o.inst] == o {
		delete(t.owners, o.inst)
	}
	t.omu.Unlock()
}

func (o *owner) sessionID() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.session
}
