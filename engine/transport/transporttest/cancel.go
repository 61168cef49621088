package transporttest

import (
	"bytes"
	"errors"
	"hash/crc32"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// The cancellation cases: a terminal task state is a fence. Once Wait reports
// a task COMPLETED, FAILED, TIMEOUT or CANCELED (or Close or UnregisterMemory
// returned), its transport never touches its local memory again. The suite
// checks it with canaries written after the fact, and by unmapping memory
// that a late access would fault on.

// window is how long the suite watches for a late byte after a fence.
const window = 300 * time.Millisecond

func canary(b []byte) {
	for i := range b {
		b[i] = 0xC3
	}
}

func intact(t *testing.T, what string, b []byte) {
	t.Helper()
	want := bytes.Repeat([]byte{0xC3}, len(b))
	if !bytes.Equal(b, want) {
		i := 0
		for i < len(b) && b[i] == 0xC3 {
			i++
		}
		t.Fatalf("%s: a byte landed at offset %d after the fence", what, i)
	}
}

func terminal(t *testing.T, b *engine.Batch, n int) (completed int) {
	t.Helper()
	for i := 0; i < n; i++ {
		ts, err := b.TaskStatus(i)
		if err != nil {
			t.Fatal(err)
		}
		switch ts.State {
		case engine.Completed:
			completed++
		case engine.Pending, engine.Waiting, engine.Invalid:
			t.Fatalf("task %d is %v after the batch finished", i, ts.State)
		}
	}
	return completed
}

// testCancel cancels a batch of reads right after submitting it: every task
// ends (completed or canceled), the batch can be freed, and nothing lands in
// local memory after Wait returned.
func testCancel(t *testing.T, s Setup) {
	v := s.start(t)
	const per, bs = 64, 1 << 20
	b := v.submitBlocks(engine.Read, per, bs)
	if err := b.Cancel(); err != nil {
		t.Fatal(err)
	}
	st, err := b.Wait(30 * time.Second)
	if err != nil {
		t.Fatalf("canceled batch did not finish: %v %+v", err, st)
	}
	n := terminal(t, b, per)
	t.Logf("%d of %d reads completed before the cancel took", n, per)
	canary(v.dst[:per*bs])
	time.Sleep(window)
	intact(t, "canceled reads", v.dst[:per*bs])
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	// The engine still works afterwards.
	if st := v.run(v.req(engine.Write, mem.Addr(v.src), 0, 4096)); st.State != engine.Completed {
		t.Fatalf("write after a cancel: %+v", st)
	}
}

// testCloseInFlight closes the engine with 512 reads in flight: Close returns
// with every task ended, and nothing lands after.
func testCloseInFlight(t *testing.T, s Setup) {
	v := s.start(t)
	const per, bs = 512, 64 << 10
	b := v.submitBlocks(engine.Read, per, bs)
	v.e.Close()
	st, err := b.Wait(0)
	if err != nil || st.State == engine.Pending {
		t.Fatalf("tasks pending after Close returned: %v %+v", err, st)
	}
	terminal(t, b, per)
	canary(v.dst[:per*bs])
	time.Sleep(window)
	intact(t, "reads of a closed engine", v.dst[:per*bs])
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
}

// testSubmitLatency submits 64 writes of 16 MiB: Submit hands them to the
// transport and returns without waiting for the copies (a layer-by-layer
// sender overlaps them with compute).
func testSubmitLatency(t *testing.T, s Setup) {
	// What is timed is the submit; the 1 GiB behind it may take long on a
	// loaded machine under -race, and must not time out meanwhile.
	v := s.startWith(t, func(c *engine.Config) { c.TransferTimeout = 60 * time.Second })
	const per, bs, step = 64, 16 << 20, 256 << 10
	b, err := v.e.AllocateBatch(per)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	reqs := make([]engine.Request, per)
	for i := range reqs {
		off := uint64(i * step) // overlapping ranges: the bytes do not matter
		reqs[i] = v.req(engine.Write, mem.Addr(v.src)+off, off, bs)
	}
	t0 := time.Now()
	if err := b.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	st, err := b.Wait(60 * time.Second)
	if err != nil || st.State != engine.Completed {
		t.Fatalf("%+v %v", st, err)
	}
	// 1 GiB takes hundreds of milliseconds to move here, seconds on a
	// loaded machine; a submit that waited for it would take about as long
	// as the whole transfer. Compared with the transfer of the same run, so
	// a loaded machine slows both.
	total := time.Since(t0)
	if took > total/2 {
		t.Errorf("submit of 64 x 16 MiB took %v of the transfer's %v: it waited for the transfers", took, total)
	}
	t.Logf("submit %v, transfer %v", took, total)
}

func pauser(t *testing.T, v *env) Pauser {
	p, ok := v.peer.(Pauser)
	if !ok {
		t.Skip("needs a peer process to stall (Setup.Process)")
	}
	return p
}

// testTimeout stalls the peer under a batch of reads: the tasks end TIMEOUT
// (or FAILED) within the timeout plus the transport's progress bound, and
// once Wait reported that, nothing lands in local memory when the peer
// comes back.
func testTimeout(t *testing.T, s Setup) {
	v := s.startWith(t, func(c *engine.Config) {
		c.TransferTimeout = time.Second
		c.Limits.ProgressTimeout = time.Second
	})
	p := pauser(t, v)
	const per, bs = 32, 1 << 20
	// One round trip first, so connections and sessions exist.
	if st := v.run(v.req(engine.Read, mem.Addr(v.dst), 0, 4096)); st.State != engine.Completed {
		t.Fatalf("%+v", st)
	}
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			p.Resume()
		}
	}()
	t0 := time.Now()
	b := v.submitBlocks(engine.Read, per, bs)
	st, err := b.Wait(30 * time.Second)
	if err != nil {
		t.Fatalf("batch on a stalled peer did not end: %v %+v", err, st)
	}
	t.Logf("ended %v after %v: %v", st.State, time.Since(t0), st.Err)
	terminal(t, b, per)
	canary(v.dst[:per*bs])
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(window)
	intact(t, "timed-out reads", v.dst[:per*bs])
}

