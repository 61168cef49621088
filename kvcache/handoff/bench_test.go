package handoff_test

import (
	_ "github.com/tecache/te/engine/std"

	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/kvcache"
	"github.com/tecache/te/kvcache/handoff"
	"github.com/tecache/te/kvcache/kvtest"
)

// BenchmarkHandoff measures the end-to-end handoff of a Llama-3-8B-shaped
// KV cache (32 layers, 8 KV heads, head dim 128, bf16, 16-token blocks) for
// a prompt of TE_BENCH_TOKENS tokens (default 4096: 512 MiB), non-contiguous
// block ids on both sides, from this process (prefill) to a decode process,
// through a sidecar on 127.0.0.1, against two references measured in the
// same run with the same engines and transport:
//
//   - raw-plan: the same coalesced requests as one engine batch, no sidecar,
//     no notification (what the handoff adds is the rendezvous and the
//     completion signal);
//   - raw-4MiB: the same number of bytes as 4 MiB requests over contiguous
//     memory, te-bench's large-block bandwidth (what the block layout costs
//     on top).
//
// A handoff is timed from prefill's Ready (decode has declared already) to
// both prefill's Send and decode's Wait having returned. The metrics are
// GB/s of each and the handoff's time as a multiple of each reference's
// (x-raw-plan, x-raw-4MiB; the goal is <= 1.2). Push: prefill WRITEs into
// decode; pull: decode READs from prefill (its references run in the decode
// process, reading).
func BenchmarkHandoff(b *testing.B) {
	tokens := 4096
	if v, err := strconv.Atoi(os.Getenv("TE_BENCH_TOKENS")); err == nil && v > 0 {
		tokens = v
	}
	n := (tokens + 15) / 16
	pre, dec := kvtest.Llama3_8B(n+n/4+1), kvtest.Llama3_8B(2*n+1)
	r := rand.New(rand.NewPCG(1, 2))
	src := kvtest.Blocks(n, pre.Blocks, r)
	dst := kvtest.Blocks(n, dec.Blocks, r)
	ctx := context.Background()
	for _, tr := range []string{"shm", "tcp"} {
		b.Run(tr, func(b *testing.B) {
			sc := startSidecar(b)
			peer := startChild(b, sc.addr, tr, dec, time.Second)
			me := newLocal(b, sc, tr, pre, time.Second)
			me.cache.Fill(src)
			peer.do(command{Op: "clear"}) // touch decode's pages, as a cache in use has them
			seg, err := me.e.OpenSegment(peer.segment)
			if err != nil {
				b.Fatal(err)
			}
			defer me.e.CloseSegment(seg)
			plan, err := kvcache.NewPlan(&me.cache.Layout, peer.layout, src, dst, kvcache.LayerRange{})
			if err != nil {
				b.Fatal(err)
			}
			bytes := plan.Stats().Bytes
			for _, mode := range []handoff.Mode{handoff.Push, handoff.Pull} {
				b.Run(string(mode), func(b *testing.B) {
					op := engine.Write
					var tHandoff, tPlan, tContig time.Duration
					var requests int
					// Local is always this side's (the source's) memory.
					raw, err := kvcache.EngineRequests(plan.Transfers(), seg, engine.Write)
					if err != nil {
						b.Fatal(err)
					}
					for k := range raw {
						raw[k].Op = op
					}
					contig := contiguous(me.cache, peer.layout, seg, op, bytes)
					handoffOnce := func(i int) time.Duration {
						id := fmt.Sprintf("%s-%s-%d-%d", tr, mode, b.N, i)
						if a := peer.do(command{Op: "expect", ID: id, Blocks: dst, Mode: string(mode)}); a.Err != "" {
							b.Fatal(a.Err)
						}
						t0 := time.Now()
						tx, err := me.c.Ready(ctx, handoff.Request{ID: id, Layout: &me.cache.Layout, Blocks: src})
						if err != nil {
							b.Fatal(err)
						}
						waiting := peer.send(command{Op: "wait", ID: id})
						res, err := tx.Send(ctx)
						if err != nil {
							b.Fatal(err)
						}
						a := peer.get(waiting)
						d := time.Since(t0)
						if a.Err != "" {
							b.Fatal(a.Err)
						}
						if mode == handoff.Pull {
							res = a.Result
						}
						if res.Bytes != bytes || res.Transport != tr {
							b.Fatalf("moved %d bytes over %s, want %d over %s", res.Bytes, res.Transport, bytes, tr)
						}
						requests = res.Requests
						return d
					}
					// The references run on the moving side: this process
					// for push, the decode process for pull.
					refPlan := func() time.Duration { return rawBatch(b, me.e, raw) }
					refContig := func() time.Duration { return rawBatch(b, me.e, contig) }
					if mode == handoff.Pull {
						ref := func(contig bool) time.Duration {
							a := peer.do(command{Op: "raw", Segment: me.e.Name(), Layout: &me.cache.Layout, Src: src, Blocks: dst, Contig: contig})
							if a.Err != "" {
								b.Fatal(a.Err)
							}
							return a.Elapsed
						}
						refPlan = func() time.Duration { return ref(false) }
						refContig = func() time.Duration { return ref(true) }
					}
					// Warm up: the first transfers between two processes
					// run several times slower (pages, connections, the
					// shm transport's validations), on both paths.
					for i := range 2 {
						handoffOnce(-1 - i)
						refPlan()
						refContig()
					}
					for i := range b.N {
						// Alternate the order so that neither side of the
						// comparison always runs on a warmer machine.
						if i%2 == 0 {
							tHandoff += handoffOnce(i)
						}
						tPlan += refPlan()
						tContig += refContig()
						if i%2 == 1 {
							tHandoff += handoffOnce(i)
						}
					}
					gbs := func(d time.Duration) float64 { return float64(bytes) * float64(b.N) / d.Seconds() / 1e9 }
					b.ReportMetric(gbs(tHandoff), "handoff-GB/s")
					b.ReportMetric(gbs(tPlan), "raw-plan-GB/s")
					b.ReportMetric(gbs(tContig), "raw-4MiB-GB/s")
					b.ReportMetric(float64(tHandoff)/float64(tPlan), "x-raw-plan")
					b.ReportMetric(float64(tHandoff)/float64(tContig), "x-raw-4MiB")
					b.ReportMetric(float64(requests), "requests")
					b.ReportMetric(float64(bytes)/(1<<20), "MiB")
				})
			}
		})
	}
}

