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
// Version 2 of the exchange (ClientSession, ServerSession) also opens an
// authenticated session: keys derived from the secret and the exchange's
// transcript (internal/session) with which every later frame of the
// connection is sealed, so that a party on the path, or one that relays
// the exchange, can neither inject nor alter a frame. A side with a secret
// that speaks version 2 refuses version 1, so no connection is downgraded
// to one without a session. Version 1 (Client, Server) stays for the
// connection code until it seals its frames.
//
// A Secret holds the current key and, during a rotation, the previous one;
// LoadSecret reads it from a configuration value, a file or the environment
// (TE_AUTH_SECRET_FILE, TE_AUTH_SECRET).
package peerauth
