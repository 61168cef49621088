package peerauth_test

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/session"
	"github.com/tecache/te/internal/wire"
)

type opened struct {
	o   peerauth.Opened
	err error
}

var ctrlOpt = peerauth.SessionOptions{Channel: session.Control}

// runSession runs ClientSession and ServerSession against each other over
// TCP on 127.0.0.1 and returns both ends' connections with the outcomes.
func runSession(t *testing.T, cs, ss *peerauth.Secret, copt, sopt peerauth.SessionOptions) (cli, srv opened, cc, sc net.Conn) {
	t.Helper()
	cc, sc = pair(t)
	dl := time.Now().Add(5 * time.Second)
	done := make(chan opened, 1)
	go func() {
		o, err := peerauth.ServerSession(sc, ss, "server-instance", dl, sopt)
		done <- opened{o, err}
	}()
	o, err := peerauth.ClientSession(cc, cs, "client-instance", dl, copt)
	return opened{o, err}, <-done, cc, sc
}

// frame sends a header record from one end and reads it at the other.
func frame(t *testing.T, s *session.Sealer, w io.Writer, o *session.Opener, r io.Reader, hdr string) {
	t.Helper()
	rec, err := s.Seal(nil, []byte(hdr))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	got, err := o.ReadRecord(r, make([]byte, len(hdr)+session.TagSize), len(hdr))
	if err != nil || string(got) != hdr {
		t.Fatalf("frame %q: got %q, %v", hdr, got, err)
	}
}

// TestSessionOpens: with one secret both ends get sessions that fit each
// other, both ways; either side asking for encryption gets it; payload
// integrity is the default, and headers only needs both sides to ask.
func TestSessionOpens(t *testing.T) {
	s := mustSecret(t, secretA)
	for _, c := range []struct {
		cliEnc, srvEnc bool
		cliHdr, srvHdr bool
		want           session.Mode
	}{
		{false, false, false, false, session.Integrity},
		{true, false, false, false, session.Encryption},
		{false, true, false, false, session.Encryption},
		{true, true, false, false, session.Encryption},
		{false, false, true, false, session.Integrity},
		{false, false, false, true, session.Integrity},
		{false, false, true, true, session.Headers},
		{true, false, true, true, session.Encryption},
		{false, true, true, true, session.Encryption},
	} {
		cli, srv, cc, sc := runSession(t, s, s,
			peerauth.SessionOptions{Channel: session.Data, Encrypt: c.cliEnc, HeadersOnly: c.cliHdr},
			peerauth.SessionOptions{Channel: session.Data, Encrypt: c.srvEnc, HeadersOnly: c.srvHdr})
		if cli.err != nil || srv.err != nil {
			t.Fatal(cli.err, srv.err)
		}
		if cli.o.PeerInstance != "server-instance" || srv.o.PeerInstance != "client-instance" {
			t.Fatal(cli.o.PeerInstance, srv.o.PeerInstance)
		}
		if cli.o.Session.Mode != c.want || srv.o.Session.Mode != c.want {
			t.Fatalf("encrypt %v/%v headers %v/%v: modes %v %v, want %v", c.cliEnc, c.srvEnc, c.cliHdr, c.srvHdr, cli.o.Session.Mode, srv.o.Session.Mode, c.want)
		}
		frame(t, cli.o.Session.Send, cc, srv.o.Session.Recv, sc, "READ addr len key")
		frame(t, srv.o.Session.Send, sc, cli.o.Session.Recv, cc, "COMPLETION id")
		frame(t, cli.o.Session.Send, cc, srv.o.Session.Recv, sc, "WRITE addr len key")
	}
}

// TestSessionRotation: the session is keyed with the secret both hold.
func TestSessionRotation(t *testing.T) {
	cli, srv, cc, sc := runSession(t, mustSecret(t, secretB+"\n"+secretA), mustSecret(t, secretA), ctrlOpt, ctrlOpt)
	if cli.err != nil || srv.err != nil {
		t.Fatal(cli.err, srv.err)
	}
	frame(t, cli.o.Session.Send, cc, srv.o.Session.Recv, sc, "hello")
}

