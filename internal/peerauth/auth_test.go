package peerauth_test

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	secretA = "correct horse battery staple 1"
	secretB = "another cluster's secret value"
)

func mustSecret(t testing.TB, text string) *peerauth.Secret {
	t.Helper()
	s, err := peerauth.ParseSecret(text)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// pair returns the two ends of a real TCP connection on 127.0.0.1.
func pair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-ch
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

type outcome struct {
	peer string
	err  error
}

// run runs Client and Server against each other over TCP.
func run(t *testing.T, cs, ss *peerauth.Secret) (cli, srv outcome) {
	t.Helper()
	c, s := pair(t)
	dl := time.Now().Add(5 * time.Second)
	done := make(chan outcome, 1)
	go func() {
		p, err := peerauth.Server(s, ss, "server-instance", dl)
		if err != nil {
			s.Close() // as the control plane does
		}
		done <- outcome{p, err}
	}()
	p, err := peerauth.Client(c, cs, "client-instance", dl)
	if err != nil {
		c.Close()
	}
	return outcome{p, err}, <-done
}

func wantErr(t *testing.T, side string, o outcome, code errs.Code, words ...string) {
	t.Helper()
	if errs.CodeOf(o.err) != code {
		t.Fatalf("%s: got %v, want %v", side, o.err, code)
	}
	for _, w := range words {
		if !strings.Contains(o.err.Error(), w) {
			t.Fatalf("%s: %q does not say %q", side, o.err, w)
		}
	}
}

func TestSameSecret(t *testing.T) {
	s := mustSecret(t, secretA)
	cli, srv := run(t, s, mustSecret(t, secretA))
	if cli.err != nil || srv.err != nil || cli.peer != "server-instance" || srv.peer != "client-instance" {
		t.Fatalf("client %+v server %+v", cli, srv)
	}
}

func TestNoSecretEitherSide(t *testing.T) {
	cli, srv := run(t, nil, nil)
	if cli.err != nil || srv.err != nil || cli.peer != "server-instance" || srv.peer != "client-instance" {
		t.Fatalf("client %+v server %+v", cli, srv)
	}
}

func TestWrongSecretRefusedBothWays(t *testing.T) {
	cli, srv := run(t, mustSecret(t, secretB), mustSecret(t, secretA))
	wantErr(t, "client", cli, errs.Unauthenticated, "refused this engine", "none of this engine's secrets")
	wantErr(t, "server", srv, errs.Unauthenticated, "holds none of this engine's secrets")
}

func TestSecretlessInitiatorRefusedByServer(t *testing.T) {
	cli, srv := run(t, nil, mustSecret(t, secretA))
	wantErr(t, "client", cli, errs.Unauthenticated, "server requires the cluster secret")
	wantErr(t, "server", srv, errs.Unauthenticated, "has no cluster secret", "client-instance")
}

func TestSecretlessServerRefusedByInitiator(t *testing.T) {
	cli, srv := run(t, mustSecret(t, secretA), nil)
	wantErr(t, "client", cli, errs.Unauthenticated, "does not authenticate", "server-instance")
	if srv.err != nil {
		t.Fatalf("a server without a secret answers and leaves the refusal to the initiator: %v", srv.err)
	}
}

func TestRotation(t *testing.T) {
	old, next := secretA, secretB
	both := mustSecret(t, next+"\n"+old+"\n")
	cases := []struct {
		name   string
		cs, ss *peerauth.Secret
		ok     bool
	}{
		{"new+old initiator, old server", both, mustSecret(t, old), true},
		{"old initiator, new+old server", mustSecret(t, old), both, true},
		{"new initiator, new+old server", mustSecret(t, next), both, true},
		{"new+old both", both, mustSecret(t, next+"\n"+old), true},
		{"new initiator, old server: the window is over", mustSecret(t, next), mustSecret(t, old), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cli, srv := run(t, c.cs, c.ss)
			if c.ok && (cli.err != nil || srv.err != nil) {
				t.Fatalf("client %v server %v", cli.err, srv.err)
			}
			if !c.ok {
				wantErr(t, "client", cli, errs.Unauthenticated)
				wantErr(t, "server", srv, errs.Unauthenticated)
			}
		})
	}
	if ids := both.KeyIDs(); len(ids) != 2 || ids[1] != mustSecret(t, old).KeyIDs()[0] {
		t.Fatalf("key ids %v", ids)
	}
}

