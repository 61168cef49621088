package sidecar_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/cmd/te-sidecar/rendezvous"
	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/kvcache"
	"github.com/tecache/te/kvcache/handoff/proto"
)

// rawRequest sends req as it is on a new connection and reads one answer.
func rawRequest(t *testing.T, addr, req string, pause time.Duration) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pause)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%.40q: %v", req, err)
	}
	return resp
}

func declBody(t *testing.T, id string, blocks ...int) []byte {
	t.Helper()
	l := kvcache.Layout{Format: kvcache.VLLM, Order: kvcache.NHD, DType: kvcache.BF16, NumBlocks: 32,
		BlockSize: 16, NumHeads: 2, HeadDim: 64, Bases: []uint64{1 << 30, 1<<30 + 1<<24}}
	lb, _ := json.Marshal(&l)
	b, _ := json.Marshal(proto.Decl{ID: id, Segment: "127.0.0.1:1", Layout: lb, Blocks: blocks, Window: 7})
	return b
}

// TestEveryAnswerJSON: every refusal the sidecar answers, from its router,
// its connection handling, fasthttp's request reading, the metadata store
// or the handoff, is a JSON ErrorBody (nothing else in it) with the
// instance, a message and a code.
func TestEveryAnswerJSON(t *testing.T) {
	sec, err := authsecret.Parse("every-answer-json-test-secret-01")
	if err != nil {
		t.Fatal(err)
	}
	srv, base := serve(t, sidecar.Config{Secret: sec, MaxKeys: 1, HeaderTimeout: 300 * time.Millisecond,
		Handoff: rendezvous.Config{MaxBody: 4096, MaxTransfers: 2, ClientTransfers: 1}})
	addr := strings.TrimPrefix(base, "http://")
	tok := []string{"Authorization", "Bearer " + sec.Token()}
	named := func(name string) []string {
		return []string{"Authorization", "Bearer " + sec.ClientToken(name), proto.ClientHeader, name}
	}
	rec := func(b string) proto.Record {
		var r proto.Record
		json.Unmarshal([]byte(b), &r)
		return r
	}
	// Fill what the refusals below need.
	if c, b, _ := do(t, "PUT", base+"/metadata?key=a", []byte(`{}`), tok...); c != 200 {
		t.Fatalf("put: %d %s", c, b)
	}
	_, b, _ := do(t, "POST", base+"/handoff/expect", declBody(t, "p0", 1), named("d0")...)
	dcap := rec(b).Capability
	do(t, "POST", base+"/handoff/ready", declBody(t, "p0", 2), named("p0")...)
	do(t, "POST", base+"/handoff/expect", declBody(t, "p1", 1), named("d1")...)
	do(t, "POST", base+"/handoff/ready", declBody(t, "p1", 2), named("p1")...)

	type answer struct {
		name   string
		status int
		resp   func() (int, string, http.Header)
	}
	viaClient := func(method, path string, body []byte, hdr ...string) func() (int, string, http.Header) {
		return func() (int, string, http.Header) { return do(t, method, base+path, body, hdr...) }
	}
	viaRaw := func(req string, pause time.Duration) func() (int, string, http.Header) {
		return func() (int, string, http.Header) {
			resp := rawRequest(t, addr, req, pause)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(b), resp.Header
		}
	}
	big := bytes.Repeat([]byte("x"), 8192)
	for _, c := range []answer{
		{"no token", 401, viaClient("GET", "/handoff/status?id=p0", nil)},
		{"no token, metadata", 401, viaClient("PUT", "/metadata?key=b", []byte(`{}`))},
		{"no token, 100-continue", 401, viaRaw("POST /handoff/expect HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n", 0)},
		{"wrong client token", 401, viaClient("POST", "/handoff/expect", declBody(t, "q", 1),
			"Authorization", "Bearer "+sec.ClientToken("a"), proto.ClientHeader, "b")},
		{"unknown path", 404, viaClient("GET", "/nope", nil)},
		{"unknown id", 404, viaClient("GET", "/handoff/status?id=zz", nil, tok...)},
		{"missing key", 404, viaClient("GET", "/metadata?key=zz", nil, tok...)},
		{"method", 405, viaClient("DELETE", "/handoff/expect", nil, tok...)},
		{"undeclared parameter", 400, viaClient("GET", "/healthz?verbose=1", nil)},
		{"malformed JSON", 400, viaClient("POST", "/handoff/abort", []byte(`{"id":`), tok...)},
		{"unknown field", 400, viaClient("POST", "/handoff/abort", []byte(`{"id":"p0","reson":"x"}`), tok...)},
		{"no key", 400, viaClient("GET", "/metadata", nil, tok...)},
		{"malformed request", 400, viaRaw("NOT HTTP\r\n\r\n", 0)},
		{"header too large", 431, viaRaw("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 32<<10)+"\r\n\r\n", 0)},
		{"slow header", 408, viaRaw("GET /healthz HTTP/1.1\r\nHost: x\r\n", 0)},
		{"other side's role", 403, viaClient("GET", "/handoff/status?id=p0&role=prefill", nil, append(tok, proto.CapabilityHeader, dcap)...)},
		{"duplicate", 409, viaClient("POST", "/handoff/expect", declBody(t, "p0", 1), tok...)},
		{"body too large", 413, viaClient("POST", "/handoff/expect", big, tok...)},
		{"body too large, 100-continue", 413, viaRaw("POST /handoff/expect HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+sec.Token()+
			"\r\nExpect: 100-continue\r\nContent-Length: 8192\r\n\r\n", 0)},
		{"metadata full", 507, viaClient("PUT", "/metadata?key=b", []byte(`{}`), tok...)},
		{"table full", 503, viaClient("POST", "/handoff/expect", declBody(t, "p2", 1), named("d2")...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, body, h := c.resp()
			if status != c.status {
				t.Fatalf("status %d, want %d: %s", status, c.status, body)
			}
			if !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
				t.Fatalf("Content-Type %q", h.Get("Content-Type"))
			}
			var e struct {
				Instance string        `json:"instance"`
				Error    string        `json:"error"`
				Code     int32         `json:"code"`
				Record   *proto.Record `json:"record"`
			}
			d := json.NewDecoder(strings.NewReader(body))
			d.DisallowUnknownFields()
			if err := d.Decode(&e); err != nil || e.Error == "" || e.Code == 0 || e.Instance != srv.Handoff().Instance() {
				t.Fatalf("not an error body (%v): %s", err, body)
			}
		})
	}
	// Shutting down, /healthz says so in JSON too.
	go srv.Shutdown(t.Context())
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			break // closed already
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 503 {
			var h sidecar.Health
			if json.Unmarshal(b, &h) != nil || h.Status != "draining" {
				t.Fatalf("draining /healthz: %s", b)
			}
			break
		}
	}
}

