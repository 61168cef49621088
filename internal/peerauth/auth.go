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
	"github.com/tecache/te/internal/session"
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
	o, err := client(conn, s, localInstance, deadline, nil)
	return o.PeerInstance, err
}

// ClientSession runs the initiator's side of the version 2 exchange, which
// opens an authenticated session (spec.md, "Authenticated sessions"), as
// Client does the version 1 exchange: same proofs, same errors, same
// deadline. With a secret on both sides it returns the session that must
// seal every frame this side sends on conn from now on and open every
// frame it reads; without a secret on either side, a nil Session (frames
// cross as they are). opt.Channel says which listener conn was dialled to;
// opt.Encrypt asks for Encryption mode (the server may also require it).
func ClientSession(conn Conn, s *Secret, localInstance string, deadline time.Time, opt SessionOptions) (Opened, error) {
	if err := opt.check(s); err != nil {
		return Opened{}, err
	}
	return client(conn, s, localInstance, deadline, &opt)
}

// SessionOptions are a version 2 exchange's settings.
type SessionOptions struct {
	// Channel is session.Control or session.Data: the listener the
	// connection was made to, bound into the session's keys.
	Channel string
	// Encrypt asks for (initiator) or requires (server) Encryption mode;
	// either side asking is enough. It needs a secret.
	Encrypt bool
	// Name and Addr are, on the server, the segment name and RPC address
	// it proves to the initiator (version 3); an empty Name proves the
	// instance id in its place. The initiator proves its Name to the
	// server in HELLO (empty: it has none) and ignores Addr.
	Name, Addr string
	// HeadersOnly asks for Headers mode (payloads in the clear,
	// unauthenticated) rather than Integrity mode. Only a session both
	// sides asked Headers of gets it: the stronger of the two modes wins.
	HeadersOnly bool
}

func (o *SessionOptions) check(s *Secret) error {
	if o.Channel != session.Control && o.Channel != session.Data {
		return errs.New(errs.InvalidArgument, "auth", "unknown session channel %q", o.Channel)
	}
	if len(o.Name) > wire.MaxAuthName || len(o.Addr) > wire.MaxAuthAddr {
		return errs.New(errs.InvalidArgument, "auth", "segment name of %d or address of %d bytes (at most %d and %d)", len(o.Name), len(o.Addr), wire.MaxAuthName, wire.MaxAuthAddr)
	}
	if o.Encrypt && s == nil {
		return errs.New(errs.InvalidArgument, "auth", "encryption needs the cluster secret: the session keys come from it").
			WithHint("set the cluster secret (" + EnvSecretFile + " or " + EnvSecret + "), or do not ask for encryption")
	}
	return nil
}

// mode is the session mode this side asks for.
func (o *SessionOptions) mode(s *Secret) uint8 {
	switch {
	case s == nil:
		return wire.SessionNone
	case o.Encrypt:
		return wire.SessionEncryption
	case o.HeadersOnly:
		return wire.SessionHeaders
	}
	return wire.SessionIntegrity
}

// Opened is what a version 2 exchange established.
type Opened struct {
	// PeerInstance is the peer's instance id, proven when Session is not
	// nil.
	PeerInstance string
	// PeerName and PeerAddr are, at the initiator, the server's segment
	// name and RPC address, proven with Session (empty without one); at
	// the server, PeerName is the initiator's segment name, proven with
	// Session (empty without one, or when the initiator has none).
	// Whoever holds the secret can name itself anything; what they prove
	// is that a connection redirected on the path or by a rewritten
	// descriptor reached another segment than the one meant, and that a
	// call came from the segment it says, not from another engine.
	PeerName, PeerAddr string
	// Session seals what this side sends and opens what it reads, from
	// the byte after the exchange on; nil when neither side has a secret.
	Session *session.Session
}