// recorder is a TCP proxy that keeps the bytes each way.
type recorder struct {
	mu       sync.Mutex
	toServer bytes.Buffer
	toClient bytes.Buffer
}

// proxy connects a client to dst through a recorder and returns the
// client's end.
func proxy(t *testing.T, dst net.Conn, rec *recorder) net.Conn {
	c, mid := pair(t)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		// Recorded before forwarded: once a side has the bytes, so does
		// the recording.
		io.Copy(io.MultiWriter(lockedWriter{&rec.mu, &rec.toServer}, dst), mid)
		dst.Close()
	}()
	go func() {
		defer wg.Done()
		io.Copy(io.MultiWriter(lockedWriter{&rec.mu, &rec.toClient}, mid), dst)
		mid.Close()
	}()
	t.Cleanup(func() { c.Close(); dst.Close(); wg.Wait() })
	return c
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestReplayedTranscriptRefused records a successful exchange, then replays
// the initiator's bytes to the server and the server's bytes to an
// initiator: both refuse, because the other side chose a fresh nonce.
func TestReplayedTranscriptRefused(t *testing.T) {
	s := mustSecret(t, secretA)
	rec := &recorder{}
	toSrv, srvEnd := pair(t)
	done := make(chan outcome, 1)
	go func() {
		p, err := peerauth.Server(srvEnd, s, "server-instance", time.Now().Add(5*time.Second))
		done <- outcome{p, err}
	}()
	c := proxy(t, toSrv, rec)
	if _, err := peerauth.Client(c, s, "client-instance", time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if o := <-done; o.err != nil {
		t.Fatal(o.err)
	}
	c.Close()
	rec.mu.Lock()
	fromClient := append([]byte(nil), rec.toServer.Bytes()...)
	fromServer := append([]byte(nil), rec.toClient.Bytes()...)
	rec.mu.Unlock()

	// The initiator's recorded bytes, replayed to the server.
	atk, srv := pair(t)
	go func() {
		p, err := peerauth.Server(srv, s, "server-instance", time.Now().Add(5*time.Second))
		srv.Close()
		done <- outcome{p, err}
	}()
	atk.Write(fromClient)
	got, _ := io.ReadAll(atk)
	o := <-done
	wantErr(t, "server given a replay", o, errs.Unauthenticated, "wrong proof")
	res := got[len(got)-(wire.FrameHeaderSize+2+wire.AuthMACSize):]
	if r, err := wire.DecodeResult(res[wire.FrameHeaderSize:]); err != nil || r.Status != wire.AuthBadProof || r.MAC != [wire.AuthMACSize]byte{} {
		t.Fatalf("replay answered %+v %v", r, err)
	}

	// The server's recorded bytes, replayed to an initiator.
	cli, fake := pair(t)
	go func() {
		io.ReadFull(fake, make([]byte, len(fromClient)-(wire.FrameHeaderSize+1+wire.AuthMACSize))) // HELLO
		fake.Write(fromServer[:len(fromServer)-(wire.FrameHeaderSize+2+wire.AuthMACSize)])         // old CHALLENGE
		io.ReadFull(fake, make([]byte, wire.FrameHeaderSize+1+wire.AuthMACSize))                   // PROOF
		fake.Write(fromServer[len(fromServer)-(wire.FrameHeaderSize+2+wire.AuthMACSize):])         // old RESULT
	}()
	_, err := peerauth.Client(cli, s, "client-instance", time.Now().Add(5*time.Second))
	wantErr(t, "initiator given a replay", outcome{err: err}, errs.Unauthenticated, "failed to prove")
}

// TestCopiedKeyIDWithoutSecret is a party that saw a key id on the wire and
// offers it: it gets a challenge but cannot answer it, and obtains no MAC.
// A fake server that reflects the initiator's proof as its own is refused.
func TestCopiedKeyIDWithoutSecret(t *testing.T) {
	s := mustSecret(t, secretA)
	atk, srv := pair(t)
	done := make(chan outcome, 1)
	go func() {
		p, err := peerauth.Server(srv, s, "server-instance", time.Now().Add(5*time.Second))
		srv.Close()
		done <- outcome{p, err}
	}()
	id := s.KeyIDs()[0]
	var kid [wire.AuthKeyIDSize]byte
	for i := range kid {
		var b byte
		for _, c := range id[2*i : 2*i+2] {
			b = b<<4 | byte(strings.IndexRune("0123456789abcdef", c))
		}
		kid[i] = b
	}
	atk.Write(wire.AppendFrame(nil, wire.KindAuth, wire.AppendHello(nil, &wire.Hello{Version: 1, KeyIDs: [][wire.AuthKeyIDSize]byte{kid}, Instance: "atk"})))
	var guess [wire.AuthMACSize]byte
	atk.Write(wire.AppendFrame(nil, wire.KindAuth, wire.AppendProof(nil, &guess)))
	got, _ := io.ReadAll(atk)
	wantErr(t, "server", <-done, errs.Unauthenticated, "wrong proof")
	if len(got) != 2*wire.FrameHeaderSize+(3+wire.AuthNonceSize+2+len("server-instance"))+(2+wire.AuthMACSize) {
		t.Fatalf("attacker got %d bytes", len(got))
	}
	if !bytes.HasSuffix(got, make([]byte, wire.AuthMACSize)) {
		t.Fatal("the refusal carries a MAC")
	}

	// Reflection: a server without the secret sends the initiator's own
	// proof back as its MAC.
	cli, fake := pair(t)
	go func() {
		var b [wire.MaxAuthBody]byte
		_, n, _ := wire.ReadFrameHeader(fake)
		io.ReadFull(fake, b[:n])
		fake.Write(wire.AppendFrame(nil, wire.KindAuth, wire.AppendChallenge(nil, &wire.Challenge{Version: 1, Status: wire.AuthProceed, Instance: "fake"})))
		_, n, _ = wire.ReadFrameHeader(fake)
		io.ReadFull(fake, b[:n])
		proof, _ := wire.DecodeProof(b[:n])
		fake.Write(wire.AppendFrame(nil, wire.KindAuth, wire.AppendResult(nil, &wire.Result{Status: wire.AuthProceed, MAC: proof})))
	}()
	_, err := peerauth.Client(cli, s, "client-instance", time.Now().Add(5*time.Second))
	wantErr(t, "initiator given its own proof", outcome{err: err}, errs.Unauthenticated, "failed to prove")
}

func TestBusyRefusal(t *testing.T) {
	c, s := pair(t)
	if err := peerauth.Refuse(s, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err := peerauth.Client(c, mustSecret(t, secretA), "client-instance", time.Now().Add(5*time.Second))
	wantErr(t, "client", outcome{err: err}, errs.ResourceExhausted, "connection limit")
}

func TestBoundsAndDeadline(t *testing.T) {
	// A server that never answers: the initiator gives up at its deadline.
	c, _ := pair(t)
	t0 := time.Now()
	_, err := peerauth.Client(c, nil, "client-instance", time.Now().Add(200*time.Millisecond))
	wantErr(t, "silent server", outcome{err: err}, errs.Timeout)
	if d := time.Since(t0); d > 3*time.Second {
		t.Fatalf("deadline of 200ms took %v", d)
	}
	// An initiator that never sends HELLO.
	_, s := pair(t)
	_, err = peerauth.Server(s, mustSecret(t, secretA), "server-instance", time.Now().Add(200*time.Millisecond))
	wantErr(t, "silent initiator", outcome{err: err}, errs.Timeout)

	// An authentication frame claiming 1 TiB, and another kind first.
	for _, f := range [][]byte{
		{0, 0, 0, 0, 0, 1, 0, 0, wire.KindAuth},
		wire.AppendFrame(nil, wire.KindDescribe, wire.AppendCall(nil, 1, wire.FlagRequest, nil)),
		wire.AppendFrame(nil, wire.KindMooncakeMetadata, []byte("{}")),
	} {
		c, s := pair(t)
		c.Write(f)
		_, err := peerauth.Server(s, mustSecret(t, secretA), "server-instance", time.Now().Add(2*time.Second))
		wantErr(t, "bad first frame", outcome{err: err}, errs.Protocol)
	}
	// Instance ids are bounded.
	c, _ = pair(t)
	_, err = peerauth.Client(c, nil, strings.Repeat("i", wire.MaxAuthInstance+1), time.Now().Add(time.Second))
	wantErr(t, "long instance", outcome{err: err}, errs.InvalidArgument)
}

func TestParseAndLoadSecret(t *testing.T) {
	if s, err := peerauth.ParseSecret(" \n\n"); s != nil || err != nil {
		t.Fatal(s, err)
	}
	for _, bad := range []string{"short", secretA + "\nshort", "a" + secretA + "\nb" + secretA + "\nc" + secretA} {
		if _, err := peerauth.ParseSecret(bad); errs.CodeOf(err) != errs.InvalidArgument {
			t.Fatalf("%q: %v", bad, err)
		}
	}
	// Trailing newline and CR, as a mounted file has them: same key.
	a := mustSecret(t, secretA)
	if b := mustSecret(t, "  "+secretA+"\r\n"); b.KeyIDs()[0] != a.KeyIDs()[0] {
		t.Fatal("white space changed the key")
	}
	if mustSecret(t, secretA).KeyIDs()[0] == mustSecret(t, secretB).KeyIDs()[0] {
		t.Fatal("two secrets share a key id")
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "secret")
	os.WriteFile(file, []byte(secretB+"\n"), 0o600)
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	check := func(value, f string, want *peerauth.Secret, src string) {
		t.Helper()
		s, source, err := peerauth.LoadSecret(value, f, getenv)
		if err != nil {
			t.Fatal(err)
		}
		if (s == nil) != (want == nil) || (s != nil && s.KeyIDs()[0] != want.KeyIDs()[0]) || !strings.Contains(source, src) {
			t.Fatalf("got %v from %q, want %v from %q", s.KeyIDs(), source, want.KeyIDs(), src)
		}
		if strings.Contains(source, secretA) || strings.Contains(source, secretB) {
			t.Fatal("the source names the secret")
		}
	}
	check("", "", nil, "")
	env[peerauth.EnvSecret] = secretA
	check("", "", a, peerauth.EnvSecret)
	env[peerauth.EnvSecretFile] = file
	check("", "", mustSecret(t, secretB), peerauth.EnvSecretFile)
	check("", file, mustSecret(t, secretB), "file")
	check(secretA, file, a, "configuration")
	env[peerauth.EnvSecretFile] = filepath.Join(dir, "absent")
	if _, _, err := peerauth.LoadSecret("", "", getenv); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("an unreadable secret file must not turn authentication off: %v", err)
	}
	os.WriteFile(file, []byte("\n"), 0o600)
	if _, _, err := peerauth.LoadSecret("", file, getenv); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("an empty secret file must not turn authentication off: %v", err)
	}
}

