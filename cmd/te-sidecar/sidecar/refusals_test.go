package sidecar_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tecache/te/cmd/te-sidecar/api"
	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
)

// TestRefusalsNameTheirInput: a bad setting is refused with the flag or
// variable it came from and the form expected.
func TestRefusalsNameTheirInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{[]string{"-max-keys=-5"}, nil, []string{"-max-keys=-5", "must be positive", "a whole number of at least 1"}},
		{[]string{"-handoff-client-bytes", "0"}, nil, []string{"-handoff-client-bytes=0", "must be positive"}},
		{[]string{"-handoff-settle-grace", "0s"}, nil, []string{"-handoff-settle-grace=0s", "must be positive"}},
		{[]string{"-shutdown-timeout", "0s"}, nil, []string{"-shutdown-timeout=0s", "a duration over 0 such as 10s"}},
		{nil, map[string]string{"TE_SIDECAR_MAX_KEYS": "-5"}, []string{"TE_SIDECAR_MAX_KEYS=-5", "must be positive", "-max-keys"}},
		{nil, map[string]string{"TE_SIDECAR_MAX_KEYS": "many"}, []string{`TE_SIDECAR_MAX_KEYS="many"`, "want a whole number such as 1048576"}},
		{nil, map[string]string{"TE_SIDECAR_SHUTDOWN_TIMEOUT": "10"}, []string{`TE_SIDECAR_SHUTDOWN_TIMEOUT="10"`, "want a duration with its unit such as 10s"}},
		{nil, map[string]string{"TE_SIDECAR_INSECURE": "yes"}, []string{`TE_SIDECAR_INSECURE="yes"`, "want 1, true, 0 or false"}},
		{nil, map[string]string{"TE_SIDECAR_LOG_REFUSALS_PER_SECOND": "-1"}, []string{"TE_SIDECAR_LOG_REFUSALS_PER_SECOND=-1", "a number over 0"}},
	} {
		_, err := sidecar.ParseOptions(c.args, func(k string) string { return c.env[k] }, &bytes.Buffer{})
		if err == nil {
			t.Errorf("%v %v: accepted", c.args, c.env)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v %v: %q does not say %q", c.args, c.env, err, w)
			}
		}
	}
}

// TestUnauthenticatedSaysWhich: no token, a header that is not a bearer
// token, and a wrong token get three different reasons; every wrong token
// gets the same one, however much of the right token it shares, and no
// answer repeats what was sent.
func TestUnauthenticatedSaysWhich(t *testing.T) {
	_, base := serve(t, sidecar.Config{Secret: secrets(t, secretNow)})
	now := authsecret.Token([]byte(secretNow))
	reason := func(hdr ...string) string {
		t.Helper()
		c, b, _ := do(t, "GET", base+"/handoff/status?id=x", nil, hdr...)
		var e struct {
			Error string
			Code  int
		}
		if c != 401 || json.Unmarshal([]byte(b), &e) != nil || errs.Code(e.Code) != errs.Unauthenticated {
			t.Fatalf("%q: %d %s", hdr, c, b)
		}
		if len(hdr) == 2 {
			if tok := strings.TrimPrefix(hdr[1], "Bearer "); len(tok) >= 8 && strings.Contains(e.Error, tok) {
				t.Fatalf("the refusal repeats the token: %q", e.Error)
			}
		}
		return e.Error
	}
	missing := reason()
	notBearer := reason("Authorization", "Basic dXNlcjpwYXNz")
	empty := reason("Authorization", "Bearer ")
	wrong := reason(bearer(authsecret.Token([]byte("another-cluster-secret-00000")))...)
	if !strings.Contains(missing, "no token") || !strings.Contains(notBearer, "not \"Bearer <token>\"") ||
		!strings.Contains(wrong, "does not match") || empty != notBearer {
		t.Fatalf("reasons: missing %q, not bearer %q, empty %q, wrong %q", missing, notBearer, empty, wrong)
	}
	for _, tok := range []string{now[:63], now + "0", strings.ToUpper(now), now[:1], secretNow} {
		if r := reason(bearer(tok)...); r != wrong {
			t.Errorf("token %q answers %q, another wrong token %q: a difference tells something about the token", tok, r, wrong)
		}
	}
	if c, _, _ := do(t, "GET", base+"/handoff/status?id=x", nil, bearer(now)...); c != 404 {
		t.Fatalf("the right token: %d", c)
	}
}

