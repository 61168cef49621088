package pipe_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/engine/internal/pipe"
	"github.com/tecache/te/internal/errs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The toy framing the tests speak: a request is an id (u64), a payload
// length (u32) and the payload; a reply is an id (u64) and a status byte
// (0 ok). Ordered pools put no id on the wire's replies: a reply is the
// status byte alone.

type item struct {
	payload  []byte
	holds    bool
	canceled atomic.Bool
	done     chan error // buffered: 1
	n        atomic.Int32
	// writing counts the writes in progress that carry this item: Done
	// must never see it above zero for a holding item.
	writing *atomic.Int32
}

func newItem(payload []byte, holds bool) *item {
	return &item{payload: payload, holds: holds, done: make(chan error, 1), writing: new(atomic.Int32)}
}

func (it *item) Canceled() bool { return it.canceled.Load() }
func (it *item) Holds() bool    { return it.holds }
func (it *item) Done(err error) {
	if it.n.Add(1) != 1 {
		panic("item settled twice")
	}
	if it.holds && it.writing.Load() > 0 {
		panic("item settled while its payload was being written")
	}
	it.done <- err
}

func (it *item) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-it.done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("item not settled")
		return nil
	}
}

type dialect struct {
	ordered bool
	// writeTimeout bounds each ProgressChunk of a write.
	writeTimeout time.Duration
	opened       atomic.Int32
}

func (d *dialect) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var dl net.Dialer
	nc, err := dl.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, errs.Wrap(errs.PeerUnreachable, "toy", err, "connect to %s", addr)
	}
	return nc, nil
}

func (d *dialect) Open(net.Conn, string) (pipe.Encoder[*item], pipe.Decoder[*item], error) {
	d.opened.Add(1)
	return &encoder{d: d}, &decoder{d: d}, nil
}

type encoder struct {
	d     *dialect
	hdrs  []byte
	chunk net.Buffers
}

func (e *encoder) Admit(*item) error { return nil }

func (e *encoder) Encode(nc net.Conn, out []pipe.Out[*item]) (int64, error) {
	e.hdrs = make([]byte, 12*len(out))
	var bufs net.Buffers
	var end int64
	for i := range out {
		h := e.hdrs[12*i : 12*i+12]
		binary.LittleEndian.PutUint64(h, out[i].ID)
		binary.LittleEndian.PutUint32(h[8:], uint32(len(out[i].Item.payload)))
		bufs = append(bufs, h, out[i].Item.payload)
		end += 12 + int64(len(out[i].Item.payload))
		out[i].End = end
		out[i].Item.writing.Add(1)
	}
	defer func() {
		for i := range out {
			out[i].Item.writing.Add(-1)
		}
	}()
	d := e.d.writeTimeout
	if d == 0 {
		d = 5 * time.Second
	}
	n, chunk, err := pipe.WriteProgress(nc, bufs, e.chunk, d)
	e.chunk = chunk
	return n, err
}

func (e *encoder) Close() {}

type decoder struct{ d *dialect }

func (d *decoder) Decode(r *pipe.Reader[*item]) error {
	var s pipe.Slot[*item]
	var err error
	var st [1]byte
	if d.d.ordered {
		if _, err := io.ReadFull(r.Buf(), st[:]); err != nil {
			return r.Lost(err)
		}
		s, err = r.Oldest()
	} else {
		var h [9]byte
		if _, err := io.ReadFull(r.Buf(), h[:]); err != nil {
			return r.Lost(err)
		}
		st[0] = h[8]
		s, err = r.Take(binary.LittleEndian.Uint64(h[:]))
	}
	if err != nil {
		return err
	}
	if st[0] == 0xEE { // a refusal after which the peer closes
		r.Done(s, errs.New(errs.AccessDenied, "toy", "refused"))
		return pipe.Requeue(errs.New(errs.PeerUnreachable, "toy", "closed after a refusal"))
	}
	if st[0] != 0 {
		r.Done(s, errs.New(errs.AccessDenied, "toy", "refused"))
		return nil
	}
	r.Done(s, nil)
	return nil
}

func (d *decoder) Close() {}

// server is the peer: each connection's requests are handed to serve.
type server struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
	count atomic.Int32 // connections accepted
}

type req struct {
	id      uint64
	payload []byte
}

func newServer(t *testing.T, serve func(nc net.Conn, br *bufio.Reader)) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			s.count.Add(1)
			s.mu.Lock()
			s.conns = append(s.conns, nc)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer nc.Close()
				serve(nc, bufio.NewReader(nc))
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *server) addr() string { return s.ln.Addr().String() }