// TestSessionWithoutSecrets: no secret on either side opens no session and
// still exchanges instances; a version 1 initiator without a secret is
// served too.
func TestSessionWithoutSecrets(t *testing.T) {
	cli, srv, _, _ := runSession(t, nil, nil, ctrlOpt, ctrlOpt)
	if cli.err != nil || srv.err != nil || cli.o.Session != nil || srv.o.Session != nil ||
		cli.o.PeerInstance != "server-instance" || srv.o.PeerInstance != "client-instance" {
		t.Fatalf("%+v %+v", cli, srv)
	}
	c, s := pair(t)
	done := make(chan opened, 1)
	go func() {
		o, err := peerauth.ServerSession(s, nil, "server-instance", time.Now().Add(5*time.Second), ctrlOpt)
		done <- opened{o, err}
	}()
	p, err := peerauth.Client(c, nil, "old-client", time.Now().Add(5*time.Second))
	if o := <-done; err != nil || p != "server-instance" || o.err != nil || o.o.PeerInstance != "old-client" || o.o.Session != nil {
		t.Fatalf("version 1 without secrets: %v %v %+v", p, err, o)
	}
}

// TestSessionRefusals: the refusals of version 1 hold in version 2, and a
// side with a secret refuses version 1 both ways (no downgrade to a
// connection without a session).
func TestSessionRefusals(t *testing.T) {
	a, b := mustSecret(t, secretA), mustSecret(t, secretB)
	cli, srv, _, _ := runSession(t, a, b, ctrlOpt, ctrlOpt)
	wantErr(t, "initiator, other secret", outcome{err: cli.err}, errs.Unauthenticated, "none of this engine's secrets")
	wantErr(t, "server, other secret", outcome{err: srv.err}, errs.Unauthenticated)
	cli, srv, _, _ = runSession(t, nil, a, ctrlOpt, ctrlOpt)
	wantErr(t, "secretless initiator", outcome{err: cli.err}, errs.Unauthenticated, "requires the cluster secret")
	cli, srv, _, _ = runSession(t, a, nil, ctrlOpt, ctrlOpt)
	wantErr(t, "secretless server", outcome{err: cli.err}, errs.Unauthenticated, "does not authenticate")

	// A version 1 initiator with the secret, at a server with it.
	c, s := pair(t)
	done := make(chan opened, 1)
	go func() {
		o, err := peerauth.ServerSession(s, a, "server-instance", time.Now().Add(5*time.Second), ctrlOpt)
		done <- opened{o, err}
	}()
	_, err := peerauth.Client(c, a, "old-client", time.Now().Add(5*time.Second))
	wantErr(t, "version 1 initiator", outcome{err: err}, errs.NotSupported, "version 1")
	wantErr(t, "server given version 1", outcome{err: (<-done).err}, errs.NotSupported, "opens no session")

	// A version 3 initiator at a version 1 server.
	c, s = pair(t)
	go func() {
		p, err := peerauth.Server(s, a, "old-server", time.Now().Add(5*time.Second))
		done <- opened{peerauth.Opened{PeerInstance: p}, err}
	}()
	_, err = peerauth.ClientSession(c, a, "client", time.Now().Add(5*time.Second), ctrlOpt)
	wantErr(t, "initiator at a version 1 server", outcome{err: err}, errs.NotSupported, "version 3")
	wantErr(t, "version 1 server", outcome{err: (<-done).err}, errs.NotSupported)

	// Settings.
	if _, err := peerauth.ClientSession(c, nil, "c", time.Time{}, peerauth.SessionOptions{Channel: session.Data, Encrypt: true}); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("encryption without a secret: %v", err)
	}
	if _, err := peerauth.ServerSession(s, a, "s", time.Time{}, peerauth.SessionOptions{Channel: "rpc"}); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("unknown channel: %v", err)
	}
}

// relay is a party without the secret in the middle of a connection (one
// that rewrote the target's endpoint in the metadata store): it forwards
// the four exchange messages between the honest initiator and the honest
// target, optionally editing them, and then holds both connections.
type relay struct {
	toCli, toSrv net.Conn // its end towards the initiator, towards the target
}

