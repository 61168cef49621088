package sidecar_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tecache/te/internal/authsecret"
)

// daemon is the te-sidecar binary in a child process, built without the
// race detector (whose shadow memory would dwarf what is measured), so
// that its memory is measured alone and as deployed.
type daemon struct {
	base string
	pid  int
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string // removed by TestMain
)

// testVersion is the version the test binary is linked with, as mk/meta.mk
// links a release.
const testVersion = "v0.0.0-test"

// sidecarBinary builds cmd/te-sidecar once per test run.
func sidecarBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		// go test puts its own go first on PATH (and sets GOROOT).
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		}
		if binDir, binErr = os.MkdirTemp("", "te-sidecar-test"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "te-sidecar")
		out, err := exec.Command(gobin, "build", "-ldflags", "-X github.com/tecache/te/cmd/te-sidecar/sidecar.Version="+testVersion,
			"-o", binPath, "github.com/tecache/te/cmd/te-sidecar").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build ./cmd/te-sidecar: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func startDaemon(t *testing.T, env ...string) daemon {
	t.Helper()
	cmd := exec.Command(sidecarBinary(t), "-log-format", "json", "-log-level", "info")
	cmd.Env = append(os.Environ(), append([]string{"TE_SIDECAR_ADDR=127.0.0.1:0"}, env...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "serving" {
				a, _ := m["addr"].(string)
				addr <- a
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Error("te-sidecar did not stop on SIGTERM")
		}
	})
	select {
	case a := <-addr:
		return daemon{base: "http://" + a, pid: cmd.Process.Pid}
	case <-time.After(20 * time.Second):
		t.Fatal("te-sidecar did not log serving")
	}
	return daemon{}
}

// peakRSS is the process's peak resident set (VmHWM), in bytes.
func (d daemon) peakRSS(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// gen is a body of n bytes: prefix, then "0," repeated, then suffix,
// generated as it is read.
type gen struct {
	prefix, suffix string
	n, off         int64
}

var zeros = []byte(strings.Repeat("0,", 16<<10))

func (g *gen) Read(p []byte) (int, error) {
	if g.off >= g.n {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), g.n-g.off)]
	pre, suf := int64(len(g.prefix)), int64(len(g.suffix))
	switch {
	case g.off < pre:
		p = p[:copy(p, g.prefix[g.off:])]
	case g.off >= g.n-suf:
		p = p[:copy(p, g.suffix[g.off-(g.n-suf):])]
	default:
		// The filler stays on an even phase: "0," pairs from the prefix.
		p = p[:min(int64(len(p)), g.n-suf-g.off)]
		ph := (g.off - pre) % 2
		p = p[:copy(p, zeros[ph:])]
	}
	g.off += int64(len(p))
	return len(p), nil
}

const layoutJSON = `{"format":"vllm","order":"NHD","dtype":"bf16","num_blocks":16,"block_size":16,"num_heads":2,"head_dim":64,"bases":[4096]}`

// declaration returns a prefill declaration body of about n bytes: blocks
// of id 0 (prefill may repeat a block).
func declaration(id string, n int64) *gen {
	prefix := `{"id":"` + id + `","segment":"127.0.0.1:1","window":7,"timeout_ms":600000,"layout":` + layoutJSON + `,"blocks":[`
	suffix := `0]}`
	if (n-int64(len(prefix)+len(suffix)))%2 != 0 {
		n++
	}
	return &gen{prefix: prefix, suffix: suffix, n: n}
}

