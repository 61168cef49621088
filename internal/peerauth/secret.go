package peerauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"

	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/engine/wire"
)

// MinSecretLen is the shortest secret accepted: 128 bits if the bytes are
// random, the least that makes guessing it from a recorded MAC hopeless.
const MinSecretLen = 16

// Environment variables read by LoadSecret, in this order.
const (
	EnvSecretFile = "TE_AUTH_SECRET_FILE"
	EnvSecret     = "TE_AUTH_SECRET"
)

// Labels (HMAC messages) of the engine's own uses of the secret. Another use
// (a bearer token, say) must pick a label outside "te-auth-v1 ".
const (
	labelKeyID     = "te-auth-v1 key id"
	labelInitiator = "te-auth-v1 initiator\x00"
	labelServer    = "te-auth-v1 server\x00"
)

type key struct {
	id  [wire.AuthKeyIDSize]byte
	mac []byte // the secret itself: the HMAC key
}

// Secret is a cluster secret: the current key and, during a rotation, the
// previous one. A nil *Secret means "no secret". A Secret is immutable and
// safe for concurrent use.
type Secret struct {
	keys []key // current first
}

func newKey(b []byte) key {
	k := key{mac: append([]byte(nil), b...)}
	m := hmac.New(sha256.New, k.mac)
	m.Write([]byte(labelKeyID))
	copy(k.id[:], m.Sum(nil))
	return k
}

// ParseSecret parses a secret's text: the first non-empty line is the
// current secret, a second one the previous secret still accepted from peers
// during a rotation. Each line is trimmed of surrounding white space and
// must be at least MinSecretLen bytes. Text with no non-empty line gives a
// nil Secret and no error.
func ParseSecret(text string) (*Secret, error) {
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	switch {
	case len(lines) == 0:
		return nil, nil
	case len(lines) > wire.MaxAuthKeys:
		return nil, errs.New(errs.InvalidArgument, "auth", "the secret has %d lines; at most %d: the current secret, then the previous one", len(lines), wire.MaxAuthKeys)
	}
	s := &Secret{}
	for i, l := range lines {
		if len(l) < MinSecretLen {
			which := "current"
			if i == 1 {
				which = "previous"
			}
			return nil, errs.New(errs.InvalidArgument, "auth", "the %s secret has %d bytes; at least %d are needed", which, len(l), MinSecretLen).
				WithHint("generate one with: head -c 32 /dev/urandom | base64")
		}
		if i == 1 && l == lines[0] {
			break // the same secret twice: one key
		}
		s.keys = append(s.keys, newKey([]byte(l)))
	}
	return s, nil
}

// LoadSecret finds the secret: value if not empty, else the contents of
// file if not empty, else the file named by TE_AUTH_SECRET_FILE, else
// TE_AUTH_SECRET (getenv nil means os.Getenv). It returns a nil Secret when
// none is set, and says where it found one in source (for a log line; never
// the secret). An unreadable file or a malformed secret is an error, not a
// fall-through: a misconfigured secret must not silently turn
// authentication off.
func LoadSecret(value, file string, getenv func(string) string) (s *Secret, source string, err error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	from := func(text, src string) (*Secret, string, error) {
		s, err := ParseSecret(text)
		if err != nil {
			return nil, "", errs.Wrap(errs.InvalidArgument, "auth", err, "secret from %s", src)
		}
		if s == nil {
			return nil, "", errs.New(errs.InvalidArgument, "auth", "%s holds no secret", src)
		}
		return s, src, nil
	}
	readFile := func(path, src string) (*Secret, string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, "", errs.Wrap(errs.InvalidArgument, "auth", err, "read the secret file named by %s", src)
		}
		return from(string(b), src)
	}
	switch {
	case strings.TrimSpace(value) != "":
		return from(value, "the configuration")
	case file != "":
		return readFile(file, "file "+file)
	case getenv(EnvSecretFile) != "":
		p := getenv(EnvSecretFile)
		return readFile(p, EnvSecretFile+"="+p)
	case getenv(EnvSecret) != "":
		return from(getenv(EnvSecret), EnvSecret)
	}
	return nil, "", nil
}

// KeyIDs returns the key ids, current first, in hex: they name the keys in
// logs and on the wire without revealing them.
func (s *Secret) KeyIDs() []string {
	if s == nil {
		return nil
	}
	out := make([]string, len(s.keys))
	for i, k := range s.keys {
		out[i] = hex.EncodeToString(k.id[:])
	}
	return out
}

// Derive returns HMAC-SHA256(key, label) for each key, current first: a
// value derived from the secret for another use (a bearer token), which a
// verifier accepts under either key during a rotation. label must not start
// with "te-auth-v1 " (the exchange's own labels).
func (s *Secret) Derive(label string) [][]byte {
	if s == nil || strings.HasPrefix(label, "te-auth-v1 ") {
		return nil
	}
	out := make([][]byte, len(s.keys))
	for i, k := range s.keys {
		m := hmac.New(sha256.New, k.mac)
		m.Write([]byte(label))
		out[i] = m.Sum(nil)
	}
	return out
}

// find returns the key with id, if s holds it.
func (s *Secret) find(id [wire.AuthKeyIDSize]byte) (key, bool) {
	if s == nil {
		return key{}, false
	}
	for _, k := range s.keys {
		if k.id == id {
			return k, true
		}
	}
	return key{}, false
}

func mac(k key, label string, transcript []byte) [wire.AuthMACSize]byte {
	m := hmac.New(sha256.New, k.mac)
	m.Write([]byte(label))
	m.Write(transcript)
	var out [wire.AuthMACSize]byte
	copy(out[:], m.Sum(nil))
	return out
}
