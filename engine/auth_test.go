package engine_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

const (
	secretA = "cluster secret A, 32 bytes long.."
	secretB = "cluster secret B, 32 bytes long.."
)

func withSecret(s string) func(*engine.Config) {
	return func(c *engine.Config) { c.AuthSecret = s }
}

// target is an engine with a secret (or none) and one remote-accessible
// buffer, so its descriptor carries a te_key.
func target(t *testing.T, mod ...func(*engine.Config)) *engine.Engine {
	t.Helper()
	e := newEngine(t, mod...)
	buf := alloc(t, 1<<16)
	if err := e.RegisterMemory(mem.Addr(buf), 1<<16, "cpu", true); err != nil {
		t.Fatal(err)
	}
	if d := e.Descriptor(); len(d.Buffers) != 1 || d.Buffers[0].Key == 0 {
		t.Fatalf("descriptor %+v", d)
	}
	return e
}

func wantCode(t *testing.T, what string, err error, want errs.Code, words ...string) {
	t.Helper()
	if got := errs.CodeOf(err); got != want {
		t.Fatalf("%s: got %v (%v), want %v", what, got, err, want)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %q does not say %q", what, err, w)
		}
	}
}

// attack sends raw bytes to addr and returns every byte the engine sent
// back before it closed the connection (or 3 s passed).
func attack(t *testing.T, addr string, send ...[]byte) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, b := range send {
		c.Write(b)
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	got, err := io.ReadAll(c)
	if isTimeout(err) {
		t.Fatalf("the engine kept the connection open after %q", got)
	}
	return got
}

func isTimeout(err error) bool { ne, ok := err.(net.Error); return ok && ne.Timeout() }

func describeFrame(id uint64) []byte {
	return wire.AppendFrame(nil, wire.KindDescribe, wire.AppendCall(nil, id, wire.FlagRequest, nil))
}

// helloFrame is a version 2 HELLO (the one that opens a session) offering
// keyIDs.
func helloFrame(keyIDs ...[wire.AuthKeyIDSize]byte) []byte {
	h := &wire.Hello{Version: wire.AuthVersionSession, Instance: "attacker", KeyIDs: keyIDs}
	if len(keyIDs) > 0 {
		h.Mode = wire.SessionIntegrity
	}
	return wire.AppendFrame(nil, wire.KindAuth, wire.AppendHello(nil, h))
}

