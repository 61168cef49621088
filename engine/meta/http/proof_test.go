package httpmeta_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/meta"
	httpmeta "github.com/tecache/te/engine/meta/http"
	"github.com/tecache/te/engine/meta/internal/storetest"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
)

// tap is a TCP relay on 127.0.0.1 that keeps, per connection, the bytes
// the client sent: what reached the server, as the server saw it.
type tap struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []*bytes.Buffer // client-to-server bytes, per accepted connection
	open   map[net.Conn]bool
	wg     sync.WaitGroup
}

func newTap(t *testing.T, target string) *tap {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tap{ln: ln, target: target, open: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for c := range p.open {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *tap) Addr() string { return p.ln.Addr().String() }

func (p *tap) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		buf := &bytes.Buffer{}
		p.mu.Lock()
		p.conns = append(p.conns, buf)
		p.open[c], p.open[u] = true, true
		p.mu.Unlock()
		end := func() {
			c.Close()
			u.Close()
			p.mu.Lock()
			delete(p.open, c)
			delete(p.open, u)
			p.mu.Unlock()
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(c, u); end() }()
		go func() { defer p.wg.Done(); io.Copy(recorder{p, buf, u}, c); end() }()
	}
}

// recorder writes to the server and keeps what it sent.
type recorder struct {
	p   *tap
	buf *bytes.Buffer
	w   io.Writer
}

// Write keeps b before it forwards it, so that a test reading the record
// after the server answered finds it (what was kept and not forwarded only
// makes the test stricter).
func (r recorder) Write(b []byte) (int, error) {
	r.p.mu.Lock()
	r.buf.Write(b)
	r.p.mu.Unlock()
	return r.w.Write(b)
}

// Sent returns what the client sent on each connection accepted since the
// from-th one.
func (p *tap) Sent(from int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, b := range p.conns[from:] {
		out = append(out, b.String())
	}
	return out
}

func (p *tap) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

const proofLine = "GET /metadata/proof?nonce="

