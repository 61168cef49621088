package engine_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/sys/mem"
)

// BenchmarkSubmitWait4KiB measures one request of 4 KiB through the local
// transport (submit, memcpy, completion, wait) per iteration, and beside it
// a plain copy of the same bytes: the difference is the engine's cost.
func BenchmarkSubmitWait4KiB(b *testing.B) {
	const n = 4096
	for _, batchSize := range []int{1, 128} {
		b.Run("engine/batch="+itoa(batchSize), func(b *testing.B) {
			a, t := newEngine(b, quiet), newEngine(b, quiet)
			src, dst := alloc(b, n*batchSize), alloc(b, n*batchSize)
			a.RegisterMemory(mem.Addr(src), uint64(len(src)), "cpu", false)
			t.RegisterMemory(mem.Addr(dst), uint64(len(dst)), "cpu", true)
			seg, err := a.OpenSegment(t.Name())
			if err != nil {
				b.Fatal(err)
			}
			reqs := make([]engine.Request, batchSize)
			for i := range reqs {
				reqs[i] = engine.Request{Op: engine.Write, Local: mem.Addr(src) + uint64(i*n), Segment: seg, Remote: mem.Addr(dst) + uint64(i*n), Length: n}
			}
			b.SetBytes(int64(n * batchSize))
			b.Run("allocate-free", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					batch, _ := a.AllocateBatch(batchSize)
					if err := batch.Submit(reqs...); err != nil {
						b.Fatal(err)
					}
					if st, err := batch.Wait(time.Second); err != nil || st.State != engine.Completed {
						b.Fatal(st, err)
					}
					batch.Free()
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batchSize), "ns/req")
			})
			b.Run("reset", func(b *testing.B) {
				batch, _ := a.AllocateBatch(batchSize)
				defer batch.Free()
				for i := 0; i < b.N; i++ {
					if err := batch.Submit(reqs...); err != nil {
						b.Fatal(err)
					}
					if st, err := batch.Wait(time.Second); err != nil || st.State != engine.Completed {
						b.Fatal(st, err)
					}
					batch.Reset()
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batchSize), "ns/req")
			})
			// The physical reference: the same copies, as plain memcpy.
			b.Run("memcpy", func(b *testing.B) {
				b.SetBytes(int64(n * batchSize))
				for i := 0; i < b.N; i++ {
					for k := 0; k < batchSize; k++ {
						copy(dst[k*n:(k+1)*n], src[k*n:(k+1)*n])
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batchSize), "ns/req")
			})
		})
	}
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

// BenchmarkScale measures the per-request cost (local transport, 4 KiB,
// batch 128, a reused batch) with one registered buffer and one open
// segment, and again with 10,000 buffers registered on each side and 1,000
// segments open: lookups are O(log n) and nothing scans the peers, so the
// second should stay within 1.2x of the first.
func BenchmarkScale(b *testing.B) {
	const n, batchSize = 4096, 128
	for _, sc := range []struct {
		name           string
		buffers, peers int
	}{{"buffers=1/segments=1", 1, 1}, {"buffers=10000/segments=1000", 10000, 1000}} {
		b.Run(sc.name, func(b *testing.B) {
			store := "mem://scale-" + itoa(sc.buffers)
			a := newEngine(b, quiet, func(c *engine.Config) { c.Metadata = store; c.SegmentName = "a" })
			t := newEngine(b, quiet, func(c *engine.Config) { c.Metadata = store; c.SegmentName = "t" })
			// Each side registers its buffers in one call: the data
			// buffers last, at the highest addresses, among the others.
			span := (sc.buffers + batchSize) * n
			src, dst := alloc(b, span), alloc(b, span)
			var ra, rt []engine.MemoryRegion
			for i := 0; i < sc.buffers-1; i++ {
				ra = append(ra, engine.MemoryRegion{Addr: mem.Addr(src) + uint64(i*n), Length: n, Location: "cpu"})
				rt = append(rt, engine.MemoryRegion{Addr: mem.Addr(dst) + uint64(i*n), Length: n, Location: "cpu", Remote: true})
			}
			base := uint64(sc.buffers * n)
			ra = append(ra, engine.MemoryRegion{Addr: mem.Addr(src) + base, Length: batchSize * n, Location: "cpu"})
			rt = append(rt, engine.MemoryRegion{Addr: mem.Addr(dst) + base, Length: batchSize * n, Location: "cpu", Remote: true})
			if err := a.RegisterMemoryBatch(ra); err != nil {
				b.Fatal(err)
			}
			if err := t.RegisterMemoryBatch(rt); err != nil {
				b.Fatal(err)
			}
			// Other segments, open: descriptors of engines that exist
			// only in the store.
			st, _ := meta.Open(store)
			for i := 1; i < sc.peers; i++ {
				name := "peer-" + itoa(i)
				d := &segment.Desc{Name: name, Protocol: "tcp", Buffers: []segment.BufferDesc{}, Instance: name}
				enc, _ := d.Encode()
				st.Put(context.Background(), meta.KeyRAM(name), enc)
				if _, err := a.OpenSegment(name); err != nil {
					b.Fatal(err)
				}
			}
			seg, err := a.OpenSegment("t")
			if err != nil {
				b.Fatal(err)
			}
			reqs := make([]engine.Request, batchSize)
			for i := range reqs {
				off := base + uint64(i*n)
				reqs[i] = engine.Request{Op: engine.Write, Local: mem.Addr(src) + off, Segment: seg, Remote: mem.Addr(dst) + off, Length: n, Transport: "local"}
			}
			batch, _ := a.AllocateBatch(batchSize)
			defer batch.Free()
			b.SetBytes(n * batchSize)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := batch.Submit(reqs...); err != nil {
					b.Fatal(err)
				}
				if st, err := batch.Wait(time.Second); err != nil || st.State != engine.Completed {
					b.Fatal(st, err)
				}
				batch.Reset()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batchSize), "ns/req")
		})
	}
}

// quiet keeps an engine's log lines out of benchmark output.
func quiet(c *engine.Config) { c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil)) }
