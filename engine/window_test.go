package engine_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// TestWindow: a peer writes through a window only inside its ranges; once the
// window is revoked its key opens nothing, while the memory stays registered
// and reachable under the buffer's own key.
func TestWindow(t *testing.T) {
	a, b, s, la, rb := pair(t)
	src := mem.Bytes(la, 1<<20)
	dst := mem.Bytes(rb, 1<<20)
	for i := range src {
		src[i] = 0x5A
	}
	key, err := b.GrantWindow([]engine.Range{{Addr: rb + 4096, Length: 4096}, {Addr: rb + 8192, Length: 4096}, {Addr: rb + 65536, Length: 100}})
	if err != nil {
		t.Fatal(err)
	}
	run := func(remote, n uint64, window uint64) engine.BatchStatus {
		t.Helper()
		batch, _ := a.AllocateBatch(1)
		defer batch.Free()
		if err := batch.Submit(engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: remote, Length: n, Transport: "local", Window: window}); err != nil {
			t.Fatal(err)
		}
		st, err := batch.Wait(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	// Merged adjacent ranges: one access may span them.
	if st := run(rb+4096, 8192, key); st.State != engine.Completed {
		t.Fatalf("write inside the window: %+v", st)
	}
	if st := run(rb+65536, 101, key); st.State != engine.Failed || errs.CodeOf(st.Err) != errs.AccessDenied {
		t.Fatalf("write past the window's range: %+v", st)
	}
	if st := run(rb, 4096, key); st.State != engine.Failed || errs.CodeOf(st.Err) != errs.AccessDenied {
		t.Fatalf("write outside the window: %+v", st)
	}
	if !bytes.Equal(dst[:4096], make([]byte, 4096)) || dst[65536] != 0 {
		t.Fatal("a refused write landed")
	}
	if err := b.RevokeWindow(key); err != nil {
		t.Fatal(err)
	}
	code(t, "revoke twice", b.RevokeWindow(key), errs.NotFound)
	clear(dst[4096:12288])
	// Refused as a window that is gone, not as a stale descriptor (which
	// would send the initiator to fetch the descriptor and try again).
	if st := run(rb+4096, 4096, key); st.State != engine.Failed || errs.CodeOf(st.Err) != errs.AccessDenied {
		t.Fatalf("write under a revoked window: %+v", st)
	}
	if st := run(rb+4096, 4096, key^0x5a5a5a5a00000000); st.State != engine.Failed || errs.CodeOf(st.Err) != errs.AccessDenied {
		t.Fatalf("write under a window key never granted: %+v", st)
	}
	if !bytes.Equal(dst[4096:12288], make([]byte, 8192)) {
		t.Fatal("a write under a revoked window landed")
	}
	if st := run(rb+4096, 4096, 0); st.State != engine.Completed {
		t.Fatalf("write with the buffer's key after the revoke: %+v", st)
	}
	if st := b.Stats(); st.WindowsGranted != 1 || st.WindowsRevoked != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestGrantWindowErrors(t *testing.T) {
	_, b, _, _, rb := pair(t)
	_, err := b.GrantWindow(nil)
	code(t, "no ranges", err, errs.InvalidArgument)
	_, err = b.GrantWindow([]engine.Range{{Addr: rb, Length: 0}})
	code(t, "empty range", err, errs.InvalidArgument)
	_, err = b.GrantWindow([]engine.Range{{Addr: rb + 1<<20 - 8, Length: 16}})
	code(t, "range past the buffer", err, errs.AddressNotRegistered)
	priv := alloc(t, 4096)
	if err := b.RegisterMemory(mem.Addr(priv), 4096, "cpu", false); err != nil {
		t.Fatal(err)
	}
	_, err = b.GrantWindow([]engine.Range{{Addr: mem.Addr(priv), Length: 4096}})
	code(t, "local-only buffer", err, errs.AccessDenied)
	code(t, "revoke unknown", b.RevokeWindow(12345), errs.NotFound)
	// A window dies with the memory under it: unregistering waits for its
	// accesses like any other and its key opens nothing after.
	key, err := b.GrantWindow([]engine.Range{{Addr: rb, Length: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.UnregisterMemory(rb); err != nil {
		t.Fatal(err)
	}
	if err := b.RevokeWindow(key); err != nil {
		t.Fatal(err)
	}
}