// TestTokenOnlyAfterProof: against te-sidecar with the same secret the
// store works as before, and every connection opens with a proof request
// that carries no token; the token follows on that connection only. When
// the sidecar at the address is replaced by one with another secret, the
// store's new connection asks for a proof again, gets none, and sends no
// token at all; back with the right secret, it works again.
func TestTokenOnlyAfterProof(t *testing.T) {
	const secret = "metadata-test-cluster-secret-04"
	sec, _ := authsecret.Parse(secret)
	other, _ := authsecret.Parse("another-cluster-secret-000004")
	sc := &sidecarServer{t: t, addr: fmt.Sprintf("127.0.0.1:%d", storetest.FreePort(t)), secret: sec}
	sc.Up()
	t.Cleanup(sc.Down)
	tp := newTap(t, sc.addr)
	ctx := context.Background()
	st, err := meta.OpenWith("http://"+tp.Addr()+"/metadata?timeout=2s&refresh=1h", meta.Options{AuthSecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i := range 5 {
		k := fmt.Sprintf("k%d", i)
		if err := st.Put(ctx, k, []byte("v")); err != nil {
			t.Fatalf("put to te-sidecar with the secret: %v", err)
		}
		if v, err := st.Get(ctx, k); err != nil || string(v) != "v" {
			t.Fatalf("get: %q %v", v, err)
		}
	}
	if v, ok := sc.srv.KV().Get("k4"); !ok || string(v) != "v" {
		t.Fatalf("sidecar holds %q %v", v, ok)
	}
	sent := tp.Sent(0)
	tokens := 0
	for i, s := range sent {
		if s == "" {
			continue // a connection the transport opened and did not use
		}
		if !strings.HasPrefix(s, proofLine) {
			t.Fatalf("connection %d did not open with a proof request: %.200q", i, s)
		}
		proof, _, _ := strings.Cut(s, "\r\n\r\n")
		if strings.Contains(proof, "Authorization") || strings.Contains(proof, sec.Token()) {
			t.Fatalf("the proof request carried a token: %q", proof)
		}
		if strings.Count(s, proofLine) != 1 {
			t.Fatalf("connection %d asked for %d proofs", i, strings.Count(s, proofLine))
		}
		tokens += strings.Count(s, "Authorization: Bearer "+sec.Token())
	}
	if tokens != 10 {
		t.Fatalf("%d requests carried the token over %d connections, want 10", tokens, len(sent))
	}

	sc.Down()
	sc.secret = other
	sc.Up()
	mark := tp.Conns()
	err = st.Put(ctx, "k9", []byte("v"))
	if errs.CodeOf(err) != errs.Unauthenticated || !strings.Contains(err.Error(), "http://"+tp.Addr()+"/metadata") ||
		!strings.Contains(err.Error(), "does not match this cluster secret") || !strings.Contains(err.Error(), "the sidecar token is not sent") {
		t.Fatalf("put to a sidecar with another secret: %v", err)
	}
	asked := 0
	for _, s := range tp.Sent(mark) {
		if s == "" {
			continue // a connection the transport opened and did not use
		}
		asked++
		if !strings.HasPrefix(s, proofLine) || strings.Contains(s, "Authorization") || strings.Contains(s, sec.Token()) {
			t.Fatalf("the sidecar with another secret got: %q", s)
		}
	}
	if asked == 0 {
		t.Fatal("the store did not ask the replaced sidecar for a proof")
	}
	if n, _ := sc.srv.KV().Size(); n != 0 {
		t.Fatalf("the sidecar with another secret holds %d keys", n)
	}

	sc.Down()
	sc.secret = sec
	sc.Up()
	if err := st.Put(ctx, "k9", []byte("v")); err != nil {
		t.Fatalf("put once the sidecar has the secret again: %v", err)
	}
}

// TestProofRotation: during a rotation a sidecar with NEW and OLD proves
// to clients holding either as their current secret; a client with a
// third secret gets no proof.
func TestProofRotation(t *testing.T) {
	const oldS, newS = "rotation-old-cluster-secret-01", "rotation-new-cluster-secret-01"
	sec, _ := authsecret.Parse(newS + "\n" + oldS)
	sc := &sidecarServer{t: t, addr: fmt.Sprintf("127.0.0.1:%d", storetest.FreePort(t)), secret: sec}
	sc.Up()
	t.Cleanup(sc.Down)
	conn := "http://" + sc.addr + "/metadata?timeout=2s"
	for _, c := range []struct {
		secret string
		ok     bool
	}{{newS, true}, {oldS, true}, {newS + "\n" + oldS, true}, {"rotation-third-cluster-secret", false}, {oldS + "\n" + newS, true}} {
		st, err := meta.OpenWith(conn, meta.Options{AuthSecret: c.secret})
		if err != nil {
			t.Fatal(err)
		}
		err = st.Put(context.Background(), "k", []byte("v"))
		st.Close()
		if c.ok && err != nil || !c.ok && errs.CodeOf(err) != errs.Unauthenticated {
			t.Errorf("client secret %q: %v", c.secret, err)
		}
	}
}

// TestTokenNotSentToPlainServer: a plain HTTP server configured as the
// metadata URL, with a cluster secret set, is asked for a proof and gets no
// Authorization header at all, whatever it answers (nothing, a 200 to
// everything, a made-up proof, the token as proof, a genuine proof recorded
// earlier for another nonce); every store call fails with Unauthenticated
// naming the URL and why, and so does an engine's start (a Metadata error
// around it). A token given explicitly
// (MC_METADATA_HTTP_TOKEN) still goes to it, as the user chose.
func TestTokenNotSentToPlainServer(t *testing.T) {
	const secret = "metadata-test-cluster-secret-03"
	sec, _ := authsecret.Parse(secret)
	other, _ := authsecret.Parse("another-cluster-secret-000003")

	// A genuine answer of te-sidecar with the same secret, to replay.
	sc := &sidecarServer{t: t, addr: fmt.Sprintf("127.0.0.1:%d", storetest.FreePort(t)), secret: sec}
	sc.Up()
	resp, err := http.Get("http://" + sc.addr + "/metadata/proof?nonce=" + authsecret.NewNonce())
	if err != nil {
		t.Fatal(err)
	}
	recorded, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	sc.Down()
	if resp.StatusCode != 200 || !bytes.Contains(recorded, []byte(`"proofs"`)) {
		t.Fatalf("recording a proof: %d %q", resp.StatusCode, recorded)
	}

	answer := func(a authsecret.ProofAnswer) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(a) }
	}
	servers := []struct {
		name string
		h    http.HandlerFunc
		why  string
	}{
		{"a Mooncake-style server", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metadata" {
				http.NotFound(w, r)
				return
			}
			w.Write([]byte(`{"x":1}`))
		}, "answered HTTP 404"},
		{"a server that answers 200 to everything", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"x":1}`)) }, "does not match"},
		{"a server that answers with the token", answer(authsecret.ProofAnswer{Instance: "i", Proofs: []string{sec.Token()}}), "does not match"},
		{"a server with another secret", func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(authsecret.ProofAnswer{Instance: "i", Proofs: other.Proofs(r.URL.Query().Get("nonce"), "i")})
		}, "does not match"},
		{"a server that replays a genuine proof", func(w http.ResponseWriter, r *http.Request) { w.Write(recorded) }, "does not match"},
		{"a server that answers garbage", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("<html>")) }, "not a proof"},
	}
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, sv := range servers {
		var mu sync.Mutex
		var seen []string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen = append(seen, r.URL.Path+" auth="+r.Header.Get("Authorization"))
			mu.Unlock()
			sv.h(w, r)
		}))
		conn := srv.URL + "/metadata?timeout=1s&refresh=1h"
		st, err := meta.OpenWith(conn, meta.Options{AuthSecret: secret})
		if err != nil {
			t.Fatal(err)
		}
		calls := map[string]func() error{
			"put":    func() error { return st.Put(ctx, "k", []byte("v")) },
			"get":    func() error { _, err := st.Get(ctx, "k"); return err },
			"delete": func() error { return st.Delete(ctx, "k") },
		}
		for op, call := range calls {
			err := call()
			if errs.CodeOf(err) != errs.Unauthenticated || !strings.Contains(err.Error(), srv.URL+"/metadata did not prove it holds the cluster secret") ||
				!strings.Contains(err.Error(), sv.why) || !strings.Contains(err.Error(), "the sidecar token is not sent") {
				t.Errorf("%s: %s: %v", sv.name, op, err)
			}
		}
		st.Close()
		_, err = engine.New(engine.Config{SegmentName: "e", Metadata: conn, ListenAddr: "127.0.0.1:0", AuthSecret: secret, Logger: quiet})
		if !errors.Is(err, errs.ErrUnauthenticated) || !strings.Contains(err.Error(), "did not prove") {
			t.Errorf("%s: an engine started: %v", sv.name, err)
		}
		mu.Lock()
		if len(seen) < 4 {
			t.Errorf("%s was asked %d times, want a proof request per call", sv.name, len(seen))
		}
		for _, s := range seen {
			if s != "/metadata/proof auth=" {
				t.Errorf("%s got %q", sv.name, s)
			}
		}
		mu.Unlock()
		srv.Close()
	}

	// The secret from the environment is held to the same rule; a token
	// given explicitly is sent as it is.
	var mu sync.Mutex
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Write([]byte(`{"x":1}`))
	}))
	defer srv.Close()
	t.Setenv(authsecret.EnvSecret, secret)
	if _, err := open(t, srv.URL+"/metadata").Get(ctx, "k"); errs.CodeOf(err) != errs.Unauthenticated {
		t.Fatalf("with the secret from the environment: %v", err)
	}
	t.Setenv(httpmeta.EnvToken, "mooncake-token")
	if v, err := open(t, srv.URL+"/metadata").Get(ctx, "k"); err != nil || string(v) != `{"x":1}` {
		t.Fatalf("with an explicit token: %q %v", v, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(auth) != 2 || auth[0] != "" || auth[1] != "Bearer mooncake-token" {
		t.Fatalf("the server saw Authorization %q", auth)
	}
}
