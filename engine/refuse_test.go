package engine_test

import (
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// An engine at its connection limit says so: a peer refused by the
// per-host limit gets ResourceExhausted naming the limit, not a reset
// that reads as "segment not found".
func TestRefusedAtConnectionLimit(t *testing.T) {
	dec := newEngine(t, func(c *engine.Config) { c.Limits.MaxConnsPerHost = 2 })
	buf := mem.MustAlloc(1 << 16)
	t.Cleanup(func() { mem.Free(buf) })
	if err := dec.RegisterMemory(mem.Addr(buf), 1<<16, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	var refused error
	for i := 0; i < 6 && refused == nil; i++ {
		p := newEngine(t)
		// Each open leaves the peer's control connection pooled.
		if _, err := p.OpenSegment(dec.Name()); err != nil {
			refused = err
		}
	}
	if refused == nil {
		t.Fatal("six peers from one host opened the segment through a per-host limit of 2")
	}
	if errs.CodeOf(refused) != errs.ResourceExhausted {
		t.Fatalf("refused with %v (code %v), want ResourceExhausted", refused, errs.CodeOf(refused))
	}
	t.Logf("refused: %v", refused)
}