// TestControlPortRefusesPeersWithoutTheSecret is issue 12's first probe:
// Describe on the RPC port used to hand every te_key to any caller.
func TestControlPortRefusesPeersWithoutTheSecret(t *testing.T) {
	tg := target(t, withSecret(secretA))
	addr := tg.RPCAddr()
	noKey := func(what string, got []byte) {
		t.Helper()
		if bytes.Contains(got, []byte("te_key")) || bytes.Contains(got, []byte(`"buffers"`)) {
			t.Fatalf("%s: the attacker received a descriptor: %q", what, got)
		}
	}
	// Today's attack: Describe straight away.
	noKey("describe first", attack(t, addr, describeFrame(1)))
	// A HELLO without a key, then Describe: refused, told why, nothing else.
	got := attack(t, addr, helloFrame(), describeFrame(1))
	noKey("no key", got)
	if c, err := wire.DecodeChallenge(got[wire.FrameHeaderSize:]); err != nil || c.Status != wire.AuthSecretRequired || c.Instance != "" {
		t.Fatalf("secretless HELLO answered %+v %v", c, err)
	}
	// A version 1 HELLO (no session) is refused as a version this engine
	// does not speak with its secret: no downgrade to unsealed frames.
	v1 := wire.AppendFrame(nil, wire.KindAuth, wire.AppendHello(nil, &wire.Hello{Version: wire.AuthVersion, Instance: "attacker", KeyIDs: [][wire.AuthKeyIDSize]byte{keyIDOf(t, secretA)}}))
	got = attack(t, addr, v1, describeFrame(1))
	noKey("version 1", got)
	if c, err := wire.DecodeChallenge(got[wire.FrameHeaderSize:]); err != nil || c.Status != wire.AuthBadVersion {
		t.Fatalf("version 1 HELLO answered %+v %v", c, err)
	}
	// A key id copied from the wire, a guessed proof, then Describe.
	kid := keyIDOf(t, secretA)
	var guess [wire.AuthMACSize]byte
	got = attack(t, addr, helloFrame(kid), wire.AppendFrame(nil, wire.KindAuth, wire.AppendProof(nil, &guess)), describeFrame(2))
	noKey("copied key id", got)
	// A Mooncake handshake frame asking for metadata.
	noKey("mooncake metadata", attack(t, addr, wire.AppendFrame(nil, wire.KindMooncakeMetadata, []byte(`{}`))))

	// Engines with another secret, or none, through the real client path.
	b := newEngine(t, withSecret(secretB))
	_, err := b.OpenSegment(tg.Name())
	wantCode(t, "wrong secret", err, errs.Unauthenticated, "refused this engine", "none of this engine's secrets")
	wantCode(t, "wrong secret, notify", b.SendNotify(tg.Name(), "n", "m"), errs.Unauthenticated)
	n := newEngine(t)
	_, err = n.OpenSegment(tg.Name())
	wantCode(t, "no secret", err, errs.Unauthenticated, "server requires the cluster secret")
	_, err = n.Probe(tg.Name())
	wantCode(t, "no secret, probe", err, errs.Unauthenticated)
	if len(tg.Notifies()) != 0 {
		t.Fatal("a notification got through")
	}
	st := tg.Stats().Control
	// Refused frames: the Describe sent before any HELLO, and the version 1 HELLO.
	if !st.Authenticated || st.AuthRefused < 5 || st.RefusedMooncake != 1 || st.RefusedFrames != 2 {
		t.Fatalf("target stats %+v", st)
	}
	if bs := b.Stats().Control; bs.AuthFailedOutbound != 2 {
		t.Fatalf("initiator stats %+v", bs)
	}

	// The same secret works for everything on the control plane.
	a := newEngine(t, withSecret(secretA))
	s, err := a.OpenSegment(tg.Name())
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := s.Descriptor(); len(d.Buffers) != 1 || d.Buffers[0].Key == 0 {
		t.Fatalf("authenticated descriptor %+v", d)
	}
	if p, err := a.Probe(tg.Name()); err != nil || p.Instance != tg.Instance() {
		t.Fatal(p, err)
	}
	if err := a.SendNotify(tg.Name(), "n", "m"); err != nil {
		t.Fatal(err)
	}
	if got := tg.Notifies(); len(got) != 1 {
		t.Fatalf("notifies %v", got)
	}
}

// TestSecretlessEngineRefusedByInitiator: an initiator with the secret does
// not talk to an engine without it (a rewritten descriptor pointing at a
// party without the secret gets nothing), and says so.
func TestSecretlessEngineRefusedByInitiator(t *testing.T) {
	open := target(t)
	a := newEngine(t, withSecret(secretA))
	_, err := a.OpenSegment(open.Name())
	wantCode(t, "describe", err, errs.Unauthenticated, "does not authenticate", open.Instance())
	wantCode(t, "notify", a.SendNotify(open.Name(), "n", "secret stuff"), errs.Unauthenticated)
	if len(open.Notifies()) != 0 {
		t.Fatal("a notification reached an engine without the secret")
	}
	// Two engines without a secret keep working (drop-in compatibility).
	b := newEngine(t)
	if _, err := b.OpenSegment(open.Name()); err != nil {
		t.Fatal(err)
	}
}

func TestSecretRotation(t *testing.T) {
	const old, next = secretA, secretB
	tg := target(t, withSecret(next+"\n"+old))
	for _, s := range []string{old, next, next + "\n" + old, old + "\n" + next} {
		e := newEngine(t, withSecret(s))
		if _, err := e.OpenSegment(tg.Name()); err != nil {
			t.Fatalf("secret %q: %v", s[:8], err)
		}
		// The rotated engine dials the others too.
		if _, err := tg.Probe(e.Name()); err != nil {
			t.Fatalf("rotated engine to %q: %v", s[:8], err)
		}
	}
	// After the window, the old secret alone is refused.
	done := target(t, withSecret(next))
	e := newEngine(t, withSecret(old))
	_, err := e.OpenSegment(done.Name())
	wantCode(t, "old secret after the rotation", err, errs.Unauthenticated)
}

