package ctrl

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/internal/connlimit"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLimits() Limits {
	return Limits{Policy: connlimit.Policy{MaxConns: 64, MaxConnsPerHost: 64, IdleTimeout: time.Minute,
		HandshakeTimeout: 5 * time.Second, ProgressTimeout: 5 * time.Second, PeerIdleTimeout: time.Minute},
		MaxCalls: 64, MaxCallsPerConn: 16, MaxFrame: 1 << 20}
}

// newPlane starts a plane on a loopback listener, closed at the test's end.
func newPlane(t *testing.T, adjust func(*Options)) *Plane {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Instance: t.Name(), Limits: testLimits(), DialTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if adjust != nil {
		adjust(&o)
	}
	c := New(ln, o)
	c.Start()
	t.Cleanup(c.Close)
	return c
}

// TestCallsPipelined: concurrent calls on one pooled connection each get
// their own reply, and an error reply comes back as the handler's error.
func TestCallsPipelined(t *testing.T) {
	srv := newPlane(t, nil)
	srv.Handle(wire.KindProbe, func(_ context.Context, body []byte) ([]byte, error) {
		if string(body) == "fail" {
			return nil, errs.New(errs.NotFound, "test", "asked to fail")
		}
		return append([]byte("re:"), body...), nil
	})
	cli := newPlane(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 100)
	for i := 0; i < 100; i++ {
		go func() {
			msg := []byte{byte('a' + i%26), byte('0' + i%10)}
			got, err := cli.Call(ctx, srv.Addr().String(), wire.KindProbe, msg)
			if err == nil && string(got) != "re:"+string(msg) {
				err = errors.New("reply " + string(got) + " to " + string(msg))
			}
			errc <- err
		}()
	}
	for i := 0; i < 100; i++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Call(ctx, srv.Addr().String(), wire.KindProbe, []byte("fail")); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("error reply: %v", err)
	}
	if st := srv.Stats(); st.ConnsAccepted != 1 {
		t.Fatalf("%d connections accepted, want 1 (pooled)", st.ConnsAccepted)
	}
}

// TestCloseAnswersHandledCalls reproduces, deterministically, the race
// behind "tasks completed but the batch's notify was not delivered:
// connection ... lost: EOF": the receiver of a notify has queued it (the
// handler ran) and sees it, and closes its engine before the reply went
// out. Close must still answer the call: the notification was delivered.
func TestCloseAnswersHandledCalls(t *testing.T) {
	srv := newPlane(t, nil)
	handled, release := make(chan struct{}), make(chan struct{})
	srv.Handle(wire.KindNotify, func(context.Context, []byte) ([]byte, error) {
		close(handled) // queued: the receiver may see it now...
		<-release      // ...and close before this call replies
		return nil, nil
	})
	draining := make(chan struct{})
	testHookDraining = func() { close(draining) }
	defer func() { testHookDraining = nil }()
	cli := newPlane(t, nil)
	res := make(chan error, 1)
	go func() {
		_, err := cli.Call(context.Background(), srv.Addr().String(), wire.KindNotify, wire.AppendNotify(nil, []byte("n"), []byte("m")))
		res <- err
	}()
	<-handled
	closed := make(chan struct{})
	go func() { srv.Close(); close(closed) }()
	<-draining // Close reads no new calls now and has not waited yet
	close(release)
	if err := <-res; err != nil {
		t.Fatalf("a call handled before its receiver closed: %v", err)
	}
	<-closed
	// After Close, nothing is served.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Call(ctx, srv.Addr().String(), wire.KindNotify, nil); err == nil {
		t.Fatal("a closed plane answered")
	}
}

