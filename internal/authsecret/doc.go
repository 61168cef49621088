// Package authsecret reads te's cluster secret and derives from it the
// bearer token te-sidecar accepts, so that the sidecar, the handoff client
// and the HTTP metadata client agree on both.
//
// # The secret
//
// The secret comes from a value (TE_AUTH_SECRET, or a Config field) or a
// file (TE_AUTH_SECRET_FILE: a Kubernetes Secret mount). Its first line is
// the current secret; an optional second line is the previous secret, still
// accepted from peers during a rotation. Each line is trimmed of surrounding
// white space and must hold at least MinLen bytes; blank lines, a third line
// or a file over 64 KiB are errors, never silently ignored.
//
// # The sidecar token
//
// te-sidecar accepts "Authorization: Bearer <token>" where
//
//	token = lowercase hex of HMAC-SHA256(key = secret, message = "te-sidecar-token v1")
//
// computed from the current or the previous secret. Any client can compute
// it, e.g. in Python:
//
//	hmac.new(secret, b"te-sidecar-token v1", hashlib.sha256).hexdigest()
//
// The token is a bearer credential: it does not reveal the secret (HMAC is
// one-way) but whoever holds it is let in, so it travels only to the
// sidecar of the caller's own pod or over a network the operator trusts.
//
// # The sidecar's proof
//
// The token opens every sidecar of the cluster, so te's clients send it only
// to a server that proves it holds the secret: the client sends a fresh
// nonce (GET /metadata/proof?nonce=N), te-sidecar answers its instance and
//
//	proof = lowercase hex of HMAC-SHA256(key = HMAC-SHA256(secret, "te-sidecar-proof v1"), message = nonce + "\n" + instance)
//
// under each secret it holds, and the client checks the proof of its current
// secret. The key's label differs from the token's, so the token does not
// give the proof; the nonce makes a recorded answer useless.
//
// # Client tokens
//
// A client may instead send its own token, ClientToken(secret, name) =
// hex of HMAC-SHA256(secret, "te-sidecar-client v1\n" + name), together with
// its name in X-Te-Client. te-sidecar then keeps the client's handoff quotas
// under that name; a request with the cluster token is charged to its source
// host, whatever name it gives. Only a holder of the secret can mint a name.
package authsecret
