package sidecarproof

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
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

// MaxAnswer bounds a proof answer: an instance and two proofs.
const MaxAnswer = 4096

// Prover proves the connections of an http.Transport (Install). Its fields
// are read at each dial, so they may be set after Install, before the first
// request.
type Prover struct {
	// Secrets is the cluster secret; the server must prove the current one,
	// whose token the client sends.
	Secrets *authsecret.Secrets
	// Path is the proof route, e.g. "/metadata/proof".
	Path string
	// Timeout bounds one proof exchange (the request's own deadline, if
	// sooner, wins).
	Timeout time.Duration
	// Roots verifies https servers (nil: the transport's TLS
	// configuration, else the system's roots).
	Roots *x509.CertPool

	// Op is the errors' operation ("http metadata", "handoff").
	Op string
	// Server names the server in a refusal, e.g. "metadata server
	// http://host:port/metadata"; the message goes on "did not prove it
	// holds the cluster secret (why); the sidecar token is not sent".
	Server string
	// Hint says how to fix a refusal.
	Hint string
	// FailCode is the code of a proof exchange that failed midway (the
	// server could not be reached, closed the connection, answered 5xx):
	// errs.Metadata, errs.PeerUnreachable. A timeout is errs.Timeout.
	FailCode errs.Code
	// FailHint says what to check when the exchange failed.
	FailHint string
}

// Install makes every connection tr opens prove itself before tr uses it.
// scheme is the URL scheme tr talks ("http" or "https"). The proof goes
// around the transport's own dialers: DialContext (nil: a net.Dialer with
// p.Timeout), and for https DialTLSContext when set, else a TLS handshake
// over DialContext with tr.TLSClientConfig (cloned) and p.Roots when set.
func (p *Prover) Install(tr *http.Transport, scheme string) {
	dial := tr.DialContext
	if dial == nil {
		dial = (&net.Dialer{Timeout: p.Timeout, KeepAlive: 30 * time.Second}).DialContext
	}
	if scheme != "https" {
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return p.proven(ctx, c, "http://"+addr)
		}
		return
	}
	dialTLS := tr.DialTLSContext
	if dialTLS == nil {
		base := tr.TLSClientConfig
		dialTLS = func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			cfg := &tls.Config{MinVersion: tls.VersionTLS12}
			if base != nil {
				cfg = base.Clone()
			}
			if cfg.ServerName == "" {
				cfg.ServerName = host
			}
			if p.Roots != nil {
				cfg.RootCAs = p.Roots
			}
			raw, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			c := tls.Client(raw, cfg)
			if err := c.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, err
			}
			return c, nil
		}
	}
	tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialTLS(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return p.proven(ctx, c, "https://"+addr)
	}
}

// proven returns c once its server has proved it holds the secret, and
// closes it otherwise.
func (p *Prover) proven(ctx context.Context, c net.Conn, origin string) (net.Conn, error) {
	if err := p.Prove(ctx, c, origin); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Prove asks the server on c (reached at origin, "scheme://host:port") to
// prove it holds the cluster secret: a GET of the proof route with a fresh
// nonce and no token, whose answer must hold the HMAC of the nonce and the
// server's instance under a key derived from the current secret
// (authsecret.Proof). A fresh nonce per connection makes a recorded answer
// useless. A server that answers and cannot prove gets an Unauthenticated
// error; one that cannot be reached or fails midway, a FailCode or Timeout
// error (the caller may retry those). On success c is left with no
// deadline and nothing unread, ready to carry requests.
func (p *Prover) Prove(ctx context.Context, c net.Conn, origin string) error {
	deadline := time.Now().Add(p.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	url := origin + p.Path
	nonce := authsecret.NewNonce()
	refuse := func(format string, args ...any) error {
		return errs.New(errs.Unauthenticated, p.Op,
			"%s did not prove it holds the cluster secret (%s); the sidecar token is not sent",
			p.Server, fmt.Sprintf(format, args...)).WithHint(p.Hint)
	}
	failed := func(err error, what string) error {
		code := p.FailCode
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() || ctx.Err() != nil {
			code = errs.Timeout
		}
		return errs.Wrap(code, p.Op, err, "%s %s", what, url).WithHint(p.FailHint)
	}
	req, err := http.NewRequest(http.MethodGet, url+"?nonce="+nonce, nil)
	if err != nil {
		return errs.Wrap(errs.InvalidArgument, p.Op, err, "proof request to %s", url)
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
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswer+1))
	resp.Body.Close()
	switch {
	case err != nil:
		return failed(err, "reading the proof of the cluster secret from")
	case resp.StatusCode >= 500:
		return errs.New(p.FailCode, p.Op, "GET %s: HTTP %d: %.200s", url, resp.StatusCode, b).WithHint(p.FailHint)
	case resp.StatusCode != http.StatusOK:
		return refuse("GET %s answered HTTP %d: %.200s", url, resp.StatusCode, b)
	case len(b) > MaxAnswer:
		return refuse("its answer is over %d bytes", MaxAnswer)
	}
	var a authsecret.ProofAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		return refuse("its answer is not a proof: %v", err)
	}
	if !p.Secrets.Proves(&a, nonce) {
		return refuse("its proof does not match this cluster secret")
	}
	// The connection goes on to carry the token: nothing may be left of
	// the exchange, or the transport would read it as the next answer.
	if resp.Close || br.Buffered() > 0 {
		return errs.New(p.FailCode, p.Op, "%s proved it holds the secret but did not keep the connection open for requests", url)
	}
	if !stop() {
		return failed(ctx.Err(), "proving")
	}
	c.SetDeadline(time.Time{})
	return nil
}

// Ours returns the *errs.Error inside err (what a transport wrapped around
// a failed proof), else err.
func Ours(err error) error {
	var e *errs.Error
	if errors.As(err, &e) {
		return e
	}
	return err
}
