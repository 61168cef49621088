package fabric_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/fabric"
	"github.com/tecache/te/internal/sys/mem"
)

// Warmup opens the endpoint to the peer ahead of the first request, and
// that request then uses it instead of opening another.
func TestWarmup(t *testing.T) {
	p := requireProvider(t, "tcp")
	mk := func() *engine.Engine {
		e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", ForceTransport: fabric.Name,
			Params: p, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	a, b := mk(), mk()
	buf := mem.MustAlloc(2 << 20)
	t.Cleanup(func() { mem.Free(buf) })
	local, remote := mem.Addr(buf), mem.Addr(buf)+1<<20
	if err := a.RegisterMemory(local, 1<<20, "cpu:0", false); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterMemory(remote, 1<<20, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	endpoints := func() int { return a.Stats().Live[fabric.Name].Endpoints }
	if n := endpoints(); n != 0 {
		t.Fatalf("%d endpoints before any peer", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Warmup(ctx, b.Name()); err != nil {
		t.Fatal(err)
	}
	if n := endpoints(); n != 1 {
		t.Fatalf("%d endpoints after Warmup, want the one to b", n)
	}
	if err := a.Warmup(ctx, b.Name()); err != nil || endpoints() != 1 {
		t.Fatalf("a second Warmup: %v, %d endpoints", err, endpoints())
	}
	seg, err := a.OpenSegment(b.Name())
	if err != nil {
		t.Fatal(err)
	}
	bt, err := a.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	defer bt.Free()
	if err := bt.Submit(engine.Request{Op: engine.Read, Local: local, Segment: seg, Remote: remote, Length: 4096}); err != nil {
		t.Fatal(err)
	}
	if st, err := bt.Wait(30 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("%+v %v", st, err)
	}
	if n := endpoints(); n != 1 {
		t.Fatalf("%d endpoints after the first read: it did not use the warm one", n)
	}
}
