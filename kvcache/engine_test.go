package kvcache_test

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newEngine(t *testing.T) *engine.Engine {
	t.Helper()
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"local"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func register(t *testing.T, e *engine.Engine, c *cache) {
	t.Helper()
	rs, err := c.l.Regions()
	if err != nil {
		t.Fatal(err)
	}
	var mr []engine.MemoryRegion
	for _, r := range rs {
		mr = append(mr, engine.MemoryRegion{Addr: r.Addr, Length: r.Length, Location: "cpu", Remote: true})
	}
	if err := e.RegisterMemoryBatch(mr); err != nil {
		t.Fatal(err)
	}
}

// TestEngineHandoff moves KV between two engines of this process through the
// engine (local transport), pushing layer by layer with WRITE and pulling
// the whole plan with READ, and checks every destination byte.
func TestEngineHandoff(t *testing.T) {
	prefill, decode := newEngine(t), newEngine(t)
	cases := []struct {
		name     string
		src, dst spec
		sb, db   []int
	}{
		{"vllm HND tp1 to tp2 rank1", spec{format: kvcache.VLLM, order: kvcache.HND, dtype: kvcache.BF16, blocks: 16, blockSize: 8, heads: 4, totalHeads: 4, headDim: 16, layers: 4},
			spec{format: kvcache.VLLM, order: kvcache.HND, dtype: kvcache.BF16, blocks: 12, blockSize: 8, heads: 2, headStart: 2, totalHeads: 4, headDim: 16, layers: 4, gap: 4096},
			[]int{3, 4, 5, 9, 15, 0}, []int{11, 2, 3, 4, 7, 8}},
		{"vllm NHD tp split", spec{format: kvcache.VLLM, order: kvcache.NHD, dtype: kvcache.FP16, blocks: 8, blockSize: 4, heads: 4, totalHeads: 4, headDim: 8, layers: 3},
			spec{format: kvcache.VLLM, order: kvcache.NHD, dtype: kvcache.FP16, blocks: 8, blockSize: 4, heads: 1, headStart: 3, totalHeads: 4, headDim: 8, layers: 3, split: true},
			[]int{1, 2, 6}, []int{5, 0, 3}},
		{"sglang to flashinfer", spec{format: kvcache.SGLang, dtype: kvcache.BF16, blocks: 10, blockSize: 16, heads: 2, totalHeads: 2, headDim: 32, layers: 2},
			spec{format: kvcache.FlashInfer, dtype: kvcache.BF16, blocks: 10, blockSize: 16, heads: 2, totalHeads: 2, headDim: 32, layers: 2},
			[]int{0, 1, 2, 3, 8}, []int{4, 5, 6, 7, 1}},
		{"mla", spec{format: kvcache.MLA, dtype: kvcache.FP8E4M3, blocks: 6, blockSize: 8, headDim: 72, layers: 3},
			spec{format: kvcache.MLA, dtype: kvcache.FP8E4M3, blocks: 9, blockSize: 8, headDim: 72, layers: 3},
			[]int{5, 0, 1}, []int{2, 7, 8}},
	}
	for _, c := range cases {
		for _, op := range []engine.Opcode{engine.Write, engine.Read} {
			name := c.name + "/write-per-layer"
			if op == engine.Read {
				name = c.name + "/read-all"
			}
			t.Run(name, func(t *testing.T) {
				src, dst := newCache(t, c.src), newCache(t, c.dst)
				p, err := kvcache.NewPlan(&src.l, &dst.l, c.sb, c.db, kvcache.LayerRange{})
				if err != nil {
					t.Fatal(err)
				}
				src.fill()
				dst.noise(3)
				want := expect(src, dst, c.sb, c.db, p.Layers().Start, p.Layers().End)
				register(t, prefill, src)
				register(t, decode, dst)
				defer unregister(t, prefill, src)
				defer unregister(t, decode, dst)

				local, peer := prefill, decode
				if op == engine.Read {
					local, peer = decode, prefill
				}
				seg, err := local.OpenSegment(peer.Name())
				if err != nil {
					t.Fatal(err)
				}
				defer local.CloseSegment(seg)
				b, err := local.AllocateBatch(p.Stats().Requests)
				if err != nil {
					t.Fatal(err)
				}
				defer b.Free()
				if op == engine.Write {
					// Push each layer as soon as it is "computed".
					for l := p.Layers().Start; l < p.Layers().End; l++ {
						if err := kvcache.SubmitLayer(b, seg, p, l, op); err != nil {
							t.Fatal(err)
						}
					}
				} else if err := kvcache.Submit(b, seg, p, op); err != nil {
					t.Fatal(err)
				}
				st, err := b.Wait(10 * time.Second)
				if err != nil || st.State != engine.Completed || st.Transferred != p.Stats().Bytes {
					t.Fatalf("batch %+v, %v; want %d bytes", st, err, p.Stats().Bytes)
				}
				if ts, err := b.TaskStatus(0); err != nil || ts.Transport != "local" {
					t.Fatalf("task 0: %+v %v, want the local transport", ts, err)
				}
				compare(t, dst, want)
			})
		}
	}
}

func unregister(t *testing.T, e *engine.Engine, c *cache) {
	rs, _ := c.l.Regions()
	var as []uint64
	for _, r := range rs {
		as = append(as, r.Addr)
	}
	if err := e.UnregisterMemoryBatch(as); err != nil {
		t.Error(err)
	}
}

// TestSubmitErrors: bad arguments are refused with InvalidArgument before
// anything moves; memory that is not registered is refused by the engine.
func TestSubmitErrors(t *testing.T) {
	a, b := newEngine(t), newEngine(t)
	s := spec{format: kvcache.VLLM, dtype: kvcache.BF16, blocks: 4, blockSize: 2, heads: 1, headDim: 4, layers: 2}
	src, dst := newCache(t, s), newCache(t, s)
	p, err := kvcache.NewPlan(&src.l, &dst.l, []int{0, 1}, []int{2, 3}, kvcache.LayerRange{})
	if err != nil {
		t.Fatal(err)
	}
	register(t, b, dst)
	seg, err := a.OpenSegment(b.Name())
	if err != nil {
		t.Fatal(err)
	}
	bt, err := a.AllocateBatch(64)
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func() error{
		"layer outside": func() error { return kvcache.SubmitLayer(bt, seg, p, 2, engine.Write) },
		"nil batch":     func() error { return kvcache.SubmitLayer(nil, seg, p, 0, engine.Write) },
		"nil plan":      func() error { return kvcache.Submit(bt, seg, nil, engine.Write) },
		"nil segment":   func() error { return kvcache.SubmitLayer(bt, nil, p, 0, engine.Write) },
		"bad opcode":    func() error { return kvcache.SubmitLayer(bt, seg, p, 0, engine.Opcode(9)) },
	} {
		if err := f(); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want invalid argument", name, err)
		}
	}
	// The source side's memory is not registered with engine a.
	if err := kvcache.SubmitLayer(bt, seg, p, 0, engine.Write); !errors.Is(err, errs.ErrAddressNotRegistered) {
		t.Errorf("unregistered source: got %v", err)
	}
	if st := bt.Status(); st.Tasks != 0 {
		t.Errorf("refused submissions left %d tasks", st.Tasks)
	}
}
