package kvcache_test

import (
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache"
)

func validLayout() kvcache.Layout {
	return kvcache.Layout{Format: kvcache.VLLM, Order: kvcache.HND, DType: kvcache.BF16, NumBlocks: 4, BlockSize: 16,
		NumHeads: 8, HeadDim: 128, Bases: []uint64{1 << 30, 1 << 31}}
}

func TestLayoutValidate(t *testing.T) {
	if err := (&kvcache.Layout{}).Validate(); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("zero layout: %v", err)
	}
	l := validLayout()
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*kvcache.Layout){
		"no format":        func(l *kvcache.Layout) { l.Format = 0 },
		"unknown format":   func(l *kvcache.Layout) { l.Format = 9 },
		"no dtype":         func(l *kvcache.Layout) { l.DType = 0 },
		"bad order":        func(l *kvcache.Layout) { l.Order = 5 },
		"zero blocks":      func(l *kvcache.Layout) { l.NumBlocks = 0 },
		"negative blocks":  func(l *kvcache.Layout) { l.NumBlocks = -3 },
		"zero block size":  func(l *kvcache.Layout) { l.BlockSize = 0 },
		"zero heads":       func(l *kvcache.Layout) { l.NumHeads = 0 },
		"zero head dim":    func(l *kvcache.Layout) { l.HeadDim = 0 },
		"huge dim":         func(l *kvcache.Layout) { l.HeadDim = math.MaxInt },
		"negative start":   func(l *kvcache.Layout) { l.HeadStart = -1 },
		"heads past total": func(l *kvcache.Layout) { l.HeadStart, l.TotalHeads = 4, 8 },
		"negative layer":   func(l *kvcache.Layout) { l.FirstLayer = -1 },
		"no bases":         func(l *kvcache.Layout) { l.Bases = nil },
		"both bases":       func(l *kvcache.Layout) { l.KBases, l.VBases = []uint64{1 << 40}, []uint64{1 << 41} },
		"unequal k/v": func(l *kvcache.Layout) {
			l.Bases, l.KBases, l.VBases = nil, []uint64{1 << 40, 1 << 42}, []uint64{1 << 41}
		},
		"zero address":     func(l *kvcache.Layout) { l.Bases[1] = 0 },
		"address overflow": func(l *kvcache.Layout) { l.Bases[1] = math.MaxUint64 - 100 },
		"overlap":          func(l *kvcache.Layout) { l.Bases[1] = l.Bases[0] + 4096 },
		"size overflow":    func(l *kvcache.Layout) { l.NumBlocks, l.BlockSize, l.NumHeads = 1<<30, 1<<30, 1<<20 },
		"flashinfer split": func(l *kvcache.Layout) {
			l.Format, l.Bases, l.KBases, l.VBases = kvcache.FlashInfer, nil, []uint64{1 << 40}, []uint64{1 << 41}
		},
		"sglang joint": func(l *kvcache.Layout) { l.Format, l.Order = kvcache.SGLang, kvcache.NHD },
		"sglang HND": func(l *kvcache.Layout) {
			l.Format, l.Bases, l.KBases, l.VBases = kvcache.SGLang, nil, []uint64{1 << 40}, []uint64{1 << 41}
		},
		"mla heads": func(l *kvcache.Layout) { l.Format, l.Order = kvcache.MLA, kvcache.NHD },
		"mla HND":   func(l *kvcache.Layout) { l.Format, l.NumHeads = kvcache.MLA, 1 },
		"mla split": func(l *kvcache.Layout) {
			l.Format, l.Order, l.NumHeads, l.Bases, l.KBases, l.VBases = kvcache.MLA, kvcache.NHD, 0, nil, []uint64{1 << 40}, []uint64{1 << 41}
		},
		"too many layers":   func(l *kvcache.Layout) { l.FirstLayer = math.MaxInt32 - 1 },
		"split k/v overlap": func(l *kvcache.Layout) { l.Bases, l.KBases, l.VBases = nil, []uint64{1 << 40}, []uint64{1<<40 + 64} },
		"split zero v":      func(l *kvcache.Layout) { l.Bases, l.KBases, l.VBases = nil, []uint64{1 << 40}, []uint64{0} },
		"layers overlap mla": func(l *kvcache.Layout) {
			l.Format, l.Order, l.NumHeads, l.Bases[1] = kvcache.MLA, kvcache.NHD, 0, l.Bases[0]+1
		},
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			l := validLayout()
			l.Bases = slices.Clone(l.Bases)
			f(&l)
			err := l.Validate()
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("got %v, want invalid argument", err)
			}
			if _, err2 := l.Regions(); err2 == nil {
				t.Fatal("Regions accepted an invalid layout")
			}
			t.Log(err)
		})
	}
}

