// Package httpmeta is the client of Mooncake's HTTP metadata protocol, opened
// by the connection string http://host:port/metadata (or https://): GET, PUT
// and DELETE on the URL with ?key=K; PUT's body is the value; a GET of a
// missing key answers 404. Mooncake's metadata servers and te-sidecar serve
// it, so engines of either project share one server.
//
// Settings go in the query, which the store removes from the URL:
//
//   - timeout: bound on one request when the caller's context has none
//     (default 3s, as Mooncake's client).
//   - retries: how often a request that failed on the network or with a 5xx
//     answer is tried again (default 2).
//   - refresh: how often the store checks that the server still holds its
//     keys and writes them again when not (default 5s): a restarted
//     in-memory server gets the engines' segments back.
//   - cluster: namespace, as Mooncake's MC_METADATA_CLUSTER_ID (which is read
//     when the query does not set it).
//
// It sends "Authorization: Bearer <token>" with, in this order: the token
// given in meta.Options; $MC_METADATA_HTTP_TOKEN, as Mooncake's client does
// (for a Mooncake metadata server, or te-sidecar's -metadata-token); or
// te-sidecar's token derived from the cluster secret, given in meta.Options
// (an engine passes its own) or found in TE_AUTH_SECRET_FILE or
// TE_AUTH_SECRET (package authsecret).
//
// A token given (the first two) is the user's choice and goes to the
// server as it is. The token derived from the secret opens /metadata and
// /handoff on every sidecar of the cluster, so it goes only to a server
// that proves it holds the secret: every new connection (over https, after
// the certificate is verified as usual) first asks GET <path>/proof?nonce=N
// with a fresh random nonce and no token, and carries requests only if the
// answer holds the HMAC of that nonce and the server's instance under a key
// derived from the current secret (authsecret.Proof). A server that does
// not prove it (a Mooncake metadata server, any other HTTP server,
// te-sidecar with another secret or none) gets no token and no request, and
// every call fails with Unauthenticated naming the URL and why. The proof
// is per connection, so a reconnection (a restarted or replaced server) is
// proven again; a kept-alive connection costs nothing more.
//
// The proof keeps the token from a server that does not hold the secret;
// it does not hide the token on the path: over http:// the token and the
// values cross the network in clear, and a party on the path, or a
// configured server that relays the exchange to a genuine sidecar, can
// take the token. Use https:// or a sidecar on loopback or a network you
// trust. The protocol has no TTL: a dead engine's keys stay until something
// deletes them.
//
// Importing this package registers the "http" and "https" schemes with
// package meta; package engine imports it.
package httpmeta
