package peerauth_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
)

// TestRecordSignVerify: a signed record verifies under its own key and
// comes back as it was; the same bytes under another key, an altered byte,
// an unsigned record and another cluster's signature are refused with a
// reason; the signed record stays JSON with its fields untouched.
func TestRecordSignVerify(t *testing.T) {
	s := mustSecret(t, secretA)
	desc := []byte(`{"name":"C","te_instance":"abc","buffers":[{"addr":1,"length":2}]}`)
	signed, err := s.SignRecord("mooncake/ram/C", desc)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(signed, &m); err != nil || m["name"] != "C" || m[peerauth.RecordField] == nil {
		t.Fatalf("signed record %s: %v", signed, err)
	}
	got, err := s.VerifyRecord("mooncake/ram/C", signed)
	if err != nil || !bytes.Equal(got, desc) {
		t.Fatalf("verify: %s, %v", got, err)
	}
	// Rotation: a record signed with the previous secret verifies at an
	// engine holding both.
	both := mustSecret(t, secretB+"\n"+secretA)
	if _, err := both.VerifyRecord("mooncake/ram/C", signed); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		key  string
		rec  []byte
		sec  *peerauth.Secret
		word string
	}{
		"copied under another name": {"mooncake/ram/B", signed, s, "copied"},
		"altered":                   {"mooncake/ram/C", bytes.Replace(signed, []byte(`"abc"`), []byte(`"abd"`), 1), s, "altered"},
		"unsigned":                  {"mooncake/ram/C", desc, s, "no te_mac"},
		"another cluster":           {"mooncake/ram/C", signed, mustSecret(t, secretB), "does not hold"},
		"truncated mac":             {"mooncake/ram/C", append(signed[:len(signed)-4:len(signed)-4], `"}`...), s, "malformed"},
	} {
		_, err := c.sec.VerifyRecord(c.key, c.rec)
		wantErr(t, name, outcome{err: err}, errs.Unauthenticated, c.word)
	}
	// Empty object, and without a secret nothing changes.
	e, err := s.SignRecord("k", []byte("{ }"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.VerifyRecord("k", e); err != nil || string(got) != "{}" {
		t.Fatalf("%s %v", got, err)
	}
	var none *peerauth.Secret
	if b, _ := none.SignRecord("k", desc); !bytes.Equal(b, desc) {
		t.Fatal("signed without a secret")
	}
	if _, err := s.SignRecord("k", []byte("[1]")); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatal(err)
	}
}
