package tcp_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
)

// Warmup dials and opens every striped connection, and says why it cannot:
// nobody listening, or a peer that never finishes the handshake (bounded by
// the caller's context, no hang).
func TestWarmup(t *testing.T) {
	tr := startFake(t, map[string]string{"tcp.conns": "3"})
	desc := func(ep string) *segment.Desc {
		return &segment.Desc{Name: "peer", Endpoints: map[string]string{"tcp": ep}}
	}
	ctx := context.Background()

	ok := fakeServer(t, func(nc net.Conn) {
		if fakeHandshake(nc) {
			var b [1]byte
			nc.Read(b[:]) // hold it open until the test ends
		}
	})
	if err := tr.Warmup(ctx, desc(ok)); err != nil {
		t.Fatal(err)
	}
	if n := tr.Stats()["peer_conns_dialed"]; n != 3 {
		t.Fatalf("dialed %d, want 3", n)
	}
	if err := tr.Warmup(ctx, desc(ok)); err != nil || tr.Stats()["peer_conns_dialed"] != 3 {
		t.Fatalf("second warmup: %v, dialed %d", err, tr.Stats()["peer_conns_dialed"])
	}

	err := tr.Warmup(ctx, desc("127.0.0.1:"+freePort(t)))
	if errs.CodeOf(err) != errs.PeerUnreachable {
		t.Fatalf("nobody listening: %v", err)
	}

	mute := fakeServer(t, func(nc net.Conn) {
		var b [1]byte
		nc.Read(b[:]) // never answers the preface
	})
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = tr.Warmup(short, desc(mute))
	if errs.CodeOf(err) != errs.Timeout {
		t.Fatalf("mute peer: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("mute peer took %v", d)
	}

	err = tr.Warmup(ctx, &segment.Desc{Name: "none"})
	if errs.CodeOf(err) != errs.TransportUnavailable {
		t.Fatalf("no endpoint: %v", err)
	}
}
