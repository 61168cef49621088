package rendezvous

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
	"unicode"

	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/kvcache"
)

// Config bounds the rendezvous. The zero value takes the defaults below.
type Config struct {
	// DefaultTimeout applies to a declaration without timeout_ms (30s).
	DefaultTimeout time.Duration
	// MaxTimeout is the largest timeout_ms accepted (10m).
	MaxTimeout time.Duration
	// SettleGrace is how long the sidecar waits, after a transfer was
	// aborted or expired while the mover was moving, for the mover to report
	// that it stopped, before it calls the transfer settled anyway (40s: an
	// engine's default transfer timeout of 30s plus margin). Until then the
	// other side must not reuse its blocks.
	SettleGrace time.Duration
	// Retain is how long a finished transfer stays queryable (2m).
	Retain time.Duration
	// MaxTransfers bounds the transfers held, finished ones included
	// (65536); a declaration beyond it is refused with 503.
	MaxTransfers int
	// MaxWait caps a long poll's timeout_ms (30s).
	MaxWait time.Duration
	// MaxBlocks bounds the block list of one declaration (1<<20).
	MaxBlocks int
}

func (c *Config) fill() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.DefaultTimeout, 30*time.Second)
	def(&c.MaxTimeout, 10*time.Minute)
	def(&c.SettleGrace, 40*time.Second)
	def(&c.Retain, 2*time.Minute)
	def(&c.MaxWait, 30*time.Second)
	if c.MaxTransfers <= 0 {
		c.MaxTransfers = 1 << 16
	}
	if c.MaxBlocks <= 0 {
		c.MaxBlocks = 1 << 20
	}
}

// MaxIDLen bounds a transfer id.
const MaxIDLen = 256

// Table is the rendezvous: the transfers the sidecar holds and their state
// machine, independent of HTTP. Safe for concurrent use.
type Table struct {
	cfg      Config
	instance string
	m        *metricSet

	mu     sync.Mutex
	recs   map[string]*rec
	closed bool
}

type rec struct {
	id        string
	mode      Mode
	decl      [2]*Decl // by side: decode, prefill
	state     State
	version   uint64
	bytes     uint64
	code      errs.Code
	reason    string
	abortBy   Role
	settled   bool
	reqs      int
	settledAt time.Time // retention counts from here

	created, paired, ended time.Time
	deadline               time.Time
	timer                  *time.Timer
	changed                chan struct{} // closed and replaced on every change
}

func side(r Role) int {
	if r == Prefill {
		return 1
	}
	return 0
}

// NewTable returns an empty table; reg (may be nil) receives its metrics.
func NewTable(cfg Config, reg Registry) *Table {
	cfg.fill()
	var inst [8]byte
	rand.Read(inst[:])
	return &Table{cfg: cfg, instance: hex.EncodeToString(inst[:]), m: newMetricSet(reg), recs: map[string]*rec{}}
}

// Instance returns the random identity of this table (of this sidecar
// start).
func (t *Table) Instance() string { return t.instance }

// Close stops every timer; the table answers nothing afterwards.
func (t *Table) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for _, r := range t.recs {
		if r.timer != nil {
			r.timer.Stop()
		}
		close(r.changed)
		r.changed = make(chan struct{})
	}
}

// Refusal is a refused request: the HTTP status, the stable code, a
// message, and the transfer's record when the request conflicted with its
// state (409).
type Refusal struct {
	Status int
	Code   errs.Code
	Msg    string
	Record *Record
	kind   string // metrics label when it is not implied by status and code
}

func (e *Refusal) Error() string { return e.Msg }

func refuse(status int, code errs.Code, format string, args ...any) *Refusal {
	return &Refusal{Status: status, Code: code, Msg: fmt.Sprintf(format, args...)}
}

func checkID(id string) *Refusal {
	if id == "" || len(id) > MaxIDLen {
		return refuse(http.StatusBadRequest, errs.InvalidArgument, "id must be 1..%d bytes", MaxIDLen)
	}
	for _, c := range id {
		if !unicode.IsPrint(c) {
			return refuse(http.StatusBadRequest, errs.InvalidArgument, "id %q has a non-printable character", id)
		}
	}
	return nil
}

