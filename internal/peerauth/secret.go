package peerauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"

	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/wire"
)

// MinSecretLen is the shortest secret accepted: 128 bits if the bytes are
// random, the least that makes guessing it from a recorded MAC hopeless.
const MinSecretLen = authsecret.MinLen

// Environment variables read by LoadSecret, in this order.
const (
	EnvSecretFile = authsecret.EnvSecretFile
	EnvSecret     = authsecret.EnvSecret
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

// ParseSecret parses a secret's text (internal/authsecret's format: the
// current secret, optionally the previous one on a second line, each at
// least MinSecretLen bytes). Text with no non-empty line gives a nil Secret
// and no error.
func ParseSecret(text string) (*Secret, error) {
	if strings.TrimSpace(text) == "" {
		return nil, nil
	}
	s, err := authsecret.Parse(text)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, "auth", err, "")
	}
	return FromSecrets(s), nil
}

// FromSecrets builds the exchange's keys from a loaded secret (nil: none).
func FromSecrets(s *authsecret.Secrets) *Secret {
	if s == nil {
		return nil
	}
	out := &Secret{keys: []key{newKey(s.Current)}}
	if s.Previous != nil {
		out.keys = append(out.keys, newKey(s.Previous))
	}
	return out
}

// LoadSecret finds the secret as internal/authsecret.LoadFrom does: value if
// not empty, else the contents of file if not empty, else the file named by
// TE_AUTH_SECRET_FILE, else TE_AUTH_SECRET (getenv nil means os.Getenv). It
// returns a nil Secret when none is set, and says where it found one in
// source (for a log line; never the secret). An unreadable file or a
// malformed secret is an error, not a fall-through.
func LoadSecret(value, file string, getenv func(string) string) (s *Secret, source string, err error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	sec, source, err := authsecret.LoadFrom(value, file, getenv)
	if err != nil {
		return nil, "", errs.Wrap(errs.InvalidArgument, "auth", err, "")
	}
	return FromSecrets(sec), source, nil
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
