package handoff_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache"
	"github.com/tecache/te/kvcache/handoff"
	"github.com/tecache/te/kvcache/kvtest"
)

// Small caches with the vLLM shape: 4 layers, 4 KiB blocks.
var (
	prefillShape = kvtest.Shape{Layers: 4, Blocks: 64, BlockSize: 16, Heads: 2, HeadDim: 64, DType: kvcache.BF16}
	decodeShape  = kvtest.Shape{Layers: 4, Blocks: 80, BlockSize: 16, Heads: 2, HeadDim: 64, DType: kvcache.BF16}
	// Non-contiguous on both sides, with some runs that coalesce.
	srcBlocks = []int{5, 6, 7, 8, 20, 21, 3, 40, 41, 42, 43, 63}
	dstBlocks = []int{0, 1, 2, 30, 31, 9, 10, 11, 50, 51, 52, 79}
)

func moved() uint64 {
	return uint64(prefillShape.Layers) * 2 * uint64(len(srcBlocks)) * prefillShape.BlockBytes()
}

// TestHandoff moves KV from this process (prefill) to a decode process
// through a real sidecar, over tcp and shm, pushing (whole or layer by
// layer) and pulling, with either side declaring first, and checks every
// byte of decode's cache.
func TestHandoff(t *testing.T) {
	sc := startSidecar(t)
	ctx := context.Background()
	for _, tr := range []string{"tcp", "shm"} {
		t.Run(tr, func(t *testing.T) {
			dec := startChild(t, sc.addr, tr, decodeShape, time.Second)
			pre := newLocal(t, sc, tr, prefillShape, time.Second)
			pre.cache.Fill(srcBlocks)
			for _, c := range []struct {
				name       string
				mode       handoff.Mode
				layered    bool
				readyFirst bool
			}{
				{"push", handoff.Push, false, false},
				{"push layer by layer", handoff.Push, true, true},
				{"pull", handoff.Pull, false, true},
				{"pull expect first", handoff.Pull, false, false},
			} {
				t.Run(c.name, func(t *testing.T) {
					id := tr + "/" + c.name
					dec.do(command{Op: "clear"})
					expect := func() {
						if a := dec.do(command{Op: "expect", ID: id, Blocks: dstBlocks, Mode: string(c.mode)}); a.Err != "" {
							t.Fatalf("expect: %s", a.Err)
						}
					}
					if !c.readyFirst {
						expect()
					}
					tx, err := pre.c.Ready(ctx, handoff.Request{ID: id, Layout: &pre.cache.Layout, Blocks: srcBlocks})
					if err != nil {
						t.Fatal(err)
					}
					if c.readyFirst {
						expect()
					}
					waiting := dec.send(command{Op: "wait", ID: id})
					if c.layered {
						for l := prefillShape.Layers - 1; l >= 0; l-- { // any order
							if err := tx.SendLayer(ctx, l); err != nil {
								t.Fatal(err)
							}
						}
						if err := tx.SendLayer(ctx, 0); !errors.Is(err, errs.ErrInvalidArgument) {
							t.Fatalf("layer sent twice: %v", err)
						}
					}
					res, err := tx.Send(ctx)
					if err != nil {
						t.Fatal(err)
					}
					a := dec.get(waiting)
					if a.Err != "" {
						t.Fatalf("decode wait: %s", a.Err)
					}
					mover, other := res, a.Result
					if c.mode == handoff.Pull {
						mover, other = a.Result, res
					}
					if !mover.Mover || other.Mover || mover.Bytes != moved() || other.Bytes != moved() || mover.Transport != tr ||
						mover.Mode != c.mode || !mover.Recorded || mover.Requests <= 0 || mover.Requests >= mover.BlockRequests {
						t.Fatalf("results: mover %+v, other %+v (want %d bytes over %s)", mover, other, moved(), tr)
					}
					if c.layered && mover.Requests <= prefillShape.Layers {
						t.Fatalf("layer by layer should coalesce within layers only: %+v", mover)
					}
					if a := dec.do(command{Op: "check", Src: srcBlocks, Blocks: dstBlocks}); a.Bad != 0 {
						t.Fatalf("decode cache: %d bad words, first: %s", a.Bad, a.First)
					}
					if a := dec.do(command{Op: "status", ID: id}); a.Status.State != "done" || !a.Status.Settled || a.Status.Bytes != moved() {
						t.Fatalf("status: %+v %s", a.Status, a.Err)
					}
				})
			}
			if a := dec.do(command{Op: "stats"}); a.Stats.NotifiesReceived == 0 {
				t.Fatalf("decode received no completion notification: %+v", a.Stats)
			}
		})
	}
}

