package engine_test

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/wire"
)

// TestDataListenerOneDeadline: the tcp data listener gives the preface and
// the exchange one deadline together (Limits.HandshakeTimeout from the
// first read): a peer that sends its preface just before it and then
// nothing is closed at the deadline, not a whole timeout later (a 1 s
// timeout held such a connection 1.9 s).
func TestDataListenerOneDeadline(t *testing.T) {
	e := newEngine(t, func(c *engine.Config) {
		c.Transports, c.AuthSecret = []string{"tcp"}, secretA
		c.Limits.HandshakeTimeout = time.Second
	})
	start := time.Now()
	c, err := net.Dial("tcp", e.Descriptor().Endpoints["tcp"])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(700 * time.Millisecond)
	if _, err := c.Write([]byte(wire.DataPreface)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [64]byte
	for {
		if _, err := c.Read(b[:]); err != nil {
			break
		}
	}
	if held := time.Since(start); held > 1500*time.Millisecond {
		t.Fatalf("connection held %v past a 1 s handshake timeout", held)
	}
}

// TestPreAuthFloodCannotLockOut: with the control listener full of idle
// connections that never authenticate (1,000 sockets from 127.0.0.2 up,
// limits 32 in all and 8 per address), a peer with the secret is served
// within a second: the oldest unauthenticated connection makes room. (The
// engine had no eviction: 8 idle sockets from 4 addresses made such a peer
// get ResourceExhausted.)
func TestPreAuthFloodCannotLockOut(t *testing.T) {
	lim := func(c *engine.Config) {
		c.Transports, c.AuthSecret = []string{"tcp"}, secretA
		c.Limits.MaxConns, c.Limits.MaxConnsPerHost = 32, 8
	}
	b := newEngine(t, lim)
	a := newEngine(t, lim)
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for i := range 1000 {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0." + strconv.Itoa(2+i/8))}, Timeout: time.Second}
		c, err := d.Dial("tcp", b.RPCAddr())
		if err != nil {
			t.Fatalf("socket %d: %v", i, err)
		}
		idle = append(idle, c)
	}
	time.Sleep(100 * time.Millisecond) // accepted, or refused, by now
	start := time.Now()
	if _, err := a.Probe(b.Name()); err != nil {
		t.Fatalf("peer with the secret during the flood: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("peer with the secret served after %v", took)
	}
	if st := b.Stats().Control; st.EvictedPending == 0 {
		t.Fatalf("no connection evicted: %+v", st)
	}
}
