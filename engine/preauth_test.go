package engine_test

import (
	"net"
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
