package tcp_test

import (
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/transporttest"
)

// TestPeerRestarts restarts a peer engine under one segment name while this
// engine keeps writing to it and reading from it over tcp: its pooled data
// and control connections, peers, goroutines and descriptors stay those of
// one live peer (transporttest.RunRestarts). 500 restarts take a few
// seconds, under -race too.
func TestPeerRestarts(t *testing.T) {
	transporttest.RunRestarts(t, transporttest.Setup{Transport: "tcp", Config: func(c *engine.Config) {
		c.Transports = []string{"tcp"}
		// Every block is striped over both connections, so each
		// incarnation is reached over all of them.
		c.Params = map[string]string{"tcp.conns": "2", "tcp.slice": "16KiB"}
	}}, transporttest.Restarts{N: 500, Every: 10})
}

// TestPeerCost measures what one live peer (a child process) costs an
// engine over tcp: two striped data connections and a control connection,
// their descriptors and goroutines, all given back when the peer exits
// (bench/README.md, "Peer restarts").
func TestPeerCost(t *testing.T) {
	cost := transporttest.PeerCost(t, transporttest.Setup{Transport: "tcp", Config: func(c *engine.Config) {
		c.Transports = []string{"tcp"}
		c.Params = map[string]string{"tcp.conns": "2", "tcp.slice": "16KiB"}
	}})
	if cost["tcp.peers"] != 1 || cost["tcp.conns_dialed"] != 2 || cost["control.peer_conns_open"] != 1 {
		t.Fatalf("one peer: %v, want one tcp peer with two data connections and one control connection", cost)
	}
}
