package sidecar_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
)

const envChild = "TE_SIDECAR_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		// Exactly what cmd/te-sidecar does.
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		code := sidecar.Main(ctx, os.Args[1:], os.Getenv, os.Stderr)
		stop()
		os.Exit(code)
	}
	goleak.VerifyTestMain(m,
		goleak.Cleanup(func(code int) {
			if binDir != "" {
				os.RemoveAll(binDir) // the te-sidecar binary the bound tests built
			}
			os.Exit(code)
		}),
		// fasthttp's server housekeeping: a worker-pool cleaner that sees
		// the shutdown on its next tick, and a process-wide clock.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"))
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func serve(t *testing.T, cfg sidecar.Config) (*sidecar.Server, string) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	s := sidecar.New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return s, "http://" + ln.Addr().String()
}

var client = &http.Client{Timeout: 5 * time.Second}

// isError reports whether body is a JSON error body with code and message.
func isError(body string, code int32, msg string) bool {
	var e struct {
		Instance string `json:"instance"`
		Error    string `json:"error"`
		Code     *int32 `json:"code"`
	}
	d := json.NewDecoder(strings.NewReader(body))
	d.DisallowUnknownFields()
	return d.Decode(&e) == nil && e.Code != nil && *e.Code == code && e.Error == msg && len(e.Instance) == 16
}

func do(t *testing.T, method, url string, body []byte, hdr ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// TestMetadataProtocol checks Mooncake's HTTP metadata protocol as its
// servers answer it.
func TestMetadataProtocol(t *testing.T) {
	_, base := serve(t, sidecar.Config{MaxValue: 1 << 10, MaxKeys: 3})
	u := base + "/metadata?key="
	if c, b, _ := do(t, "GET", u+"mooncake%2Fram%2Fa", nil); c != 404 || !isError(b, 19, "metadata not found") {
		t.Fatalf("missing key: %d %q", c, b)
	}
	if c, b, _ := do(t, "PUT", u+"mooncake%2Fram%2Fa", []byte(`{"name":"a"}`)); c != 200 || b != `{"status":"updated","key":"mooncake/ram/a"}` {
		t.Fatalf("put: %d %q", c, b)
	}
	c, b, h := do(t, "GET", u+"mooncake%2Fram%2Fa", nil)
	if c != 200 || b != `{"name":"a"}` || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
		t.Fatalf("get: %d %q %v", c, b, h)
	}
	do(t, "PUT", u+"mooncake%2Fram%2Fa", []byte(`{"name":"a2"}`))
	if _, b, _ := do(t, "GET", u+"mooncake%2Fram%2Fa", nil); b != `{"name":"a2"}` {
		t.Fatalf("last put wins: %q", b)
	}
	if c, b, _ := do(t, "DELETE", u+"mooncake%2Fram%2Fa", nil); c != 200 || b != `{"status":"deleted","key":"mooncake/ram/a"}` {
		t.Fatalf("delete: %d %q", c, b)
	}
	if c, _, _ := do(t, "DELETE", u+"mooncake%2Fram%2Fa", nil); c != 200 {
		t.Fatalf("delete of a missing key: %d", c)
	}
	if c, _, _ := do(t, "GET", u+"mooncake%2Fram%2Fa", nil); c != 404 {
		t.Fatalf("deleted key: %d", c)
	}
	// Bad requests.
	if c, _, _ := do(t, "GET", base+"/metadata", nil); c != 400 {
		t.Fatalf("no key: %d", c)
	}
	if c, _, _ := do(t, "GET", u+strings.Repeat("k", sidecar.MaxKeyLen+1), nil); c != 400 {
		t.Fatalf("oversized key: %d", c)
	}
	if c, _, h := do(t, "POST", u+"k", nil); c != 405 || h.Get("Allow") != "DELETE, GET, PUT" {
		t.Fatalf("POST: %d Allow=%q", c, h.Get("Allow"))
	}
	if c, _, _ := do(t, "GET", base+"/nothing", nil); c != 404 {
		t.Fatalf("unknown path: %d", c)
	}
	if c, _, _ := do(t, "PUT", u+"big", bytes.Repeat([]byte("x"), 2<<10)); c != 413 {
		t.Fatalf("oversized value: %d", c)
	}
	for i := 0; i < 3; i++ {
		if c, _, _ := do(t, "PUT", u+fmt.Sprint(i), []byte("v")); c != 200 {
			t.Fatalf("put %d: %d", i, c)
		}
	}
	if c, _, _ := do(t, "PUT", u+"3", []byte("v")); c != 507 {
		t.Fatalf("put beyond MaxKeys: %d", c)
	}
	if c, _, _ := do(t, "PUT", u+"2", []byte("v2")); c != 200 {
		t.Fatalf("overwrite when full: %d", c)
	}
}