// TestOpenRoutes: the routes -h, the log and the OpenAPI document name as
// open (sidecar.OpenRoutes) are those of the route table that need no
// token, and each answers without one on a server with a secret.
func TestOpenRoutes(t *testing.T) {
	s, base := serve(t, sidecar.Config{Secret: secrets(t, secretNow)})
	var open []string
	for _, r := range s.Routes() {
		if r.Auth == api.Open {
			open = append(open, r.Path)
			q := ""
			if r.Declares("nonce") {
				q = "?nonce=" + authsecret.NewNonce() // the proof's required parameter
			}
			if c, _, _ := do(t, r.Method, base+r.Path+q, nil); c != 200 {
				t.Errorf("%s %s without a token: %d", r.Method, r.Path, c)
			}
		}
	}
	named := regexp.MustCompile(`/[\w./-]+`).FindAllString(sidecar.OpenRoutes, -1)
	slices.Sort(open)
	slices.Sort(named)
	if !slices.Equal(open, named) {
		t.Fatalf("OpenRoutes names %v, the routes without a token are %v", named, open)
	}
	var help bytes.Buffer
	sidecar.ParseOptions([]string{"-h"}, func(string) string { return "" }, &help)
	if !strings.Contains(strings.Join(strings.Fields(help.String()), " "), "Every route but "+sidecar.OpenRoutes+" then needs") {
		t.Errorf("-h does not name the open routes as %q:\n%s", sidecar.OpenRoutes, help.String())
	}
	_, doc, _ := do(t, "GET", base+"/openapi.json", nil)
	if !strings.Contains(doc, "every route but "+sidecar.OpenRoutes+" needs") {
		t.Error("the OpenAPI document does not name the open routes")
	}
}

// TestAnsweredCodes: every code the sidecar's source refuses with is in
// sidecar.Answered, the document lists each with the number and name
// internal/errs gives it, and a refusal's code is the number the document
// gives its name.
func TestAnsweredCodes(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "..", "internal", "errs", "errs.go"))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]errs.Code{}
	for _, m := range regexp.MustCompile(`(?m)^\t(\w+)\s+Code = (\d+)$`).FindAllStringSubmatch(string(src), -1) {
		n, _ := strconv.Atoi(m[2])
		byName[m[1]] = errs.Code(n)
	}
	if len(byName) < 25 {
		t.Fatalf("read %d codes from internal/errs", len(byName))
	}
	files, _ := filepath.Glob("*.go")
	more, _ := filepath.Glob(filepath.Join("..", "rendezvous", "*.go"))
	refuses := regexp.MustCompile(`refuse\([^)]*?errs\.(\w+)|^\s*return errs\.(\w+)$`)
	seen := 0
	for _, f := range append(files, more...) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, _ := os.ReadFile(f)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range refuses.FindAllStringSubmatch(line, -1) {
				name := m[1] + m[2]
				c, ok := byName[name]
				if !ok {
					continue // errs.Code and the like
				}
				seen++
				if !slices.Contains(sidecar.Answered, c) {
					t.Errorf("%s:%d refuses with errs.%s (%d), which sidecar.Answered does not list", f, i+1, name, c)
				}
			}
		}
	}
	if seen < 15 {
		t.Fatalf("found only %d refusals in the source: the scan is broken", seen)
	}
	_, base := serve(t, sidecar.Config{})
	_, doc, _ := do(t, "GET", base+"/openapi.json", nil)
	for _, c := range sidecar.Answered {
		if !strings.Contains(doc, fmt.Sprintf("%d %s", int32(c), c)) {
			t.Errorf("the OpenAPI document does not list %d %s", int32(c), c)
		}
	}
	c, b, _ := do(t, "GET", base+"/metadata?key=a&nope=1", nil)
	var e struct{ Code int32 }
	if c != 400 || json.Unmarshal([]byte(b), &e) != nil || !strings.Contains(doc, fmt.Sprintf("%d %s", e.Code, errs.InvalidArgument)) {
		t.Fatalf("a bad query: %d %s; the document does not give its code as invalid argument", c, b)
	}
}
