package interop_test

import (
	_ "github.com/tecache/te/engine/std"

	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/engine/transport/tcp"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// te-sidecar's fasthttp housekeeping (see cmd/te-sidecar/sidecar's tests).
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"))
}

// EnvMooncakeDir names the directory of the Mooncake fixtures when they are
// not at ../shared/interop/mooncake beside the repository.
const EnvMooncakeDir = "TE_MOONCAKE_INTEROP_DIR"

// mooncakeDir returns the fixtures' directory, or skips the test when there
// is none (a plain clone). A directory named in the environment must hold
// them.
func mooncakeDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(EnvMooncakeDir)
	named := dir != ""
	if !named {
		wd, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		for root := wd; ; root = filepath.Dir(root) {
			if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
				dir = filepath.Join(root, "..", "shared", "interop", "mooncake")
				break
			}
			if filepath.Dir(root) == root {
				t.Skip("Mooncake interop: repository root not found")
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "mc_peer")); err != nil {
		if named {
			t.Fatalf("%s=%s holds no mc_peer: %v", EnvMooncakeDir, dir, err)
		}
		t.Skipf("Mooncake interop fixtures not found at %s (a plain clone; set %s): %v", dir, EnvMooncakeDir, err)
	}
	return dir
}

// tail keeps the last bytes written to it, for failure messages.
type tail struct {
	mu sync.Mutex
	b  []byte
}

func (w *tail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > 16<<10 {
		w.b = w.b[len(w.b)-(8<<10):]
	}
	return len(p), nil
}

func (w *tail) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}

func mcEnv(dir string) []string {
	return append(os.Environ(), "GLOG_logtostderr=1", "MC_TCP_BIND_ADDRESS=127.0.0.1", "LD_LIBRARY_PATH="+dir)
}

// mcTarget is a running `mc_peer target`.
type mcTarget struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	done   chan struct{}
	stderr *tail
	Info   struct {
		Segment string `json:"segment"`
		Addr    uint64 `json:"addr"`
		Size    uint64 `json:"size"`
	}
}

// checksum is the line mc_peer target prints when asked.
type checksum struct {
	CRC        uint32 `json:"crc32"`
	Size       uint64 `json:"size"`
	Notifies   int    `json:"notifies"`
	LastNotify string `json:"last_notify"`
}

func startMcTarget(t *testing.T, dir string, args ...string) *mcTarget {
	t.Helper()
	args = append([]string{"target", "--on-eof", "exit", "--timeout", "120"}, args...)
	p := &mcTarget{t: t, lines: make(chan string, 8), done: make(chan struct{}), stderr: &tail{}}
	p.cmd = exec.Command(filepath.Join(dir, "mc_peer"), args...)
	p.cmd.Env = mcEnv(dir)
	p.cmd.Stderr = p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start mc_peer (are Mooncake's runtime packages installed? .ci/deps.d/interop.pkgs): %v", err)
	}
	go func() {
		defer close(p.done)
		s := bufio.NewScanner(out)
		for s.Scan() {
			select {
			case p.lines <- s.Text():
			default:
			}
		}
		p.cmd.Wait()
	}()
	t.Cleanup(func() {
		p.stdin.Close()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	if err := json.Unmarshal([]byte(p.line(30*time.Second)), &p.Info); err != nil || p.Info.Segment == "" || p.Info.Addr == 0 {
		t.Fatalf("mc_peer target announced nothing usable (%v); stderr:\n%s", err, p.stderr)
	}
	return p
}

func (p *mcTarget) line(d time.Duration) string {
	p.t.Helper()
	select {
	case l := <-p.lines:
		return l
	case <-p.done:
		p.t.Fatalf("mc_peer target exited (%v); stderr:\n%s", p.cmd.ProcessState, p.stderr)
	case <-time.After(d):
		p.t.Fatalf("mc_peer target said nothing within %v; stderr:\n%s", d, p.stderr)
	}
	return ""
}

// finish closes the target's stdin and returns the checksum it then prints.
func (p *mcTarget) finish() checksum {
	p.t.Helper()
	p.stdin.Close()
	var c checksum
	if err := json.Unmarshal([]byte(p.line(15*time.Second)), &c); err != nil {
		p.t.Fatal(err)
	}
	return c
}

// initiatorResult is mc_peer initiator's JSON line.
type initiatorResult struct {
	OK         bool   `json:"ok"`
	Written    uint64 `json:"written"`
	Read       uint64 `json:"read"`
	Mismatches uint64 `json:"mismatches"`
	Error      string `json:"error"`
	CRCSrc     uint32 `json:"crc32_src"`
	CRCRead    uint32 `json:"crc32_read"`
	Notify     string `json:"notify"`
}

func runMcInitiator(t *testing.T, dir string, args ...string) initiatorResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "mc_peer"), append([]string{"initiator", "--timeout", "30"}, args...)...)
	cmd.Env = mcEnv(dir)
	stderr := &tail{}
	cmd.Stderr = stderr
	out, err := cmd.Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var r initiatorResult
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &r); jerr != nil {
		t.Fatalf("mc_peer initiator %v: %v, output %q; stderr:\n%s", args, err, out, stderr)
	}
	if r.OK != (err == nil) {
		t.Fatalf("mc_peer initiator: ok %v but exit %v", r.OK, err)
	}
	if !r.OK {
		t.Logf("mc_peer initiator %v: %s", args, r.Error)
	}
	return r
}

