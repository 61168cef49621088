package authsecret_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	cur  = "0123456789abcdef-cluster"
	prev = "fedcba9876543210-previous"
	// hmac.new(cur, b"te-sidecar-token v1", hashlib.sha256).hexdigest(),
	// computed with Python's hmac module.
	curToken = "4c06c78bc1fc45d4b3feff06c7e9f12f0394f68236ce3de711e539c220f7d01a"
)

func TestParse(t *testing.T) {
	s, err := authsecret.Parse("  " + cur + "\r\n")
	if err != nil || string(s.Current) != cur || s.Previous != nil {
		t.Fatalf("one line: %+v %v", s, err)
	}
	s, err = authsecret.Parse(cur + "\n" + prev + "\n\n")
	if err != nil || string(s.Current) != cur || string(s.Previous) != prev {
		t.Fatalf("rotation: %+v %v", s, err)
	}
	// Blank lines are skipped, as a secret file's editor may leave them.
	s, err = authsecret.Parse(cur + "\n\n" + prev)
	if err != nil || string(s.Previous) != prev {
		t.Fatalf("blank line between: %+v %v", s, err)
	}
	// The same secret twice is one secret.
	s, err = authsecret.Parse(cur + "\n" + cur)
	if err != nil || s.Previous != nil {
		t.Fatalf("same secret twice: %+v %v", s, err)
	}
	for _, bad := range []string{"", "\n\n", "short", cur + "\nshort", cur + "\n" + prev + "\n" + cur} {
		if _, err := authsecret.Parse(bad); errs.CodeOf(err) != errs.InvalidArgument {
			t.Errorf("%q: %v, want InvalidArgument", bad, err)
		}
	}
}

func TestToken(t *testing.T) {
	s, _ := authsecret.Parse(cur + "\n" + prev)
	if s.Token() != curToken || authsecret.Token([]byte(cur)) != curToken {
		t.Fatalf("token %s, want %s", s.Token(), curToken)
	}
	ts := s.Tokens()
	if len(ts) != 2 || ts[0] != curToken || ts[1] != authsecret.Token([]byte(prev)) || ts[0] == ts[1] {
		t.Fatalf("tokens %v", ts)
	}
	if !authsecret.Match(curToken, ts) || !authsecret.Match(ts[1], ts) {
		t.Fatal("a valid token does not match")
	}
	for _, bad := range []string{"", curToken[:63], curToken + "0", strings.ToUpper(curToken), cur} {
		if authsecret.Match(bad, ts) {
			t.Errorf("%q matches", bad)
		}
	}
	if authsecret.Match("", []string{""}) {
		t.Error("an empty token matches an empty list entry")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "secret")
	if err := os.WriteFile(file, []byte(prev+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	get := func(k string) string { return env[k] }
	if s, err := authsecret.Load("", "", get); s != nil || err != nil {
		t.Fatalf("nothing set: %+v %v", s, err)
	}
	env[authsecret.EnvSecret] = cur
	if s, err := authsecret.Load("", "", get); err != nil || string(s.Current) != cur {
		t.Fatalf("from %s: %+v %v", authsecret.EnvSecret, s, err)
	}
	env[authsecret.EnvSecretFile] = file // the file wins over the value
	if s, err := authsecret.Load("", "", get); err != nil || string(s.Current) != prev {
		t.Fatalf("from %s: %+v %v", authsecret.EnvSecretFile, s, err)
	}
	if s, err := authsecret.Load(cur, file, get); err != nil || string(s.Current) != cur {
		t.Fatalf("an explicit value wins: %+v %v", s, err)
	}
	if s, err := authsecret.Load("", file, nil); err != nil || string(s.Current) != prev {
		t.Fatalf("an explicit file: %+v %v", s, err)
	}
	env[authsecret.EnvSecretFile] = filepath.Join(dir, "missing")
	if _, err := authsecret.Load("", "", get); errs.CodeOf(err) != errs.InvalidArgument || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, []byte(strings.Repeat("x", 70<<10)), 0o600)
	if _, err := authsecret.Load("", big, nil); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("oversized file: %v", err)
	}
	delete(env, authsecret.EnvSecretFile)
	env[authsecret.EnvSecret] = "weak"
	if _, err := authsecret.Load("", "", get); errs.CodeOf(err) != errs.InvalidArgument || !strings.Contains(err.Error(), authsecret.EnvSecret) {
		t.Fatalf("weak secret: %v", err)
	}
}

func ExampleToken() {
	// What a client sends to te-sidecar: Authorization: Bearer <token>.
	fmt.Println(authsecret.Token([]byte("0123456789abcdef-cluster")))
	// Output: 4c06c78bc1fc45d4b3feff06c7e9f12f0394f68236ce3de711e539c220f7d01a
}

