package handoff_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache/handoff"
)

const (
	proofSecret = "handoff-proof-cluster-secret-001"
	otherSecret = "handoff-proof-other-secret-0002"
)

// recorder is an HTTP server on 127.0.0.1 that notes the path and the
// Authorization header of every request it gets, then hands it to h.
type recorder struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []string
}

func newRecorder(t *testing.T, h http.Handler) *recorder {
	r := &recorder{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.seen = append(r.seen, req.URL.Path+" auth="+req.Header.Get("Authorization"))
		r.mu.Unlock()
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *recorder) addr() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

// front is a recorder that forwards every request to the sidecar at addr,
// as a plain reverse proxy does.
func front(t *testing.T, addr string) *recorder {
	target, _ := url.Parse("http://" + addr)
	p := httputil.NewSingleHostReverseProxy(target)
	tr := &http.Transport{Proxy: nil}
	p.Transport = tr
	t.Cleanup(tr.CloseIdleConnections)
	return newRecorder(t, p)
}

// wantRefused checks that err is the client's refusal of a sidecar that did
// not prove the secret: Unauthenticated, naming the URL, why, and that the
// token was not sent.
func wantRefused(t *testing.T, what string, err error, sidecarURL, why string) {
	t.Helper()
	if errs.CodeOf(err) != errs.Unauthenticated || !errors.Is(err, errs.ErrUnauthenticated) ||
		!strings.Contains(err.Error(), "sidecar "+sidecarURL+" did not prove it holds the cluster secret") ||
		!strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "the sidecar token is not sent") {
		t.Fatalf("%s: got %v (code %v), want the client's Unauthenticated refusal of %s (%s)", what, err, errs.CodeOf(err), sidecarURL, why)
	}
}

