package engine_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/promcheck"
	"github.com/tecache/te/internal/sys/mem"
)

// tcpPair is two engines of this process that talk over tcp, a's segment
// handle to b, and a registered buffer on each.
func tcpPair(t *testing.T, mod ...func(*engine.Config)) (a, b *engine.Engine, s *engine.Segment, la, rb uint64) {
	t.Helper()
	tcp := func(c *engine.Config) { c.Transports = []string{"tcp"} }
	a, b = newEngine(t, append([]func(*engine.Config){tcp}, mod...)...), newEngine(t, tcp)
	ba, bb := alloc(t, 1<<20), alloc(t, 1<<20)
	if err := a.RegisterMemory(mem.Addr(ba), 1<<20, "cpu", true); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterMemory(mem.Addr(bb), 1<<20, "cpu", true); err != nil {
		t.Fatal(err)
	}
	s, err := a.OpenSegment(b.Name())
	if err != nil {
		t.Fatal(err)
	}
	return a, b, s, mem.Addr(ba), mem.Addr(bb)
}

func transfer(t *testing.T, a *engine.Engine, reqs ...engine.Request) {
	t.Helper()
	batch, err := a.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	defer batch.Free()
	if err := batch.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	if st, err := batch.Wait(time.Minute); err != nil || st.State != engine.Completed {
		t.Fatalf("batch %+v %v", st, err)
	}
}

// TestWriteMetrics: the exposition passes promlint (promtool's linter) with
// HELP and TYPE on every family, and counts what happened: tasks, bytes and
// the latency histogram of the transport and peer class that served them.
func TestWriteMetrics(t *testing.T) {
	a, _, s, la, rb := tcpPair(t)
	r := engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 4096}
	transfer(t, a, r, r, r)

	var buf bytes.Buffer
	if err := a.WriteMetrics(&buf); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	if problems := promcheck.Check(buf.Bytes()); len(problems) > 0 {
		t.Fatalf("exposition problems:\n%s\n\n%s", strings.Join(problems, "\n"), text)
	}
	for _, want := range []string{
		`te_tasks_total{state="completed"} 3`,
		`te_transferred_bytes_total 12288`,
		`te_task_duration_seconds_count{transport="tcp",peer="same_process"} 3`,
		`te_task_duration_seconds_bucket{transport="tcp",peer="same_process",le="+Inf"} 3`,
		`te_task_duration_seconds_count{transport="tcp",peer="other_host"} 0`,
		`te_route_info{segment="` + s.Name() + `",memory="host",transport="tcp"} 1`,
		`te_engine_info{version="` + engine.Version + `"`,
		`te_control_refused_total{reason="max_conns"} 0`,
		`te_transport_stat{transport="tcp",stat="conns_open"}`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in\n%s", want, text)
		}
	}
}

// TestStageHistograms: each batch of 256 requests or more adds one submit
// and one transfer observation to its transport's stage histograms, a Wait
// that blocked one wakeup, and the stages' sums stay within the batches'
// own time. Smaller batches are sampled: about one per 256 requests.
func TestStageHistograms(t *testing.T) {
	a, _, s, la, rb := tcpPair(t)
	const batches = 20
	r := engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 4 << 10}
	reqs := make([]engine.Request, 256)
	for i := range reqs {
		reqs[i] = r
		reqs[i].Local += uint64(i) * r.Length
		reqs[i].Remote += uint64(i) * r.Length
	}
	start := time.Now()
	for range batches {
		transfer(t, a, reqs...)
	}
	elapsed := time.Since(start).Seconds()
	var buf bytes.Buffer
	if err := a.WriteMetrics(&buf); err != nil {
		t.Fatal(err)
	}
	if problems := promcheck.Check(buf.Bytes()); len(problems) > 0 {
		t.Fatalf("exposition problems:\n%s", strings.Join(problems, "\n"))
	}
	value := func(series string) float64 {
		for _, l := range strings.Split(buf.String(), "\n") {
			if v, ok := strings.CutPrefix(l, series+" "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("%s: %v", l, err)
				}
				return f
			}
		}
		t.Fatalf("no %s in\n%s", series, buf.String())
		return 0
	}
	var sum float64
	for _, stage := range []string{"submit", "transfer", "wakeup"} {
		n := value(`te_batch_stage_seconds_count{transport="tcp",stage="` + stage + `"}`)
		v := value(`te_batch_stage_seconds_sum{transport="tcp",stage="` + stage + `"}`)
		t.Logf("%s: %v observations, %.1f µs in all", stage, n, v*1e6)
		switch {
		case stage != "wakeup" && n != batches:
			t.Errorf("%s: %v observations for %d batches", stage, n, batches)
		case stage == "wakeup" && (n < 1 || n > batches):
			t.Errorf("wakeup: %v observations for %d batches each waited once", n, batches)
		case v <= 0 && stage == "transfer":
			t.Errorf("transfer: no time in %d batches of 1 MiB over tcp", batches)
		}
		sum += v
	}
	st := a.Stats().Stages["tcp"]
	if st.Submits != batches || st.Transfers != batches || st.Wakeups != uint64(value(`te_batch_stage_seconds_count{transport="tcp",stage="wakeup"}`)) || st.TransferNS == 0 {
		t.Errorf("Stats.Stages[tcp] = %+v, unlike the metrics", st)
	}
	if sum > elapsed {
		t.Errorf("the stages add up to %.3f s, more than the %.3f s the batches took", sum, elapsed)
	}
	// A fresh batch of one request is timed with odds 2 in 256 (none of
	// 2400: 7e-9).
	const small = 2400
	for range small {
		transfer(t, a, r)
	}
	timed := a.Stats().Stages["tcp"].Submits - st.Submits
	t.Logf("%d batches of one request: %d timed", small, timed)
	if timed == 0 || timed > small/40 {
		t.Errorf("%d of %d single-request batches timed, want about 2 in 256", timed, small)
	}
}

