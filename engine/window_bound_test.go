package engine_test

import (
	"bytes"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	_ "github.com/tecache/te/engine/transport/tcp"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// boundTrio is an owner with one registered buffer, a window over part of
// it granted to grantee alone, and a third engine: all of one config.
type boundTrio struct {
	owner, grantee, other *engine.Engine
	dst                   []byte
	key                   uint64
}

func newBoundTrio(t *testing.T, mod ...func(*engine.Config)) *boundTrio {
	t.Helper()
	return newTrio(t, func(x *boundTrio, r []engine.Range) (uint64, error) {
		return x.owner.GrantWindowTo(x.grantee.Name(), r)
	}, mod...)
}

// newTrio makes the three engines and the owner's buffer, and grants the
// window over its first half with grant.
func newTrio(t *testing.T, grant func(x *boundTrio, r []engine.Range) (uint64, error), mod ...func(*engine.Config)) *boundTrio {
	t.Helper()
	x := &boundTrio{owner: newEngine(t, mod...), grantee: newEngine(t, mod...), other: newEngine(t, mod...)}
	x.dst = alloc(t, 1<<16)
	if err := x.owner.RegisterMemory(mem.Addr(x.dst), 1<<16, "cpu", true); err != nil {
		t.Fatal(err)
	}
	var err error
	if x.key, err = grant(x, []engine.Range{{Addr: mem.Addr(x.dst), Length: 1 << 15}}); err != nil {
		t.Fatal(err)
	}
	return x
}

// write has e write 4 KiB of v at the start of the owner's buffer under the
// window, over transport tr, and returns the outcome.
func (x *boundTrio) write(t *testing.T, e *engine.Engine, tr string, v byte) engine.BatchStatus {
	t.Helper()
	src := alloc(t, 4096)
	for i := range src {
		src[i] = v
	}
	if err := e.RegisterMemory(mem.Addr(src), 4096, "cpu", false); err != nil {
		t.Fatal(err)
	}
	defer e.UnregisterMemory(mem.Addr(src))
	s, err := e.OpenSegment(x.owner.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseSegment(s)
	b, err := e.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if err := b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(src), Segment: s, Remote: mem.Addr(x.dst),
		Length: 4096, Transport: tr, Window: x.key}); err != nil {
		return engine.BatchStatus{State: engine.Failed, Err: err}
	}
	st, err := b.Wait(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// check runs the scenario over tr: the other engine is refused and lands
// nothing, the grantee's write lands, and after the revoke the grantee is
// refused too.
func (x *boundTrio) check(t *testing.T, tr string) {
	t.Helper()
	st := x.write(t, x.other, tr, 0xEE)
	if st.State != engine.Failed || errs.CodeOf(st.Err) != errs.AccessDenied {
		t.Fatalf("%s: another engine wrote under a window granted to %q: %+v", tr, x.grantee.Name(), st)
	}
	if !bytes.Equal(x.dst[:4096], make([]byte, 4096)) {
		t.Fatalf("%s: a refused write landed", tr)
	}
	if st := x.write(t, x.grantee, tr, 0x5A); st.State != engine.Completed {
		t.Fatalf("%s: the grantee's write: %+v", tr, st)
	}
	if x.dst[0] != 0x5A || x.dst[4095] != 0x5A {
		t.Fatalf("%s: the grantee's write did not land", tr)
	}
	x.checkRevoked(t, tr, "the grantee")
}

// checkRevoked revokes the window and checks that who (the grantee) can no
// longer write under it and nothing of its write lands.
func (x *boundTrio) checkRevoked(t *testing.T, tr, who string) {
	t.Helper()
	if err := x.owner.RevokeWindow(x.key); err != nil {
		t.Fatal(err)
	}
	clear(x.dst)
	if st := x.write(t, x.grantee, tr, 0x77); st.State != engine.Failed || errs.CodeOf(st.Err) != errs.AccessDenied {
		t.Fatalf("%s: %s wrote after the revoke: %+v", tr, who, st)
	}
	if !bytes.Equal(x.dst[:4096], make([]byte, 4096)) {
		t.Fatalf("%s: a write after the revoke landed", tr)
	}
}

// TestWindowBoundToGranteeTCP: with the cluster secret, a window granted to
// one engine is refused to another engine holding the secret and its key,
// over tcp (the data connection's exchange proved who calls), and nothing
// lands; the grantee writes, and revoking still fences.
func TestWindowBoundToGranteeTCP(t *testing.T) {
	x := newBoundTrio(t, withSecret(secretA), func(c *engine.Config) { c.Transports = []string{"tcp"} })
	x.check(t, "tcp")
}

// TestWindowBoundToGranteeLocal: in one process the owner knows the engine
// that calls for certain, so the binding holds even without a secret.
func TestWindowBoundToGranteeLocal(t *testing.T) {
	x := newBoundTrio(t)
	x.check(t, "local")
}

// TestWindowBoundWithoutSecretIsBearer: without a secret nothing about a
// remote peer is proven, and a bound window is honoured for any engine
// holding its key over tcp (documented: binding protects only with a
// secret).
func TestWindowBoundWithoutSecretIsBearer(t *testing.T) {
	x := newBoundTrio(t, func(c *engine.Config) { c.Transports = []string{"tcp"} })
	if st := x.write(t, x.other, "tcp", 0xEE); st.State != engine.Completed {
		t.Fatalf("without a secret: %+v", st)
	}
}

func TestGrantWindowToErrors(t *testing.T) {
	_, b, _, _, rb := pair(t)
	_, err := b.GrantWindowTo(strings.Repeat("x", segment.MaxGranteeLen+1), []engine.Range{{Addr: rb, Length: 4096}})
	code(t, "grantee name too long", err, errs.InvalidArgument)
	_, err = b.GrantWindowTo("peer", nil)
	code(t, "no ranges", err, errs.InvalidArgument)
}

// nowin is a transport that cannot enforce windows (an RDMA NIC checks the
// buffer's rkey, never the owner's window): ranked before every other, it
// reaches the engines of this process that turned it on (param nowin.on)
// and completes each request without moving anything, counting them.
type nowin struct{ carried atomic.Int64 }

var (
	nowinMu    sync.Mutex
	nowinPeers = map[string]*nowin{}
)

func init() {
	transport.RegisterFactory("nowin", func() (transport.Transport, error) { return &nowin{}, nil })
}

func (n *nowin) Name() string { return "nowin" }
func (n *nowin) Caps() transport.Caps {
	return transport.Caps{SameProcess: true, HostMemory: true, Rank: -1}
}
func (n *nowin) Start(h transport.Host) error {
	if v, _ := h.Param("nowin.on"); v != "1" {
		return nil // installed by default in every engine of these tests: reaches none of them
	}
	nowinMu.Lock()
	nowinPeers[h.Instance()] = n
	nowinMu.Unlock()
	return nil
}
func (n *nowin) Describe(*segment.Desc)           {}
func (n *nowin) Register(*segment.Region) error   { return nil }
func (n *nowin) Unregister(*segment.Region) error { return nil }
func (n *nowin) Reachable(d *segment.Desc) error {
	nowinMu.Lock()
	defer nowinMu.Unlock()
	if nowinPeers[d.Instance] == nil {
		return errs.New(errs.TransportUnavailable, "nowin", "not here")
	}
	return nil
}
func (n *nowin) Submit(reqs []transport.Request) {
	for i := range reqs {
		n.carried.Add(1)
		reqs[i].Complete(nil)
	}
}
func (n *nowin) Cancel([]*transport.Request)   {}
func (n *nowin) Quiesce(*segment.Region) error { return nil }
func (n *nowin) Close() error {
	nowinMu.Lock()
	for k, v := range nowinPeers {
		if v == n {
			delete(nowinPeers, k)
		}
	}
	nowinMu.Unlock()
	return nil
}

// TestWindowNeverOverUnenforcingTransport: a request under a window never
// goes over a transport that cannot enforce windows, even the best-ranked
// one: selection passes it over for one that can (local here), and with
// none left, or with it forced, the request fails with NotSupported naming
// why, rather than going under the buffer's own key.
func TestWindowNeverOverUnenforcingTransport(t *testing.T) {
	on := map[string]string{"nowin.on": "1"}
	both := func(c *engine.Config) { c.Transports, c.Params = []string{"local", "nowin"}, on }
	x := newBoundTrio(t, both)
	nw := func(e *engine.Engine) *nowin {
		nowinMu.Lock()
		defer nowinMu.Unlock()
		return nowinPeers[e.Instance()]
	}
	if st := x.write(t, x.grantee, "", 0x5A); st.State != engine.Completed || x.dst[0] != 0x5A {
		t.Fatalf("under the window, best transport unable to enforce it: %+v", st)
	}
	if n := nw(x.grantee).carried.Load(); n != 0 {
		t.Fatalf("a transport that cannot enforce windows carried %d requests under one", n)
	}
	for range 2 { // the second answer comes from the cached choice
		st := x.write(t, x.grantee, "nowin", 0x11)
		if st.State != engine.Failed || errs.CodeOf(st.Err) != errs.NotSupported || !strings.Contains(st.Err.Error(), "window") {
			t.Fatalf("window forced over nowin: %+v", st)
		}
	}
	only := newBoundTrio(t, func(c *engine.Config) { c.Transports, c.Params = []string{"nowin"}, on })
	for range 2 {
		st := only.write(t, only.grantee, "", 0x11)
		if st.State != engine.Failed || errs.CodeOf(st.Err) != errs.NotSupported || !strings.Contains(st.Err.Error(), "enforce") {
			t.Fatalf("window with only nowin: %+v", st)
		}
	}
	if n := nw(only.grantee).carried.Load(); n != 0 {
		t.Fatalf("nowin carried %d requests under a window", n)
	}
	if got := only.grantee.Stats().WindowsUnenforced; got != 2 {
		t.Fatalf("windows_unenforced %d, want 2", got)
	}
}