// TestTokenNotSentToPlainSidecar: with a cluster secret, a plain HTTP server
// given as the sidecar is asked for a proof and gets no Authorization header
// at all, whatever it answers; every call fails with Unauthenticated naming
// the URL and saying the token was not sent. So with the secret from the
// environment (how libte and Python get it), and through an
// Options.HTTPClient. A token given in Options.Token still goes to it as
// given.
func TestTokenNotSentToPlainSidecar(t *testing.T) {
	sec, _ := authsecret.Parse(proofSecret)
	other, _ := authsecret.Parse(otherSecret)
	sc := startSidecar(t) // only for the engine's segment; the calls go to the plain servers
	pre := newLocal(t, sc, "tcp", prefillShape, time.Second)
	ctx := context.Background()

	servers := []struct {
		name string
		h    http.HandlerFunc
		why  string
	}{
		{"a server that answers 404", http.NotFound, "answered HTTP 404"},
		{"a server that answers 200 to everything", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"instance":"x"}`)) }, "does not match"},
		{"a server that answers the token as proof", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"instance":"i","proofs":["` + sec.Token() + `"]}`))
		}, "does not match"},
		{"a server that proves another secret", func(w http.ResponseWriter, r *http.Request) {
			n := r.URL.Query().Get("nonce")
			w.Write([]byte(`{"instance":"i","proofs":["` + other.Proofs(n, "i")[0] + `"]}`))
		}, "does not match"},
		{"a server that answers garbage", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("<html>")) }, "not a proof"},
	}
	for _, sv := range servers {
		t.Run(sv.name, func(t *testing.T) {
			rec := newRecorder(t, sv.h)
			c, err := handoff.New(pre.e, handoff.Options{Sidecar: rec.addr(), AuthSecret: proofSecret, RequestTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = c.Ready(ctx, handoff.Request{ID: "p1", Layout: &pre.cache.Layout, Blocks: srcBlocks})
			wantRefused(t, "ready", err, rec.srv.URL, sv.why)
			_, err = c.Expect(ctx, handoff.Request{ID: "p2", Layout: &pre.cache.Layout, Blocks: srcBlocks})
			wantRefused(t, "expect", err, rec.srv.URL, sv.why)
			seen := rec.got()
			if len(seen) != 2 {
				t.Fatalf("the server got %q, want one proof request per call", seen)
			}
			for _, s := range seen {
				if s != "/metadata/proof auth=" {
					t.Fatalf("the server got %q", s)
				}
			}
		})
	}

	rec := newRecorder(t, http.HandlerFunc(http.NotFound))
	t.Run("secret from the environment", func(t *testing.T) {
		t.Setenv(authsecret.EnvSecret, proofSecret)
		c, err := handoff.New(pre.e, handoff.Options{Sidecar: "http://" + rec.addr()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Ready(ctx, handoff.Request{ID: "p3", Layout: &pre.cache.Layout, Blocks: srcBlocks})
		wantRefused(t, "ready", err, rec.srv.URL, "answered HTTP 404")
	})
	t.Run("own http client", func(t *testing.T) {
		mine := &http.Transport{MaxIdleConnsPerHost: 2}
		c, err := handoff.New(pre.e, handoff.Options{Sidecar: rec.addr(), AuthSecret: proofSecret, HTTPClient: &http.Client{Transport: mine}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Ready(ctx, handoff.Request{ID: "p4", Layout: &pre.cache.Layout, Blocks: srcBlocks})
		wantRefused(t, "ready", err, rec.srv.URL, "answered HTTP 404")
		if mine.DialContext != nil {
			t.Fatal("the caller's transport was changed")
		}
		_, err = handoff.New(pre.e, handoff.Options{Sidecar: rec.addr(), AuthSecret: proofSecret,
			HTTPClient: &http.Client{Transport: roundTripper(func(*http.Request) (*http.Response, error) { return nil, errors.New("x") })}})
		if errs.CodeOf(err) != errs.InvalidArgument || !strings.Contains(err.Error(), "*http.Transport") {
			t.Fatalf("a transport the client cannot prove connections on: %v", err)
		}
	})
	for _, s := range rec.got() {
		if s != "/metadata/proof auth=" {
			t.Fatalf("the server got %q", s)
		}
	}

	t.Run("explicit token", func(t *testing.T) {
		rec := newRecorder(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{}`)) }))
		c, err := handoff.New(pre.e, handoff.Options{Sidecar: rec.addr(), Token: "the-users-own-token", AuthSecret: proofSecret})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Ready(ctx, handoff.Request{ID: "p5", Layout: &pre.cache.Layout, Blocks: srcBlocks})
		if errs.CodeOf(err) != errs.Protocol {
			t.Fatalf("ready to a server that answers {}: %v", err)
		}
		if seen := rec.got(); len(seen) != 1 || seen[0] != "/handoff/ready auth=Bearer the-users-own-token" {
			t.Fatalf("the server got %q, want the given token on /handoff/ready and no proof request", seen)
		}
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestTokenOnlyToProvenSidecar: a real te-sidecar with the same secret
// proves it and then gets the client's token (once per connection: two
// calls, one proof), and the handoff declaration goes through; te-sidecar
// with another secret is asked for a proof, gets no token and no
// declaration, and the call fails with Unauthenticated. A sidecar replaced
// at the same address by one with another secret is asked again on the
// new connection and gets nothing.
func TestTokenOnlyToProvenSidecar(t *testing.T) {
	sec, _ := authsecret.Parse(proofSecret)
	other, _ := authsecret.Parse(otherSecret)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()

	same := startSidecarWith(t, sidecar.Config{Secret: sec, Logger: quiet})
	pre := newLocal(t, same, "tcp", prefillShape, time.Second)
	token := sec.ClientToken(pre.e.Name())

	fs := front(t, same.addr)
	c, err := handoff.New(pre.e, handoff.Options{Sidecar: fs.addr(), AuthSecret: proofSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tx, err := c.Ready(ctx, handoff.Request{ID: "q1", Layout: &pre.cache.Layout, Blocks: srcBlocks})
	if err != nil {
		t.Fatalf("ready to te-sidecar with the same secret: %v", err)
	}
	st, err := tx.Status(ctx)
	if err != nil || st.State != "waiting" {
		t.Fatalf("status: %+v %v", st, err)
	}
	if err := tx.Abort(ctx, "test over"); err != nil {
		t.Fatal(err)
	}
	seen := fs.got()
	if len(seen) < 3 || seen[0] != "/metadata/proof auth=" || seen[1] != "/handoff/ready auth=Bearer "+token ||
		!strings.HasPrefix(seen[2], "/handoff/status auth=Bearer "+token) {
		t.Fatalf("te-sidecar got %q, want a proof, then the declaration and the status with the token", seen)
	}
	proofs := 0
	for _, s := range seen {
		if strings.HasPrefix(s, "/metadata/proof") {
			proofs++
		}
	}
	if proofs != 1 {
		t.Fatalf("te-sidecar got %q: %d proof requests over a kept-alive connection, want 1", seen, proofs)
	}

	another := startSidecarWith(t, sidecar.Config{Secret: other, Logger: quiet})
	fa := front(t, another.addr)
	c2, err := handoff.New(pre.e, handoff.Options{Sidecar: fa.addr(), AuthSecret: proofSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_, err = c2.Ready(ctx, handoff.Request{ID: "q2", Layout: &pre.cache.Layout, Blocks: srcBlocks})
	wantRefused(t, "ready to te-sidecar with another secret", err, fa.srv.URL, "does not match")
	if seen := fa.got(); len(seen) != 1 || seen[0] != "/metadata/proof auth=" {
		t.Fatalf("te-sidecar with another secret got %q, want only a proof request", seen)
	}

	// Replaced in place: the kept-alive connection dies with the old
	// sidecar, and the new connection proves again.
	direct, err := handoff.New(pre.e, handoff.Options{Sidecar: same.addr, AuthSecret: proofSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	tx, err = direct.Ready(ctx, handoff.Request{ID: "q3", Layout: &pre.cache.Layout, Blocks: srcBlocks})
	if err != nil {
		t.Fatal(err)
	}
	same.cfg.Secret = other
	same.restart()
	for i := 0; ; i++ {
		_, err = direct.Ready(ctx, handoff.Request{ID: "q4", Layout: &pre.cache.Layout, Blocks: srcBlocks})
		// A request racing the old connection's close may see it closed.
		if errs.CodeOf(err) != errs.PeerUnreachable || i == 2 {
			break
		}
	}
	wantRefused(t, "ready to the replaced sidecar", err, "http://"+same.addr, "does not match")
	if _, err := tx.Status(ctx); errs.CodeOf(err) != errs.Unauthenticated {
		t.Fatalf("status at the replaced sidecar: %v", err)
	}
}
