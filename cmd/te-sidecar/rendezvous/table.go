package rendezvous

import (
	"github.com/tecache/te/kvcache/handoff/proto"

	"container/list"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
	"unicode"

	"github.com/tecache/te/cmd/te-sidecar/api"
	"github.com/tecache/te/internal/errs"
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
	// Retain is how long a finished transfer stays queryable (2m). When the
	// table is full the oldest finished transfers go first.
	Retain time.Duration
	// MaxTransfers bounds the transfers held, finished ones included
	// (65536).
	MaxTransfers int
	// MaxWait caps a long poll's timeout_ms (30s).
	MaxWait time.Duration
	// MaxBlocks bounds the block list of one declaration (1<<20).
	MaxBlocks int
	// MaxBody bounds the body of one request (4 MiB); a larger one is
	// refused with 413.
	MaxBody int
	// MaxBytes bounds the memory held by the declarations of live
	// transfers, as estimated by Cost (128 MiB).
	MaxBytes int64
	// ClientTransfers bounds the unpaired transfers one client may hold
	// (4096): past it that client is refused with 429 until its transfers
	// pair or end.
	ClientTransfers int
	// ClientBytes bounds the declaration bytes of one client's live
	// transfers (32 MiB); past it, 429.
	ClientBytes int64
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
	if c.MaxBody <= 0 {
		c.MaxBody = DefaultMaxBody
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = 128 << 20
	}
	if c.ClientTransfers <= 0 {
		c.ClientTransfers = 4096
	}
	if c.ClientBytes <= 0 {
		c.ClientBytes = 32 << 20
	}
}

// DefaultMaxBody is Config.MaxBody's default.
const DefaultMaxBody = 4 << 20

// MaxIDLen bounds a transfer id.
const MaxIDLen = 256

// Cost estimates the memory a declaration holds while its transfer lives:
// the table keeps its layout, segment and block list (8 bytes per block id)
// plus a fixed overhead.
func Cost(d *proto.Decl) int64 {
	return int64(len(d.ID)+len(d.Segment)+len(d.Layout)) + 8*int64(len(d.Blocks)) + 512
}

// Table is the rendezvous: the transfers the sidecar holds and their state
// machine, independent of HTTP. Safe for concurrent use.
type Table struct {
	cfg      Config
	instance string
	m        *metricSet

	mu       sync.Mutex
	recs     map[string]*rec
	clients  map[string]*usage
	bytes    int64      // Cost of the declarations of live transfers
	finished *list.List // settled terminal records, oldest first
	polls    int        // long polls waiting
	closed   bool
}

// usage is what one client holds.
type usage struct {
	waiting *list.List // unpaired transfers it created, oldest first
	bytes   int64      // Cost of its declarations of live transfers
}

type rec struct {
	id   string
	mode proto.Mode
	decl [2]*proto.Decl // by side: decode, prefill
	caps [2]string      // capability of each side that declared
	// noticeKey is minted at pairing and given to both sides (and no one
	// else): the mover's completion notice carries an HMAC under it, so
	// the waiting side counts only the paired mover's word.
	noticeKey string
	// mover is the moving side's segment, kept from pairing on (the
	// declarations go once the transfer ends): the other side binds its
	// window to it, and learns it even if it first looks once all is over.
	mover     string
	client    [2]string // the client that declared each side
	creator   string    // the client whose declaration created it
	cost      [2]int64  // Cost of each declaration while held
	state     proto.State
	version   uint64
	bytes     uint64
	code      errs.Code
	reason    string
	abortBy   proto.Role
	settled   bool
	reqs      int
	settledAt time.Time // retention counts from here

	created, paired, ended time.Time
	deadline               time.Time
	timer                  *time.Timer
	changed                chan struct{} // closed and replaced on every change
	waitElem               *list.Element // in the creator's waiting list while waiting
	doneElem               *list.Element // in Table.finished once settled and terminal
}

func side(r proto.Role) int {
	if r == proto.Prefill {
		return 1
	}
	return 0
}

func roleOf(side int) proto.Role {
	if side == 1 {
		return proto.Prefill
	}
	return proto.Decode
}