// TestCloseBoundsDrain: a call whose handler does not end (it ignores its
// context) does not hold Close beyond closeGrace; the caller gets an error.
func TestCloseBoundsDrain(t *testing.T) {
	srv := newPlane(t, nil)
	entered, stuck := make(chan struct{}), make(chan struct{})
	defer close(stuck)
	srv.Handle(wire.KindProbe, func(context.Context, []byte) ([]byte, error) {
		close(entered)
		<-stuck
		return nil, nil
	})
	cli := newPlane(t, nil)
	res := make(chan error, 1)
	go func() {
		_, err := cli.Call(context.Background(), srv.Addr().String(), wire.KindProbe, nil)
		res <- err
	}()
	<-entered
	t0 := time.Now()
	done := make(chan struct{})
	go func() { srv.Close(); close(done) }()
	if err := <-res; errs.CodeOf(err) != errs.PeerUnreachable {
		t.Fatalf("a call cut by Close: %v", err)
	}
	if d := time.Since(t0); d > closeGrace+3*time.Second {
		t.Fatalf("the call ended %v after Close began", d)
	}
	stuck <- struct{}{} // let the handler return, so Close can finish
	<-done
}

// TestCallCanceled: a call whose context ends returns Timeout; its late
// reply is dropped and the connection serves the next call.
func TestCallCanceled(t *testing.T) {
	srv := newPlane(t, nil)
	var slow atomic.Bool
	slow.Store(true)
	gate := make(chan struct{})
	srv.Handle(wire.KindProbe, func(_ context.Context, body []byte) ([]byte, error) {
		if slow.Load() {
			<-gate
		}
		return body, nil
	})
	cli := newPlane(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := cli.Call(ctx, srv.Addr().String(), wire.KindProbe, []byte("late"))
	cancel()
	if errs.CodeOf(err) != errs.Timeout {
		t.Fatalf("call past its deadline: %v", err)
	}
	slow.Store(false)
	close(gate) // the late reply goes out now
	got, err := cli.Call(context.Background(), srv.Addr().String(), wire.KindProbe, []byte("next"))
	if err != nil || string(got) != "next" {
		t.Fatalf("next call: %q %v", got, err)
	}
	if st := srv.Stats(); st.ConnsAccepted != 1 {
		t.Fatalf("%d connections: a timed-out call must not cost the connection", st.ConnsAccepted)
	}
}

// TestCallRetriesDeadPooledConnection: the peer restarted under the same
// address while a connection to its old self sat in the pool; the next call
// meets the dead connection and goes through on a new one.
func TestCallRetriesDeadPooledConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	echo := func(_ context.Context, b []byte) ([]byte, error) { return b, nil }
	o := Options{Instance: "srv", Limits: testLimits(), DialTimeout: time.Second}
	srv := New(ln, o)
	srv.Handle(wire.KindProbe, echo)
	srv.Start()
	cli := newPlane(t, nil)
	if _, err := cli.Call(context.Background(), addr, wire.KindProbe, []byte("1")); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("address taken again meanwhile: %v", err)
	}
	srv2 := New(ln2, o)
	srv2.Handle(wire.KindProbe, echo)
	srv2.Start()
	defer srv2.Close()
	got, err := cli.Call(context.Background(), addr, wire.KindProbe, []byte("2"))
	if err != nil || string(got) != "2" {
		t.Fatalf("call after the peer restarted: %q %v", got, err)
	}
}

