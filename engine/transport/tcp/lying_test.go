package tcp_test

import (
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/engine/transport/tcp"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// Lying peers: test servers speaking te's (and Mooncake's) data framing on
// 127.0.0.1 that answer what they have not read, answer twice, answer ids
// never sent, or stall mid-payload. Each request must end with a clear
// error, never COMPLETED while its local memory can still be read; the
// memory is unmapped the moment the request ends, so a late touch by the
// transport crashes the test.

// lyingParams: small slices are not wanted (one slice per request), and a
// stalled payload is given up quickly.
var lyingParams = map[string]string{"tcp.slice": "64MiB", "tcp.conns": "2", "limits.progress_timeout": "300ms", "tcp.timeout": "2s"}

// submitUnmapped submits one request per (op, length) on fresh mappings
// and unmaps each the moment its request ends. It returns the outcomes, in
// order.
func submitUnmapped(t *testing.T, tr *tcp.Transport, d *segment.Desc, ops []transport.Opcode, n int) []error {
	t.Helper()
	out := make([]error, len(ops))
	done := make(chan int, len(ops))
	reqs := make([]transport.Request, len(ops))
	for i, op := range ops {
		buf, err := mem.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		for k := range buf {
			buf[k] = byte(k)
		}
		reqs[i] = transport.Request{Op: op, Local: mem.Addr(buf), Remote: d.Buffers[0].Addr, Length: uint64(n), Peer: d,
			Buffer: &d.Buffers[0], Key: d.Buffers[0].Key, Index: i,
			Owner: transport.CompleteFunc(func(i int, err error) {
				out[i] = err
				mem.Free(buf) // a late touch faults
				done <- i
			})}
	}
	tr.Submit(reqs)
	for range ops {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("requests not finished")
		}
	}
	return out
}

func teDesc(ep string) *segment.Desc {
	return &segment.Desc{Name: "liar", Endpoints: map[string]string{"tcp": ep},
		Buffers: []segment.BufferDesc{{Addr: 1 << 40, Length: 1 << 30, Key: 42}}}
}

// TestLyingPeerEarlyCompletion: the peer acknowledges a WRITE as soon as its
// header came and never reads the payload. The request fails with a
// protocol error once the payload is given up, not COMPLETED while the
// writer still reads it.
func TestLyingPeerEarlyCompletion(t *testing.T) {
	quit := make(chan struct{})
	ep := fakeServer(t, func(nc net.Conn) {
		if !fakeHandshake(nc) {
			return
		}
		var h [wire.ReqHeaderSize]byte
		if _, err := io.ReadFull(nc, h[:]); err != nil {
			return
		}
		q, _ := wire.DecodeDataRequest(h[:])
		nc.Write(wire.AppendCompletion(nil, wire.Completion{ID: q.ID}))
		<-quit // reads nothing more
	})
	t.Cleanup(func() { close(quit) })
	tr := startFake(t, lyingParams)
	t0 := time.Now()
	err := submitUnmapped(t, tr, teDesc(ep), []transport.Opcode{transport.Write}, 48<<20)[0]
	if errs.CodeOf(err) != errs.Protocol {
		t.Fatalf("a WRITE acknowledged before its payload was sent: %v, want a protocol error", err)
	}
	if d := time.Since(t0); d < 300*time.Millisecond {
		t.Fatalf("ended after %v, before the payload was given up", d)
	}
}

