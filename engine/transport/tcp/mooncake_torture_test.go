package tcp_test

import (
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/transporttest"
)

// TestTortureMooncake runs the fence torture over Mooncake's tcp data
// framing: the initiator opens the peer through a Mooncake handshake
// listener, holds a Mooncake descriptor and moves every byte in Mooncake's
// framing to a te target that accepts Mooncake peers, while the peer
// re-registers, local memory is unregistered, batches are cancelled, reset
// and freed, and the engine closes in flight. It then checks that the
// framing really was Mooncake's: a silent fallback to te's framing would
// leave the target's Mooncake counter behind the completed tasks.
func TestTortureMooncake(t *testing.T) {
	res := transporttest.RunTorture(t, transporttest.Setup{Transport: "tcp", Mooncake: true, Config: func(c *engine.Config) {
		c.Transports = []string{"tcp"}
		// Small slices over two connections: a task's slices are
		// pipelined, and some are cut in flight.
		c.Params = map[string]string{"tcp.conns": "2", "tcp.slice": "4KiB"}
	}})
	if t.Failed() {
		return
	}
	for _, d := range []struct {
		when string
		ok   bool
	}{{"as opened", res.Desc != nil && res.Desc.IsMooncake()}, {"at the end", res.Last != nil && res.Last.IsMooncake()}} {
		if !d.ok {
			t.Errorf("the initiator's descriptor %s is not a Mooncake one: it spoke te's framing", d.when)
		}
	}
	if res.Metadata == 0 || res.Refused == 0 {
		t.Errorf("the Mooncake handshake listener answered %d Metadata requests and closed %d te openings; want both",
			res.Metadata, res.Refused)
	}
	if res.Target == nil {
		t.Fatal("no target stats")
	}
	served := res.Target.Transport["tcp"]["mooncake_served"]
	if served < uint64(res.Completed) {
		t.Errorf("the target served %d requests in Mooncake's framing, fewer than the %d tasks that completed: the initiator spoke te's framing",
			served, res.Completed)
	}
	t.Logf("%d tasks completed, %d Mooncake requests served, %d Metadata requests", res.Completed, served, res.Metadata)
}
