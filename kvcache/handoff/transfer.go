package handoff

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache"
	"github.com/tecache/te/kvcache/handoff/proto"
)

// Request declares one side of a transfer.
type Request struct {
	// ID names the transfer; prefill and decode use the same one (the
	// serving system's request id). At most 256 printable bytes.
	ID string
	// Layout is this side's cache, with its base addresses. Its memory must
	// be registered with the engine (remote-accessible) for the whole
	// transfer.
	Layout *kvcache.Layout
	// Blocks are this side's block ids, in token order; prefill's i-th block
	// goes to decode's i-th.
	Blocks []int
	// Mode is chosen by decode (Push when empty). Prefill may leave it
	// empty or name the mode it expects, to have a mismatch refused.
	Mode Mode
	// Timeout bounds the transfer from this declaration: unpaired or
	// unfinished by then, it expires (0: the sidecar's default, 30s).
	Timeout time.Duration
	// Peer is the segment name of the other side's engine, when the
	// serving system knows it (a proxy tells decode its prefill, and
	// prefill its decode). The window over this side's blocks is then
	// granted to that engine alone (engine.GrantWindowTo): with a cluster
	// secret no other engine can use its key, even one that learns it. A
	// pairing with another segment fails on both sides.
	//
	// Empty: the window is granted to the first engine that uses it
	// (engine.GrantWindowToFirst), and bound, once the sidecar pairs the
	// transfer, to the engine it paired (engine.BindWindow): with a
	// cluster secret, an engine that learned the key and used it first
	// makes this side's Wait fail with AccessDenied (the paired mover's
	// requests are refused too), and once bound no other engine can use
	// it. Without a secret nothing proves which engine uses a window over
	// tcp, shm or cxl, and the key stays a bearer key.
	Peer string
}

// Result describes a finished transfer.
type Result struct {
	ID   string
	Mode Mode
	// Mover is true on the side that moved the bytes (prefill in push
	// mode, decode in pull mode).
	Mover bool
	Bytes uint64
	// BlockRequests and Requests are the requests before and after
	// coalescing (known on the moving side).
	BlockRequests int
	Requests      int
	// Transport is the engine transport that moved the bytes (moving side).
	Transport string
	// Elapsed is, on the moving side, the time from its first submit to
	// its last byte; on the other side, the time Wait waited.
	Elapsed time.Duration
	// Recorded is false when the moving side moved every byte and notified
	// the peer but the sidecar lost the transfer before recording it.
	Recorded bool
}

// Transfer is one declared transfer. Wait (or Send) finishes it; Abort gives
// it up. Wait and SendLayer are called from one goroutine; Abort and Status
// from any.
type Transfer struct {
	c        *Client
	role     proto.Role
	id       string
	layout   *kvcache.Layout
	blocks   []int
	peer     string // the other side's segment, when the caller named it
	instance string
	cap      string // this side's capability for the transfer

	waitMu sync.Mutex // one Wait at a time

	mu      sync.Mutex
	rec     proto.Record
	plan    *kvcache.Plan
	seg     *engine.Segment
	batch   *engine.Batch
	layered bool
	sent    map[int]bool
	start   time.Time
	aborted bool
	// window is this side's grant over its blocks, which the mover's
	// requests present; revoked once this side is done with the transfer.
	window  uint64
	revoked bool
	revErr  error
	// peerWindow is the peer's window key, presented by this side's
	// requests when it moves the bytes.
	peerWindow uint64
	// noticeKey signs (mover) or checks (waiting side) the completion
	// notice; from the paired record.
	noticeKey string
	untracked bool
	done      bool          // the outcome is being or was reported
	fin       chan struct{} // closed once result and err are set
	result    *Result
	err       error
}

// Expect declares, on the decode side, where transfer r.ID's KV must go. It
// does not block beyond one sidecar call; Wait waits for (push) or performs
// (pull) the transfer.
func (c *Client) Expect(ctx context.Context, r Request) (*Transfer, error) {
	if r.Mode == "" {
		r.Mode = Push
	}
	return c.declare(ctx, proto.Decode, r)
}