// NewTable returns an empty table; reg (may be nil) receives its metrics.
func NewTable(cfg Config, reg Registry) *Table {
	cfg.fill()
	var inst [8]byte
	rand.Read(inst[:])
	t := &Table{cfg: cfg, instance: hex.EncodeToString(inst[:]), recs: map[string]*rec{},
		clients: map[string]*usage{}, finished: list.New()}
	t.m = newMetricSet(reg, t)
	return t
}

// Instance returns the random identity of this table (of this sidecar
// start).
func (t *Table) Instance() string { return t.instance }

// Usage is what a table holds now.
type Usage struct {
	Transfers int   // records, finished ones included
	Bytes     int64 // Cost of the declarations of live transfers
	Clients   int   // clients holding live declarations
	LongPolls int   // long polls waiting
}

// Usage returns what the table holds now.
func (t *Table) Usage() Usage {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Usage{Transfers: len(t.recs), Bytes: t.bytes, Clients: len(t.clients), LongPolls: t.polls}
}

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
	Record *proto.Record
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
func (t *Table) checkDecl(role proto.Role, d *proto.Decl) (*kvcache.Layout, *Refusal) {
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
	case "", proto.Push, proto.Pull:
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
	if err := api.Decode(d.Layout, &l); err != nil {
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
	if role == proto.Decode {
		s := slices.Clone(d.Blocks)
		slices.Sort(s)
		for i := 1; i < len(s); i++ {
			if s[i] == s[i-1] {
				return bad("destination block id %d appears twice", s[i])
			}
		}
	}
	if d.Window == 0 {
		// Without a window the mover would present the buffers' keys:
		// whoever paired first could aim it anywhere in the segment, and
		// the side could not fence the transfer's access alone.
		return bad("no window: a declaration carries the key of the engine window the side granted over its blocks (engine.GrantWindow)")
	}
	return &l, nil
}

func newCapability() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Declare records one side's declaration; client names the declarer for
// its quotas. The second declaration pairs the transfer and starts it. The record
// returned carries the declaring side's capability, which the side's later
// requests about the transfer must present.
func (t *Table) Declare(role proto.Role, d proto.Decl, client string) (proto.Record, *Refusal) {
	if role != proto.Prefill && role != proto.Decode {
		return proto.Record{}, refuse(http.StatusBadRequest, errs.InvalidArgument, "role %q is neither prefill nor decode", role)
	}
	if _, e := t.checkDecl(role, &d); e != nil {
		t.m.rejected(e)
		return proto.Record{}, e
	}
	timeout := t.cfg.DefaultTimeout
	if d.TimeoutMS > 0 {
		timeout = time.Duration(d.TimeoutMS) * time.Millisecond
	}
	if cap(d.Blocks) > len(d.Blocks)+len(d.Blocks)/8 {
		// JSON decoding grew the list by doubling: keep what it holds.
		d.Blocks = slices.Clone(d.Blocks)
	}
	cost := Cost(&d)
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return proto.Record{}, refuse(http.StatusServiceUnavailable, errs.Closed, "sidecar shutting down")
	}
	r := t.recs[d.ID]
	if r != nil {
		// Conflicts are answered without either side's declaration or
		// capability: the caller has proved nothing about this transfer.
		conflict := func(e *Refusal) (proto.Record, *Refusal) {
			rr := r.record(t, "", now)
			e.Record = &rr
			t.m.rejected(e)
			return proto.Record{}, e
		}
		if r.decl[side(role)] != nil || r.caps[side(role)] != "" {
			return conflict(refuse(http.StatusConflict, errs.InvalidArgument, "%s already declared transfer %q", role, d.ID))
		}
		if r.state.Terminal() {
			return conflict(refuse(http.StatusConflict, r.state.Code(), "transfer %q is already %s: %s", d.ID, r.state, r.reason))
		}
	}
	// Pairing: decode's mode wins; a prefill that named another mode is
	// refused rather than silently moved the other way.
	var mode proto.Mode
	if r != nil {
		mode = r.mode
		if role == proto.Decode {
			if mode != "" && d.Mode != "" && mode != d.Mode {
				return proto.Record{}, t.modeConflict(r, role, d.Mode, now)
			}
			if d.Mode != "" {
				mode = d.Mode
			}
		} else if d.Mode != "" && mode != "" && d.Mode != mode {
			return proto.Record{}, t.modeConflict(r, role, d.Mode, now)
		}
		if mode == "" {
			mode = proto.Push
		}
	}
	if e := t.admit(client, cost, r, now); e != nil {
		t.m.rejected(e)
		return proto.Record{}, e
	}
	if r == nil {
		r = &rec{id: d.ID, state: proto.Waiting, created: now, deadline: now.Add(timeout), changed: make(chan struct{}), mode: d.Mode,
			creator: client}
		t.hold(r, role, &d, client, cost)
		t.recs[d.ID] = r
		r.waitElem = t.use(client).waiting.PushBack(r)
		t.m.enter(proto.Waiting)
		t.bump(r)
		return r.declared(t, role, now), nil
	}
	r.mode = mode
	t.hold(r, role, &d, client, cost)
	t.unwait(r)
	r.paired = now
	r.noticeKey = newCapability()
	if d := r.decl[side(mode.Mover())]; d != nil {
		r.mover = d.Segment
	}
	if dl := now.Add(timeout); dl.After(r.deadline) {
		r.deadline = dl
	}
	t.m.paired(now.Sub(r.created))
	if err := compatible(r.decl[1], r.decl[0]); err != nil {
		t.end(r, proto.Failed, errs.CodeOf(err), "prefill and decode caches do not match: "+err.Error(), now)
		t.settle(r, now) // nothing moved
	} else {
		t.move(r, proto.Transferring)
	}
	t.bump(r)
	return r.declared(t, role, now), nil
}

