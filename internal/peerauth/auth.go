package peerauth

import (
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/wire"
)

// Conn is what the exchange needs of a connection. A net.Conn is one; a
// caller that already wraps the connection in a buffered reader passes
// WithReader(conn, r) so no byte is lost between the two.
type Conn interface {
	io.Reader
	io.Writer
	SetDeadline(t time.Time) error
}

// Client runs the initiator's side of the exchange on conn, which must be
// freshly connected (after the data path's preface, for a data connection):
// it proves that this side holds s and checks that the peer does too.
// localInstance is this engine's instance id (1 to 128 bytes).
//
// It returns the peer's instance id, proven when s is not nil. Errors:
// Unauthenticated (the message says which side refused: the peer has no
// secret or another one, or this side has none and the peer requires one),
// ResourceExhausted (the peer is at its connection limit), Timeout (not done
// by deadline), PeerUnreachable (the peer closed the connection), Protocol,
// NotSupported. On error the caller closes conn and sends nothing on it.
//
// deadline bounds the whole exchange (zero: none). Client leaves conn's
// deadline cleared. It reads exactly the exchange's bytes, nothing after.
func Client(conn Conn, s *Secret, localInstance string, deadline time.Time) (peerInstance string, err error) {
	if err := checkInstance(localInstance); err != nil {
		return "", err
	}
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	who := nameOf(conn)

	h := &wire.Hello{Version: wire.AuthVersion, Instance: localInstance}
	rand.Read(h.Nonce[:])
	if s != nil {
		for _, k := range s.keys {
			h.KeyIDs = append(h.KeyIDs, k.id)
		}
	}
	hb := wire.AppendHello(nil, h)
	if err := writeMsg(conn, hb); err != nil {
		return "", ioErr(err, who, "send HELLO")
	}
	var buf [wire.MaxAuthBody]byte
	cb, err := readMsg(conn, buf[:], who)
	if err != nil {
		return "", err
	}
	c, err := wire.DecodeChallenge(cb)
	if err != nil {
		return "", err
	}
	switch c.Status {
	case wire.AuthBusy:
		return "", errs.New(errs.ResourceExhausted, "auth", "peer %s refused the connection: it is at its connection limit", who)
	case wire.AuthBadVersion:
		return "", errs.New(errs.NotSupported, "auth", "peer %s does not speak authentication version %d", who, wire.AuthVersion)
	case wire.AuthSecretRequired:
		return "", errs.New(errs.Unauthenticated, "auth", "peer %s refused this engine: the server requires the cluster secret, and this engine has none", who).
			WithHint("give every engine the secret: Config.AuthSecret, " + EnvSecretFile + " or " + EnvSecret)
	case wire.AuthUnknownKey:
		return "", errs.New(errs.Unauthenticated, "auth", "peer %s refused this engine: it holds none of this engine's secrets (key ids %s)", who, strings.Join(s.KeyIDs(), ", ")).
			WithHint("the two engines have different cluster secrets")
	}
	if c.Version != wire.AuthVersion {
		return "", errs.New(errs.NotSupported, "auth", "peer %s answered with authentication version %d, not %d", who, c.Version, wire.AuthVersion)
	}
	if c.Status == wire.AuthNoAuth {
		if s != nil {
			return "", errs.New(errs.Unauthenticated, "auth", "peer %s (instance %s) does not authenticate: it has no cluster secret, and this engine refuses it", who, printable(c.Instance)).
				WithHint("give the peer the cluster secret too")
		}
		if err := checkInstance(c.Instance); err != nil {
			return "", errs.New(errs.Protocol, "auth", "peer %s sent an unusable instance id", who)
		}
		return c.Instance, nil
	}
	// Status AuthProceed.
	if s == nil || int(c.KeyIndex) >= len(s.keys) {
		return "", errs.New(errs.Protocol, "auth", "peer %s asked for a proof with key %d of the %d this engine offered", who, c.KeyIndex, len(h.KeyIDs))
	}
	if err := checkInstance(c.Instance); err != nil {
		return "", errs.New(errs.Protocol, "auth", "peer %s sent an unusable instance id", who)
	}
	k := s.keys[c.KeyIndex]
	t := wire.AppendTranscript(nil, hb, cb)
	proof := mac(k, labelInitiator, t)
	if err := writeMsg(conn, wire.AppendProof(nil, &proof)); err != nil {
		return "", ioErr(err, who, "send PROOF")
	}
	rb, err := readMsg(conn, buf[:], who)
	if err != nil {
		return "", err
	}
	r, err := wire.DecodeResult(rb)
	if err != nil {
		return "", err
	}
	if r.Status == wire.AuthBadProof {
		return "", errs.New(errs.Unauthenticated, "auth", "peer %s refused this engine's proof", who)
	}
	want := mac(k, labelServer, t)
	if !hmac.Equal(r.MAC[:], want[:]) {
		return "", errs.New(errs.Unauthenticated, "auth", "peer %s (instance %s) failed to prove it holds the cluster secret; this engine refuses it", who, printable(c.Instance))
	}
	return c.Instance, nil
}

