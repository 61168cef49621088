package sidecar_test

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
)

const (
	secretNow  = "the-current-cluster-secret-0001"
	secretPrev = "the-previous-cluster-secret-000"
)

func secrets(t *testing.T, text string) *authsecret.Secrets {
	t.Helper()
	s, err := authsecret.Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

// TestSecret: with a cluster secret every route but /healthz and /metrics
// needs the token derived from it (either secret during a rotation); the
// metadata token is accepted on /metadata only; nothing leaks to a caller
// without a token.
func TestSecret(t *testing.T) {
	sec := secrets(t, secretNow+"\n"+secretPrev)
	_, base := serve(t, sidecar.Config{Secret: sec, Token: "mooncake-token"})
	now, prev := authsecret.Token([]byte(secretNow)), authsecret.Token([]byte(secretPrev))
	other := authsecret.Token([]byte("another-cluster-secret-00000"))
	md := base + "/metadata?key=mooncake%2Fram%2Fseg"
	desc := `{"name":"seg","buffers":[{"te_key":"c2VjcmV0LWtleQ"}]}`
	for _, hdr := range [][]string{nil, bearer(other), bearer(now[:63]), bearer(secretNow), {"Authorization", now}} {
		for _, m := range []string{"GET", "PUT", "DELETE"} {
			c, b, h := do(t, m, md, []byte(desc), hdr...)
			if c != 401 || h.Get("WWW-Authenticate") != "Bearer" || strings.Contains(b, "te_key") {
				t.Fatalf("%s /metadata with %q: %d %q", m, hdr, c, b)
			}
			var e struct{ Code int }
			if json.Unmarshal([]byte(b), &e) != nil || errs.Code(e.Code) != errs.Unauthenticated {
				t.Fatalf("401 body %q", b)
			}
		}
		for _, r := range []struct{ m, p string }{{"POST", "/handoff/expect"}, {"POST", "/handoff/ready"}, {"POST", "/handoff/complete"},
			{"POST", "/handoff/abort"}, {"GET", "/handoff/status?id=x"}, {"GET", "/handoff/wait?id=x"}} {
			if c, _, _ := do(t, r.m, base+r.p, []byte(`{"id":"x","ok":true}`), hdr...); c != 401 {
				t.Fatalf("%s %s with %q: %d", r.m, r.p, hdr, c)
			}
		}
	}
	if c, _, _ := do(t, "PUT", md, []byte(desc), bearer(now)...); c != 200 {
		t.Fatalf("put with the token: %d", c)
	}
	for _, tok := range []string{now, prev, "mooncake-token"} {
		if c, b, _ := do(t, "GET", md, nil, bearer(tok)...); c != 200 || b != desc {
			t.Fatalf("get with %s: %d %q", tok, c, b)
		}
	}
	// The metadata token opens /metadata only.
	if c, _, _ := do(t, "GET", base+"/handoff/status?id=x", nil, bearer("mooncake-token")...); c != 401 {
		t.Fatalf("handoff with the metadata token: %d", c)
	}
	if c, _, _ := do(t, "GET", base+"/handoff/status?id=x", nil, bearer(prev)...); c != 404 {
		t.Fatalf("handoff with the previous secret's token: %d", c)
	}
	for _, p := range []string{"/healthz", "/metrics"} {
		if c, _, _ := do(t, "GET", base+p, nil); c != 200 {
			t.Fatalf("%s without a token: %d", p, c)
		}
	}
	_, m, _ := do(t, "GET", base+"/metrics", nil)
	if !strings.Contains(m, `te_sidecar_refused_total{reason="unauthenticated"} 46`) {
		t.Errorf("refusals not counted:\n%s", m)
	}
}

// TestNoSecretLoopbackOnly: without a secret te-sidecar serves loopback
// only, unless -insecure says to trust the network.
func TestNoSecretLoopbackOnly(t *testing.T) {
	none := func(string) string { return "" }
	o, err := sidecar.ParseOptions(nil, none, io.Discard)
	if err != nil || o.Addr != "127.0.0.1:8080" {
		t.Fatalf("default without a secret: %q %v", o.Addr, err)
	}
	for _, addr := range []string{":8080", "0.0.0.0:8080", "10.1.2.3:80", "[::]:80", "example.com:80"} {
		if _, err := sidecar.ParseOptions([]string{"-addr", addr}, none, io.Discard); err == nil || !strings.Contains(err.Error(), "-insecure") {
			t.Errorf("%s without a secret: %v", addr, err)
		}
		if o, err := sidecar.ParseOptions([]string{"-addr", addr, "-insecure"}, none, io.Discard); err != nil || !o.Insecure {
			t.Errorf("%s with -insecure: %v", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "127.9.9.9:1", "[::1]:80", "localhost:80"} {
		if _, err := sidecar.ParseOptions([]string{"-addr", addr}, none, io.Discard); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
	env := map[string]string{"TE_SIDECAR_INSECURE": "1", "TE_SIDECAR_ADDR": ":9"}
	if _, err := sidecar.ParseOptions(nil, func(k string) string { return env[k] }, io.Discard); err != nil {
		t.Errorf("TE_SIDECAR_INSECURE=1: %v", err)
	}
	env["TE_SIDECAR_INSECURE"] = "maybe"
	if _, err := sidecar.ParseOptions(nil, func(k string) string { return env[k] }, io.Discard); err == nil {
		t.Error("TE_SIDECAR_INSECURE=maybe accepted")
	}

	// With a secret, from the file flag or the environment, every address
	// goes and the default is every interface.
	file := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(file, []byte(secretNow+"\n"), 0o600)
	o, err = sidecar.ParseOptions([]string{"-auth-secret-file", file}, none, io.Discard)
	if err != nil || o.Addr != ":8080" {
		t.Fatalf("default with a secret: %q %v", o.Addr, err)
	}
	// In a pod (POD_IP from the downward API) the default is the pod's
	// own address, and -h says what the default binds.
	pod := map[string]string{authsecret.EnvSecret: secretNow, sidecar.EnvPodIP: "10.4.5.6"}
	if o, err = sidecar.ParseOptions(nil, func(k string) string { return pod[k] }, io.Discard); err != nil || o.Addr != "10.4.5.6:8080" {
		t.Fatalf("default with a secret in a pod: %q %v", o.Addr, err)
	}
	var help strings.Builder
	sidecar.ParseOptions([]string{"-h"}, none, &help)
	if !strings.Contains(help.String(), "every interface") || !strings.Contains(help.String(), "POD_IP") {
		t.Fatalf("-h does not say what the default binds:\n%s", help.String())
	}
	env = map[string]string{authsecret.EnvSecret: secretNow, "TE_SIDECAR_ADDR": "0.0.0.0:9"}
	if _, err := sidecar.ParseOptions(nil, func(k string) string { return env[k] }, io.Discard); err != nil {
		t.Fatalf("secret from the environment: %v", err)
	}
	env[authsecret.EnvSecret] = "short"
	if _, err := sidecar.ParseOptions(nil, func(k string) string { return env[k] }, io.Discard); err == nil {
		t.Fatal("a weak secret was accepted")
	}
	if _, err := sidecar.ParseOptions([]string{"-auth-secret-file", file + ".missing"}, none, io.Discard); err == nil {
		t.Fatal("a missing secret file was accepted")
	}
}

// TestDaemonWithSecret: the te-sidecar binary reads its secret from
// TE_AUTH_SECRET_FILE, with the previous secret on the second line during a
// rotation, and a bad secret file stops it at start.
func TestDaemonWithSecret(t *testing.T) {
	file := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(file, []byte(secretNow+"\n"+secretPrev+"\n"), 0o600)
	d := startDaemon(t, authsecret.EnvSecretFile+"="+file)
	for _, c := range []struct {
		tok  string
		want int
	}{{"", 401}, {authsecret.Token([]byte("some-other-cluster-secret")), 401},
		{authsecret.Token([]byte(secretNow)), 404}, {authsecret.Token([]byte(secretPrev)), 404}} {
		var hdr []string
		if c.tok != "" {
			hdr = bearer(c.tok)
		}
		if code, _, _ := do(t, "GET", d.base+"/handoff/status?id=x", nil, hdr...); code != c.want {
			t.Fatalf("token %q: %d, want %d", c.tok, code, c.want)
		}
	}
	if code, _, _ := do(t, "GET", d.base+"/healthz", nil); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
	os.WriteFile(file, []byte("short\n"), 0o600)
	cmd := exec.Command(sidecarBinary(t), "-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), authsecret.EnvSecretFile+"="+file)
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "secret") {
		t.Fatalf("a weak secret file: %v, %s", err, out)
	}
}

// TestMetadataProof: GET /metadata/proof is open and answers a nonce with
// the HMAC proofs of the sidecar's secrets bound to the nonce and its
// instance (the one /healthz reports); a bad nonce is refused, a sidecar
// without a secret has nothing to prove, and the answer holds no token.
func TestMetadataProof(t *testing.T) {
	sec := secrets(t, secretNow+"\n"+secretPrev)
	_, base := serve(t, sidecar.Config{Secret: sec, Token: "mooncake-token"})
	nonce := authsecret.NewNonce()
	c, b, _ := do(t, "GET", base+"/metadata/proof?nonce="+nonce, nil)
	var a authsecret.ProofAnswer
	if c != 200 || json.Unmarshal([]byte(b), &a) != nil {
		t.Fatalf("proof: %d %q", c, b)
	}
	var h sidecar.Health
	if c, hb, _ := do(t, "GET", base+"/healthz", nil); c != 200 || json.Unmarshal([]byte(hb), &h) != nil || h.Instance == "" {
		t.Fatalf("healthz: %d %q", c, hb)
	}
	want := []string{authsecret.Proof([]byte(secretNow), nonce, h.Instance), authsecret.Proof([]byte(secretPrev), nonce, h.Instance)}
	if a.Instance != h.Instance || len(a.Proofs) != 2 || a.Proofs[0] != want[0] || a.Proofs[1] != want[1] {
		t.Fatalf("answer %+v, want instance %s proofs %q", a, h.Instance, want)
	}
	if !sec.Proves(&a, nonce) || !(&authsecret.Secrets{Current: []byte(secretPrev)}).Proves(&a, nonce) {
		t.Fatal("the answer does not prove either secret")
	}
	for _, tok := range []string{sec.Token(), authsecret.Token([]byte(secretPrev)), "mooncake-token"} {
		if strings.Contains(b, tok) {
			t.Fatalf("the proof answer holds a token: %q", b)
		}
	}
	for _, q := range []string{"", "?nonce=", "?nonce=abc", "?nonce=" + strings.ToUpper(nonce), "?nonce=" + nonce + "&nonce=" + nonce,
		"?nonce=" + strings.Repeat("a", authsecret.MaxNonceLen+1), "?nonce=" + nonce + "&key=x"} {
		var e struct{ Code int32 }
		if c, b, _ := do(t, "GET", base+"/metadata/proof"+q, nil); c != 400 || json.Unmarshal([]byte(b), &e) != nil || errs.Code(e.Code) != errs.InvalidArgument {
			t.Errorf("proof%s: %d %q", q, c, b)
		}
	}
	_, open := serve(t, sidecar.Config{})
	if c, b, _ := do(t, "GET", open+"/metadata/proof?nonce="+nonce, nil); c != 404 || !isError(b, int32(errs.NotFound), "this sidecar has no cluster secret: it has nothing to prove") {
		t.Fatalf("proof without a secret: %d %q", c, b)
	}
}
