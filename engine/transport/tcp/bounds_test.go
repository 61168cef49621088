package tcp_test

import (
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/engine/transport/tcp"
	"github.com/tecache/te/internal/sys/mem"
)

// TestDataPortConnectionFlood: 10,000 connections from one address that never
// send a byte. The listener admits at most its per-address bound, refuses the
// rest at once, closes the admitted ones after the handshake timeout, and a
// client from another address transfers throughout. Goroutines come back.
func TestDataPortConnectionFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("opens thousands of sockets")
	}
	h := newFakeHost(map[string]string{
		"limits.max_conns": "200", "limits.max_conns_per_host": "50",
		"limits.handshake_timeout": "500ms", "limits.idle_timeout": "500ms",
	})
	buf := alloc(t, 1<<20)
	r, _ := segment.NewRegion(mem.Addr(buf), 1<<20, "cpu", true)
	h.reg.Add(r)
	tg := tcp.New()
	if err := tg.Start(h); err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	d := &segment.Desc{Name: "t", Instance: "fake", Buffers: []segment.BufferDesc{r.Desc}}
	tg.Describe(d)
	ep := d.Endpoints["tcp"]
	base := runtime.NumGoroutine()

	// The flood comes from 127.0.0.2; the legitimate client from 127.0.0.1.
	dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	flood := 10000
	if lim := raiseNoFile(t); uint64(flood)+500 > lim {
		flood = int(lim) - 500
		t.Logf("RLIMIT_NOFILE %d: %d connections", lim, flood)
	}
	conns := make([]net.Conn, 0, flood)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < flood; i++ {
		c, err := dialer.Dial("tcp", ep)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	// Refused ones get a few bytes and EOF; admitted ones hear nothing
	// until their handshake times out.
	var mu sync.Mutex
	closedEarly := 0
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func(c net.Conn) {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if _, err := io.ReadAll(c); err == nil {
				mu.Lock()
				closedEarly++
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	if closedEarly < flood-50 {
		t.Fatalf("%d of %d flood connections refused at once, want all but 50", closedEarly, flood)
	}
	if g := runtime.NumGoroutine(); g > base+2*50+20 {
		t.Errorf("%d goroutines during the flood (%d before): not bounded by the per-address limit", g, base)
	}

	// A legitimate client still gets through.
	local := alloc(t, 4096)
	lh := newFakeHost(nil)
	lr, _ := segment.NewRegion(mem.Addr(local), 4096, "cpu", false)
	lh.reg.Add(lr)
	in := tcp.New()
	if err := in.Start(lh); err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	done := make(chan error, 1)
	in.Submit([]transport.Request{{Op: transport.Read, Local: mem.Addr(local), Remote: r.Addr, Length: 4096, Peer: d,
		Buffer: &d.Buffers[0], Key: r.Desc.Key, Region: lr, Owner: transport.DoneFunc(func(err error) { done <- err })}})
	if err := <-done; err != nil {
		t.Fatalf("legitimate read during the flood: %v", err)
	}

	// The admitted flood connections are closed by the handshake timeout
	// and the goroutines go back.
	deadline := time.Now().Add(10 * time.Second)
	for tg.Stats()["conns_open"] > 2 { // the legitimate client's
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open after the handshake timeout", tg.Stats()["conns_open"])
		}
		time.Sleep(20 * time.Millisecond)
	}
	st := tg.Stats()
	// Admitted ones were closed by the handshake timeout while the flood
	// was still dialling, making room for others: count the peak.
	if st["conns_peak"] > 50+1 || st["conns_refused_per_host"] < uint64(flood/2) {
		t.Fatalf("stats %v", st)
	}
	t.Logf("stats after the flood: %v", st)
}

// raiseNoFile lifts the soft limit on open files to the hard one and returns
// it.
func raiseNoFile(t *testing.T) uint64 {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
			t.Fatal(err)
		}
	}
	return r.Cur
}
