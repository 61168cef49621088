package authsecret

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
)

// ProofLabel is the message HMAC'ed with the secret into the key of
// te-sidecar's proof. It differs from TokenMessage and ClientTokenPrefix
// in its first bytes, so that no proof is a token and a holder of the token
// cannot compute a proof.
const ProofLabel = "te-sidecar-proof v1"

// ProofPath is the sidecar route that answers a proof, below the metadata
// path: GET /metadata/proof?nonce=N.
const ProofPath = "/proof"

// Bounds of a nonce: lowercase hex of 16 to 64 random bytes. A client sends
// NonceBytes of them.
const (
	NonceBytes  = 32
	MinNonceLen = 32
	MaxNonceLen = 128
)

// MaxInstanceLen bounds the instance a proof names.
const MaxInstanceLen = 256

// ProofAnswer is te-sidecar's answer to GET /metadata/proof?nonce=N: the
// proof under each secret it accepts (the current one first, then the
// previous during a rotation), each bound to the nonce and to the
// sidecar's instance.
type ProofAnswer struct {
	Instance string   `json:"instance"`
	Proofs   []string `json:"proofs"`
}

// Proof returns the proof of holding secret for nonce, given by the
// sidecar instance:
//
//	key   = HMAC-SHA256(secret, "te-sidecar-proof v1")
//	proof = lowercase hex of HMAC-SHA256(key, nonce + "\n" + instance)
//
// The nonce holds no newline (ValidNonce), so the message splits one way.
func Proof(secret []byte, nonce, instance string) string {
	k := hmac.New(sha256.New, secret)
	k.Write([]byte(ProofLabel))
	m := hmac.New(sha256.New, k.Sum(nil))
	m.Write([]byte(nonce))
	m.Write([]byte{'\n'})
	m.Write([]byte(instance))
	return hex.EncodeToString(m.Sum(nil))
}

// Proofs returns the proofs a sidecar with these secrets answers: the
// current secret's, then the previous one's during a rotation.
func (s *Secrets) Proofs(nonce, instance string) []string {
	p := []string{Proof(s.Current, nonce, instance)}
	if s.Previous != nil {
		p = append(p, Proof(s.Previous, nonce, instance))
	}
	return p
}

// Proves reports whether a answers nonce with a proof of the current
// secret, the one whose token a client sends.
func (s *Secrets) Proves(a *ProofAnswer, nonce string) bool {
	if a == nil || a.Instance == "" || len(a.Instance) > MaxInstanceLen || len(a.Proofs) > 2 {
		return false
	}
	return Match(Proof(s.Current, nonce, a.Instance), a.Proofs)
}

// NewNonce returns a fresh nonce: NonceBytes random bytes in lowercase hex.
func NewNonce() string {
	b := make([]byte, NonceBytes)
	rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// ValidNonce reports whether n is a nonce a sidecar answers: MinNonceLen to
// MaxNonceLen lowercase hex digits.
func ValidNonce(n string) bool {
	if len(n) < MinNonceLen || len(n) > MaxNonceLen {
		return false
	}
	for i := 0; i < len(n); i++ {
		if c := n[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