// TestVersion: te-sidecar -version prints the version it was linked with
// (here by the test's -ldflags, as mk/meta.mk does) and exits 0;
// /healthz, /openapi.json and te_sidecar_build_info report it too.
func TestVersion(t *testing.T) {
	out, err := exec.Command(sidecarBinary(t), "-version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "te-sidecar " + testVersion + " (" + runtime.Version() + ")\n"; string(out) != want {
		t.Fatalf("-version printed %q, want %q", out, want)
	}
	d := startDaemon(t)
	resp, err := http.Get(d.base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var h sidecar.Health
	json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if h.Version != testVersion || h.Status != "ok" {
		t.Fatalf("/healthz: %+v", h)
	}
	_, m := post(t, "GET", d.base+"/metrics", nil, 0)
	if !strings.Contains(m, `te_sidecar_build_info{version="`+testVersion+`",go_version="`+runtime.Version()+`"} 1`) {
		t.Fatal("te_sidecar_build_info lacks the version")
	}
}

// checkExposition checks the Prometheus text format as promtool's linter
// and parser would: every family has one HELP (not empty) and one TYPE line
// before its samples, which are contiguous; names and label names use the
// allowed characters; counters end in _total and nothing else does;
// histograms have buckets up to +Inf, _sum and _count; values parse.
func checkExposition(t *testing.T, text string) (families int) {
	t.Helper()
	name := regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	sample := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$`)
	help, typ := map[string]string{}, map[string]string{}
	seen := map[string]bool{}
	parts := map[string]map[string]bool{}
	cur := ""
	for i, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if f, ok := strings.CutPrefix(l, "# HELP "); ok {
			n, h, _ := strings.Cut(f, " ")
			if _, dup := help[n]; dup || strings.TrimSpace(h) == "" || !name.MatchString(n) {
				t.Errorf("line %d: HELP %q (repeated, empty or a bad name)", i+1, l)
			}
			help[n] = h
			continue
		}
		if f, ok := strings.CutPrefix(l, "# TYPE "); ok {
			n, ty, _ := strings.Cut(f, " ")
			if _, dup := typ[n]; dup || help[n] == "" {
				t.Errorf("line %d: TYPE of %s repeated or before its HELP", i+1, n)
			}
			switch ty {
			case "counter", "gauge", "histogram", "summary":
			default:
				t.Errorf("line %d: type %q", i+1, ty)
			}
			if (ty == "counter") != strings.HasSuffix(n, "_total") {
				t.Errorf("%s is a %s: only counters end in _total, and every counter does", n, ty)
			}
			if ty != "histogram" && ty != "summary" && (strings.HasSuffix(n, "_count") || strings.HasSuffix(n, "_sum") || strings.HasSuffix(n, "_bucket")) {
				t.Errorf("%s is a %s with a histogram's suffix", n, ty)
			}
			typ[n] = ty
			cur = n
			if seen[n] {
				t.Errorf("family %s is split", n)
			}
			seen[n] = true
			families++
			continue
		}
		if strings.HasPrefix(l, "#") || l == "" {
			t.Errorf("line %d: %q", i+1, l)
			continue
		}
		m := sample.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("line %d: not a sample: %q", i+1, l)
			continue
		}
		if _, err := strconv.ParseFloat(m[3], 64); err != nil && m[3] != "+Inf" && m[3] != "-Inf" && m[3] != "NaN" {
			t.Errorf("line %d: value %q", i+1, m[3])
		}
		fam, suffix := m[1], ""
		if fam != cur {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(fam, s); ok && b == cur {
					fam, suffix = b, s
				}
			}
		}
		if fam != cur {
			t.Errorf("line %d: sample of %s outside its family (%s)", i+1, m[1], cur)
			continue
		}
		if parts[fam] == nil {
			parts[fam] = map[string]bool{}
		}
		parts[fam][suffix] = true
		if suffix == "_bucket" && strings.Contains(l, `le="+Inf"`) {
			parts[fam]["+Inf"] = true
		}
	}
	for f, ty := range typ {
		if ty == "histogram" && parts[f] != nil && !(parts[f]["+Inf"] && parts[f]["_sum"] && parts[f]["_count"]) {
			t.Errorf("histogram %s lacks +Inf, _sum or _count", f)
		}
	}
	return families
}

// TestMetricsExposition: after some traffic, /metrics is valid for the
// checker above and for promtool check metrics (when promtool is
// installed: Debian's prometheus package), Go and process families
// included; refusals and the connection bounds are counted.
func TestMetricsExposition(t *testing.T) {
	sec, err := authsecret.Parse("metrics-exposition-test-secret-1")
	if err != nil {
		t.Fatal(err)
	}
	_, base := serve(t, sidecar.Config{Secret: sec})
	tok := []string{"Authorization", "Bearer " + sec.Token()}
	do(t, "PUT", base+"/metadata?key=a", []byte(`{}`), tok...)
	do(t, "GET", base+"/metadata?key=a", nil)
	do(t, "POST", base+"/handoff/expect", declBody(t, "m0", 1), tok...)
	do(t, "GET", base+"/handoff/status?id=zz", nil, tok...)
	_, m, h := do(t, "GET", base+"/metrics", nil)
	if !strings.HasPrefix(h.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("Content-Type %q", h.Get("Content-Type"))
	}
	n := checkExposition(t, m)
	for _, want := range []string{"# TYPE go_goroutines gauge", "# TYPE process_resident_memory_bytes gauge",
		"# TYPE go_gc_duration_seconds summary", "# TYPE process_open_fds gauge", "# TYPE te_handoff_transfers_held gauge",
		`te_sidecar_refused_total{reason="unauthenticated"} 1`, `te_handoff_rejected_total{reason="not_found"} 1`,
		`te_sidecar_connections{state="authenticated"}`, "te_sidecar_connections_accepted_total"} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	t.Logf("%d families", n)
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not installed: checked by checkExposition only")
		return
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(m)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestRefusalLog: each refused request gets an info line with its route,
// source and reason, at most the rate a second (bursts of five times it):
// a flood of 300 refusals writes about 10 lines, and the rest are counted.
func TestRefusalLog(t *testing.T) {
	sec, err := authsecret.Parse("refusal-log-test-cluster-secret1")
	if err != nil {
		t.Fatal(err)
	}
	var buf syncBuffer
	log, err := sidecar.NewLogger(&buf, "json", 0)
	if err != nil {
		t.Fatal(err)
	}
	_, base := serve(t, sidecar.Config{Secret: sec, Logger: log, RefusalLogRate: 2})
	t0 := time.Now()
	for range 300 {
		if c, _, _ := do(t, "GET", base+"/handoff/status?id=x", nil); c != 401 {
			t.Fatalf("status %d", c)
		}
	}
	elapsed := time.Since(t0)
	var lines []map[string]any
	for l := range strings.Lines(buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m["msg"] == "request refused" {
			lines = append(lines, m)
		}
	}
	if max := 10 + 2*int(elapsed.Seconds()+1); len(lines) < 10 || len(lines) > max {
		t.Fatalf("%d refusal lines in %v, want 10..%d", len(lines), elapsed, max)
	}
	first := lines[0]
	if first["level"] != "INFO" || first["route"] != "/handoff/status" || first["status"] != float64(401) ||
		!strings.HasPrefix(fmt.Sprint(first["source"]), "127.0.0.1:") || !strings.Contains(fmt.Sprint(first["reason"]), "unauthenticated") {
		t.Fatalf("refusal line %v", first)
	}
	_, m, _ := do(t, "GET", base+"/metrics", nil)
	want := fmt.Sprintf("te_sidecar_refusal_logs_suppressed_total %d", 300-len(lines))
	if !strings.Contains(m, want) {
		t.Fatalf("metrics lack %q", want)
	}
}

// syncBuffer is a bytes.Buffer for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