func newRelay(t *testing.T, edit func(msg int, body []byte)) (cli, srv opened, cc, sc net.Conn, r *relay) {
	t.Helper()
	a := mustSecret(t, secretA)
	cc, rc := pair(t) // initiator <-> relay
	rs, sc := pair(t) // relay <-> target
	r = &relay{toCli: rc, toSrv: rs}
	dl := time.Now().Add(5 * time.Second)
	srvDone := make(chan opened, 1)
	go func() {
		o, err := peerauth.ServerSession(sc, a, "target", dl, ctrlOpt)
		srvDone <- opened{o, err}
	}()
	relayed := make(chan struct{})
	go func() {
		defer close(relayed)
		rc.SetDeadline(dl)
		rs.SetDeadline(dl)
		for i, dir := range []struct{ from, to net.Conn }{{rc, rs}, {rs, rc}, {rc, rs}, {rs, rc}} {
			kind, body, err := wire.ReadFrame(dir.from, wire.MaxAuthBody)
			if err != nil {
				return
			}
			if edit != nil {
				edit(i, body)
			}
			dir.to.Write(wire.AppendFrame(nil, kind, body))
		}
	}()
	o, err := peerauth.ClientSession(cc, a, "initiator", dl, ctrlOpt)
	cli = opened{o, err}
	srv = <-srvDone
	<-relayed
	rc.SetDeadline(time.Time{})
	rs.SetDeadline(time.Time{})
	return cli, srv, cc, sc, r
}

// forward copies one record of n plaintext bytes from the initiator to the
// target through the relay, letting it edit the bytes.
func (r *relay) forward(t *testing.T, n int, edit func([]byte)) {
	t.Helper()
	b := make([]byte, n+session.TagSize)
	if _, err := io.ReadFull(r.toCli, b); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(b)
	}
	r.toSrv.Write(b)
}

