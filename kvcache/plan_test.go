package kvcache_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache"
)

// run plans src -> dst, checks the plan's invariants, executes it with
// memcpy (layer by layer when perLayer, else the merged list) and checks
// every destination byte.
func run(t *testing.T, src, dst *cache, sb, db []int, lr kvcache.LayerRange, perLayer bool) *kvcache.Plan {
	t.Helper()
	p, err := kvcache.NewPlan(&src.l, &dst.l, sb, db, lr)
	if err != nil {
		t.Fatal(err)
	}
	src.fill()
	dst.noise(uint64(len(sb)))
	l0, l1 := p.Layers().Start, p.Layers().End
	want := expect(src, dst, sb, db, l0, l1)
	checkInvariants(t, p)
	within(t, src, dst, p.Transfers())
	if perLayer {
		for l := l0; l < l1; l++ {
			memcpyAll(p.Layer(l))
		}
	} else {
		memcpyAll(p.Transfers())
	}
	compare(t, dst, want)
	return p
}

func checkInvariants(t *testing.T, p *kvcache.Plan) {
	t.Helper()
	st := p.Stats()
	sum := func(ts []kvcache.Transfer) (n uint64) {
		for _, x := range ts {
			n += x.Length
		}
		return n
	}
	if got := sum(p.Transfers()); got != st.Bytes {
		t.Fatalf("merged transfers move %d bytes, stats say %d", got, st.Bytes)
	}
	var perLayer uint64
	n := 0
	for l := p.Layers().Start; l < p.Layers().End; l++ {
		perLayer += sum(p.Layer(l))
		n += len(p.Layer(l))
		if len(p.Layer(l)) > p.MaxLayerTransfers() {
			t.Fatal("MaxLayerTransfers too small")
		}
	}
	if perLayer != st.Bytes || n != st.Requests || len(p.Transfers()) != st.Merged {
		t.Fatalf("per-layer %d bytes / %d requests, merged %d; stats %+v", perLayer, n, len(p.Transfers()), st)
	}
	if !(st.Merged <= st.Requests && st.Requests <= st.BlockRequests) {
		t.Fatalf("coalescing increased the count: %+v", st)
	}
	// No destination byte is written twice.
	ds := slices.Clone(p.Transfers())
	slices.SortFunc(ds, func(a, b kvcache.Transfer) int { return int(int64(a.Dst - b.Dst)) })
	for i := 1; i < len(ds); i++ {
		if ds[i].Dst < ds[i-1].Dst+ds[i-1].Length {
			t.Fatalf("destination ranges overlap: %+v %+v", ds[i-1], ds[i])
		}
	}
	// Nothing mergeable is left.
	for i := 1; i < len(p.Transfers()); i++ {
		a, b := p.Transfers()[i-1], p.Transfers()[i]
		if a.Src+a.Length == b.Src && a.Dst+a.Length == b.Dst {
			t.Fatalf("transfers %+v and %+v left unmerged", a, b)
		}
	}
}

func base(f kvcache.Format, o kvcache.Order) spec {
	return spec{format: f, order: o, dtype: kvcache.BF16, blocks: 10, blockSize: 4, heads: 4, totalHeads: 4, headDim: 8, layers: 3}
}