func TestMetadataBytes(t *testing.T) {
	_, base := serve(t, sidecar.Config{MaxMetadataBytes: 100})
	u := base + "/metadata?key="
	if c, _, _ := do(t, "PUT", u+"a", bytes.Repeat([]byte("x"), 90)); c != 200 {
		t.Fatalf("put within the bytes: %d", c)
	}
	if c, _, _ := do(t, "PUT", u+"b", bytes.Repeat([]byte("x"), 20)); c != 507 {
		t.Fatalf("put over the bytes: %d", c)
	}
	if c, _, _ := do(t, "PUT", u+"a", bytes.Repeat([]byte("y"), 99)); c != 200 {
		t.Fatalf("overwrite within the bytes: %d", c)
	}
	if c, _, _ := do(t, "DELETE", u+"a", nil); c != 200 {
		t.Fatalf("delete: %d", c)
	}
	if c, _, _ := do(t, "PUT", u+"b", bytes.Repeat([]byte("x"), 20)); c != 200 {
		t.Fatalf("put after a delete: %d", c)
	}
}

func TestToken(t *testing.T) {
	_, base := serve(t, sidecar.Config{Token: "tok"})
	u := base + "/metadata?key=k"
	if c, _, h := do(t, "PUT", u, []byte("v")); c != 401 || h.Get("WWW-Authenticate") != "Bearer" {
		t.Fatalf("no token: %d", c)
	}
	if c, _, _ := do(t, "PUT", u, []byte("v"), "Authorization", "Bearer tok2"); c != 401 {
		t.Fatalf("wrong token: %d", c)
	}
	if c, _, _ := do(t, "PUT", u, []byte("v"), "Authorization", "Bearer tok"); c != 200 {
		t.Fatalf("right token: %d", c)
	}
	// Health and metrics stay open to probes and scrapers.
	if c, _, _ := do(t, "GET", base+"/healthz", nil); c != 200 {
		t.Fatalf("healthz: %d", c)
	}
}

// sampleLine is a sample of the text format; a label set may have a space
// after each comma, as Prometheus' parser allows.
var sampleLine = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",? ?)*\})? ([-+0-9.eE]+|NaN|[+-]Inf)$`)

func TestMetricsAndHealth(t *testing.T) {
	s, base := serve(t, sidecar.Config{Version: "1.2.3"})
	do(t, "PUT", base+"/metadata?key=a", []byte("12345"))
	do(t, "GET", base+"/metadata?key=a", nil)
	do(t, "GET", base+"/metadata?key=b", nil)
	do(t, "GET", base+"/no/such/path", nil)
	s.Handle("GET", "/extra", func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("hi") })
	if c, b, _ := do(t, "GET", base+"/extra", nil); c != 200 || b != "hi" {
		t.Fatalf("extra route: %d %q", c, b)
	}
	s.Metrics().Counter("te_test_things_total", "Things.", "kind").Add(2, `a"b\c`)

	c, b, _ := do(t, "GET", base+"/healthz", nil)
	var hz struct {
		Status, Version string
	}
	if c != 200 || json.Unmarshal([]byte(b), &hz) != nil || hz.Status != "ok" || hz.Version != "1.2.3" {
		t.Fatalf("healthz: %d %q", c, b)
	}
	c, body, h := do(t, "GET", base+"/metrics", nil)
	if c != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("metrics: %d %v", c, h)
	}
	for _, want := range []string{
		`te_sidecar_http_requests_total{route="/metadata",method="PUT",code="200"} 1`,
		`te_sidecar_http_requests_total{route="/metadata",method="GET",code="404"} 1`,
		`te_sidecar_http_requests_total{route="other",method="other",code="404"} 1`,
		`te_sidecar_http_requests_total{route="/extra",method="GET",code="200"} 1`,
		`te_sidecar_metadata_ops_total{op="get",result="not_found"} 1`,
		`te_sidecar_metadata_keys 1`,
		`te_sidecar_metadata_bytes 6`,
		`te_sidecar_http_request_duration_seconds_count{route="/metadata",method="GET"} 2`,
		`te_sidecar_http_request_duration_seconds_bucket{route="/metadata",method="GET",le="+Inf"} 2`,
		`te_sidecar_build_info{version="1.2.3",go_version="`,
		`te_test_things_total{kind="a\"b\\c"} 2`,
		"# TYPE te_sidecar_http_request_duration_seconds histogram",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
		if strings.HasPrefix(l, "# TYPE ") {
			name := strings.Fields(l)[2]
			if seen[name] {
				t.Errorf("family %s twice", name)
			}
			seen[name] = true
			continue
		}
		if strings.HasPrefix(l, "# HELP ") {
			continue
		}
		if !sampleLine.MatchString(l) {
			t.Errorf("not a sample line: %q", l)
		}
	}
}

