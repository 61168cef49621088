package engine_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
)

// newFirstTrio is newBoundTrio with the window granted to the first engine
// that uses it (GrantWindowToFirst) rather than to the grantee by name.
func newFirstTrio(t *testing.T, mod ...func(*engine.Config)) *boundTrio {
	t.Helper()
	x := newTrio(t, func(x *boundTrio, r []engine.Range) (uint64, error) { return x.owner.GrantWindowToFirst(r) }, mod...)
	if p, err := x.owner.WindowPeer(x.key); err != nil || p != "" {
		t.Fatalf("a window nobody used is bound to %q (%v)", p, err)
	}
	return x
}

// checkFirst runs the scenario over tr: the grantee's first write lands
// and binds the window to it; then the other engine, holding the key, is
// refused and lands nothing; the owner can no longer bind the window to
// another engine, and learns whom it is bound to; the grantee goes on
// writing; after the revoke it is refused too.
func (x *boundTrio) checkFirst(t *testing.T, tr string) {
	t.Helper()
	if st := x.write(t, x.grantee, tr, 0x5A); st.State != engine.Completed || x.dst[0] != 0x5A {
		t.Fatalf("%s: the first user's write: %+v", tr, st)
	}
	if p, err := x.owner.WindowPeer(x.key); err != nil || p != x.grantee.Name() {
		t.Fatalf("%s: window bound to %q (%v), want its first user %q", tr, p, err, x.grantee.Name())
	}
	st := x.write(t, x.other, tr, 0xEE)
	if st.State != engine.Failed || errs.CodeOf(st.Err) != errs.AccessDenied {
		t.Fatalf("%s: another engine wrote under a window its first user %q bound: %+v", tr, x.grantee.Name(), st)
	}
	if !bytes.Equal(x.dst[:4096], bytes.Repeat([]byte{0x5A}, 4096)) {
		t.Fatalf("%s: a refused write landed", tr)
	}
	err := x.owner.BindWindow(x.key, x.other.Name())
	code(t, tr+": binding a window used by another", err, errs.AccessDenied)
	if !strings.Contains(err.Error(), x.grantee.Name()) {
		t.Fatalf("%s: the refusal does not name the engine that used the window: %v", tr, err)
	}
	if err := x.owner.BindWindow(x.key, x.grantee.Name()); err != nil {
		t.Fatalf("%s: binding the window to its first user: %v", tr, err)
	}
	if st := x.write(t, x.grantee, tr, 0x33); st.State != engine.Completed || x.dst[0] != 0x33 {
		t.Fatalf("%s: the first user's second write: %+v", tr, st)
	}
	x.checkRevoked(t, tr, "the first user")
}

// checkBoundFirst: the owner binds the window to the grantee before anyone
// used it; the other engine, holding the key, is refused from the start
// and lands nothing; the grantee writes.
func (x *boundTrio) checkBoundFirst(t *testing.T, tr string) {
	t.Helper()
	if err := x.owner.BindWindow(x.key, x.grantee.Name()); err != nil {
		t.Fatal(err)
	}
	st := x.write(t, x.other, tr, 0xEE)
	if st.State != engine.Failed || errs.CodeOf(st.Err) != errs.AccessDenied {
		t.Fatalf("%s: another engine wrote under a window bound to %q before any use: %+v", tr, x.grantee.Name(), st)
	}
	if !bytes.Equal(x.dst[:4096], make([]byte, 4096)) {
		t.Fatalf("%s: a refused write landed", tr)
	}
	if st := x.write(t, x.grantee, tr, 0x5A); st.State != engine.Completed || x.dst[0] != 0x5A || x.dst[4095] != 0x5A {
		t.Fatalf("%s: the write of the engine the window was bound to: %+v", tr, st)
	}
}

// TestWindowBoundOnFirstUse: with the cluster secret, a window granted to
// the first engine that uses it is bound to that engine by its first
// write, over the transports that enforce windows and reach another engine
// of this process (tcp: its session proved who calls; local; shm and cxl
// check the same way, TestWindowFirstUserOnly in kvcache/handoff runs shm
// between processes), and is refused to another engine that holds the secret and its
// key, landing nothing. Bound by its owner before any use, it is refused
// to the other engine from the start.
func TestWindowBoundOnFirstUse(t *testing.T) {
	for _, tr := range []string{"tcp", "local"} {
		only := func(c *engine.Config) { c.Transports = []string{tr} }
		t.Run(tr, func(t *testing.T) {
			newFirstTrio(t, withSecret(secretA), only).checkFirst(t, tr)
		})
		t.Run(tr+" bound before use", func(t *testing.T) {
			newFirstTrio(t, withSecret(secretA), only).checkBoundFirst(t, tr)
		})
	}
}

// TestWindowFirstUseWithoutSecret: without a secret nothing proves which
// remote engine calls, so over tcp no access binds the window and it
// stays a bearer key (documented); in this process (local) the first
// user is known, and the binding holds.
func TestWindowFirstUseWithoutSecret(t *testing.T) {
	x := newFirstTrio(t, func(c *engine.Config) { c.Transports = []string{"tcp"} })
	for _, e := range []*engine.Engine{x.grantee, x.other} {
		if st := x.write(t, e, "tcp", 0x11); st.State != engine.Completed {
			t.Fatalf("without a secret: %+v", st)
		}
	}
	if p, _ := x.owner.WindowPeer(x.key); p != "" {
		t.Fatalf("an unproven access bound the window to %q", p)
	}
	newFirstTrio(t).checkFirst(t, "local")
}

func TestBindWindowErrors(t *testing.T) {
	_, b, _, _, rb := pair(t)
	bearer, err := b.GrantWindow([]engine.Range{{Addr: rb, Length: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	code(t, "bind a bearer window", b.BindWindow(bearer, "peer"), errs.InvalidArgument)
	code(t, "bind an unknown window", b.BindWindow(bearer^1, "peer"), errs.NotFound)
	_, err = b.WindowPeer(bearer ^ 1)
	code(t, "peer of an unknown window", err, errs.NotFound)
	first, err := b.GrantWindowToFirst([]engine.Range{{Addr: rb, Length: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	code(t, "bind to no one", b.BindWindow(first, ""), errs.InvalidArgument)
	if err := b.BindWindow(first, "peer"); err != nil {
		t.Fatal(err)
	}
	code(t, "bind to another", b.BindWindow(first, "other"), errs.AccessDenied)
	named, err := b.GrantWindowTo("peer", []engine.Range{{Addr: rb, Length: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.BindWindow(named, "peer"); err != nil {
		t.Fatalf("binding a window to its grantee: %v", err)
	}
	code(t, "bind a granted window to another", b.BindWindow(named, "other"), errs.AccessDenied)
	_, err = b.GrantWindowToFirst(nil)
	code(t, "no ranges", err, errs.InvalidArgument)
}