// TestAbort aborts from each side, before pairing and after, and checks
// that the other side learns it and that an abort returns only once the
// mover has stopped (the transfer is settled).
func TestAbort(t *testing.T) {
	sc := startSidecar(t)
	ctx := context.Background()
	dec := startChild(t, sc.addr, "tcp", decodeShape, time.Second)
	pre := newLocal(t, sc, "tcp", prefillShape, time.Second)
	ready := func(id string) (*handoff.Transfer, error) {
		return pre.c.Ready(ctx, handoff.Request{ID: id, Layout: &pre.cache.Layout, Blocks: srcBlocks})
	}

	t.Run("decode before pairing", func(t *testing.T) {
		dec.do(command{Op: "expect", ID: "a1", Blocks: dstBlocks})
		if a := dec.do(command{Op: "abort", ID: "a1", Reason: "request cancelled"}); a.Err != "" {
			t.Fatal(a.Err)
		}
		_, err := ready("a1")
		wantCode(t, "ready after decode aborted", err, errs.Canceled)
		if !strings.Contains(err.Error(), "request cancelled") {
			t.Fatalf("the reason is lost: %v", err)
		}
	})

	t.Run("prefill after pairing, push", func(t *testing.T) {
		dec.do(command{Op: "expect", ID: "a2", Blocks: dstBlocks})
		tx, err := ready("a2")
		if err != nil {
			t.Fatal(err)
		}
		waiting := dec.send(command{Op: "wait", ID: "a2"})
		if err := tx.Abort(ctx, "out of memory"); err != nil {
			t.Fatal(err)
		}
		a := dec.get(waiting)
		if a.Code != errs.Canceled || !strings.Contains(a.Err, "out of memory") {
			t.Fatalf("decode wait after prefill abort: %+v", a)
		}
		if st, err := tx.Status(ctx); err != nil || st.State != "aborted" || !st.Settled {
			t.Fatalf("status %+v %v", st, err)
		}
		if _, err := tx.Wait(ctx); errs.CodeOf(err) != errs.Canceled {
			t.Fatalf("wait after abort: %v", err)
		}
	})

	t.Run("decode after pairing, push", func(t *testing.T) {
		dec.do(command{Op: "expect", ID: "a3", Blocks: dstBlocks})
		tx, err := ready("a3")
		if err != nil {
			t.Fatal(err)
		}
		// Decode's abort returns once its window is revoked, before
		// prefill (the mover) reports: nothing prefill sends lands then.
		if a := dec.do(command{Op: "abort", ID: "a3", Reason: "decode restarting"}); a.Err != "" {
			t.Fatal(a.Err)
		}
		abortedAt(t, tx)
		_, err = tx.Wait(ctx)
		wantCode(t, "prefill wait after decode abort", err, errs.Canceled)
	})

	t.Run("prefill after pairing, pull", func(t *testing.T) {
		tx, err := ready("a4")
		if err != nil {
			t.Fatal(err)
		}
		dec.do(command{Op: "expect", ID: "a4", Blocks: dstBlocks, Mode: "pull"})
		aborted := make(chan error, 1)
		go func() { aborted <- tx.Abort(ctx, "shutting down") }()
		abortedAt(t, tx)
		a := dec.do(command{Op: "wait", ID: "a4"})
		if a.Code != errs.Canceled {
			t.Fatalf("decode (the reader) wait after prefill abort: %+v", a)
		}
		select {
		case err := <-aborted:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("prefill's abort did not return once decode reported")
		}
	})

	t.Run("abort a finished transfer", func(t *testing.T) {
		dec.do(command{Op: "expect", ID: "a5", Blocks: dstBlocks})
		tx, err := ready("a5")
		if err != nil {
			t.Fatal(err)
		}
		waiting := dec.send(command{Op: "wait", ID: "a5"})
		if _, err := tx.Send(ctx); err != nil {
			t.Fatal(err)
		}
		dec.get(waiting)
		wantCode(t, "abort after done", tx.Abort(ctx, "late"), errs.InvalidArgument)
	})
}

