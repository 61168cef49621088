package rendezvous_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/internal/sidecar"
	"github.com/tecache/te/internal/sidecar/rendezvous"
	"github.com/tecache/te/kvcache"
)

func TestMain(m *testing.M) {
	// fasthttp's worker pool cleaner sleeps on after Shutdown (it exits at
	// its next tick); it is not ours to stop.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"))
}

// reg adapts the sidecar's registry, as te-sidecar does.
type reg struct{ m *sidecar.Metrics }

func (r reg) Counter(n, h string, l ...string) rendezvous.Adder { return r.m.Counter(n, h, l...) }
func (r reg) Gauge(n, h string, l ...string) rendezvous.Adder   { return r.m.Gauge(n, h, l...) }
func (r reg) Histogram(n, h string, b []float64, l ...string) rendezvous.Observer {
	return r.m.Histogram(n, h, b, l...)
}

type server struct {
	t    *testing.T
	base string
	srv  *sidecar.Server
	svc  *rendezvous.Service
	hc   *http.Client
	once sync.Once
}

// start serves a real te-sidecar server with the handoff mounted with cfg
// on 127.0.0.1.
func start(t *testing.T, cfg rendezvous.Config) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := sidecar.New(sidecar.Config{Logger: nil})
	svc := rendezvous.Mount(srv, reg{srv.Metrics()}, cfg)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s := &server{t: t, base: "http://" + ln.Addr().String(), srv: srv, svc: svc,
		hc: &http.Client{Transport: &http.Transport{}}}
	t.Cleanup(func() {
		s.stop()
		if err := <-errc; err != nil {
			t.Error(err)
		}
		s.hc.CloseIdleConnections()
	})
	return s
}

func (s *server) stop() {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			s.t.Error(err)
		}
		s.svc.Close()
	})
}

// do sends a request and returns the status and body.
func (s *server) do(method, path string, body any) (int, []byte) {
	s.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			s.t.Fatal(err)
		}
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, s.base+path, r)
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	if got := resp.Header.Get(rendezvous.InstanceHeader); strings.HasPrefix(path, "/handoff/") && resp.StatusCode != 405 && got != s.svc.Instance() {
		s.t.Errorf("%s %s: instance header %q, want %q", method, path, got, s.svc.Instance())
	}
	return resp.StatusCode, out
}

// ok sends a request that must succeed and returns the record.
func (s *server) ok(method, path string, body any) rendezvous.Record {
	s.t.Helper()
	code, b := s.do(method, path, body)
	if code != 200 {
		s.t.Fatalf("%s %s: %d %s", method, path, code, b)
	}
	var r rendezvous.Record
	if err := json.Unmarshal(b, &r); err != nil {
		s.t.Fatal(err)
	}
	if r.Instance != s.svc.Instance() {
		s.t.Fatalf("record instance %q, want %q", r.Instance, s.svc.Instance())
	}
	return r
}

// refused sends a request that must fail with status and code.
func (s *server) refused(method, path string, body any, status int, code errs.Code) rendezvous.ErrorBody {
	s.t.Helper()
	got, b := s.do(method, path, body)
	var e rendezvous.ErrorBody
	if err := json.Unmarshal(b, &e); err != nil {
		s.t.Fatalf("%s %s: %d, body %q is not an error body: %v", method, path, got, b, err)
	}
	if got != status || errs.Code(e.Code) != code || e.Error == "" || e.Instance != s.svc.Instance() {
		s.t.Fatalf("%s %s: got %d %+v, want %d code %v", method, path, got, e, status, code)
	}
	return e
}

