package tcp_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// The Mooncake loop (mcloop.go) serves the data listener whenever the engine
// accepts Mooncake peers; these tests drive it with hand-made Mooncake
// connections.

// closedWithin reads from r until the target closes the connection and
// returns how long that took from t0; it fails the test if the connection
// is still open after limit.
func closedWithin(t *testing.T, r *mcRaw, t0 time.Time, limit time.Duration) time.Duration {
	t.Helper()
	r.nc.SetReadDeadline(t0.Add(limit))
	_, err := io.Copy(io.Discard, r.br)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("connection still open after %v", limit)
	}
	return time.Since(t0)
}

func tcpStat(e *engine.Engine, name string) uint64 { return e.TransportStats()["tcp"][name] }

// TestMooncakeLoopCutsStalledPeers: a Mooncake peer that stops halfway
// through a header, a WRITE's payload, or reading a READ's payload is cut off
// after the handshake or progress timeout, and one that sends nothing after
// a served request after the idle timeout; each cut counts in slow_closed,
// and none comes early.
func TestMooncakeLoopCutsStalledPeers(t *testing.T) {
	const (
		header   = 300 * time.Millisecond
		progress = 400 * time.Millisecond
		idle     = 2500 * time.Millisecond // far from the others: each cut is told apart
		big      = 64 << 20                // more than loopback's socket buffers hold unread
	)
	buf := alloc(t, big)
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"},
		AcceptMooncakePeers: true, Limits: engine.Limits{HandshakeTimeout: header, ProgressTimeout: progress, IdleTimeout: idle}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.RegisterMemory(mem.Addr(buf), big, "cpu", true); err != nil {
		t.Fatal(err)
	}
	ep := net.JoinHostPort("127.0.0.1", strconv.Itoa(e.Descriptor().TCPDataPort))
	base := mem.Addr(buf)
	var hdr [wire.MooncakeHeaderSize]byte
	wire.PutMooncakeRequest(hdr[:], wire.MooncakeRequest{Size: 4096, Addr: base, Op: wire.MooncakeWrite, V2: true})

	cases := []struct {
		name  string
		bound time.Duration
		start func(r *mcRaw)
	}{
		{"first header", header, func(r *mcRaw) { r.nc.Write(hdr[:10]) }},
		{"nothing at all", header, func(*mcRaw) {}},
		{"write payload", progress, func(r *mcRaw) {
			r.send(wire.MooncakeWrite, true, base, 64<<10, make([]byte, 1000))
		}},
		{"read payload unread", progress, func(r *mcRaw) {
			// The reply cannot fit the socket buffers: the target's
			// writes stop once they are full.
			r.send(wire.MooncakeRead, true, base, big, nil)
		}},
		{"idle after a request", idle, func(r *mcRaw) {
			r.send(wire.MooncakeWrite, true, base, 16, make([]byte, 16))
			r.expectStatus(wire.MooncakeOK)
		}},
		{"second header", header, func(r *mcRaw) {
			r.send(wire.MooncakeWrite, true, base, 16, make([]byte, 16))
			r.expectStatus(wire.MooncakeOK)
			r.nc.Write(hdr[:5])
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := dialMc(t, ep)
			before := tcpStat(e, "slow_closed")
			c.start(r)
			t0 := time.Now()
			var took time.Duration
			if c.name == "read payload unread" {
				// Read nothing until the target gave up on it.
				waitFor(t, c.bound+5*time.Second, "the stalled READ cut", func() bool { return tcpStat(e, "slow_closed") > before })
				took = time.Since(t0)
				closedWithin(t, r, t0, c.bound+10*time.Second)
			} else {
				took = closedWithin(t, r, t0, c.bound+5*time.Second)
			}
			if took < c.bound*3/4 || took > c.bound+1500*time.Millisecond {
				t.Errorf("cut after %v, bound %v", took, c.bound)
			}
			if got := tcpStat(e, "slow_closed"); got != uint64(i)+1 {
				t.Errorf("slow_closed %d after %d cuts", got, i+1)
			}
		})
	}
	// The READ cut released its region: unregistering does not wait.
	t0 := time.Now()
	if err := e.UnregisterMemory(base); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > time.Second {
		t.Errorf("unregister took %v after every access was cut", took)
	}
}