// TestRelayCannotInjectOrAlter is the attack on the opening-only
// authentication: a relay forwards the exchange unchanged, so the target
// takes the relay's connection for the honest initiator's. With sessions
// the relay's own request, an altered request and a replayed one all fail
// at the target, while the initiator's own traffic through the relay works.
func TestRelayCannotInjectOrAlter(t *testing.T) {
	read := []byte("READ  id=1 addr=0x7f0000001000 len=64 key=0x1234")

	t.Run("honest traffic passes", func(t *testing.T) {
		cli, srv, cc, sc, r := newRelay(t, nil)
		if cli.err != nil || srv.err != nil {
			t.Fatal(cli.err, srv.err)
		}
		rec, _ := cli.o.Session.Send.Seal(nil, read)
		cc.Write(rec)
		r.forward(t, len(read), nil)
		got, err := srv.o.Session.Recv.ReadRecord(sc, make([]byte, 128), len(read))
		if err != nil || !bytes.Equal(got, read) {
			t.Fatal(got, err)
		}
	})
	t.Run("injected request", func(t *testing.T) {
		_, srv, _, sc, r := newRelay(t, nil)
		// The relay's own READ: it has no key, so it can only guess a tag.
		r.toSrv.Write(append(append([]byte(nil), read...), make([]byte, session.TagSize)...))
		_, err := srv.o.Session.Recv.ReadRecord(sc, make([]byte, 128), len(read))
		wantErr(t, "injected", outcome{err: err}, errs.Unauthenticated)
	})
	t.Run("altered request", func(t *testing.T) {
		cli, srv, cc, sc, r := newRelay(t, nil)
		rec, _ := cli.o.Session.Send.Seal(nil, read)
		cc.Write(rec)
		r.forward(t, len(read), func(b []byte) { b[bytes.Index(b, []byte("0x7f"))+3] = '0' }) // another address
		_, err := srv.o.Session.Recv.ReadRecord(sc, make([]byte, 128), len(read))
		wantErr(t, "altered", outcome{err: err}, errs.Unauthenticated)
	})
	t.Run("replayed request", func(t *testing.T) {
		cli, srv, cc, sc, r := newRelay(t, nil)
		rec, _ := cli.o.Session.Send.Seal(nil, read)
		cc.Write(rec)
		var copied []byte
		r.forward(t, len(read), func(b []byte) { copied = append([]byte(nil), b...) })
		r.toSrv.Write(copied)
		buf := make([]byte, 128)
		if _, err := srv.o.Session.Recv.ReadRecord(sc, buf, len(read)); err != nil {
			t.Fatal(err)
		}
		_, err := srv.o.Session.Recv.ReadRecord(sc, buf, len(read))
		wantErr(t, "replayed", outcome{err: err}, errs.Unauthenticated)
	})
	t.Run("downgraded mode", func(t *testing.T) {
		// The relay cannot strip encryption: the initiator refuses a
		// weaker mode than it asked for, and a HELLO rewritten anyway
		// breaks the transcript both proofs cover.
		for _, srvEncrypt := range []bool{false, true} {
			a := mustSecret(t, secretA)
			cc, rc := pair(t)
			rs, sc := pair(t)
			dl := time.Now().Add(5 * time.Second)
			srvDone := make(chan error, 1)
			go func() {
				_, err := peerauth.ServerSession(sc, a, "target", dl, peerauth.SessionOptions{Channel: session.Control, Encrypt: srvEncrypt})
				sc.Close()
				srvDone <- err
			}()
			go func() {
				_, body, err := wire.ReadFrame(rc, wire.MaxAuthBody)
				if err != nil {
					return
				}
				body[3] = wire.SessionHeaders // the HELLO asked for encryption
				rs.Write(wire.AppendFrame(nil, wire.KindAuth, body))
				go func() { io.Copy(rs, rc); rs.Close() }()
				io.Copy(rc, rs)
				rc.Close()
			}()
			_, err := peerauth.ClientSession(cc, a, "initiator", dl, peerauth.SessionOptions{Channel: session.Control, Encrypt: true})
			cc.Close()
			srvErr := <-srvDone
			if srvEncrypt {
				// Encryption chosen, so the initiator proves over its
				// own HELLO, which the target never saw.
				wantErr(t, "target given a rewritten HELLO", outcome{err: srvErr}, errs.Unauthenticated, "wrong proof")
				wantErr(t, "initiator", outcome{err: err}, errs.Unauthenticated, "refused this engine's proof")
			} else {
				wantErr(t, "initiator offered integrity", outcome{err: err}, errs.Protocol, "session mode 3")
				if srvErr == nil {
					t.Fatal("the target opened a session the initiator refused")
				}
			}
		}
	})
	t.Run("another channel", func(t *testing.T) {
		// A control connection's exchange relayed to a data listener: the
		// exchange succeeds (channels are not on the wire) but no frame
		// opens.
		a := mustSecret(t, secretA)
		cli, srv, cc, sc := runSession(t, a, a, peerauth.SessionOptions{Channel: session.Control}, peerauth.SessionOptions{Channel: session.Data})
		if cli.err != nil || srv.err != nil {
			t.Fatal(cli.err, srv.err)
		}
		rec, _ := cli.o.Session.Send.Seal(nil, read)
		cc.Write(rec)
		_, err := srv.o.Session.Recv.ReadRecord(sc, make([]byte, 128), len(read))
		wantErr(t, "crossed channel", outcome{err: err}, errs.Unauthenticated)
	})
}