func TestHistogramBuckets(t *testing.T) {
	m := sidecar.NewMetrics()
	h := m.Histogram("x_seconds", "X.", []float64{1, 0.1})
	for _, v := range []float64{0.05, 0.5, 5} {
		h.Observe(v)
	}
	var b bytes.Buffer
	m.WriteTo(&b)
	want := "# HELP x_seconds X.\n# TYPE x_seconds histogram\n" +
		"x_seconds_bucket{le=\"0.1\"} 1\nx_seconds_bucket{le=\"1\"} 2\nx_seconds_bucket{le=\"+Inf\"} 3\n" +
		"x_seconds_sum 5.55\nx_seconds_count 3\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
	// Same name, other type; an invalid name; a reserved label: not
	// exported, no panic.
	m.Counter("x_seconds", "again").Inc()
	m.Counter("bad name", "spaces").Inc()
	m.Gauge("y", "le is the histograms' label", "le").Set(1, "2")
	m.GaugeFunc("x_seconds", "again", func() float64 { return 1 })
	b.Reset()
	m.WriteTo(&b)
	if b.String() != want {
		t.Fatalf("a clashing registration changed the exposition:\n%s", b.String())
	}
}

// TestGracefulShutdown: a request in flight finishes; new connections are
// refused afterwards; /healthz says draining meanwhile.
func TestGracefulShutdown(t *testing.T) {
	s := sidecar.New(sidecar.Config{Logger: quiet()})
	release := make(chan struct{})
	started := make(chan struct{})
	s.Handle("GET", "/slow", func(ctx *fasthttp.RequestCtx) {
		close(started)
		<-release
		ctx.SetBodyString("done")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	base := "http://" + ln.Addr().String()
	var wg sync.WaitGroup
	wg.Add(1)
	var slowCode int
	var slowBody string
	go func() {
		defer wg.Done()
		slowCode, slowBody, _ = do(t, "GET", base+"/slow", nil)
	}()
	<-started
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	// Shutdown closes the listener first, then waits for the request.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("still accepting after Shutdown was called")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-shut:
		t.Fatalf("shutdown returned with a request in flight: %v", err)
	default:
	}
	close(release)
	wg.Wait()
	if slowCode != 200 || slowBody != "done" {
		t.Fatalf("in-flight request: %d %q", slowCode, slowBody)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Fatal("still accepting after shutdown")
	}
}

func TestParseOptions(t *testing.T) {
	env := map[string]string{"TE_SIDECAR_ADDR": "127.0.0.1:9", "TE_LOG_LEVEL": "debug", "MC_METADATA_HTTP_TOKEN": "t"}
	get := func(k string) string { return env[k] }
	o, err := sidecar.ParseOptions([]string{"-log-level", "warn"}, get, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Addr != "127.0.0.1:9" || o.LogLevel != "warn" || o.Token != "t" || o.LogFormat != "text" || o.ShutdownTimeout != 10*time.Second {
		t.Fatalf("%+v", o)
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"-log-level", "loud"}, nil},
		{[]string{"-log-format", "xml"}, nil},
		{[]string{"-max-keys", "0"}, nil},
		{[]string{"extra"}, nil},
		{[]string{"-nope"}, nil},
		{nil, map[string]string{"TE_SIDECAR_MAX_VALUE": "big"}},
		{nil, map[string]string{"TE_SIDECAR_SHUTDOWN_TIMEOUT": "soon"}},
		{nil, map[string]string{"TE_LOG_FORMAT": "xml"}},
		{[]string{"-reserved-conns", "4096"}, nil},
		{[]string{"-header-timeout", "0s"}, nil},
		{[]string{"-max-pending-conns-per-ip", "0"}, nil},
		{nil, map[string]string{"TE_SIDECAR_LOG_REFUSALS_PER_SECOND": "many"}},
	} {
		if _, err := sidecar.ParseOptions(c.args, func(k string) string { return c.env[k] }, io.Discard); err == nil {
			t.Errorf("%v %v: accepted", c.args, c.env)
		}
	}
	if code := sidecar.Main(context.Background(), []string{"-log-level", "loud"}, get, io.Discard); code != 2 {
		t.Fatalf("Main with a bad flag: exit %d", code)
	}
}

