package rendezvous_test

import (
	"github.com/tecache/te/kvcache/handoff/proto"

	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/cmd/te-sidecar/rendezvous"
	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache"
)

func TestMain(m *testing.M) {
	// fasthttp's worker pool cleaner sleeps on after Shutdown (it exits at
	// its next tick); it is not ours to stop.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"))
}

type server struct {
	t    *testing.T
	base string
	srv  *sidecar.Server
	svc  *rendezvous.Service
	hc   *http.Client
	once sync.Once
}

// start serves a real te-sidecar server with the handoff configured with
// cfg on 127.0.0.1.
func start(t *testing.T, cfg rendezvous.Config) *server {
	return startWith(t, sidecar.Config{Handoff: cfg})
}

func startWith(t *testing.T, cfg sidecar.Config) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	srv := sidecar.New(cfg)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s := &server{t: t, base: "http://" + ln.Addr().String(), srv: srv, svc: srv.Handoff(),
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
	})
}

// do sends a request with the given header pairs (e.g. the capability) and
// returns the status and body.
func (s *server) do(method, path string, body any, hdr ...string) (int, []byte) {
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
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
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
	if got := resp.Header.Get(proto.InstanceHeader); strings.HasPrefix(path, "/handoff/") && resp.StatusCode != 405 &&
		resp.StatusCode != 401 && resp.StatusCode != 413 && got != s.svc.Instance() {
		s.t.Errorf("%s %s: instance header %q, want %q", method, path, got, s.svc.Instance())
	}
	return resp.StatusCode, out
}

// cp is the header pair that presents a capability.
func cp(capability string) []string { return []string{proto.CapabilityHeader, capability} }

// ok sends a request that must succeed and returns the record.
func (s *server) ok(method, path string, body any, hdr ...string) proto.Record {
	s.t.Helper()
	code, b := s.do(method, path, body, hdr...)
	if code != 200 {
		s.t.Fatalf("%s %s: %d %s", method, path, code, b)
	}
	var r proto.Record
	if err := json.Unmarshal(b, &r); err != nil {
		s.t.Fatal(err)
	}
	if r.Instance != s.svc.Instance() {
		s.t.Fatalf("record instance %q, want %q", r.Instance, s.svc.Instance())
	}
	return r
}