// TestMooncakeLoopFraming: requests the loop gets in pieces or together:
// pipelined requests in one segment, a header and payload trickled byte by
// byte, te's preface split in two, and a refusal after requests served on the
// same connection (handed to the goroutine path mid-connection).
func TestMooncakeLoopFraming(t *testing.T) {
	tg := newMcTarget(t, true, nil)
	fill(tg.buf, 0)
	base := mem.Addr(tg.buf)
	a, b := mcPattern(5000, 1), mcPattern(70000, 2)

	// Requests sent together, without waiting for answers, in one write:
	// a small WRITE, a READ of it, then larger WRITEs and a READ of all;
	// the statuses and READ payloads come in order and each READ sees
	// the WRITEs before it.
	r := dialMc(t, tg.data)
	small := mcPattern(100, 4)
	reqs := []struct {
		op      uint8
		addr, n uint64
		p       []byte
	}{
		{wire.MooncakeWrite, base + 80000, 100, small}, {wire.MooncakeRead, base + 80000, 100, nil},
		{wire.MooncakeWrite, base, 5000, a}, {wire.MooncakeWrite, base + 5000, 70000, b}, {wire.MooncakeRead, base, 75000, nil},
	}
	var out []byte
	for _, q := range reqs {
		var h [wire.MooncakeHeaderSize]byte
		wire.PutMooncakeRequest(h[:], wire.MooncakeRequest{Size: q.n, Addr: q.addr, Op: q.op, V2: true})
		out = append(append(out, h[:]...), q.p...)
	}
	if _, err := r.nc.Write(out); err != nil {
		t.Fatal(err)
	}
	for i, q := range reqs {
		r.expectStatus(wire.MooncakeOK)
		if q.op != wire.MooncakeRead {
			continue
		}
		got := make([]byte, q.n)
		if _, err := io.ReadFull(r.br, got); err != nil {
			t.Fatal(err)
		}
		want := small
		if i == 4 {
			want = append(append([]byte{}, a...), b...)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("pipelined request %d: the READ returned other bytes", i)
		}
	}

	// A header and payload one byte per write.
	r = dialMc(t, tg.data)
	var h [wire.MooncakeHeaderSize]byte
	wire.PutMooncakeRequest(h[:], wire.MooncakeRequest{Size: 100, Addr: base + 200000, Op: wire.MooncakeWrite, V2: true})
	c := mcPattern(100, 3)
	for _, x := range append(h[:], c...) {
		if _, err := r.nc.Write([]byte{x}); err != nil {
			t.Fatal(err)
		}
	}
	r.expectStatus(wire.MooncakeOK)
	if !bytes.Equal(tg.buf[200000:200100], c) {
		t.Fatal("trickled WRITE did not land")
	}

	// te's preface in two pieces, the second in one segment with the
	// exchange's first frame: the loop hands all of it to te's path.
	nc, err := net.Dial("tcp", tg.data)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	nc.Write([]byte(wire.DataPreface[:3]))
	time.Sleep(20 * time.Millisecond) // two segments, most likely two reads
	te := &raw{t: t, nc: nc, br: bufio.NewReader(nc)}
	joined := &withFirst{Conn: nc, first: []byte(wire.DataPreface[3:])}
	if _, err := peerauth.Client(peerauth.WithReader(joined, te.br), nil, "raw-initiator", time.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	te.send(wire.DataRead, 1, base+200000, 100, tg.e.Descriptor().Buffers[0].Key, nil)
	if comp, p := te.recv(); comp.Status != errs.OK || !bytes.Equal(p, c) {
		t.Fatalf("te READ through the loop: %+v", comp)
	}

	// Served requests, then one out of range on the same connection: a
	// refusal status, the connection closed, memory unchanged.
	r = dialMc(t, tg.data)
	r.send(wire.MooncakeWrite, true, base+300000, 4, []byte{9, 9, 9, 9})
	r.expectStatus(wire.MooncakeOK)
	before := append([]byte(nil), tg.buf...)
	r.send(wire.MooncakeWrite, true, base+(1<<20)-10, 64<<10, bytes.Repeat([]byte{0xEE}, 64<<10))
	r.expectStatus(wire.MooncakeAddrRejected)
	r.expectClosed()
	if !bytes.Equal(tg.buf, before) {
		t.Fatal("a refused WRITE changed memory")
	}
}

// withFirst sends first with the first Write.
type withFirst struct {
	net.Conn
	first []byte
}

func (w *withFirst) Write(p []byte) (int, error) {
	if w.first != nil {
		b := append(w.first, p...)
		w.first = nil
		_, err := w.Conn.Write(b)
		return len(p), err
	}
	return w.Conn.Write(p)
}

// TestMooncakeLoopRefusals: bad headers on a fresh connection and after a
// served request (the goroutine path then takes over mid-connection): each
// is refused or closed, nothing lands; te's preface, split in two, still
// reaches te's path.
func TestMooncakeLoopRefusals(t *testing.T) {
	tg := newMcTarget(t, true, nil)
	fill(tg.buf, 0x11)
	base := mem.Addr(tg.buf)
	junk := bytes.Repeat([]byte{0x77}, 8192)
	cases := []struct {
		name    string
		op      uint8
		addr, n uint64
		payload []byte
		want    uint32 // 0xffffffff: closed without a status
	}{
		{"one past the end", wire.MooncakeWrite, base + (1 << 20) - 4095, 4096, junk[:4096], wire.MooncakeAddrRejected},
		{"zero length", wire.MooncakeWrite, base, 0, nil, wire.MooncakeAddrRejected},
		{"address wraps", wire.MooncakeWrite, ^uint64(0) - 100, 4096, junk[:4096], wire.MooncakeAddrRejected},
		{"huge length", wire.MooncakeRead, base, 1 << 47, nil, wire.MooncakeAddrRejected},
		// Not a Mooncake header by its first 8 bytes (no registrable
		// size has bytes 6 and 7 set): not te's preface either, closed.
		{"length wraps", wire.MooncakeWrite, base + 4096, ^uint64(0) - 4000, junk, 0xffffffff},
		{"private", wire.MooncakeWrite, mem.Addr(tg.private), 8, junk[:8], wire.MooncakeAddrRejected},
		{"version 1", wire.MooncakeWrite, base, 8, junk[:8], 0xffffffff},
	}
	for _, served := range []bool{false, true} {
		for _, c := range cases {
			r := dialMc(t, tg.data)
			if served {
				r.send(wire.MooncakeRead, true, base, 8, nil)
				r.expectStatus(wire.MooncakeOK)
				if _, err := io.ReadFull(r.br, make([]byte, 8)); err != nil {
					t.Fatal(err)
				}
			}
			r.send(c.op, c.name != "version 1", c.addr, c.n, c.payload)
			if c.want != 0xffffffff {
				if got, ok := r.status(); !ok || got != c.want {
					t.Fatalf("%s (after a served request: %v): status %d (read: %v), want %d", c.name, served, got, ok, c.want)
				}
			}
			r.expectClosed()
		}
	}
	if !bytes.Equal(tg.buf, bytes.Repeat([]byte{0x11}, len(tg.buf))) || !bytes.Equal(tg.private, make([]byte, 4096)) {
		t.Fatal("a refused request changed memory")
	}
}

// TestMooncakeLoopConnLimit: the per-address bound holds on the loop: past
// it a connection is refused (an auth frame saying busy, then closed) and
// counted; a freed slot is taken again.
func TestMooncakeLoopConnLimit(t *testing.T) {
	tg := newMcTarget(t, true, func(c *engine.Config) { c.Limits.MaxConnsPerHost = 2 })
	held := []*mcRaw{dialMc(t, tg.data), dialMc(t, tg.data)}
	for _, r := range held { // both admitted and served
		r.send(wire.MooncakeWrite, true, mem.Addr(tg.buf), 1, []byte{1})
		r.expectStatus(wire.MooncakeOK)
	}
	r := dialMc(t, tg.data)
	kind, _, err := wire.ReadFrame(r.br, 1<<10)
	if err != nil || kind != wire.KindAuth {
		t.Fatalf("third connection: frame kind %#x, %v; want a refusal", kind, err)
	}
	r.expectClosed()
	if n := tcpStat(tg.e, "conns_refused_per_host"); n != 1 {
		t.Fatalf("conns_refused_per_host %d, want 1", n)
	}
	held[0].nc.Close()
	waitFor(t, 5*time.Second, "the slot freed", func() bool { return tcpStat(tg.e, "conns_open") == 1 })
	r = dialMc(t, tg.data)
	r.send(wire.MooncakeWrite, true, mem.Addr(tg.buf), 1, []byte{2})
	r.expectStatus(wire.MooncakeOK)
}

// TestMooncakeLoopUnregisterCutsUnreadRead: a READ whose payload the peer
// does not read holds its buffer; UnregisterMemory cuts it after its grace.
func TestMooncakeLoopUnregisterCutsUnreadRead(t *testing.T) {
	const grace, big = 300 * time.Millisecond, 64 << 20
	buf := alloc(t, big)
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"},
		AcceptMooncakePeers: true, UnregisterGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.RegisterMemory(mem.Addr(buf), big, "cpu", true); err != nil {
		t.Fatal(err)
	}
	r := dialMc(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(e.Descriptor().TCPDataPort)))
	r.send(wire.MooncakeRead, true, mem.Addr(buf), big, nil)
	r.expectStatus(wire.MooncakeOK) // the reply began: the region is held
	t0 := time.Now()
	if err := e.UnregisterMemory(mem.Addr(buf)); err != nil {
		t.Fatalf("unregister with an unread Mooncake READ: %v", err)
	}
	if took := time.Since(t0); took > grace+2*time.Second {
		t.Errorf("unregister took %v (grace %v)", took, grace)
	}
	if n, _ := io.Copy(io.Discard, r.br); n >= big {
		t.Fatal("the whole READ arrived although it was cut")
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ds)
}