// hold records a side's declaration and charges its cost to client.
func (t *Table) hold(r *rec, role proto.Role, d *proto.Decl, client string, cost int64) {
	s := side(role)
	r.decl[s], r.caps[s], r.client[s], r.cost[s] = d, newCapability(), client, cost
	t.use(client).bytes += cost
	t.bytes += cost
}

func (t *Table) use(client string) *usage {
	u := t.clients[client]
	if u == nil {
		u = &usage{waiting: list.New()}
		t.clients[client] = u
	}
	return u
}

// forget drops client's entry once it holds nothing.
func (t *Table) forget(client string) {
	if u := t.clients[client]; u != nil && u.bytes == 0 && u.waiting.Len() == 0 {
		delete(t.clients, client)
	}
}

// unwait takes r off its creator's list of unpaired transfers.
func (t *Table) unwait(r *rec) {
	if r.waitElem == nil {
		return
	}
	if u := t.clients[r.creator]; u != nil {
		u.waiting.Remove(r.waitElem)
		t.forget(r.creator)
	}
	r.waitElem = nil
}

// release returns r's declarations' memory: a finished transfer needs no
// layouts or block lists any more.
func (t *Table) release(r *rec) {
	t.unwait(r)
	for s := range 2 {
		if r.cost[s] == 0 {
			continue
		}
		if u := t.clients[r.client[s]]; u != nil {
			u.bytes -= r.cost[s]
			t.forget(r.client[s])
		}
		t.bytes -= r.cost[s]
		r.cost[s] = 0
		r.decl[s] = nil
	}
}

// admit checks client's quota and the table's totals for a declaration of
// cost, which creates a transfer or pairs pairing (never evicted to make
// room for itself), making room when a client over its share holds what is
// needed. Callers hold t.mu.
func (t *Table) admit(client string, cost int64, pairing *rec, now time.Time) *Refusal {
	fresh := pairing == nil
	var waiting int
	var held int64
	if u := t.clients[client]; u != nil {
		waiting, held = u.waiting.Len(), u.bytes
	}
	if fresh && waiting >= t.cfg.ClientTransfers {
		e := refuse(http.StatusTooManyRequests, errs.ResourceExhausted,
			"client %s holds %d unpaired transfers, its limit: they must pair, end or expire first", client, waiting)
		e.kind = "client_quota"
		return e
	}
	if held+cost > t.cfg.ClientBytes {
		e := refuse(http.StatusTooManyRequests, errs.ResourceExhausted,
			"client %s would hold %d bytes of declarations, over its limit of %d", client, held+cost, t.cfg.ClientBytes)
		e.kind = "client_quota"
		return e
	}
	if fresh {
		waiting++
	}
	for {
		byCount := fresh && len(t.recs) >= t.cfg.MaxTransfers
		byBytes := t.bytes+cost > t.cfg.MaxBytes
		if !byCount && !byBytes {
			return nil
		}
		if byCount && t.finished.Len() > 0 {
			// Finished transfers are kept for late queries only.
			t.drop(t.finished.Front().Value.(*rec))
			continue
		}
		if !t.evict(client, byBytes, waiting, held+cost, pairing, now) {
			e := refuse(http.StatusServiceUnavailable, errs.ResourceExhausted,
				"sidecar holds %d transfers and %d bytes of declarations, its limits are %d and %d",
				len(t.recs), t.bytes, t.cfg.MaxTransfers, t.cfg.MaxBytes)
			e.kind = "full"
			return e
		}
	}
}

