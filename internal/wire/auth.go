package wire

import (
	"encoding/binary"

	"github.com/tecache/te/internal/errs"
)

// Authentication messages (spec.md, "Peer authentication"): the bodies of
// the frames of kind KindAuth that open every connection.
const (
	// AuthVersion is the exchange without sessions: it authenticates the
	// opening of a connection only.
	AuthVersion = 1
	// AuthVersionSession is the exchange that opens an authenticated
	// session (spec.md, "Authenticated sessions"): HELLO and CHALLENGE
	// carry a session mode, and every frame after RESULT is sealed.
	AuthVersionSession = 2
	// AuthVersionIdentity is version 2 whose accepting CHALLENGE also
	// names the server's segment and RPC address, so the session proves
	// which segment the initiator reached, not only that it holds the
	// secret, and whose HELLO names the initiator's segment, so the
	// server knows who calls (spec.md, "Exchange, version 3").
	AuthVersionIdentity = 3
	// MaxAuthBody bounds the body of an authentication frame.
	MaxAuthBody = 1536
	// MaxAuthName bounds the segment name a version 3 CHALLENGE proves.
	MaxAuthName = 1024
	// MaxAuthAddr bounds the RPC address a version 3 CHALLENGE proves.
	MaxAuthAddr = 255
	// AuthNonceSize is the size of each side's nonce.
	AuthNonceSize = 32
	// AuthKeyIDSize is the size of a key id.
	AuthKeyIDSize = 8
	// AuthMACSize is the size of an HMAC-SHA256.
	AuthMACSize = 32
	// MaxAuthKeys is how many key ids an initiator may offer.
	MaxAuthKeys = 2
	// MaxAuthInstance bounds an instance id.
	MaxAuthInstance = 128

	AuthMsgHello     uint8 = 1
	AuthMsgChallenge uint8 = 2
	AuthMsgProof     uint8 = 3
	AuthMsgResult    uint8 = 4
)

// Session modes: the mode byte of a version 2 HELLO (what the initiator
// asks for) and CHALLENGE (what the server chose).
//
// The values are not in order of strength (SessionIntegrity came after the
// other two): StrongerMode compares them.
const (
	SessionNone       uint8 = 0 // no secret: no session
	SessionHeaders    uint8 = 1 // headers and bodies authenticated, payloads in the clear
	SessionEncryption uint8 = 2 // everything sealed with AES-GCM
	SessionIntegrity  uint8 = 3 // headers, bodies and payloads authenticated, nothing encrypted
)

// modeRank orders the modes by what they protect.
func modeRank(m uint8) int {
	switch m {
	case SessionHeaders:
		return 1
	case SessionIntegrity:
		return 2
	case SessionEncryption:
		return 3
	}
	return 0
}

// StrongerMode returns the one of a and b that protects more: the mode a
// server chooses from the HELLO's and its own.
func StrongerMode(a, b uint8) uint8 {
	if modeRank(b) > modeRank(a) {
		return b
	}
	return a
}

// validMode reports whether m is a mode a version 2 message may carry.
func validMode(m uint8) bool { return m <= SessionIntegrity }

// AuthStatus is the status byte of a CHALLENGE or RESULT.
type AuthStatus uint8

// Statuses (spec.md has what an initiator does with each).
const (
	AuthProceed        AuthStatus = 0 // CHALLENGE: send PROOF; RESULT: accepted
	AuthNoAuth         AuthStatus = 1 // the server has no secret
	AuthSecretRequired AuthStatus = 2 // the initiator offered no key; the server requires one
	AuthUnknownKey     AuthStatus = 3 // the server holds none of the offered keys
	AuthBusy           AuthStatus = 4 // the server is at its connection limit
	AuthBadProof       AuthStatus = 5 // RESULT: the proof is wrong
	AuthBadVersion     AuthStatus = 6 // the server does not speak this version
)

// Hello is the initiator's first message.
type Hello struct {
	Version uint8
	// Mode is the session mode asked for (version 2 only): SessionNone
	// without a key id, else SessionHeaders, SessionIntegrity or
	// SessionEncryption.
	Mode     uint8
	Nonce    [AuthNonceSize]byte
	KeyIDs   [][AuthKeyIDSize]byte
	Instance string
	// Name is the initiator's own segment name (version 3 only; empty:
	// none, as for an engine that publishes no segment). The server's
	// RESULT MAC covers it, so the server knows which segment is calling.
	Name string
}

