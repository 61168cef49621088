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
