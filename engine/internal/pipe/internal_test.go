package pipe

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tecache/te/internal/errs"
)

// nopItem counts its settlements.
type nopItem struct{ done chan error }

func (it nopItem) Canceled() bool { return false }
func (it nopItem) Holds() bool    { return false }
func (it nopItem) Done(err error) { it.done <- err }
func (it nopItem) wait() error    { return <-it.done }
func newNop() nopItem             { return nopItem{make(chan error, 1)} }

// lineDialect answers every request: a request is one byte, its id; the
// reply is the same byte.
type lineDialect struct{}

func (lineDialect) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}
func (lineDialect) Open(net.Conn, string) (Encoder[nopItem], Decoder[nopItem], error) {
	return lineCodec{}, lineCodec{}, nil
}

type lineCodec struct{}

func (lineCodec) Admit(nopItem) error { return nil }
func (lineCodec) Encode(nc net.Conn, out []Out[nopItem]) (int64, error) {
	b := make([]byte, len(out))
	for i := range out {
		b[i] = byte(out[i].ID)
		out[i].End = int64(i + 1)
	}
	n, err := nc.Write(b)
	return int64(n), err
}
func (lineCodec) Decode(r *Reader[nopItem]) error {
	id, err := r.Buf().ReadByte()
	if err != nil {
		return r.Lost(err)
	}
	s, err := r.Take(uint64(id))
	if err != nil {
		return err
	}
	r.Done(s, nil)
	return nil
}
func (lineCodec) Close() {}

// TestPrunedConnectionResends: a caller took a connection just before the
// janitor pruned it; what it then queues goes to the peer's replacement
// rather than failing with "pruned" (the race behind a batch notify failing
// with a lost connection).
func TestPrunedConnectionResends(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer nc.Close(); io.Copy(nc, nc) }()
		}
	}()
	p := New[nopItem](lineDialect{}, Options{PeerIdle: time.Hour, Component: "toy"})
	defer p.Close(errs.New(errs.Closed, "toy", "closed"))
	pe, err := p.Peer(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := pe.get(0) // chosen by a caller...
	p.Prune(time.Now().Add(2 * time.Hour))
	if p.Pruned() != 1 {
		t.Fatalf("pruned %d, want 1", p.Pruned())
	}
	it := newNop()
	c.enqueue([]nopItem{it}, nil) // ...and used after the prune
	if err := it.wait(); err != nil {
		t.Fatalf("item queued on a pruned connection: %v", err)
	}
}
