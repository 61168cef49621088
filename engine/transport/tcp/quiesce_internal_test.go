package tcp

import (
	"net"
	"testing"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// TestQuiesceSeesBlockedPush: a peer sends READs and never reads their
// completions. The target's writer is stuck on the socket, its queue of
// completions is full (of READs of buffer A), and its reader waits in push
// with a READ of buffer B. Unregistering B must see that access and cut the
// connection, not wait for it until the progress timeout and fail.
func TestQuiesceSeesBlockedPush(t *testing.T) {
	bufA, bufB := mem.MustAlloc(1<<20), mem.MustAlloc(64<<10)
	defer mem.Free(bufA)
	defer mem.Free(bufB)
	reg := segment.NewRegistry()
	ra, _ := segment.NewRegion(mem.Addr(bufA), 1<<20, "cpu", true)
	rb, _ := segment.NewRegion(mem.Addr(bufB), 64<<10, "cpu", true)
	if _, _, err := reg.Add(ra, rb); err != nil {
		t.Fatal(err)
	}
	tr := New()
	tr.reg = reg
	tr.opt.Progress = 2 * time.Second // how long Quiesce waits before it gives up
	near, far := net.Pipe()           // far is the peer that never reads
	defer far.Close()
	// The writer's own progress deadline never fires here: only a cut
	// ends the access.
	s := &serverConn{t: tr, nc: noWriteDeadline{near}, wake: make(chan struct{}, 1), space: make(chan struct{}, 1), done: make(chan struct{})}
	tr.served[s] = struct{}{}
	read := func(r *segment.Region, n uint64) response {
		g, err := reg.Acquire(r.Addr, n, 0, true, segment.Anyone)
		if err != nil {
			t.Fatal(err)
		}
		return response{comp: wire.Completion{ID: 1, Length: n}, addr: r.Addr, region: g}
	}
	s.startWriter()
	s.push(read(ra, 4096)) // the writer takes it and blocks on the socket
	waitUntilTrue(t, func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.writing != nil })
	for range maxServerQueue {
		s.push(read(ra, 4096))
	}
	pushed := make(chan bool, 1)
	go func() { pushed <- s.push(read(rb, 64<<10)) }()
	waitUntilTrue(t, func() bool { return s.pushing.Load() != nil })

	closing, err := reg.Close(rb.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := tr.Quiesce(closing[0]); err != nil {
		t.Fatalf("quiesce of a buffer held by a blocked push: %v (after %v)", err, time.Since(t0))
	}
	if ok := <-pushed; ok {
		t.Fatal("the blocked push went through after the cut")
	}
	s.writer.Wait()
	// What serve would release when the reader returns.
	for _, r := range s.queue {
		r.region.Release()
	}
	if !ra.Idle() || !closing[0].Idle() {
		t.Fatal("regions still held")
	}
}

func waitUntilTrue(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

type noWriteDeadline struct{ net.Conn }

func (noWriteDeadline) SetWriteDeadline(time.Time) error { return nil }