// TestLayoutAddr checks Addr against the test's own row-major indexing for
// every format and a sample of elements, and Regions against the tensors.
func TestLayoutAddr(t *testing.T) {
	for _, s := range []spec{
		{format: kvcache.VLLM, order: kvcache.NHD, blocks: 5, blockSize: 3, heads: 2, headStart: 4, totalHeads: 8, headDim: 4, layers: 2},
		{format: kvcache.VLLM, order: kvcache.HND, blocks: 5, blockSize: 3, heads: 2, headDim: 4, layers: 2, firstLayer: 7},
		{format: kvcache.VLLM, order: kvcache.HND, blocks: 5, blockSize: 3, heads: 2, headDim: 4, layers: 2, split: true, gap: 8},
		{format: kvcache.FlashInfer, order: kvcache.NHD, blocks: 5, blockSize: 3, heads: 2, headDim: 4, layers: 2},
		{format: kvcache.FlashInfer, order: kvcache.HND, blocks: 5, blockSize: 3, heads: 2, headDim: 4, layers: 2, reverse: true},
		{format: kvcache.SGLang, blocks: 5, blockSize: 3, heads: 2, headDim: 4, layers: 2},
		{format: kvcache.MLA, blocks: 5, blockSize: 3, headDim: 12, layers: 2},
	} {
		s.dtype = kvcache.FP16
		c := newCache(t, s)
		hs, hn := c.heldHeads()
		for l := s.firstLayer; l < s.firstLayer+s.layers; l++ {
			for kv := range c.comps() {
				for b := range s.blocks {
					for tk := range s.blockSize {
						for h := hs; h < hs+hn; h++ {
							got, err := c.l.Addr(l, kv, b, tk, h)
							if want := c.addr(l, kv, b, tk, h, 0); err != nil || got != want {
								t.Fatalf("%v %v: Addr(%d,%d,%d,%d,%d) = %#x, %v; want %#x", s.format, s.order, l, kv, b, tk, h, got, err, want)
							}
						}
					}
				}
			}
		}
		for _, bad := range [][5]int{{s.firstLayer - 1, 0, 0, 0, hs}, {s.firstLayer + s.layers, 0, 0, 0, hs}, {s.firstLayer, c.comps(), 0, 0, hs},
			{s.firstLayer, 0, s.blocks, 0, hs}, {s.firstLayer, 0, 0, s.blockSize, hs}, {s.firstLayer, 0, 0, 0, hs + hn}, {s.firstLayer, 0, -1, 0, hs}} {
			if _, err := c.l.Addr(bad[0], bad[1], bad[2], bad[3], bad[4]); !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("%v: Addr%v accepted: %v", s.format, bad, err)
			}
		}
		rs, err := c.l.Regions()
		if err != nil || len(rs) != s.layers*s.perLayer() {
			t.Fatalf("regions %v %v", rs, err)
		}
		for _, r := range rs {
			if r.Length != uint64(s.tensorBytes()) {
				t.Fatalf("%v: region %+v, want %d bytes", s.format, r, s.tensorBytes())
			}
		}
		lb, err := c.l.LayerBytes()
		if want := uint64(s.tensorBytes() * s.perLayer()); err != nil || lb != want {
			t.Fatalf("%v: layer bytes %d, want %d", s.format, lb, want)
		}
		bb, err := c.l.BlockBytes()
		heads := max(s.heads, 1)
		if want := uint64(s.blockSize * heads * s.headDim * 2); err != nil || bb != want {
			t.Fatalf("%v: block bytes %d, want %d", s.format, bb, want)
		}
	}
}