// Challenge is the server's answer to Hello.
type Challenge struct {
	Version uint8
	Status  AuthStatus
	// Mode is the session mode chosen (version 2 only): at least the
	// HELLO's (StrongerMode), with status 0; SessionNone with any other
	// status.
	Mode     uint8
	Nonce    [AuthNonceSize]byte
	KeyIndex uint8
	Instance string
	// Name and Addr are the server's segment name and RPC address
	// (version 3, status 0 only; empty otherwise).
	Name, Addr string
}

// Result is the server's answer to the initiator's proof.
type Result struct {
	Status AuthStatus
	MAC    [AuthMACSize]byte
}

func authErr(format string, args ...any) error {
	return errs.New(errs.Protocol, "auth", format, args...)
}

// AppendHello appends a HELLO body in h.Version's layout.
func AppendHello(dst []byte, h *Hello) []byte {
	dst = append(dst, AuthMsgHello, h.Version, uint8(len(h.KeyIDs)))
	if h.Version >= AuthVersionSession {
		dst = append(dst, h.Mode)
	}
	dst = append(dst, h.Nonce[:]...)
	for _, id := range h.KeyIDs {
		dst = append(dst, id[:]...)
	}
	dst = append(dst, uint8(len(h.Instance)))
	dst = append(dst, h.Instance...)
	if h.Version == AuthVersionIdentity {
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(h.Name)))
		dst = append(dst, h.Name...)
	}
	return dst
}

// DecodeHello decodes a HELLO body: version 2's layout when its version
// byte says 2, version 1's otherwise. The version is not checked here: a
// server answers an unknown one with AuthBadVersion.
func DecodeHello(b []byte) (*Hello, error) {
	fixed := 3
	if len(b) > 1 && (b[1] == AuthVersionSession || b[1] == AuthVersionIdentity) {
		fixed = 4
	}
	if len(b) < fixed+AuthNonceSize+1 || b[0] != AuthMsgHello {
		return nil, authErr("not a HELLO (%d bytes)", len(b))
	}
	h := &Hello{Version: b[1]}
	k := int(b[2])
	if k > MaxAuthKeys {
		return nil, authErr("HELLO offers %d keys, at most %d", k, MaxAuthKeys)
	}
	if fixed == 4 {
		h.Mode = b[3]
		if !validMode(h.Mode) || (h.Mode == SessionNone) != (k == 0) {
			return nil, authErr("HELLO asks for session mode %d with %d keys", h.Mode, k)
		}
	}
	copy(h.Nonce[:], b[fixed:])
	p := b[fixed+AuthNonceSize:]
	if len(p) < k*AuthKeyIDSize+1 {
		return nil, authErr("short HELLO")
	}
	for i := 0; i < k; i++ {
		var id [AuthKeyIDSize]byte
		copy(id[:], p[i*AuthKeyIDSize:])
		h.KeyIDs = append(h.KeyIDs, id)
	}
	p = p[k*AuthKeyIDSize:]
	n := int(p[0])
	named := h.Version == AuthVersionIdentity
	if n == 0 || n > MaxAuthInstance || len(p) < 1+n || !named && len(p) != 1+n {
		return nil, authErr("HELLO instance of %d bytes in %d", n, len(p)-1)
	}
	h.Instance = string(p[1 : 1+n])
	if named {
		p = p[1+n:]
		if len(p) < 2 {
			return nil, authErr("HELLO without the initiator's name")
		}
		ln := int(binary.LittleEndian.Uint16(p))
		if ln > MaxAuthName || len(p) != 2+ln {
			return nil, authErr("HELLO name of %d bytes in %d", ln, len(p)-2)
		}
		h.Name = string(p[2:])
	}
	return h, nil
}

// AppendChallenge appends a CHALLENGE body in c.Version's layout.
func AppendChallenge(dst []byte, c *Challenge) []byte {
	dst = append(dst, AuthMsgChallenge, c.Version, uint8(c.Status))
	if c.Version >= AuthVersionSession {
		dst = append(dst, c.Mode)
	}
	dst = append(dst, c.Nonce[:]...)
	dst = append(dst, c.KeyIndex, uint8(len(c.Instance)))
	dst = append(dst, c.Instance...)
	if c.Version == AuthVersionIdentity && c.Status == AuthProceed {
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(c.Name)))
		dst = append(dst, c.Name...)
		dst = append(dst, uint8(len(c.Addr)))
		dst = append(dst, c.Addr...)
	}
	return dst
}

