package httpmeta

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
)

// maxProofAnswer bounds a proof answer: an instance and two proofs.
const maxProofAnswer = 4096

// dialProven makes every connection of tr prove, before the transport
// sends anything on it, that its server holds the cluster secret: the
// token derived from the secret then travels only over connections to such
// a server. The proof is per connection rather than per store, so a
// reconnection (the server restarted, the name now resolves elsewhere) is
// proven again before the token goes out on it; a kept-alive connection
// costs nothing more. Over https the TLS handshake, verified as usual,
// comes first.
func (s *Store) dialProven(tr *http.Transport, d *net.Dialer, scheme string) {
	if scheme == "https" {
		tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			td := &tls.Dialer{NetDialer: d, Config: &tls.Config{ServerName: host, RootCAs: s.roots, MinVersion: tls.VersionTLS12}}
			c, err := td.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return s.proven(ctx, c, "https://"+addr)
		}
		return
	}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return s.proven(ctx, c, "http://"+addr)
	}
}

// proven returns c once its server has proved it holds the secret, and
// closes it otherwise.
func (s *Store) proven(ctx context.Context, c net.Conn, origin string) (net.Conn, error) {
	if err := s.prove(ctx, c, origin); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// prove asks the server on c to prove it holds the cluster secret: a GET
// of the proof route with a fresh nonce and no token, whose answer must
// hold the HMAC of the nonce and the server's instance under a key derived
// from the current secret (authsecret.Proof). A fresh nonce per connection
// makes a recorded answer useless. A server that answers and cannot prove
// gets an Unauthenticated error naming it and why; one that cannot be
// reached or fails midway, a Metadata or Timeout error (retried).
func (s *Store) prove(ctx context.Context, c net.Conn, origin string) error {
	deadline := time.Now().Add(s.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	url := origin + s.proofPath
	nonce := authsecret.NewNonce()
	refuse := func(format string, args ...any) error {
		return errs.New(errs.Unauthenticated, "http metadata",
			"metadata server %s did not prove it holds the cluster secret (%s); the sidecar token is not sent",
			s.base, fmt.Sprintf(format, args...)).
			WithHint("point the store at te-sidecar with the same cluster secret, or set " + EnvToken +
				" to the metadata server's own token (sent without a proof)")
	}
	failed := func(err error, what string) error {
		code := errs.Metadata
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() || ctx.Err() != nil {
			code = errs.Timeout
		}
		return errs.Wrap(code, "http metadata", err, "%s %s", what, url).
			WithHint("check that the metadata server is running and reachable")
	}
	req, err := http.NewRequest(http.MethodGet, url+"?nonce="+nonce, nil)
	if err != nil {
		return errs.Wrap(errs.InvalidArgument, "http metadata", err, "proof request to %s", url)
	}
	req.Header.Set("Accept", "application/json")
	if err := req.Write(c); err != nil {
		return failed(err, "asking for a proof of the cluster secret at")
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return failed(err, "reading the proof of the cluster secret from")
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxProofAnswer+1))
	resp.Body.Close()
	switch {
	case err != nil:
		return failed(err, "reading the proof of the cluster secret from")
	case resp.StatusCode >= 500:
		return errs.New(errs.Metadata, "http metadata", "GET %s: HTTP %d: %.200s", url, resp.StatusCode, b)
	case resp.StatusCode != http.StatusOK:
		return refuse("GET %s answered HTTP %d: %.200s", url, resp.StatusCode, b)
	case len(b) > maxProofAnswer:
		return refuse("its answer is over %d bytes", maxProofAnswer)
	}
	var a authsecret.ProofAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		return refuse("its answer is not a proof: %v", err)
	}
	if !s.sec.Proves(&a, nonce) {
		return refuse("its proof does not match this cluster secret")
	}
	// The connection goes on to carry the token: nothing may be left of
	// the exchange, or the transport would read it as the next answer.
	if resp.Close || br.Buffered() > 0 {
		return errs.New(errs.Metadata, "http metadata", "%s proved it holds the secret but did not keep the connection open for requests", url)
	}
	if !stop() {
		return failed(ctx.Err(), "proving")
	}
	c.SetDeadline(time.Time{})
	return nil
}

// unwrapOurs returns the store's own error inside err (what the transport
// wrapped around a failed proof), else err.
func unwrapOurs(err error) error {
	var e *errs.Error
	if errors.As(err, &e) {
		return e
	}
	return err
}