// Ready declares, on the prefill side, that transfer r.ID's KV can be taken
// from r.Blocks. In pull mode the KV must be complete when Ready is called;
// in push mode the bytes move with SendLayer and Wait (also named Send),
// so Ready may come before the layers are computed. It does not block
// beyond one sidecar call.
func (c *Client) Ready(ctx context.Context, r Request) (*Transfer, error) {
	return c.declare(ctx, proto.Prefill, r)
}

func (c *Client) declare(ctx context.Context, role proto.Role, r Request) (*Transfer, error) {
	op := "handoff " + map[proto.Role]string{proto.Decode: "expect", proto.Prefill: "ready"}[role]
	if r.Layout == nil {
		return nil, errs.New(errs.InvalidArgument, op, "nil layout")
	}
	if err := r.Layout.Validate(); err != nil {
		return nil, err
	}
	switch r.Mode {
	case "", Push, Pull:
	default:
		return nil, errs.New(errs.InvalidArgument, op, "mode %q is neither push nor pull", r.Mode)
	}
	if r.Timeout < 0 {
		return nil, errs.New(errs.InvalidArgument, op, "negative timeout")
	}
	lj, err := json.Marshal(r.Layout)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, op, err, "encoding the layout")
	}
	// A window over this side's blocks: whichever side ends up moving the
	// bytes presents its key, and this side revokes it when it is done with
	// the transfer, so no late byte of it can land (or be read) after.
	ranges, err := blockRanges(r.Layout, r.Blocks)
	if err != nil {
		return nil, err
	}
	// Not knowing the peer, the window goes to the first engine that uses
	// it; this side binds it to the paired engine once the sidecar names
	// it (bind), and so learns if another engine used it first. The
	// mover's requests wait for nothing.
	grant := c.e.GrantWindowToFirst
	if r.Peer != "" {
		grant = func(rs []engine.Range) (uint64, error) { return c.e.GrantWindowTo(r.Peer, rs) }
	}
	window, err := grant(ranges)
	if err != nil {
		return nil, errs.Wrap(errs.CodeOf(err), op, err, "the blocks of transfer %q must be registered, remote-accessible memory", r.ID)
	}
	d := proto.Decl{ID: r.ID, Segment: c.e.Name(), Layout: lj, Blocks: r.Blocks, Mode: proto.Mode(r.Mode), Window: window}
	if r.Timeout > 0 {
		d.TimeoutMS = max(1, r.Timeout.Milliseconds())
	}
	path := "/handoff/expect"
	if role == proto.Prefill {
		path = "/handoff/ready"
	}
	rec, he, err := c.call(ctx, http.MethodPost, path, d, c.opts.RequestTimeout, "")
	if err == nil && he != nil {
		if he.body.Record != nil && he.body.Record.State.Terminal() {
			err = endErr(op, *he.body.Record)
		} else {
			err = refused(op, he)
		}
	}
	if err == nil && rec.State == proto.Failed {
		err = endErr(op, rec) // caches that cannot match: nothing moves
	}
	if err != nil {
		// Nobody was given the key: revoking it waits for nothing.
		c.e.RevokeWindow(window)
		return nil, err
	}
	c.track(r.ID)
	return &Transfer{c: c, role: role, id: r.ID, layout: r.Layout, blocks: append([]int(nil), r.Blocks...),
		instance: rec.Instance, rec: rec, cap: rec.Capability, window: window, noticeKey: rec.NoticeKey, peer: r.Peer}, nil
}

// blockRanges lists the memory of blocks in every layer of l, coalesced (a
// plan from the layout to itself).
func blockRanges(l *kvcache.Layout, blocks []int) ([]engine.Range, error) {
	p, err := kvcache.NewPlan(l, l, blocks, blocks, kvcache.LayerRange{})
	if err != nil {
		return nil, err
	}
	ts := p.Transfers()
	rs := make([]engine.Range, len(ts))
	for i, x := range ts {
		rs[i] = engine.Range{Addr: x.Dst, Length: x.Length}
	}
	return rs, nil
}

