package engine_test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// sampler records the peak of the heap in use and of the goroutine count
// while an attack runs.
type sampler struct {
	stop     chan struct{}
	done     chan struct{}
	peakHeap atomic.Uint64
	peakG    atomic.Int64
}

func sample(every time.Duration) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		var ms runtime.MemStats
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > s.peakHeap.Load() {
				s.peakHeap.Store(ms.HeapInuse)
			}
			if g := int64(runtime.NumGoroutine()); g > s.peakG.Load() {
				s.peakG.Store(g)
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) end() (heap uint64, goroutines int) {
	close(s.stop)
	<-s.done
	return s.peakHeap.Load(), int(s.peakG.Load())
}

func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// settle waits until the goroutines and file descriptors are back near
// their counts before an attack.
func settle(t *testing.T, what string, g0, fd0 int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		g, fd := runtime.NumGoroutine(), openFDs(t)
		if g <= g0+5 && fd <= fd0+5 {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%s: %d goroutines (before %d), %d fds (before %d)\n%s", what, g, g0, fd, fd0, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rawPeer dials addr from the loopback address src and runs the exchange as
// instance inst without a secret (so with no session), as a hostile but
// well-formed peer would before misbehaving; rawSessionPeer does it with one.
func rawPeer(t testing.TB, addr, src string, inst string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peerauth.Client(c, nil, inst, time.Now().Add(5*time.Second)); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// legit keeps a legitimate peer's calls going during an attack and counts
// failures.
type legit struct {
	stop     chan struct{}
	done     chan struct{}
	ok, fail atomic.Int64
	lastErr  atomic.Value
}

func keepCalling(from, to *engine.Engine) *legit {
	l := &legit{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			_, err := from.Probe(to.Name())
			if err == nil {
				_, err = from.OpenSegment(to.Name())
			}
			if err != nil {
				l.fail.Add(1)
				l.lastErr.Store(err.Error())
			} else {
				l.ok.Add(1)
			}
			select {
			case <-l.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return l
}

func (l *legit) check(t *testing.T) {
	t.Helper()
	close(l.stop)
	<-l.done
	if l.fail.Load() != 0 || l.ok.Load() < 3 {
		t.Fatalf("legitimate calls during the attack: %d ok, %d failed (last: %v)", l.ok.Load(), l.fail.Load(), l.lastErr.Load())
	}
}

// TestStalledFramesBoundedHeap is issue 13's first row: 80 connections each
// announce a 64 MiB frame and send all but its last byte; it used to hold
// 5.37 GB. Beside them, connections announce frames within their kind's
// limit (a 64 KiB call, a 16 MiB notification) and stall the same way.
func TestStalledFramesBoundedHeap(t *testing.T) {
	tg := newEngine(t, func(c *engine.Config) { c.Limits.ProgressTimeout = 500 * time.Millisecond })
	a := newEngine(t)
	if _, err := a.Probe(tg.Name()); err != nil {
		t.Fatal(err)
	}
	g0, fd0 := runtime.NumGoroutine(), openFDs(t)
	h0 := heapInuse()
	l := keepCalling(a, tg)
	s := sample(10 * time.Millisecond)

	const big = 64 << 20
	payload := make([]byte, 1<<20) // sent over and over: the attacker's memory stays small
	stall := func(c net.Conn, kind uint8, n uint64) {
		var h [wire.FrameHeaderSize + wire.CallHeaderSize]byte
		binary.LittleEndian.PutUint64(h[:], n+1)
		h[wire.OffFrameKind] = kind
		if _, err := c.Write(h[:]); err != nil {
			return
		}
		for left := n - wire.CallHeaderSize - 1; left > 0; {
			k := min(left, uint64(len(payload)))
			if _, err := c.Write(payload[:k]); err != nil {
				return // the engine closed the connection: what we want
			}
			left -= k
		}
	}
	var wg sync.WaitGroup
	var conns []net.Conn
	var mu sync.Mutex
	attackOne := func(i int, kind uint8, n uint64) {
		defer wg.Done()
		c := rawPeer(t, tg.RPCAddr(), "127.0.0.2", fmt.Sprintf("atk-%d", i))
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		stall(c, kind, n)
	}
	for i := 0; i < 80; i++ {
		wg.Add(1)
		go attackOne(i, wire.KindDescribe, big)
	}
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go attackOne(100+i, wire.KindProbe, wire.RequestLimit(wire.KindProbe))
	}
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go attackOne(200+i, wire.KindNotify, wire.MaxNotifyBody)
	}
	wg.Wait()
	// Every stalled connection is cut: the oversize ones at once, the
	// others when their body made no progress for ProgressTimeout.
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("a stalled connection was not closed: %v", err)
		}
		c.Close()
	}
	peak, _ := s.end()
	l.check(t)
	if grew := int64(peak) - int64(h0); grew > 96<<20 {
		t.Fatalf("heap in use grew by %d MiB during the attack", grew>>20)
	}
	st := tg.Stats().Control
	if st.RefusedFrames < 80 || st.SlowClosed < 40 || st.RefusedNotifies < 1 {
		t.Fatalf("stats %+v", st)
	}
	settle(t, "after the attack", g0, fd0)
	// The legitimate caller's connection stays; a second one it may have
	// dialled and dropped is counted out once the engine reads its EOF.
	waitFor(t, "the control plane back to one connection", func() bool {
		st := tg.Stats().Control
		return st.NotifyBytes == 0 && st.ConnsOpen == 1
	})
}

// TestPipelinedCallsBoundedGoroutines is issue 13's second row: 200k
// Describe calls pipelined on one connection made 189k goroutines.
func TestPipelinedCallsBoundedGoroutines(t *testing.T) {
	const calls = 200_000
	tg := target(t, func(c *engine.Config) { c.Limits.ProgressTimeout = 500 * time.Millisecond })
	a := newEngine(t)
	if _, err := a.Probe(tg.Name()); err != nil {
		t.Fatal(err)
	}
	g0, fd0 := runtime.NumGoroutine(), openFDs(t)
	l := keepCalling(a, tg)
	s := sample(2 * time.Millisecond)

	c := rawPeer(t, tg.RPCAddr(), "127.0.0.2", "pipeliner")
	var replies atomic.Int64
	readDone := make(chan error, 1)
	go func() {
		r := bufio.NewReaderSize(c, 1<<20)
		for replies.Load() < calls {
			kind, n, err := wire.ReadFrameHeader(r)
			if err != nil {
				readDone <- err
				return
			}
			body, err := wire.ReadBody(r, n, nil)
			if err != nil {
				readDone <- err
				return
			}
			if call, err := wire.DecodeCall(body); kind != wire.KindDescribe || err != nil || call.Flags != wire.FlagReplyOK {
				readDone <- fmt.Errorf("reply kind %#x flags %d: %v", kind, call.Flags, err)
				return
			}
			replies.Add(1)
		}
		readDone <- nil
	}()
	w := bufio.NewWriterSize(c, 1<<16)
	for i := uint64(1); i <= calls; i++ {
		w.Write(describeFrame(i))
	}
	w.Flush()
	if err := <-readDone; err != nil {
		t.Fatalf("after %d replies: %v", replies.Load(), err)
	}
	_, peakG := s.end()
	l.check(t)
	// The bound: this connection's calls (64), the legitimate peer's, the
	// test's own goroutines.
	if peakG > g0+engine.DefaultMaxCallsPerConn+16 {
		t.Fatalf("%d goroutines at the peak (%d before)", peakG, g0)
	}
	if st := tg.Stats().Control; st.CallsThrottled == 0 {
		t.Fatalf("the reader never waited for a call slot: %+v", st)
	}

	// The same calls from a peer that reads no replies: the engine stops
	// reading it, and cuts it once its replies make no progress.
	c2 := rawPeer(t, tg.RPCAddr(), "127.0.0.2", "deaf")
	s = sample(2 * time.Millisecond)
	writeDone := make(chan error, 1)
	go func() {
		w := bufio.NewWriterSize(c2, 1<<16)
		var err error
		for i := uint64(1); i <= calls && err == nil; i++ {
			_, err = w.Write(describeFrame(i))
		}
		if err == nil {
			err = w.Flush()
		}
		writeDone <- err
	}()
	c.Close()
	waitFor(t, "the deaf peer to be cut off", func() bool {
		st := tg.Stats().Control
		return st.SlowClosed >= 1 && st.ConnsOpen == 1
	})
	<-writeDone
	_, peakG = s.end()
	if peakG > g0+engine.DefaultMaxCallsPerConn+16 {
		t.Fatalf("%d goroutines at the peak (%d before)", peakG, g0)
	}
	c2.Close()
	settle(t, "after the attack", g0, fd0)
}

// TestNotifyFloodRefusedOverBudget is issue 13's third row: 150
// notifications of 16 MiB under made-up names were all kept. Ten
// connections, each under its own made-up instance and holding the secret
// (a peer gone wrong rather than an outsider), send 15 each.
func TestNotifyFloodRefusedOverBudget(t *testing.T) {
	tg := newEngine(t, withSecret(secretA))
	a := newEngine(t, withSecret(secretA))
	if _, err := a.Probe(tg.Name()); err != nil {
		t.Fatal(err)
	}
	sec, _ := peerauth.ParseSecret(secretA)
	h0 := heapInuse()
	l := keepCalling(a, tg)
	s := sample(10 * time.Millisecond)

	msg := make([]byte, wire.MaxNotifyMsg)
	var accepted, refused atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 10)
	for k := 0; k < 10; k++ {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			// The secret opens a session: every frame sealed.
			c, sess := rawSessionPeer(t, tg.RPCAddr(), "127.0.0.2", sec, fmt.Sprintf("made-up-%d", k))
			defer c.Close()
			seal, open := sess.Split()
			r := bufio.NewReader(c)
			for i := 0; i < 15; i++ {
				name := fmt.Sprintf("sender-%d-%d", k, i)
				var h []byte
				h = binary.LittleEndian.AppendUint16(h, uint16(len(name)))
				h = append(h, name...)
				h = binary.LittleEndian.AppendUint32(h, uint32(len(msg)))
				if err := writeSealedCall(c, seal, wire.KindNotify, uint64(i+1), h, msg); err != nil {
					errc <- err
					return
				}
				call, err := readSealedReply(r, open)
				if err != nil {
					errc <- err
					return
				}
				switch call.Flags {
				case wire.FlagReplyOK:
					accepted.Add(1)
				case wire.FlagReplyErr:
					if e := wire.DecodeError(call.Payload); e.Code != errs.ResourceExhausted {
						errc <- e
						return
					}
					refused.Add(1)
				}
			}
		}(k)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	peak, _ := s.end()
	l.check(t)
	if accepted.Load()+refused.Load() != 150 || accepted.Load() < 1 || accepted.Load()*wire.MaxNotifyMsg > engine.DefaultNotifyBytes {
		t.Fatalf("%d accepted, %d refused", accepted.Load(), refused.Load())
	}
	// The budget (64 MiB) plus the notifications being read, not 2.4 GB.
	if grew := int64(peak) - int64(h0); grew > 256<<20 {
		t.Fatalf("heap in use grew by %d MiB", grew>>20)
	}
	st := tg.Stats().Control
	if st.RefusedNotifies != uint64(refused.Load()) || st.NotifyBytes > engine.DefaultNotifyBytes {
		t.Fatalf("stats %+v", st)
	}
	// Nothing accepted was dropped; draining frees the budget.
	if got := tg.Notifies(); int64(len(got)) != accepted.Load() {
		t.Fatalf("drained %d of %d accepted", len(got), accepted.Load())
	}
	if st := tg.Stats().Control; st.NotifyBytes != 0 {
		t.Fatalf("budget after draining %+v", st)
	}
	if err := a.SendNotify(tg.Name(), "after", string(msg[:1<<20])); err != nil {
		t.Fatal(err)
	}
}