// rawBatch submits rs as one batch, waits, and returns the time.
func rawBatch(b *testing.B, e *engine.Engine, rs []engine.Request) time.Duration {
	bt, err := e.AllocateBatch(len(rs))
	if err != nil {
		b.Fatal(err)
	}
	defer bt.Free()
	t0 := time.Now()
	if err := bt.Submit(rs...); err != nil {
		b.Fatal(err)
	}
	st, err := bt.Wait(-1)
	d := time.Since(t0)
	if err != nil || st.State != engine.Completed {
		b.Fatalf("raw batch: %+v %v", st, err)
	}
	return d
}

// contiguous returns requests of 4 MiB moving n bytes between the two
// caches' layer tensors, in address order on both sides.
func contiguous(c *kvtest.Cache, peer *kvcache.Layout, seg *engine.Segment, op engine.Opcode, n uint64) []engine.Request {
	const chunk = 4 << 20
	var rs []engine.Request
	pl := peer.Bases
	peerLayer := 2 * uint64(peer.NumBlocks) * c.BlockBytes()
	var li, pi int
	var lo, po uint64
	for n > 0 {
		k := min(chunk, n, c.LayerBytes()-lo, peerLayer-po)
		r := engine.Request{Op: op, Segment: seg, Length: k, Local: c.Layout.Bases[li] + lo, Remote: pl[pi] + po}
		rs = append(rs, r)
		n -= k
		if lo += k; lo == c.LayerBytes() {
			li, lo = li+1, 0
		}
		if po += k; po == peerLayer {
			pi, po = pi+1, 0
		}
	}
	return rs
}