// revoke ends this side's window once: after it returns nil no access under
// it touches this side's memory. Its error is kept and returned again.
func (t *Transfer) revoke() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.revoked && t.window != 0 {
		t.revErr = t.c.e.RevokeWindow(t.window)
		if t.revErr == nil || errs.CodeOf(t.revErr) == errs.NotFound || errs.CodeOf(t.revErr) == errs.Closed {
			t.revoked, t.revErr = true, nil
		}
	}
	return t.revErr
}

// bind binds the window over this side's blocks to the engine the sidecar
// paired with this side (segment), or fails with AccessDenied when another
// engine used it first (or it was granted to another, Request.Peer): this
// side then must not report the transfer done, whatever lands. A sidecar
// that does not name the mover (segment empty, before 1.4) leaves the
// window bound to its first user alone.
func (t *Transfer) bind(op, segment string) error {
	if segment == "" {
		return nil
	}
	err := t.c.e.BindWindow(t.window, segment)
	switch errs.CodeOf(err) {
	case errs.OK, errs.NotFound: // NotFound: revoked already (aborted), nobody can use it
		return nil
	case errs.AccessDenied:
		return errs.Wrap(errs.AccessDenied, op, err, "transfer %q is paired with segment %q, but the window over this side's blocks is not that engine's", t.id, segment).
			WithHint("another engine used the window's key (it learned it), or Request.Peer named another engine; nothing it moved is reported done")
	}
	return errs.Wrap(errs.CodeOf(err), op, err, "transfer %q: binding the window over this side's blocks to segment %q", t.id, segment)
}

// fenced returns err, or the revoke's failure if that came first: a caller
// must not reuse the blocks unless the window is gone.
func (t *Transfer) fenced(err error) error {
	if rerr := t.revoke(); rerr != nil {
		return errs.Wrap(errs.CodeOf(rerr), "handoff", rerr, "transfer %q: the window over this side's blocks could not be revoked; do not reuse them", t.id)
	}
	return err
}

// ID returns the transfer's id.
func (t *Transfer) ID() string { return t.id }

// record keeps rec as the latest state; a different sidecar instance means
// the transfer is lost.
func (t *Transfer) record(op string, rec proto.Record) error {
	if rec.Instance != t.instance {
		return lost(op, t.id, "te-sidecar restarted (instance "+t.instance+" is now "+rec.Instance+")")
	}
	t.mu.Lock()
	if rec.Version >= t.rec.Version || rec.State.Terminal() {
		t.rec = rec
	}
	if rec.NoticeKey != "" {
		t.noticeKey = rec.NoticeKey
	}
	t.mu.Unlock()
	return nil
}

func (t *Transfer) last() proto.Record {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rec
}

// answer interprets a sidecar answer about this transfer.
func (t *Transfer) answer(op string, rec proto.Record, he *httpError) (proto.Record, error) {
	if he != nil {
		if he.body.Instance != "" && he.body.Instance != t.instance {
			return rec, lost(op, t.id, "te-sidecar restarted (instance "+t.instance+" is now "+he.body.Instance+")")
		}
		if he.status == http.StatusNotFound {
			return rec, lost(op, t.id, "te-sidecar no longer knows it")
		}
		if he.body.Record != nil {
			if err := t.record(op, *he.body.Record); err != nil {
				return rec, err
			}
			return *he.body.Record, refused(op, he)
		}
		return rec, refused(op, he)
	}
	return rec, t.record(op, rec)
}

// Status asks the sidecar for the transfer's state.
func (t *Transfer) Status(ctx context.Context) (Status, error) {
	q := url.Values{"id": {t.id}}
	rec, he, err := t.c.call(ctx, http.MethodGet, "/handoff/status?"+q.Encode(), nil, t.c.opts.RequestTimeout, t.cap)
	if err != nil {
		return Status{}, err
	}
	rec, err = t.answer("handoff status", rec, he)
	if err != nil {
		return Status{}, err
	}
	return statusOf(rec), nil
}

