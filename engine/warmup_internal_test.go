package engine

import (
	"context"
	"testing"

	_ "github.com/tecache/te/engine/transport/tcp" // the transport Warmup connects
	"github.com/tecache/te/internal/sys/mem"
)

// TestWarmupCachesRoute: Warmup makes the host-memory choice pick would
// make, so the first request to the segment finds it cached (a cache miss
// cost the first submit 5-10 us of selection); with a transport forced, as
// in pick, nothing is cached.
func TestWarmupCachesRoute(t *testing.T) {
	for _, force := range []string{"", "tcp"} {
		newE := func() *Engine {
			e, err := New(Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"}, ForceTransport: force})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return e
		}
		a, b := newE(), newE()
		buf := mem.MustAlloc(1 << 16)
		t.Cleanup(func() { mem.Free(buf) })
		if err := b.RegisterMemory(mem.Addr(buf), 1<<16, "cpu:0", true); err != nil {
			t.Fatal(err)
		}
		s, err := a.OpenSegment(b.Name())
		if err != nil {
			t.Fatal(err)
		}
		if pc := s.st.pick[0].Load(); pc != nil {
			t.Fatalf("force %q: a route cached before any request or Warmup", force)
		}
		if err := a.Warmup(context.Background(), b.Name()); err != nil {
			t.Fatal(err)
		}
		pc := s.st.pick[0].Load()
		switch {
		case force == "" && (pc == nil || pc.t == nil || pc.t.Name() != "tcp" || pc.err != nil):
			t.Fatalf("after Warmup the host-memory route is %+v, want tcp cached", pc)
		case force != "" && pc != nil:
			t.Fatalf("force %q: Warmup cached a route pick would not", force)
		}
		a.CloseSegment(s)
	}
}