func TestPlanByteExact(t *testing.T) {
	nonContig := []int{7, 2, 3, 9, 0}
	nonContigDst := []int{1, 5, 6, 8, 4}
	with := func(s spec, f func(*spec)) spec { f(&s); return s }
	cases := []struct {
		name     string
		src, dst spec
		sb, db   []int
		lr       kvcache.LayerRange
	}{
		{"vllm NHD same", base(kvcache.VLLM, kvcache.NHD), base(kvcache.VLLM, kvcache.NHD), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"vllm HND same gaps", with(base(kvcache.VLLM, kvcache.HND), func(s *spec) { s.gap = 100 }), base(kvcache.VLLM, kvcache.HND), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"vllm NHD to HND", base(kvcache.VLLM, kvcache.NHD), base(kvcache.VLLM, kvcache.HND), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"vllm HND to NHD split", base(kvcache.VLLM, kvcache.HND), with(base(kvcache.VLLM, kvcache.NHD), func(s *spec) { s.split = true }), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"vllm split HND reversed layers", with(base(kvcache.VLLM, kvcache.HND), func(s *spec) { s.split = true; s.reverse = true }), with(base(kvcache.VLLM, kvcache.HND), func(s *spec) { s.split = true }), []int{0, 1, 2, 3}, []int{4, 5, 6, 7}, kvcache.LayerRange{}},
		{"flashinfer NHD", base(kvcache.FlashInfer, kvcache.NHD), base(kvcache.FlashInfer, kvcache.NHD), []int{3, 4, 5, 8}, []int{0, 1, 2, 9}, kvcache.LayerRange{}},
		{"flashinfer HND to vllm NHD", base(kvcache.FlashInfer, kvcache.HND), base(kvcache.VLLM, kvcache.NHD), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"sglang to vllm HND", base(kvcache.SGLang, kvcache.NHD), base(kvcache.VLLM, kvcache.HND), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"sglang same", base(kvcache.SGLang, kvcache.NHD), base(kvcache.SGLang, kvcache.NHD), []int{1, 2, 3}, []int{6, 7, 8}, kvcache.LayerRange{}},
		{"mla", with(base(kvcache.MLA, kvcache.NHD), func(s *spec) { s.headDim, s.totalHeads = 24, 0 }), with(base(kvcache.MLA, kvcache.NHD), func(s *spec) { s.headDim, s.totalHeads = 24, 0 }), nonContig, nonContigDst, kvcache.LayerRange{}},
		// Decode TP 2 > prefill TP 1: decode rank 1 takes heads 2..3.
		{"tp HND decode rank 1 of 2", base(kvcache.VLLM, kvcache.HND), with(base(kvcache.VLLM, kvcache.HND), func(s *spec) { s.heads, s.headStart = 2, 2 }), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"tp NHD decode rank 0 of 4", base(kvcache.VLLM, kvcache.NHD), with(base(kvcache.VLLM, kvcache.NHD), func(s *spec) { s.heads, s.headStart = 1, 0 }), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"tp NHD decode rank 1 of 2", base(kvcache.VLLM, kvcache.NHD), with(base(kvcache.VLLM, kvcache.NHD), func(s *spec) { s.heads, s.headStart = 2, 2 }), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"tp flashinfer HND rank 1 of 2", base(kvcache.FlashInfer, kvcache.HND), with(base(kvcache.FlashInfer, kvcache.HND), func(s *spec) { s.heads, s.headStart = 2, 2 }), nonContig, nonContigDst, kvcache.LayerRange{}},
		// Prefill TP 2 > decode TP 1: prefill rank 1 fills heads 2..3 of decode's blocks.
		{"tp gather HND", with(base(kvcache.VLLM, kvcache.HND), func(s *spec) { s.heads, s.headStart = 2, 2 }), base(kvcache.VLLM, kvcache.HND), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"tp gather sglang", with(base(kvcache.SGLang, kvcache.NHD), func(s *spec) { s.heads, s.headStart = 2, 2 }), base(kvcache.SGLang, kvcache.NHD), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"layer range", base(kvcache.VLLM, kvcache.NHD), base(kvcache.VLLM, kvcache.NHD), nonContig, nonContigDst, kvcache.Layers(1, 2)},
		{"pipeline stage", with(base(kvcache.VLLM, kvcache.HND), func(s *spec) { s.layers = 4 }), with(base(kvcache.VLLM, kvcache.HND), func(s *spec) { s.firstLayer, s.layers = 2, 2 }), nonContig, nonContigDst, kvcache.Layers(2, 4)},
		{"fp8", with(base(kvcache.VLLM, kvcache.NHD), func(s *spec) { s.dtype = kvcache.FP8E4M3 }), with(base(kvcache.VLLM, kvcache.NHD), func(s *spec) { s.dtype = kvcache.FP8E4M3; s.heads, s.headStart = 2, 2 }), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"fp32", with(base(kvcache.FlashInfer, kvcache.NHD), func(s *spec) { s.dtype = kvcache.FP32 }), with(base(kvcache.VLLM, kvcache.HND), func(s *spec) { s.dtype = kvcache.FP32 }), nonContig, nonContigDst, kvcache.LayerRange{}},
		{"fan out", base(kvcache.VLLM, kvcache.HND), base(kvcache.VLLM, kvcache.HND), []int{2, 2, 3}, []int{0, 5, 9}, kvcache.LayerRange{}},
	}
	for _, c := range cases {
		for _, perLayer := range []bool{false, true} {
			name := c.name + "/merged"
			if perLayer {
				name = c.name + "/per-layer"
			}
			t.Run(name, func(t *testing.T) {
				src, dst := newCache(t, c.src), newCache(t, c.dst)
				p := run(t, src, dst, c.sb, c.db, c.lr, perLayer)
				t.Logf("%+v", p.Stats())
			})
		}
	}
}

