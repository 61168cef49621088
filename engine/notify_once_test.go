package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/internal/ctrl"
	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/internal/connlimit"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/wire"
)

// Notifications carry an id the receiver dedups (NotifyOnce,
// internal/wire/spec.md), so a notification whose reply was lost is sent
// again and still queued once: the sender's one success is one delivery.

// cutRelay forwards control connections to a target. Armed, it cuts the
// connection at the first bytes the target sends back, forwarding none of
// them: the reply of a call the target served is lost with its connection.
// stall freezes the connections open at the time instead (nothing more is
// forwarded either way and the sockets stay open: a path that silently
// stopped carrying them), while connections made later are forwarded.
type cutRelay struct {
	ln    net.Listener
	to    string
	armed atomic.Bool
	cuts  atomic.Int32
	mu    sync.Mutex
	conns []net.Conn
	gates []chan struct{} // closed: that connection is stalled
	done  chan struct{}   // closed at cleanup: stalled pumps return
	wg    sync.WaitGroup
}

func newCutRelay(t *testing.T, to string) *cutRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &cutRelay{ln: ln, to: to, done: make(chan struct{})}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(func() {
		ln.Close()
		close(r.done)
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *cutRelay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.to)
		if err != nil {
			c.Close()
			continue
		}
		gate := make(chan struct{})
		r.mu.Lock()
		r.conns = append(r.conns, c, s)
		r.gates = append(r.gates, gate)
		r.mu.Unlock()
		// pump forwards src to dst until either ends; cut marks the
		// target's side, which an armed relay cuts at its first bytes.
		pump := func(dst, src net.Conn, cut bool) {
			defer r.wg.Done()
			defer dst.Close()
			defer src.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := src.Read(buf)
				select {
				case <-gate:
					<-r.done // stalled: drop the bytes, forward nothing more
					return
				default:
				}
				if n > 0 {
					if cut && r.armed.CompareAndSwap(true, false) {
						r.cuts.Add(1)
						return
					}
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}
		r.wg.Add(2)
		go pump(s, c, false)
		go pump(c, s, true)
	}
}

// stall freezes every connection open now.
func (r *cutRelay) stall() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range r.gates {
		select {
		case <-g:
		default:
			close(g)
		}
	}
}

// TestNotifyLostReplyDeliveredOnce: the target queues a notification and
// its reply is lost with the connection; the sender sends it again (same
// id) on a new connection, the target answers ok without queueing it
// again: the sender sees one success, the target's queue holds one copy.
// With a secret the dedup key is the instance the session proved, behind
// the relay as without it.
func TestNotifyLostReplyDeliveredOnce(t *testing.T) {
	for _, secret := range []bool{false, true} {
		t.Run(fmt.Sprint("secret=", secret), func(t *testing.T) {
			var tg, a *engine.Engine
			var seg string
			if !secret {
				tg = newEngine(t)
				r := newCutRelay(t, tg.RPCAddr())
				seg = r.addr() // peer-to-peer: the segment is the address dialled
				a = newEngine(t)
				lostReplyOnce(t, a, tg, seg, r)
				return
			}
			store := relayStore(t)
			tg = newEngine(t, func(c *engine.Config) {
				c.Metadata, c.AuthSecret, c.SegmentName = store+"?refresh=1h", relaySecret, "target"
			})
			r := newCutRelay(t, tg.RPCAddr())
			// The target's rpc_meta points at the relay (signed: the
			// relay stands for a path that drops a reply, not a forger).
			sec, err := peerauth.ParseSecret(relaySecret)
			if err != nil {
				t.Fatal(err)
			}
			host, port, _ := net.SplitHostPort(r.addr())
			var pn int
			fmt.Sscan(port, &pn)
			b, _ := json.Marshal(meta.RPCMeta{IPOrHostName: host, RPCPort: pn})
			if b, err = sec.SignRecord(meta.KeyRPC("target"), b); err != nil {
				t.Fatal(err)
			}
			storePut(t, store, meta.KeyRPC("target"), b)
			a = newEngine(t, func(c *engine.Config) { c.Metadata, c.AuthSecret = store+"?refresh=1h", relaySecret })
			lostReplyOnce(t, a, tg, "target", r)
		})
	}
}

func (r *cutRelay) addr() string { return r.ln.Addr().String() }