// TestExpiry: a transfer nobody pairs expires, and both kinds of side learn
// it with a Timeout error.
func TestExpiry(t *testing.T) {
	sc := startSidecar(t)
	ctx := context.Background()
	dec := startChild(t, sc.addr, "tcp", decodeShape, time.Second)
	pre := newLocal(t, sc, "tcp", prefillShape, time.Second)

	dec.do(command{Op: "expect", ID: "e1", Blocks: dstBlocks, Timeout: 300})
	t0 := time.Now()
	if a := dec.do(command{Op: "wait", ID: "e1"}); a.Code != errs.Timeout || !strings.Contains(a.Err, "prefill never declared") {
		t.Fatalf("decode wait: %+v", a)
	}
	if el := time.Since(t0); el > 5*time.Second {
		t.Fatalf("expiry took %v", el)
	}
	tx, err := pre.c.Ready(ctx, handoff.Request{ID: "e2", Layout: &pre.cache.Layout, Blocks: srcBlocks, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Send(ctx)
	wantCode(t, "prefill send, nobody expects", err, errs.Timeout)
	// A late declaration learns that the transfer expired.
	if a := dec.do(command{Op: "expect", ID: "e2", Blocks: dstBlocks}); a.Code != errs.Timeout {
		t.Fatalf("late expect: %+v", a)
	}
}

// TestSidecarRestart: transfers declared to a sidecar that restarts are
// reported lost (TransferLost), on both sides, instead of waited for.
func TestSidecarRestart(t *testing.T) {
	sc := startSidecar(t)
	ctx := context.Background()
	dec := startChild(t, sc.addr, "tcp", decodeShape, 500*time.Millisecond)
	pre := newLocal(t, sc, "tcp", prefillShape, 500*time.Millisecond)

	// Decode waits, unpaired, while the sidecar restarts.
	dec.do(command{Op: "expect", ID: "l1", Blocks: dstBlocks})
	waiting := dec.send(command{Op: "wait", ID: "l1"})
	deadline := time.Now().Add(10 * time.Second)
	for sc.srv.Handoff().Usage().LongPolls == 0 { // decode is in its long poll
		if time.Now().After(deadline) {
			t.Fatal("decode's wait never reached the sidecar")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Paired, but prefill has not sent yet.
	dec.do(command{Op: "expect", ID: "l2", Blocks: dstBlocks})
	tx, err := pre.c.Ready(ctx, handoff.Request{ID: "l2", Layout: &pre.cache.Layout, Blocks: srcBlocks})
	if err != nil {
		t.Fatal(err)
	}
	sc.restart()

	a := dec.get(waiting)
	if a.Code != errs.TransferLost || !strings.Contains(a.Err, "restarted") && !strings.Contains(a.Err, "no longer knows") {
		t.Fatalf("decode wait across a restart: %+v", a)
	}
	_, err = tx.Send(ctx)
	// Prefill learned decode's declaration before the restart, so it may
	// have moved the bytes (and notified decode) before it learned about
	// the restart: either it moved everything, or it reports the loss.
	if err != nil && !errors.Is(err, errs.ErrTransferLost) {
		t.Fatalf("prefill send across a restart: %v", err)
	}
	_, err = tx.Status(ctx)
	wantCode(t, "status across a restart", err, errs.TransferLost)
	// A fresh declaration on the new sidecar works.
	if a := dec.do(command{Op: "expect", ID: "l3", Blocks: dstBlocks}); a.Err != "" {
		t.Fatal(a.Err)
	}
	waiting = dec.send(command{Op: "wait", ID: "l3"})
	tx, err = pre.c.Ready(ctx, handoff.Request{ID: "l3", Layout: &pre.cache.Layout, Blocks: srcBlocks})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Send(ctx); err != nil {
		t.Fatal(err)
	}
	if a := dec.get(waiting); a.Err != "" {
		t.Fatal(a.Err)
	}
}

// TestSidecarGone: with no sidecar at all, a waiting side gives up as lost
// after LostGrace instead of waiting forever.
func TestSidecarGone(t *testing.T) {
	sc := startSidecar(t)
	ctx := context.Background()
	pre := newLocal(t, sc, "tcp", prefillShape, 300*time.Millisecond)
	tx, err := pre.c.Ready(ctx, handoff.Request{ID: "g1", Layout: &pre.cache.Layout, Blocks: srcBlocks})
	if err != nil {
		t.Fatal(err)
	}
	sc.stop()
	t0 := time.Now()
	_, err = tx.Send(ctx)
	wantCode(t, "send with the sidecar gone", err, errs.TransferLost)
	if el := time.Since(t0); el > 5*time.Second {
		t.Fatalf("took %v", el)
	}
	_, err = pre.c.Ready(ctx, handoff.Request{ID: "g2", Layout: &pre.cache.Layout, Blocks: srcBlocks})
	wantCode(t, "ready with the sidecar gone", err, errs.PeerUnreachable)
}

// TestBadInput: the client's and the sidecar's refusals arrive as clear
// errors with stable codes.
func TestBadInput(t *testing.T) {
	sc := startSidecar(t)
	ctx := context.Background()
	pre := newLocal(t, sc, "tcp", prefillShape, time.Second)
	dec := newLocal(t, sc, "tcp", decodeShape, time.Second)
	l := &pre.cache.Layout
	for _, c := range []struct {
		name string
		r    handoff.Request
	}{
		{"nil layout", handoff.Request{ID: "b", Blocks: srcBlocks}},
		{"invalid layout", handoff.Request{ID: "b", Layout: &kvcache.Layout{Format: kvcache.VLLM}, Blocks: srcBlocks}},
		{"no id", handoff.Request{Layout: l, Blocks: srcBlocks}},
		{"no blocks", handoff.Request{ID: "b", Layout: l}},
		{"block out of range", handoff.Request{ID: "b", Layout: l, Blocks: []int{64}}},
		{"bad mode", handoff.Request{ID: "b", Layout: l, Blocks: srcBlocks, Mode: "sideways"}},
		{"negative timeout", handoff.Request{ID: "b", Layout: l, Blocks: srcBlocks, Timeout: -1}},
	} {
		_, err := pre.c.Ready(ctx, c.r)
		wantCode(t, c.name, err, errs.InvalidArgument)
	}
	if _, err := handoff.New(nil, handoff.Options{Sidecar: sc.addr}); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("nil engine: %v", err)
	}
	for _, addr := range []string{"", "ftp://x", "http://"} {
		if _, err := handoff.New(pre.e, handoff.Options{Sidecar: addr}); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Fatalf("sidecar %q: %v", addr, err)
		}
	}
	// Duplicate id.
	if _, err := pre.c.Ready(ctx, handoff.Request{ID: "dup", Layout: l, Blocks: srcBlocks}); err != nil {
		t.Fatal(err)
	}
	_, err := pre.c.Ready(ctx, handoff.Request{ID: "dup", Layout: l, Blocks: srcBlocks})
	wantCode(t, "duplicate ready", err, errs.InvalidArgument)
	// Caches that cannot match: the second declaration fails, and the first
	// side's Wait learns it.
	tx, err := pre.c.Ready(ctx, handoff.Request{ID: "mm", Layout: l, Blocks: srcBlocks[:3]})
	if err != nil {
		t.Fatal(err)
	}
	_, err = dec.c.Expect(ctx, handoff.Request{ID: "mm", Layout: &dec.cache.Layout, Blocks: dstBlocks})
	wantCode(t, "expect with a different block count", err, errs.InvalidArgument)
	if !strings.Contains(err.Error(), "do not match") {
		t.Fatal(err)
	}
	_, err = tx.Wait(ctx)
	wantCode(t, "wait on a mismatched transfer", err, errs.InvalidArgument)
	// SendLayer is for the pushing prefill only.
	dt, err := dec.c.Expect(ctx, handoff.Request{ID: "sl", Layout: &dec.cache.Layout, Blocks: dstBlocks})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "decode SendLayer", dt.SendLayer(ctx, 0), errs.InvalidArgument)
	pt, err := pre.c.Ready(ctx, handoff.Request{ID: "sl", Layout: l, Blocks: srcBlocks})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "layer out of range", pt.SendLayer(ctx, 4), errs.InvalidArgument)
	// Decode's abort returns once prefill, the mover, has reported.
	aborted := make(chan error, 1)
	go func() { aborted <- dt.Abort(ctx, "test over") }()
	abortedAt(t, pt)
	_, err = pt.Wait(ctx)
	wantCode(t, "wait after abort", err, errs.Canceled)
	if err := <-aborted; err != nil {
		t.Fatal(err)
	}
}

