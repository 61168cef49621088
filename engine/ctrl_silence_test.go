package engine_test

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/engine"
)

// stallRelay forwards control connections to a target; stall freezes the
// connections open at the time (nothing more is forwarded either way, the
// sockets stay open: a path that silently stopped carrying them), while
// connections made later are forwarded.
type stallRelay struct {
	ln    net.Listener
	to    string
	mu    sync.Mutex
	gates []chan struct{} // closed: that connection is stalled
	conns []net.Conn
	done  chan struct{} // closed at Cleanup: stalled pumps return
	wg    sync.WaitGroup
}

func newStallRelay(t *testing.T, to string) *stallRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &stallRelay{ln: ln, to: to, done: make(chan struct{})}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(func() {
		ln.Close()
		close(r.done)
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *stallRelay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.to)
		if err != nil {
			c.Close()
			continue
		}
		gate := make(chan struct{})
		r.mu.Lock()
		r.conns = append(r.conns, c, s)
		r.gates = append(r.gates, gate)
		r.mu.Unlock()
		pump := func(dst, src net.Conn) {
			defer r.wg.Done()
			buf := make([]byte, 64<<10)
			for {
				n, err := src.Read(buf)
				select {
				case <-gate:
					<-r.done // stalled: drop the bytes, forward nothing more
					return
				default:
				}
				if n > 0 {
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}
		r.wg.Add(2)
		go pump(s, c)
		go pump(c, s)
	}
}

// stall freezes every connection open now.
func (r *stallRelay) stall() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range r.gates {
		select {
		case <-g:
		default:
			close(g)
		}
	}
}

func (r *stallRelay) addr() string { return r.ln.Addr().String() }

// TestControlConnSilenceRedials: a dialled control connection whose stream
// stalls with a call in flight is cut after the progress timeout and the
// call (a notification, which the receiver dedups) goes again on a fresh
// connection, well inside its RPC timeout. Before, it and every later call
// to that peer waited on the stalled connection until each timed out.
func TestControlConnSilenceRedials(t *testing.T) {
	const progress = 500 * time.Millisecond
	tg := newEngine(t)
	r := newStallRelay(t, tg.RPCAddr())
	a := newEngine(t, func(c *engine.Config) {
		c.RPCTimeout = 10 * time.Second
		c.Limits.ProgressTimeout = progress
	})
	seg := r.addr() // peer-to-peer: the segment is the address dialled
	if err := a.SendNotify(seg, "warm", "up"); err != nil {
		t.Fatal(err)
	}
	r.stall()
	for i := range 3 {
		t0 := time.Now()
		if err := a.SendNotify(seg, "after", "stall"); err != nil {
			t.Fatalf("notification %d after the stall: %v", i, err)
		}
		took := time.Since(t0)
		t.Logf("notification %d after the stall: %v", i, took.Round(time.Millisecond))
		if took > 5*time.Second {
			t.Fatalf("notification %d took %v: it waited on the stalled connection", i, took)
		}
	}
	got := 0
	for _, n := range tg.Notifies() {
		if n.Name == "after" {
			got++
		}
	}
	if got != 3 {
		t.Fatalf("target queued %d notifications, want 3 (each once)", got)
	}
}
