package kvcache

import (
	"cmp"
	"errors"
	"slices"

	"github.com/tecache/te/internal/errs"
)

// Transfer is one contiguous copy: Length bytes from source address Src to
// destination address Dst.
type Transfer struct {
	Src    uint64
	Dst    uint64
	Length uint64
}

// LayerRange is the half-open range [Start, End) of model-wide layer
// indexes a plan covers. The zero value means every layer of the source.
type LayerRange struct {
	Start, End int
}

// Layers returns the range [start, end).
func Layers(start, end int) LayerRange { return LayerRange{start, end} }

// MaxTransfers bounds the transfers of one plan (before coalescing across
// blocks), the same bound the engine puts on a batch: a layout pair that
// would need more (e.g. NHD to HND with huge blocks) is refused with
// TooLarge instead of exhausting memory.
const MaxTransfers = 1 << 24

// Stats describes a plan.
type Stats struct {
	Layers int    // layers covered
	Blocks int    // block pairs
	Bytes  uint64 // bytes moved
	// Pieces is the number of contiguous runs one block of one component
	// needs: 1 when the whole block (or one contiguous head range, HND)
	// moves; BlockSize per block for a head range of an NHD layout.
	Pieces int
	// BlockRequests counts requests before coalescing: one per layer, K/V
	// component, block pair and piece.
	BlockRequests int
	// Requests counts requests after coalescing runs that are consecutive
	// on both sides within each layer: what SubmitLayer submits over all
	// layers.
	Requests int
	// Merged counts requests after also coalescing across layers where
	// memory is contiguous on both sides: len(Transfers()).
	Merged int
}

// Plan is the list of copies that move the KV of a set of blocks from a
// source layout to a destination layout, grouped by layer so that a layer
// can be sent as soon as it is computed. A Plan is immutable and safe for
// concurrent use; the slices it returns must not be modified.
type Plan struct {
	start, end int
	layers     [][]Transfer
	all        []Transfer
	stats      Stats
}

// Compatible reports whether blocks of src can be copied to blocks of dst:
// both layouts are valid and agree on format family, dtype, head_dim,
// block_size and model, and their head ranges overlap. It is what NewPlan
// checks before it looks at block ids and layers, at a fraction of the cost
// of a plan, so a rendezvous can refuse a mismatched pair early.
func Compatible(src, dst *Layout) error {
	_, _, _, err := match(src, dst)
	return err
}

// match compiles both layouts, checks that they fit together and returns
// the per-block copy pattern over their common heads.
func match(src, dst *Layout) (sg, dg *geom, pattern []Transfer, err error) {
	if src == nil || dst == nil {
		return nil, nil, nil, planErr("nil layout")
	}
	if sg, err = src.compile(); err != nil {
		return nil, nil, nil, sideErr("source", err)
	}
	if dg, err = dst.compile(); err != nil {
		return nil, nil, nil, sideErr("destination", err)
	}
	if (src.Format == MLA) != (dst.Format == MLA) {
		return nil, nil, nil, planErr("source is %s and destination %s: an MLA cache only maps to an MLA cache", src.Format, dst.Format)
	}
	if src.DType != dst.DType {
		return nil, nil, nil, planErr("dtype mismatch: source %s, destination %s", src.DType, dst.DType).
			WithHint("te copies bytes; it does not convert between dtypes")
	}
	if src.HeadDim != dst.HeadDim {
		return nil, nil, nil, planErr("head_dim mismatch: source %d, destination %d", src.HeadDim, dst.HeadDim)
	}
	if src.BlockSize != dst.BlockSize {
		return nil, nil, nil, planErr("block_size mismatch: source %d tokens, destination %d", src.BlockSize, dst.BlockSize)
	}
	if src.TotalHeads > 0 && dst.TotalHeads > 0 && src.TotalHeads != dst.TotalHeads {
		return nil, nil, nil, planErr("total_heads mismatch: source %d, destination %d (not the same model?)", src.TotalHeads, dst.TotalHeads)
	}
	lo, hi := max(sg.headStart, dg.headStart), min(sg.headStart+sg.heads, dg.headStart+dg.heads)
	if lo >= hi {
		return nil, nil, nil, planErr("source heads %d..%d and destination heads %d..%d do not overlap",
			sg.headStart, sg.headStart+sg.heads-1, dg.headStart, dg.headStart+dg.heads-1)
	}
	if pattern, err = blockPattern(sg, dg, lo, hi); err != nil {
		return nil, nil, nil, err
	}
	return sg, dg, pattern, nil
}