// TestNotifyBudgetPerSender: a sender over its own budget is refused while
// another sender's notifications still get in.
func TestNotifyBudgetPerSender(t *testing.T) {
	tg := newEngine(t, withSecret(secretA), func(c *engine.Config) {
		c.Limits.NotifyBytes, c.Limits.NotifyBytesPerSender = 3<<20, 1<<20
	})
	a := newEngine(t, withSecret(secretA))
	b := newEngine(t, withSecret(secretA))
	half := string(make([]byte, 600<<10))
	if err := a.SendNotify(tg.Name(), "a", half); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "a over its budget", a.SendNotify(tg.Name(), "a", half), errs.ResourceExhausted, "per sender")
	if err := b.SendNotify(tg.Name(), "b", half); err != nil {
		t.Fatalf("another sender refused: %v", err)
	}
	if n := len(tg.Notifies()); n != 2 {
		t.Fatalf("drained %d", n)
	}
	if err := a.SendNotify(tg.Name(), "a", half); err != nil {
		t.Fatalf("after draining: %v", err)
	}
}

// raiseNoFile lifts the soft limit on open files to the hard one and
// returns it.
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

// TestIdleConnectionsCappedAndClosed is issue 13's fourth row on the RPC
// port: 10k idle connections were kept forever (10k fds and goroutines).
func TestIdleConnectionsCappedAndClosed(t *testing.T) {
	n := 10_000
	if lim := raiseNoFile(t); uint64(n)+1000 > lim {
		n = int(lim) - 1000
		t.Logf("RLIMIT_NOFILE %d: %d connections", lim, n)
	}
	tg := newEngine(t, func(c *engine.Config) {
		c.Limits.MaxConns, c.Limits.MaxConnsPerHost = 300, 100
		c.Limits.HandshakeTimeout, c.Limits.IdleTimeout = time.Second, 300*time.Millisecond
	})
	a := newEngine(t)
	if _, err := a.Probe(tg.Name()); err != nil {
		t.Fatal(err)
	}
	g0, fd0 := runtime.NumGoroutine(), openFDs(t)
	l := keepCalling(a, tg)
	s := sample(5 * time.Millisecond)

	// One address opens 150: the per-address cap keeps 100.
	conns := make([]net.Conn, 0, n+150)
	for i := 0; i < 150; i++ {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 30)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", tg.RPCAddr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	waitFor(t, "the per-address refusals", func() bool { return tg.Stats().Control.RefusedConnsPerHost == 50 })
	// Then 10k from ten addresses: the listener's cap keeps 300 at most.
	flood := make([]net.Conn, n)
	var wg sync.WaitGroup
	var dialErr atomic.Value
	for w := 0; w < 10; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+w))}, Timeout: 5 * time.Second}
			for i := w; i < n; i += 10 {
				c, err := d.Dial("tcp", tg.RPCAddr())
				if err != nil {
					dialErr.Store(err)
					return
				}
				flood[i] = c
			}
		}(w)
	}
	wg.Wait()
	conns = append(conns, flood...)
	if err := dialErr.Load(); err != nil {
		t.Fatal(err)
	}
	st := tg.Stats().Control
	if st.ConnsPeak > 300 || st.ConnsOpen > 300 || st.RefusedConns == 0 {
		t.Fatalf("during the flood %+v", st)
	}
	// The engine's side holds at most its cap of sockets; the rest of the
	// descriptors are the attacker's.
	if fds := openFDs(t); fds > fd0+len(conns)+300+20 {
		t.Fatalf("%d fds open during the flood (%d before, %d attacking)", fds, fd0, len(conns))
	}
	// Fifty more authenticate, then stay idle: closed after IdleTimeout.
	var idle []net.Conn
	waitFor(t, "the flood's connections to be cut at the handshake deadline", func() bool { return tg.Stats().Control.ConnsOpen <= 1 })
	for i := 0; i < 50; i++ {
		idle = append(idle, rawPeer(t, tg.RPCAddr(), "127.0.0.20", "idler"))
	}
	for _, c := range idle {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("an idle connection was not closed: %v", err)
		}
	}
	_, peakG := s.end()
	l.check(t)
	st = tg.Stats().Control
	if st.HandshakeTimeouts < 250 || st.IdleClosed < 50 || st.ConnsPeak > 300 {
		t.Fatalf("after the flood %+v", st)
	}
	if peakG > g0+300+40 {
		t.Fatalf("%d goroutines at the peak (%d before)", peakG, g0)
	}
	for _, c := range append(conns, idle...) {
		if c != nil {
			c.Close()
		}
	}
	settle(t, "after the flood", g0, fd0)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTrickledFrameCutOff: a body arriving a byte at a time is cut at the
