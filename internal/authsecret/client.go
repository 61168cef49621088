package authsecret

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// ClientTokenPrefix starts the message HMAC'ed with the secret into a
// client's own sidecar token; the client's name follows it.
const ClientTokenPrefix = "te-sidecar-client v1\n"

// ClientToken returns the sidecar token of the client called name under one
// secret: lowercase hex of HMAC-SHA256(secret, ClientTokenPrefix + name).
// te-sidecar accepts it in place of the cluster token from a request that
// names that client (X-Te-Client) and then keeps the client's handoff
// quotas under that name: only a holder of the secret can mint a name, so
// a holder of the cluster token alone cannot spread its declarations over
// names it makes up.
func ClientToken(secret []byte, name string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ClientTokenPrefix))
	m.Write([]byte(name))
	return hex.EncodeToString(m.Sum(nil))
}

// ClientToken returns the current secret's token for the client name: the
// one clients send.
func (s *Secrets) ClientToken(name string) string { return ClientToken(s.Current, name) }

// ClientTokens returns the tokens the sidecar accepts for the client name:
// the current secret's and, during a rotation, the previous one's.
func (s *Secrets) ClientTokens(name string) []string {
	t := []string{ClientToken(s.Current, name)}
	if s.Previous != nil {
		t = append(t, ClientToken(s.Previous, name))
	}
	return t
}