// TestSessionProvesServerName: the server's segment name and RPC address
// reach the initiator inside the transcript both MACs cover (version 3);
// without a secret nothing is claimed. A relay that rewrites the name on
// the way fails the server's proof.
func TestSessionProvesServerName(t *testing.T) {
	s := mustSecret(t, secretA)
	cli, srv, _, _ := runSession(t, s, s, ctrlOpt, peerauth.SessionOptions{Channel: session.Control, Name: "decode-3", Addr: "10.1.2.3:7000"})
	if cli.err != nil || srv.err != nil {
		t.Fatal(cli.err, srv.err)
	}
	if cli.o.PeerName != "decode-3" || cli.o.PeerAddr != "10.1.2.3:7000" || cli.o.PeerInstance != "server-instance" {
		t.Fatalf("proven %q %q %q", cli.o.PeerName, cli.o.PeerAddr, cli.o.PeerInstance)
	}
	// A server given no name proves its instance as its name.
	cli, _, _, _ = runSession(t, s, s, ctrlOpt, ctrlOpt)
	if cli.err != nil || cli.o.PeerName != "server-instance" {
		t.Fatal(cli.o.PeerName, cli.err)
	}
	// No secret: nothing proven, nothing claimed.
	cli, _, _, _ = runSession(t, nil, nil, ctrlOpt, peerauth.SessionOptions{Channel: session.Control, Name: "decode-3"})
	if cli.err != nil || cli.o.PeerName != "" || cli.o.Session != nil {
		t.Fatal(cli.o, cli.err)
	}

	// A relay that renames the server in its CHALLENGE.
	c, r := pair(t)
	r2, sv := pair(t)
	done := make(chan error, 1)
	go func() {
		_, err := peerauth.ServerSession(sv, s, "server-instance", time.Now().Add(5*time.Second), peerauth.SessionOptions{Channel: session.Control, Name: "segment-C"})
		done <- err
	}()
	go func() {
		// HELLO through unchanged, CHALLENGE renamed, the rest through.
		fwd(r, r2, nil)
		fwd(r2, r, func(b []byte) []byte {
			ch, err := wire.DecodeChallenge(b)
			if err != nil {
				return b
			}
			ch.Name = "segment-B"
			return wire.AppendChallenge(nil, ch)
		})
		fwd(r, r2, nil)
		fwd(r2, r, nil)
	}()
	_, err := peerauth.ClientSession(c, s, "client-instance", time.Now().Add(5*time.Second), ctrlOpt)
	wantErr(t, "renamed server", outcome{err: err}, errs.Unauthenticated)
	<-done
}

// TestSessionProvesInitiatorName: the initiator's segment name reaches the
// server inside the HELLO both MACs cover (version 3), so the server knows
// which segment calls; without a secret nothing is proven. A relay that
// renames the initiator on the way fails the initiator's proof.
func TestSessionProvesInitiatorName(t *testing.T) {
	s := mustSecret(t, secretA)
	cli, srv, _, _ := runSession(t, s, s, peerauth.SessionOptions{Channel: session.Control, Name: "prefill-7"}, ctrlOpt)
	if cli.err != nil || srv.err != nil {
		t.Fatal(cli.err, srv.err)
	}
	if srv.o.PeerName != "prefill-7" || srv.o.PeerInstance != "client-instance" {
		t.Fatalf("server saw %q %q", srv.o.PeerName, srv.o.PeerInstance)
	}
	// An initiator without a segment proves none.
	_, srv, _, _ = runSession(t, s, s, ctrlOpt, ctrlOpt)
	if srv.err != nil || srv.o.PeerName != "" {
		t.Fatal(srv.o.PeerName, srv.err)
	}

	// A relay that renames the initiator in its HELLO.
	c, r := pair(t)
	r2, sv := pair(t)
	done := make(chan error, 1)
	go func() {
		_, err := peerauth.ServerSession(sv, s, "server-instance", time.Now().Add(5*time.Second), ctrlOpt)
		done <- err
	}()
	go func() {
		fwd(r, r2, func(b []byte) []byte {
			h, err := wire.DecodeHello(b)
			if err != nil {
				return b
			}
			h.Name = "prefill-8"
			return wire.AppendHello(nil, h)
		})
		fwd(r2, r, nil)
		fwd(r, r2, nil)
		fwd(r2, r, nil)
	}()
	_, err := peerauth.ClientSession(c, s, "client-instance", time.Now().Add(5*time.Second), peerauth.SessionOptions{Channel: session.Control, Name: "prefill-7"})
	if err == nil {
		t.Fatal("a renamed initiator opened a session")
	}
	if err := <-done; errs.CodeOf(err) != errs.Unauthenticated {
		t.Fatalf("server: %v, want Unauthenticated", err)
	}
}

// fwd relays one authentication frame from one side to the other, its body
// rewritten by edit when edit is not nil.
func fwd(from io.Reader, to io.Writer, edit func([]byte) []byte) {
	var h [wire.FrameHeaderSize]byte
	if _, err := io.ReadFull(from, h[:]); err != nil {
		return
	}
	_, n, _ := wire.ParseFrameHeader(h[:])
	body := make([]byte, n)
	io.ReadFull(from, body)
	if edit != nil {
		body = edit(body)
	}
	to.Write(wire.AppendFrame(nil, wire.KindAuth, body))
}