func layout(t *testing.T, blocks int, base uint64) json.RawMessage {
	t.Helper()
	l := kvcache.Layout{Format: kvcache.VLLM, Order: kvcache.NHD, DType: kvcache.BF16, NumBlocks: blocks,
		BlockSize: 16, NumHeads: 2, HeadDim: 64, Bases: []uint64{base, base + 1<<24}}
	b, err := json.Marshal(&l)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decl(t *testing.T, id string, blocks []int, mode rendezvous.Mode, timeoutMS int64) rendezvous.Decl {
	return rendezvous.Decl{ID: id, Segment: "127.0.0.1:1", Layout: layout(t, 32, 1<<30), Blocks: blocks, Mode: mode, TimeoutMS: timeoutMS}
}

func TestPushRendezvous(t *testing.T) {
	s := start(t, rendezvous.Config{})
	d := s.ok("POST", "/handoff/expect", decl(t, "r1", []int{7, 3, 9}, rendezvous.Push, 0))
	if d.State != rendezvous.Waiting || !d.Expect || d.Ready || d.Peer != nil || d.Mode != rendezvous.Push || d.ExpiresInMS <= 0 || !(d.Version > 0) {
		t.Fatalf("after expect: %+v", d)
	}
	p := s.ok("POST", "/handoff/ready", decl(t, "r1", []int{1, 2, 3}, "", 0))
	if p.State != rendezvous.Transferring || p.Peer == nil || p.Peer.Segment != "127.0.0.1:1" || fmt.Sprint(p.Peer.Blocks) != "[7 3 9]" {
		t.Fatalf("prefill (the pusher) should learn decode's declaration: %+v", p)
	}
	// Decode is not the mover: it never gets prefill's declaration.
	w := s.ok("GET", fmt.Sprintf("/handoff/wait?id=r1&role=decode&since=%d&timeout_ms=5000", d.Version), nil)
	if w.State != rendezvous.Transferring || w.Peer != nil {
		t.Fatalf("decode wait: %+v", w)
	}
	// A long poll returns when the state changes.
	got := make(chan rendezvous.Record, 1)
	go func() {
		code, b := s.do("GET", fmt.Sprintf("/handoff/wait?id=r1&since=%d&timeout_ms=10000", w.Version), nil)
		var r rendezvous.Record
		if code != 200 || json.Unmarshal(b, &r) != nil {
			t.Errorf("wait: %d %s", code, b)
		}
		got <- r
	}()
	time.Sleep(50 * time.Millisecond)
	c := s.ok("POST", "/handoff/complete", rendezvous.Complete{ID: "r1", OK: true, Bytes: 12345, Requests: 3, Seconds: 0.01})
	if c.State != rendezvous.Done || !c.Settled || c.Bytes != 12345 {
		t.Fatalf("complete: %+v", c)
	}
	select {
	case r := <-got:
		if r.State != rendezvous.Done || r.Version != c.Version {
			t.Fatalf("long poll returned %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("long poll did not return on completion")
	}
	st := s.ok("GET", "/handoff/status?id=r1", nil)
	if st.State != rendezvous.Done || st.Requests != 3 || st.Bytes != 12345 || st.ExpiresInMS != 0 {
		t.Fatalf("status: %+v", st)
	}
	// Completing twice or aborting a finished transfer conflicts.
	e := s.refused("POST", "/handoff/complete", rendezvous.Complete{ID: "r1", OK: true}, 409, errs.OK)
	if e.Record == nil || e.Record.State != rendezvous.Done {
		t.Fatalf("conflict body %+v", e)
	}
	s.refused("POST", "/handoff/abort", rendezvous.Abort{ID: "r1"}, 409, errs.OK)

	_, m := s.do("GET", "/metrics", nil)
	for _, want := range []string{
		`te_handoff_transfers_total{mode="push",state="done"} 1`,
		`te_handoff_bytes_total{mode="push"} 12345`,
		`te_handoff_requests_total{mode="push"} 3`,
		`te_handoff_transfers{state="done"} 1`,
		`te_handoff_transfers{state="waiting"} 0`,
		`te_handoff_transfer_seconds_count{mode="push"} 1`,
		`te_handoff_move_seconds_sum{mode="push"} 0.01`,
		`te_handoff_pair_wait_seconds_count 1`,
		`te_handoff_seconds_count{mode="push",state="done"} 1`,
		`te_handoff_rejected_total{reason="conflict"} 2`,
	} {
		if !strings.Contains(string(m), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Log(string(m))
	}
}

func TestPullRendezvous(t *testing.T) {
	s := start(t, rendezvous.Config{})
	p := s.ok("POST", "/handoff/ready", decl(t, "r2", []int{4, 5}, rendezvous.Pull, 0))
	if p.State != rendezvous.Waiting || p.Mode != rendezvous.Pull {
		t.Fatalf("ready: %+v", p)
	}
	d := s.ok("POST", "/handoff/expect", decl(t, "r2", []int{0, 1}, rendezvous.Pull, 0))
	if d.State != rendezvous.Transferring || d.Peer == nil || fmt.Sprint(d.Peer.Blocks) != "[4 5]" {
		t.Fatalf("decode (the puller) should learn prefill's declaration: %+v", d)
	}
	if r := s.ok("GET", "/handoff/status?id=r2&role=prefill", nil); r.Peer != nil {
		t.Fatalf("prefill is not the mover in pull mode: %+v", r)
	}
	f := s.ok("POST", "/handoff/complete", rendezvous.Complete{ID: "r2", OK: false, Code: int32(errs.PeerUnreachable), Reason: "boom"})
	if f.State != rendezvous.Failed || errs.Code(f.Code) != errs.PeerUnreachable || !strings.Contains(f.Reason, "boom") || !f.Settled {
		t.Fatalf("failed complete: %+v", f)
	}
	_, m := s.do("GET", "/metrics", nil)
	if !strings.Contains(string(m), `te_handoff_failures_total{reason="peer_unreachable"} 1`) {
		t.Errorf("metrics:\n%s", m)
	}
}

func TestBadRequests(t *testing.T) {
	s := start(t, rendezvous.Config{MaxTransfers: 3})
	good := decl(t, "x", []int{1}, rendezvous.Push, 0)
	for _, c := range []struct {
		name string
		path string
		body any
	}{
		{"invalid JSON", "/handoff/expect", `{"id":`},
		{"empty body", "/handoff/ready", ``},
		{"JSON array", "/handoff/ready", `[1,2]`},
		{"trailing garbage", "/handoff/complete", `{"id":"x"} x`},
		{"no id", "/handoff/expect", rendezvous.Decl{Segment: "s", Layout: good.Layout, Blocks: []int{1}}},
		{"control char in id", "/handoff/expect", rendezvous.Decl{ID: "a\x01", Segment: "s", Layout: good.Layout, Blocks: []int{1}}},
		{"long id", "/handoff/expect", rendezvous.Decl{ID: strings.Repeat("a", 257), Segment: "s", Layout: good.Layout, Blocks: []int{1}}},
		{"no segment", "/handoff/expect", rendezvous.Decl{ID: "x", Layout: good.Layout, Blocks: []int{1}}},
		{"no layout", "/handoff/expect", rendezvous.Decl{ID: "x", Segment: "s", Blocks: []int{1}}},
		{"layout not an object", "/handoff/expect", rendezvous.Decl{ID: "x", Segment: "s", Layout: json.RawMessage(`"vllm"`), Blocks: []int{1}}},
		{"invalid layout", "/handoff/expect", rendezvous.Decl{ID: "x", Segment: "s", Layout: json.RawMessage(`{"format":"vllm","dtype":"bf16"}`), Blocks: []int{1}}},
		{"no blocks", "/handoff/expect", rendezvous.Decl{ID: "x", Segment: "s", Layout: good.Layout}},
		{"block out of range", "/handoff/ready", rendezvous.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{32}}},
		{"negative block", "/handoff/ready", rendezvous.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{-1}}},
		{"duplicate destination block", "/handoff/expect", rendezvous.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{2, 2}}},
		{"bad mode", "/handoff/expect", rendezvous.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{1}, Mode: "both"}},
		{"negative timeout", "/handoff/expect", rendezvous.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{1}, TimeoutMS: -1}},
		{"huge timeout", "/handoff/expect", rendezvous.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{1}, TimeoutMS: 1 << 50}},
		{"abort bad role", "/handoff/abort", rendezvous.Abort{ID: "x", Role: "router"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s.refused("POST", c.path, c.body, 400, errs.InvalidArgument)
		})
	}
	s.refused("GET", "/handoff/status", nil, 400, errs.InvalidArgument)
	s.refused("GET", "/handoff/wait?id=x&since=-1", nil, 400, errs.InvalidArgument)
	s.refused("GET", "/handoff/wait?id=x&timeout_ms=soon", nil, 400, errs.InvalidArgument)
	s.refused("GET", "/handoff/status?id=x&role=router", nil, 400, errs.InvalidArgument)

	// Unknown ids.
	s.refused("GET", "/handoff/status?id=nope", nil, 404, errs.NotFound)
	s.refused("GET", "/handoff/wait?id=nope&timeout_ms=10", nil, 404, errs.NotFound)
	s.refused("POST", "/handoff/complete", rendezvous.Complete{ID: "nope", OK: true}, 404, errs.NotFound)
	s.refused("POST", "/handoff/abort", rendezvous.Abort{ID: "nope"}, 404, errs.NotFound)

	// Duplicates and conflicts.
	s.ok("POST", "/handoff/expect", good)
	e := s.refused("POST", "/handoff/expect", good, 409, errs.InvalidArgument)
	if e.Record == nil || e.Record.State != rendezvous.Waiting || !strings.Contains(e.Error, "already declared") {
		t.Fatalf("duplicate: %+v", e)
	}
	s.refused("POST", "/handoff/complete", rendezvous.Complete{ID: "x", OK: true}, 409, errs.OK) // not paired
	s.refused("POST", "/handoff/ready", decl(t, "x", []int{1}, rendezvous.Pull, 0), 409, errs.InvalidArgument)
	if r := s.ok("GET", "/handoff/status?id=x", nil); r.State != rendezvous.Waiting || r.Ready {
		t.Fatalf("a refused declaration changed the transfer: %+v", r)
	}
	// Method not allowed comes from the sidecar's router.
	if code, _ := s.do("GET", "/handoff/expect", nil); code != 405 {
		t.Fatalf("GET /handoff/expect: %d", code)
	}
	// The table is bounded.
	s.ok("POST", "/handoff/expect", decl(t, "y", []int{1}, rendezvous.Push, 0))
	s.ok("POST", "/handoff/expect", decl(t, "z", []int{1}, rendezvous.Push, 0))
	s.refused("POST", "/handoff/expect", decl(t, "w", []int{1}, rendezvous.Push, 0), 503, errs.NoMemory)

	_, m := s.do("GET", "/metrics", nil)
	for _, want := range []string{`te_handoff_rejected_total{reason="invalid"}`, `te_handoff_rejected_total{reason="unknown_id"} 4`,
		`te_handoff_rejected_total{reason="duplicate"} 1`, `te_handoff_rejected_total{reason="full"} 1`, `te_handoff_transfers{state="waiting"} 3`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestMismatchFailsAtPairing(t *testing.T) {
	s := start(t, rendezvous.Config{})
	s.ok("POST", "/handoff/expect", decl(t, "m", []int{1, 2}, rendezvous.Push, 0))
	// Three prefill blocks for two decode blocks.
	r := s.ok("POST", "/handoff/ready", decl(t, "m", []int{1, 2, 3}, "", 0))
	if r.State != rendezvous.Failed || errs.Code(r.Code) != errs.InvalidArgument || !r.Settled || !strings.Contains(r.Reason, "do not match") {
		t.Fatalf("mismatch: %+v", r)
	}
	// A dtype mismatch too.
	s.ok("POST", "/handoff/expect", decl(t, "m2", []int{1}, rendezvous.Push, 0))
	d := decl(t, "m2", []int{1}, "", 0)
	d.Layout = json.RawMessage(strings.Replace(string(d.Layout), `"bf16"`, `"fp16"`, 1))
	if r := s.ok("POST", "/handoff/ready", d); r.State != rendezvous.Failed || !strings.Contains(r.Reason, "dtype") {
		t.Fatalf("dtype mismatch: %+v", r)
	}
	_, m := s.do("GET", "/metrics", nil)
	if !strings.Contains(string(m), `te_handoff_failures_total{reason="mismatch"} 2`) {
		t.Errorf("metrics:\n%s", m)
	}
}

func TestAbort(t *testing.T) {
	s := start(t, rendezvous.Config{})
	// Before pairing: aborted and settled at once; the late side is told.
	s.ok("POST", "/handoff/expect", decl(t, "a1", []int{1}, rendezvous.Push, 0))
	a := s.ok("POST", "/handoff/abort", rendezvous.Abort{ID: "a1", Role: rendezvous.Decode, Reason: "client went away"})
	if a.State != rendezvous.Aborted || !a.Settled || a.AbortBy != rendezvous.Decode || errs.Code(a.Code) != errs.Canceled || !strings.Contains(a.Reason, "client went away") {
		t.Fatalf("abort: %+v", a)
	}
	e := s.refused("POST", "/handoff/ready", decl(t, "a1", []int{1}, "", 0), 409, errs.Canceled)
	if e.Record == nil || e.Record.State != rendezvous.Aborted {
		t.Fatalf("late ready: %+v", e)
	}
	// While moving: aborted but not settled until the mover reports.
	s.ok("POST", "/handoff/expect", decl(t, "a2", []int{1}, rendezvous.Push, 0))
	s.ok("POST", "/handoff/ready", decl(t, "a2", []int{1}, "", 0))
	a = s.ok("POST", "/handoff/abort", rendezvous.Abort{ID: "a2", Role: rendezvous.Prefill})
	if a.State != rendezvous.Aborted || a.Settled {
		t.Fatalf("abort while moving: %+v", a)
	}
	e = s.refused("POST", "/handoff/complete", rendezvous.Complete{ID: "a2", OK: true, Bytes: 10}, 409, errs.Canceled)
	if e.Record == nil || !e.Record.Settled || e.Record.State != rendezvous.Aborted {
		t.Fatalf("late complete: %+v", e)
	}
	s.refused("POST", "/handoff/abort", rendezvous.Abort{ID: "a2"}, 409, errs.Canceled)
	_, m := s.do("GET", "/metrics", nil)
	for _, want := range []string{`te_handoff_failures_total{reason="aborted_by_decode"} 1`, `te_handoff_failures_total{reason="aborted_by_prefill"} 1`,
		`te_handoff_transfers{state="aborted"} 2`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestExpiry(t *testing.T) {
	s := start(t, rendezvous.Config{SettleGrace: 300 * time.Millisecond, Retain: 300 * time.Millisecond})
	// Unpaired: expires at its deadline, settled.
	d := s.ok("POST", "/handoff/expect", decl(t, "e1", []int{1}, rendezvous.Push, 100))
	t0 := time.Now()
	r := s.ok("GET", fmt.Sprintf("/handoff/wait?id=e1&since=%d&timeout_ms=5000", d.Version), nil)
	if r.State != rendezvous.Expired || !r.Settled || errs.Code(r.Code) != errs.Timeout || !strings.Contains(r.Reason, "prefill never declared") {
		t.Fatalf("expiry: %+v", r)
	}
	if el := time.Since(t0); el < 50*time.Millisecond || el > 3*time.Second {
		t.Fatalf("expired after %v, want about 100ms", el)
	}
	// Paired but never completed: expired, then settled after the grace.
	s.ok("POST", "/handoff/ready", decl(t, "e2", []int{1}, "", 150))
	p := s.ok("POST", "/handoff/expect", decl(t, "e2", []int{1}, rendezvous.Push, 150))
	r = s.ok("GET", fmt.Sprintf("/handoff/wait?id=e2&since=%d&timeout_ms=5000", p.Version), nil)
	if r.State != rendezvous.Expired || r.Settled {
		t.Fatalf("expiry while moving: %+v", r)
	}
	r = s.ok("GET", fmt.Sprintf("/handoff/wait?id=e2&since=%d&timeout_ms=5000", r.Version), nil)
	if r.State != rendezvous.Expired || !r.Settled || !strings.Contains(r.Reason, "never reported") {
		t.Fatalf("settle after grace: %+v", r)
	}
	// Finished transfers are dropped after the retention time.
	time.Sleep(600 * time.Millisecond)
	s.refused("GET", "/handoff/status?id=e1", nil, 404, errs.NotFound)
	s.refused("GET", "/handoff/status?id=e2", nil, 404, errs.NotFound)
	_, m := s.do("GET", "/metrics", nil)
	for _, want := range []string{`te_handoff_failures_total{reason="expired_unpaired"} 1`, `te_handoff_failures_total{reason="expired_moving"} 1`,
		`te_handoff_transfers{state="expired"} 0`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestWaitTimeoutAndShutdown(t *testing.T) {
	s := start(t, rendezvous.Config{})
	d := s.ok("POST", "/handoff/expect", decl(t, "w1", []int{1}, rendezvous.Push, 0))
	t0 := time.Now()
	r := s.ok("GET", fmt.Sprintf("/handoff/wait?id=w1&since=%d&timeout_ms=100", d.Version), nil)
	if r.Version != d.Version || time.Since(t0) < 80*time.Millisecond {
		t.Fatalf("timed-out wait returned %+v after %v", r, time.Since(t0))
	}
	// An already newer version returns at once.
	t0 = time.Now()
	s.ok("GET", "/handoff/wait?id=w1&since=0&timeout_ms=10000", nil)
	if time.Since(t0) > time.Second {
		t.Fatal("wait with an old version blocked")
	}
	// Shutdown ends a long poll instead of waiting for it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.do("GET", fmt.Sprintf("/handoff/wait?id=w1&since=%d&timeout_ms=30000", d.Version), nil)
	}()
	time.Sleep(100 * time.Millisecond)
	t0 = time.Now()
	s.stop()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("long poll survived shutdown")
	}
	if el := time.Since(t0); el > 3*time.Second {
		t.Fatalf("shutdown took %v", el)
	}
}