// client runs version 1 (v2 nil) or version 2 of the initiator's side.
func client(conn Conn, s *Secret, localInstance string, deadline time.Time, v2 *SessionOptions) (Opened, error) {
	if err := checkInstance(localInstance); err != nil {
		return Opened{}, err
	}
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	who := nameOf(conn)

	h := &wire.Hello{Version: wire.AuthVersion, Instance: localInstance}
	if v2 != nil {
		h.Version, h.Mode, h.Name = wire.AuthVersionIdentity, v2.mode(s), v2.Name
	}
	rand.Read(h.Nonce[:])
	if s != nil {
		for _, k := range s.keys {
			h.KeyIDs = append(h.KeyIDs, k.id)
		}
	}
	hb := wire.AppendHello(nil, h)
	if err := writeMsg(conn, hb); err != nil {
		return Opened{}, ioErr(err, who, "send HELLO")
	}
	var buf [wire.MaxAuthBody]byte
	cb, err := readMsg(conn, buf[:], who)
	if err != nil {
		return Opened{}, err
	}
	c, err := wire.DecodeChallenge(cb)
	if err != nil {
		return Opened{}, err
	}
	switch c.Status {
	case wire.AuthBusy:
		return Opened{}, errs.New(errs.ResourceExhausted, "auth", "peer %s refused the connection: it is at its connection limit", who)
	case wire.AuthBadVersion:
		return Opened{}, errs.New(errs.NotSupported, "auth", "peer %s does not speak authentication version %d", who, h.Version)
	case wire.AuthSecretRequired:
		return Opened{}, errs.New(errs.Unauthenticated, "auth", "peer %s refused this engine: the server requires the cluster secret, and this engine has none", who).
			WithHint("give every engine the secret: Config.AuthSecret, " + EnvSecretFile + " or " + EnvSecret)
	case wire.AuthUnknownKey:
		return Opened{}, errs.New(errs.Unauthenticated, "auth", "peer %s refused this engine: it holds none of this engine's secrets (key ids %s)", who, strings.Join(s.KeyIDs(), ", ")).
			WithHint("the two engines have different cluster secrets")
	}
	if c.Version != h.Version {
		return Opened{}, errs.New(errs.NotSupported, "auth", "peer %s answered with authentication version %d, not %d", who, c.Version, h.Version)
	}
	if c.Status == wire.AuthNoAuth {
		if s != nil {
			return Opened{}, errs.New(errs.Unauthenticated, "auth", "peer %s (instance %s) does not authenticate: it has no cluster secret, and this engine refuses it", who, printable(c.Instance)).
				WithHint("give the peer the cluster secret too")
		}
		if err := checkInstance(c.Instance); err != nil {
			return Opened{}, errs.New(errs.Protocol, "auth", "peer %s sent an unusable instance id", who)
		}
		return Opened{PeerInstance: c.Instance}, nil
	}
	// Status AuthProceed.
	if s == nil || int(c.KeyIndex) >= len(s.keys) {
		return Opened{}, errs.New(errs.Protocol, "auth", "peer %s asked for a proof with key %d of the %d this engine offered", who, c.KeyIndex, len(h.KeyIDs))
	}
	if err := checkInstance(c.Instance); err != nil {
		return Opened{}, errs.New(errs.Protocol, "auth", "peer %s sent an unusable instance id", who)
	}
	if wire.StrongerMode(c.Mode, h.Mode) != c.Mode {
		// The mode is in the transcript, so only a server with the secret
		// can have chosen it: a broken one. Refused all the same.
		return Opened{}, errs.New(errs.Protocol, "auth", "peer %s chose session mode %d where this engine asked for %d", who, c.Mode, h.Mode)
	}
	k := s.keys[c.KeyIndex]
	t := wire.AppendTranscript(nil, hb, cb)
	proof := mac(k, labelInitiator, t)
	if err := writeMsg(conn, wire.AppendProof(nil, &proof)); err != nil {
		return Opened{}, ioErr(err, who, "send PROOF")
	}
	rb, err := readMsg(conn, buf[:], who)
	if err != nil {
		return Opened{}, err
	}
	r, err := wire.DecodeResult(rb)
	if err != nil {
		return Opened{}, err
	}
	if r.Status == wire.AuthBadProof {
		return Opened{}, errs.New(errs.Unauthenticated, "auth", "peer %s refused this engine's proof", who)
	}
	want := mac(k, labelServer, t)
	if !hmac.Equal(r.MAC[:], want[:]) {
		return Opened{}, errs.New(errs.Unauthenticated, "auth", "peer %s (instance %s) failed to prove it holds the cluster secret; this engine refuses it", who, printable(c.Instance))
	}
	o := Opened{PeerInstance: c.Instance, PeerName: c.Name, PeerAddr: c.Addr}
	if v2 != nil {
		if o.Session, err = openSession(k, t, v2.Channel, c.Mode, session.Initiator); err != nil {
			return Opened{}, err
		}
	}
	return o, nil
}

// openSession derives the session keys of a successful version 2 exchange.
func openSession(k key, transcript []byte, channel string, mode uint8, role session.Role) (*session.Session, error) {
	return session.New(session.Params{Secret: k.mac, KeyID: k.id, Transcript: transcript, Channel: channel, Mode: session.Mode(mode)}, role)
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
	o, err := server(conn, s, localInstance, deadline, nil)
	return o.PeerInstance, err
}

// ServerSession runs the accepting side of the exchange as Server does,
// speaking version 2 (which opens an authenticated session) and version 1
// to an initiator without a secret when this side has none either. With a
// secret it refuses version 1 (AuthBadVersion): an initiator that cannot
// open a session is not served, so nobody can downgrade a connection to an
// unprotected one. It returns the session (nil without a secret: frames
// cross as they are). opt.Channel names the listener; opt.Encrypt requires
// Encryption mode whatever the initiator asked for.
func ServerSession(conn Conn, s *Secret, localInstance string, deadline time.Time, opt SessionOptions) (Opened, error) {
	if err := opt.check(s); err != nil {
		return Opened{}, err
	}
	return server(conn, s, localInstance, deadline, &opt)
}

