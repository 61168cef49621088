package wire

import (
	"bytes"
	"testing"

	"github.com/tecache/te/internal/errs"
)

func TestAuthMessagesRoundTrip(t *testing.T) {
	h := &Hello{Version: AuthVersion, Instance: "0123456789abcdef"}
	h.Nonce[0], h.Nonce[31] = 1, 2
	h.KeyIDs = [][AuthKeyIDSize]byte{{1, 2, 3, 4, 5, 6, 7, 8}, {9}}
	b := AppendHello(nil, h)
	if len(b) > MaxAuthBody {
		t.Fatalf("HELLO of %d bytes", len(b))
	}
	h2, err := DecodeHello(b)
	if err != nil || h2.Instance != h.Instance || h2.Nonce != h.Nonce || len(h2.KeyIDs) != 2 || h2.KeyIDs[1] != h.KeyIDs[1] {
		t.Fatal(h2, err)
	}
	named := &Hello{Version: AuthVersionIdentity, Mode: SessionIntegrity, Instance: "i", Name: "prefill-0", KeyIDs: h.KeyIDs[:1]}
	if h3, err := DecodeHello(AppendHello(nil, named)); err != nil || h3.Name != "prefill-0" || h3.Instance != "i" {
		t.Fatal(h3, err)
	}
	named.Name = ""
	if h3, err := DecodeHello(AppendHello(nil, named)); err != nil || h3.Name != "" {
		t.Fatal(h3, err)
	}
	c := &Challenge{Version: AuthVersion, Status: AuthProceed, KeyIndex: 1, Instance: "srv"}
	c.Nonce[5] = 7
	c2, err := DecodeChallenge(AppendChallenge(nil, c))
	if err != nil || *c2 != *c {
		t.Fatal(c2, err)
	}
	var mac [AuthMACSize]byte
	mac[3] = 9
	if m, err := DecodeProof(AppendProof(nil, &mac)); err != nil || m != mac {
		t.Fatal(m, err)
	}
	r := &Result{Status: AuthBadProof}
	if r2, err := DecodeResult(AppendResult(nil, r)); err != nil || *r2 != *r {
		t.Fatal(r2, err)
	}
}

func TestAuthMessagesRefuseMalformed(t *testing.T) {
	h := &Hello{Version: AuthVersion, Instance: "x"}
	good := AppendHello(nil, h)
	bad := map[string][]byte{
		"empty":            nil,
		"wrong msg":        append([]byte{AuthMsgProof}, good[1:]...),
		"three keys":       append([]byte{AuthMsgHello, AuthVersion, 3}, good[3:]...),
		"trailing":         append(append([]byte(nil), good...), 0),
		"no instance":      AppendHello(nil, &Hello{Version: AuthVersion}),
		"instance too big": AppendHello(nil, &Hello{Version: AuthVersion, Instance: string(bytes.Repeat([]byte{'a'}, MaxAuthInstance+1))}),
		"truncated":        good[:len(good)-1],
	}
	v3 := AppendHello(nil, &Hello{Version: AuthVersionIdentity, Instance: "x", Name: "seg"})
	bad["v3 without its name"] = v3[:len(v3)-5]
	bad["v3 name cut"] = v3[:len(v3)-1]
	bad["v3 trailing"] = append(append([]byte(nil), v3...), 0)
	bad["v3 name too big"] = AppendHello(nil, &Hello{Version: AuthVersionIdentity, Instance: "x", Name: string(bytes.Repeat([]byte{'a'}, MaxAuthName+1))})
	for name, b := range bad {
		if _, err := DecodeHello(b); errs.CodeOf(err) != errs.Protocol {
			t.Errorf("HELLO %s: %v", name, err)
		}
	}
	ch := AppendChallenge(nil, &Challenge{Version: AuthVersion, Status: AuthBadProof})
	if _, err := DecodeChallenge(ch); errs.CodeOf(err) != errs.Protocol {
		t.Errorf("CHALLENGE with a RESULT-only status: %v", err)
	}
	if _, err := DecodeResult(AppendResult(nil, &Result{Status: AuthUnknownKey})); errs.CodeOf(err) != errs.Protocol {
		t.Errorf("RESULT with a CHALLENGE-only status: %v", err)
	}
	if _, err := DecodeProof([]byte{AuthMsgProof, 1}); errs.CodeOf(err) != errs.Protocol {
		t.Errorf("short PROOF: %v", err)
	}
}