// DecodeChallenge decodes a CHALLENGE body: version 2's layout when its
// version byte says 2, version 1's otherwise (a refusal of an unknown
// version is sent in version 1's).
func DecodeChallenge(b []byte) (*Challenge, error) {
	head := 3
	if len(b) > 1 && (b[1] == AuthVersionSession || b[1] == AuthVersionIdentity) {
		head = 4
	}
	fixed := head + AuthNonceSize + 2
	if len(b) < fixed || b[0] != AuthMsgChallenge {
		return nil, authErr("not a CHALLENGE (%d bytes)", len(b))
	}
	c := &Challenge{Version: b[1], Status: AuthStatus(b[2]), KeyIndex: b[head+AuthNonceSize]}
	if head == 4 {
		c.Mode = b[3]
		if !validMode(c.Mode) || (c.Mode == SessionNone) != (c.Status != AuthProceed) {
			return nil, authErr("CHALLENGE status %d with session mode %d", c.Status, c.Mode)
		}
	}
	copy(c.Nonce[:], b[head:])
	n := int(b[fixed-1])
	ids := c.Version == AuthVersionIdentity && c.Status == AuthProceed
	if n > MaxAuthInstance || len(b) < fixed+n || !ids && len(b) != fixed+n {
		return nil, authErr("CHALLENGE instance of %d bytes in %d", n, len(b)-fixed)
	}
	if c.Status > AuthBadVersion || c.Status == AuthBadProof {
		return nil, authErr("CHALLENGE status %d", c.Status)
	}
	c.Instance = string(b[fixed : fixed+n])
	if ids {
		p := b[fixed+n:]
		if len(p) < 2 {
			return nil, authErr("CHALLENGE without the server's name")
		}
		ln := int(binary.LittleEndian.Uint16(p))
		if ln == 0 || ln > MaxAuthName || len(p) < 2+ln+1 {
			return nil, authErr("CHALLENGE name of %d bytes in %d", ln, len(p)-2)
		}
		c.Name = string(p[2 : 2+ln])
		p = p[2+ln:]
		la := int(p[0])
		if la > MaxAuthAddr || len(p) != 1+la {
			return nil, authErr("CHALLENGE address of %d bytes in %d", la, len(p)-1)
		}
		c.Addr = string(p[1:])
	}
	return c, nil
}

// AppendProof appends a PROOF body.
func AppendProof(dst []byte, mac *[AuthMACSize]byte) []byte {
	dst = append(dst, AuthMsgProof)
	return append(dst, mac[:]...)
}

// DecodeProof decodes a PROOF body.
func DecodeProof(b []byte) ([AuthMACSize]byte, error) {
	var mac [AuthMACSize]byte
	if len(b) != 1+AuthMACSize || b[0] != AuthMsgProof {
		return mac, authErr("not a PROOF (%d bytes)", len(b))
	}
	copy(mac[:], b[1:])
	return mac, nil
}

// AppendResult appends a RESULT body.
func AppendResult(dst []byte, r *Result) []byte {
	dst = append(dst, AuthMsgResult, uint8(r.Status))
	return append(dst, r.MAC[:]...)
}

// DecodeResult decodes a RESULT body.
func DecodeResult(b []byte) (*Result, error) {
	if len(b) != 2+AuthMACSize || b[0] != AuthMsgResult {
		return nil, authErr("not a RESULT (%d bytes)", len(b))
	}
	r := &Result{Status: AuthStatus(b[1])}
	if r.Status != AuthProceed && r.Status != AuthBadProof {
		return nil, authErr("RESULT status %d", r.Status)
	}
	copy(r.MAC[:], b[2:])
	return r, nil
}

// AppendTranscript appends T, what both MACs cover: each of the HELLO and
// CHALLENGE bodies, as sent, after its u16 length.
func AppendTranscript(dst, hello, challenge []byte) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(hello)))
	dst = append(dst, hello...)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(challenge)))
	return append(dst, challenge...)
}