// TestMetricsListener: MetricsAddr with no host serves /metrics on
// loopback, and Close stops it.
func TestMetricsListener(t *testing.T) {
	a := newEngine(t, func(c *engine.Config) { c.MetricsAddr = ":0" })
	addr := a.MetricsAddr()
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("metrics bound to %q, want loopback", addr)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if p := promcheck.Check(body); len(p) > 0 || !bytes.Contains(body, []byte("te_tasks_total")) {
		t.Fatalf("%v\n%s", p, body)
	}
	if resp, err := http.Post("http://"+addr+"/metrics", "text/plain", nil); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Fatalf("POST /metrics: %d", resp.StatusCode)
		}
	}
	a.Close()
	if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
		resp.Body.Close()
		t.Fatal("metrics still served after Close")
	}
}

// TestDebugLogLines: at debug level an engine says when it opened a segment
// and how each batch ended.
func TestDebugLogLines(t *testing.T) {
	var buf syncBuffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a, _, s, la, rb := tcpPair(t, func(c *engine.Config) { c.Logger = logger })
	transfer(t, a, engine.Request{Op: engine.Read, Local: la, Segment: s, Remote: rb, Length: 8192})
	out := buf.String()
	for _, want := range []string{`msg="te: segment opened" segment=` + s.Name(), `msg="te: batch finished" tasks=1 completed=1 failed=0 bytes=8192`,
		"transport=tcp", "elapsed="} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in the debug log:\n%s", want, out)
		}
	}
}

// syncBuffer is a bytes.Buffer that engine goroutines may log into.
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

// TestMetricsPortRange: an engine given a port range takes a free port of
// it (the ranks of a pod share one setting); one whose every port is taken
// runs without a listener rather than fail.
func TestMetricsPortRange(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port // taken: the range starts at a busy port
	if port > 65535-16 {
		t.Skip("no room for a range above the port the kernel gave")
	}
	a := newEngine(t, func(c *engine.Config) { c.MetricsAddr = fmt.Sprintf("127.0.0.1:%d-%d", port, port+16) })
	_, p, _ := net.SplitHostPort(a.MetricsAddr())
	if got, _ := strconv.Atoi(p); got <= port || got > port+16 {
		t.Fatalf("metrics on %q, want a port in (%d, %d]", a.MetricsAddr(), port, port+16)
	}
	// Every port taken: the engine starts, without a listener.
	b := newEngine(t, func(c *engine.Config) { c.MetricsAddr = fmt.Sprintf("127.0.0.1:%d-%d", port, port) })
	if b.MetricsAddr() != "" {
		t.Fatalf("a busy port gave a listener on %q", b.MetricsAddr())
	}
	for _, bad := range []string{"127.0.0.1:9-8", "127.0.0.1:0-5", "127.0.0.1:1000-2000", "127.0.0.1:x"} {
		if _, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"local"}, MetricsAddr: bad}); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

// TestMetricsListenerCapped: idle connections from one address past the
// metrics listener's per-host cap are closed at once (a flood no longer
// takes the process's descriptors), and a scraper from another address is
// served meanwhile.
func TestMetricsListenerCapped(t *testing.T) {
	a := newEngine(t, func(c *engine.Config) { c.MetricsAddr = "127.0.0.1:0" })
	addr := a.MetricsAddr()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 40 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	open := 0
	for _, c := range held {
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil && isTimeout(err) {
			open++ // still held by the server
		}
	}
	if open > 8 {
		t.Fatalf("%d of 40 idle connections from one address held open (cap 8)", open)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	cl := http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
}

// TestLiveGauges: what a peer costs is reported while it lives (tcp peers
// and connections dialled and accepted, control connections) in Stats and
// as gauges, and falls back to nothing dialled once it is gone, without
// waiting for the idle janitor.
func TestLiveGauges(t *testing.T) {
	a, b, s, la, rb := tcpPair(t)
	r := engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 4096}
	transfer(t, a, r)
	st := a.Stats()
	l := st.Live["tcp"]
	if l.Peers != 1 || l.ConnsDialed < 1 || st.Control.Peers != 1 || st.Control.PeerConnsOpen != 1 {
		t.Fatalf("a peer after a transfer: live %+v, control %+v", l, st.Control)
	}
	// Both engines are in this process: what a dialled, b accepted.
	if acc := b.Stats().Live["tcp"].ConnsAccepted; acc != l.ConnsDialed {
		t.Fatalf("b accepted %d tcp connections, a dialled %d", acc, l.ConnsDialed)
	}
	var buf bytes.Buffer
	if err := a.WriteMetrics(&buf); err != nil {
		t.Fatal(err)
	}
	if p := promcheck.Check(buf.Bytes()); len(p) > 0 {
		t.Fatalf("exposition problems: %v", p)
	}
	for _, want := range []string{
		`te_transport_peers{transport="tcp"} 1`,
		`te_transport_connections{transport="tcp",direction="dialed"} ` + strconv.Itoa(l.ConnsDialed),
		`te_transport_connections{transport="tcp",direction="accepted"} 0`,
		`te_control_peer_connections 1`,
		`te_control_peers 1`,
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("missing %q in\n%s", want, buf.String())
		}
	}
	b.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st = a.Stats()
		l = st.Live["tcp"]
		if l.Peers == 0 && l.ConnsDialed == 0 && st.Control.Peers == 0 && st.Control.PeerConnsOpen == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the peer closed, a still holds: live %+v, control peers %d, connections %d",
				l, st.Control.Peers, st.Control.PeerConnsOpen)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