// NewPlan plans the copy of source blocks srcBlocks[i] to destination
// blocks dstBlocks[i], for every layer in layers and both K and V, of the
// KV heads the two layouts have in common.
//
// The layouts must agree on dtype, block size, head dim and (when both give
// it) the total head count, and be both MLA or both not. They may differ in
// format and order (vLLM HND to FlashInfer NHD works, one run per token and
// head) and in the heads they hold: with tensor parallelism, each side holds
// a head range and the plan copies the intersection (see HeadRange).
//
// Runs that are consecutive in memory on both sides (adjacent block ids in
// a layer, a block's K and V in FlashInfer, the last block of a layer and the
// first of the next when the tensors are back to back) become one transfer.
// Source block ids may repeat (one block fanned out to several); destination
// ids may not.
func NewPlan(src, dst *Layout, srcBlocks, dstBlocks []int, layers LayerRange) (*Plan, error) {
	sg, dg, pattern, err := match(src, dst)
	if err != nil {
		return nil, err
	}
	if len(srcBlocks) == 0 || len(dstBlocks) == 0 {
		return nil, planErr("empty block list (%d source, %d destination ids)", len(srcBlocks), len(dstBlocks))
	}
	if len(srcBlocks) != len(dstBlocks) {
		return nil, planErr("%d source block ids but %d destination block ids", len(srcBlocks), len(dstBlocks))
	}
	for i, b := range srcBlocks {
		if b < 0 || b >= src.NumBlocks {
			return nil, planErr("source block id %d (index %d) outside 0..%d", b, i, src.NumBlocks-1)
		}
	}
	for i, b := range dstBlocks {
		if b < 0 || b >= dst.NumBlocks {
			return nil, planErr("destination block id %d (index %d) outside 0..%d", b, i, dst.NumBlocks-1)
		}
	}
	sorted := slices.Clone(dstBlocks)
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, planErr("destination block id %d appears twice", sorted[i])
		}
	}

	if layers == (LayerRange{}) {
		layers = LayerRange{sg.first, sg.first + len(sg.base)}
	}
	if layers.Start >= layers.End {
		return nil, planErr("empty layer range [%d, %d)", layers.Start, layers.End)
	}
	for _, s := range []struct {
		name string
		g    *geom
	}{{"source", sg}, {"destination", dg}} {
		if layers.Start < s.g.first || layers.End > s.g.first+len(s.g.base) {
			return nil, planErr("layer range [%d, %d) outside the %s's layers [%d, %d)",
				layers.Start, layers.End, s.name, s.g.first, s.g.first+len(s.g.base))
		}
	}

	nl := layers.End - layers.Start
	total, ok := checkedMul(uint64(nl), uint64(sg.comps), uint64(len(srcBlocks)), uint64(len(pattern)))
	if !ok || total > MaxTransfers {
		return nil, errs.New(errs.TooLarge, "kvcache plan", "%d layers x %d components x %d blocks x %d pieces per block exceed %d transfers",
			nl, sg.comps, len(srcBlocks), len(pattern), MaxTransfers).
			WithHint("use the same head order (NHD/HND) on both sides, or plan fewer blocks or layers at a time")
	}
	var pieceBytes uint64
	for _, p := range pattern {
		pieceBytes += p.Length
	}

	p := &Plan{start: layers.Start, end: layers.End, layers: make([][]Transfer, nl)}
	p.stats = Stats{
		Layers: nl, Blocks: len(srcBlocks), Pieces: len(pattern), BlockRequests: int(total),
		Bytes: pieceBytes * uint64(nl*sg.comps*len(srcBlocks)),
	}
	// Visit the pairs in source block order, so that each layer's transfers
	// come out sorted by source address and merge as they are appended, and
	// find the runs that are consecutive on both sides.
	order := make([]int, len(srcBlocks))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := cmp.Compare(srcBlocks[a], srcBlocks[b]); c != 0 {
			return c
		}
		return cmp.Compare(dstBlocks[a], dstBlocks[b])
	})
	var runs []int // run i is order[runs[i]:runs[i+1]]
	for i := range order {
		if i == 0 || srcBlocks[order[i]] != srcBlocks[order[i-1]]+1 || dstBlocks[order[i]] != dstBlocks[order[i-1]]+1 {
			runs = append(runs, i)
		}
	}
	runs = append(runs, len(order))
	// A whole block that is also the block stride on both sides makes a run
	// of blocks one transfer.
	whole := len(pattern) == 1 && pattern[0].Length == sg.blockStride && pattern[0].Length == dg.blockStride
	// FlashInfer interleaves K and V per block: walk blocks, then K and V.
	interleaved := sg.blockStride != sg.compBytes
	// Build each layer in a scratch slice and keep the coalesced result in
	// one array shared by all layers: few, right-sized allocations.
	scratch := make([]Transfer, 0, min(int(total)/nl, 1<<16))
	perLayer := sg.comps * len(srcBlocks) * len(pattern)
	if whole {
		perLayer = sg.comps * (len(runs) - 1)
	}
	flat := make([]Transfer, 0, nl*perLayer) // an upper bound, exact without merges
	ends := make([]int, nl)
	for i := range nl {
		layer := layers.Start + i
		sb, db := sg.base[layer-sg.first], dg.base[layer-dg.first]
		ts := scratch[:0]
		emit := func(c, k int) {
			so := sb[c] + uint64(srcBlocks[k])*sg.blockStride
			do := db[c] + uint64(dstBlocks[k])*dg.blockStride
			for _, pc := range pattern {
				ts = appendMerge(ts, Transfer{so + pc.Src, do + pc.Dst, pc.Length})
			}
		}
		if interleaved {
			for _, k := range order {
				for c := range sg.comps {
					emit(c, k)
				}
			}
		} else {
			comps := []int{0, 1}[:sg.comps]
			if sg.comps == 2 && sb[1] < sb[0] {
				comps = []int{1, 0}
			}
			for _, c := range comps {
				for r := 0; r+1 < len(runs); r++ {
					run := order[runs[r]:runs[r+1]]
					if whole {
						k := run[0]
						ts = appendMerge(ts, Transfer{sb[c] + uint64(srcBlocks[k])*sg.blockStride,
							db[c] + uint64(dstBlocks[k])*dg.blockStride, uint64(len(run)) * pattern[0].Length})
						continue
					}
					for _, k := range run {
						emit(c, k)
					}
				}
			}
		}
		ts = coalesce(ts)
		flat = append(flat, ts...)
		ends[i] = len(flat)
		scratch = ts[:0]
	}
	if len(flat) < cap(flat)/2 {
		flat = slices.Clone(flat)
	}
	prev := 0
	for i, e := range ends {
		p.layers[i] = flat[prev:e:e]
		prev = e
	}
	p.stats.Requests = len(flat)
	p.all = acrossLayers(flat, ends)
	p.stats.Merged = len(p.all)
	return p, nil
}

