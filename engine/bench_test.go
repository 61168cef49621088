package engine_test

import (
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
)

// BenchmarkSubmitWait4KiB measures one request of 4 KiB through the local
// transport (submit, memcpy, completion, wait) per iteration, and beside it
// a plain copy of the same bytes: the difference is the engine's cost.
func BenchmarkSubmitWait4KiB(b *testing.B) {
	const n = 4096
	for _, batchSize := range []int{1, 128} {
		b.Run("engine/batch="+itoa(batchSize), func(b *testing.B) {
			a, t := newEngine(b), newEngine(b)
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
			b.ResetTimer()
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
	}
	b.Run("memcpy", func(b *testing.B) {
		src, dst := alloc(b, n), alloc(b, n)
		b.SetBytes(n)
		for i := 0; i < b.N; i++ {
			copy(dst, src)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/req")
	})
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}
