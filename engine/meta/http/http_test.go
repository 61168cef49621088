package httpmeta_test

import (
	_ "github.com/tecache/te/engine/std"

	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/meta"
	httpmeta "github.com/tecache/te/engine/meta/http"
	"github.com/tecache/te/engine/meta/internal/storetest"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
)

// envSidecar makes the re-executed test binary run te-sidecar, exactly as
// cmd/te-sidecar does.
const envSidecar = "TE_HTTPMETA_TEST_SIDECAR"

func TestMain(m *testing.M) {
	if os.Getenv(envSidecar) != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		code := sidecar.Main(ctx, os.Args[1:], os.Getenv, os.Stderr)
		stop()
		os.Exit(code)
	}
	storetest.Main(m)
}

// sidecarServer runs te-sidecar's server in this process on a fixed port, so
// that it can be stopped and started again (empty, as a restarted sidecar).
type sidecarServer struct {
	t      *testing.T
	addr   string
	token  string
	secret *authsecret.Secrets
	srv    *sidecar.Server
	done   chan error
}

func startSidecar(t *testing.T, token string) *sidecarServer {
	s := &sidecarServer{t: t, addr: fmt.Sprintf("127.0.0.1:%d", storetest.FreePort(t)), token: token}
	s.Up()
	t.Cleanup(s.Down)
	return s
}

