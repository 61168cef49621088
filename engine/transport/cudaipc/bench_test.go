package cudaipc_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/cudaipc"
	"github.com/tecache/te/internal/sys/gpu/gputest"
)

// BenchmarkGPURequests is the cost per request of GPU-to-GPU writes
// between two processes over cudaipc, once per runtime (cuda, hip): 64
// requests of 4 KiB and 8 of 1 MiB per batch, into the child's buffer
// through its IPC handle. The physical reference in the same run is the
// runtime's own device-to-device copy of the same bytes, one stream
// synchronisation per batch, as te's copies are: te/copy says what te adds.
// On the fakes the copies are memmoves, so what it measures is te's and the
// runtime binding's cost per request; with TE_CUDA_REAL=1 (TE_HIP_REAL=1)
// on a GPU machine it is the real thing.
func BenchmarkGPURequests(b *testing.B) {
	for _, v := range gputest.Vendors() {
		for _, c := range []struct{ size, batch uint64 }{{4 << 10, 64}, {1 << 20, 8}} {
			b.Run(fmt.Sprintf("%s/%dKiB", v.Kind, c.size>>10), func(b *testing.B) {
				if err := v.Ready(); err != nil {
					b.Skipf("no %s runtime and no fake: %v", v.Kind, err)
				}
				drv := v.Driver(b)
				b.Setenv(gputest.EnvKind, v.Kind)
				n := c.size * c.batch
				g, err := newGPU(v, n)
				if err != nil {
					b.Fatal(err)
				}
				defer g.free()
				ref, err := newGPU(v, n)
				if err != nil {
					b.Fatal(err)
				}
				defer ref.free()
				e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", ForceTransport: cudaipc.Name})
				if err != nil {
					b.Fatal(err)
				}
				defer e.Close()
				if err := e.RegisterMemory(g.addr, n, v.Location(0), false); err != nil {
					b.Fatal(err)
				}
				ch := startChild(b)
				seg, err := e.OpenSegment(ch.name)
				if err != nil {
					b.Fatal(err)
				}
				reqs := make([]engine.Request, c.batch)
				for i := range reqs {
					off := uint64(i) * c.size
					reqs[i] = engine.Request{Op: engine.Write, Local: g.addr + off, Segment: seg, Remote: ch.addr + off, Length: c.size}
				}
				bt, err := e.AllocateBatch(len(reqs))
				if err != nil {
					b.Fatal(err)
				}
				defer bt.Free()
				batch := func() {
					if err := bt.Reset(); err != nil {
						b.Fatal(err)
					}
					if err := bt.Submit(reqs...); err != nil {
						b.Fatal(err)
					}
					if st, err := bt.Wait(30 * time.Second); err != nil || st.State != engine.Completed {
						b.Fatalf("%+v %v", st, err)
					}
				}
				batch() // mapping, streams and first touch
				if err := copyDtoD(drv, ref.addr, g.addr, n); err != nil {
					b.Fatal(err)
				}
				var te, cp time.Duration
				for b.Loop() {
					t0 := time.Now()
					batch()
					t1 := time.Now()
					if err := copyDtoD(drv, ref.addr, g.addr, n); err != nil {
						b.Fatal(err)
					}
					te, cp = te+t1.Sub(t0), cp+time.Since(t1)
				}
				reqsDone := float64(b.N) * float64(c.batch)
				b.ReportMetric(float64(te.Nanoseconds())/reqsDone, "ns/req")
				b.ReportMetric(float64(cp.Nanoseconds())/reqsDone, "copy-ns/req")
				b.ReportMetric(float64(te)/float64(cp), "te/copy")
			})
		}
	}
}