func post(t *testing.T, method, url string, body io.Reader, n int64, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = n // -1: chunked
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v (the server must answer, not reset the connection)", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// filler is what raw bodies are made of.
var filler = []byte(strings.Repeat("0,", 128<<10))

// rawPost sends method path with a body of n bytes (chunked when chunked)
// over a plain connection, as fast as loopback takes it, and returns the
// answer's status and body. It fails the test when the connection is reset
// instead of answered.
func rawPost(t *testing.T, base, method, path string, n int64, chunked bool, hdr ...string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	var h strings.Builder
	fmt.Fprintf(&h, "%s %s HTTP/1.1\r\nHost: te-sidecar\r\nContent-Type: application/json\r\n", method, path)
	if chunked {
		h.WriteString("Transfer-Encoding: chunked\r\n")
	} else {
		fmt.Fprintf(&h, "Content-Length: %d\r\n", n)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&h, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	h.WriteString("\r\n")
	if _, err := io.WriteString(c, h.String()); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	if len(hdr) > 0 && hdr[len(hdr)-1] == "100-continue" {
		// The sidecar answers before the body is sent.
		return readAnswer(t, br, method)
	}
	chunk := fmt.Appendf(nil, "%x\r\n", len(filler))
	for sent := int64(0); sent < n; {
		b := filler[:min(int64(len(filler)), n-sent)]
		if chunked {
			if len(b) < len(filler) {
				chunk = fmt.Appendf(chunk[:0], "%x\r\n", len(b))
			}
			if _, err := c.Write(chunk); err != nil {
				t.Fatalf("%s %s: connection reset after %d bytes instead of an answer: %v", method, path, sent, err)
			}
		}
		if _, err := c.Write(b); err != nil {
			t.Fatalf("%s %s: connection reset after %d bytes instead of an answer: %v", method, path, sent, err)
		}
		if chunked {
			c.Write([]byte("\r\n"))
		}
		sent += int64(len(b))
	}
	if chunked {
		io.WriteString(c, "0\r\n\r\n")
	}
	return readAnswer(t, br, method)
}

func readAnswer(t *testing.T, br *bufio.Reader, method string) (int, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestBodyLimits: bodies over a route's limit get a 413 that the client
// reads (not a reset), whether their length is announced or chunked, and
// the sidecar's memory does not grow with them: a 100 MB body, and the 60
// declarations of 15 MiB that took it from 37 MB to 988 MB. A client that
// asks first (Expect: 100-continue) is refused before it sends the body.
func TestBodyLimits(t *testing.T) {
	d := startDaemon(t)
	base := d.peakRSS(t)
	const mb100 = 100_000_000
	for _, c := range []struct {
		method, path string
		chunked      bool
	}{
		{"PUT", "/metadata?key=big", false},
		{"POST", "/handoff/expect", true},
	} {
		code, msg := rawPost(t, d.base, c.method, c.path, mb100, c.chunked)
		if code != 413 || !strings.Contains(msg, "limit") {
			t.Fatalf("%s %s with a 100 MB body (chunked %v): %d %q", c.method, c.path, c.chunked, code, msg)
		}
	}
	for i := range 60 {
		var hdr []string
		if i%2 == 1 {
			hdr = []string{"Expect", "100-continue"}
		}
		code, msg := rawPost(t, d.base, "POST", "/handoff/ready", 15<<20, false, hdr...)
		if code != 413 || (hdr == nil && !strings.Contains(msg, `"code":24`)) {
			t.Fatalf("declaration %d of 15 MiB (%q): %d %q", i, hdr, code, msg)
		}
	}
	grew := d.peakRSS(t) - base
	t.Logf("peak RSS %d MiB at start, grew %d MiB over 200 MB of refused bodies and 60 refused declarations of 15 MiB", base>>20, grew>>20)
	if grew > 64<<20 {
		t.Fatalf("peak RSS grew by %d MiB", grew>>20)
	}
	code, m := post(t, "GET", d.base+"/metrics", nil, 0)
	if code != 200 || !strings.Contains(m, `te_sidecar_refused_total{reason="too_large"} 62`) {
		t.Fatalf("refusals not counted: %d\n%s", code, m)
	}
	// The daemon still serves.
	if code, _ := post(t, "PUT", d.base+"/metadata?key=k", strings.NewReader("v"), 1); code != 200 {
		t.Fatalf("put after the attack: %d", code)
	}
}

// TestDeclarationBudget: declarations within the body limit are held up to
// the per-client and total budgets, past which clients get 429 and 503; the
// client holding the most loses its unpaired declarations first when the
// table is full; the sidecar's memory stays bounded by the budgets. The
// budgets are a quarter of the defaults (8 and 32 MiB instead of 32 and 128)
// to keep the test short; the arithmetic is the same. The clients are the
// local host (the cluster token) and 40 named clients with their client
// tokens.
func TestDeclarationBudget(t *testing.T) {
	const clientBytes, maxBytes = 8 << 20, 32 << 20
	const secret = "declaration-budget-test-secret-01"
	sec, err := authsecret.Parse(secret)
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, fmt.Sprint("TE_SIDECAR_HANDOFF_CLIENT_BYTES=", clientBytes), fmt.Sprint("TE_SIDECAR_HANDOFF_MAX_BYTES=", maxBytes),
		authsecret.EnvSecret+"="+secret)
	base := d.peakRSS(t)
	// 256 Ki blocks: about 512 KiB of JSON and 2 MiB held each.
	const blocks = 1 << 18
	size := int64(len(declaration("x", 0).prefix)) + 2*blocks + 1
	count := map[int]int{}
	for i := range 20 {
		body := declaration(fmt.Sprint("one", i), size)
		code, msg := post(t, "POST", d.base+"/handoff/ready", body, body.n, "Authorization", "Bearer "+sec.Token())
		if code != 200 && !strings.Contains(msg, `"code":24`) {
			t.Fatalf("declaration %d: %d %q", i, code, msg)
		}
		count[code]++
	}
	if count[200] != 3 || count[429] != 17 {
		t.Fatalf("one client: %v, want 3 accepted and 17 refused with 429", count)
	}
	// Many clients: the total budget, for which the first client, holding
	// the most, loses its unpaired declarations first.
	clear(count)
	for i := range 40 {
		body := declaration(fmt.Sprint("many", i), size)
		name := fmt.Sprint("engine-", i)
		code, msg := post(t, "POST", d.base+"/handoff/ready", body, body.n, "X-Te-Client", name, "Authorization", "Bearer "+sec.ClientToken(name))
		if code != 200 && !strings.Contains(msg, `"code":24`) {
			t.Fatalf("declaration %d: %d %q", i, code, msg)
		}
		count[code]++
	}
	if count[200] != 15 || count[503] != 25 {
		t.Fatalf("many clients: %v, want 15 accepted and 25 refused with 503", count)
	}
	grew := d.peakRSS(t) - base
	t.Logf("peak RSS %d MiB at start, grew %d MiB holding 15 declarations of 2 MiB under a %d MiB budget", base>>20, grew>>20, maxBytes>>20)
	// The declarations held, the garbage of decoding them (the collector
	// lets the heap reach twice what is live) and the buffers of requests.
	if grew > 3*maxBytes+32<<20 {
		t.Fatalf("peak RSS grew by %d MiB", grew>>20)
	}
	_, m := post(t, "GET", d.base+"/metrics", nil, 0)
	for _, want := range []string{`te_handoff_rejected_total{reason="client_quota"} 17`, `te_handoff_rejected_total{reason="full"} 25`,
		`te_handoff_failures_total{reason="evicted"} 3`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	var held int64
	for _, l := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(l, "te_handoff_declaration_bytes "); ok {
			held, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if held < 15*blocks*8 || held > maxBytes {
		t.Errorf("held %d bytes of declarations, want 15 of 2 MiB within %d", held, maxBytes)
	}
}