// acrossLayers returns the layers' transfers (each coalesced, ends[i] the
// end of layer i in flat) coalesced across layers too. In the common case
// nothing merges across layers and the layers' array is shared.
func acrossLayers(flat []Transfer, ends []int) []Transfer {
	merge := false
	for _, e := range ends[:len(ends)-1] {
		if e > 0 && e < len(flat) {
			a, b := flat[e-1], flat[e]
			if a.Src+a.Length == b.Src && a.Dst+a.Length == b.Dst || b.Src < a.Src {
				merge = true
				break
			}
		}
	}
	if !merge {
		return flat
	}
	all := make([]Transfer, 0, len(flat))
	for _, t := range flat {
		all = appendMerge(all, t)
	}
	return slices.Clip(coalesce(all))
}

// blockPattern returns the runs that copy heads [lo, hi) of one block of one
// component, as offsets from the source and destination block starts,
// coalesced and in source address order.
func blockPattern(sg, dg *geom, lo, hi int) ([]Transfer, error) {
	n := hi - lo
	bs := int(sg.compBytes / (uint64(sg.heads) * sg.row)) // tokens per block
	sh, dh := uint64(lo-sg.headStart), uint64(lo-dg.headStart)
	row := sg.row
	// Walk the block in source memory order: heads outer for HND, tokens
	// outer for NHD. The inner loop collapses to one run when it is
	// contiguous on both sides, and the outer one too when the collapsed
	// runs follow each other on both sides.
	type loop struct {
		n          int
		sStr, dStr uint64
	}
	heads := loop{n, sg.headStride, dg.headStride}
	toks := loop{bs, sg.tokStride, dg.tokStride}
	outer, inner := toks, heads
	if sg.headStride > sg.tokStride {
		outer, inner = heads, toks
	}
	innerRun := inner.n == 1 || inner.sStr == row && inner.dStr == row
	runLen := row
	if innerRun {
		runLen = uint64(inner.n) * row
	}
	if innerRun && (outer.n == 1 || outer.sStr == runLen && outer.dStr == runLen) {
		return []Transfer{{sh * sg.headStride, dh * dg.headStride, uint64(outer.n) * runLen}}, nil
	}
	count := uint64(outer.n)
	if !innerRun {
		count *= uint64(inner.n)
	}
	if count > MaxTransfers {
		return nil, errs.New(errs.TooLarge, "kvcache plan", "one block needs %d separate runs (more than %d)", count, MaxTransfers)
	}
	var ts []Transfer
	s0, d0 := sh*sg.headStride, dh*dg.headStride
	for o := range outer.n {
		so, do := s0+uint64(o)*outer.sStr, d0+uint64(o)*outer.dStr
		if innerRun {
			ts = appendMerge(ts, Transfer{so, do, runLen})
			continue
		}
		for i := range inner.n {
			ts = appendMerge(ts, Transfer{so + uint64(i)*inner.sStr, do + uint64(i)*inner.dStr, row})
		}
	}
	return ts, nil
}