func (s *sidecarServer) Up() {
	s.t.Helper()
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		s.t.Fatal(err)
	}
	s.srv = sidecar.New(sidecar.Config{Token: s.token, Secret: s.secret, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	s.done = make(chan error, 1)
	go func() { s.done <- s.srv.Serve(ln) }()
}

func (s *sidecarServer) Down() {
	if s.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.srv.Shutdown(ctx)
	<-s.done
	s.srv = nil
}

// TestEngines runs te-sidecar as a process; the outage kills it (SIGKILL)
// and starts a fresh, empty one on the same port.
func TestEngines(t *testing.T) {
	sc := storetest.Process(t, "te-sidecar", func(port int) []string {
		return []string{os.Args[0], "-addr", fmt.Sprintf("127.0.0.1:%d", port), "-log-level", "warn"}
	}, envSidecar+"=1")
	storetest.Run(t, storetest.Setup{
		Conn: "http://" + sc.Addr() + "/metadata?refresh=200ms&timeout=1s",
		Down: sc.Stop,
		Up:   sc.Start,
	})
}

// TestInProcessRestart does the same with te-sidecar's server in this
// process, shut down gracefully and started again empty.
func TestInProcessRestart(t *testing.T) {
	sc := startSidecar(t, "")
	storetest.Outage(t, storetest.Setup{
		Conn: "http://" + sc.addr + "/metadata?refresh=200ms&timeout=1s",
		Down: sc.Down,
		Up:   sc.Up,
	})
}

func open(t *testing.T, conn string) *httpmeta.Store {
	t.Helper()
	s, err := httpmeta.Open(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStore(t *testing.T) {
	sc := startSidecar(t, "")
	ctx := context.Background()
	s := open(t, "http://"+sc.addr+"/metadata?cluster=c7")
	if s.URL() != "http://"+sc.addr+"/metadata" {
		t.Fatalf("URL %q keeps te's settings", s.URL())
	}
	if _, err := s.Get(ctx, meta.KeyRAM("a b&c")); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("missing key: %v", err)
	}
	if err := s.Put(ctx, meta.KeyRAM("a b&c"), []byte(`{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, meta.KeyRAM("a b&c")); err != nil || string(v) != `{"x":1}` {
		t.Fatalf("get: %q %v", v, err)
	}
	// Stored under Mooncake's key, escaped in the query.
	if v, ok := sc.srv.KV().Get("mooncake/c7/ram/a b&c"); !ok || string(v) != `{"x":1}` {
		t.Fatalf("sidecar holds %q %v", v, ok)
	}
	if err := s.Delete(ctx, meta.KeyRAM("a b&c")); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, meta.KeyRAM("a b&c")); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	if _, err := s.Get(ctx, meta.KeyRAM("a b&c")); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("deleted key: %v", err)
	}
}

func TestToken(t *testing.T) {
	sc := startSidecar(t, "s3cret")
	ctx := context.Background()
	s := open(t, "http://"+sc.addr+"/metadata")
	err := s.Put(ctx, "k", []byte("v"))
	if errs.CodeOf(err) != errs.Metadata || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), httpmeta.EnvToken) {
		t.Fatalf("put without the token: %v", err)
	}
	t.Setenv(httpmeta.EnvToken, "s3cret")
	s2 := open(t, "http://"+sc.addr+"/metadata")
	if err := s2.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := s2.Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("get with the token: %q %v", v, err)
	}
}

// TestSecret: against te-sidecar with a cluster secret, the store sends
// the token derived from the secret it is given (as an engine passes its
// own) or finds in TE_AUTH_SECRET; without one it gets a Metadata error
// that says what to set; MC_METADATA_HTTP_TOKEN, when set, is sent as is.
func TestSecret(t *testing.T) {
	const secret = "metadata-test-cluster-secret-01"
	sec, err := authsecret.Parse(secret)
	if err != nil {
		t.Fatal(err)
	}
	sc := &sidecarServer{t: t, addr: fmt.Sprintf("127.0.0.1:%d", storetest.FreePort(t)), secret: sec, token: "mooncake-token"}
	sc.Up()
	t.Cleanup(sc.Down)
	ctx := context.Background()
	conn := "http://" + sc.addr + "/metadata"

	s := open(t, conn)
	err = s.Put(ctx, "k", []byte("v"))
	if errs.CodeOf(err) != errs.Metadata || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), authsecret.EnvSecret) {
		t.Fatalf("put without the secret: %v", err)
	}
	given, err := meta.OpenWith(conn, meta.Options{AuthSecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer given.Close()
	if err := given.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("put with the given secret: %v", err)
	}
	t.Setenv(authsecret.EnvSecret, secret)
	if v, err := open(t, conn).Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("get with the secret from the environment: %q %v", v, err)
	}
	t.Setenv(httpmeta.EnvToken, "mooncake-token")
	if v, err := open(t, conn).Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("get with the Mooncake token: %q %v", v, err)
	}
	t.Setenv(httpmeta.EnvToken, "")
	t.Setenv(authsecret.EnvSecret, "weak")
	if _, err := httpmeta.Open(conn); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("a weak secret: %v", err)
	}
}

// TestRetries: 5xx answers are retried, 4xx are not, and a server that
// never answers costs the timeout, not more.
func TestRetries(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		switch r.URL.Query().Get("key") {
		case "flaky":
			if n < 3 {
				http.Error(w, "busy", http.StatusServiceUnavailable)
				return
			}
			w.Write([]byte("ok"))
		case "bad":
			http.Error(w, "no", http.StatusBadRequest)
		case "slow":
			// Never answers in time; returns once the client gives up.
			select {
			case <-r.Context().Done():
			case <-time.After(30 * time.Second):
			}
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	s := open(t, srv.URL+"/metadata?retries=3&timeout=500ms")
	if v, err := s.Get(ctx, "flaky"); err != nil || string(v) != "ok" || calls.Load() != 3 {
		t.Fatalf("flaky: %q %v after %d calls", v, err, calls.Load())
	}
	calls.Store(0)
	if _, err := s.Get(ctx, "bad"); errs.CodeOf(err) != errs.Metadata || calls.Load() != 1 {
		t.Fatalf("bad: %v after %d calls", err, calls.Load())
	}
	t0 := time.Now()
	if _, err := s.Get(ctx, "slow"); errs.CodeOf(err) != errs.Timeout {
		t.Fatalf("slow: %v", err)
	}
	if d := time.Since(t0); d > 10*time.Second { // the server would hold it 30 s
		t.Fatalf("slow server held the caller %v", d)
	}
}

func TestUnreachable(t *testing.T) {
	s := open(t, fmt.Sprintf("http://127.0.0.1:%d/metadata?timeout=300ms", storetest.FreePort(t)))
	t0 := time.Now()
	_, err := s.Get(context.Background(), "k")
	if c := errs.CodeOf(err); c != errs.Metadata && c != errs.Timeout {
		t.Fatalf("get from nowhere: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second { // a few times the 300 ms timeout, not a hang
		t.Fatalf("took %v", d)
	}
}

func TestOpenErrors(t *testing.T) {
	for _, c := range []string{"http://", "http://h:1/metadata?timeout=0", "http://h:1/m?retries=x", "http://a b:1/",
		"https://h:1/?refresh=-1s"} {
		if s, err := meta.Open(c); errs.CodeOf(err) != errs.InvalidArgument {
			if s != nil {
				s.Close()
			}
			t.Errorf("%q: %v, want InvalidArgument", c, err)
		}
	}
}

func ExampleOpen() {
	s, err := httpmeta.Open("http://127.0.0.1:8080/metadata?timeout=2s&cluster=prod")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	fmt.Println(s.URL())
	// Output: http://127.0.0.1:8080/metadata
}

// BenchmarkGet: the client against te-sidecar as a separate process.
func BenchmarkGet(b *testing.B) {
	sc := storetest.Process(b, "te-sidecar", func(port int) []string {
		return []string{os.Args[0], "-addr", fmt.Sprintf("127.0.0.1:%d", port), "-log-level", "warn"}
	}, envSidecar+"=1")
	s, err := httpmeta.Open("http://" + sc.Addr() + "/metadata")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.BenchGet(b, s)
}

// TestEngineSecretReachesStore: an engine given the cluster secret only in its
// Config publishes through te-sidecar's /metadata with the token derived from
// it, and a peer engine with the same secret opens its segment; an engine
// without the secret cannot publish there at all.
func TestEngineSecretReachesStore(t *testing.T) {
	const secret = "metadata-test-cluster-secret-02"
	sec, _ := authsecret.Parse(secret)
	sc := &sidecarServer{t: t, addr: fmt.Sprintf("127.0.0.1:%d", storetest.FreePort(t)), secret: sec}
	sc.Up()
	t.Cleanup(sc.Down)
	conn := "http://" + sc.addr + "/metadata"
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := func(name, secret string) engine.Config {
		return engine.Config{SegmentName: name, Metadata: conn, ListenAddr: "127.0.0.1:0", AuthSecret: secret, Logger: quiet}
	}
	a, err := engine.New(cfg("a", secret))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := engine.New(cfg("b", secret))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	seg, err := b.OpenSegment("a")
	if err != nil {
		t.Fatalf("open a segment published with the Config's secret: %v", err)
	}
	b.CloseSegment(seg)
	if _, err := engine.New(cfg("c", "")); errs.CodeOf(err) != errs.Metadata {
		t.Fatalf("an engine without the secret published: %v", err)
	}
}
