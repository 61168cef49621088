package main

import (
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/capi/internal/glue"
	"github.com/tecache/te/engine"
)

// headerErrors maps each function te.h declares to the TE_ERR_ names its
// comment's "Errors:" part lists ("as te_x" takes te_x's too), plus the
// ones te.h's "Functions" preamble gives every function that takes a
// handle: TE_ERR_INVALID_ARGUMENT and TE_ERR_INTERNAL.
func headerErrors(t *testing.T) map[string]map[string]bool {
	t.Helper()
	h := readHeader(t)
	out := map[string]map[string]bool{}
	as := map[string]string{}
	decl := regexp.MustCompile(`(?s)/\*((?:[^*]|\*[^/])*)\*/\s*int (te_\w+)\(`)
	for _, m := range decl.FindAllStringSubmatch(h, -1) {
		_, errors, ok := strings.Cut(m[1], "Errors:")
		if !ok {
			continue // documented together with the function before it
		}
		set := map[string]bool{"TE_ERR_INVALID_ARGUMENT": true, "TE_ERR_INTERNAL": true}
		for _, name := range regexp.MustCompile(`TE_ERR_\w+`).FindAllString(errors, -1) {
			set[name] = true
		}
		if ref := regexp.MustCompile(`\bas\s+(te_\w+)`).FindStringSubmatch(errors); ref != nil {
			as[m[2]] = ref[1]
		}
		out[m[2]] = set
	}
	for fn, ref := range as {
		for name := range out[ref] {
			out[fn][name] = true
		}
	}
	if len(out) < 40 {
		t.Fatalf("read the Errors of %d functions from te.h", len(out))
	}
	return out
}

// TestHeaderListsReturnedErrors provokes, through the engine calls the
// exports make, the failures of te_open_segment, te_probe and
// te_notify_send that a user meets (a peer holding another secret, a full
// receiver queue) and checks that the code the export returns (glue.Code,
// what fail() hands to C) is one te.h lists for that function.
func TestHeaderListsReturnedErrors(t *testing.T) {
	listed := headerErrors(t)
	codes := defines(t, "TE_ERR_")
	name := func(rc int32) string {
		for n, v := range codes {
			if int32(v) == rc {
				return n
			}
		}
		return "no TE_ERR_ code"
	}
	check := func(fn string, err error, want string) {
		t.Helper()
		rc := glue.Code(err)
		if got := name(rc); got != want {
			t.Errorf("%s: returned %d (%s), want %s: %v", fn, rc, got, want, err)
		}
		if !listed[fn][name(rc)] {
			t.Errorf("%s returns %s (%v), which te.h does not list for it", fn, name(rc), err)
		}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	newEngine := func(secret string, maxNotifies int) *engine.Engine {
		t.Helper()
		e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", ForceTransport: "tcp", AuthSecret: secret,
			MaxNotifies: maxNotifies, Logger: quiet, RPCTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	const secret, other = "the-cluster-secret-of-this-test", "another-cluster-secret-000000"
	a, b := newEngine(secret, 0), newEngine(other, 0)
	_, err := a.OpenSegment(b.Name())
	check("te_open_segment", err, "TE_ERR_AUTH")
	_, err = a.Probe(b.Name())
	check("te_probe", err, "TE_ERR_AUTH")
	check("te_notify_send", a.SendNotify(b.Name(), "n", "m"), "TE_ERR_AUTH")

	full := newEngine(secret, 1)
	if err := a.SendNotify(full.Name(), "first", ""); err != nil {
		t.Fatal(err)
	}
	check("te_notify_send", a.SendNotify(full.Name(), "second", ""), "TE_ERR_RESOURCE_EXHAUSTED")
	if listed["te_notify_send"]["TE_ERR_NO_MEMORY"] {
		t.Error("te.h lists TE_ERR_NO_MEMORY for te_notify_send, which never allocates on the caller's behalf")
	}
}