// refused sends a request that must fail with status and code.
func (s *server) refused(method, path string, body any, status int, code errs.Code, hdr ...string) proto.ErrorBody {
	s.t.Helper()
	got, b := s.do(method, path, body, hdr...)
	var e proto.ErrorBody
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

func decl(t *testing.T, id string, blocks []int, mode proto.Mode, timeoutMS int64) proto.Decl {
	return proto.Decl{ID: id, Segment: "127.0.0.1:1", Layout: layout(t, 32, 1<<30), Blocks: blocks, Mode: mode, TimeoutMS: timeoutMS, Window: 7}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// polling waits until n long polls wait in the table.
func (s *server) polling(n int) {
	s.t.Helper()
	eventually(s.t, 5*time.Second, fmt.Sprintf("%d long polls waiting", n), func() bool { return s.svc.Usage().LongPolls >= n })
}

var capRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestPushRendezvous(t *testing.T) {
	s := start(t, rendezvous.Config{})
	d := s.ok("POST", "/handoff/expect", decl(t, "r1", []int{7, 3, 9}, proto.Push, 0))
	if d.State != proto.Waiting || !d.Expect || d.Ready || d.Peer != nil || d.Mode != proto.Push || d.ExpiresInMS <= 0 || !(d.Version > 0) {
		t.Fatalf("after expect: %+v", d)
	}
	p := s.ok("POST", "/handoff/ready", decl(t, "r1", []int{1, 2, 3}, "", 0))
	if p.State != proto.Transferring || p.Peer == nil || p.Peer.Segment != "127.0.0.1:1" || fmt.Sprint(p.Peer.Blocks) != "[7 3 9]" {
		t.Fatalf("prefill (the pusher) should learn decode's declaration: %+v", p)
	}
	if !capRE.MatchString(d.Capability) || !capRE.MatchString(p.Capability) || d.Capability == p.Capability {
		t.Fatalf("capabilities %q and %q: want two different 128-bit values", d.Capability, p.Capability)
	}
	// Decode is not the mover: it never gets prefill's declaration.
	w := s.ok("GET", fmt.Sprintf("/handoff/wait?id=r1&role=decode&since=%d&timeout_ms=5000", d.Version), nil, cp(d.Capability)...)
	if w.State != proto.Transferring || w.Peer != nil || w.Capability != "" {
		t.Fatalf("decode wait: %+v", w)
	}
	// A long poll returns when the state changes.
	got := make(chan proto.Record, 1)
	go func() {
		code, b := s.do("GET", fmt.Sprintf("/handoff/wait?id=r1&since=%d&timeout_ms=10000", w.Version), nil, cp(d.Capability)...)
		var r proto.Record
		if code != 200 || json.Unmarshal(b, &r) != nil {
			t.Errorf("wait: %d %s", code, b)
		}
		got <- r
	}()
	s.polling(1)
	c := s.ok("POST", "/handoff/complete", proto.Complete{ID: "r1", OK: true, Bytes: 12345, Requests: 3, Seconds: 0.01}, cp(p.Capability)...)
	if c.State != proto.Done || !c.Settled || c.Bytes != 12345 {
		t.Fatalf("complete: %+v", c)
	}
	select {
	case r := <-got:
		if r.State != proto.Done || r.Version != c.Version {
			t.Fatalf("long poll returned %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("long poll did not return on completion")
	}
	st := s.ok("GET", "/handoff/status?id=r1", nil, cp(d.Capability)...)
	if st.State != proto.Done || st.Requests != 3 || st.Bytes != 12345 || st.ExpiresInMS != 0 {
		t.Fatalf("status: %+v", st)
	}
	// Completing twice or aborting a finished transfer conflicts.
	e := s.refused("POST", "/handoff/complete", proto.Complete{ID: "r1", OK: true}, 409, errs.OK, cp(p.Capability)...)
	if e.Record == nil || e.Record.State != proto.Done {
		t.Fatalf("conflict body %+v", e)
	}
	s.refused("POST", "/handoff/abort", proto.Abort{ID: "r1"}, 409, errs.OK, cp(d.Capability)...)
	if u := s.svc.Usage(); u.Bytes != 0 || u.Clients != 0 || u.Transfers != 1 {
		t.Fatalf("a finished transfer still holds %+v", u)
	}

	_, m := s.do("GET", "/metrics", nil)
	for _, want := range []string{
		`te_handoff_transfers_total{mode="push",state="done"} 1`,
		`te_handoff_bytes_total{mode="push"} 12345`,
		`te_handoff_requests_total{mode="push"} 3`,
		`te_handoff_transfers_held{state="done"} 1`,
		`te_handoff_transfers_held{state="waiting"} 0`,
		`te_handoff_transfer_seconds_count{mode="push"} 1`,
		`te_handoff_move_seconds_sum{mode="push"} 0.01`,
		`te_handoff_pair_wait_seconds_count 1`,
		`te_handoff_seconds_count{mode="push",state="done"} 1`,
		`te_handoff_rejected_total{reason="conflict"} 2`,
		`te_handoff_declaration_bytes 0`,
		`te_handoff_long_polls 0`,
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
	p := s.ok("POST", "/handoff/ready", decl(t, "r2", []int{4, 5}, proto.Pull, 0))
	if p.State != proto.Waiting || p.Mode != proto.Pull {
		t.Fatalf("ready: %+v", p)
	}
	d := s.ok("POST", "/handoff/expect", decl(t, "r2", []int{0, 1}, proto.Pull, 0))
	if d.State != proto.Transferring || d.Peer == nil || fmt.Sprint(d.Peer.Blocks) != "[4 5]" {
		t.Fatalf("decode (the puller) should learn prefill's declaration: %+v", d)
	}
	if r := s.ok("GET", "/handoff/status?id=r2&role=prefill", nil, cp(p.Capability)...); r.Peer != nil {
		t.Fatalf("prefill is not the mover in pull mode: %+v", r)
	}
	// In pull mode prefill cannot report the outcome.
	s.refused("POST", "/handoff/complete", proto.Complete{ID: "r2", OK: true}, 403, errs.Unauthenticated, cp(p.Capability)...)
	f := s.ok("POST", "/handoff/complete", proto.Complete{ID: "r2", OK: false, Code: int32(errs.PeerUnreachable), Reason: "boom"}, cp(d.Capability)...)
	if f.State != proto.Failed || errs.Code(f.Code) != errs.PeerUnreachable || !strings.Contains(f.Reason, "boom") || !f.Settled {
		t.Fatalf("failed complete: %+v", f)
	}
	_, m := s.do("GET", "/metrics", nil)
	if !strings.Contains(string(m), `te_handoff_failures_total{reason="peer_unreachable"} 1`) {
		t.Errorf("metrics:\n%s", m)
	}
}

// TestCapabilities: nobody but the two sides learns or changes anything
// about a transfer, not even whether it exists: a missing or forged
// capability gets the answer an unknown id gets (404, NotFound, the same
// message but for the id, the same metrics label). Only the mover reports
// its outcome.
func TestCapabilities(t *testing.T) {
	s := start(t, rendezvous.Config{})
	d := s.ok("POST", "/handoff/expect", decl(t, "c1", []int{1, 2}, proto.Push, 0))
	p := s.ok("POST", "/handoff/ready", decl(t, "c1", []int{3, 4}, "", 0))
	forged := strings.Repeat("0", 32)
	for _, hdr := range [][]string{nil, cp(forged), cp(d.Capability + "0"), cp(strings.ToUpper(p.Capability))} {
		for _, id := range []string{"c1", "c2"} { // c2 does not exist
			e := []proto.ErrorBody{
				s.refused("POST", "/handoff/complete", proto.Complete{ID: id, OK: true, Bytes: 1}, 404, errs.NotFound, hdr...),
				s.refused("POST", "/handoff/abort", proto.Abort{ID: id, Reason: "forged"}, 404, errs.NotFound, hdr...),
				s.refused("GET", "/handoff/status?id="+id, nil, 404, errs.NotFound, hdr...),
				s.refused("GET", "/handoff/wait?id="+id+"&since=0", nil, 404, errs.NotFound, hdr...),
			}
			for _, b := range e {
				want := fmt.Sprintf("no transfer %q for the capability presented (header X-Te-Capability) on sidecar instance %s", id, b.Instance)
				if b.Error != want || b.Record != nil {
					t.Fatalf("refusal for %s tells more than an unknown id's: %+v", id, b)
				}
			}
		}
	}
	// The waiting side cannot forge the mover's outcome, nor claim to be it.
	s.refused("POST", "/handoff/complete", proto.Complete{ID: "c1", OK: true, Bytes: 1}, 403, errs.Unauthenticated, cp(d.Capability)...)
	s.refused("GET", "/handoff/status?id=c1&role=prefill", nil, 403, errs.Unauthenticated, cp(d.Capability)...)
	s.refused("POST", "/handoff/abort", proto.Abort{ID: "c1", Role: proto.Prefill}, 403, errs.Unauthenticated, cp(d.Capability)...)
	// A second declaration of a side learns neither declaration nor a
	// capability.
	e := s.refused("POST", "/handoff/ready", decl(t, "c1", []int{3, 4}, "", 0), 409, errs.InvalidArgument)
	if e.Record == nil || e.Record.Peer != nil || e.Record.Capability != "" {
		t.Fatalf("duplicate declaration answered %+v", e.Record)
	}
	if r := s.ok("GET", "/handoff/status?id=c1", nil, cp(d.Capability)...); r.State != proto.Transferring || r.Peer != nil {
		t.Fatalf("forgeries changed the transfer: %+v", r)
	}
	if r := s.ok("GET", "/handoff/status?id=c1", nil, cp(p.Capability)...); r.Peer == nil {
		t.Fatalf("the mover's status lacks the peer: %+v", r)
	}
	s.ok("POST", "/handoff/complete", proto.Complete{ID: "c1", OK: true, Bytes: 7}, cp(p.Capability)...)
	_, m := s.do("GET", "/metrics", nil)
	for _, want := range []string{`te_handoff_rejected_total{reason="capability"} 3`, `te_handoff_rejected_total{reason="not_found"} 32`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("refusals not counted as %s:\n%s", want, m)
		}
	}
}

func TestBadRequests(t *testing.T) {
	s := start(t, rendezvous.Config{MaxTransfers: 3, MaxBody: 64 << 10})
	good := decl(t, "x", []int{1}, proto.Push, 0)
	for _, c := range []struct {
		name string
		path string
		body any
	}{
		{"invalid JSON", "/handoff/expect", `{"id":`},
		{"empty body", "/handoff/ready", ``},
		{"JSON array", "/handoff/ready", `[1,2]`},
		{"trailing garbage", "/handoff/complete", `{"id":"x"} x`},
		{"no id", "/handoff/expect", proto.Decl{Segment: "s", Layout: good.Layout, Blocks: []int{1}}},
		{"control char in id", "/handoff/expect", proto.Decl{ID: "a\x01", Segment: "s", Layout: good.Layout, Blocks: []int{1}}},
		{"long id", "/handoff/expect", proto.Decl{ID: strings.Repeat("a", 257), Segment: "s", Layout: good.Layout, Blocks: []int{1}}},
		{"no segment", "/handoff/expect", proto.Decl{ID: "x", Layout: good.Layout, Blocks: []int{1}}},
		{"no layout", "/handoff/expect", proto.Decl{ID: "x", Segment: "s", Blocks: []int{1}}},
		{"layout not an object", "/handoff/expect", proto.Decl{ID: "x", Segment: "s", Layout: json.RawMessage(`"vllm"`), Blocks: []int{1}}},
		{"invalid layout", "/handoff/expect", proto.Decl{ID: "x", Segment: "s", Layout: json.RawMessage(`{"format":"vllm","dtype":"bf16"}`), Blocks: []int{1}}},
		{"no blocks", "/handoff/expect", proto.Decl{ID: "x", Segment: "s", Layout: good.Layout}},
		{"block out of range", "/handoff/ready", proto.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{32}}},
		{"negative block", "/handoff/ready", proto.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{-1}}},
		{"duplicate destination block", "/handoff/expect", proto.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{2, 2}}},
		{"bad mode", "/handoff/expect", proto.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{1}, Mode: "both"}},
		{"negative timeout", "/handoff/expect", proto.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{1}, TimeoutMS: -1}},
		{"huge timeout", "/handoff/expect", proto.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{1}, TimeoutMS: 1 << 50}},
		{"abort bad role", "/handoff/abort", proto.Abort{ID: "x", Role: "router"}},
		{"no window", "/handoff/expect", proto.Decl{ID: "x", Segment: "s", Layout: good.Layout, Blocks: []int{1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s.refused("POST", c.path, c.body, 400, errs.InvalidArgument)
		})
	}
	// Strict decoding: a misspelt field is named, not mistaken for a
	// missing one; so is one inside the layout, and a wrong type.
	layout := string(good.Layout)
	for _, c := range []struct{ path, body, want string }{
		{"/handoff/expect", `{"id":"x","segmnt":"s","layout":` + layout + `,"blocks":[1]}`, `unknown field "segmnt"`},
		{"/handoff/ready", `{"id":"x","segment":"s","layout":` + strings.Replace(layout, `"block_size"`, `"blok_size"`, 1) + `,"blocks":[1]}`,
			`layout: unknown field "blok_size"`},
		{"/handoff/complete", `{"id":"x","ok":true,"bytes":1,"extra":0}`, `unknown field "extra"`},
		{"/handoff/abort", `{"id":"x","reson":"typo"}`, `unknown field "reson"`},
		{"/handoff/expect", `{"id":"x","segment":"s","layout":` + layout + `,"blocks":"1"}`, `field "blocks": a JSON string where an array is expected`},
	} {
		e := s.refused("POST", c.path, c.body, 400, errs.InvalidArgument)
		if !strings.HasSuffix(e.Error, c.want) || strings.Contains(e.Error, "json:") {
			t.Errorf("%s %s: %q, want it to end with %q", c.path, c.body, e.Error, c.want)
		}
	}
	// Undeclared query parameters are refused by name.
	if e := s.refused("GET", "/handoff/status?id=x&rol=decode", nil, 400, errs.InvalidArgument); !strings.Contains(e.Error, `unknown query parameter "rol"`) {
		t.Errorf("undeclared parameter: %q", e.Error)
	}
	if e := s.refused("GET", "/handoff/wait?id=x&id=y", nil, 400, errs.InvalidArgument); !strings.Contains(e.Error, "given twice") {
		t.Errorf("repeated parameter: %q", e.Error)
	}
	s.refused("GET", "/handoff/status", nil, 400, errs.InvalidArgument)
	s.refused("GET", "/handoff/wait?id=x&since=-1", nil, 400, errs.InvalidArgument)
	s.refused("GET", "/handoff/wait?id=x&timeout_ms=soon", nil, 400, errs.InvalidArgument)
	s.refused("GET", "/handoff/status?id=x&role=router", nil, 400, errs.InvalidArgument)
	// A body over the limit is refused whole, with an answer the client
	// reads.
	big := decl(t, "big", make([]int, 40000), proto.Push, 0)
	s.refused("POST", "/handoff/ready", big, 413, errs.ResourceExhausted)

	// Unknown ids.
	s.refused("GET", "/handoff/status?id=nope", nil, 404, errs.NotFound)
	s.refused("GET", "/handoff/wait?id=nope&timeout_ms=10", nil, 404, errs.NotFound)
	s.refused("POST", "/handoff/complete", proto.Complete{ID: "nope", OK: true}, 404, errs.NotFound)
	s.refused("POST", "/handoff/abort", proto.Abort{ID: "nope"}, 404, errs.NotFound)

	// Duplicates and conflicts.
	x := s.ok("POST", "/handoff/expect", good)
	e := s.refused("POST", "/handoff/expect", good, 409, errs.InvalidArgument)
	if e.Record == nil || e.Record.State != proto.Waiting || !strings.Contains(e.Error, "already declared") {
		t.Fatalf("duplicate: %+v", e)
	}
	s.refused("POST", "/handoff/complete", proto.Complete{ID: "x", OK: true}, 409, errs.OK, cp(x.Capability)...) // not paired
	s.refused("POST", "/handoff/ready", decl(t, "x", []int{1}, proto.Pull, 0), 409, errs.InvalidArgument)
	if r := s.ok("GET", "/handoff/status?id=x", nil, cp(x.Capability)...); r.State != proto.Waiting || r.Ready {
		t.Fatalf("a refused declaration changed the transfer: %+v", r)
	}
	// Method not allowed comes from the sidecar's router.
	if code, _ := s.do("GET", "/handoff/expect", nil); code != 405 {
		t.Fatalf("GET /handoff/expect: %d", code)
	}
	// The table is bounded; unpaired transfers of the only client are not
	// evicted for that client's own next one.
	s.ok("POST", "/handoff/expect", decl(t, "y", []int{1}, proto.Push, 0))
	s.ok("POST", "/handoff/expect", decl(t, "z", []int{1}, proto.Push, 0))
	s.refused("POST", "/handoff/expect", decl(t, "w", []int{1}, proto.Push, 0), 503, errs.ResourceExhausted)

	_, m := s.do("GET", "/metrics", nil)
	for _, want := range []string{`te_handoff_rejected_total{reason="invalid"}`, `te_handoff_rejected_total{reason="not_found"} 4`,
		`te_handoff_rejected_total{reason="duplicate"} 1`, `te_handoff_rejected_total{reason="full"} 1`, `te_handoff_transfers_held{state="waiting"} 3`,
		`te_handoff_rejected_total{reason="too_large"} 1`, `te_sidecar_refused_total{reason="too_large"} 1`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestMismatchFailsAtPairing(t *testing.T) {
	s := start(t, rendezvous.Config{})
	s.ok("POST", "/handoff/expect", decl(t, "m", []int{1, 2}, proto.Push, 0))
	// Three prefill blocks for two decode blocks.
	r := s.ok("POST", "/handoff/ready", decl(t, "m", []int{1, 2, 3}, "", 0))
	if r.State != proto.Failed || errs.Code(r.Code) != errs.InvalidArgument || !r.Settled || !strings.Contains(r.Reason, "do not match") {
		t.Fatalf("mismatch: %+v", r)
	}
	// A dtype mismatch too.
	s.ok("POST", "/handoff/expect", decl(t, "m2", []int{1}, proto.Push, 0))
	d := decl(t, "m2", []int{1}, "", 0)
	d.Layout = json.RawMessage(strings.Replace(string(d.Layout), `"bf16"`, `"fp16"`, 1))
	if r := s.ok("POST", "/handoff/ready", d); r.State != proto.Failed || !strings.Contains(r.Reason, "dtype") {
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
	d := s.ok("POST", "/handoff/expect", decl(t, "a1", []int{1}, proto.Push, 0))
	a := s.ok("POST", "/handoff/abort", proto.Abort{ID: "a1", Role: proto.Decode, Reason: "client went away"}, cp(d.Capability)...)
	if a.State != proto.Aborted || !a.Settled || a.AbortBy != proto.Decode || errs.Code(a.Code) != errs.Canceled || !strings.Contains(a.Reason, "client went away") {
		t.Fatalf("abort: %+v", a)
	}
	e := s.refused("POST", "/handoff/ready", decl(t, "a1", []int{1}, "", 0), 409, errs.Canceled)
	if e.Record == nil || e.Record.State != proto.Aborted {
		t.Fatalf("late ready: %+v", e)
	}
	// While moving: aborted but not settled until the mover reports.
	d = s.ok("POST", "/handoff/expect", decl(t, "a2", []int{1}, proto.Push, 0))
	p := s.ok("POST", "/handoff/ready", decl(t, "a2", []int{1}, "", 0))
	a = s.ok("POST", "/handoff/abort", proto.Abort{ID: "a2"}, cp(p.Capability)...)
	if a.State != proto.Aborted || a.Settled || a.AbortBy != proto.Prefill {
		t.Fatalf("abort while moving: %+v", a)
	}
	// Only the mover's report settles it.
	s.refused("POST", "/handoff/complete", proto.Complete{ID: "a2", OK: true, Bytes: 10}, 403, errs.Unauthenticated, cp(d.Capability)...)
	e = s.refused("POST", "/handoff/complete", proto.Complete{ID: "a2", OK: true, Bytes: 10}, 409, errs.Canceled, cp(p.Capability)...)
	if e.Record == nil || !e.Record.Settled || e.Record.State != proto.Aborted {
		t.Fatalf("late complete: %+v", e)
	}
	s.refused("POST", "/handoff/abort", proto.Abort{ID: "a2"}, 409, errs.Canceled, cp(d.Capability)...)
	_, m := s.do("GET", "/metrics", nil)
	for _, want := range []string{`te_handoff_failures_total{reason="aborted_by_decode"} 1`, `te_handoff_failures_total{reason="aborted_by_prefill"} 1`,
		`te_handoff_transfers_held{state="aborted"} 2`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestExpiry(t *testing.T) {
	s := start(t, rendezvous.Config{SettleGrace: 300 * time.Millisecond, Retain: 300 * time.Millisecond})
	// Unpaired: expires at its deadline, settled.
	d := s.ok("POST", "/handoff/expect", decl(t, "e1", []int{1}, proto.Push, 100))
	t0 := time.Now()
	r := s.ok("GET", fmt.Sprintf("/handoff/wait?id=e1&since=%d&timeout_ms=5000", d.Version), nil, cp(d.Capability)...)
	if r.State != proto.Expired || !r.Settled || errs.Code(r.Code) != errs.Timeout || !strings.Contains(r.Reason, "prefill never declared") {
		t.Fatalf("expiry: %+v", r)
	}
	if el := time.Since(t0); el < 50*time.Millisecond {
		t.Fatalf("expired after %v, want about 100ms", el)
	}
	// Paired but never completed: expired, then settled after the grace.
	p := s.ok("POST", "/handoff/ready", decl(t, "e2", []int{1}, "", 150))
	s.ok("POST", "/handoff/expect", decl(t, "e2", []int{1}, proto.Push, 150))
	r = s.ok("GET", "/handoff/status?id=e2", nil, cp(p.Capability)...)
	for r.State != proto.Expired {
		r = s.ok("GET", fmt.Sprintf("/handoff/wait?id=e2&since=%d&timeout_ms=5000", r.Version), nil, cp(p.Capability)...)
	}
	if r.Settled {
		t.Fatalf("expiry while moving settled at once: %+v", r)
	}
	r = s.ok("GET", fmt.Sprintf("/handoff/wait?id=e2&since=%d&timeout_ms=5000", r.Version), nil, cp(p.Capability)...)
	if r.State != proto.Expired || !r.Settled || !strings.Contains(r.Reason, "never reported") {
		t.Fatalf("settle after grace: %+v", r)
	}
	// Finished transfers are dropped after the retention time.
	eventually(t, 5*time.Second, "finished transfers dropped", func() bool { return s.svc.Usage().Transfers == 0 })
	s.refused("GET", "/handoff/status?id=e1", nil, 404, errs.NotFound, cp(d.Capability)...)
	s.refused("GET", "/handoff/status?id=e2", nil, 404, errs.NotFound, cp(p.Capability)...)
	_, m := s.do("GET", "/metrics", nil)
	for _, want := range []string{`te_handoff_failures_total{reason="expired_unpaired"} 1`, `te_handoff_failures_total{reason="expired_moving"} 1`,
		`te_handoff_transfers_held{state="expired"} 0`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestWaitTimeoutAndShutdown(t *testing.T) {
	s := start(t, rendezvous.Config{})
	d := s.ok("POST", "/handoff/expect", decl(t, "w1", []int{1}, proto.Push, 0))
	t0 := time.Now()
	r := s.ok("GET", fmt.Sprintf("/handoff/wait?id=w1&since=%d&timeout_ms=100", d.Version), nil, cp(d.Capability)...)
	if r.Version != d.Version || time.Since(t0) < 80*time.Millisecond {
		t.Fatalf("timed-out wait returned %+v after %v", r, time.Since(t0))
	}
	// An already newer version returns at once.
	t0 = time.Now()
	s.ok("GET", "/handoff/wait?id=w1&since=0&timeout_ms=30000", nil, cp(d.Capability)...)
	if time.Since(t0) > 20*time.Second {
		t.Fatal("wait with an old version blocked")
	}
	// Shutdown ends a long poll instead of waiting for it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.do("GET", fmt.Sprintf("/handoff/wait?id=w1&since=%d&timeout_ms=30000", d.Version), nil, cp(d.Capability)...)
	}()
	s.polling(1)
	t0 = time.Now()
	s.stop()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("long poll survived shutdown")
	}
	if el := time.Since(t0); el > 20*time.Second {
		t.Fatalf("shutdown took %v", el)
	}
}

// TestMoverNamedToBothSides: once a transfer pairs, both sides (and only
// they) learn the mover's segment, in push and pull mode, and still after
// the transfer ended and its declarations were released: the waiting side
// binds its window to that engine.
func TestMoverNamedToBothSides(t *testing.T) {
	s := start(t, rendezvous.Config{})
	for _, c := range []struct {
		mode  proto.Mode
		mover string
	}{{proto.Push, "prefill:1"}, {proto.Pull, "decode:1"}} {
		id := "m-" + string(c.mode)
		dd := decl(t, id, []int{1, 2}, c.mode, 0)
		dd.Segment = "decode:1"
		pd := decl(t, id, []int{3, 4}, "", 0)
		pd.Segment = "prefill:1"
		d := s.ok("POST", "/handoff/expect", dd)
		if d.Mover != "" {
			t.Fatalf("%s: a mover named before pairing: %+v", c.mode, d)
		}
		p := s.ok("POST", "/handoff/ready", pd)
		if p.Mover != c.mover {
			t.Fatalf("%s: prefill's record names mover %q, want %q", c.mode, p.Mover, c.mover)
		}
		if r := s.ok("GET", "/handoff/status?id="+id, nil, cp(d.Capability)...); r.Mover != c.mover {
			t.Fatalf("%s: decode's record names mover %q, want %q", c.mode, r.Mover, c.mover)
		}
		// A second declaration learns nothing about the pairing.
		if e := s.refused("POST", "/handoff/ready", pd, 409, errs.InvalidArgument); e.Record == nil || e.Record.Mover != "" {
			t.Fatalf("%s: duplicate declaration answered %+v", c.mode, e.Record)
		}
		moverCap, otherCap := p.Capability, d.Capability
		if c.mode == proto.Pull {
			moverCap, otherCap = d.Capability, p.Capability
		}
		s.ok("POST", "/handoff/complete", proto.Complete{ID: id, OK: true, Bytes: 7}, cp(moverCap)...)
		if r := s.ok("GET", "/handoff/status?id="+id, nil, cp(otherCap)...); r.State != proto.Done || r.Mover != c.mover {
			t.Fatalf("%s: after the transfer, the waiting side's record: %+v", c.mode, r)
		}
	}
}
