package kvcache_test

import (
	_ "github.com/tecache/te/engine/std"

	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/kvcache"
)

// memcpyRate measures this machine's memcpy bandwidth (bytes/ns) on 64 MiB,
// once per run: the physical reference the planning time is compared with.
var memcpyRate = sync.OnceValue(func() float64 {
	const n = 64 << 20
	src, dst := mem.MustAlloc(n), mem.MustAlloc(n)
	defer mem.Free(src)
	defer mem.Free(dst)
	copy(dst, src) // fault the pages in
	best := time.Duration(1 << 62)
	for range 5 {
		t0 := time.Now()
		copy(dst, src)
		best = min(best, time.Since(t0))
	}
	return float64(n) / float64(best.Nanoseconds())
})

// BenchmarkPlanLlama plans the handoff of a 4k-token prompt (256 blocks) of
// a Llama-3-8B-shaped cache: 32 layers, 8 KV heads, head dim 128, bf16,
// 16-token blocks, 512 MiB of KV. Metrics:
//   - requests, block-requests: after and before coalescing;
//   - naive-x: planning time over the time to merely list one transfer per
//     layer, K/V and block (the floor for any planner that emits them);
//   - copy-%: planning time as a share of copying the plan's bytes at this
//     machine's memcpy bandwidth (memcpy-GB/s), measured in the same run.
func BenchmarkPlanLlama(b *testing.B) {
	for _, c := range []struct {
		name   string
		order  kvcache.Order
		dHeads int // decode heads (TP 8/dHeads), starting at head 0
		random bool
	}{
		{"HND/consecutive", kvcache.HND, 8, false},
		{"HND/random", kvcache.HND, 8, true},
		{"HND-tp2/random", kvcache.HND, 4, true},
		{"NHD-tp2/random", kvcache.NHD, 4, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			src := llama(c.order, 4096, 1<<40)
			dst := llama(c.order, 4096, 1<<42)
			dst.NumHeads = c.dHeads
			r := rand.New(rand.NewPCG(7, 7))
			sb, db := seq(256), seq(256)
			if c.random {
				sb, db = r.Perm(4096)[:256], r.Perm(4096)[:256]
			} else {
				for i := range db {
					sb[i] += 1000
					db[i] += 3000
				}
			}
			naive := naiveList(src, sb, db)
			b.ReportAllocs()
			var p *kvcache.Plan
			for b.Loop() {
				var err error
				if p, err = kvcache.NewPlan(src, dst, sb, db, kvcache.LayerRange{}); err != nil {
					b.Fatal(err)
				}
			}
			per := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			st := p.Stats()
			b.ReportMetric(float64(st.Requests), "requests")
			b.ReportMetric(float64(st.BlockRequests), "block-requests")
			b.ReportMetric(per/float64(naive.Nanoseconds()), "naive-x")
			b.ReportMetric(100*per/(float64(st.Bytes)/memcpyRate()), "copy-%")
			b.ReportMetric(memcpyRate(), "memcpy-GB/s")
		})
	}
}

// naiveList times listing one transfer per layer, K/V and block for the
// layout (best of 20), without coalescing or checks.
func naiveList(l *kvcache.Layout, sb, db []int) time.Duration {
	bb, _ := l.BlockBytes()
	nb := uint64(l.NumBlocks)
	best := time.Duration(1 << 62)
	for range 20 {
		t0 := time.Now()
		out := make([]kvcache.Transfer, 0, len(l.Bases)*2*len(sb))
		for _, base := range l.Bases {
			for kv := range uint64(2) {
				for i, s := range sb {
					out = append(out, kvcache.Transfer{Src: base + kv*nb*bb + uint64(s)*bb, Dst: base + kv*nb*bb + uint64(db[i])*bb, Length: bb})
				}
			}
		}
		best = min(best, time.Since(t0))
		if len(out) == 0 {
			panic("empty")
		}
	}
	return best
}
