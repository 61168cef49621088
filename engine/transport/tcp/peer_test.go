package tcp_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/engine/transport/tcp"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/session"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// TestPeerKilledMidBatch: SIGKILL the target process while a batch of large
// reads and writes is in flight; every task ends FAILED well within the
// transfer timeout (goleak in TestMain checks no goroutine is left).
func TestPeerKilledMidBatch(t *testing.T) {
	const block, n = 1 << 20, 64
	p := transporttest.NewChildPeer(t, block*n)
	defer p.Close()
	local := alloc(t, block*n)
	e := newEngine(t, "", map[string]string{"tcp.slice": "256KiB"})
	if err := e.RegisterMemory(mem.Addr(local), block*n, "cpu:0", false); err != nil {
		t.Fatal(err)
	}
	seg, err := e.OpenSegment(p.Segment())
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseSegment(seg)
	for round := 0; round < 2; round++ {
		b, err := e.AllocateBatch(n)
		if err != nil {
			t.Fatal(err)
		}
		var reqs []engine.Request
		for i := uint64(0); i < n; i++ {
			op := engine.Read
			if i%2 == 1 {
				op = engine.Write
			}
			reqs = append(reqs, engine.Request{Op: op, Local: mem.Addr(local) + i*block, Segment: seg, Remote: p.Addr() + i*block, Length: block})
		}
		if err := b.Submit(reqs...); err != nil {
			t.Fatal(err)
		}
		if round == 1 {
			p.Kill()
		}
		t0 := time.Now()
		st, err := b.Wait(5 * time.Second)
		if err != nil {
			t.Fatalf("round %d: batch still pending %v after submit: %v", round, time.Since(t0), st)
		}
		if round == 0 {
			if st.State != engine.Completed {
				t.Fatalf("before the kill: %+v", st)
			}
			continue
		}
		// Some tasks may have finished before the kill; the rest failed.
		if st.State != engine.Failed || st.Failed == 0 {
			t.Fatalf("after the kill: %+v", st)
		}
		for i := 0; i < n; i++ {
			ts, _ := b.TaskStatus(i)
			if ts.State == engine.Failed && !errors.Is(ts.Err, errs.ErrPeerUnreachable) {
				t.Errorf("task %d: %v, want peer unreachable", i, ts.Err)
			}
		}
		t.Logf("failed %d of %d tasks %v after the kill", st.Failed, n, time.Since(t0))
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
	}
	// The next request reconnects (and fails fast: nobody listens).
	b, _ := e.AllocateBatch(1)
	if err := b.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(local), Segment: seg, Remote: p.Addr(), Length: 4096}); err == nil {
		st, _ := b.Wait(5 * time.Second)
		if st.State != engine.Failed {
			t.Fatalf("request to a dead peer: %+v", st)
		}
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// TestPeerRestarted: the target restarts under the same name, with the same
// data port and the same memory range but new keys. A request built from the
// old descriptor is refused by the new target's key check and never written;
// the initiator then refreshes the descriptor and the next request works.
func TestPeerRestarted(t *testing.T) {
	rpc, data := "127.0.0.1:"+freePort(t), "127.0.0.1:"+freePort(t)
	params := map[string]string{"tcp.listen": data}
	buf := alloc(t, 1<<20)
	start := func() *engine.Engine {
		e, err := engine.New(engine.Config{ListenAddr: rpc, Hostname: "127.0.0.1", Transports: []string{"tcp"}, Params: params})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.RegisterMemory(mem.Addr(buf), uint64(len(buf)), "cpu:0", true); err != nil {
			t.Fatal(err)
		}
		return e
	}
	local := alloc(t, 4096)
	tg := start()
	e := newEngine(t, "", nil)
	if err := e.RegisterMemory(mem.Addr(local), 4096, "cpu:0", false); err != nil {
		t.Fatal(err)
	}
	seg, err := e.OpenSegment(tg.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseSegment(seg)
	write := func(v byte) engine.BatchStatus {
		t.Helper()
		for i := range local {
			local[i] = v
		}
		b, _ := e.AllocateBatch(1)
		defer b.Free()
		if err := b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(local), Segment: seg, Remote: mem.Addr(buf), Length: 4096}); err != nil {
			t.Fatal(err)
		}
		st, err := b.Wait(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := write(1); st.State != engine.Completed {
		t.Fatalf("first write: %+v", st)
	}
	oldKey := tg.Descriptor().Buffers[0].Key
	tg.Close()
	tg = start()
	defer tg.Close()
	if tg.Descriptor().Buffers[0].Key == oldKey {
		t.Fatal("re-registration kept its key")
	}
	clear(buf[:4096])
	// The old connections are gone (give the initiator's readers a moment
	// to see their EOF); the first request reconnects to the new target
	// with the old key.
	time.Sleep(200 * time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := write(2)
		if st.State == engine.Completed {
			t.Fatal("a request with the old descriptor's key was honoured")
		}
		if errors.Is(st.Err, errs.ErrStaleDescriptor) {
			break
		}
		// A connection the initiator had not yet seen die fails with
		// peer unreachable first; that also invalidates the descriptor,
		// so go round again only while the old key is still cached.
		if !errors.Is(st.Err, errs.ErrPeerUnreachable) || time.Now().After(deadline) {
			t.Fatalf("stale write: %+v", st)
		}
		if d, _ := seg.Descriptor(); d.Buffers[0].Key != oldKey {
			t.Skip("descriptor refreshed before a stale request reached the new target")
		}
	}
	if !bytes.Equal(buf[:4096], make([]byte, 4096)) {
		t.Fatal("a refused write changed the restarted target's memory")
	}
	if st := write(3); st.State != engine.Completed {
		t.Fatalf("after refresh: %+v", st)
	}
	if buf[0] != 3 || buf[4095] != 3 {
		t.Fatal("write after refresh did not land")
	}
}

// fakeHost is a transport.Host without an engine, for driving the transport
// directly against hand-written servers.
type fakeHost struct {
	reg    *segment.Registry
	params map[string]string
	secret *peerauth.Secret
	inst   string
}

func (h *fakeHost) SegmentName() string { return "fake" }
func (h *fakeHost) Instance() string {
	if h.inst == "" {
		return "fake"
	}
	return h.inst
}
func (h *fakeHost) AuthSecret() *peerauth.Secret  { return h.secret }
func (h *fakeHost) Registry() *segment.Registry   { return h.reg }
func (h *fakeHost) Control() transport.Control    { return nil }
func (h *fakeHost) Logf(string, ...any)           {}
func (h *fakeHost) Param(k string) (string, bool) { v, ok := h.params[k]; return v, ok }
func newFakeHost(params map[string]string) *fakeHost {
	return &fakeHost{reg: segment.NewRegistry(), params: params}
}

// fakeHandshake is the target's side of a connection's opening: the preface,
// then the authentication exchange without a secret.
func fakeHandshake(nc net.Conn) bool {
	var pre [wire.DataPrefaceSize]byte
	if _, err := io.ReadFull(nc, pre[:]); err != nil || wire.CheckDataPreface(pre[:]) != nil {
		return false
	}
	o, err := peerauth.ServerSession(nc, nil, "fake-target", time.Now().Add(10*time.Second), peerauth.SessionOptions{Channel: session.Data})
	return err == nil && o.Session == nil
}

// fakeServer accepts data connections and hands each to serve.
func fakeServer(t *testing.T, serve func(nc net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); serve(nc) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

type result struct {
	mu   sync.Mutex
	errs []error
	n    int
	ch   chan struct{}
}

func newResult(n int) *result { return &result{n: n, ch: make(chan struct{})} }

func (r *result) done(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
	if len(r.errs) == r.n {
		close(r.ch)
	}
}

func (r *result) wait(t *testing.T, d time.Duration) []error {
	t.Helper()
	select {
	case <-r.ch:
	case <-time.After(d):
		t.Fatalf("requests not finished within %v", d)
	}
	return r.errs
}

func startFake(t *testing.T, params map[string]string) *tcp.Transport {
	t.Helper()
	tr := tcp.New()
	if err := tr.Start(newFakeHost(params)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func reqsTo(endpoint string, local []byte, n int, op transport.Opcode, r *result) []transport.Request {
	d := &segment.Desc{Name: "peer", Endpoints: map[string]string{"tcp": endpoint}}
	buf := &segment.BufferDesc{Addr: 1 << 40, Length: 1 << 30, Key: 42}
	var out []transport.Request
	for i := 0; i < n; i++ {
		out = append(out, transport.Request{Op: op, Local: mem.Addr(local), Remote: buf.Addr, Length: uint64(len(local)), Peer: d, Buffer: buf, Key: buf.Key, Owner: transport.DoneFunc(r.done)})
	}
	return out
}

// TestInitiatorRejectsBadCompletions: completions for unknown ids, with the
// wrong payload length, malformed, or cut short fail the requests with a
// protocol or unreachable error, promptly, and free every goroutine.
func TestInitiatorRejectsBadCompletions(t *testing.T) {
	local := alloc(t, 4096)
	cases := map[string]struct {
		reply func(req wire.DataRequest) []byte
		code  errs.Code
	}{
		"unknown id": {func(q wire.DataRequest) []byte {
			return wire.AppendCompletion(nil, wire.Completion{ID: q.ID + 1000})
		}, errs.Protocol},
		"wrong length": {func(q wire.DataRequest) []byte {
			return wire.AppendCompletion(nil, wire.Completion{ID: q.ID, Length: q.Length - 1})
		}, errs.Protocol},
		"garbage": {func(wire.DataRequest) []byte { return bytes.Repeat([]byte{0xEE}, wire.CompHeaderSize) }, errs.Protocol},
		"truncated header": {func(q wire.DataRequest) []byte {
			return wire.AppendCompletion(nil, wire.Completion{ID: q.ID, Length: q.Length})[:10]
		}, errs.PeerUnreachable},
		"truncated payload": {func(q wire.DataRequest) []byte {
			return append(wire.AppendCompletion(nil, wire.Completion{ID: q.ID, Length: q.Length}), 1, 2, 3)
		}, errs.PeerUnreachable},
		"remote error": {func(q wire.DataRequest) []byte {
			return wire.AppendCompletion(nil, wire.Completion{ID: q.ID, Status: errs.StaleDescriptor})
		}, errs.StaleDescriptor},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			ep := fakeServer(t, func(nc net.Conn) {
				var h [wire.ReqHeaderSize]byte
				if !fakeHandshake(nc) {
					return
				}
				if _, err := io.ReadFull(nc, h[:]); err != nil {
					return
				}
				q, _ := wire.DecodeDataRequest(h[:])
				nc.Write(c.reply(q))
				if c.code == errs.PeerUnreachable {
					nc.Close()
				}
				io.Copy(io.Discard, nc)
			})
			tr := startFake(t, nil)
			r := newResult(1)
			tr.Submit(reqsTo(ep, local, 1, transport.Read, r))
			errsGot := r.wait(t, 5*time.Second)
			if errs.CodeOf(errsGot[0]) != c.code {
				t.Fatalf("got %v, want code %v", errsGot[0], c.code)
			}
		})
	}
}

// TestCloseFailsInFlight: a target that never answers; Close ends every
// request with Closed before it returns.
func TestCloseFailsInFlight(t *testing.T) {
	ep := fakeServer(t, func(nc net.Conn) { io.Copy(io.Discard, nc) })
	local := alloc(t, 64<<10)
	tr := startFake(t, map[string]string{"tcp.conns": "3", "tcp.slice": "4KiB"})
	r := newResult(20)
	tr.Submit(reqsTo(ep, local, 10, transport.Write, r))
	tr.Submit(reqsTo(ep, local, 10, transport.Read, r))
	time.Sleep(50 * time.Millisecond)
	tr.Close()
	for _, err := range r.wait(t, time.Second) {
		if !errors.Is(err, errs.ErrClosed) {
			t.Fatalf("in flight at close: %v", err)
		}
	}
	// After Close, requests fail at once.
	r2 := newResult(1)
	tr.Submit(reqsTo(ep, local, 1, transport.Read, r2))
	if err := r2.wait(t, time.Second)[0]; !errors.Is(err, errs.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

// TestCloseWhileSubmitting: Close races with Submit from several goroutines
// against a live target; every request ends (ok or Closed) and nothing hangs.
func TestCloseWhileSubmitting(t *testing.T) {
	tg := newTarget(t)
	local := alloc(t, 16<<10)
	tr := startFake(t, map[string]string{"tcp.slice": "4KiB"})
	d := &segment.Desc{Name: "peer", Endpoints: map[string]string{"tcp": tg.endpoint}}
	buf := &segment.BufferDesc{Addr: mem.Addr(tg.buf), Length: uint64(len(tg.buf)), Key: tg.key}
	const workers, per = 4, 200
	r := newResult(workers * per)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				tr.Submit([]transport.Request{{Op: transport.Opcode(i % 2), Local: mem.Addr(local), Remote: buf.Addr,
					Length: uint64(len(local)), Peer: d, Buffer: buf, Key: buf.Key, Owner: transport.DoneFunc(r.done)}})
			}
		}()
	}
	time.Sleep(5 * time.Millisecond)
	tr.Close()
	wg.Wait()
	for _, err := range r.wait(t, 5*time.Second) {
		if err != nil && !errors.Is(err, errs.ErrClosed) && !errors.Is(err, errs.ErrPeerUnreachable) {
			t.Fatalf("unexpected: %v", err)
		}
	}
}

// TestHungPeer: a target that accepts and reads but never answers. With
// requests in flight and nothing arriving for tcp.timeout, the connection is
// failed and so are they; an idle connection (nothing in flight) is kept.
func TestHungPeer(t *testing.T) {
	hung := fakeServer(t, func(nc net.Conn) {
		if fakeHandshake(nc) {
			io.Copy(io.Discard, nc)
		}
	})
	local := alloc(t, 4096)
	tr := startFake(t, map[string]string{"tcp.timeout": "300ms"})
	r := newResult(3)
	t0 := time.Now()
	tr.Submit(reqsTo(hung, local, 3, transport.Read, r))
	for _, err := range r.wait(t, 5*time.Second) {
		if !errors.Is(err, errs.ErrPeerUnreachable) {
			t.Fatalf("hung peer: %v", err)
		}
	}
	if el := time.Since(t0); el < 200*time.Millisecond {
		t.Fatalf("failed after %v, before the timeout", el)
	}
	// A live peer that answers every READ with zeros and counts the
	// connections it accepts.
	var accepted atomic.Int32
	live := fakeServer(t, func(nc net.Conn) {
		accepted.Add(1)
		if !fakeHandshake(nc) {
			return
		}
		for {
			var h [wire.ReqHeaderSize]byte
			if _, err := io.ReadFull(nc, h[:]); err != nil {
				return
			}
			q, _ := wire.DecodeDataRequest(h[:])
			nc.Write(append(wire.AppendCompletion(nil, wire.Completion{ID: q.ID, Length: q.Length}), make([]byte, q.Length)...))
		}
	})
	for i := 0; i < 4; i++ {
		r := newResult(1)
		tr.Submit(reqsTo(live, local, 1, transport.Read, r))
		if err := r.wait(t, 5*time.Second)[0]; err != nil {
			t.Fatalf("request %d to a live peer: %v", i, err)
		}
		time.Sleep(700 * time.Millisecond) // idle for two timeouts
	}
	if n := accepted.Load(); n != int32(tr.Options().Conns) {
		t.Fatalf("%d connections for 4 requests over %d idle periods; idle connections must be kept", n, 4)
	}
}

// TestUnreachable: nothing listens; requests fail with PeerUnreachable and
// the next request dials again.
func TestUnreachable(t *testing.T) {
	ep := "127.0.0.1:" + freePort(t)
	local := alloc(t, 4096)
	tr := startFake(t, nil)
	for i := 0; i < 2; i++ {
		r := newResult(4)
		tr.Submit(reqsTo(ep, local, 4, transport.Read, r))
		for _, err := range r.wait(t, 5*time.Second) {
			if !errors.Is(err, errs.ErrPeerUnreachable) {
				t.Fatalf("round %d: %v", i, err)
			}
		}
	}
}

func TestParams(t *testing.T) {
	bad := []map[string]string{
		{"tcp.conns": "1"}, {"tcp.conns": "x"}, {"tcp.conns": "1000"},
		{"tcp.slice": "1"}, {"tcp.slice": "1TiB"}, {"tcp.slice": "12 parsecs"},
		{"tcp.listen": "nohostport"}, {"tcp.dial_timeout": "-1s"}, {"tcp.timeout": "0s"},
	}
	for _, p := range bad {
		tr := tcp.New()
		err := tr.Start(newFakeHost(p))
		if !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%v: %v", p, err)
		}
		tr.Close()
	}
	tr := startFake(t, map[string]string{"tcp.conns": "5", "tcp.slice": "128KiB", "tcp.dial_timeout": "1s"})
	if o := tr.Options(); o.Conns != 5 || o.Slice != 128<<10 || o.DialTimeout != time.Second {
		t.Fatalf("options %+v", o)
	}
	if d := tcp.DefaultOptions(); d.Conns < tcp.MinConns || d.Slice < 256<<10 || d.Slice > 1<<20 {
		t.Fatalf("defaults %+v", d)
	}
}

// TestPruneWhileSubmitting: the janitor prunes idle peers while submits dial
// new connections to them (a lock-order cycle once deadlocked this); every
// request ends and the transport closes.
func TestPruneWhileSubmitting(t *testing.T) {
	tg := newTarget(t)
	local := alloc(t, 4096)
	tr := startFake(t, map[string]string{"limits.peer_idle_timeout": "1ms"})
	d := &segment.Desc{Name: "peer", Endpoints: map[string]string{"tcp": tg.endpoint}}
	buf := &segment.BufferDesc{Addr: mem.Addr(tg.buf), Length: uint64(len(tg.buf)), Key: tg.key}
	const rounds = 300
	r := newResult(rounds)
	for i := 0; i < rounds; i++ {
		tr.Submit([]transport.Request{{Op: transport.Write, Local: mem.Addr(local), Remote: buf.Addr, Length: 4096,
			Peer: d, Buffer: buf, Key: buf.Key, Owner: transport.DoneFunc(r.done)}})
		if i%10 == 0 {
			time.Sleep(2 * time.Millisecond) // let the janitor run between submits
		}
	}
	for _, err := range r.wait(t, 30*time.Second) {
		if err != nil && !errors.Is(err, errs.ErrClosed) && !errors.Is(err, errs.ErrPeerUnreachable) {
			t.Fatalf("unexpected: %v", err)
		}
	}
	// Idle now: the janitor prunes the peer within a few ticks, if it did
	// not already between the submits.
	waitFor(t, 5*time.Second, "the janitor prunes the idle peer", func() bool { return tr.Stats()["peer_conns_pruned"] > 0 })
}