// mcPattern is mc_peer's write pattern: P ^ (((i*2654435761) mod 2^32) >> 24).
func mcPattern(n int, p byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = p ^ byte((uint32(i)*2654435761)>>24)
	}
	return b
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newEngine(t *testing.T, mod func(*engine.Config)) *engine.Engine {
	t.Helper()
	cfg := engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"},
		TransferTimeout: 20 * time.Second, Logger: quiet()}
	if mod != nil {
		mod(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func register(t *testing.T, e *engine.Engine, n int, remote bool) []byte {
	t.Helper()
	b, err := mem.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Free(b) }) // after the engine's Close (cleanups run in reverse)
	if err := e.RegisterMemory(mem.Addr(b), uint64(n), "cpu", remote); err != nil {
		t.Fatal(err)
	}
	return b
}

// transfer moves [local, local+n) to or from seg at remote in 64 KiB
// requests, one batch, and fails the test unless every one completed.
func transfer(t *testing.T, e *engine.Engine, seg *engine.Segment, op engine.Opcode, local []byte, remote uint64) {
	t.Helper()
	const block = 64 << 10
	var reqs []engine.Request
	for off := 0; off < len(local); off += block {
		n := min(block, len(local)-off)
		reqs = append(reqs, engine.Request{Op: op, Local: mem.Addr(local) + uint64(off), Segment: seg, Remote: remote + uint64(off), Length: uint64(n)})
	}
	b, err := e.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if err := b.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	st, err := b.Wait(30 * time.Second)
	if err != nil || st.State != engine.Completed {
		t.Fatalf("%v batch: %+v %v", op, st, err)
	}
	if ts, _ := b.TaskStatus(0); ts.Transport != "tcp" {
		t.Fatalf("transport %q", ts.Transport)
	}
}

