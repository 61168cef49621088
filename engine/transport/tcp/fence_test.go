package tcp_test

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// fenceTarget is an engine (tcp only) with a 1 MiB remote-accessible buffer
// the test frees itself, and the given limits.
func fenceTarget(t *testing.T, adjust func(*engine.Config)) (*engine.Engine, []byte, string, uint64) {
	t.Helper()
	cfg := engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"}}
	if adjust != nil {
		adjust(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	buf, err := mem.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.RegisterMemory(mem.Addr(buf), 1<<20, "cpu", true); err != nil {
		t.Fatal(err)
	}
	d := e.Descriptor()
	return e, buf, d.Endpoints["tcp"], d.Buffers[0].Key
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestUnregisterCutsStalledWrite: an initiator stalls halfway through a
// WRITE's payload while the owner unregisters the buffer. UnregisterMemory
// returns success shortly after its grace period (it cuts that connection),
// and the rest of the payload, sent afterwards, never lands.
func TestUnregisterCutsStalledWrite(t *testing.T) {
	const grace = 300 * time.Millisecond
	e, buf, ep, key := fenceTarget(t, func(c *engine.Config) { c.UnregisterGrace = grace })
	defer mem.Free(buf)
	fill(buf, 0)
	r := dialRaw(t, ep, true)
	half := bytes.Repeat([]byte{0xAB}, 512<<10)
	r.send(wire.DataWrite, 1, mem.Addr(buf), 1<<20, key, half)
	waitFor(t, 10*time.Second, "first half of the payload in the target", func() bool {
		return buf[len(half)-1] == 0xAB
	})
	t0 := time.Now()
	if err := e.UnregisterMemory(mem.Addr(buf)); err != nil {
		t.Fatalf("unregister with a stalled writer: %v", err)
	}
	took := time.Since(t0)
	if took > grace+2*time.Second {
		t.Errorf("unregister took %v (grace %v)", took, grace)
	}
	fill(buf, 0xC3)
	r.nc.Write(half) // the target cut the connection: this may fail
	r.expectClosed()
	time.Sleep(100 * time.Millisecond)
	for i, c := range buf {
		if c != 0xC3 {
			t.Fatalf("a byte landed at %d after UnregisterMemory returned: %#x", i, c)
		}
	}
	t.Logf("unregister returned after %v", took)
}

// TestUnregisterCutsStalledRead: an initiator asks for READs and never reads
// its socket, so the target's writer blocks with the buffer held. Unregister
// cuts it and returns; the buffer is then unmapped (a late read of it would
// fault and kill this test) while the initiator drains what was sent.
func TestUnregisterCutsStalledRead(t *testing.T) {
	e, buf, ep, key := fenceTarget(t, func(c *engine.Config) { c.UnregisterGrace = 200 * time.Millisecond })
	r := dialRaw(t, ep, true)
	for i := 0; i < 64; i++ {
		r.send(wire.DataRead, uint64(i), mem.Addr(buf), 1<<20, key, nil)
	}
	time.Sleep(100 * time.Millisecond) // let the target queue them (fewer held is fine too)
	if err := e.UnregisterMemory(mem.Addr(buf)); err != nil {
		t.Fatalf("unregister with a stalled reader: %v", err)
	}
	mem.Free(buf)
	r.nc.SetDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, r.nc)
	t.Logf("initiator drained %d bytes after the cut (%v)", n, err)
	if n >= 64*(1<<20) {
		t.Fatal("every READ was served: nothing was cut")
	}
}

// TestTrickledWriteCutOff: a WRITE payload trickled a few bytes at a time is
// cut off by the progress timeout, so it cannot hold the buffer (and a
// goroutine) for ever; the owner then unregisters at once.
func TestTrickledWriteCutOff(t *testing.T) {
	e, buf, ep, key := fenceTarget(t, func(c *engine.Config) { c.Limits.ProgressTimeout = 500 * time.Millisecond })
	defer mem.Free(buf)
	r := dialRaw(t, ep, true)
	r.send(wire.DataWrite, 1, mem.Addr(buf), 1<<20, key, []byte{1})
	t0 := time.Now()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for i := 0; i < 100; i++ {
			if _, err := r.nc.Write([]byte{byte(i)}); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	r.expectClosed()
	<-closed
	if took := time.Since(t0); took > 3*time.Second {
		t.Fatalf("trickling peer cut after %v (progress timeout 500ms)", took)
	}
	t1 := time.Now()
	if err := e.UnregisterMemory(mem.Addr(buf)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t1); took > time.Second {
		t.Fatalf("unregister after the cut took %v", took)
	}
}

// TestRevokeWindowCutsStalledWrite: a mover writes into a window granted over
// the buffer and stalls halfway; RevokeWindow returns after its grace, the
// rest of the payload never lands, and the buffer itself stays registered
// and writable under its own key.
func TestRevokeWindowCutsStalledWrite(t *testing.T) {
	const grace = 200 * time.Millisecond
	e, buf, ep, key := fenceTarget(t, func(c *engine.Config) { c.UnregisterGrace = grace })
	defer mem.Free(buf)
	fill(buf, 0)
	win, err := e.GrantWindow([]engine.Range{{Addr: mem.Addr(buf), Length: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	r := dialRaw(t, ep, true)
	half := bytes.Repeat([]byte{0xAB}, 512<<10)
	r.send(wire.DataWrite, 1, mem.Addr(buf), 1<<20, win, half)
	waitFor(t, 10*time.Second, "first half of the payload in the target", func() bool {
		return buf[len(half)-1] == 0xAB
	})
	if err := e.RevokeWindow(win); err != nil {
		t.Fatalf("revoke with a stalled mover: %v", err)
	}
	fill(buf, 0xC3)
	r.nc.Write(half)
	r.expectClosed()
	// Under the window's key nothing goes any more; under the buffer's,
	// everything does.
	r2 := dialRaw(t, ep, true)
	r2.send(wire.DataWrite, 7, mem.Addr(buf)+100, 4, win, []byte("late"))
	if c, _ := r2.recv(); c.Status == 0 {
		t.Fatal("a write under the revoked window was accepted")
	}
	for i, c := range buf {
		if c != 0xC3 {
			t.Fatalf("a byte landed at %d after RevokeWindow returned: %#x", i, c)
		}
	}
	r2.send(wire.DataWrite, 8, mem.Addr(buf), 4, key, []byte("kept"))
	if c, _ := r2.recv(); c.Status != 0 || string(buf[:4]) != "kept" {
		t.Fatalf("write under the buffer's key: status %v", c.Status)
	}
}