// evict expires the oldest unpaired transfer of the heaviest client (the
// one holding the most unpaired transfers, or with byBytes the most bytes
// of declarations) when that client holds more than the requester would
// (waiting transfers, held bytes): declarations that never pair cannot
// lock the others out, and nobody loses a transfer to a heavier requester.
// Paired transfers are never evicted, nor keep, the one being paired.
// Nothing moves for an unpaired transfer, so it is settled at once.
func (t *Table) evict(requester string, byBytes bool, waiting int, held int64, keep *rec, now time.Time) bool {
	weight := func(u *usage) int64 {
		if byBytes {
			return u.bytes
		}
		return int64(u.waiting.Len())
	}
	var victim string
	var vu *usage
	var r *rec
	for c, u := range t.clients {
		if c == requester || u.waiting.Len() == 0 || (vu != nil && weight(u) <= weight(vu)) {
			continue
		}
		// Its oldest unpaired transfer, but never the one being paired.
		e := u.waiting.Front()
		if e.Value.(*rec) == keep {
			e = e.Next()
		}
		if e != nil {
			victim, vu, r = c, u, e.Value.(*rec)
		}
	}
	mine := int64(waiting)
	if byBytes {
		mine = held
	}
	if vu == nil || weight(vu) <= mine {
		return false
	}
	n := vu.waiting.Len()
	t.settle(r, now)
	t.end(r, proto.Expired, errs.ResourceExhausted, fmt.Sprintf(
		"evicted before pairing: the sidecar was full and client %s held %d unpaired transfers", victim, n), now)
	t.bump(r)
	return true
}

func (t *Table) modeConflict(r *rec, role proto.Role, m proto.Mode, now time.Time) *Refusal {
	e := refuse(http.StatusConflict, errs.InvalidArgument, "%s asks for %s mode but transfer %q is %s", role, m, r.id, r.mode)
	rr := r.record(t, "", now)
	e.Record, e.kind = &rr, "conflict"
	t.m.rejected(e)
	return e
}

// compatible checks that a plan can be made from the two declarations,
// cheaply: the layouts fit together and the block lists have one length.
func compatible(src, dst *proto.Decl) error {
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
	return kvcache.Compatible(&sl, &dl)
}

// authorize finds the transfer id and the side whose capability the caller
// presents; want, when not empty, is the role the caller claims. A missing
// or foreign capability is refused with 403, so that nobody but the two
// sides learns or changes anything about a transfer. Callers hold t.mu.
func (t *Table) authorize(id, capability string, want proto.Role) (*rec, proto.Role, *Refusal) {
	if e := checkID(id); e != nil {
		return nil, "", e
	}
	switch want {
	case "", proto.Prefill, proto.Decode:
	default:
		return nil, "", refuse(http.StatusBadRequest, errs.InvalidArgument, "role %q is neither prefill nor decode", want)
	}
	if t.closed {
		return nil, "", refuse(http.StatusServiceUnavailable, errs.Closed, "sidecar shutting down")
	}
	r := t.recs[id]
	caps := [2]string{noCapability, noCapability}
	if r != nil {
		caps = r.caps
	}
	role := proto.Role("")
	for s := range 2 {
		// Both compared, in constant time, whatever matches; an unknown id
		// is compared too, so that it takes the time a known one takes.
		if caps[s] != "" && subtle.ConstantTimeCompare([]byte(caps[s]), []byte(capability)) == 1 {
			role = roleOf(s)
		}
	}
	if r == nil || role == "" {
		// An unknown id and a capability that is not the transfer's get one
		// answer: nobody learns which ids exist.
		e := refuse(http.StatusNotFound, errs.NotFound,
			"no transfer %q for the capability presented (header %s) on sidecar instance %s", id, proto.CapabilityHeader, t.instance)
		t.m.rejected(e)
		return nil, "", e
	}
	if want != "" && want != role {
		e := refuse(http.StatusForbidden, errs.Unauthenticated, "the capability presented for transfer %q is %s's, not %s's", id, role, want)
		e.kind = "capability"
		t.m.rejected(e)
		return nil, "", e
	}
	return r, role, nil
}

