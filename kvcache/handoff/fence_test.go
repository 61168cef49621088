package handoff_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/sys/proc"
	"github.com/tecache/te/kvcache"
	"github.com/tecache/te/kvcache/handoff"
	"github.com/tecache/te/kvcache/kvtest"
)

// Caches big enough that a transfer is still on the wire when the test
// stops the sender: 8 layers of 256 blocks of 32 KiB per K and V.
var bigShape = kvtest.Shape{Layers: 8, Blocks: 256, BlockSize: 16, Heads: 8, HeadDim: 128, DType: kvcache.BF16}

func blockSpans(t *testing.T, l *kvcache.Layout, blocks []int) [][]byte {
	t.Helper()
	p, err := kvcache.NewPlan(l, l, blocks, blocks, kvcache.LayerRange{})
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, x := range p.Transfers() {
		out = append(out, mem.Bytes(x.Dst, x.Length))
	}
	return out
}

// TestAbortStalledMover: prefill (another process) pushes a large transfer
// and is stopped halfway (SIGSTOP), its bytes still in flight. Decode's Abort
// returns once its window is revoked, without waiting for prefill; decode's
// blocks, overwritten with a canary after it returned, are untouched when
// prefill continues and tries to send the rest.
func TestAbortStalledMover(t *testing.T) {
	sc := startSidecar(t)
	ctx := context.Background()
	pre := startChild(t, sc.addr, "tcp", bigShape, time.Second)
	dec := newLocal(t, sc, "tcp", bigShape, time.Second)
	blocks := make([]int, 240)
	for i := range blocks {
		blocks[i] = i
	}
	spans := blockSpans(t, &dec.cache.Layout, blocks)
	for _, s := range spans {
		clear(s)
	}
	pre.do(command{Op: "fill", Blocks: blocks})
	tx, err := dec.c.Expect(ctx, handoff.Request{ID: "stall", Layout: &dec.cache.Layout, Blocks: blocks})
	if err != nil {
		t.Fatal(err)
	}
	if a := pre.do(command{Op: "ready", ID: "stall", Blocks: blocks}); a.Err != "" {
		t.Fatal(a.Err)
	}
	sending := pre.send(command{Op: "wait", ID: "stall"})
	// Stop prefill as soon as its first bytes land.
	landed := func() bool {
		for _, s := range spans[:4] {
			for _, b := range s {
				if b != 0 {
					return true
				}
			}
		}
		return false
	}
	deadline := time.Now().Add(20 * time.Second)
	for !landed() {
		if time.Now().After(deadline) {
			t.Fatal("no byte of the transfer landed")
		}
		time.Sleep(50 * time.Microsecond)
	}
	if err := proc.Stop(pre.cmd.Process.Pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			pre.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	t0 := time.Now()
	if err := tx.Abort(ctx, "decode gave up"); err != nil {
		t.Fatalf("abort with the mover stopped: %v", err)
	}
	took := time.Since(t0)
	for _, s := range spans {
		for i := range s {
			s[i] = 0xC3
		}
	}
	pre.cmd.Process.Signal(syscall.SIGCONT)
	stopped = false
	a := pre.get(sending)
	if a.Err == "" {
		t.Fatalf("prefill's send completed after decode aborted: %+v", a)
	}
	for k, s := range spans {
		for i, b := range s {
			if b != 0xC3 {
				t.Fatalf("a byte landed in decode's block span %d at %d after Abort returned", k, i)
			}
		}
	}
	if took > 10*time.Second {
		t.Fatalf("abort took %v", took)
	}
	if st := dec.e.Stats(); st.WindowsRevoked == 0 {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("abort returned after %v; prefill's send ended with %s", took, a.Err)
	_, err = tx.Wait(ctx)
	wantCode(t, "wait after abort", err, errs.Canceled)
}