// TestReplayedControlTranscriptRefused records a legitimate engine's control
// connection (handshake and Describe) through a proxy and replays the
// initiator's bytes: the engine refuses, and the replay learns nothing.
func TestReplayedControlTranscriptRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The target is named after the proxy, so the initiator, which checks
	// the name the session proves, sends its Describe through it.
	tg := target(t, withSecret(secretA), func(c *engine.Config) { c.SegmentName = ln.Addr().String() })
	var rec bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		up, err := net.Dial("tcp", tg.RPCAddr())
		if err != nil {
			return
		}
		defer up.Close()
		go func() { io.Copy(c, up); c.Close() }()
		io.Copy(io.MultiWriter(up, &rec), c)
	}()
	a := newEngine(t, withSecret(secretA), func(c *engine.Config) { c.Limits.PeerIdleTimeout = -1 })
	// In P2P mode the segment name is the address: the proxy's.
	s, err := a.OpenSegment(ln.Addr().String())
	if err == nil || s != nil {
		// The descriptor names the target, not the proxy, so the fetch
		// is refused after the exchange; the bytes are what matter.
		t.Logf("open through proxy: %v", err)
	}
	a.Close()
	ln.Close()
	wg.Wait()
	sent := rec.Bytes()
	if !bytes.Contains(sent, []byte{wire.KindDescribe}) || len(sent) < 100 {
		t.Fatalf("recorded %d bytes", len(sent))
	}
	got := attack(t, tg.RPCAddr(), sent)
	if bytes.Contains(got, []byte("te_key")) {
		t.Fatal("a replayed transcript obtained the descriptor")
	}
	// CHALLENGE (fresh nonce), then RESULT refused.
	_, n, _ := wire.ReadFrameHeader(bytes.NewReader(got))
	rest := got[wire.FrameHeaderSize+int(n):]
	if r, err := wire.DecodeResult(rest[wire.FrameHeaderSize:]); err != nil || r.Status != wire.AuthBadProof {
		t.Fatalf("replay answered %+v %v", r, err)
	}
}

var ctrlpeer struct {
	once     sync.Once
	dir, bin string
	err      error
	out      []byte
}

// ctrlpeerBin builds the helper process of the cross-process tests once per
// test binary; TestMain removes it.
func ctrlpeerBin(t *testing.T) string {
	t.Helper()
	ctrlpeer.once.Do(func() {
		if ctrlpeer.dir, ctrlpeer.err = os.MkdirTemp("", "te-ctrlpeer"); ctrlpeer.err != nil {
			return
		}
		ctrlpeer.bin = filepath.Join(ctrlpeer.dir, "ctrlpeer")
		ctrlpeer.out, ctrlpeer.err = exec.Command("go", "build", "-o", ctrlpeer.bin, "./internal/ctrlpeer").CombinedOutput()
	})
	if ctrlpeer.err != nil {
		t.Fatalf("build helper: %v\n%s", ctrlpeer.err, ctrlpeer.out)
	}
	return ctrlpeer.bin
}

func keyIDOf(t *testing.T, secret string) [wire.AuthKeyIDSize]byte {
	t.Helper()
	s, err := peerauth.ParseSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	var id [wire.AuthKeyIDSize]byte
	h := s.KeyIDs()[0]
	for i := range id {
		var b byte
		for _, c := range h[2*i : 2*i+2] {
			b = b<<4 | byte(strings.IndexRune("0123456789abcdef", c))
		}
		id[i] = b
	}
	return id
}