// Complete records the mover's outcome; only the mover's capability is
// accepted once the transfer is paired.
func (t *Table) Complete(c proto.Complete, capability string) (proto.Record, *Refusal) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	r, role, e := t.authorize(c.ID, capability, "")
	if e != nil {
		return proto.Record{}, e
	}
	conflict := func(format string, args ...any) (proto.Record, *Refusal) {
		e := refuse(http.StatusConflict, r.state.Code(), format, args...)
		rr := r.record(t, role, now)
		e.Record = &rr
		t.m.rejected(e)
		return proto.Record{}, e
	}
	if r.state == proto.Waiting {
		return conflict("transfer %q is not paired yet: nothing to complete", c.ID)
	}
	if !r.paired.IsZero() && role != r.mode.Mover() {
		e := refuse(http.StatusForbidden, errs.Unauthenticated, "only the mover (%s) completes %s transfer %q", r.mode.Mover(), r.mode, c.ID)
		e.kind = "capability"
		t.m.rejected(e)
		return proto.Record{}, e
	}
	switch {
	case r.state == proto.Transferring:
		r.bytes, r.reqs = c.Bytes, c.Requests
		if c.OK {
			t.end(r, proto.Done, errs.OK, "", now)
			t.m.completed(r.mode, c)
		} else {
			code := errs.Code(c.Code)
			if code == errs.OK {
				code = errs.Internal
			}
			t.end(r, proto.Failed, code, "mover: "+c.Reason, now)
		}
		t.settle(r, now)
		t.bump(r)
		return r.record(t, role, now), nil
	case !r.settled:
		// Aborted or expired while the mover was moving: it has stopped now.
		r.bytes = c.Bytes
		t.settle(r, now)
		t.bump(r)
		return conflict("transfer %q was %s before it completed: %s", c.ID, r.state, r.reason)
	}
	return conflict("transfer %q already %s", c.ID, r.state)
}

// Abort ends a transfer that is not finished yet, for the side whose
// capability is presented.
func (t *Table) Abort(a proto.Abort, capability string) (proto.Record, *Refusal) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	r, role, e := t.authorize(a.ID, capability, a.Role)
	if e != nil {
		return proto.Record{}, e
	}
	if r.state.Terminal() {
		e := refuse(http.StatusConflict, r.state.Code(), "transfer %q already %s", a.ID, r.state)
		rr := r.record(t, role, now)
		e.Record = &rr
		t.m.rejected(e)
		return proto.Record{}, e
	}
	reason := "aborted by " + string(role)
	if a.Reason != "" {
		reason += ": " + a.Reason
	}
	r.abortBy = role
	// Before pairing nobody moves anything; after it the mover may be in
	// the middle of a batch and settles when it reports.
	if r.state == proto.Waiting {
		t.settle(r, now)
	}
	t.end(r, proto.Aborted, errs.Canceled, reason, now)
	t.bump(r)
	return r.record(t, role, now), nil
}

// Status returns a transfer's record for the side whose capability is
// presented (role, when not empty, is the side the caller claims to be).
func (t *Table) Status(id, capability string, role proto.Role) (proto.Record, *Refusal) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, role, e := t.authorize(id, capability, role)
	if e != nil {
		return proto.Record{}, e
	}
	return r.record(t, role, time.Now()), nil
}