// TestClientToken: a client's token, checked against openssl's
// (printf 'te-sidecar-client v1\n%s' NAME | openssl dgst -sha256 -hmac SECRET),
// differs per name, from the cluster token, and per secret.
func TestClientToken(t *testing.T) {
	s, err := authsecret.Parse(cur + "\n" + prev)
	if err != nil {
		t.Fatal(err)
	}
	const want = "f1f5e4b16d3dc23f8089c00865f1195ffcfbece1739a8d6dd2f647cb351e17bb"
	if got := s.ClientToken("decode-0"); got != want {
		t.Fatalf("client token %s, want %s", got, want)
	}
	ts := s.ClientTokens("decode-0")
	if len(ts) != 2 || ts[0] != want || ts[1] != authsecret.ClientToken([]byte(prev), "decode-0") || ts[0] == ts[1] {
		t.Fatalf("client tokens %q", ts)
	}
	for _, other := range []string{s.ClientToken("decode-1"), s.ClientToken(""), s.Token()} {
		if authsecret.Match(other, ts) {
			t.Fatalf("%s matches decode-0's tokens", other)
		}
	}
}

// TestSecretFileNotRegular: a secret file naming a FIFO (nobody writing),
// a directory or a device is refused at once with what it is, rather than
// blocking the caller on open or read.
func TestSecretFileNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "secret.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, kind string }{
		{fifo, "named pipe"}, {dir, "directory"}, {"/dev/null", "character device"},
	} {
		done := make(chan error, 1)
		go func() {
			_, err := authsecret.Load("", "", func(k string) string {
				if k == authsecret.EnvSecretFile {
					return c.path
				}
				return ""
			})
			done <- err
		}()
		select {
		case err := <-done:
			if errs.CodeOf(err) != errs.InvalidArgument || !strings.Contains(err.Error(), c.kind) ||
				!strings.Contains(err.Error(), "not a regular file") || !strings.Contains(err.Error(), authsecret.EnvSecretFile) {
				t.Errorf("%s: %v, want invalid argument naming %s, a %s", c.path, err, authsecret.EnvSecretFile, c.kind)
			}
		case <-time.After(5 * time.Second):
			// Unblock the open so the goroutine ends, then fail.
			if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
			<-done
			t.Fatalf("%s: loading the secret blocked", c.path)
		}
	}
}

// TestProof: the sidecar's proof, checked against Python's hmac
// (k = hmac.new(secret, b"te-sidecar-proof v1", sha256).digest();
// hmac.new(k, nonce + b"\n" + instance, sha256).hexdigest()), is bound to
// the nonce, the instance and the secret, is never the token, and proves
// only the current secret to a client.
func TestProof(t *testing.T) {
	const nonce = "00112233445566778899aabbccddeeff"
	const want = "7171ca7b93672a866f01c7186e064e00706cc7eecfdc290ada8382219288cbc9"
	s, err := authsecret.Parse(cur + "\n" + prev)
	if err != nil {
		t.Fatal(err)
	}
	if got := authsecret.Proof([]byte(cur), nonce, "sidecar-1"); got != want {
		t.Fatalf("proof %s, want %s", got, want)
	}
	ps := s.Proofs(nonce, "sidecar-1")
	if len(ps) != 2 || ps[0] != want || ps[1] != authsecret.Proof([]byte(prev), nonce, "sidecar-1") {
		t.Fatalf("proofs %q", ps)
	}
	if !s.Proves(&authsecret.ProofAnswer{Instance: "sidecar-1", Proofs: ps}, nonce) {
		t.Fatal("a sidecar's own answer does not prove")
	}
	other, _ := authsecret.Parse(prev) // a sidecar that holds only our previous secret
	for name, a := range map[string]*authsecret.ProofAnswer{
		"another nonce":         {Instance: "sidecar-1", Proofs: s.Proofs(nonce[:31]+"0", "sidecar-1")},
		"another instance":      {Instance: "sidecar-2", Proofs: ps},
		"the token":             {Instance: "sidecar-1", Proofs: []string{s.Token()}},
		"the previous secret":   {Instance: "sidecar-1", Proofs: other.Proofs(nonce, "sidecar-1")},
		"no instance":           {Proofs: s.Proofs(nonce, "")},
		"no proof":              {Instance: "sidecar-1"},
		"too many proofs":       {Instance: "sidecar-1", Proofs: []string{"a", "b", ps[0]}},
		"an overlong instance":  {Instance: strings.Repeat("i", authsecret.MaxInstanceLen+1), Proofs: s.Proofs(nonce, strings.Repeat("i", authsecret.MaxInstanceLen+1))},
		"an upper-case proof":   {Instance: "sidecar-1", Proofs: []string{strings.ToUpper(ps[0])}},
		"the proof under token": {Instance: "sidecar-1", Proofs: []string{authsecret.Proof([]byte(s.Token()), nonce, "sidecar-1")}},
	} {
		if s.Proves(a, nonce) {
			t.Errorf("%s proves", name)
		}
	}
	if s.Proves(nil, nonce) {
		t.Error("no answer proves")
	}
	n1, n2 := authsecret.NewNonce(), authsecret.NewNonce()
	if n1 == n2 || !authsecret.ValidNonce(n1) || len(n1) != 2*authsecret.NonceBytes {
		t.Fatalf("nonces %q %q", n1, n2)
	}
	for _, bad := range []string{"", nonce[:31], strings.ToUpper(nonce), nonce + "\n", nonce[:30] + "zz", strings.Repeat("a", authsecret.MaxNonceLen+1)} {
		if authsecret.ValidNonce(bad) {
			t.Errorf("nonce %q is valid", bad)
		}
	}
}