func TestLayoutJSON(t *testing.T) {
	l := validLayout()
	l.HeadStart, l.TotalHeads, l.FirstLayer = 8, 32, 4
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"format":"vllm"`, `"order":"HND"`, `"dtype":"bf16"`, `"num_blocks":4`, `"head_start":8`, `"bases":[1073741824,2147483648]`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	var back kvcache.Layout
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.Bases, l.Bases) || back.Format != l.Format || back.Order != l.Order || back.DType != l.DType ||
		back.HeadStart != 8 || back.TotalHeads != 32 || back.FirstLayer != 4 || back.NumHeads != 8 {
		t.Fatalf("round trip: %+v", back)
	}
	for _, bad := range []string{`{"format":"tensorrt"}`, `{"dtype":"int4"}`, `{"order":"NDH"}`} {
		if err := json.Unmarshal([]byte(bad), &back); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if _, err := json.Marshal(kvcache.Layout{}); err == nil {
		t.Error("marshalled a layout without format or dtype")
	}
}

func TestParse(t *testing.T) {
	for s, want := range map[string]kvcache.DType{"bf16": kvcache.BF16, "BFloat16": kvcache.BF16, "half": kvcache.FP16,
		"fp8": kvcache.FP8E4M3, "fp8_e5m2": kvcache.FP8E5M2, "float32": kvcache.FP32} {
		if d, err := kvcache.ParseDType(s); err != nil || d != want {
			t.Errorf("%s: %v %v", s, d, err)
		}
	}
	for d, size := range map[kvcache.DType]int{kvcache.FP16: 2, kvcache.BF16: 2, kvcache.FP8E4M3: 1, kvcache.FP8E5M2: 1, kvcache.FP32: 4, 0: 0, 77: 0} {
		if d.Size() != size {
			t.Errorf("%v: size %d want %d", d, d.Size(), size)
		}
		if size > 0 {
			if back, err := kvcache.ParseDType(d.String()); err != nil || back != d {
				t.Errorf("%v does not round-trip", d)
			}
		}
	}
	for _, f := range []kvcache.Format{kvcache.VLLM, kvcache.FlashInfer, kvcache.MLA, kvcache.SGLang} {
		if back, err := kvcache.ParseFormat(f.String()); err != nil || back != f {
			t.Errorf("%v does not round-trip", f)
		}
	}
	if o, err := kvcache.ParseOrder("hnd"); err != nil || o != kvcache.HND {
		t.Error(o, err)
	}
	if kvcache.Format(0).String() != "invalid" || kvcache.DType(0).String() != "invalid" || kvcache.Order(9).String() != "invalid" {
		t.Error("invalid values must say so")
	}
}

func TestHeadRange(t *testing.T) {
	cases := []struct{ total, tp, rank, start, n int }{
		{8, 1, 0, 0, 8}, {8, 2, 1, 4, 4}, {8, 8, 5, 5, 1}, {8, 16, 0, 0, 1}, {8, 16, 1, 0, 1}, {8, 16, 15, 7, 1}, {1, 4, 3, 0, 1},
	}
	for _, c := range cases {
		s, n, err := kvcache.HeadRange(c.total, c.tp, c.rank)
		if err != nil || s != c.start || n != c.n {
			t.Errorf("HeadRange(%d,%d,%d) = %d,%d,%v; want %d,%d", c.total, c.tp, c.rank, s, n, err, c.start, c.n)
		}
	}
	for _, c := range [][3]int{{8, 3, 0}, {8, 12, 0}, {8, 2, 2}, {8, 2, -1}, {0, 1, 0}, {8, 0, 0}} {
		if _, _, err := kvcache.HeadRange(c[0], c[1], c[2]); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("HeadRange%v: %v", c, err)
		}
	}
}

func TestSourceRanks(t *testing.T) {
	cases := []struct {
		total, src, dst, rank int
		want                  []int
	}{
		{8, 2, 2, 1, []int{1}},          // same TP: rank to rank
		{8, 1, 4, 3, []int{0}},          // decode TP 4, prefill TP 1
		{8, 2, 4, 3, []int{1}},          // decode rank 3 reads prefill rank 3/2
		{8, 4, 1, 0, []int{0, 1, 2, 3}}, // prefill TP 4 into decode TP 1: gather
		{8, 8, 2, 1, []int{4, 5, 6, 7}},
		{2, 4, 2, 1, []int{3}}, // prefill replicates head 1 on ranks 2, 3; decode rank 1 picks 2+1%2
		{2, 4, 2, 0, []int{0}},
		{2, 4, 8, 5, []int{3}}, // both replicated: decode rank 5 holds head 1
	}
	for _, c := range cases {
		got, err := kvcache.SourceRanks(c.total, c.src, c.dst, c.rank)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("SourceRanks(%d, %d, %d, %d) = %v, %v; want %v", c.total, c.src, c.dst, c.rank, got, err, c.want)
		}
	}
	if _, err := kvcache.SourceRanks(8, 3, 2, 0); err == nil {
		t.Error("accepted a TP size that does not divide the heads")
	}
}