// Server runs the accepting side of the exchange on conn: it checks that the
// peer holds s and proves that this side does too. With s nil it answers
// "no authentication here" and returns the peer's claimed, unproven instance.
//
// It returns the peer's instance id. Errors: Unauthenticated (the peer
// offered no secret, another one, or a wrong proof; it was told it is
// refused and learned nothing else), Timeout, PeerUnreachable, Protocol (the
// first frame is not an authentication frame, or is malformed),
// NotSupported. On error the caller closes conn without reading from it
// again.
//
// deadline bounds the whole exchange (zero: none). Server leaves conn's
// deadline cleared. It reads exactly the exchange's bytes, nothing after.
func Server(conn Conn, s *Secret, localInstance string, deadline time.Time) (peerInstance string, err error) {
	if err := checkInstance(localInstance); err != nil {
		return "", err
	}
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	who := nameOf(conn)

	var buf [wire.MaxAuthBody]byte
	hb, err := readMsg(conn, buf[:], who)
	if err != nil {
		return "", err
	}
	hb = append([]byte(nil), hb...) // buf is reused for PROOF
	h, err := wire.DecodeHello(hb)
	if err != nil {
		return "", err
	}
	c := &wire.Challenge{Version: wire.AuthVersion}
	refuse := func(st wire.AuthStatus, err error) (string, error) {
		c.Status = st
		writeMsg(conn, wire.AppendChallenge(nil, c))
		return "", err
	}
	if h.Version != wire.AuthVersion {
		return refuse(wire.AuthBadVersion, errs.New(errs.NotSupported, "auth", "peer %s speaks authentication version %d, not %d", who, h.Version, wire.AuthVersion))
	}
	if s == nil {
		c.Status, c.Instance = wire.AuthNoAuth, localInstance
		if err := writeMsg(conn, wire.AppendChallenge(nil, c)); err != nil {
			return "", ioErr(err, who, "send CHALLENGE")
		}
		return h.Instance, nil
	}
	if len(h.KeyIDs) == 0 {
		return refuse(wire.AuthSecretRequired, errs.New(errs.Unauthenticated, "auth",
			"peer %s (instance %s) has no cluster secret; this engine requires one and refused it", who, printable(h.Instance)))
	}
	var k key
	found := false
	for i, id := range h.KeyIDs {
		if k, found = s.find(id); found {
			c.KeyIndex = uint8(i)
			break
		}
	}
	if !found {
		var theirs []string
		for _, id := range h.KeyIDs {
			theirs = append(theirs, hexID(id))
		}
		return refuse(wire.AuthUnknownKey, errs.New(errs.Unauthenticated, "auth",
			"peer %s (instance %s) holds none of this engine's secrets (its key ids %s, ours %s); refused",
			who, printable(h.Instance), strings.Join(theirs, ", "), strings.Join(s.KeyIDs(), ", ")))
	}
	c.Status, c.Instance = wire.AuthProceed, localInstance
	rand.Read(c.Nonce[:])
	cb := wire.AppendChallenge(nil, c)
	if err := writeMsg(conn, cb); err != nil {
		return "", ioErr(err, who, "send CHALLENGE")
	}
	pb, err := readMsg(conn, buf[:], who)
	if err != nil {
		return "", err
	}
	proof, err := wire.DecodeProof(pb)
	if err != nil {
		return "", err
	}
	t := wire.AppendTranscript(nil, hb, cb)
	want := mac(k, labelInitiator, t)
	if !hmac.Equal(proof[:], want[:]) {
		writeMsg(conn, wire.AppendResult(nil, &wire.Result{Status: wire.AuthBadProof}))
		return "", errs.New(errs.Unauthenticated, "auth",
			"peer %s (instance %s) sent a wrong proof for key id %s (another secret under a copied key id, or a replayed exchange); refused",
			who, printable(h.Instance), hexID(k.id))
	}
	if err := writeMsg(conn, wire.AppendResult(nil, &wire.Result{Status: wire.AuthProceed, MAC: mac(k, labelServer, t)})); err != nil {
		return "", ioErr(err, who, "send RESULT")
	}
	return h.Instance, nil
}