// TestPlanCoalescing pins the request counts of the cases that matter.
func TestPlanCoalescing(t *testing.T) {
	consec := []int{2, 3, 4, 5}
	cases := []struct {
		name                       string
		src, dst                   spec
		sb, db                     []int
		pieces, block, req, merged int
	}{
		// 3 layers x 2 x 4 blocks; consecutive ids: one run per layer and K/V.
		{"vllm consecutive", base(kvcache.VLLM, kvcache.NHD), base(kvcache.VLLM, kvcache.NHD), consec, []int{0, 1, 2, 3}, 1, 24, 6, 6},
		// All blocks in order: K then V then the next layer are back to back on both sides.
		{"vllm whole cache", base(kvcache.VLLM, kvcache.NHD), base(kvcache.VLLM, kvcache.NHD), seq(10), seq(10), 1, 60, 3, 1},
		// Gaps between layers stop the merge across layers.
		{"vllm whole cache gaps", func() spec { s := base(kvcache.VLLM, kvcache.NHD); s.gap = 64; return s }(), base(kvcache.VLLM, kvcache.NHD), seq(10), seq(10), 1, 60, 3, 3},
		// FlashInfer: a block's K and V are adjacent, so consecutive blocks make one run per layer.
		{"flashinfer consecutive", base(kvcache.FlashInfer, kvcache.NHD), base(kvcache.FlashInfer, kvcache.NHD), consec, []int{0, 1, 2, 3}, 1, 24, 3, 3},
		// Non-adjacent ids: nothing merges.
		{"vllm scattered", base(kvcache.VLLM, kvcache.NHD), base(kvcache.VLLM, kvcache.NHD), []int{0, 2, 4, 6}, []int{1, 3, 5, 7}, 1, 24, 24, 24},
		// Adjacent on one side only: nothing merges.
		{"one side adjacent", base(kvcache.VLLM, kvcache.NHD), base(kvcache.VLLM, kvcache.NHD), consec, []int{0, 2, 4, 6}, 1, 24, 24, 24},
		// Adjacent pairs out of list order still merge: (7,1)+(8,2) and (3,5)+(4,6).
		{"unordered pairs", base(kvcache.VLLM, kvcache.NHD), base(kvcache.VLLM, kvcache.NHD), []int{8, 3, 7, 4}, []int{2, 5, 1, 6}, 1, 24, 12, 12},
		// HND head slice: one run per block (the slice is contiguous), runs of adjacent blocks do not merge (strided).
		{"tp HND", base(kvcache.VLLM, kvcache.HND), func() spec { s := base(kvcache.VLLM, kvcache.HND); s.heads, s.headStart = 2, 2; return s }(), consec, []int{0, 1, 2, 3}, 1, 24, 24, 24},
		// NHD head slice: one run per token.
		{"tp NHD", base(kvcache.VLLM, kvcache.NHD), func() spec { s := base(kvcache.VLLM, kvcache.NHD); s.heads, s.headStart = 2, 2; return s }(), consec, []int{0, 1, 2, 3}, 4, 96, 96, 96},
		// NHD to HND: one run per token and head, except that the last run
		// of a block meets the first of the next when both sides' blocks are
		// adjacent (3 such joins per component and layer).
		{"NHD to HND", base(kvcache.VLLM, kvcache.NHD), base(kvcache.VLLM, kvcache.HND), consec, []int{0, 1, 2, 3}, 16, 384, 366, 366},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, dst := newCache(t, c.src), newCache(t, c.dst)
			p := run(t, src, dst, c.sb, c.db, kvcache.LayerRange{}, false)
			st := p.Stats()
			if st.Pieces != c.pieces || st.BlockRequests != c.block || st.Requests != c.req || st.Merged != c.merged {
				t.Fatalf("stats %+v, want pieces %d, block requests %d, requests %d, merged %d", st, c.pieces, c.block, c.req, c.merged)
			}
			heads := min(c.src.heads, c.dst.heads)
			if want := uint64(3 * 2 * len(c.sb) * c.src.blockSize * heads * c.src.headDim * 2); st.Bytes != want {
				t.Fatalf("bytes %d, want %d", st.Bytes, want)
			}
		})
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestPlanProperty plans random layout pairs, block lists and head ranges
// and checks every destination byte.
func TestPlanProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	iters := 300
	if testing.Short() {
		iters = 50
	}
	formats := []kvcache.Format{kvcache.VLLM, kvcache.FlashInfer, kvcache.SGLang}
	dtypes := []kvcache.DType{kvcache.FP16, kvcache.BF16, kvcache.FP8E5M2, kvcache.FP32}
	for it := range iters {
		total := []int{1, 2, 4, 8}[r.IntN(4)]
		mk := func() spec {
			s := spec{format: formats[r.IntN(len(formats))], blockSize: 1 + r.IntN(5), headDim: 1 + r.IntN(6),
				totalHeads: total, blocks: 1 + r.IntN(12), gap: r.IntN(2) * 32, reverse: r.IntN(4) == 0}
			if s.format != kvcache.SGLang {
				s.order = kvcache.Order(r.IntN(2))
				s.split = s.format == kvcache.VLLM && r.IntN(2) == 0
			}
			tp := []int{1, 2, 4, 8, 16}[r.IntN(5)]
			start, n, err := kvcache.HeadRange(total, tp, r.IntN(tp))
			if err != nil {
				s.headStart, s.heads = 0, total
			} else {
				s.headStart, s.heads = start, n
			}
			return s
		}
		src, dst := mk(), mk()
		if r.IntN(8) == 0 {
			src = spec{format: kvcache.MLA, blockSize: 1 + r.IntN(5), headDim: 1 + r.IntN(20), blocks: 1 + r.IntN(12)}
			dst = src
			dst.blocks = 1 + r.IntN(12)
			dst.gap = 16
		}
		dt := dtypes[r.IntN(len(dtypes))]
		src.dtype, dst.dtype = dt, dt
		dst.blockSize, dst.headDim = src.blockSize, src.headDim
		// Intersecting head ranges: retry the destination's range.
		for dst.format != kvcache.MLA && (dst.headStart >= src.headStart+src.heads || src.headStart >= dst.headStart+dst.heads) {
			dst.headStart, dst.heads = src.headStart, src.heads
		}
		nl := 1 + r.IntN(3)
		src.layers, dst.layers = nl, nl
		n := 1 + r.IntN(min(src.blocks, dst.blocks))
		var sb []int
		if r.IntN(2) == 0 {
			s0 := r.IntN(src.blocks - n + 1)
			sb = seq(n)
			for i := range sb {
				sb[i] += s0
			}
		} else {
			sb = make([]int, n)
			for i := range sb {
				sb[i] = r.IntN(src.blocks) // repeats allowed on the source side
			}
		}
		db := r.Perm(dst.blocks)[:n]
		if r.IntN(3) == 0 {
			slices.Sort(db)
		}
		l0 := r.IntN(nl)
		lr := kvcache.Layers(l0, l0+1+r.IntN(nl-l0))
		t.Run("", func(t *testing.T) {
			defer func() {
				if t.Failed() {
					t.Logf("iteration %d: src %+v dst %+v sb %v db %v layers %v", it, src, dst, sb, db, lr)
				}
			}()
			run(t, newCache(t, src), newCache(t, dst), sb, db, lr, r.IntN(2) == 0)
		})
	}
}

