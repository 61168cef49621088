package handoff

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sidecarproof"
	"github.com/tecache/te/kvcache/handoff/proto"
)

// Mode says which side moves the bytes.
type Mode string

// Modes.
const (
	// Push: prefill WRITEs into decode's blocks (as Mooncake and SGLang do).
	Push Mode = "push"
	// Pull: decode READs from prefill's blocks (as NIXL does).
	Pull Mode = "pull"
)

// NotifyName is the engine notification name handoff completions travel
// under; the Client consumes them.
const NotifyName = proto.NotifyName

// Options configure a Client.
type Options struct {
	// Sidecar is te-sidecar's address: "host:port" or "http://host:port".
	Sidecar string
	// HTTPClient talks to the sidecar (default: a client with keep-alive
	// connections and no overall timeout; each call has its own).
	HTTPClient *http.Client
	// RequestTimeout bounds one sidecar call that is not a long poll
	// (default 5s).
	RequestTimeout time.Duration
	// PollInterval is the longest pause between two looks at the engine's
	// notifications while waiting for a peer's completion (default 1ms; the
	// first looks come sooner).
	PollInterval time.Duration
	// LostGrace is how long a waiting side that learns its transfer was lost
	// while the peer was moving still waits for the peer's completion
	// notification (default 5s).
	LostGrace time.Duration
	// Token is the bearer token te-sidecar requires when it has a cluster
	// secret. Empty: derived from AuthSecret, else AuthSecretFile, else the
	// environment (TE_AUTH_SECRET_FILE, then TE_AUTH_SECRET); none at all
	// sends no token.
	Token string
	// AuthSecret is the cluster secret (its first line is used).
	AuthSecret string
	// AuthSecretFile is a file holding the cluster secret.
	AuthSecretFile string
}

// Client is one process's handoff client: it declares transfers to the
// sidecar and drives its engine for the transfers this side moves. It reads
// the engine's notifications (engine.Notifies) for completions; an
// application that also uses notifications reads the others with
// Client.Notifies. Safe for concurrent use.
type Client struct {
	e     *engine.Engine
	base  string
	hc    *http.Client
	opts  Options
	token string

	nmu sync.Mutex
	// notices holds completions received for transfers this client
	// declared and has not finished (open); a notice for any other id is
	// dropped, so nobody can plant one ahead of a transfer.
	notices map[string][]proto.Notice
	open    map[string]int
	other   []engine.Notification
}

// maxNoticesPerID bounds the notices kept for one open transfer until its
// waiting side checks them (the paired mover's, and whatever others sent
// under its id); older ones are dropped first.
const maxNoticesPerID = 4

// New returns a client for engine e and the sidecar in opts.
func New(e *engine.Engine, opts Options) (*Client, error) {
	if e == nil {
		return nil, errs.New(errs.InvalidArgument, "handoff", "nil engine")
	}
	base := strings.TrimSpace(opts.Sidecar)
	if base == "" {
		return nil, errs.New(errs.InvalidArgument, "handoff", "no sidecar address").
			WithHint("give te-sidecar's host:port, e.g. 127.0.0.1:8080")
	}
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" {
		return nil, errs.New(errs.InvalidArgument, "handoff", "sidecar address %q is not host:port or http://host:port", opts.Sidecar)
	}
	base = u.Scheme + "://" + u.Host
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 5 * time.Second
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = time.Millisecond
	}
	if opts.LostGrace <= 0 {
		opts.LostGrace = 5 * time.Second
	}
	token := opts.Token
	var sec *authsecret.Secrets
	if token == "" {
		var err error
		if sec, err = authsecret.Load(opts.AuthSecret, opts.AuthSecretFile, os.Getenv); err != nil {
			return nil, errs.Wrap(errs.CodeOf(err), "handoff", err, "the cluster secret for te-sidecar")
		}
		if sec != nil {
			token = sec.Token()
			// With the secret, the client's own token: te-sidecar then keeps
			// this engine's quotas apart from other clients on its host.
			if name := e.Name(); usableName(name) {
				token = sec.ClientToken(name)
			}
		}
	}
	hc, err := httpClient(opts, sec, base, u.Scheme)
	if err != nil {
		return nil, err
	}
	return &Client{e: e, base: base, hc: hc, opts: opts, token: token, notices: map[string][]proto.Notice{}, open: map[string]int{}}, nil
}