// Refuse tells a connection this side will not serve (it is at its
// connection limit) with a CHALLENGE of status 4, without reading anything:
// the initiator's Client then returns ResourceExhausted. The caller closes
// conn afterwards. The write is bounded by deadline.
func Refuse(conn Conn, deadline time.Time) error {
	conn.SetDeadline(deadline)
	return writeMsg(conn, wire.AppendChallenge(nil, &wire.Challenge{Version: wire.AuthVersion, Status: wire.AuthBusy}))
}

// IsAuthFrame reports whether hdr, the first wire.FrameHeaderSize bytes a
// peer sent, opens the exchange (kind wire.KindAuth): a listener that also
// serves Mooncake peers tells them apart with it.
func IsAuthFrame(hdr []byte) bool {
	return len(hdr) >= wire.FrameHeaderSize && hdr[wire.OffFrameKind] == wire.KindAuth
}

// WithReader returns conn reading through r (a bufio.Reader over conn, say),
// for a caller that already buffered part of the connection.
func WithReader(conn net.Conn, r io.Reader) net.Conn { return &readerConn{conn, r} }

type readerConn struct {
	net.Conn
	r io.Reader
}

func (c *readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func writeMsg(conn Conn, body []byte) error {
	_, err := conn.Write(wire.AppendFrame(make([]byte, 0, wire.FrameHeaderSize+len(body)), wire.KindAuth, body))
	return err
}

// readMsg reads one authentication frame into buf (at most MaxAuthBody
// bytes): nothing is allocated for what the peer claims.
func readMsg(conn Conn, buf []byte, who string) ([]byte, error) {
	var h [wire.FrameHeaderSize]byte
	if _, err := io.ReadFull(conn, h[:]); err != nil {
		return nil, ioErr(err, who, "read")
	}
	kind, n, err := wire.ParseFrameHeader(h[:])
	if err != nil {
		return nil, err
	}
	if kind != wire.KindAuth {
		return nil, errs.New(errs.Protocol, "auth", "peer %s sent a frame of kind %#x where authentication was due", who, kind).
			WithHint("both ends must be te engines that authenticate (kind 0x13 first)")
	}
	if n > uint64(len(buf)) {
		return nil, errs.New(errs.Protocol, "auth", "peer %s sent an authentication frame of %d bytes (at most %d)", who, n, len(buf))
	}
	if _, err := io.ReadFull(conn, buf[:n]); err != nil {
		return nil, ioErr(err, who, "read")
	}
	return buf[:n], nil
}

func ioErr(err error, who, what string) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return errs.Wrap(errs.Timeout, "auth", err, "authentication with %s did not finish in time", who)
	}
	return errs.Wrap(errs.PeerUnreachable, "auth", err, "%s during authentication with %s (the peer closed the connection)", what, who)
}

func checkInstance(s string) error {
	if len(s) == 0 || len(s) > wire.MaxAuthInstance {
		return errs.New(errs.InvalidArgument, "auth", "instance id of %d bytes (1 to %d)", len(s), wire.MaxAuthInstance)
	}
	return nil
}

func nameOf(conn Conn) string {
	if a, ok := conn.(interface{ RemoteAddr() net.Addr }); ok && a.RemoteAddr() != nil {
		return a.RemoteAddr().String()
	}
	return "peer"
}

func hexID(id [wire.AuthKeyIDSize]byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 2*len(id))
	for i, b := range id {
		out[2*i], out[2*i+1] = digits[b>>4], digits[b&15]
	}
	return string(out)
}

// printable keeps a peer-chosen string fit for a log line.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}
