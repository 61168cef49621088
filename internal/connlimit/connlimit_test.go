package connlimit_test

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/internal/connlimit"
	"github.com/tecache/te/internal/errs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// server accepts on 127.0.0.1 through lim: admitted connections are held
// until the client closes them, refused ones are closed at once.
type server struct {
	ln   net.Listener
	lim  *connlimit.Limiter
	wg   sync.WaitGroup
	held chan struct{} // one value per admitted connection
}

func newServer(t *testing.T, lim *connlimit.Limiter) *server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ln: ln, lim: lim, held: make(chan struct{}, 1024)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			release, err := lim.Admit(c.RemoteAddr())
			if err != nil {
				c.Close()
				continue
			}
			s.held <- struct{}{}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer release()
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); s.wg.Wait() })
	return s
}

func dialFrom(t *testing.T, src, dst string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", dst)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// closedByServer reports whether the server closed c (EOF), waiting up to 5s.
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err == io.EOF || (err != nil && !isTimeout(err))
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for dl := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(dl) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCapsPerHostAndTotal(t *testing.T) {
	lim := connlimit.New(5, 3)
	s := newServer(t, lim)
	addr := s.ln.Addr().String()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// Three from 127.0.0.2 are admitted; the fourth is refused per host.
	for i := 0; i < 3; i++ {
		conns = append(conns, dialFrom(t, "127.0.0.2", addr))
		<-s.held
	}
	extra := dialFrom(t, "127.0.0.2", addr)
	if !closedByServer(extra) {
		t.Fatal("a fourth connection from one address was kept")
	}
	extra.Close()
	// Another address still gets in, up to the total of 5.
	for i := 0; i < 2; i++ {
		conns = append(conns, dialFrom(t, "127.0.0.3", addr))
		<-s.held
	}
	extra = dialFrom(t, "127.0.0.4", addr)
	if !closedByServer(extra) {
		t.Fatal("a sixth connection was kept")
	}
	extra.Close()
	st := lim.Stats()
	if st.Open != 5 || st.Peak != 5 || st.Accepted != 5 || st.RefusedPerHost != 1 || st.RefusedTotal != 1 {
		t.Fatalf("stats %+v", st)
	}
	// Closing frees the slots: the refused address gets in now.
	conns[0].Close()
	waitFor(t, "a slot to be released", func() bool { return lim.Stats().Open == 4 })
	conns = append(conns, dialFrom(t, "127.0.0.4", addr))
	<-s.held
	if st := lim.Stats(); st.Open != 5 || st.Accepted != 6 {
		t.Fatalf("stats after release %+v", st)
	}
}

func TestAdmitErrorsAndRelease(t *testing.T) {
	lim := connlimit.New(0, 1)
	a := &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 1}
	mapped := &net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.1"), Port: 2}
	rel, err := lim.Admit(a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Admit(mapped); errs.CodeOf(err) != errs.ResourceExhausted {
		t.Fatalf("an IPv4-mapped address escaped the per-host bound: %v", err)
	}
	rel()
	rel() // idempotent: must not free a slot it does not hold
	rel2, err := lim.Admit(mapped)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Admit(a); err == nil {
		t.Fatal("a double release freed a second slot")
	}
	rel2()
	// Non-IP addresses count against the total only.
	lim = connlimit.New(1, 1)
	p1, _ := net.Pipe()
	defer p1.Close()
	if _, err := lim.Admit(p1.RemoteAddr()); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Admit(p1.RemoteAddr()); errs.CodeOf(err) != errs.ResourceExhausted {
		t.Fatal("total bound not applied to a pipe")
	}
}

// TestIPv6PerPrefix: IPv6 addresses of one /64 share one per-address
// budget (one host given a /64 cannot open unlimited connections by
// changing its low bits); another /64 has its own.
func TestIPv6PerPrefix(t *testing.T) {
	l := connlimit.New(100, 2)
	at := func(s string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(s), Port: 1} }
	for _, a := range []string{"2001:db8:1:2::1", "2001:db8:1:2:ffff::9"} {
		if _, err := l.Admit(at(a)); err != nil {
			t.Fatal(a, err)
		}
	}
	_, err := l.Admit(at("2001:db8:1:2:abcd::1"))
	if errs.CodeOf(err) != errs.ResourceExhausted || !strings.Contains(err.Error(), "2001:db8:1:2::/64") {
		t.Fatalf("third address of one /64: %v", err)
	}
	if _, err := l.Admit(at("2001:db8:1:3::1")); err != nil {
		t.Fatalf("another /64: %v", err)
	}
	if _, err := l.Admit(at("::ffff:10.0.0.1")); err != nil {
		t.Fatal(err)
	}
}
