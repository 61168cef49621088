package tcp_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/engine/transport/tcp"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

func secret(t *testing.T, text string) *peerauth.Secret {
	t.Helper()
	s, err := peerauth.ParseSecret(text)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const (
	secretA = "cluster-secret-A-0123456789abcdef"
	secretB = "cluster-secret-B-0123456789abcdef"
)

// authTarget is a tcp transport serving one registered buffer (filled with
// 0x11) with the given secret.
type authTarget struct {
	tr   *tcp.Transport
	buf  []byte
	desc *segment.Desc
}

func newAuthTarget(t *testing.T, s *peerauth.Secret) *authTarget {
	t.Helper()
	buf := alloc(t, 1<<20)
	for i := range buf {
		buf[i] = 0x11
	}
	h := newFakeHost(nil)
	h.secret, h.inst = s, "target-instance"
	r, _ := segment.NewRegion(mem.Addr(buf), 1<<20, "cpu", true)
	if _, _, err := h.reg.Add(r); err != nil {
		t.Fatal(err)
	}
	tr := tcp.New()
	if err := tr.Start(h); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	d := &segment.Desc{Name: "target", Instance: "target-instance", RPC: "127.0.0.1:1", Buffers: []segment.BufferDesc{r.Desc}}
	tr.Describe(d)
	return &authTarget{tr: tr, buf: buf, desc: d}
}

func (a *authTarget) untouched(t *testing.T) {
	t.Helper()
	if !bytes.Equal(a.buf, bytes.Repeat([]byte{0x11}, len(a.buf))) {
		t.Fatal("the target's memory changed")
	}
}

// initiate runs one WRITE and one READ from a transport holding s and returns
// local (filled with 0x22 first) and their outcomes.
func initiate(t *testing.T, s *peerauth.Secret, d *segment.Desc) (local []byte, werr, rerr error) {
	t.Helper()
	h := newFakeHost(nil)
	h.secret, h.inst = s, "initiator-instance"
	local = alloc(t, 4096)
	for i := range local {
		local[i] = 0x22
	}
	lr, _ := segment.NewRegion(mem.Addr(local), 4096, "cpu", false)
	h.reg.Add(lr)
	tr := tcp.New()
	if err := tr.Start(h); err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	buf := &d.Buffers[0]
	run := func(op transport.Opcode) error {
		done := make(chan error, 1)
		tr.Submit([]transport.Request{{Op: op, Local: mem.Addr(local), Remote: buf.Addr, Length: 4096, Peer: d, Buffer: buf,
			Key: buf.Key, Region: lr, Owner: transport.DoneFunc(func(err error) { done <- err })}})
		select {
		case err := <-done:
			return err
		case <-time.After(15 * time.Second):
			t.Fatal("no completion")
			return nil
		}
	}
	werr = run(transport.Write)
	rerr = run(transport.Read)
	return local, werr, rerr
}

// TestDataPathAuthentication: every data connection authenticates both ways
// before its first request. Without the secret, or with another one, nothing
// is read or written on either side, and the error says who refused.
func TestDataPathAuthentication(t *testing.T) {
	cases := []struct {
		name           string
		target, initer string
		ok             bool
		msg            string
	}{
		{"both without", "", "", true, ""},
		{"same secret", secretA, secretA, true, ""},
		{"rotation: target holds new and old", secretB + "\n" + secretA, secretA, true, ""},
		{"rotation: initiator holds new and old", secretA, secretB + "\n" + secretA, true, ""},
		{"initiator without", secretA, "", false, "requires the cluster secret"},
		{"other secret", secretA, secretB, false, "holds none"},
		{"target without", "", secretA, false, "does not authenticate"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ts, is *peerauth.Secret
			if c.target != "" {
				ts = secret(t, c.target)
			}
			if c.initer != "" {
				is = secret(t, c.initer)
			}
			tg := newAuthTarget(t, ts)
			local, werr, rerr := initiate(t, is, tg.desc)
			if c.ok {
				if werr != nil || rerr != nil {
					t.Fatalf("write %v, read %v", werr, rerr)
				}
				if tg.buf[0] != 0x22 || local[0] != 0x22 {
					t.Fatal("bytes did not move")
				}
				return
			}
			for _, err := range []error{werr, rerr} {
				if !errors.Is(err, errs.ErrUnauthenticated) {
					t.Fatalf("got %v, want Unauthenticated", err)
				}
				if !bytes.Contains([]byte(err.Error()), []byte(c.msg)) {
					t.Fatalf("message %q does not say %q", err, c.msg)
				}
			}
			tg.untouched(t)
			if !bytes.Equal(local, bytes.Repeat([]byte{0x22}, 4096)) {
				t.Fatal("the initiator's memory changed")
			}
		})
	}
}

// TestDataPathSkipsAuthentication: an attacker that knows a buffer's key (from
// an old descriptor, say) and sends requests without the exchange is closed
// before anything is read or written.
func TestDataPathSkipsAuthentication(t *testing.T) {
	tg := newAuthTarget(t, secret(t, secretA))
	buf := tg.desc.Buffers[0]
	nc, err := net.Dial("tcp", tg.desc.Endpoints["tcp"])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	msg := []byte(wire.DataPreface)
	msg = wire.AppendDataRequest(msg, wire.DataRequest{Kind: wire.DataWrite, ID: 1, Addr: buf.Addr, Length: 8, Key: buf.Key})
	msg = append(msg, "ATTACKER"...)
	msg = wire.AppendDataRequest(msg, wire.DataRequest{Kind: wire.DataRead, ID: 2, Addr: buf.Addr, Length: 4096, Key: buf.Key})
	nc.Write(msg)
	got, _ := io.ReadAll(nc)
	if bytes.Contains(got, bytes.Repeat([]byte{0x11}, 64)) {
		t.Fatal("the attacker read the target's memory")
	}
	tg.untouched(t)
}

// TestRewrittenDescriptorGetsNoData: a descriptor rewritten to point the data
// endpoint at a party without the secret: the initiator refuses it after the
// exchange and sends it no request and no payload.
func TestRewrittenDescriptorGetsNoData(t *testing.T) {
	var after atomic.Int64
	ep := fakeServer(t, func(nc net.Conn) {
		if !fakeHandshake(nc) { // a party without the secret: "no authentication here"
			return
		}
		n, _ := io.Copy(io.Discard, nc)
		after.Add(n)
	})
	d := &segment.Desc{Name: "victim", Instance: "target-instance", Endpoints: map[string]string{"tcp": ep},
		Buffers: []segment.BufferDesc{{Addr: 1 << 40, Length: 1 << 20, Key: 99}}}
	_, werr, rerr := initiate(t, secret(t, secretA), d)
	if !errors.Is(werr, errs.ErrUnauthenticated) || !errors.Is(rerr, errs.ErrUnauthenticated) {
		t.Fatalf("write %v, read %v", werr, rerr)
	}
	time.Sleep(50 * time.Millisecond)
	if n := after.Load(); n != 0 {
		t.Fatalf("the impostor received %d bytes after the exchange", n)
	}
}