// httpClient returns the client that talks to the sidecar at base. With a
// token derived from the secret (sec set), every connection it opens must
// first prove that its server holds the secret (package sidecarproof): the
// token opens every sidecar of the cluster, so it goes to no server that
// cannot. A token given in Options.Token is sent as given.
func httpClient(opts Options, sec *authsecret.Secrets, base, scheme string) (*http.Client, error) {
	if sec == nil && opts.HTTPClient != nil {
		return opts.HTTPClient, nil
	}
	var tr *http.Transport
	if opts.HTTPClient == nil || opts.HTTPClient.Transport == nil {
		tr = &http.Transport{
			Proxy:               nil, // the sidecar is in the pod: never through a proxy
			DialContext:         (&net.Dialer{Timeout: opts.RequestTimeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		}
	} else {
		given, ok := opts.HTTPClient.Transport.(*http.Transport)
		if !ok {
			return nil, errs.New(errs.InvalidArgument, "handoff",
				"Options.HTTPClient's transport is a %T: with a token derived from the cluster secret it must be an *http.Transport, on whose connections te-sidecar proves it holds the secret", opts.HTTPClient.Transport).
				WithHint("leave Options.HTTPClient unset or give it an *http.Transport, or give the token in Options.Token (sent without a proof)")
		}
		// A copy with the proof around its dialers. The proof is asked on
		// the connection itself, which through a proxy would be the
		// proxy's: no proxy.
		tr = given.Clone()
		tr.Proxy = nil
	}
	if sec != nil {
		(&sidecarproof.Prover{
			Secrets: sec,
			Path:    "/metadata" + authsecret.ProofPath,
			Timeout: opts.RequestTimeout,
			Op:      "handoff",
			Server:  "sidecar " + base,
			Hint: "point the client at te-sidecar with the same cluster secret (" + authsecret.EnvSecretFile + " or " +
				authsecret.EnvSecret + "), or give the sidecar's token in Options.Token (sent without a proof)",
			FailCode: errs.PeerUnreachable,
			FailHint: "check that te-sidecar is running and reachable",
		}).Install(tr, scheme)
	}
	if opts.HTTPClient == nil {
		return &http.Client{Transport: tr}, nil
	}
	c := *opts.HTTPClient
	c.Transport = tr
	return &c, nil
}

// usableName reports whether te-sidecar takes name as a client name (at
// most 256 bytes, no control characters).
func usableName(name string) bool {
	return name != "" && len(name) <= 256 && !strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// Close releases the client's idle sidecar connections. Transfers in
// progress are not affected.
func (c *Client) Close() error {
	c.hc.CloseIdleConnections()
	return nil
}

// Notifies drains the engine's notifications and returns those that are not
// handoff completions, oldest first. Use it instead of engine.Notifies once
// a Client reads that engine.
func (c *Client) Notifies() []engine.Notification {
	c.nmu.Lock()
	defer c.nmu.Unlock()
	c.drainLocked()
	out := c.other
	c.other = nil
	return out
}

func (c *Client) drainLocked() {
	for _, n := range c.e.Notifies() {
		if n.Name != NotifyName {
			c.other = append(c.other, n)
			continue
		}
		var nt proto.Notice
		if json.Unmarshal([]byte(n.Msg), &nt) != nil || nt.ID == "" {
			continue // not ours after all; a malformed notice cannot be matched to a transfer
		}
		if c.open[nt.ID] == 0 {
			continue // no transfer of ours by that id: never stored, never counted
		}
		q := c.notices[nt.ID]
		if len(q) >= maxNoticesPerID {
			q = q[1:]
		}
		c.notices[nt.ID] = append(q, nt)
	}
}

// track notes that this client declared transfer id: notices for it are
// kept until untrack.
func (c *Client) track(id string) {
	c.nmu.Lock()
	c.open[id]++
	c.nmu.Unlock()
}

// untrack forgets one declaration of id and, with the last, its notices.
func (c *Client) untrack(id string) {
	c.nmu.Lock()
	defer c.nmu.Unlock()
	if c.open[id]--; c.open[id] <= 0 {
		delete(c.open, id)
		delete(c.notices, id)
	}
}

// notice returns and forgets the first completion received for id that
// verifies under key (the transfer's notice key), if any; the others
// received so far are dropped.
func (c *Client) notice(id, key string) (proto.Notice, bool) {
	c.nmu.Lock()
	defer c.nmu.Unlock()
	c.drainLocked()
	q := c.notices[id]
	if len(q) == 0 || key == "" {
		return proto.Notice{}, false // unchecked notices wait for the key
	}
	delete(c.notices, id)
	for _, n := range q {
		if n.Verify(key) {
			return n, true
		}
	}
	return proto.Notice{}, false
}

// httpError is a sidecar answer other than 200.
type httpError struct {
	status int
	body   proto.ErrorBody
}

// call sends one request to the sidecar, with the transfer's capability
// when there is one, and decodes the record it answers. A non-200 answer
// comes back as *httpError (with the error body), a transport failure as a
// PeerUnreachable error.
func (c *Client) call(ctx context.Context, method, path string, in any, timeout time.Duration, capability string) (proto.Record, *httpError, error) {
	var rec proto.Record
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return rec, nil, errs.Wrap(errs.InvalidArgument, "handoff", err, "encoding request")
		}
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return rec, nil, errs.Wrap(errs.InvalidArgument, "handoff", err, "building request")
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if capability != "" {
		req.Header.Set(proto.CapabilityHeader, capability)
	}
	req.Header.Set(proto.ClientHeader, c.e.Name())
	resp, err := c.hc.Do(req)
	if err != nil {
		if errs.CodeOf(err) == errs.Unauthenticated {
			return rec, nil, sidecarproof.Ours(err) // the sidecar did not prove it holds the secret: nothing was sent
		}
		if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return rec, nil, errs.Wrap(errs.Timeout, "handoff", err, "sidecar %s did not answer %s %s in time", c.base, method, path)
		}
		return rec, nil, errs.Wrap(errs.PeerUnreachable, "handoff", err, "sidecar %s unreachable", c.base)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return rec, nil, errs.Wrap(errs.PeerUnreachable, "handoff", err, "reading the sidecar's answer")
	}
	if resp.StatusCode != http.StatusOK {
		he := &httpError{status: resp.StatusCode}
		if json.Unmarshal(b, &he.body) != nil || he.body.Error == "" {
			he.body = proto.ErrorBody{Error: strings.TrimSpace(string(b)), Code: int32(errs.Protocol),
				Instance: resp.Header.Get(proto.InstanceHeader)}
		}
		return rec, he, nil
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.Instance == "" {
		return rec, nil, errs.New(errs.Protocol, "handoff", "the sidecar's answer to %s %s is not a handoff record: %.200q", method, path, b)
	}
	return rec, nil, nil
}

// refused turns a sidecar's error answer into an *errs.Error with the
// sidecar's code.
func refused(op string, he *httpError) error {
	code := errs.Code(he.body.Code)
	if code == errs.OK {
		code = errs.Protocol
	}
	e := errs.New(code, op, "sidecar answered %d: %s", he.status, he.body.Error)
	if he.status == http.StatusUnauthorized {
		e = e.WithHint("te-sidecar has a cluster secret: give this process the same one (" +
			authsecret.EnvSecretFile + " or " + authsecret.EnvSecret + ")")
	}
	return e
}

// Status is a transfer's state as the sidecar holds it.
type Status struct {
	ID    string
	State string // waiting, transferring, done, failed, aborted, expired
	Mode  Mode
	Bytes uint64
	// Code is the stable error code of a failed, aborted or expired
	// transfer.
	Code errs.Code
	// Reason says why it failed, was aborted or expired.
	Reason string
	// Settled is true once the moving side is known not to touch either
	// side's memory for this transfer any more: blocks may be reused.
	Settled bool
	// Instance is the sidecar's instance.
	Instance string
}

func statusOf(r proto.Record) Status {
	return Status{ID: r.ID, State: string(r.State), Mode: Mode(r.Mode), Bytes: r.Bytes, Code: errs.Code(r.Code),
		Reason: r.Reason, Settled: r.Settled, Instance: r.Instance}
}

// endErr is the error a caller gets for a transfer that ended other than
// done.
func endErr(op string, r proto.Record) error {
	code := errs.Code(r.Code)
	if code == errs.OK {
		code = errs.Internal
	}
	return errs.New(code, op, "transfer %q %s: %s", r.ID, r.State, r.Reason)
}

func lost(op, id, why string) error {
	return errs.New(errs.TransferLost, op, "transfer %q lost: %s", id, why).
		WithHint("the sidecar restarted or dropped it; release the blocks and retry the request")
}

func wait(q url.Values) string { return "/handoff/wait?" + q.Encode() }

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
