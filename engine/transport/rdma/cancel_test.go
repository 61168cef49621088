package rdma

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

func (f *fabric) counts(name string) (posts, posted, cqes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.posts[name], f.posted[name], f.cqes[name]
}

// waitErr waits for one outcome on c.
func waitErr(t *testing.T, c <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-c:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not complete in 10s", what)
		return nil
	}
}

// A batch of 128 requests is posted with one ibv_post_send per endpoint,
// signaled every signalEvery(depth) work requests and at each chain's end: the doorbells and completions
// are counted on the fake NICs.
func TestFabricOneDoorbellPerEndpoint(t *testing.T) {
	f := newFabric()
	a, b := newSide(t, f, "a", 2, nil), newSide(t, f, "b", 2, nil)
	fill(a.buf, 11)
	// Connect both NIC pairs first: what follows counts steady state.
	for i := 0; i < 2; i++ {
		if err := do(t, a, b, transport.Write, 0, 0, 4096); err != nil {
			t.Fatal(err)
		}
	}
	p0, _, c0 := f.counts("a_nic0")
	p1, _, c1 := f.counts("a_nic1")
	const n, bs = 128, 4096
	done := make(chan error, n)
	cb := transport.DoneFunc(func(err error) { done <- err })
	reqs := make([]transport.Request, n)
	for i := range reqs {
		reqs[i] = req(a, b, transport.Write, uint64(i*bs), uint64(i*bs), bs, cb)
	}
	a.tr.Submit(reqs)
	for i := 0; i < n; i++ {
		if err := waitErr(t, done, "a request"); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(a.buf[:n*bs], b.buf[:n*bs]) {
		t.Fatal("bytes differ")
	}
	q0, w0, d0 := f.counts("a_nic0")
	q1, w1, d1 := f.counts("a_nic1")
	posts, cqes := q0-p0+q1-p1, d0-c0+d1-c1
	t.Logf("128 requests: %d ibv_post_send calls, %d completions (%d + %d work requests)", posts, cqes, w0, w1)
	if posts > 2 {
		t.Fatalf("%d ibv_post_send calls for a batch over 2 endpoints", posts)
	}
	if want := n/signalEvery(DefaultDepth) + 2; cqes > want {
		t.Fatalf("%d completions for %d work requests, want at most %d", cqes, n, want)
	}
}

// Steady state allocates per submit, not per request or slice.
func TestFabricAllocations(t *testing.T) {
	f := newFabric()
	a, b := newSide(t, f, "a", 2, map[string]string{"rdma.slice": "16KiB"}), newSide(t, f, "b", 2, nil)
	for i := 0; i < 2; i++ {
		if err := do(t, a, b, transport.Write, 0, 0, 4096); err != nil {
			t.Fatal(err)
		}
	}
	const n, bs = 128, 32 << 10 // 256 slices
	done := make(chan error, n)
	cb := transport.DoneFunc(func(err error) { done <- err })
	reqs := make([]transport.Request, n)
	run := func() {
		for i := range reqs {
			reqs[i] = req(a, b, transport.Write, uint64(i*bs), uint64(i*bs), bs, cb)
		}
		a.tr.Submit(reqs)
		for i := 0; i < n; i++ {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	run()
	allocs := testing.AllocsPerRun(20, run)
	t.Logf("%.1f allocations per submit of %d requests (%d slices)", allocs, n, n*bs/(16<<10))
	// The submit's two slabs, plus what the fake NICs allocate to queue
	// completions; nothing per request or slice.
	if allocs > 16 {
		t.Fatalf("%.1f allocations per submit of %d requests", allocs, n)
	}
}

// Canceling requests whose slices wait for an endpoint still connecting
// ends them at once; nothing is posted for them.
func TestFabricCancelPending(t *testing.T) {
	f := newFabric()
	a, b := newSide(t, f, "a", 1, nil), newSide(t, f, "b", 1, nil)
	gate := make(chan struct{})
	f.mu.Lock()
	f.gate = gate
	f.mu.Unlock()
	done := make(chan error, 2)
	rs := []transport.Request{req(a, b, transport.Write, 0, 0, 1<<20, transport.DoneFunc(func(err error) { done <- err }))}
	a.tr.Submit(rs)
	a.tr.Cancel([]*transport.Request{&rs[0]})
	if err := waitErr(t, done, "the canceled request"); !errors.Is(err, errs.ErrCanceled) {
		t.Fatalf("canceled request: %v, want Canceled", err)
	}
	close(gate)
	// The endpoint comes up with nothing to post.
	if err := do(t, a, b, transport.Write, 0, 0, 4096); err != nil {
		t.Fatal(err)
	}
	if _, posted, _ := f.counts("a_nic0"); posted != 1 {
		t.Fatalf("%d work requests posted, want only the later request's", posted)
	}
}

// Canceling a request with work requests on the NIC: its queue pairs go to
// the error state, and the request completes only once the flushed
// completions are polled. The other request on the same queue pairs goes
// again over a new endpoint and completes; no slice of the canceled one is
// posted again (its source changes afterwards and the change never
// arrives).
func TestFabricCancelPosted(t *testing.T) {
	f := newFabric()
	a, b := newSide(t, f, "a", 1, map[string]string{"rdma.qps": "1"}), newSide(t, f, "b", 1, nil)
	if err := do(t, a, b, transport.Write, 0, 0, 4096); err != nil {
		t.Fatal(err)
	}
	hs0, _, _ := f.stats()
	const half = 1 << 20
	copy(a.buf[:2*half], bytes.Repeat([]byte{12}, 2*half))
	clear(b.buf[:2*half])
	f.mu.Lock()
	f.hold = true // the NIC does not report completions until flushed
	f.mu.Unlock()
	canceled, other := make(chan error, 2), make(chan error, 2)
	rs := []transport.Request{
		req(a, b, transport.Write, 0, 0, half, transport.DoneFunc(func(err error) { canceled <- err })),
		req(a, b, transport.Write, half, half, half, transport.DoneFunc(func(err error) { other <- err })),
	}
	a.tr.Submit(rs)
	gate := make(chan struct{})
	f.mu.Lock()
	f.gate = gate // the reconnection waits
	f.mu.Unlock()
	a.hws[0].pause() // flushed completions wait in the CQ
	a.tr.Cancel([]*transport.Request{&rs[0]})
	select {
	case err := <-canceled:
		t.Fatalf("canceled request completed (%v) before its flushed completions were polled", err)
	case <-time.After(50 * time.Millisecond):
	}
	a.hws[0].resume()
	if err := waitErr(t, canceled, "the canceled request"); !errors.Is(err, errs.ErrCanceled) {
		t.Fatalf("canceled request: %v, want Canceled", err)
	}
	// Nothing of it may move any more.
	copy(a.buf[:half], bytes.Repeat([]byte{0xCD}, half))
	f.mu.Lock()
	f.hold = false
	f.mu.Unlock()
	close(gate)
	if err := waitErr(t, other, "the other request"); err != nil {
		t.Fatalf("other request: %v", err)
	}
	if !bytes.Equal(a.buf[half:2*half], b.buf[half:2*half]) {
		t.Fatal("the other request's bytes differ")
	}
	if bytes.IndexByte(b.buf[:half], 0xCD) >= 0 {
		t.Fatal("a slice of the canceled request was posted after it completed")
	}
	if hs, _, _ := f.stats(); hs != hs0+1 {
		t.Fatalf("handshakes %d -> %d, want one reconnection", hs0, hs)
	}
}

// Close with 512 requests in flight (completions held back): every one
// ends Closed, and every queue pair is gone.
func TestFabricClose512InFlight(t *testing.T) {
	f := newFabric()
	a, b := newSide(t, f, "a", 2, map[string]string{"rdma.slice": "4KiB"}), newSide(t, f, "b", 2, nil)
	for i := 0; i < 2; i++ {
		if err := do(t, a, b, transport.Write, 0, 0, 4096); err != nil {
			t.Fatal(err)
		}
	}
	f.mu.Lock()
	f.hold = true
	f.mu.Unlock()
	const n = 512
	done := make(chan error, 2*n)
	cb := transport.DoneFunc(func(err error) { done <- err })
	for k := 0; k < 4; k++ {
		rs := make([]transport.Request, n/4)
		for i := range rs {
			rs[i] = req(a, b, transport.Write, uint64(i*8192), uint64(i*8192), 8192, cb)
		}
		a.tr.Submit(rs)
	}
	if err := a.tr.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		select {
		case err := <-done:
			if !errors.Is(err, errs.ErrClosed) {
				t.Fatalf("request %d: %v, want Closed", i, err)
			}
		default:
			t.Fatalf("%d of %d requests had not ended when Close returned", n-i, n)
		}
	}
	if len(done) != 0 {
		t.Fatal("completed more than once")
	}
	for _, n := range a.tr.nics {
		if n.outstanding() != 0 {
			t.Fatalf("%s: %d work requests still counted", n.name, n.outstanding())
		}
	}
}

// Quiesce has nothing to cut; Unregister deregisters the memory regions, so
// a peer's access under the old keys is refused by the NIC and nothing
// lands.
func TestFabricQuiesceUnregister(t *testing.T) {
	f := newFabric()
	a, b := newSide(t, f, "a", 1, nil), newSide(t, f, "b", 1, nil)
	if err := do(t, a, b, transport.Write, 0, 0, 4096); err != nil {
		t.Fatal(err)
	}
	if err := b.tr.Quiesce(b.reg); err != nil {
		t.Fatal(err)
	}
	if err := b.tr.Unregister(b.reg); err != nil {
		t.Fatal(err)
	}
	clear(b.buf[:8192])
	fill(a.buf[:8192], 13)
	if err := do(t, a, b, transport.Write, 0, 0, 8192); !errors.Is(err, errs.ErrStaleDescriptor) {
		t.Fatalf("write after Unregister: %v, want StaleDescriptor", err)
	}
	if bytes.IndexByte(b.buf[:8192], 13) >= 0 {
		t.Fatal("a write landed after Unregister")
	}
}