// TestNotifiesPassThrough: notifications that are not handoff completions
// reach the application through Client.Notifies.
func TestNotifiesPassThrough(t *testing.T) {
	sc := startSidecar(t)
	a := newLocal(t, sc, "tcp", prefillShape, time.Second)
	b := newLocal(t, sc, "tcp", decodeShape, time.Second)
	if err := a.e.SendNotify(b.e.Name(), "app", "hello"); err != nil {
		t.Fatal(err)
	}
	if err := a.e.SendNotify(b.e.Name(), handoff.NotifyName, "not json"); err != nil {
		t.Fatal(err)
	}
	got := b.c.Notifies()
	if len(got) != 1 || got[0] != (engine.Notification{Name: "app", Msg: "hello"}) {
		t.Fatalf("notifies: %+v", got)
	}
}

// TestSecret: with a cluster secret on te-sidecar, both sides (this process
// and a child, which read TE_AUTH_SECRET) hand off as before; a client
// without the secret is refused with Unauthenticated; and a third party
// that holds the secret but not the transfer's capability can neither
// report nor abort the transfer.
func TestSecret(t *testing.T) {
	const secret = "handoff-test-cluster-secret-0001"
	sec, err := authsecret.Parse(secret)
	if err != nil {
		t.Fatal(err)
	}
	sc := startSidecarWith(t, sidecar.Config{Secret: sec})
	t.Setenv(authsecret.EnvSecret, secret) // for this process and the child
	ctx := context.Background()
	dec := startChild(t, sc.addr, "tcp", decodeShape, time.Second)
	pre := newLocal(t, sc, "tcp", prefillShape, time.Second)
	pre.cache.Fill(srcBlocks)

	if a := dec.do(command{Op: "expect", ID: "s1", Blocks: dstBlocks}); a.Err != "" {
		t.Fatalf("expect: %s", a.Err)
	}
	tx, err := pre.c.Ready(ctx, handoff.Request{ID: "s1", Layout: &pre.cache.Layout, Blocks: srcBlocks})
	if err != nil {
		t.Fatal(err)
	}
	// A third party with the secret's token but no capability.
	forge := func(path, body string) int {
		req, _ := http.NewRequest("POST", "http://"+sc.addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+sec.Token())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// Refused as an unknown id is: the third party does not even learn
	// that s1 exists.
	if c := forge("/handoff/complete", `{"id":"s1","ok":true,"bytes":1}`); c != 404 {
		t.Fatalf("forged complete: %d", c)
	}
	if c := forge("/handoff/abort", `{"id":"s1","reason":"forged"}`); c != 404 {
		t.Fatalf("forged abort: %d", c)
	}
	waiting := dec.send(command{Op: "wait", ID: "s1"})
	if res, err := tx.Send(ctx); err != nil || res.Bytes != moved() {
		t.Fatalf("send: %+v %v", res, err)
	}
	if a := dec.get(waiting); a.Err != "" || a.Result.Bytes != moved() {
		t.Fatalf("decode wait: %+v", a)
	}
	if a := dec.do(command{Op: "check", Src: srcBlocks, Blocks: dstBlocks}); a.Bad != 0 {
		t.Fatalf("decode cache: %d bad words, first: %s", a.Bad, a.First)
	}
	http.DefaultClient.CloseIdleConnections()

	// Without the secret's token.
	wrong, err := handoff.New(pre.e, handoff.Options{Sidecar: sc.addr, Token: "not-the-token"})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	_, err = wrong.Ready(ctx, handoff.Request{ID: "s2", Layout: &pre.cache.Layout, Blocks: srcBlocks})
	wantCode(t, "ready without the token", err, errs.Unauthenticated)
	if !strings.Contains(err.Error(), authsecret.EnvSecret) {
		t.Fatalf("the error does not say how to fix it: %v", err)
	}
	if _, err := handoff.New(pre.e, handoff.Options{Sidecar: sc.addr, AuthSecret: "short"}); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("a weak secret: %v", err)
	}
}