// progress deadline, and a header trickled the same way at the handshake
// deadline.
func TestTrickledFrameCutOff(t *testing.T) {
	tg := newEngine(t, func(c *engine.Config) {
		c.Limits.ProgressTimeout, c.Limits.HandshakeTimeout = 300*time.Millisecond, 300*time.Millisecond
	})
	probe := wire.AppendFrame(nil, wire.KindProbe, wire.AppendCall(nil, 1, wire.FlagRequest, make([]byte, 1000)))
	for i, c := range []struct {
		sent, trickle []byte
	}{
		{probe[:wire.FrameHeaderSize], probe[wire.FrameHeaderSize:]}, // the body, a byte at a time
		{nil, describeFrame(1)}, // the header, a byte at a time
	} {
		conn := rawPeer(t, tg.RPCAddr(), "127.0.0.1", "trickler")
		conn.Write(c.sent)
		t0 := time.Now()
		cut := false
		for _, b := range c.trickle {
			if _, err := conn.Write([]byte{b}); err != nil {
				cut = true
				break
			}
			conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if _, err := conn.Read(make([]byte, 1)); !isTimeout(err) {
				cut = true // EOF: the engine closed it
				break
			}
		}
		conn.Close()
		if !cut || time.Since(t0) > 5*time.Second {
			t.Fatalf("case %d: a trickling peer was kept for %v", i, time.Since(t0))
		}
	}
	if st := tg.Stats().Control; st.SlowClosed != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestCallsBoundPerEngine: four connections pipelining calls never have
// more than Limits.MaxCalls in flight in the engine, and every call is
// answered.
func TestCallsBoundPerEngine(t *testing.T) {
	tg := target(t, func(c *engine.Config) { c.Limits.MaxCalls = 3 })
	const per = 3000
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := tg.Stats().Control.CallsInFlight; n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for k := 0; k < 4; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := rawPeer(t, tg.RPCAddr(), "127.0.0.1", "pipeliner")
			defer c.Close()
			go func() {
				w := bufio.NewWriter(c)
				for i := uint64(1); i <= per; i++ {
					w.Write(describeFrame(i))
				}
				w.Flush()
			}()
			r := bufio.NewReader(c)
			for i := 0; i < per; i++ {
				if _, _, err := wire.ReadFrame(r, 1<<20); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if peak.Load() > 3 || peak.Load() < 1 {
		t.Fatalf("peak of %d calls in flight with MaxCalls 3", peak.Load())
	}
	// The last reply is on the wire a moment before its call is counted out.
	deadline := time.Now().Add(5 * time.Second)
	for tg.Stats().Control.CallsInFlight != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if st := tg.Stats().Control; st.CallsThrottled == 0 || st.CallsInFlight != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestOversizeFramesRefused: a request over its kind's limit is answered
// TooLarge and the connection closed; a descriptor over this side's
// Limits.MaxFrame fails the fetch with TooLarge instead of being read.
func TestOversizeFramesRefused(t *testing.T) {
	tg := target(t)
	c := rawPeer(t, tg.RPCAddr(), "127.0.0.1", "big")
	c.Write(wire.AppendFrame(nil, wire.KindProbe, wire.AppendCall(nil, 7, wire.FlagRequest, make([]byte, 70<<10))))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	c.Close()
	if isTimeout(err) {
		t.Fatal("connection not closed")
	}
	if len(got) > 0 { // best effort: the answer can be lost to the reset
		call, err := wire.DecodeCall(got[wire.FrameHeaderSize:])
		if err != nil || call.ID != 7 || wire.DecodeError(call.Payload).Code != errs.TooLarge {
			t.Fatalf("answer %+v %v", call, err)
		}
	}
	if st := tg.Stats().Control; st.RefusedFrames != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The client refuses to send what the peer would refuse.
	a := newEngine(t, func(c *engine.Config) { c.Limits.MaxFrame = 4 << 10 })
	wantCode(t, "notify over the limit", a.SendNotify(tg.Name(), "n", string(make([]byte, wire.MaxNotifyMsg+1))), errs.TooLarge)
	// A descriptor larger than this side's limit.
	for i := 0; i < 60; i++ {
		buf := alloc(t, 4096)
		if err := tg.RegisterMemory(mem.Addr(buf), 4096, "cpu", true); err != nil {
			t.Fatal(err)
		}
	}
	_, err = a.OpenSegment(tg.Name())
	wantCode(t, "descriptor over MaxFrame", err, errs.TooLarge, "MaxFrame")
	if st := a.Stats().Control; st.RefusedFrames != 1 {
		t.Fatalf("initiator stats %+v", st)
	}
}

// TestPeerIdleTimeoutClosesDialled: a dialled control connection with no
// call for PeerIdleTimeout is closed on both sides; the next call dials.
func TestPeerIdleTimeoutClosesDialled(t *testing.T) {
	tg := newEngine(t)
	a := newEngine(t, func(c *engine.Config) { c.Limits.PeerIdleTimeout = 100 * time.Millisecond })
	if _, err := a.Probe(tg.Name()); err != nil {
		t.Fatal(err)
	}
	if tg.Stats().Control.ConnsOpen != 1 {
		t.Fatal("no connection")
	}
	waitFor(t, "the idle connection to close", func() bool {
		return a.Stats().Control.PeerIdleClosed == 1 && tg.Stats().Control.ConnsOpen == 0
	})
	if _, err := a.Probe(tg.Name()); err != nil {
		t.Fatal(err)
	}
	if st := tg.Stats().Control; st.ConnsAccepted != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLimitsValidated(t *testing.T) {
	for _, mod := range []func(*engine.Limits){
		func(l *engine.Limits) { l.MaxConns = -1 },
		func(l *engine.Limits) { l.HandshakeTimeout = -1 },
		func(l *engine.Limits) { l.ProgressTimeout = -1 },
		func(l *engine.Limits) { l.MaxFrame = 100 },
		func(l *engine.Limits) { l.MaxCalls = -5 },
	} {
		cfg := engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"local"}}
		mod(&cfg.Limits)
		_, err := engine.New(cfg)
		wantCode(t, "bad limits", err, errs.InvalidArgument, "Limits.")
	}
	// The older Config.MaxFrame still sets the descriptor limit.
	tg := target(t)
	for i := 0; i < 60; i++ {
		buf := alloc(t, 4096)
		tg.RegisterMemory(mem.Addr(buf), 4096, "cpu", true)
	}
	a := newEngine(t, func(c *engine.Config) { c.MaxFrame = 4 << 10 })
	_, err := a.OpenSegment(tg.Name())
	wantCode(t, "Config.MaxFrame", err, errs.TooLarge)
}