func TestPlanErrors(t *testing.T) {
	good := func() spec { return base(kvcache.VLLM, kvcache.NHD) }
	src, dst := newCache(t, good()), newCache(t, good())
	mla := newCache(t, spec{format: kvcache.MLA, dtype: kvcache.BF16, blocks: 4, blockSize: 4, headDim: 8, layers: 3})
	alt := func(f func(*kvcache.Layout)) *kvcache.Layout {
		l := dst.l
		l.Bases = slices.Clone(l.Bases)
		f(&l)
		return &l
	}
	cases := []struct {
		name     string
		src, dst *kvcache.Layout
		sb, db   []int
		lr       kvcache.LayerRange
		code     errs.Code
	}{
		{"nil layout", nil, &dst.l, []int{0}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"dtype", &src.l, alt(func(l *kvcache.Layout) { l.DType = kvcache.FP16 }), []int{0}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"fp8 encodings", alt(func(l *kvcache.Layout) { l.DType = kvcache.FP8E4M3 }), alt(func(l *kvcache.Layout) { l.DType = kvcache.FP8E5M2 }), []int{0}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"head dim", &src.l, alt(func(l *kvcache.Layout) { l.HeadDim = 4 }), []int{0}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"block size", &src.l, alt(func(l *kvcache.Layout) { l.BlockSize = 2 }), []int{0}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"total heads", &src.l, alt(func(l *kvcache.Layout) { l.TotalHeads = 8 }), []int{0}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"disjoint heads", alt(func(l *kvcache.Layout) { l.NumHeads, l.HeadStart = 2, 0 }), alt(func(l *kvcache.Layout) { l.NumHeads, l.HeadStart = 2, 2 }), []int{0}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"mla to vllm", &mla.l, &dst.l, []int{0}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"empty lists", &src.l, &dst.l, nil, nil, kvcache.LayerRange{}, errs.InvalidArgument},
		{"unequal lists", &src.l, &dst.l, []int{0, 1}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"src block range", &src.l, &dst.l, []int{10}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"negative block", &src.l, &dst.l, []int{-1}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"dst block range", &src.l, &dst.l, []int{0}, []int{10}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"duplicate dst", &src.l, &dst.l, []int{0, 1, 2}, []int{4, 5, 4}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"layers past end", &src.l, &dst.l, []int{0}, []int{0}, kvcache.Layers(1, 4), errs.InvalidArgument},
		{"layers empty", &src.l, &dst.l, []int{0}, []int{0}, kvcache.Layers(2, 2), errs.InvalidArgument},
		{"layers negative", &src.l, &dst.l, []int{0}, []int{0}, kvcache.Layers(-1, 1), errs.InvalidArgument},
		{"dst lacks layers", &src.l, alt(func(l *kvcache.Layout) { l.FirstLayer = 1 }), []int{0}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"bad src layout", alt(func(l *kvcache.Layout) { l.NumBlocks = 0 }), &dst.l, []int{0}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
		{"bad dst layout", &src.l, alt(func(l *kvcache.Layout) { l.Bases[1] = l.Bases[0] }), []int{0}, []int{0}, kvcache.LayerRange{}, errs.InvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := kvcache.NewPlan(c.src, c.dst, c.sb, c.db, c.lr)
			if err == nil || p != nil {
				t.Fatalf("planned %v", p)
			}
			// Compatible refuses exactly the pairs of layouts that can
			// never be planned, whatever the blocks and layers.
			layoutsOnly := map[string]bool{"nil layout": true, "dtype": true, "fp8 encodings": true, "head dim": true,
				"block size": true, "total heads": true, "disjoint heads": true, "mla to vllm": true,
				"bad src layout": true, "bad dst layout": true}[c.name]
			if cerr := kvcache.Compatible(c.src, c.dst); (cerr != nil) != layoutsOnly || (cerr != nil && errs.CodeOf(cerr) != c.code) {
				t.Fatalf("Compatible: %v, want an error: %v", cerr, layoutsOnly)
			}
			var e *errs.Error
			if !errors.As(err, &e) || e.Code != c.code || !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("error %v (%T), want code %v", err, err, c.code)
			}
			t.Log(err)
		})
	}
}