func TestDerive(t *testing.T) {
	s := mustSecret(t, secretB+"\n"+secretA)
	d := s.Derive("te-sidecar bearer v1")
	if len(d) != 2 || bytes.Equal(d[0], d[1]) || len(d[0]) != 32 {
		t.Fatal("derive")
	}
	if !bytes.Equal(mustSecret(t, secretA).Derive("te-sidecar bearer v1")[0], d[1]) {
		t.Fatal("the previous key derives differently alone")
	}
	if s.Derive("te-auth-v1 key id") != nil {
		t.Fatal("derived a value under the exchange's own label")
	}
}

// BenchmarkHandshake is the per-connection cost of authentication: dial,
// run the exchange and close, with and without a secret.
func BenchmarkHandshake(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	for _, name := range []string{"nosecret", "secret"} {
		var s *peerauth.Secret
		if name == "secret" {
			s = mustSecret(b, secretA)
		}
		b.Run(name, func(b *testing.B) {
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < b.N; i++ {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					peerauth.Server(c, s, "server-instance", time.Now().Add(5*time.Second))
					c.Close()
				}
			}()
			for i := 0; i < b.N; i++ {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				if _, err := peerauth.Client(c, s, "client-instance", time.Now().Add(5*time.Second)); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
			wg.Wait()
		})
	}
}