func readHeader(br *bufio.Reader) (uint64, uint32, error) {
	var h [12]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, 0, err
	}
	return binary.LittleEndian.Uint64(h[:]), binary.LittleEndian.Uint32(h[8:]), nil
}

func readReq(br *bufio.Reader) (req, error) {
	id, n, err := readHeader(br)
	if err != nil {
		return req{}, err
	}
	p := make([]byte, n)
	_, err = io.ReadFull(br, p)
	return req{id, p}, err
}

func reply(nc net.Conn, id uint64, status byte) {
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:], id)
	b[8] = status
	nc.Write(b[:])
}

// echo answers every request once it has read it.
func echo(nc net.Conn, br *bufio.Reader) {
	for {
		q, err := readReq(br)
		if err != nil {
			return
		}
		reply(nc, q.id, 0)
	}
}

func newPool(t *testing.T, d *dialect, o pipe.Options) *pipe.Pool[*item] {
	t.Helper()
	o.Component = "toy"
	p := pipe.New[*item](d, o)
	t.Cleanup(func() { p.Close(errs.New(errs.Closed, "toy", "closed")) })
	return p
}

func peer(t *testing.T, p *pipe.Pool[*item], addr string) *pipe.Peer[*item] {
	t.Helper()
	pe, err := p.Peer(addr)
	if err != nil {
		t.Fatal(err)
	}
	return pe
}