// TestMooncakeLoopCloseMidRequest: Close with the loop's connections in
// every state (a header half read, a WRITE half read, a READ's payload
// unread, idle between requests, te's preface half sent) returns promptly,
// closes each of them, and leaves no descriptor and no goroutine behind.
func TestMooncakeLoopCloseMidRequest(t *testing.T) {
	const big = 64 << 20
	buf := alloc(t, big)
	start := func() *engine.Engine {
		e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"},
			AcceptMooncakePeers: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.RegisterMemory(mem.Addr(buf), big, "cpu", true); err != nil {
			t.Fatal(err)
		}
		return e
	}
	start().Close() // whatever the runtime opens once, opened before counting
	fds, gs := openFDs(t), runtime.NumGoroutine()

	e := start()
	ep := net.JoinHostPort("127.0.0.1", strconv.Itoa(e.Descriptor().TCPDataPort))
	base := mem.Addr(buf)
	var rs []*mcRaw
	open := func() *mcRaw {
		r := dialMc(t, ep)
		rs = append(rs, r)
		return r
	}
	var h [wire.MooncakeHeaderSize]byte
	wire.PutMooncakeRequest(h[:], wire.MooncakeRequest{Size: 64, Addr: base, Op: wire.MooncakeRead, V2: true})
	open().nc.Write(h[:9])
	open().send(wire.MooncakeWrite, true, base, 1<<20, make([]byte, 1000))
	unread := open()
	unread.send(wire.MooncakeRead, true, base, big, nil)
	unread.expectStatus(wire.MooncakeOK)
	idle := open()
	idle.send(wire.MooncakeWrite, true, base, 1, []byte{1})
	idle.expectStatus(wire.MooncakeOK)
	open().nc.Write([]byte(wire.DataPreface[:4]))
	waitFor(t, 5*time.Second, "every connection accepted", func() bool { return tcpStat(e, "conns_open") == uint64(len(rs)) })

	t0 := time.Now()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("Close took %v", took)
	}
	for i, r := range rs {
		r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.Copy(io.Discard, r.br)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("connection %d still open after Close", i)
		}
		r.nc.Close()
	}
	waitFor(t, 5*time.Second, "descriptors and goroutines back to their count before the engine", func() bool {
		return openFDs(t) <= fds && runtime.NumGoroutine() <= gs
	})
}