// testUnregisterLocal unregisters the local memory of a batch stalled on a
// hung peer: UnregisterMemory returns once nothing can touch it, the memory
// is unmapped (a late access would fault and kill the test), and the peer
// comes back to find nothing to write into.
//
// UnregisterMemory may also refuse with Timeout when accesses it cannot cut
// (a GPU's copies, slow on a loaded machine) outlast its bound; the range
// then stays registered and a retry tries again, which the test does. Until
// it succeeded the memory is never freed: a test that ends early closes the
// engine first (Close returns once its transports let go of every task).
func testUnregisterLocal(t *testing.T, s Setup) {
	v := s.startWith(t, func(c *engine.Config) {
		c.UnregisterGrace = 200 * time.Millisecond
		c.Limits.ProgressTimeout = time.Second
	})
	p := pauser(t, v)
	const per, bs = 16, 1 << 20
	src, err := mem.Alloc(per * bs)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := mem.Alloc(per * bs)
	if err != nil {
		t.Fatal(err)
	}
	freed := false
	defer func() {
		if !freed {
			v.e.Close() // nothing touches src and dst once it returned
			mem.Free(src)
			mem.Free(dst)
		}
	}()
	if err := v.e.RegisterMemoryBatch([]engine.MemoryRegion{
		{Addr: mem.Addr(src), Length: per * bs, Location: "cpu:0"},
		{Addr: mem.Addr(dst), Length: per * bs, Location: "cpu:0"},
	}); err != nil {
		t.Fatal(err)
	}
	if st := v.run(v.req(engine.Read, mem.Addr(dst), 0, 4096)); st.State != engine.Completed {
		t.Fatalf("%+v", st)
	}
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			p.Resume()
		}
	}()
	b, err := v.e.AllocateBatch(2 * per)
	if err != nil {
		t.Fatal(err)
	}
	var reqs []engine.Request
	for i := 0; i < per; i++ {
		reqs = append(reqs, v.req(engine.Write, mem.Addr(src)+uint64(i*bs), uint64(i*bs), bs),
			v.req(engine.Read, mem.Addr(dst)+uint64(i*bs), uint64(i*bs), bs))
	}
	if err := b.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for try := 1; ; try++ {
		err := v.e.UnregisterMemoryBatch([]uint64{mem.Addr(src), mem.Addr(dst)})
		if err == nil {
			break
		}
		if !errors.Is(err, engine.ErrTimeout) || time.Since(t0) > 60*time.Second {
			t.Fatalf("unregister under a stalled peer (try %d, after %v): %v", try, time.Since(t0), err)
		}
		t.Logf("unregister try %d: %v (retrying)", try, err)
	}
	t.Logf("unregister returned after %v", time.Since(t0))
	st, err := b.Wait(0)
	if err != nil || st.State == engine.Pending {
		t.Fatalf("tasks on unregistered memory still pending: %v %+v", err, st)
	}
	terminal(t, b, 2*per)
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	mem.Free(src)
	mem.Free(dst)
	freed = true
	resumed = true
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(window)
	// Still alive: nothing touched the unmapped memory. The engine works.
	if st := v.run(v.req(engine.Write, mem.Addr(v.src), 0, 4096)); st.State != engine.Completed {
		t.Fatalf("write after the peer came back: %+v", st)
	}
}