// Wait returns once the transfer's version exceeds since, the timeout
// passes or stop is closed, with the record as it is then.
func (t *Table) Wait(id, capability string, role proto.Role, since uint64, timeout time.Duration, stop <-chan struct{}) (proto.Record, *Refusal) {
	timeout = min(timeout, t.cfg.MaxWait)
	var timer *time.Timer
	t.mu.Lock()
	t.polls++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.polls--
		t.mu.Unlock()
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		t.mu.Lock()
		r, who, e := t.authorize(id, capability, role)
		if e != nil {
			t.mu.Unlock()
			return proto.Record{}, e
		}
		if r.version > since || t.closed {
			rr := r.record(t, who, time.Now())
			t.mu.Unlock()
			return rr, nil
		}
		ch := r.changed
		t.mu.Unlock()
		if timer == nil {
			if timeout <= 0 {
				return t.Status(id, capability, role)
			}
			timer = time.NewTimer(timeout)
		}
		select {
		case <-ch:
		case <-timer.C:
			return t.Status(id, capability, role)
		case <-stop:
			return t.Status(id, capability, role)
		}
	}
}

// noCapability stands in for the capabilities of an unknown id: a value
// no capability equals (capabilities are hex).
const noCapability = "--------------------------------"

// move changes a live transfer's state.
func (t *Table) move(r *rec, s proto.State) {
	t.m.leave(r.state)
	r.state = s
	t.m.enter(s)
}

// end moves r to a terminal state and releases its declarations.
func (t *Table) end(r *rec, s proto.State, code errs.Code, reason string, now time.Time) {
	from := r.state
	t.move(r, s)
	r.code, r.reason, r.ended = code, reason, now
	t.m.ended(r, from)
	t.release(r)
	t.settle(r, time.Time{})
}

// settle marks r settled at now (a zero now only files an already settled,
// terminal r among the finished ones).
func (t *Table) settle(r *rec, now time.Time) {
	if !now.IsZero() && !r.settled {
		r.settled, r.settledAt = true, now
	}
	if r.settled && r.state.Terminal() && r.doneElem == nil {
		r.doneElem = t.finished.PushBack(r)
	}
}

// drop forgets r. Callers hold t.mu.
func (t *Table) drop(r *rec) {
	if r.timer != nil {
		r.timer.Stop()
	}
	if r.doneElem != nil {
		t.finished.Remove(r.doneElem)
		r.doneElem = nil
	}
	t.release(r)
	delete(t.recs, r.id)
	t.m.leave(r.state)
	close(r.changed)
	r.changed = make(chan struct{})
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
		if r.state == proto.Waiting {
			missing := "prefill"
			if r.decl[0] == nil {
				missing = "decode"
			}
			t.settle(r, now)
			t.end(r, proto.Expired, errs.Timeout, "expired: "+missing+" never declared", now)
		} else {
			t.end(r, proto.Expired, errs.Timeout, "expired: the mover did not complete in time", now)
		}
		t.bump(r)
	case !r.settled:
		if now.Before(r.ended.Add(t.cfg.SettleGrace)) {
			t.arm(r)
			return
		}
		t.settle(r, now)
		r.reason += " (the mover never reported; settled after the grace period)"
		t.bump(r)
	default:
		if now.Before(r.settledAt.Add(t.cfg.Retain)) {
			t.arm(r)
			return
		}
		t.drop(r)
	}
}

// record renders r for a caller in role (empty: a caller that proved
// nothing about r, which learns neither declaration).
func (r *rec) record(t *Table, role proto.Role, now time.Time) proto.Record {
	out := proto.Record{
		Instance: t.instance, ID: r.id, State: r.state, Mode: r.mode, Version: r.version,
		Expect: r.caps[0] != "", Ready: r.caps[1] != "", Bytes: r.bytes, Code: int32(r.code),
		Reason: r.reason, AbortBy: r.abortBy, Settled: r.settled, Requests: r.reqs,
	}
	if !r.state.Terminal() {
		out.ExpiresInMS = max(1, r.deadline.Sub(now).Milliseconds())
	}
	if role != "" {
		out.NoticeKey, out.Mover = r.noticeKey, r.mover
	}
	if r.state == proto.Transferring && role != "" && role == r.mode.Mover() {
		if o := r.decl[1-side(role)]; o != nil {
			out.Peer = &proto.Peer{Segment: o.Segment, Layout: o.Layout, Blocks: o.Blocks, Window: o.Window}
		}
	}
	return out
}

// declared renders r for the side that just declared, with its capability.
func (r *rec) declared(t *Table, role proto.Role, now time.Time) proto.Record {
	out := r.record(t, role, now)
	out.Capability = r.caps[side(role)]
	return out
}