// checkDecl validates one side's declaration on its own and returns its
// parsed layout.
func (t *Table) checkDecl(role Role, d *Decl) (*kvcache.Layout, *Refusal) {
	if e := checkID(d.ID); e != nil {
		return nil, e
	}
	bad := func(format string, args ...any) (*kvcache.Layout, *Refusal) {
		return nil, refuse(http.StatusBadRequest, errs.InvalidArgument, "%s declaration of %q: "+format, append([]any{role, d.ID}, args...)...)
	}
	if d.Segment == "" || len(d.Segment) > 1024 {
		return bad("segment must be 1..1024 bytes")
	}
	switch d.Mode {
	case "", Push, Pull:
	default:
		return bad("mode %q is neither push nor pull", d.Mode)
	}
	if d.TimeoutMS < 0 || d.TimeoutMS > t.cfg.MaxTimeout.Milliseconds() {
		return bad("timeout_ms %d outside 0..%d", d.TimeoutMS, t.cfg.MaxTimeout.Milliseconds())
	}
	if len(d.Layout) == 0 {
		return bad("no layout")
	}
	var l kvcache.Layout
	if err := json.Unmarshal(d.Layout, &l); err != nil {
		return bad("layout: %v", err)
	}
	if err := l.Validate(); err != nil {
		return bad("layout: %v", err)
	}
	if len(d.Blocks) == 0 || len(d.Blocks) > t.cfg.MaxBlocks {
		return bad("%d block ids, want 1..%d", len(d.Blocks), t.cfg.MaxBlocks)
	}
	for i, b := range d.Blocks {
		if b < 0 || b >= l.NumBlocks {
			return bad("block id %d (index %d) outside 0..%d", b, i, l.NumBlocks-1)
		}
	}
	if role == Decode {
		s := slices.Clone(d.Blocks)
		slices.Sort(s)
		for i := 1; i < len(s); i++ {
			if s[i] == s[i-1] {
				return bad("destination block id %d appears twice", s[i])
			}
		}
	}
	return &l, nil
}

// Declare records one side's declaration; the second one pairs the transfer
// and starts it.
func (t *Table) Declare(role Role, d Decl) (Record, *Refusal) {
	if role != Prefill && role != Decode {
		return Record{}, refuse(http.StatusBadRequest, errs.InvalidArgument, "role %q is neither prefill nor decode", role)
	}
	if _, e := t.checkDecl(role, &d); e != nil {
		t.m.rejected(e)
		return Record{}, e
	}
	timeout := t.cfg.DefaultTimeout
	if d.TimeoutMS > 0 {
		timeout = time.Duration(d.TimeoutMS) * time.Millisecond
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return Record{}, refuse(http.StatusServiceUnavailable, errs.Closed, "sidecar shutting down")
	}
	r := t.recs[d.ID]
	if r == nil {
		if len(t.recs) >= t.cfg.MaxTransfers {
			e := refuse(http.StatusServiceUnavailable, errs.NoMemory, "sidecar holds %d transfers, its limit", len(t.recs))
			t.m.rejected(e)
			return Record{}, e
		}
		r = &rec{id: d.ID, state: Waiting, created: now, deadline: now.Add(timeout), changed: make(chan struct{}), mode: d.Mode}
		r.decl[side(role)] = &d
		t.recs[d.ID] = r
		t.m.enter(Waiting)
		t.bump(r)
		return r.record(t, role, now), nil
	}
	if r.decl[side(role)] != nil {
		e := refuse(http.StatusConflict, errs.InvalidArgument, "%s already declared transfer %q", role, d.ID)
		rr := r.record(t, role, now)
		e.Record = &rr
		t.m.rejected(e)
		return Record{}, e
	}
	if r.state.Terminal() {
		e := refuse(http.StatusConflict, codeOf(r.state), "transfer %q is already %s: %s", d.ID, r.state, r.reason)
		rr := r.record(t, role, now)
		e.Record = &rr
		t.m.rejected(e)
		return Record{}, e
	}
	// Pairing: decode's mode wins; a prefill that named another mode is
	// refused rather than silently moved the other way.
	mode := r.mode
	if role == Decode {
		if mode != "" && d.Mode != "" && mode != d.Mode {
			return Record{}, t.modeConflict(r, role, d.Mode, now)
		}
		if d.Mode != "" {
			mode = d.Mode
		}
	} else if d.Mode != "" && mode != "" && d.Mode != mode {
		return Record{}, t.modeConflict(r, role, d.Mode, now)
	}
	if mode == "" {
		mode = Push
	}
	r.mode = mode
	r.decl[side(role)] = &d
	r.paired = now
	if dl := now.Add(timeout); dl.After(r.deadline) {
		r.deadline = dl
	}
	t.m.paired(now.Sub(r.created))
	if err := compatible(r.decl[1], r.decl[0]); err != nil {
		t.end(r, Failed, errs.CodeOf(err), "prefill and decode caches do not match: "+err.Error(), now)
		r.settle(now) // nothing moved
	} else {
		t.move(r, Transferring)
	}
	t.bump(r)
	return r.record(t, role, now), nil
}