func FuzzDecodeHello(f *testing.F) {
	f.Add(AppendHello(nil, &Hello{Version: 1, Instance: "abc", KeyIDs: [][AuthKeyIDSize]byte{{1}}}))
	f.Add([]byte{1, 1, 0})
	f.Add(AppendHello(nil, &Hello{Version: 2, Mode: 2, Instance: "abc", KeyIDs: [][AuthKeyIDSize]byte{{1}, {2}}}))
	f.Add(AppendHello(nil, &Hello{Version: 2, Instance: "abc"}))
	f.Add(AppendHello(nil, &Hello{Version: 3, Mode: 3, Instance: "abc", Name: "seg", KeyIDs: [][AuthKeyIDSize]byte{{1}}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := DecodeHello(data)
		if err != nil {
			return
		}
		if !bytes.Equal(AppendHello(nil, h), data) {
			t.Fatal("round trip differs")
		}
	})
}

func FuzzDecodeChallenge(f *testing.F) {
	f.Add(AppendChallenge(nil, &Challenge{Version: 1, Status: AuthProceed, Instance: "abc"}))
	f.Add(AppendChallenge(nil, &Challenge{Version: 1, Status: AuthBusy}))
	f.Add(AppendChallenge(nil, &Challenge{Version: 2, Status: AuthProceed, Mode: 1, Instance: "abc"}))
	f.Add(AppendChallenge(nil, &Challenge{Version: 2, Status: AuthNoAuth, Instance: "abc"}))
	f.Add(AppendChallenge(nil, &Challenge{Version: 3, Status: AuthProceed, Mode: 1, Instance: "abc", Name: "seg", Addr: "h:1"}))
	f.Add(AppendChallenge(nil, &Challenge{Version: 3, Status: AuthBusy}))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := DecodeChallenge(data)
		if err != nil {
			return
		}
		if !bytes.Equal(AppendChallenge(nil, c), data) {
			t.Fatal("round trip differs")
		}
	})
}

func FuzzDecodeResult(f *testing.F) {
	f.Add(AppendResult(nil, &Result{Status: AuthProceed}))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeResult(data)
		if err != nil {
			return
		}
		if !bytes.Equal(AppendResult(nil, r), data) {
			t.Fatal("round trip differs")
		}
		if p, err := DecodeProof(data); err == nil && !bytes.Equal(AppendProof(nil, &p), data) {
			t.Fatal("proof round trip differs")
		}
	})
}

// TestSessionMessagesRoundTrip: version 2's HELLO and CHALLENGE carry the
// session mode at offset 3 and are otherwise version 1's.
func TestSessionMessagesRoundTrip(t *testing.T) {
	h := &Hello{Version: AuthVersionSession, Mode: SessionEncryption, Instance: "i", KeyIDs: [][AuthKeyIDSize]byte{{1}}}
	h.Nonce[0] = 5
	b := AppendHello(nil, h)
	if len(b) != len(AppendHello(nil, &Hello{Version: AuthVersion, Instance: "i", KeyIDs: h.KeyIDs}))+1 || b[3] != SessionEncryption || b[4] != 5 {
		t.Fatalf("layout % x", b)
	}
	h2, err := DecodeHello(b)
	if err != nil || h2.Mode != h.Mode || h2.Nonce != h.Nonce || h2.Instance != "i" || len(h2.KeyIDs) != 1 {
		t.Fatal(h2, err)
	}
	c := &Challenge{Version: AuthVersionSession, Status: AuthProceed, Mode: SessionIntegrity, KeyIndex: 1, Instance: "srv"}
	c.Nonce[31] = 9
	cb := AppendChallenge(nil, c)
	if cb[3] != SessionIntegrity || cb[4+31] != 9 {
		t.Fatalf("layout % x", cb)
	}
	if c2, err := DecodeChallenge(cb); err != nil || *c2 != *c {
		t.Fatal(c2, err)
	}
	// A refusal in version 1's layout (what a server sends to a version
	// it does not speak) decodes whatever the initiator's version.
	r, err := DecodeChallenge(AppendChallenge(nil, &Challenge{Version: AuthVersion, Status: AuthBadVersion}))
	if err != nil || r.Status != AuthBadVersion {
		t.Fatal(r, err)
	}
}

