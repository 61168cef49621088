package engine

import (
	"github.com/tecache/te/engine/transport"
	"strconv"
	"testing"
	"time"
)

// BenchmarkStageMarks is what timing a batch's stages adds per request: the
// marks one submit of n requests and its settle and wake-up make, over n.
// The physical reference beside it is one clock read.
func BenchmarkStageMarks(b *testing.B) {
	e := &Engine{transports: make([]transport.Transport, 1)} // the tasks' (nil) transport is index 0
	for _, n := range []int{1, 128} {
		b.Run("requests="+strconv.Itoa(n), func(b *testing.B) {
			bt := &Batch{e: e, tasks: make([]task, 1), now: time.Now()}
			for i := 0; i < b.N; i++ {
				bt.markHanded(0, n)
				bt.observeTransfer(0)
				bt.observeWakeup()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/req")
		})
	}
	b.Run("clock-read", func(b *testing.B) {
		var sink int64
		for i := 0; i < b.N; i++ {
			sink += monoNow()
		}
		_ = sink
	})
}
