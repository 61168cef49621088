// Package peerauth proves, on one connection, that both ends hold the
// cluster secret: the mutual challenge-response of internal/wire/spec.md
// ("Peer authentication"), HMAC-SHA256 over both sides' fresh nonces and
// instance ids, run before any other byte of the connection is trusted.
//
// The control plane runs it on every connection it accepts (Server) or
// dials (Client); the tcp data path runs it right after its preface. The
// secret never crosses the wire; a party without it obtains nothing, and a
// recorded exchange cannot be replayed. Without a secret on either side the
// exchange still runs (one round trip) so that each side learns the other's
// instance and a side with a secret can refuse a side without one clearly.
//
// A Secret holds the current key and, during a rotation, the previous one;
// LoadSecret reads it from a configuration value, a file or the environment
// (TE_AUTH_SECRET_FILE, TE_AUTH_SECRET).
package peerauth