// testWindow: a transport that declares Caps.Windows honours a window the
// target granted: requests under its key reach its ranges (several of them,
// in one batch) and nothing else, and none after it was revoked, while the
// buffer's own key still works. Over a transport that cannot enforce
// windows a request under one is refused (NotSupported) and lands nothing:
// it never goes under the buffer's own key.
func testWindow(t *testing.T, s Setup) {
	v := s.start(t)
	const bs = 64 << 10
	if c := v.e.Stats().Caps[s.Transport]; !c.Windows {
		if err := v.peer.Fill(0); err != nil {
			t.Fatal(err)
		}
		zero, _ := v.peer.CRC(0, 2*bs)
		key, err := v.peer.Grant([2]uint64{0, 2 * bs})
		if err != nil {
			t.Fatal(err)
		}
		fillRandom(v.src[:bs], 7)
		r := v.req(engine.Write, mem.Addr(v.src), 0, bs)
		r.Window, r.Transport = key, s.Transport
		b, err := v.e.AllocateBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		err = b.Submit(r)
		if err == nil {
			st, _ := b.Wait(30 * time.Second)
			err = st.Err
			if st.State == engine.Completed {
				t.Fatalf("%s carried a request under a window it cannot enforce", s.Transport)
			}
		}
		if errs.CodeOf(err) != errs.NotSupported {
			t.Fatalf("request under a window over %s: %v, want NotSupported", s.Transport, err)
		}
		if got, _ := v.peer.CRC(0, 2*bs); got != zero {
			t.Fatalf("a request under a window over %s landed", s.Transport)
		}
		return
	}
	if err := v.peer.Fill(0); err != nil {
		t.Fatal(err)
	}
	zero, _ := v.peer.CRC(0, 8*bs)
	key, err := v.peer.Grant([2]uint64{bs, bs}, [2]uint64{4 * bs, 2 * bs})
	if err != nil {
		t.Fatal(err)
	}
	fillRandom(v.src[:8*bs], 7)
	win := func(off uint64) engine.Request {
		r := v.req(engine.Write, mem.Addr(v.src)+off, off, bs)
		r.Window = key
		return r
	}
	if st := v.run(win(bs), win(4*bs), win(5*bs)); st.State != engine.Completed {
		t.Fatalf("writes inside the window: %+v", st)
	}
	for _, off := range []uint64{bs, 4 * bs, 5 * bs} {
		got, _ := v.peer.CRC(off, bs)
		if got != crc32.ChecksumIEEE(v.src[off:off+bs]) {
			t.Fatalf("write at %d under the window did not land", off)
		}
	}
	for _, off := range []uint64{0, 2 * bs, 6 * bs} {
		if st := v.run(win(off)); st.State == engine.Completed {
			t.Fatalf("write at %d outside the window completed", off)
		}
		if got, _ := v.peer.CRC(off, bs); got != crc32.ChecksumIEEE(make([]byte, bs)) {
			t.Fatalf("write at %d outside the window landed", off)
		}
	}
	if err := v.peer.Revoke(key); err != nil {
		t.Fatal(err)
	}
	if err := v.peer.Fill(0); err != nil {
		t.Fatal(err)
	}
	if st := v.run(win(bs)); st.State == engine.Completed {
		t.Fatal("write under a revoked window completed")
	}
	if got, _ := v.peer.CRC(0, 8*bs); got != zero {
		t.Fatal("a write under a revoked window landed")
	}
	if st := v.run(v.req(engine.Write, mem.Addr(v.src), bs, bs)); st.State != engine.Completed {
		t.Fatalf("write under the buffer's key after the revoke: %+v", st)
	}
}

// submitBlocks submits per requests of bs bytes each, block i of the local
// buffer (dst for reads, src for writes) to block i of the peer's, in one
// batch, and returns it.
func (v *env) submitBlocks(op engine.Opcode, per int, bs uint64) *engine.Batch {
	v.t.Helper()
	b, err := v.e.AllocateBatch(per)
	if err != nil {
		v.t.Fatal(err)
	}
	local := mem.Addr(v.src)
	if op == engine.Read {
		local = mem.Addr(v.dst)
	}
	reqs := make([]engine.Request, per)
	for i := range reqs {
		reqs[i] = v.req(op, local+uint64(i)*bs, uint64(i)*bs, bs)
	}
	if err := b.Submit(reqs...); err != nil {
		v.t.Fatal(err)
	}
	return b
}