func TestSessionMessagesRefuseMalformed(t *testing.T) {
	key := [][AuthKeyIDSize]byte{{1}}
	hellos := map[string]*Hello{
		"mode without key": {Version: AuthVersionSession, Mode: SessionIntegrity, Instance: "x"},
		"key without mode": {Version: AuthVersionSession, KeyIDs: key, Instance: "x"},
		"unknown mode":     {Version: AuthVersionSession, Mode: 4, KeyIDs: key, Instance: "x"},
	}
	for name, h := range hellos {
		if _, err := DecodeHello(AppendHello(nil, h)); errs.CodeOf(err) != errs.Protocol {
			t.Errorf("HELLO %s: %v", name, err)
		}
	}
	if _, err := DecodeHello(AppendHello(nil, &Hello{Version: AuthVersionSession, Mode: 1, KeyIDs: key, Instance: "x"})[:4+AuthNonceSize]); errs.CodeOf(err) != errs.Protocol {
		t.Errorf("short HELLO: %v", err)
	}
	challenges := map[string]*Challenge{
		"proceed without mode": {Version: AuthVersionSession, Status: AuthProceed, Instance: "x"},
		"refusal with mode":    {Version: AuthVersionSession, Status: AuthUnknownKey, Mode: SessionIntegrity},
		"no auth with mode":    {Version: AuthVersionSession, Status: AuthNoAuth, Mode: SessionEncryption, Instance: "x"},
		"unknown mode":         {Version: AuthVersionSession, Status: AuthProceed, Mode: 7, Instance: "x"},
	}
	for name, c := range challenges {
		if _, err := DecodeChallenge(AppendChallenge(nil, c)); errs.CodeOf(err) != errs.Protocol {
			t.Errorf("CHALLENGE %s: %v", name, err)
		}
	}
}

// TestIdentityChallengeRoundTrip: version 3's accepting CHALLENGE carries
// the server's segment name and RPC address after the instance; a refusal
// carries neither, and a name that does not fit is refused.
func TestIdentityChallengeRoundTrip(t *testing.T) {
	c := &Challenge{Version: AuthVersionIdentity, Status: AuthProceed, Mode: SessionIntegrity, Instance: "srv", Name: "prefill-0", Addr: "10.0.0.1:7000"}
	b := AppendChallenge(nil, c)
	c2, err := DecodeChallenge(b)
	if err != nil || *c2 != *c {
		t.Fatal(c2, err)
	}
	if _, err := DecodeChallenge(b[:len(b)-1]); errs.CodeOf(err) != errs.Protocol {
		t.Fatal("short address decoded:", err)
	}
	noName := AppendChallenge(nil, &Challenge{Version: AuthVersionIdentity, Status: AuthProceed, Mode: 1, Instance: "srv"})
	if _, err := DecodeChallenge(noName); errs.CodeOf(err) != errs.Protocol {
		t.Fatal("empty name decoded:", err)
	}
	long := AppendChallenge(nil, &Challenge{Version: AuthVersionIdentity, Status: AuthProceed, Mode: 1, Instance: "srv", Name: string(bytes.Repeat([]byte{'n'}, MaxAuthName+1))})
	if _, err := DecodeChallenge(long); errs.CodeOf(err) != errs.Protocol {
		t.Fatal("long name decoded:", err)
	}
	if len(long) > MaxAuthBody+2 {
		t.Fatalf("largest challenge %d bytes over the bound %d", len(long), MaxAuthBody)
	}
	busy := AppendChallenge(nil, &Challenge{Version: AuthVersionIdentity, Status: AuthBusy, Name: "x"})
	if r, err := DecodeChallenge(busy); err != nil || r.Name != "" {
		t.Fatal(r, err)
	}
}

// TestStrongerMode: the server's choice is the mode that protects more,
// whatever the order of the mode bytes' values.
func TestStrongerMode(t *testing.T) {
	order := []uint8{SessionHeaders, SessionIntegrity, SessionEncryption}
	for i, a := range order {
		for j, b := range order {
			want := order[max(i, j)]
			if got := StrongerMode(a, b); got != want {
				t.Fatalf("StrongerMode(%d, %d) = %d, want %d", a, b, got, want)
			}
		}
	}
}