// abortedAt waits until the sidecar holds tx as aborted.
func abortedAt(t *testing.T, tx *handoff.Transfer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := tx.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.State == "aborted" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("transfer %s not aborted: %+v", tx.ID(), st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPlantedNotice: a te.handoff notice planted before the transfer pairs
// (by an engine that holds whatever the cluster needs, but is not the
// paired mover and has no notice key), unsigned or with a made-up MAC, and
// one for an id nobody declared, complete nothing: decode's Wait returns
// only once the real mover moved every byte, and its cache is right.
func TestPlantedNotice(t *testing.T) {
	sc := startSidecar(t)
	ctx := context.Background()
	pre := newLocal(t, sc, "tcp", prefillShape, time.Second)
	dec := newLocal(t, sc, "tcp", decodeShape, time.Second)
	forger := newLocal(t, sc, "tcp", prefillShape, time.Second)
	pre.cache.Fill(srcBlocks)
	dec.cache.Clear(0)
	const id = "planted"
	plant := func(id string, mac string) {
		t.Helper()
		msg := `{"id":"` + id + `","ok":true,"bytes":` + strconv.FormatUint(moved(), 10) + `,"mac":"` + mac + `"}`
		if err := forger.e.SendNotify(dec.e.Name(), handoff.NotifyName, msg); err != nil {
			t.Fatal(err)
		}
	}
	plant("not-declared", "")
	tx, err := dec.c.Expect(ctx, handoff.Request{ID: id, Layout: &dec.cache.Layout, Blocks: dstBlocks, Mode: handoff.Push})
	if err != nil {
		t.Fatal(err)
	}
	plant(id, "")
	plant(id, strings.Repeat("ab", 32))
	type out struct {
		res handoff.Result
		err error
	}
	waited := make(chan out, 1)
	go func() {
		res, err := tx.Wait(ctx)
		waited <- out{res, err}
	}()
	ptx, err := pre.c.Ready(ctx, handoff.Request{ID: id, Layout: &pre.cache.Layout, Blocks: srcBlocks})
	if err != nil {
		t.Fatal(err)
	}
	plant(id, "") // after pairing too
	select {
	case o := <-waited:
		t.Fatalf("decode's Wait returned before the mover moved anything: %+v, %v", o.res, o.err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := ptx.Send(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-waited:
		if o.err != nil || o.res.Bytes != moved() {
			t.Fatalf("decode's Wait: %+v, %v", o.res, o.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("decode's Wait did not return after the transfer")
	}
	if bad, first := dec.cache.Check(srcBlocks, dstBlocks, 0); bad != 0 {
		t.Fatalf("decode cache: %d bad words, first: %s", bad, first)
	}
}

// TestWindowBoundToMover: with the cluster secret, a side that names the
// engine it expects on the other end (Request.Peer) grants its window to
// that engine alone. Decode names this process's prefill: the push lands.
// Decode names another segment: prefill, paired by the sidecar and holding
// the key, is refused by decode's engine over tcp, the transfer fails and
// not a byte lands in decode's blocks. A mover that named another segment
// than the one it was paired with refuses to move.
func TestWindowBoundToMover(t *testing.T) {
	const secret = "handoff-test-cluster-secret-0002"
	sec, err := authsecret.Parse(secret)
	if err != nil {
		t.Fatal(err)
	}
	sc := startSidecarWith(t, sidecar.Config{Secret: sec})
	t.Setenv(authsecret.EnvSecret, secret) // for this process and the child
	ctx := context.Background()
	dec := startChild(t, sc.addr, "tcp", decodeShape, time.Second)
	pre := newLocal(t, sc, "tcp", prefillShape, time.Second)
	pre.cache.Fill(srcBlocks)
	push := func(id, bound string, mine string) (answer, error) {
		t.Helper()
		dec.do(command{Op: "clear"})
		if a := dec.do(command{Op: "expect", ID: id, Blocks: dstBlocks, Segment: bound}); a.Err != "" {
			t.Fatalf("expect: %s", a.Err)
		}
		tx, err := pre.c.Ready(ctx, handoff.Request{ID: id, Layout: &pre.cache.Layout, Blocks: srcBlocks, Peer: mine})
		if err != nil {
			t.Fatal(err)
		}
		waiting := dec.send(command{Op: "wait", ID: id})
		_, err = tx.Send(ctx)
		return dec.get(waiting), err
	}
	if a, err := push("w1", pre.e.Name(), dec.segment); err != nil || a.Err != "" {
		t.Fatalf("bound to the mover: send %v, decode %s", err, a.Err)
	}
	if a := dec.do(command{Op: "check", Src: srcBlocks, Blocks: dstBlocks}); a.Bad != 0 {
		t.Fatalf("decode cache: %d bad words, first: %s", a.Bad, a.First)
	}
	a, err := push("w2", "127.0.0.1:1", "")
	if errs.CodeOf(err) != errs.AccessDenied || a.Err == "" {
		t.Fatalf("bound to another engine: send %v, decode %q", err, a.Err)
	}
	// Nothing moved: every word of decode's cache is still cleared.
	if a := dec.do(command{Op: "check"}); a.Bad != 0 {
		t.Fatalf("the refused mover's bytes landed in decode's cache: %d words, first: %s", a.Bad, a.First)
	}
	_, err = push("w3", "", "127.0.0.1:1")
	if errs.CodeOf(err) != errs.AccessDenied || !strings.Contains(err.Error(), "paired with") {
		t.Fatalf("mover paired with another segment than it named: %v", err)
	}
}