func (t *Table) modeConflict(r *rec, role Role, m Mode, now time.Time) *Refusal {
	e := refuse(http.StatusConflict, errs.InvalidArgument, "%s asks for %s mode but transfer %q is %s", role, m, r.id, r.mode)
	rr := r.record(t, role, now)
	e.Record, e.kind = &rr, "conflict"
	t.m.rejected(e)
	return e
}

// compatible checks that a plan can be made from the two declarations,
// cheaply: one block pair over every layer, plus the list lengths.
func compatible(src, dst *Decl) error {
	var sl, dl kvcache.Layout
	if err := json.Unmarshal(src.Layout, &sl); err != nil {
		return err
	}
	if err := json.Unmarshal(dst.Layout, &dl); err != nil {
		return err
	}
	if len(src.Blocks) != len(dst.Blocks) {
		return errs.New(errs.InvalidArgument, "handoff", "prefill declared %d blocks, decode %d", len(src.Blocks), len(dst.Blocks))
	}
	_, err := kvcache.NewPlan(&sl, &dl, src.Blocks[:1], dst.Blocks[:1], kvcache.LayerRange{})
	return err
}

// Complete records the mover's outcome.
func (t *Table) Complete(c Complete) (Record, *Refusal) {
	if e := checkID(c.ID); e != nil {
		return Record{}, e
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	r, e := t.lookup(c.ID)
	if e != nil {
		return Record{}, e
	}
	conflict := func(format string, args ...any) (Record, *Refusal) {
		e := refuse(http.StatusConflict, codeOf(r.state), format, args...)
		rr := r.record(t, r.mode.Mover(), now)
		e.Record = &rr
		t.m.rejected(e)
		return Record{}, e
	}
	switch {
	case r.state == Waiting:
		return conflict("transfer %q is not paired yet: nothing to complete", c.ID)
	case r.state == Transferring:
		r.bytes, r.reqs = c.Bytes, c.Requests
		if c.OK {
			t.end(r, Done, errs.OK, "", now)
			t.m.completed(r.mode, c)
		} else {
			code := errs.Code(c.Code)
			if code == errs.OK {
				code = errs.Internal
			}
			t.end(r, Failed, code, "mover: "+c.Reason, now)
		}
		r.settle(now)
		t.bump(r)
		return r.record(t, r.mode.Mover(), now), nil
	case !r.settled:
		// Aborted or expired while the mover was moving: it has stopped now.
		r.bytes = c.Bytes
		r.settle(now)
		t.bump(r)
		return conflict("transfer %q was %s before it completed: %s", c.ID, r.state, r.reason)
	}
	return conflict("transfer %q already %s", c.ID, r.state)
}

// Abort ends a transfer that is not finished yet.
func (t *Table) Abort(a Abort) (Record, *Refusal) {
	if e := checkID(a.ID); e != nil {
		return Record{}, e
	}
	switch a.Role {
	case "", Prefill, Decode:
	default:
		return Record{}, refuse(http.StatusBadRequest, errs.InvalidArgument, "role %q is neither prefill nor decode", a.Role)
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	r, e := t.lookup(a.ID)
	if e != nil {
		return Record{}, e
	}
	if r.state.Terminal() {
		e := refuse(http.StatusConflict, codeOf(r.state), "transfer %q already %s", a.ID, r.state)
		rr := r.record(t, a.Role, now)
		e.Record = &rr
		t.m.rejected(e)
		return Record{}, e
	}
	by := a.Role
	if by == "" {
		by = "client"
	}
	reason := "aborted by " + string(by)
	if a.Reason != "" {
		reason += ": " + a.Reason
	}
	r.abortBy = a.Role
	// Before pairing nobody moves anything; after it the mover may be in
	// the middle of a batch and settles when it reports.
	if r.state == Waiting {
		r.settle(now)
	}
	t.end(r, Aborted, errs.Canceled, reason, now)
	t.bump(r)
	return r.record(t, a.Role, now), nil
}

// Status returns a transfer's record; role (may be empty) decides whether
// the peer's declaration is included.
func (t *Table) Status(id string, role Role) (Record, *Refusal) {
	if e := checkID(id); e != nil {
		return Record{}, e
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r, e := t.lookup(id)
	if e != nil {
		return Record{}, e
	}
	return r.record(t, role, time.Now()), nil
}

// Wait returns once the transfer's version exceeds since, the timeout
// passes or stop is closed, with the record as it is then.
func (t *Table) Wait(id string, role Role, since uint64, timeout time.Duration, stop <-chan struct{}) (Record, *Refusal) {
	if e := checkID(id); e != nil {
		return Record{}, e
	}
	timeout = min(timeout, t.cfg.MaxWait)
	var timer *time.Timer
	for {
		t.mu.Lock()
		r, e := t.lookup(id)
		if e != nil || r.version > since || t.closed {
			t.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			if e != nil {
				return Record{}, e
			}
			return t.Status(id, role)
		}
		ch := r.changed
		t.mu.Unlock()
		if timer == nil {
			if timeout <= 0 {
				return t.Status(id, role)
			}
			timer = time.NewTimer(timeout)
		}
		select {
		case <-ch:
		case <-timer.C:
			return t.Status(id, role)
		case <-stop:
			timer.Stop()
			return t.Status(id, role)
		}
	}
}

func (t *Table) lookup(id string) (*rec, *Refusal) {
	if t.closed {
		return nil, refuse(http.StatusServiceUnavailable, errs.Closed, "sidecar shutting down")
	}
	r := t.recs[id]
	if r == nil {
		e := refuse(http.StatusNotFound, errs.NotFound, "no transfer %q on sidecar instance %s", id, t.instance)
		t.m.rejected(e)
		return nil, e
	}
	return r, nil
}

// move changes a live transfer's state.
func (t *Table) move(r *rec, s State) {
	t.m.leave(r.state)
	r.state = s
	t.m.enter(s)
}

// end moves r to a terminal state.
func (t *Table) end(r *rec, s State, code errs.Code, reason string, now time.Time) {
	from := r.state
	t.move(r, s)
	r.code, r.reason, r.ended = code, reason, now
	t.m.ended(r, from)
}

// bump publishes a change: waiters wake, the timer is re-armed.
func (t *Table) bump(r *rec) {
	r.version++
	close(r.changed)
	r.changed = make(chan struct{})
	t.arm(r)
}

// arm sets r's timer to its next event: expiry while live, the settle
// deadline while the mover may still run, removal once settled.
func (t *Table) arm(r *rec) {
	var at time.Time
	switch {
	case !r.state.Terminal():
		at = r.deadline
	case !r.settled:
		at = r.ended.Add(t.cfg.SettleGrace)
	default:
		at = r.settledAt.Add(t.cfg.Retain)
	}
	d := time.Until(at)
	if r.timer == nil {
		r.timer = time.AfterFunc(d, func() { t.fire(r) })
		return
	}
	r.timer.Reset(d)
}

func (t *Table) fire(r *rec) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.recs[r.id] != r {
		return
	}
	now := time.Now()
	switch {
	case !r.state.Terminal():
		if now.Before(r.deadline) {
			t.arm(r)
			return
		}
		if r.state == Waiting {
			missing := "prefill"
			if r.decl[0] == nil {
				missing = "decode"
			}
			r.settle(now)
			t.end(r, Expired, errs.Timeout, "expired: "+missing+" never declared", now)
		} else {
			t.end(r, Expired, errs.Timeout, "expired: the mover did not complete in time", now)
		}
		t.bump(r)
	case !r.settled:
		if now.Before(r.ended.Add(t.cfg.SettleGrace)) {
			t.arm(r)
			return
		}
		r.settle(now)
		r.reason += " (the mover never reported; settled after the grace period)"
		t.bump(r)
	default:
		if now.Before(r.settledAt.Add(t.cfg.Retain)) {
			t.arm(r)
			return
		}
		delete(t.recs, r.id)
		t.m.leave(r.state)
		close(r.changed)
	}
}

// record renders r for a caller in role.
func (r *rec) record(t *Table, role Role, now time.Time) Record {
	out := Record{
		Instance: t.instance, ID: r.id, State: r.state, Mode: r.mode, Version: r.version,
		Expect: r.decl[0] != nil, Ready: r.decl[1] != nil, Bytes: r.bytes, Code: int32(r.code),
		Reason: r.reason, AbortBy: r.abortBy, Settled: r.settled, Requests: r.reqs,
	}
	if !r.state.Terminal() {
		out.ExpiresInMS = max(1, r.deadline.Sub(now).Milliseconds())
	}
	if r.state == Transferring && role != "" && role == r.mode.Mover() {
		o := r.decl[1-side(role)]
		out.Peer = &Peer{Segment: o.Segment, Layout: o.Layout, Blocks: o.Blocks}
	}
	return out
}

func (r *rec) settle(now time.Time) {
	r.settled, r.settledAt = true, now
}