// poll long-polls the sidecar until the record changes or about two
// seconds pass.
func (t *Transfer) poll(ctx context.Context, since uint64) (proto.Record, error) {
	q := url.Values{"id": {t.id}, "role": {string(t.role)}, "since": {itoa(since)}, "timeout_ms": {"2000"}}
	rec, he, err := t.c.call(ctx, http.MethodGet, wait(q), nil, 2*time.Second+t.c.opts.RequestTimeout, t.cap)
	if err != nil {
		return rec, err
	}
	return t.answer("handoff wait", rec, he)
}

// until long-polls until ok(record) holds, the transfer is lost, or ctx
// ends. An unreachable sidecar is retried for LostGrace.
func (t *Transfer) until(ctx context.Context, op string, ok func(proto.Record) bool) (proto.Record, error) {
	var down time.Time
	for {
		rec := t.last()
		if ok(rec) {
			return rec, nil
		}
		_, err := t.poll(ctx, rec.Version)
		switch {
		case err == nil:
			down = time.Time{}
		case ctx.Err() != nil:
			return rec, errs.Wrap(errs.Canceled, op, ctx.Err(), "transfer %q", t.id)
		case errs.CodeOf(err) == errs.PeerUnreachable || errs.CodeOf(err) == errs.Timeout:
			if down.IsZero() {
				down = time.Now()
			}
			if time.Since(down) > t.c.opts.LostGrace {
				return rec, lost(op, t.id, "te-sidecar unreachable: "+err.Error())
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		case errs.CodeOf(err) == errs.TransferLost:
			return rec, err
		default:
			// A refusal that carried the record (e.g. 409) updated it above.
			if r := t.last(); ok(r) {
				return r, nil
			}
			return rec, err
		}
	}
}

// paired waits until both sides have declared.
func (t *Transfer) paired(ctx context.Context, op string) (proto.Record, error) {
	rec, err := t.until(ctx, op, func(r proto.Record) bool { return r.State != proto.Waiting })
	if err != nil {
		return rec, err
	}
	// Done is a success too: on a fast path the waiting side may first see
	// the transfer after the mover already reported it.
	if rec.State != proto.Transferring && rec.State != proto.Done {
		return rec, endErr(op, rec)
	}
	return rec, nil
}

// isMover reports whether this side moves the bytes (known once paired).
func (t *Transfer) isMover(rec proto.Record) bool {
	return rec.Mode != "" && rec.Mode.Mover() == t.role
}

// Send is Wait, named for the prefill side.
func (t *Transfer) Send(ctx context.Context) (Result, error) { return t.Wait(ctx) }

// Wait finishes the transfer on this side and returns once this side's
// memory is no longer touched for it: the moving side (prefill in push
// mode, decode in pull mode) waits for the pairing, plans, submits what
// SendLayer has not, waits for its batch and reports the outcome; the other
// side waits for the mover's completion notification (no sidecar round
// trip) or for the sidecar to report a failure, an abort or an expiry, and
// then revokes the window it granted over its blocks, so that no late byte
// of the transfer lands in (or is read from) them after Wait returns.
//
// Once the moving side has submitted, Wait returns only after its batch has
// finished (bounded by the engine's transfer timeout), whatever ctx says:
// returning earlier would let the caller free memory the engine still uses.
// When ctx ends on the waiting side, Wait returns a Canceled error and the
// transfer goes on; call Abort to end it and settle.
func (t *Transfer) Wait(ctx context.Context) (res Result, err error) {
	t.waitMu.Lock()
	defer t.waitMu.Unlock()
	defer func() {
		if !(errs.CodeOf(err) == errs.Canceled && ctx.Err() != nil) {
			t.untrack() // finished: its notices are no longer kept
		}
	}()
	t.mu.Lock()
	if t.done {
		t.mu.Unlock()
		return t.finish(ctx, nil) // the outcome another call reported
	}
	t.mu.Unlock()
	rec, err := t.paired(ctx, "handoff wait")
	if err != nil {
		if rec.State.Terminal() && !rec.Settled && t.isMover(rec) {
			// Aborted or expired after pairing, before this side moved
			// anything: its report settles the transfer for the peer.
			t.finish(ctx, err)
			return Result{ID: t.id, Mode: Mode(rec.Mode), Mover: true}, err
		}
		if errs.CodeOf(err) == errs.Canceled && !rec.State.Terminal() {
			return Result{ID: t.id, Mode: Mode(rec.Mode)}, err // ctx ended: the transfer goes on
		}
		// Failed, aborted, expired or lost, maybe while the mover still
		// moves: revoking this side's window stops it touching our blocks.
		return Result{ID: t.id, Mode: Mode(rec.Mode)}, t.fenced(err)
	}
	if t.isMover(rec) {
		return t.move(ctx, rec)
	}
	// Paired: the window goes to the mover alone, or this side learns that
	// another engine used it first and fails (revoking it cuts that engine
	// off; the mover's refused requests fail its side).
	if err := t.bind("handoff wait", rec.Mover); err != nil {
		return Result{ID: t.id, Mode: Mode(rec.Mode)}, t.fenced(err)
	}
	res, err = t.await(ctx)
	if errs.CodeOf(err) == errs.Canceled && ctx.Err() != nil {
		return res, err // ctx ended: the transfer goes on; Abort ends it
	}
	return res, t.fenced(err)
}

// setup plans the transfer and opens the peer's segment once paired.
func (t *Transfer) setup(rec proto.Record, layered bool) error {
	if t.plan != nil {
		return nil
	}
	op := "handoff"
	if rec.Peer == nil {
		return errs.New(errs.Protocol, op, "the sidecar paired transfer %q without the peer's declaration", t.id)
	}
	if t.peer != "" && rec.Peer.Segment != t.peer {
		return errs.New(errs.AccessDenied, op, "transfer %q was paired with segment %q, not %q as declared", t.id, rec.Peer.Segment, t.peer)
	}
	// This side's own window is nobody's to use in this transfer; bound
	// to the paired engine it is at least no one else's, and if another
	// engine used it first (wrote into or read these blocks), the
	// transfer fails.
	if err := t.bind(op, rec.Peer.Segment); err != nil {
		return err
	}
	var peer kvcache.Layout
	if err := json.Unmarshal(rec.Peer.Layout, &peer); err != nil {
		return errs.Wrap(errs.InvalidArgument, op, err, "the peer's layout")
	}
	src, dst, sb, db := t.layout, &peer, t.blocks, rec.Peer.Blocks
	if t.role == proto.Decode {
		src, dst, sb, db = &peer, t.layout, rec.Peer.Blocks, t.blocks
	}
	p, err := kvcache.NewPlan(src, dst, sb, db, kvcache.LayerRange{})
	if err != nil {
		return err
	}
	seg, err := t.c.e.OpenSegment(rec.Peer.Segment)
	if err != nil {
		return err
	}
	n := len(p.Transfers())
	if layered {
		n = p.Stats().Requests
	}
	b, err := t.c.e.AllocateBatch(n)
	if err != nil {
		t.c.e.CloseSegment(seg)
		return err
	}
	t.plan, t.seg, t.batch, t.layered, t.sent = p, seg, b, layered, map[int]bool{}
	t.peerWindow = rec.Peer.Window
	return nil
}

// requests turns plan transfers into the mover's requests, under the peer's
// window.
func (t *Transfer) requests(ts []kvcache.Transfer) ([]engine.Request, error) {
	rs, err := kvcache.EngineRequests(ts, t.seg, t.opcode())
	for i := range rs {
		rs[i].Window = t.peerWindow
	}
	return rs, err
}

func (t *Transfer) opcode() engine.Opcode {
	if t.role == proto.Prefill {
		return engine.Write
	}
	return engine.Read
}

// notice is the completion message the engine sends to the peer, signed
// with the transfer's notice key. Callers hold t.mu.
func (t *Transfer) notice(ok bool, bytes uint64, code errs.Code) string {
	n := proto.Notice{ID: t.id, OK: ok, Bytes: bytes, Code: int32(code)}
	n.Sign(t.noticeKey)
	b, _ := json.Marshal(n)
	return string(b)
}

// untrack ends this transfer's claim on the client's notices, once.
func (t *Transfer) untrack() {
	t.mu.Lock()
	done := t.untracked
	t.untracked = true
	t.mu.Unlock()
	if !done {
		t.c.untrack(t.id)
	}
}

// submitLayers submits the given layers; the one that completes the plan
// carries the completion notification. Callers hold t.mu.
func (t *Transfer) submitLayers(layers []int) error {
	lr := t.plan.Layers()
	total := lr.End - lr.Start
	for _, l := range layers {
		if t.aborted {
			return errs.New(errs.Canceled, "handoff send", "transfer %q was aborted", t.id)
		}
		rs, err := t.requests(t.plan.Layer(l))
		if err != nil {
			return err
		}
		if t.start.IsZero() {
			t.start = time.Now()
		}
		if len(t.sent)+1 == total {
			err = t.batch.SubmitWithNotify(t.seg.Name(), NotifyName, t.notice(true, t.plan.Stats().Bytes, 0), rs...)
		} else {
			err = t.batch.Submit(rs...)
		}
		if err != nil {
			return err
		}
		t.sent[l] = true
	}
	return nil
}

// SendLayer pushes one layer (a model-wide layer index) as soon as it is
// computed, without waiting for it to arrive, so that its transfer overlaps
// the computation of the next. Push mode, prefill side only. The first call
// waits for decode's declaration. Wait (Send) submits the layers not sent
// and waits for all of them.
func (t *Transfer) SendLayer(ctx context.Context, layer int) error {
	const op = "handoff send layer"
	if t.role != proto.Prefill {
		return errs.New(errs.InvalidArgument, op, "only prefill sends layers")
	}
	rec, err := t.paired(ctx, op)
	if err != nil {
		return err
	}
	if rec.Mode != proto.Push {
		return errs.New(errs.InvalidArgument, op, "transfer %q is in %s mode: decode reads it, prefill sends nothing", t.id, rec.Mode)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return errs.New(errs.InvalidArgument, op, "transfer %q is finished", t.id)
	}
	if err := t.setup(rec, true); err != nil {
		return err
	}
	if !t.layered {
		return errs.New(errs.InvalidArgument, op, "transfer %q is already being sent whole", t.id)
	}
	lr := t.plan.Layers()
	if layer < lr.Start || layer >= lr.End {
		return errs.New(errs.InvalidArgument, op, "layer %d outside the plan's layers [%d, %d)", layer, lr.Start, lr.End)
	}
	if t.sent[layer] {
		return errs.New(errs.InvalidArgument, op, "layer %d already sent", layer)
	}
	return t.submitLayers([]int{layer})
}

// move is Wait on the moving side.
func (t *Transfer) move(ctx context.Context, rec proto.Record) (Result, error) {
	t.mu.Lock()
	var err error
	if t.done || t.aborted {
		err = errs.New(errs.Canceled, "handoff wait", "transfer %q was aborted", t.id)
	} else {
		err = t.setup(rec, false)
	}
	if err == nil {
		if t.layered {
			var rest []int
			lr := t.plan.Layers()
			for l := lr.Start; l < lr.End; l++ {
				if !t.sent[l] {
					rest = append(rest, l)
				}
			}
			err = t.submitLayers(rest)
		} else if t.start.IsZero() {
			if t.aborted {
				err = errs.New(errs.Canceled, "handoff wait", "transfer %q was aborted", t.id)
			} else {
				var rs []engine.Request
				rs, err = t.requests(t.plan.Transfers())
				if err == nil {
					t.start = time.Now()
					err = t.batch.SubmitWithNotify(t.seg.Name(), NotifyName, t.notice(true, t.plan.Stats().Bytes, 0), rs...)
				}
			}
		}
	}
	b := t.batch
	t.mu.Unlock()
	if b != nil {
		<-b.Done() // what was submitted finishes before memory may be reused
	}
	return t.finish(ctx, err)
}

// finish reports the mover's outcome once: to the peer by notification
// when it failed (a success was notified by the batch), to the sidecar, and
// releases the batch and segment.
func (t *Transfer) finish(ctx context.Context, submitErr error) (Result, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		// Another caller is reporting (or has): its outcome is ours.
		fin := t.fin
		t.mu.Unlock()
		<-fin
		t.mu.Lock()
		return *t.result, t.err
	}
	t.done = true
	t.fin = make(chan struct{})
	defer close(t.fin)
	res := Result{ID: t.id, Mode: Mode(t.rec.Mode), Mover: true}
	var st engine.BatchStatus
	if t.batch != nil {
		st = t.batch.Status()
		if ts, err := t.batch.TaskStatus(0); err == nil {
			res.Transport = ts.Transport
		}
		res.Requests = st.Tasks
	}
	if t.plan != nil {
		res.BlockRequests = t.plan.Stats().BlockRequests
	}
	if !t.start.IsZero() {
		res.Elapsed = time.Since(t.start)
	}
	failure := submitErr
	if failure == nil && (st.Tasks == 0 || st.Failed > 0 || st.State != engine.Completed) {
		failure = st.Err
		if failure == nil {
			failure = errs.New(errs.Internal, "handoff", "batch ended %s", st.State)
		}
	}
	c := proto.Complete{ID: t.id, OK: failure == nil, Bytes: st.Transferred, Requests: res.Requests, Seconds: res.Elapsed.Seconds()}
	peer := ""
	if failure != nil {
		c.Code, c.Reason = int32(errs.CodeOf(failure)), failure.Error()
		if t.seg != nil {
			peer = t.seg.Name()
		}
	} else {
		res.Bytes = st.Transferred
	}
	if t.batch != nil {
		t.batch.Free()
		t.batch = nil
	}
	if t.seg != nil {
		t.c.e.CloseSegment(t.seg)
		t.seg = nil
	}
	// The report must reach the sidecar even when the caller's ctx has
	// ended: it is what settles the transfer for the peer.
	rctx := context.WithoutCancel(ctx)
	var failNotice string
	if peer != "" {
		failNotice = t.notice(false, st.Transferred, errs.CodeOf(failure))
	}
	t.mu.Unlock()
	// This side's own window was never handed to anyone (the sidecar gives
	// a declaration's window to the mover only): dropping it is immediate.
	t.revoke()
	if peer != "" {
		// Best effort: the sidecar tells the peer too.
		t.c.e.SendNotify(peer, NotifyName, failNotice)
	}
	rec, he, err := t.c.call(rctx, http.MethodPost, "/handoff/complete", c, t.c.opts.RequestTimeout, t.cap)
	if err == nil {
		rec, err = t.answer("handoff complete", rec, he)
	}
	t.mu.Lock()
	switch {
	case rec.State == proto.Aborted || rec.State == proto.Expired:
		// The peer gave up (and revoked its window, so this side's
		// requests were refused): that, not the refusal, is the outcome.
		t.err = endErr("handoff complete", rec)
	case failure != nil:
		t.err = failure
	case err == nil:
		res.Recorded = true
	case errs.CodeOf(err) == errs.TransferLost || errs.CodeOf(err) == errs.PeerUnreachable:
		// Every byte moved and the peer was notified; only the record is
		// gone.
	case rec.State.Terminal() && rec.State != proto.Done:
		t.err = endErr("handoff complete", rec)
	default:
		t.err = err
	}
	t.result = &res
	return res, t.err
}