// TestRoundTrip: many items, striped over three connections, all settle
// with their replies.
func TestRoundTrip(t *testing.T) {
	srv := newServer(t, echo)
	p := newPool(t, &dialect{}, pipe.Options{Conns: 3})
	pe := peer(t, p, srv.addr())
	var items []*item
	for i := 0; i < 300; i++ {
		it := newItem(make([]byte, i*100), i%2 == 0)
		items = append(items, it)
		pe.Send(pe.Stripe(), it)
	}
	for i, it := range items {
		if err := it.wait(t); err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if n := srv.count.Load(); n != 3 {
		t.Fatalf("%d connections, want 3", n)
	}
}

// TestEarlyReplyFailsUnsentPayload: the peer answers a holding item as soon
// as its header came, without reading its payload, then stops reading. The
// reply is held, not acted on: the item fails with a Protocol error once the
// write gave up, and never while its payload was being written (Done
// panics then).
func TestEarlyReplyFailsUnsentPayload(t *testing.T) {
	quit := make(chan struct{})
	srv := newServer(t, func(nc net.Conn, br *bufio.Reader) {
		id, _, err := readHeader(br)
		if err != nil {
			return
		}
		reply(nc, id, 0)
		<-quit // and read nothing more
	})
	t.Cleanup(func() { close(quit) })
	p := newPool(t, &dialect{writeTimeout: 300 * time.Millisecond}, pipe.Options{})
	pe := peer(t, p, srv.addr())
	it := newItem(make([]byte, 64<<20), true)
	pe.Send(0, it)
	err := it.wait(t)
	if errs.CodeOf(err) != errs.Protocol {
		t.Fatalf("an early reply to an unsent payload: %v, want a protocol error", err)
	}
}

// TestEarlyReplyHeldUntilSent: the peer answers first and reads the payload
// afterwards; the item completes, but only once the writer is past it.
func TestEarlyReplyHeldUntilSent(t *testing.T) {
	srv := newServer(t, func(nc net.Conn, br *bufio.Reader) {
		id, n, err := readHeader(br)
		if err != nil {
			return
		}
		reply(nc, id, 0)
		time.Sleep(50 * time.Millisecond) // the reply is read while the write still runs
		io.CopyN(io.Discard, br, int64(n))
		echo(nc, br)
	})
	p := newPool(t, &dialect{}, pipe.Options{})
	pe := peer(t, p, srv.addr())
	it := newItem(make([]byte, 32<<20), true)
	pe.Send(0, it)
	if err := it.wait(t); err != nil {
		t.Fatal(err)
	}
}

// TestForgedReplies: a second reply for an item, or one for an id never
// sent, ends the connection with a Protocol error; what it still carried
// fails, what was answered before stays answered.
func TestForgedReplies(t *testing.T) {
	for name, forge := range map[string]func(nc net.Conn, first uint64){
		"duplicate": func(nc net.Conn, first uint64) { reply(nc, first, 0) },
		"unknown":   func(nc net.Conn, first uint64) { reply(nc, first+1000, 0) },
	} {
		t.Run(name, func(t *testing.T) {
			srv := newServer(t, func(nc net.Conn, br *bufio.Reader) {
				q, err := readReq(br)
				if err != nil {
					return
				}
				reply(nc, q.id, 0)
				if _, err := readReq(br); err != nil {
					return
				}
				forge(nc, q.id)
				io.Copy(io.Discard, br)
			})
			p := newPool(t, &dialect{}, pipe.Options{})
			pe := peer(t, p, srv.addr())
			a := newItem([]byte("a"), true)
			pe.Send(0, a)
			if err := a.wait(t); err != nil {
				t.Fatal(err)
			}
			b := newItem([]byte("b"), true)
			pe.Send(0, b)
			if err := b.wait(t); errs.CodeOf(err) != errs.Protocol {
				t.Fatalf("an item in flight behind a forged reply: %v, want a protocol error", err)
			}
		})
	}
}

// TestCancelReleases: a canceled item in flight settles at once; its late
// reply is dropped and the connection carries on for the others.
func TestCancelReleases(t *testing.T) {
	late := make(chan uint64, 1)
	srv := newServer(t, func(nc net.Conn, br *bufio.Reader) {
		q, err := readReq(br)
		if err != nil {
			return
		}
		late <- q.id // not answered yet
		for {
			r, err := readReq(br)
			if err != nil {
				return
			}
			if string(r.payload) == "now" {
				reply(nc, q.id, 0) // the late reply to the canceled item
			}
			reply(nc, r.id, 0)
		}
	})
	p := newPool(t, &dialect{}, pipe.Options{})
	pe := peer(t, p, srv.addr())
	a := newItem([]byte("stuck"), true)
	pe.Send(0, a)
	<-late
	a.canceled.Store(true)
	pe.Cancel()
	if err := a.wait(t); errs.CodeOf(err) != errs.Canceled {
		t.Fatalf("canceled item: %v", err)
	}
	b := newItem([]byte("now"), false)
	pe.Send(0, b)
	if err := b.wait(t); err != nil {
		t.Fatalf("an item after a canceled one: %v", err)
	}
	if n := srv.count.Load(); n != 1 {
		t.Fatalf("%d connections: a cancel must not cut the connection", n)
	}
}

// TestOrderedCancelRequeues: with replies in order and no ids, a canceled
// item in flight cuts its connection; the item queued behind it is sent
// again on a new one and completes.
func TestOrderedCancelRequeues(t *testing.T) {
	sent := make(chan struct{}, 4)
	srv := newServer(t, func(nc net.Conn, br *bufio.Reader) {
		for {
			q, err := readReq(br)
			if err != nil {
				return
			}
			sent <- struct{}{}
			if string(q.payload) == "stuck" {
				io.Copy(io.Discard, br)
				return
			}
			nc.Write([]byte{0})
		}
	})
	p := newPool(t, &dialect{ordered: true}, pipe.Options{Ordered: true, Retries: 2})
	pe := peer(t, p, srv.addr())
	a, b := newItem([]byte("stuck"), true), newItem([]byte("b"), true)
	pe.Send(0, a, b)
	<-sent
	a.canceled.Store(true)
	pe.Cancel()
	if err := a.wait(t); errs.CodeOf(err) != errs.Canceled {
		t.Fatalf("canceled item: %v", err)
	}
	if err := b.wait(t); err != nil {
		t.Fatalf("item behind the canceled one: %v", err)
	}
	if n := srv.count.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the cut one and its successor)", n)
	}
}

// TestOrderedRefusalRequeues: a refusal (Requeue) fails the refused item
// and sends those behind it again.
func TestOrderedRefusalRequeues(t *testing.T) {
	srv := newServer(t, func(nc net.Conn, br *bufio.Reader) {
		for {
			q, err := readReq(br)
			if err != nil {
				return
			}
			if string(q.payload) == "bad" {
				nc.Write([]byte{0xEE})
				return
			}
			nc.Write([]byte{0})
		}
	})
	p := newPool(t, &dialect{ordered: true}, pipe.Options{Ordered: true, Retries: 2})
	pe := peer(t, p, srv.addr())
	a, bad, c := newItem([]byte("a"), true), newItem([]byte("bad"), true), newItem([]byte("c"), false)
	pe.Send(0, a, bad, c)
	if err := a.wait(t); err != nil {
		t.Fatal(err)
	}
	if err := bad.wait(t); errs.CodeOf(err) != errs.AccessDenied {
		t.Fatalf("refused item: %v", err)
	}
	if err := c.wait(t); err != nil {
		t.Fatalf("item behind a refused one: %v", err)
	}
}

