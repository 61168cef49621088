package httpmeta

import (
	"context"
	"crypto/x509"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
)

// TestProofOverHTTPS: over https the certificate is verified before
// anything is sent (an untrusted one gets no request at all), and then the
// server proves it holds the secret, on the TLS connection, before the
// token goes out on it. The server is te-sidecar behind a TLS-terminating
// proxy, as an operator would run it.
func TestProofOverHTTPS(t *testing.T) {
	const secret = "metadata-test-cluster-secret-05"
	sec, _ := authsecret.Parse(secret)
	sc := sidecar.New(sidecar.Config{Secret: sec, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sc.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		sc.Shutdown(ctx)
		<-done
	}()
	target, _ := url.Parse("http://" + ln.Addr().String())
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = &http.Transport{Proxy: nil}
	defer proxy.Transport.(*http.Transport).CloseIdleConnections()
	var mu sync.Mutex
	var seen []string
	front := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path+" auth="+r.Header.Get("Authorization"))
		mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	front.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	front.StartTLS()
	defer front.Close()
	conn := front.URL + "/metadata?timeout=2s&refresh=1h"
	ctx := context.Background()

	untrusted, err := OpenWith(conn, meta.Options{AuthSecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	err = untrusted.Put(ctx, "k", []byte("v"))
	untrusted.Close()
	if errs.CodeOf(err) != errs.Metadata || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("put to an untrusted certificate: %v", err)
	}
	mu.Lock()
	if len(seen) != 0 {
		t.Fatalf("a server with an untrusted certificate got %q", seen)
	}
	mu.Unlock()

	st, err := OpenWith(conn, meta.Options{AuthSecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.proof.Roots = x509.NewCertPool()
	st.proof.Roots.AddCert(front.Certificate())
	if err := st.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("put over https: %v", err)
	}
	if v, err := st.Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("get over https: %q %v", v, err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"/metadata/proof auth=", "/metadata auth=Bearer " + sec.Token(), "/metadata auth=Bearer " + sec.Token()}
	if strings.Join(seen, "|") != strings.Join(want, "|") {
		t.Fatalf("the server saw %q, want %q", seen, want)
	}
}