// await is Wait on the side that does not move the bytes.
func (t *Transfer) await(ctx context.Context) (Result, error) {
	const op = "handoff wait"
	start := time.Now()
	res := Result{ID: t.id, Mode: Mode(t.last().Mode)}
	pctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	type update struct {
		rec proto.Record
		err error
	}
	updates := make(chan update, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		rec, err := t.until(pctx, op, func(r proto.Record) bool { return r.State == proto.Done || r.State.Terminal() && r.Settled })
		select {
		case updates <- update{rec, err}:
		case <-pctx.Done():
		}
	}()
	defer func() { cancel(); wg.Wait() }()

	interval := 20 * time.Microsecond
	timer := time.NewTimer(interval)
	defer timer.Stop()
	var lostAt time.Time
	var lostErr error
	for {
		t.mu.Lock()
		key := t.noticeKey
		t.mu.Unlock()
		if n, ok := t.c.notice(t.id, key); ok {
			res.Elapsed = time.Since(start)
			res.Bytes = n.Bytes
			if n.OK {
				res.Recorded = true
				return res, nil
			}
			return res, errs.New(errs.Code(n.Code), op, "the moving side reported transfer %q failed", t.id)
		}
		if !lostAt.IsZero() && time.Since(lostAt) > t.c.opts.LostGrace {
			return res, lostErr
		}
		select {
		case u := <-updates:
			if u.err != nil {
				if errs.CodeOf(u.err) == errs.TransferLost && u.rec.State == proto.Transferring {
					// The mover may still be moving: give its notification
					// a chance before calling the transfer lost.
					lostAt, lostErr = time.Now(), u.err
					continue
				}
				if ctx.Err() != nil {
					return res, errs.Wrap(errs.Canceled, op, ctx.Err(), "transfer %q still running; Abort ends it", t.id)
				}
				return res, u.err
			}
			res.Elapsed = time.Since(start)
			if u.rec.State == proto.Done {
				res.Bytes, res.Requests, res.Recorded = u.rec.Bytes, u.rec.Requests, true
				return res, nil
			}
			return res, endErr(op, u.rec)
		case <-timer.C:
			interval = min(2*interval, t.c.opts.PollInterval)
			timer.Reset(interval)
		case <-ctx.Done():
			return res, errs.Wrap(errs.Canceled, op, ctx.Err(), "transfer %q still running; Abort ends it", t.id)
		}
	}
}