// TestPruneRace: the janitor prunes a peer between a caller choosing it
// and sending on it; the items go to the peer's replacement instead of
// failing with the pruned connection.
func TestPruneRace(t *testing.T) {
	srv := newServer(t, echo)
	p := newPool(t, &dialect{}, pipe.Options{PeerIdle: time.Hour})
	pe := peer(t, p, srv.addr())
	warm := newItem([]byte("warm"), false)
	pe.Send(0, warm)
	if err := warm.wait(t); err != nil {
		t.Fatal(err)
	}
	p.Prune(time.Now().Add(2 * time.Hour)) // idle by then: pruned
	if p.Pruned() != 1 {
		t.Fatalf("%d pruned, want 1", p.Pruned())
	}
	it := newItem([]byte("after"), true)
	pe.Send(0, it) // the caller chose pe before the prune
	if err := it.wait(t); err != nil {
		t.Fatalf("item sent on a pruned peer: %v", err)
	}
}

// TestCloseSettlesEverything: Close settles what is queued and in flight
// with its error and returns once the goroutines are gone (goleak).
func TestCloseSettlesEverything(t *testing.T) {
	srv := newServer(t, func(nc net.Conn, br *bufio.Reader) { io.Copy(io.Discard, br) })
	p := pipe.New[*item](&dialect{}, pipe.Options{Conns: 2, Component: "toy"})
	pe := peer(t, p, srv.addr())
	var items []*item
	for i := 0; i < 50; i++ {
		it := newItem(make([]byte, 1<<20), i%2 == 0)
		items = append(items, it)
		pe.Send(i, it)
	}
	time.Sleep(20 * time.Millisecond)
	p.Close(errs.New(errs.Closed, "toy", "closed"))
	for _, it := range items {
		if err := it.wait(t); !errors.Is(err, errs.ErrClosed) {
			t.Fatalf("in flight at close: %v", err)
		}
	}
	if _, err := p.Peer(srv.addr()); !errors.Is(err, errs.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	late := newItem(nil, false)
	pe.Send(0, late)
	if err := late.wait(t); !errors.Is(err, errs.ErrClosed) {
		t.Fatalf("sent after close: %v", err)
	}
}

// TestMaxInFlight: the writer never has more than MaxInFlight items
// unanswered on a connection.
func TestMaxInFlight(t *testing.T) {
	var outstanding, peak atomic.Int32
	srv := newServer(t, func(nc net.Conn, br *bufio.Reader) {
		replies := make(chan uint64, 100)
		go func() {
			for id := range replies {
				time.Sleep(time.Millisecond)
				outstanding.Add(-1)
				reply(nc, id, 0)
			}
		}()
		defer close(replies)
		for {
			q, err := readReq(br)
			if err != nil {
				return
			}
			n := outstanding.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			replies <- q.id
		}
	})
	p := newPool(t, &dialect{}, pipe.Options{MaxInFlight: 3})
	pe := peer(t, p, srv.addr())
	var items []*item
	for i := 0; i < 40; i++ {
		it := newItem([]byte("x"), false)
		items = append(items, it)
		pe.Send(0, it)
	}
	for _, it := range items {
		if err := it.wait(t); err != nil {
			t.Fatal(err)
		}
	}
	if peak.Load() > 3 {
		t.Fatalf("%d items in flight at once, bound 3", peak.Load())
	}
}

// TestSilence: a peer that reads but never answers fails the connection
// after Silence; an idle connection stays.
func TestSilence(t *testing.T) {
	srv := newServer(t, func(nc net.Conn, br *bufio.Reader) { io.Copy(io.Discard, br) })
	p := newPool(t, &dialect{}, pipe.Options{Silence: 200 * time.Millisecond})
	pe := peer(t, p, srv.addr())
	it := newItem([]byte("x"), false)
	t0 := time.Now()
	pe.Send(0, it)
	if err := it.wait(t); errs.CodeOf(err) != errs.PeerUnreachable {
		t.Fatalf("unanswered item: %v", err)
	}
	if d := time.Since(t0); d < 200*time.Millisecond {
		t.Fatalf("failed after %v, before the silence bound", d)
	}
}