func lostReplyOnce(t *testing.T, a, tg *engine.Engine, seg string, r *cutRelay) {
	t.Helper()
	// A first notification opens the connection through the relay.
	if err := a.SendNotify(seg, "warm", "up"); err != nil {
		t.Fatal(err)
	}
	r.armed.Store(true)
	if err := a.SendNotify(seg, "kv", "ready"); err != nil {
		t.Fatalf("the notification whose reply was lost: %v", err)
	}
	if n := r.cuts.Load(); n != 1 {
		t.Fatalf("the relay cut %d replies, want 1", n)
	}
	got := tg.Notifies()
	for i := range got {
		if got[i].FromInstance != "" && got[i].FromInstance != a.Instance() {
			t.Fatalf("notification from %q, sent by %q", got[i].FromInstance, a.Instance())
		}
		got[i].From, got[i].FromInstance = "", ""
	}
	want := []engine.Notification{{Name: "warm", Msg: "up"}, {Name: "kv", Msg: "ready"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("queued %v, want %v", got, want)
	}
	if st := tg.Stats(); st.NotifiesReceived != 2 || st.NotifiesDuplicate != 1 {
		t.Fatalf("received %d, duplicates %d; want 2 and 1", st.NotifiesReceived, st.NotifiesDuplicate)
	}
	if n := a.Stats().NotifiesSent; n != 2 {
		t.Fatalf("sent %d, want 2", n)
	}
	// The duplicate's bytes went back to the budget.
	if n := tg.Stats().Control.NotifyBytes; n != 0 {
		t.Fatalf("%d notification bytes still charged after the drain", n)
	}
}

// TestNotifySamePayloadTwice: two notifications with the same name and
// message are two notifications: each has its own id, both are queued.
func TestNotifySamePayloadTwice(t *testing.T) {
	a, b := newEngine(t), newEngine(t)
	for range 2 {
		if err := a.SendNotify(b.Name(), "kv", "ready"); err != nil {
			t.Fatal(err)
		}
	}
	big := strings.Repeat("x", 100<<10) // over 64 KiB: the peer is probed first
	for range 2 {
		if err := a.SendNotify(b.Name(), "big", big); err != nil {
			t.Fatal(err)
		}
	}
	got := b.Notifies()
	if len(got) != 4 || got[0] != got[1] || got[0].Msg != "ready" || got[2] != got[3] || got[2].Msg != big {
		t.Fatalf("queued %d notifications, want the two pairs", len(got))
	}
	if st := b.Stats(); st.NotifiesDuplicate != 0 {
		t.Fatalf("%d taken for duplicates", st.NotifiesDuplicate)
	}
}

// olderTe is a control plane that speaks Notify and Probe as te before
// NotifyOnce did: NotifyOnce is a kind it has no handler for.
type olderTe struct {
	p                      *ctrl.Plane
	notifies, once, probes atomic.Int32
	mu                     sync.Mutex
	got                    []string
}

func newOlderTe(t *testing.T) *olderTe {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &olderTe{p: ctrl.New(ln, ctrl.Options{Instance: "older", Name: ln.Addr().String(), Addr: ln.Addr().String(),
		Limits: ctrl.Limits{Policy: connlimit.Policy{MaxConns: 16, MaxConnsPerHost: 16, IdleTimeout: time.Minute,
			HandshakeTimeout: 5 * time.Second, ProgressTimeout: 5 * time.Second, PeerIdleTimeout: time.Minute},
			MaxCalls: 16, MaxCallsPerConn: 16, MaxFrame: 1 << 20},
		DialTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})}
	o.p.Handle(wire.KindNotify, func(_ context.Context, b []byte) ([]byte, error) {
		name, msg, err := wire.ParseNotify(b)
		if err != nil {
			return nil, err
		}
		o.notifies.Add(1)
		o.mu.Lock()
		o.got = append(o.got, string(name)+"="+string(msg))
		o.mu.Unlock()
		return nil, nil
	})
	// What an older te answers to a kind it does not know, counted.
	o.p.Handle(wire.KindNotifyOnce, func(context.Context, []byte) ([]byte, error) {
		o.once.Add(1)
		return nil, errs.New(errs.NotSupported, "rpc", "no handler for this message kind")
	})
	o.p.Handle(wire.KindProbe, func(context.Context, []byte) ([]byte, error) {
		o.probes.Add(1)
		return json.Marshal(engine.Probe{Name: ln.Addr().String(), Instance: "older", Version: 1})
	})
	o.p.Start()
	t.Cleanup(o.p.Close)
	return o
}

// TestNotifyOlderPeer: a te that predates NotifyOnce answers it
// NotSupported with nothing queued; the sender then sends Notify, and
// remembers the peer. A notification over 64 KiB (which an older te would
// refuse by closing the connection) goes after a Probe that lacks
// notify_ids, as Notify from the start.
func TestNotifyOlderPeer(t *testing.T) {
	a := newEngine(t)
	old := newOlderTe(t)
	addr := old.p.Addr().String()
	for i := range 2 {
		if err := a.SendNotify(addr, "n", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n, o := old.notifies.Load(), old.once.Load(); n != 2 || o != 1 {
		t.Fatalf("older peer: %d Notify, %d NotifyOnce; want 2 and 1 (remembered after the first)", n, o)
	}
	old2 := newOlderTe(t)
	big := strings.Repeat("y", 100<<10)
	if err := a.SendNotify(old2.p.Addr().String(), "big", big); err != nil {
		t.Fatal(err)
	}
	if n, o, p := old2.notifies.Load(), old2.once.Load(), old2.probes.Load(); n != 1 || o != 0 || p != 1 {
		t.Fatalf("older peer, large: %d Notify, %d NotifyOnce, %d probes; want 1, 0, 1", n, o, p)
	}
	old.mu.Lock()
	defer old.mu.Unlock()
	if fmt.Sprint(old.got) != "[n=0 n=1]" {
		t.Fatalf("older peer got %v", old.got)
	}
}