// TestAuthAcrossProcesses runs the control plane against another process
// that takes its secret from TE_AUTH_SECRET_FILE, as a Kubernetes pod would.
func TestAuthAcrossProcesses(t *testing.T) {
	bin := ctrlpeerBin(t)
	file := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(file, []byte(secretA+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "TE_AUTH_SECRET_FILE="+file)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	name, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	name = strings.TrimSpace(name)

	wrong := newEngine(t, withSecret(secretB))
	_, err = wrong.OpenSegment(name)
	wantCode(t, "wrong secret", err, errs.Unauthenticated)
	none := newEngine(t)
	_, err = none.OpenSegment(name)
	wantCode(t, "no secret", err, errs.Unauthenticated, "requires the cluster secret")
	if got := attack(t, name, describeFrame(1)); bytes.Contains(got, []byte("te_key")) {
		t.Fatal("the other process handed out its descriptor")
	}

	e := newEngine(t, withSecret(secretA), func(c *engine.Config) { c.RPCTimeout = 3 * time.Second })
	s, err := e.OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := s.Descriptor(); err != nil || len(d.Buffers) != 1 || d.Buffers[0].Key == 0 {
		t.Fatalf("descriptor %+v %v", d, err)
	}
	// The echo goes back over the other process's dialled, authenticated
	// connection to this engine.
	if err := e.SendNotify(name, "echo", e.Name()); err != nil {
		t.Fatal(err)
	}
	waitNotify(t, e, engine.Notification{Name: "echo-reply", Msg: e.Name()})
}

// TestStartupLogSaysWhetherPeersAuthenticate: one warning without a secret;
// with one, an info line naming where it came from and never the secret.
func TestStartupLogSaysWhetherPeersAuthenticate(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	withLog := func(c *engine.Config) { c.Logger = logger }
	e := newEngine(t, withLog)
	e.Close()
	mu.Lock()
	out := buf.String()
	buf.Reset()
	mu.Unlock()
	if strings.Count(out, "peers are not authenticated") != 1 || !strings.Contains(out, "level=WARN") {
		t.Fatalf("log without a secret:\n%s", out)
	}
	e = newEngine(t, withLog, withSecret(secretA))
	e.Close()
	mu.Lock()
	out = buf.String()
	mu.Unlock()
	if strings.Contains(out, "not authenticated") || !strings.Contains(out, "authenticate with the cluster secret") ||
		strings.Contains(out, secretA) || !strings.Contains(out, "configuration") {
		t.Fatalf("log with a secret:\n%s", out)
	}
	// A malformed secret is an error, not an engine without one.
	_, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", AuthSecret: "short", Transports: []string{"local"}})
	wantCode(t, "short secret", err, errs.InvalidArgument, "at least 16")
	_, err = engine.New(engine.Config{ListenAddr: "127.0.0.1:0", AuthSecretFile: "/nonexistent/secret", Transports: []string{"local"}})
	wantCode(t, "missing secret file", err, errs.InvalidArgument)
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestBindsTheAdvertisedAddress is issue 12 item 5: without an explicit
// ListenAddr host, the RPC listener and the tcp data listener bind the
// advertised host only, not every interface.
func TestBindsTheAdvertisedAddress(t *testing.T) {
	reachable := func(addr, from string) bool {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 2 * time.Second}
		_, port, _ := net.SplitHostPort(addr)
		c, err := d.DialContext(context.Background(), "tcp", net.JoinHostPort(from, port))
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
	tcp := func(c *engine.Config) { c.Transports = []string{"local", "tcp"} }
	for _, c := range []struct {
		name, listen string
		everywhere   bool
	}{
		{"default", "", false},
		{"port only", ":0", false},
		{"explicit all interfaces", "0.0.0.0:0", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEngine(t, tcp, func(cfg *engine.Config) { cfg.ListenAddr, cfg.Hostname = c.listen, "127.0.0.1" })
			data := e.Descriptor().Endpoints["tcp"]
			if e.RPCAddr() != net.JoinHostPort("127.0.0.1", itoa(e.RPCPort())) || data == "" {
				t.Fatalf("rpc %s data %q", e.RPCAddr(), data)
			}
			for _, a := range []string{e.RPCAddr(), data} {
				if !reachable(a, "127.0.0.1") {
					t.Fatalf("%s not reachable at the advertised host", a)
				}
				if got := reachable(a, "127.0.0.2"); got != c.everywhere {
					t.Fatalf("%s reachable on another address: %v, want %v", a, got, c.everywhere)
				}
			}
		})
	}
	// A Hostname this host does not have: a clear error, not 0.0.0.0.
	_, err := engine.New(engine.Config{Hostname: "192.0.2.1", Transports: []string{"local"}})
	wantCode(t, "foreign hostname", err, errs.InvalidArgument, "ListenAddr")
}

// TestNotificationSenderProven: a notification carries the segment name and
// instance its sender's session proved, whatever its name and message say;
// without a secret nothing is proven and both are empty.
func TestNotificationSenderProven(t *testing.T) {
	for _, secret := range []bool{true, false} {
		var mod []func(*engine.Config)
		if secret {
			mod = append(mod, withSecret(secretA))
		}
		a, b := newEngine(t, mod...), newEngine(t, mod...)
		// The name claims another sender: only the session's word counts.
		if err := a.SendNotify(b.Name(), "nixl/n/someone-else", b.Name()); err != nil {
			t.Fatal(err)
		}
		var got []engine.Notification
		for deadline := time.Now().Add(5 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
			got = b.Notifies()
			time.Sleep(time.Millisecond)
		}
		if len(got) != 1 {
			t.Fatalf("secret %v: %d notifications", secret, len(got))
		}
		from, inst := a.Name(), a.Instance()
		if !secret {
			from, inst = "", ""
		}
		if got[0].From != from || got[0].FromInstance != inst {
			t.Fatalf("secret %v: sender %q/%q, want %q/%q", secret, got[0].From, got[0].FromInstance, from, inst)
		}
	}
}
