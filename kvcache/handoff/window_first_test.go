package handoff_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache"
	"github.com/tecache/te/kvcache/handoff"
)

// hijack has h, an engine that holds the cluster secret and learned the key
// of decode's window (from a log, say) but was paired with nothing, write
// its block 1 (all 0xEE) into decode's first destination block, every
// layer, under that key over tr, and returns the outcome.
func hijack(t *testing.T, h *side, dec *child, key uint64) error {
	t.Helper()
	h.cache.Clear(0xEE)
	seg, err := h.e.OpenSegment(dec.segment)
	if err != nil {
		t.Fatal(err)
	}
	defer h.e.CloseSegment(seg)
	p, err := kvcache.NewPlan(&h.cache.Layout, dec.layout, []int{1}, dstBlocks[:1], kvcache.LayerRange{})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := kvcache.EngineRequests(p.Transfers(), seg, engine.Write)
	if err != nil {
		t.Fatal(err)
	}
	for i := range rs {
		rs[i].Window = key
	}
	b, err := h.e.AllocateBatch(len(rs))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if err := b.Submit(rs...); err != nil {
		return err
	}
	st, err := b.Wait(20 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != engine.Completed {
		return st.Err
	}
	return nil
}

// TestWindowFirstUserOnly: with the cluster secret and neither side naming
// the other (Request.Peer empty, as vLLM and SGLang connectors declare),
// decode's window still ends up bound to the mover the sidecar paired,
// over tcp and shm, with no round trip added to the mover's path:
//
//   - the paired mover's push lands byte for byte; then a third engine with
//     the secret that learned the window's key (a hijacker) is refused and
//     lands nothing, though decode has not revoked the window yet;
//   - once the pairing is known to decode (its Wait bound the window to the
//     mover) and before the mover sent a byte, the hijacker is refused too,
//     and the mover's push then lands;
//   - a hijacker that used the key first makes decode's Wait fail with
//     AccessDenied naming it, instead of reporting the transfer done, and
//     the paired mover is refused as well.
func TestWindowFirstUserOnly(t *testing.T) {
	const secret = "handoff-test-cluster-secret-0003"
	sec, err := authsecret.Parse(secret)
	if err != nil {
		t.Fatal(err)
	}
	sc := startSidecarWith(t, sidecar.Config{Secret: sec})
	t.Setenv(authsecret.EnvSecret, secret) // for this process and the child
	ctx := context.Background()
	for _, tr := range []string{"tcp", "shm"} {
		t.Run(tr, func(t *testing.T) {
			dec := startChild(t, sc.addr, tr, decodeShape, time.Second)
			pre := newLocal(t, sc, tr, prefillShape, time.Second)
			h := newLocal(t, sc, tr, prefillShape, time.Second)
			pre.cache.Fill(srcBlocks)
			expect := func(id string) uint64 {
				t.Helper()
				dec.do(command{Op: "clear"})
				a := dec.do(command{Op: "expect", ID: id, Blocks: dstBlocks})
				if a.Err != "" || a.Window == 0 {
					t.Fatalf("expect: %s (window %#x)", a.Err, a.Window)
				}
				return a.Window
			}
			ready := func(id string) *handoff.Transfer {
				t.Helper()
				tx, err := pre.c.Ready(ctx, handoff.Request{ID: id, Layout: &pre.cache.Layout, Blocks: srcBlocks})
				if err != nil {
					t.Fatal(err)
				}
				return tx
			}
			intact := func(what string) {
				t.Helper()
				if a := dec.do(command{Op: "check", Src: srcBlocks, Blocks: dstBlocks}); a.Bad != 0 {
					t.Fatalf("%s: decode cache: %d bad words, first: %s", what, a.Bad, a.First)
				}
			}

			t.Run("after the mover", func(t *testing.T) {
				id := tr + "/after"
				key := expect(id)
				res, err := ready(id).Send(ctx)
				if err != nil || res.Bytes != moved() || res.Transport != tr {
					t.Fatalf("send: %+v %v", res, err)
				}
				intact("the mover's push")
				// Decode has not waited yet: its window is still open.
				err = hijack(t, h, dec, key)
				wantCode(t, "a hijacker after the mover", err, errs.AccessDenied)
				intact("after the hijacker's refused write")
				if a := dec.do(command{Op: "wait", ID: id}); a.Err != "" || a.Result.Bytes != moved() {
					t.Fatalf("decode wait: %+v", a)
				}
			})

			t.Run("before the mover", func(t *testing.T) {
				id := tr + "/before"
				key := expect(id)
				tx := ready(id)
				waiting := dec.send(command{Op: "wait", ID: id})
				// Decode's Wait learns the pairing and binds the window to
				// the mover, which has not sent a byte yet.
				deadline := time.Now().Add(10 * time.Second)
				for {
					a := dec.do(command{Op: "windowpeer", ID: id})
					if a.Err != "" {
						t.Fatal(a.Err)
					}
					if a.Segment == pre.e.Name() {
						break
					}
					if a.Segment != "" || time.Now().After(deadline) {
						t.Fatalf("decode's window bound to %q, want the mover %q", a.Segment, pre.e.Name())
					}
					time.Sleep(2 * time.Millisecond)
				}
				err := hijack(t, h, dec, key)
				wantCode(t, "a hijacker before the mover", err, errs.AccessDenied)
				if a := dec.do(command{Op: "check"}); a.Bad != 0 {
					t.Fatalf("the hijacker's bytes landed: %d words, first: %s", a.Bad, a.First)
				}
				if res, err := tx.Send(ctx); err != nil || res.Bytes != moved() {
					t.Fatalf("send: %+v %v", res, err)
				}
				if a := dec.get(waiting); a.Err != "" || a.Result.Bytes != moved() {
					t.Fatalf("decode wait: %+v", a)
				}
				intact("the mover's push")
			})

			t.Run("hijacker first", func(t *testing.T) {
				id := tr + "/hijacked"
				key := expect(id)
				if err := hijack(t, h, dec, key); err != nil {
					t.Fatalf("the first user of a window nobody was paired with yet: %v", err)
				}
				tx := ready(id)
				waiting := dec.send(command{Op: "wait", ID: id})
				_, err := tx.Send(ctx)
				wantCode(t, "the paired mover after a hijacker", err, errs.AccessDenied)
				a := dec.get(waiting)
				if a.Code != errs.AccessDenied || !strings.Contains(a.Err, h.e.Name()) || !strings.Contains(a.Err, pre.e.Name()) {
					t.Fatalf("decode's Wait after a hijacker used its window first: code %v, %q", a.Code, a.Err)
				}
			})
		})
	}
}