// TestPlanTooLarge: a layout pair that needs one run per token and head on
// huge blocks is refused instead of allocating billions of entries.
func TestPlanTooLarge(t *testing.T) {
	mk := func(o kvcache.Order, base uint64) *kvcache.Layout {
		return &kvcache.Layout{Format: kvcache.VLLM, Order: o, DType: kvcache.BF16, NumBlocks: 2, BlockSize: 1 << 14,
			NumHeads: 1 << 11, HeadDim: 1, Bases: []uint64{base}}
	}
	_, err := kvcache.NewPlan(mk(kvcache.NHD, 1<<40), mk(kvcache.HND, 1<<41), []int{0}, []int{1}, kvcache.LayerRange{})
	if !errors.Is(err, errs.ErrTooLarge) {
		t.Fatalf("got %v, want too large", err)
	}
	// The same shapes in the same order are one run per block.
	p, err := kvcache.NewPlan(mk(kvcache.HND, 1<<40), mk(kvcache.HND, 1<<41), []int{0, 1}, []int{1, 0}, kvcache.LayerRange{})
	if err != nil || p.Stats().Requests != 4 {
		t.Fatal(err, p)
	}
}

// TestPlanLayerSlices: Layer is nil outside the range, and appending to one
// layer's slice cannot overwrite the next layer's transfers.
func TestPlanLayerSlices(t *testing.T) {
	src, dst := newCache(t, base(kvcache.VLLM, kvcache.NHD)), newCache(t, base(kvcache.VLLM, kvcache.NHD))
	p, err := kvcache.NewPlan(&src.l, &dst.l, []int{0, 2}, []int{1, 3}, kvcache.Layers(0, 3))
	if err != nil {
		t.Fatal(err)
	}
	if p.Layer(-1) != nil || p.Layer(3) != nil || p.Layer(0) == nil {
		t.Fatal("Layer range")
	}
	next := slices.Clone(p.Layer(1))
	_ = append(p.Layer(0), kvcache.Transfer{Src: 1, Dst: 2, Length: 3})
	if !slices.Equal(p.Layer(1), next) {
		t.Fatal("appending to layer 0 changed layer 1")
	}
	if p.MaxLayerTransfers() != 4 || p.Stats().Requests != 12 {
		t.Fatalf("%d %+v", p.MaxLayerTransfers(), p.Stats())
	}
}
