package fabric_test

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/fabric"
	"github.com/tecache/te/internal/sys/mem"
)

// rssKiB is this process's resident set (VmRSS).
func rssKiB(b *testing.B) int {
	s, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// BenchmarkPeerEndpoint measures what a new peer costs over the tcp
// provider: the first 4 KiB read to a fresh engine (its endpoint opened,
// addresses exchanged, rxm's connection formed) and the memory the
// initiator's side of it adds (bench/README.md, "fabric: what a peer
// costs"). FI_OFI_RXM_MSG_RX_SIZE=4096 FI_OFI_RXM_BUFFER_SIZE=16384 in the
// environment measures rxm's own defaults instead of te's.
func BenchmarkPeerEndpoint(b *testing.B) {
	p := map[string]string{"fabric.provider": "tcp"}
	if _, err := fabric.Probe("127.0.0.1", "tcp"); err != nil {
		b.Skipf("fabric over tcp unavailable: %v", err)
	}
	mk := func() *engine.Engine {
		e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", ForceTransport: fabric.Name, Params: p,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		return e
	}
	a := mk()
	defer a.Close()
	buf := mem.MustAlloc(2 << 20)
	defer mem.Free(buf)
	local, remote := mem.Addr(buf), mem.Addr(buf)+1<<20
	if err := a.RegisterMemory(local, 1<<20, "cpu:0", false); err != nil {
		b.Fatal(err)
	}
	var first time.Duration
	grew := 0
	for i := 0; i < b.N; i++ {
		peer := mk()
		defer peer.Close()
		if err := peer.RegisterMemory(remote, 1<<20, "cpu:0", true); err != nil {
			b.Fatal(err)
		}
		seg, err := a.OpenSegment(peer.Name())
		if err != nil {
			b.Fatal(err)
		}
		before := rssKiB(b)
		bt, err := a.AllocateBatch(1)
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if err := bt.Submit(engine.Request{Op: engine.Read, Local: local, Segment: seg, Remote: remote, Length: 4096}); err != nil {
			b.Fatal(err)
		}
		if st, err := bt.Wait(30 * time.Second); err != nil || st.State != engine.Completed {
			b.Fatalf("%+v %v", st, err)
		}
		first += time.Since(t0)
		grew += rssKiB(b) - before
		bt.Free()
	}
	b.ReportMetric(float64(first.Microseconds())/1000/float64(b.N), "first-ms/peer")
	b.ReportMetric(float64(grew)/1024/float64(b.N), "MiB/peer")
}
