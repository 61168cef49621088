package rdma_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Benchmarks of the multi-rail and failover behaviour between two
// processes on the fake fabric (hgx8 tree). Each iteration is a whole
// experiment of a few seconds; run them with -benchtime=1x:
//
//	go test -run '^$' -bench 'Fabric(SlowRail|Failover)' -benchtime 1x ./engine/transport/rdma/

// fabricPair starts two nodes with a buffer of size each at loc, and opens
// b's segment on a.
func fabricPair(b *testing.B, loc string, size uint64, env ...string) (*fabricSetup, *node, *node, uint64, uint64) {
	f := newFabricSetup(b, "hgx8")
	x, y := f.startNode(env...), f.startNode(env...)
	src := x.addr("alloc cpu %d", size)
	dst := y.addr("alloc cpu %d", size)
	x.do("reg %d %d %s", src, size, loc)
	y.do("reg %d %d %s", dst, size, loc)
	x.do("open %s", y.name)
	return f, x, y, src, dst
}

// BenchmarkFabricSlowRail: 8 rails (memory registered as plain "cpu", every
// NIC near it) at 50 MB/s each, then one of them slowed to 5 MB/s. The
// weighted split should lose at most that rail's share (1/8 of the
// aggregate, 0.875x); an even split would fall to the slow rail's pace
// (about 0.1x).
func BenchmarkFabricSlowRail(b *testing.B) {
	const rate, block, per = 50_000_000, 1 << 20, 8
	for i := 0; i < b.N; i++ {
		f, x, y, src, dst := fabricPair(b, "cpu", per*block)
		f.control(fmt.Sprintf("* rate %d", rate))
		x.stream(y.name, src, dst, block, per, time.Second) // warm up: endpoints, rates
		all := x.stream(y.name, src, dst, block, per, 3*time.Second)
		f.control(fmt.Sprintf("* rate %d", rate), fmt.Sprintf("mlx5_3 rate %d", rate/10))
		x.stream(y.name, src, dst, block, per, time.Second) // the estimate follows
		before := x.stats()
		slow := x.stream(y.name, src, dst, block, per, 3*time.Second)
		l, _ := railBytes(diff(before, x.stats()))
		a1 := float64(all.Bytes) / all.Seconds
		a2 := float64(slow.Bytes) / slow.Seconds
		b.ReportMetric(a1/1e6, "MB/s-8-rails")
		b.ReportMetric(a2/1e6, "MB/s-one-slowed")
		b.ReportMetric(a2/a1, "x-aggregate")
		b.ReportMetric(float64(l["mlx5_3"])/float64(sumOf(l)), "slow-rail-share")
	}
}

func sumOf(m map[string]uint64) uint64 {
	var s uint64
	for _, v := range m {
		s += v
	}
	return s
}

// BenchmarkFabricFailover: a stream of 1 MiB batches (16 x 64 KiB) over the
// four rails of socket 0 at 100 MB/s each; 1.5 s in, mlx5_1's link goes
// down (its work requests are retransmitted until the retry timer, about
// 0.5 s, runs out, as on hardware). The stall
// is the longest batch around the failure (from it until 500 ms after every
// process applied it) less the median batch before it: the time a transfer
// waits for the failed rail's slices to fail over. The longest batch of the
// same span before the failure, less the median, is the machine's noise.
func BenchmarkFabricFailover(b *testing.B) {
	const rate, block, per = 100_000_000, 64 << 10, 16
	for i := 0; i < b.N; i++ {
		f, x, y, src, dst := fabricPair(b, "cpu:0", per*block)
		f.control(fmt.Sprintf("* rate %d", rate))
		x.stream(y.name, src, dst, block, per, 500*time.Millisecond)
		var failedAt time.Duration
		done := make(chan streamResult)
		t0 := time.Now()
		go func() { done <- x.stream(y.name, src, dst, block, per, 4*time.Second) }()
		time.Sleep(1500 * time.Millisecond)
		failedAt = time.Since(t0)
		f.control(fmt.Sprintf("* rate %d", rate), "mlx5_1 down")
		applied := time.Since(t0)
		r := <-done
		// After: batches that started before the failure was applied
		// everywhere plus 500 ms; the same span just before the failure
		// says how long batches take anyway on this machine (noise).
		var before, after, quiet []int64
		window := applied - failedAt + 500*time.Millisecond
		for k, end := range r.EndUS {
			e := time.Duration(end) * time.Microsecond
			start := e - time.Duration(r.LatUS[k])*time.Microsecond
			switch {
			case e < failedAt:
				before = append(before, r.LatUS[k])
				if e > failedAt-window {
					quiet = append(quiet, r.LatUS[k])
				}
			case start < failedAt+window:
				after = append(after, r.LatUS[k])
			}
		}
		if len(quiet) == 0 || len(after) == 0 {
			b.Fatalf("%d batches before the failure, %d after", len(before), len(after))
		}
		var around []string
		for k, end := range r.EndUS {
			if t := time.Duration(end) * time.Microsecond; t > failedAt-20*time.Millisecond && t < applied+100*time.Millisecond {
				around = append(around, fmt.Sprintf("%.1f@%.0f", float64(r.LatUS[k])/1e3, float64(end)/1e3))
			}
		}
		b.Logf("failed at %v, applied at %v; batches around (latency ms @ end ms): %v", failedAt, applied, around)
		slices.Sort(before)
		med := before[len(before)/2]
		stall := slices.Max(after) - med
		b.ReportMetric(float64(med)/1e3, "ms-median-batch")
		b.ReportMetric(float64(stall)/1e3, "ms-stall")
		b.ReportMetric(float64(slices.Max(quiet)-med)/1e3, "ms-noise-before")
		st := x.stats()
		b.ReportMetric(float64(st["nic.mlx5_1.retries"]), "slices-retried")
		// Endpoint failures on rails with mlx5_1 at neither end: the
		// watchdog's mistakes on a loaded host (each costs a detour, not
		// data).
		var others uint64
		for k, v := range st {
			if name, ok := strings.CutSuffix(k, ".errors"); ok && strings.HasPrefix(k, "rail.") && !strings.Contains(name, "mlx5_1") {
				others += v
			}
		}
		b.ReportMetric(float64(others), "errors-healthy-rails")
	}
}