// TestLyingPeerDuplicateAndForged: a completion sent twice, and one for an
// id never sent, end the connection with a protocol error: the request
// answered honestly before stays COMPLETED, the one behind it on the same
// connection fails.
func TestLyingPeerDuplicateAndForged(t *testing.T) {
	for name, lie := range map[string]func(q wire.DataRequest) []byte{
		"duplicate": func(q wire.DataRequest) []byte { return wire.AppendCompletion(nil, wire.Completion{ID: q.ID}) },
		"forged":    func(q wire.DataRequest) []byte { return wire.AppendCompletion(nil, wire.Completion{ID: q.ID + 7}) },
	} {
		t.Run(name, func(t *testing.T) {
			ep := fakeServer(t, func(nc net.Conn) {
				if !fakeHandshake(nc) {
					return
				}
				var h [wire.ReqHeaderSize]byte
				for i := 0; ; i++ {
					if _, err := io.ReadFull(nc, h[:]); err != nil {
						return
					}
					q, _ := wire.DecodeDataRequest(h[:])
					if _, err := io.CopyN(io.Discard, nc, int64(q.Length)); err != nil {
						return
					}
					if i == 0 { // the first honestly, then the lie; no more answers
						nc.Write(append(wire.AppendCompletion(nil, wire.Completion{ID: q.ID}), lie(q)...))
					}
				}
			})
			tr := startFake(t, map[string]string{"tcp.conns": "2"})
			// Striped: requests 0 and 2 on one connection, 1 and 3 on
			// the other, in that order.
			w := transport.Write
			got := submitUnmapped(t, tr, teDesc(ep), []transport.Opcode{w, w, w, w}, 64<<10)
			for i, err := range got {
				if i < 2 && err != nil {
					t.Errorf("request %d, answered honestly: %v", i, err)
				}
				if i >= 2 && errs.CodeOf(err) != errs.Protocol {
					t.Errorf("request %d, behind the lie: %v, want a protocol error", i, err)
				}
			}
		})
	}
}

// TestLyingPeerStallsMidPayload: a READ's completion comes with part of its
// payload, then nothing. The request fails once the payload stalls for the
// progress timeout; its memory is unmapped at once, and the rest of the
// payload, sent late, lands nowhere.
func TestLyingPeerStallsMidPayload(t *testing.T) {
	late := make(chan struct{})
	ep := fakeServer(t, func(nc net.Conn) {
		if !fakeHandshake(nc) {
			return
		}
		var h [wire.ReqHeaderSize]byte
		if _, err := io.ReadFull(nc, h[:]); err != nil {
			return
		}
		q, _ := wire.DecodeDataRequest(h[:])
		nc.Write(wire.AppendCompletion(nil, wire.Completion{ID: q.ID, Length: q.Length}))
		nc.Write(make([]byte, 1000))
		<-late
		nc.Write(make([]byte, q.Length-1000)) // after the request ended
	})
	tr := startFake(t, lyingParams)
	err := submitUnmapped(t, tr, teDesc(ep), []transport.Opcode{transport.Read}, 1<<20)[0]
	close(late)
	if errs.CodeOf(err) != errs.PeerUnreachable {
		t.Fatalf("a READ whose payload stalled: %v", err)
	}
	time.Sleep(50 * time.Millisecond) // room for a late touch to fault
}

// TestLyingMooncakePeerEarlyStatus: a Mooncake target sends an OK status for
// a WRITE while its payload is still being sent, and reads nothing more: the
// status matches the slice in flight, but the request fails with a protocol
// error once the payload is given up.
func TestLyingMooncakePeerEarlyStatus(t *testing.T) {
	quit := make(chan struct{})
	ep := fakeServer(t, func(nc net.Conn) {
		var h [wire.MooncakeHeaderSize]byte
		if _, err := io.ReadFull(nc, h[:]); err != nil {
			return
		}
		var st [wire.MooncakeStatusSize]byte
		wire.PutMooncakeStatus(st[:], wire.MooncakeOK)
		nc.Write(st[:])
		<-quit
	})
	t.Cleanup(func() { close(quit) })
	host, port, _ := net.SplitHostPort(ep)
	p, _ := strconv.Atoi(port)
	d := &segment.Desc{Name: "mc", Protocol: "tcp", TCPDataPort: p, TCPProtoVersion: 2, RPC: net.JoinHostPort(host, "1"),
		Buffers: []segment.BufferDesc{{Name: "mc", Addr: 1 << 40, Length: 1 << 30}}}
	tr := startFake(t, lyingParams)
	err := submitUnmapped(t, tr, d, []transport.Opcode{transport.Write}, 48<<20)[0]
	if errs.CodeOf(err) != errs.Protocol {
		t.Fatalf("a WRITE acknowledged before its payload was sent: %v, want a protocol error", err)
	}
}