// TestProcess runs the daemon as cmd/te-sidecar does, in a child process:
// it serves, logs JSON, and exits 0 on SIGTERM.
func TestProcess(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-log-format", "json")
	cmd.Env = append(os.Environ(), envChild+"=1", "TE_SIDECAR_ADDR=127.0.0.1:0", "TE_LOG_LEVEL=debug")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan map[string]any, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				m = map[string]any{"unparsed": sc.Text()}
			}
			lines <- m
		}
	}()
	var addr string
	timeout := time.After(10 * time.Second)
	for addr == "" {
		select {
		case m, ok := <-lines:
			if !ok {
				t.Fatal("daemon exited before serving")
			}
			if m["unparsed"] != nil {
				t.Fatalf("log line is not JSON: %v", m["unparsed"])
			}
			if m["msg"] == "serving" {
				addr, _ = m["addr"].(string)
			}
		case <-timeout:
			t.Fatal("daemon did not log serving")
		}
	}
	base := "http://" + addr
	if c, _, _ := do(t, "PUT", base+"/metadata?key=k", []byte("v")); c != 200 {
		t.Fatalf("put: %d", c)
	}
	if c, b, _ := do(t, "GET", base+"/metadata?key=k", nil); c != 200 || b != "v" {
		t.Fatalf("get: %d %q", c, b)
	}
	if c, b, _ := do(t, "GET", base+"/metrics", nil); c != 200 || !strings.Contains(b, "go_gomaxprocs ") {
		t.Fatalf("metrics: %d", c)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	var msgs []string
	for m := range lines {
		if m["unparsed"] != nil {
			t.Fatalf("log line is not JSON: %v", m["unparsed"])
		}
		if m["level"] == nil || m["service"] != "te-sidecar" {
			t.Fatalf("log line without level or service: %v", m)
		}
		msgs = append(msgs, fmt.Sprint(m["msg"]))
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	if cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("exit code %d after SIGTERM, logs %v", cmd.ProcessState.ExitCode(), msgs)
	}
	if got := strings.Join(msgs, ","); !strings.Contains(got, "shutting down") || !strings.HasSuffix(got, "stopped") {
		t.Fatalf("logs after SIGTERM: %v", msgs)
	}
}

func ExampleServer_Handle() {
	s := sidecar.New(sidecar.Config{Logger: quiet()})
	handoffs := s.Metrics().Counter("te_sidecar_handoffs_total", "Handoffs by result.", "result")
	s.Handle("POST", "/handoff", func(ctx *fasthttp.RequestCtx) {
		handoffs.Inc("accepted")
		ctx.SetStatusCode(fasthttp.StatusAccepted)
	})
	var b bytes.Buffer
	handoffs.Inc("accepted")
	s.Metrics().WriteTo(&b)
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "te_sidecar_handoffs_total") {
			fmt.Println(l)
		}
	}
	// Output: te_sidecar_handoffs_total{result="accepted"} 1
}

// TestMaxConns: idle connections that never authenticated give way to
// newcomers (the oldest goes); once every slot is held by connections that
// authenticated, a newcomer is answered 503 in JSON and closed, and counted;
// it is served again once a connection goes.
func TestMaxConns(t *testing.T) {
	_, base := serve(t, sidecar.Config{MaxConns: 2, MaxConnsPerIP: 2, HeaderTimeout: time.Second})
	addr := strings.TrimPrefix(base, "http://")
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// roundTrip sends a request and reads the status line and body.
	roundTrip := func(c net.Conn, path string) (string, string) {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err.Error(), ""
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.Status, string(b)
	}
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}
	// Two idle connections: a third closes the older once it has had its
	// moment (HeaderTimeout/20) to send a request.
	idle := dial()
	dial()
	time.Sleep(100 * time.Millisecond)
	fresh := dial()
	if !closed(idle) {
		t.Fatal("the oldest idle connection was not closed for a newcomer")
	}
	if st, _ := roundTrip(fresh, "/metadata?key=k"); !strings.HasPrefix(st, "404") {
		t.Fatalf("the newcomer: %s", st)
	}
	// Two authenticated connections (no secret: any request on a route
	// that is not open authenticates): a third gets 503.
	a := dial()
	if st, _ := roundTrip(a, "/metadata?key=k"); !strings.HasPrefix(st, "404") {
		t.Fatalf("second connection: %s", st)
	}
	var st, body string
	for deadline := time.Now().Add(10 * time.Second); !strings.HasPrefix(st, "503"); {
		if time.Now().After(deadline) {
			t.Fatalf("a third connection got %q", st)
		}
		st, body = roundTrip(dial(), "/healthz")
	}
	if !isError(body, 24, "every connection slot is held by connections that authenticated (-max-conns): retry later") {
		t.Fatalf("503 body %q", body)
	}
	fresh.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if st, _ := roundTrip(dial(), "/healthz"); strings.HasPrefix(st, "200") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not served after a connection closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, m, _ := do(t, "GET", base+"/metrics", nil)
	for _, re := range []string{`te_sidecar_connections_refused_total\{reason="conns"\} [1-9]`,
		`te_sidecar_connections_evicted_total\{reason="pending"\} [1-9]`, `te_sidecar_connections_authenticated_total [2-9]`} {
		if !regexp.MustCompile(re).MatchString(m) {
			t.Errorf("metrics lack %s:\n%s", re, m)
		}
	}
}
