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