// appendMerge appends t, extending the last transfer instead when t follows
// it on both sides.
func appendMerge(ts []Transfer, t Transfer) []Transfer {
	if n := len(ts); n > 0 {
		last := &ts[n-1]
		if last.Src+last.Length == t.Src && last.Dst+last.Length == t.Dst {
			last.Length += t.Length
			return ts
		}
	}
	return append(ts, t)
}

// coalesce sorts ts by source address and merges neighbours that are
// contiguous on both sides. After sorting, two mergeable runs are always
// neighbours, so one pass finds every merge. Plans emit layers in source
// order already (and the layers of one allocation follow each other), which
// costs one check.
func coalesce(ts []Transfer) []Transfer {
	less := func(a, b Transfer) int {
		if c := cmp.Compare(a.Src, b.Src); c != 0 {
			return c
		}
		return cmp.Compare(a.Dst, b.Dst)
	}
	if slices.IsSortedFunc(ts, less) {
		return ts
	}
	slices.SortFunc(ts, less)
	out := ts[:1]
	for _, t := range ts[1:] {
		out = appendMerge(out, t)
	}
	return out
}

// Layers returns the plan's layer range.
func (p *Plan) Layers() LayerRange { return LayerRange{p.start, p.end} }

// Layer returns the transfers of one layer (model-wide index), coalesced
// within the layer, or nil when the layer is outside the plan.
func (p *Plan) Layer(layer int) []Transfer {
	if layer < p.start || layer >= p.end {
		return nil
	}
	return p.layers[layer-p.start]
}

// MaxLayerTransfers returns the largest number of transfers of any one
// layer: the batch capacity one SubmitLayer call needs.
func (p *Plan) MaxLayerTransfers() int {
	n := 0
	for _, ts := range p.layers {
		n = max(n, len(ts))
	}
	return n
}

// Transfers returns every transfer of the plan, also coalesced across
// layers: the list to use when the whole cache is ready at once.
func (p *Plan) Transfers() []Transfer { return p.all }

// Stats returns the plan's statistics.
func (p *Plan) Stats() Stats { return p.stats }

func planErr(format string, args ...any) *errs.Error {
	return errs.New(errs.InvalidArgument, "kvcache plan", format, args...)
}

func sideErr(side string, err error) error {
	var e *errs.Error
	if errors.As(err, &e) {
		return errs.New(e.Code, "kvcache plan", "%s %s", side, e.Msg).WithHint(e.Hint)
	}
	return err
}
