// Package sidecarproof makes an HTTP client send te-sidecar's token derived
// from the cluster secret only over connections whose server has proved
// that it holds the secret.
//
// The token opens /metadata and /handoff on every sidecar of the cluster,
// so a client that derives it (the HTTP metadata store, the handoff client)
// must not hand it to whatever address it was given. A Prover, installed in
// the client's http.Transport, asks the server on every new connection,
// before the transport writes anything on it, for
//
//	GET <Path>?nonce=N        (a fresh nonce, no Authorization header)
//
// and checks the answer with authsecret (Secrets.Proves). A server that
// cannot prove it gets no request at all; the dial fails with an
// Unauthenticated error naming the server and saying the token was not
// sent. Binding the proof to the connection means a reconnection (a
// restarted sidecar, a name that now resolves elsewhere) proves again,
// while a kept-alive connection costs nothing more. Over https the TLS
// handshake, verified as usual, comes first.
//
// A token the user gave explicitly is theirs to send to a server they
// named: clients install a Prover only for a token derived from the secret.
package sidecarproof