// Abort gives the transfer up and returns once this side's memory is no
// longer touched for it: on the moving side once its requests were canceled
// and ended, on the other side once the window over its blocks is revoked
// (what the mover still sends is refused; it need not have stopped). The
// peer learns it from the sidecar. Aborting a finished transfer is an
// InvalidArgument error.
func (t *Transfer) Abort(ctx context.Context, reason string) error {
	const op = "handoff abort"
	a := proto.Abort{ID: t.id, Role: t.role, Reason: reason}
	rec, he, err := t.c.call(ctx, http.MethodPost, "/handoff/abort", a, t.c.opts.RequestTimeout, t.cap)
	if err != nil {
		return err
	}
	rec, err = t.answer(op, rec, he)
	if err != nil {
		if !rec.State.Terminal() {
			return err
		}
		if rec.State == proto.Done {
			return errs.New(errs.InvalidArgument, op, "transfer %q already done", t.id)
		}
		// Already failed, aborted or expired: settle below like a fresh abort.
	}
	t.mu.Lock()
	t.aborted = true
	b := t.batch
	t.mu.Unlock()
	t.untrack()
	if t.isMover(rec) && !rec.Settled {
		// This side moves: its requests are canceled and end once the
		// engine let go of them, then its report settles the transfer.
		if b != nil {
			b.Cancel()
			<-b.Done()
		}
		t.finish(ctx, errs.New(errs.Canceled, op, "transfer %q aborted by %s: %s", t.id, t.role, reason))
		return nil
	}
	// This side's window ends: whatever the mover still sends under it is
	// refused, and nothing it sent lands after this returns.
	return t.fenced(nil)
}