func waitNotify(t *testing.T, e *engine.Engine, msg string) engine.Notification {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range e.Notifies() {
			if n.Msg == msg {
				return n
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("notification %q did not arrive", msg)
	return engine.Notification{}
}

func unchanged(t *testing.T, what string, b []byte, want []byte) {
	t.Helper()
	if !bytes.Equal(b, want) {
		i := 0
		for i < len(b) && b[i] == want[i] {
			i++
		}
		t.Fatalf("%s: te's memory changed at %d", what, i)
	}
}

const size = 2 << 20

// TestMooncakeToTe: Mooncake's initiator (mc_peer, on Mooncake's C API) opens
// a te engine in peer-to-peer mode (Mooncake's Metadata exchange), writes,
// reads back and checks, and notifies; te finds the bytes in its memory and
// the notification in its queue. A WRITE outside te's registered range is
// rejected and reported FAILED by Mooncake; an engine that does not accept
// Mooncake peers makes every Mooncake WRITE fail, never "complete".
func TestMooncakeToTe(t *testing.T) {
	dir := mooncakeDir(t)
	e := newEngine(t, func(c *engine.Config) { c.AcceptMooncakePeers = true })
	buf := register(t, e, size, true)
	fill := bytes.Repeat([]byte{0xAB}, size)
	copy(buf, fill)
	addr := strconv.FormatUint(mem.Addr(buf), 10)

	r := runMcInitiator(t, dir, "--metadata", "P2PHANDSHAKE", "--segment", e.Name(), "--remote-addr", addr,
		"--size", "2M", "--block", "64K", "--op", "both", "--pattern", "0xCD", "--notify", "hello-te")
	if !r.OK || r.Written != size || r.Read != size || r.Mismatches != 0 || r.Notify != "sent" {
		t.Fatalf("mc_peer initiator: %+v", r)
	}
	want := mcPattern(size, 0xCD)
	unchanged(t, "after Mooncake's writes", buf, want)
	if c := crc32.ChecksumIEEE(buf); c != r.CRCSrc || c != r.CRCRead {
		t.Fatalf("crc32 of te's memory %d, Mooncake wrote %d and read %d", c, r.CRCSrc, r.CRCRead)
	}
	waitNotify(t, e, "hello-te")

	// Half inside, half past the end of te's buffer.
	r = runMcInitiator(t, dir, "--metadata", "P2PHANDSHAKE", "--segment", e.Name(),
		"--remote-addr", strconv.FormatUint(mem.Addr(buf)+size-32<<10, 10),
		"--size", "64K", "--block", "64K", "--op", "write", "--pattern", "0x11")
	if r.OK || r.Error == "" {
		t.Fatalf("write past te's buffer: %+v", r)
	}
	unchanged(t, "after a rejected write", buf, want)

	off := newEngine(t, nil)
	obuf := register(t, off, size, true)
	copy(obuf, fill)
	r = runMcInitiator(t, dir, "--metadata", "P2PHANDSHAKE", "--segment", off.Name(),
		"--remote-addr", strconv.FormatUint(mem.Addr(obuf), 10), "--size", "256K", "--block", "64K", "--op", "write", "--pattern", "0x22")
	if r.OK {
		t.Fatalf("a Mooncake write to an engine that does not accept Mooncake peers reported ok: %+v", r)
	}
	unchanged(t, "engine not accepting Mooncake peers", obuf, fill)
}

// TestTeToMooncake: te opens a Mooncake engine (mc_peer target) in
// peer-to-peer mode, reads its fill, writes, reads back, notifies and probes
// it; Mooncake's own checksum of its memory matches what te wrote. Driven
// below the engine, te's initiator gets Mooncake's rejection of a WRITE past
// its buffer, and the requests behind it on that connection go out again on
// a new one and succeed.
func TestTeToMooncake(t *testing.T) {
	dir := mooncakeDir(t)
	mc := startMcTarget(t, dir, "--metadata", "P2PHANDSHAKE", "--name", "127.0.0.1", "--size", "2M", "--fill", "0xAB")
	e := newEngine(t, nil)
	seg, err := e.OpenSegment(mc.Info.Segment)
	if err != nil {
		t.Fatalf("open %s: %v", mc.Info.Segment, err)
	}
	d, _ := seg.Descriptor()
	if !d.IsMooncake() || d.TCPProtoVersion != 2 || len(d.Buffers) != 1 || d.Buffers[0].Addr != mc.Info.Addr {
		t.Fatalf("Mooncake's descriptor as te sees it: %+v", d)
	}
	local := register(t, e, size, false)
	transfer(t, e, seg, engine.Read, local[:64<<10], mc.Info.Addr)
	unchanged(t, "Mooncake's fill read by te", local[:64<<10], bytes.Repeat([]byte{0xAB}, 64<<10))
	want := mcPattern(size, 0x5A)
	copy(local, want)
	transfer(t, e, seg, engine.Write, local, mc.Info.Addr)
	clear(local)
	transfer(t, e, seg, engine.Read, local, mc.Info.Addr)
	unchanged(t, "read back from Mooncake", local, want)
	if err := e.SendNotify(mc.Info.Segment, e.Name(), "hello-mc"); err != nil {
		t.Fatal(err)
	}
	if p, err := e.Probe(mc.Info.Segment); err != nil || p.Name != mc.Info.Segment {
		t.Fatalf("probe: %+v %v", p, err)
	}

	// Below the engine (which would refuse an address the descriptor
	// lacks), against Mooncake's own target.
	tr := tcp.New()
	if err := tr.Start(hostFor(map[string]string{"tcp.conns": "2", "tcp.slice": "1MiB"})); err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	big := d.Clone()
	big.Buffers[0].Length += 1 << 20
	res := make(chan [2]any, 8)
	var reqs []transport.Request
	for i := 0; i < 6; i++ {
		remote := mc.Info.Addr + uint64(i)*(64<<10)
		if i == 2 {
			remote = mc.Info.Addr + size // past Mooncake's buffer
		}
		reqs = append(reqs, transport.Request{Op: transport.Write, Local: mem.Addr(local) + uint64(i)*(64<<10), Remote: remote, Length: 64 << 10,
			Peer: big, Buffer: &big.Buffers[0], Index: i, Owner: transport.CompleteFunc(func(i int, err error) { res <- [2]any{i, err} })})
	}
	copy(local, want)
	tr.Submit(reqs)
	for range reqs {
		select {
		case x := <-res:
			i, err := x[0].(int), x[1]
			if i == 2 {
				if e, _ := err.(error); errs.CodeOf(e) != errs.AddressNotRegistered {
					t.Fatalf("write past Mooncake's buffer: %v", err)
				}
			} else if err != nil {
				t.Fatalf("request %d beside a rejected one: %v", i, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("requests did not finish")
		}
	}

	c := mc.finish()
	if c.Size != size || c.CRC != crc32.ChecksumIEEE(want) {
		t.Fatalf("Mooncake's checksum %+v, te wrote crc32 %d", c, crc32.ChecksumIEEE(want))
	}
	if c.Notifies < 1 || !strings.HasSuffix(c.LastNotify, "hello-mc") {
		t.Fatalf("Mooncake's notifications: %+v", c)
	}
}

// TestMooncakeHTTPMetadata: te and Mooncake share an HTTP metadata server,
// Mooncake's own and te-sidecar's in turn: each opens the other by name and
// moves bytes both ways.
func TestMooncakeHTTPMetadata(t *testing.T) {
	dir := mooncakeDir(t)
	servers := map[string]func(t *testing.T) string{
		"mooncake": func(t *testing.T) string { return startMooncakeMetadata(t, dir) },
		"sidecar":  startSidecar,
	}
	for _, name := range []string{"mooncake", "sidecar"} {
		t.Run(name, func(t *testing.T) {
			url := servers[name](t)
			e := newEngine(t, func(c *engine.Config) {
				c.Metadata, c.SegmentName, c.AcceptMooncakePeers = url, "te_tgt_"+name, true
			})
			buf := register(t, e, 1<<20, true)
			r := runMcInitiator(t, dir, "--metadata", url, "--name", "mc_init_"+name, "--segment", e.Name(),
				"--remote-addr", strconv.FormatUint(mem.Addr(buf), 10), "--size", "1M", "--block", "64K", "--op", "both", "--pattern", "0x77")
			if !r.OK || r.Mismatches != 0 {
				t.Fatalf("mc_peer initiator: %+v", r)
			}
			unchanged(t, "after Mooncake's writes", buf, mcPattern(1<<20, 0x77))

			mc := startMcTarget(t, dir, "--metadata", url, "--name", "mc_tgt_"+name, "--size", "1M", "--fill", "0x01")
			seg, err := e.OpenSegment("mc_tgt_" + name)
			if err != nil {
				t.Fatal(err)
			}
			if d, _ := seg.Descriptor(); !d.IsMooncake() || !strings.HasPrefix(d.RPC, "127.0.0.1:") {
				t.Fatalf("descriptor %+v", d)
			}
			local := register(t, e, 1<<20, false)
			want := mcPattern(1<<20, 0x42)
			copy(local, want)
			transfer(t, e, seg, engine.Write, local, mc.Info.Addr)
			clear(local)
			transfer(t, e, seg, engine.Read, local, mc.Info.Addr)
			unchanged(t, "read back from Mooncake", local, want)
			if c := mc.finish(); c.CRC != crc32.ChecksumIEEE(want) {
				t.Fatalf("Mooncake's checksum %+v", c)
			}
		})
	}
}

func startMooncakeMetadata(t *testing.T, dir string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(filepath.Join(dir, "mooncake_http_metadata_server"), "-addr", addr)
	stderr := &tail{}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	url := "http://" + addr + "/metadata"
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := c.Get(url + "?key=probe")
		if err == nil {
			resp.Body.Close()
			c.CloseIdleConnections()
			return url
		}
		select {
		case <-done:
			t.Fatalf("mooncake_http_metadata_server exited: %s", stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("mooncake_http_metadata_server not serving: %v; %s", err, stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startSidecar(t *testing.T) string {
	t.Helper()
	s := sidecar.New(sidecar.Config{Logger: quiet()})
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
		<-done
	})
	return "http://" + ln.Addr().String() + "/metadata"
}

// host is a transport.Host without an engine.
type host struct {
	reg    *segment.Registry
	params map[string]string
}

func hostFor(params map[string]string) *host {
	return &host{reg: segment.NewRegistry(), params: params}
}

func (h *host) SegmentName() string           { return "interop" }
func (h *host) Instance() string              { return "interop" }
func (h *host) Registry() *segment.Registry   { return h.reg }
func (h *host) Control() transport.Control    { return nil }
func (h *host) Logf(string, ...any)           {}
func (h *host) Param(k string) (string, bool) { v, ok := h.params[k]; return v, ok }
