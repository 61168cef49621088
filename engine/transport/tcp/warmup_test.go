package tcp_test

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/wire"
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

	// A target that answers every request AccessDenied, as te's does a
	// WRITE under key 0 after reading its payload, and counts them.
	var pings atomic.Int32
	ok := fakeServer(t, func(nc net.Conn) {
		if !fakeHandshake(nc) {
			return
		}
		var h [wire.ReqHeaderSize]byte
		for {
			if _, err := io.ReadFull(nc, h[:]); err != nil {
				return
			}
			req, err := wire.DecodeDataRequest(h[:])
			if err != nil || req.Kind != wire.DataWrite || req.Key != 0 || req.Length != 4096 {
				return
			}
			if _, err := io.CopyN(io.Discard, nc, int64(req.Length)); err != nil {
				return
			}
			pings.Add(1)
			var c [wire.CompHeaderSize]byte
			wire.PutCompletion(c[:], wire.Completion{Status: errs.AccessDenied, ID: req.ID})
			if _, err := nc.Write(c[:]); err != nil {
				return
			}
		}
	})
	if err := tr.Warmup(ctx, desc(ok)); err != nil {
		t.Fatal(err)
	}
	if n := tr.Stats()["peer_conns_dialed"]; n != 3 {
		t.Fatalf("dialed %d, want 3", n)
	}
	// Each connection carried one round trip through the data path.
	if n := pings.Load(); n != 3 {
		t.Fatalf("%d key-0 WRITEs reached the target, want one per connection (3)", n)
	}
	if err := tr.Warmup(ctx, desc(ok)); err != nil || tr.Stats()["peer_conns_dialed"] != 3 {
		t.Fatalf("second warmup: %v, dialed %d", err, tr.Stats()["peer_conns_dialed"])
	}

	err := tr.Warmup(ctx, desc("127.0.0.1:"+freePort(t)))
	if errs.CodeOf(err) != errs.PeerUnreachable {
		t.Fatalf("nobody listening: %v", err)
	}

	// A target that opens the session and then never answers: Warmup ends
	// with the caller's context.
	deaf := fakeServer(t, func(nc net.Conn) {
		if fakeHandshake(nc) {
			var b [1]byte
			nc.Read(b[:])
		}
	})
	short0, cancel0 := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel0()
	if err := tr.Warmup(short0, desc(deaf)); errs.CodeOf(err) != errs.Timeout {
		t.Fatalf("a target that never answers: %v, want Timeout", err)
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
