package engine_test

import (
	"testing"
	"time"

	"github.com/tecache/te/engine"
)

// TestControlConnSilenceRedials: a dialled control connection whose stream
// stalls with a call in flight is cut after the progress timeout and the
// call (a notification, which the receiver dedups) goes again on a fresh
// connection, well inside its RPC timeout. Before, it and every later call
// to that peer waited on the stalled connection until each timed out.
func TestControlConnSilenceRedials(t *testing.T) {
	const progress = 500 * time.Millisecond
	tg := newEngine(t)
	r := newCutRelay(t, tg.RPCAddr())
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