// TestAuthFailureNotRetried: a peer without the secret fails the opening;
// the call fails with Unauthenticated at once, counted.
func TestAuthFailureNotRetried(t *testing.T) {
	a, err := peerauth.ParseSecret("0123456789abcdef0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	b, err := peerauth.ParseSecret("fedcba9876543210fedcba9876543210")
	if err != nil {
		t.Fatal(err)
	}
	srv := newPlane(t, func(o *Options) { o.Secret = a })
	srv.Handle(wire.KindProbe, func(context.Context, []byte) ([]byte, error) { return nil, nil })
	cli := newPlane(t, func(o *Options) { o.Secret = b })
	_, err = cli.Call(context.Background(), srv.Addr().String(), wire.KindProbe, nil)
	if errs.CodeOf(err) != errs.Unauthenticated {
		t.Fatalf("call to a peer with another secret: %v", err)
	}
	if n := cli.Stats().AuthFailedOutbound; n != 1 {
		t.Fatalf("auth_failed_outbound %d, want 1", n)
	}
}

// TestServedCallNotResent: a call that is not first on its connection and
// whose reply is lost after the peer served it (a dropped reply) is not
// sent again: a notification is queued once and the sender learns it may
// not have arrived, instead of a second copy and a success. A Probe, which
// serving twice leaves as once, is still retried.
func TestServedCallNotResent(t *testing.T) {
	srv := newPlane(t, nil)
	var notifies, probes atomic.Int32
	srv.Handle(wire.KindNotify, func(context.Context, []byte) ([]byte, error) { notifies.Add(1); return nil, nil })
	srv.Handle(wire.KindProbe, func(context.Context, []byte) ([]byte, error) { probes.Add(1); return nil, nil })
	cli := newPlane(t, nil)
	addr := srv.Addr().String()
	ctx := context.Background()
	if _, err := cli.Call(ctx, addr, wire.KindProbe, nil); err != nil { // first on the connection
		t.Fatal(err)
	}
	var drop atomic.Int32
	drop.Store(1)
	hook := func(kind uint8) bool { return drop.CompareAndSwap(1, 0) }
	testHookDropReply.Store(&hook)
	defer testHookDropReply.Store(nil)
	_, err := cli.Call(ctx, addr, wire.KindNotify, wire.AppendNotify(nil, []byte("kv"), []byte("ready")))
	if errs.CodeOf(err) != errs.PeerUnreachable {
		t.Fatalf("notify whose reply was lost: %v", err)
	}
	if n := notifies.Load(); n != 1 {
		t.Fatalf("notification served %d times", n)
	}
	if _, err := cli.Call(ctx, addr, wire.KindProbe, nil); err != nil { // a fresh connection
		t.Fatal(err)
	}
	drop.Store(1)
	if _, err := cli.Call(ctx, addr, wire.KindProbe, nil); err != nil {
		t.Fatalf("probe whose reply was lost is retried: %v", err)
	}
	if n := probes.Load(); n != 4 {
		t.Fatalf("probes served %d times, want 4 (one retried)", n)
	}
}

// TestNotifyOnceResent: a NotifyOnce whose reply is lost after the peer
// served it goes again, the same body (id included), on a new connection,
// even as the first call of a fresh connection: the receiver dedups by the
// id (the engine's handler), and the sender sees the second reply.
func TestNotifyOnceResent(t *testing.T) {
	srv := newPlane(t, nil)
	var mu sync.Mutex
	var bodies [][]byte
	srv.Handle(wire.KindNotifyOnce, func(_ context.Context, b []byte) ([]byte, error) {
		mu.Lock()
		bodies = append(bodies, append([]byte(nil), b...))
		mu.Unlock()
		return nil, nil
	})
	cli := newPlane(t, nil)
	var drop atomic.Int32
	drop.Store(1)
	hook := func(kind uint8) bool { return kind == wire.KindNotifyOnce && drop.CompareAndSwap(1, 0) }
	testHookDropReply.Store(&hook)
	defer testHookDropReply.Store(nil)
	body := wire.AppendNotifyOnce(nil, 0x1234_5678_9abc_def0, []byte("kv"), []byte("ready"))
	// The first call on a fresh connection.
	if _, err := cli.Call(context.Background(), srv.Addr().String(), wire.KindNotifyOnce, body); err != nil {
		t.Fatalf("NotifyOnce whose first reply was lost: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 || string(bodies[0]) != string(body) || string(bodies[1]) != string(body) {
		t.Fatalf("served %d times (want 2, the same body): %q", len(bodies), bodies)
	}
	if drop.Load() != 0 {
		t.Fatal("no reply was dropped")
	}
}
