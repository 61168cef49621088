package shm

import (
	"sync/atomic"

	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
)

// reqState tracks one request cut into spans, possibly over several jobs.
type reqState struct {
	r    *transport.Request
	left atomic.Int32
	err  atomic.Pointer[error]
}

func (s *reqState) failed() bool { return s.err.Load() != nil }

// end records one span's outcome; the last one completes the request with the first
// error.
func (s *reqState) end(err error) {
	if err != nil {
		s.err.CompareAndSwap(nil, &err)
	}
	if s.left.Add(-1) == 0 {
		var e error
		if p := s.err.Load(); p != nil {
			e = *p
		}
		s.r.Complete(e)
	}
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

// minSplit is the least a job carries when a batch is spread over workers:
// below it the hand-off costs more than the second core gains.
const minSplit = 128 << 10

// inlineBytes is the most Submit copies in the caller's goroutine instead of
// handing the job to a worker.
const inlineBytes = 64 << 10

// Submit cuts the requests into jobs (by owner and opcode) and queues them
// for the workers. A batch is spread over the workers in jobs of at least
// minSplit bytes and at most JobBytes bytes and IOVMax spans; a request may
// be cut between jobs. Submit blocks only while the queue is full.
func (t *Transport) Submit(in []transport.Request) {
	reqs := make([]*transport.Request, len(in))
	for i := range in {
		reqs[i] = &in[i]
	}
	type key struct {
		inst string
		op   transport.Opcode
	}
	type group struct {
		reqs  []*reqState
		bytes uint64
	}
	groups := map[key]*group{}
	var order []*group
	states := make([]reqState, len(reqs)) // one allocation for the batch
	for i, r := range reqs {
		if r.Length == 0 || r.Peer == nil || r.Buffer == nil {
			r.Complete(errs.New(errs.InvalidArgument, "shm", "empty request"))
			continue
		}
		k := key{r.Peer.Instance, r.Op}
		g := groups[k]
		if g == nil {
			g = &group{}
			groups[k] = g
			order = append(order, g)
		}
		states[i].r = r
		g.reqs = append(g.reqs, &states[i])
		g.bytes += r.Length
	}
	var out []*job
	for _, g := range order {
		jobs := (g.bytes + t.opt.JobBytes - 1) / t.opt.JobBytes
		jobs = max(jobs, min(uint64(t.opt.Workers), g.bytes/minSplit), 1)
		size := (g.bytes + jobs - 1) / jobs
		var j *job
		for _, rs := range g.reqs {
			r := rs.r
			for off := uint64(0); off < r.Length; {
				if j == nil {
					c := min(len(g.reqs), IOVMax)
					j = &job{d: r.Peer, op: r.Op, spans: make([]span, 0, c), rs: make([]*reqState, 0, c)}
					out = append(out, j)
				}
				n := min(size-j.bytes, r.Length-off)
				j.spans = append(j.spans, span{local: r.Local + off, remote: r.Remote + off, n: n})
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
	t.mu.RLock()
	defer t.mu.RUnlock()
	if len(out) == 1 && out[0].bytes <= inlineBytes && !t.closed {
		// One small job: copy it here. A hand-off to a worker would cost
		// two context switches, more than the copy itself. Holding mu
		// keeps Close waiting until the copy is done.
		v := t.vms.Get().(*vm)
		t.run(v, out[0])
		t.vms.Put(v)
		return
	}
	for i, j := range out {
		if t.closed {
			for _, j := range out[i:] {
				j.failAll(errs.New(errs.Closed, "shm", "engine closed"))
			}
			return
		}
		select {
		case t.jobs <- j:
		case <-t.closing:
			for _, j := range out[i:] {
				j.failAll(errs.New(errs.Closed, "shm", "engine closed"))
			}
			return
		}
	}
}

func (t *Transport) worker() {
	defer t.wg.Done()
	v := newVM()
	for {
		select {
		case <-t.closing:
			return
		case j := <-t.jobs:
			t.run(v, j)
		}
	}
}

// run moves one job: attach and renew the lease if needed, make sure every
// key is one the owner granted, hold the buffers' entries (a revocation waits
// for them), then copy with as few syscalls as the kernel allows.
func (t *Transport) run(v *vm, j *job) {
	if err := t.sameHost(j.d); err != nil {
		j.failAll(err)
		return
	}
	o := t.ownerFor(j.d)
	if err := o.ready(t); err != nil {
		j.failAll(err)
		return
	}
	t.hold(o, j)
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
		// The lease was renewed to at least half its length before the
		// entries were taken; a job runs for milliseconds. Should it ever
		// run out mid-job, stop: the owner no longer counts on us.
		if o.leaseLeft() <= 0 {
			return errs.New(errs.Timeout, "shm", "lease on segment %q ran out mid-transfer", o.name)
		}
		return nil
	}
	calls, short := v.calls, v.short
	v.move(j.d.Host.Pid, j.op == transport.Write, j.spans, skip, check, fail)
	t.st.syscalls.Add(v.calls - calls)
	t.st.shortSyscalls.Add(v.short - short)
	var moved int64
	for i := range j.spans {
		if done[i] {
			continue
		}
		j.ents[i].release()
		j.ents[i] = nil
		moved += int64(j.spans[i].n)
		// A span left out because its request failed elsewhere ends
		// without an error of its own: the request carries one already.
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
		index := map[uint64]int{}
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
			k := j.rs[i].r.Buffer.Key
			if k == 0 {
				resolved[i] = true
				j.rs[i].end(errs.New(errs.StaleDescriptor, "shm", "buffer at %#x has no capability key", s.remote))
				continue
			}
			if o.allowed[k] != nil {
				continue
			}
			if _, ok := index[k]; !ok {
				index[k] = len(ask)
				ask = append(ask, item{Key: k, Addr: s.remote, Len: s.n})
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
			if x, ok := index[j.rs[i].r.Buffer.Key]; ok && grants[x].Code != 0 {
				resolved[i] = true
				t.st.staleRefused.Add(1)
				j.rs[i].end(errs.New(grants[x].Code, "shm", "owner refused [%#x,+%d): %v", j.spans[i].remote, j.spans[i].n, grants[x].Code))
			}
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, s := range j.spans {
		if resolved[i] {
			continue
		}
		e := o.allowed[j.rs[i].r.Buffer.Key]
		var err error
		switch {
		case e == nil:
			err = errs.New(errs.StaleDescriptor, "shm", "buffer at %#x was revoked", s.remote)
		case s.remote < e.addr || s.remote+s.n > e.addr+e.len || s.remote+s.n < s.remote:
			err = errs.New(errs.AccessDenied, "shm", "[%#x,+%d) is outside the buffer the owner granted", s.remote, s.n)
		case !e.acquire():
			err = errs.New(errs.StaleDescriptor, "shm", "buffer at %#x was revoked", s.remote)
		}
		if err != nil {
			t.st.staleRefused.Add(1)
			j.rs[i].end(err)
			continue
		}
		j.ents[i] = e
	}
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