// TestMooncakeLoopFairTurns: a peer that streams requests without pause
// (1-byte WRITEs, pipelined) does not hold the loop: another peer's
// requests are answered meanwhile.
func TestMooncakeLoopFairTurns(t *testing.T) {
	tg := newMcTarget(t, true, nil)
	base := mem.Addr(tg.buf)
	hog := dialMc(t, tg.data)
	hog.nc.SetDeadline(time.Now().Add(time.Minute))
	// 25 bytes per request, 256 KiB of them per write.
	var one [wire.MooncakeHeaderSize + 1]byte
	wire.PutMooncakeRequest(one[:], wire.MooncakeRequest{Size: 1, Addr: base, Op: wire.MooncakeWrite, V2: true})
	chunk := bytes.Repeat(one[:], (256<<10)/len(one))
	stop := make(chan struct{})
	done := make(chan struct{}, 2)
	go func() { // the hog's requests
		defer func() { done <- struct{}{} }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := hog.nc.Write(chunk); err != nil {
				return
			}
		}
	}()
	go func() { // and its statuses, read as fast as they come
		defer func() { done <- struct{}{} }()
		io.Copy(io.Discard, hog.nc)
	}()
	defer func() {
		close(stop)
		hog.nc.Close()
		<-done
		<-done
	}()
	waitFor(t, 10*time.Second, "the hog served", func() bool { return tg.e.TransportStats()["tcp"]["mooncake_served"] > 10000 })
	for i := 0; i < 20; i++ {
		r := dialMc(t, tg.data)
		r.nc.SetDeadline(time.Now().Add(5 * time.Second))
		r.send(wire.MooncakeRead, true, base+4096, 8, nil)
		if c, ok := r.status(); !ok || c != wire.MooncakeOK {
			t.Fatalf("request %d beside the hog: status %d, read %v", i, c, ok)
		}
		r.nc.Close()
	}
}