// server runs version 1 (v2 nil) or versions 1 and 2 of the accepting side.
func server(conn Conn, s *Secret, localInstance string, deadline time.Time, v2 *SessionOptions) (Opened, error) {
	if err := checkInstance(localInstance); err != nil {
		return Opened{}, err
	}
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	who := nameOf(conn)

	var buf [wire.MaxAuthBody]byte
	hb, err := readMsg(conn, buf[:], who)
	if err != nil {
		return Opened{}, err
	}
	hb = append([]byte(nil), hb...) // buf is reused for PROOF
	// Refusals of a version this side does not speak go out in version
	// 1's layout, which every initiator decodes.
	c := &wire.Challenge{Version: wire.AuthVersion}
	refuse := func(st wire.AuthStatus, err error) (Opened, error) {
		c.Status, c.Mode, c.Instance = st, wire.SessionNone, ""
		writeMsg(conn, wire.AppendChallenge(nil, c))
		return Opened{}, err
	}
	if len(hb) < 2 || hb[0] != wire.AuthMsgHello {
		_, err := wire.DecodeHello(hb)
		return Opened{}, err
	}
	version := hb[1]
	speaks := version == wire.AuthVersion && (v2 == nil || s == nil) ||
		(version == wire.AuthVersionSession || version == wire.AuthVersionIdentity) && v2 != nil
	if !speaks {
		if version == wire.AuthVersion && v2 != nil {
			return refuse(wire.AuthBadVersion, errs.New(errs.NotSupported, "auth",
				"peer %s speaks authentication version 1, which opens no session; this engine has a cluster secret and requires version %d", who, wire.AuthVersionSession).
				WithHint("upgrade the peer: with a secret every engine must protect its connections"))
		}
		want := wire.AuthVersion
		if v2 != nil {
			want = wire.AuthVersionIdentity
		}
		return refuse(wire.AuthBadVersion, errs.New(errs.NotSupported, "auth", "peer %s speaks authentication version %d, not %d", who, version, want))
	}
	h, err := wire.DecodeHello(hb)
	if err != nil {
		return Opened{}, err
	}
	c.Version = h.Version
	if s == nil {
		c.Status, c.Instance = wire.AuthNoAuth, localInstance
		if err := writeMsg(conn, wire.AppendChallenge(nil, c)); err != nil {
			return Opened{}, ioErr(err, who, "send CHALLENGE")
		}
		return Opened{PeerInstance: h.Instance}, nil
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
		c.KeyIndex = 0
		return refuse(wire.AuthUnknownKey, errs.New(errs.Unauthenticated, "auth",
			"peer %s (instance %s) holds none of this engine's secrets (its key ids %s, ours %s); refused",
			who, printable(h.Instance), strings.Join(theirs, ", "), strings.Join(s.KeyIDs(), ", ")))
	}
	c.Status, c.Instance = wire.AuthProceed, localInstance
	if v2 != nil {
		c.Mode = wire.StrongerMode(h.Mode, v2.mode(s))
		if c.Version == wire.AuthVersionIdentity {
			c.Name, c.Addr = v2.Name, v2.Addr
			if c.Name == "" {
				c.Name = localInstance
			}
		}
	}
	rand.Read(c.Nonce[:])
	cb := wire.AppendChallenge(nil, c)
	if err := writeMsg(conn, cb); err != nil {
		return Opened{}, ioErr(err, who, "send CHALLENGE")
	}
	pb, err := readMsg(conn, buf[:], who)
	if err != nil {
		return Opened{}, err
	}
	proof, err := wire.DecodeProof(pb)
	if err != nil {
		return Opened{}, err
	}
	t := wire.AppendTranscript(nil, hb, cb)
	want := mac(k, labelInitiator, t)
	if !hmac.Equal(proof[:], want[:]) {
		writeMsg(conn, wire.AppendResult(nil, &wire.Result{Status: wire.AuthBadProof}))
		return Opened{}, errs.New(errs.Unauthenticated, "auth",
			"peer %s (instance %s) sent a wrong proof for key id %s (another secret under a copied key id, or a replayed exchange); refused",
			who, printable(h.Instance), hexID(k.id))
	}
	o := Opened{PeerInstance: h.Instance, PeerName: h.Name}
	if v2 != nil {
		// Keys first: a failure here must not follow an accepting RESULT.
		if o.Session, err = openSession(k, t, v2.Channel, c.Mode, session.Server); err != nil {
			return Opened{}, err
		}
	}
	if err := writeMsg(conn, wire.AppendResult(nil, &wire.Result{Status: wire.AuthProceed, MAC: mac(k, labelServer, t)})); err != nil {
		return Opened{}, ioErr(err, who, "send RESULT")
	}
	return o, nil
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
