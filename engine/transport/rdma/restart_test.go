package rdma_test

import (
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/rdma"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/sys/ibv/ibvtest"
)

// TestPeerRestartsFakeVerbs restarts a peer engine under one segment name
// while this engine keeps writing to it and reading from it over rdma on
// the software libibverbs (two devices per engine): its endpoints and queue
// pairs, the library's live verbs objects, its control connections,
// goroutines and descriptors stay those of one live peer
// (transporttest.RunRestarts).
func TestPeerRestartsFakeVerbs(t *testing.T) {
	lib := ibvtest.Build(t)
	fake := ibvtest.Open(t, lib)
	transporttest.RunRestarts(t, transporttest.Setup{Transport: rdma.Name, Config: func(c *engine.Config) {
		c.Transports = []string{rdma.Name}
		c.Params = map[string]string{"rdma.library": lib}
	}}, transporttest.Restarts{N: 500, Every: 10, Probes: map[string]func() int{"verbs_objects": func() int { return int(fake.Live()) }}})
}

// TestPeerCostFakeVerbs measures what one live peer (a child process on
// the same fake fabric) costs an engine over rdma: an endpoint and its
// queue pairs per rail, a control connection, their descriptors and
// goroutines, all given back once the peer exited and its endpoints went
// idle (Options.PeerIdle; bench/README.md, "Peer restarts").
func TestPeerCostFakeVerbs(t *testing.T) {
	lib := ibvtest.Build(t)
	// The child inherits the fabric and the library from the environment.
	t.Setenv(ibvtest.EnvFabric, t.TempDir())
	t.Setenv("TE_IBV_LIBRARY", lib)
	cost := transporttest.PeerCost(t, transporttest.Setup{Transport: rdma.Name, Config: func(c *engine.Config) {
		c.Transports = []string{rdma.Name}
		// Nothing tells the engine the peer exited: its endpoints go
		// once idle this long.
		c.Params = map[string]string{"rdma.library": lib, "limits.peer_idle_timeout": "200ms"}
	}})
	if cost["rdma.peers"] != 1 || cost["rdma.endpoints"] < 1 || cost["rdma.queue_pairs"] < cost["rdma.endpoints"] ||
		cost["control.peer_conns_open"] != 1 {
		t.Fatalf("one peer: %v, want one rdma peer with its endpoints and queue pairs and one control connection", cost)
	}
}
