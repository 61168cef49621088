package kvcache

import (
	"math/bits"
	"slices"

	"github.com/tecache/te/internal/errs"
)

// Layout describes one rank's KV cache in memory: its format, element type,
// shape, which KV heads it holds and where each layer lives. Layers are
// numbered globally: the layout holds layers FirstLayer .. FirstLayer +
// NumLayers() - 1 (a pipeline stage holds a slice of the model's layers).
//
// The JSON form is what the handoff exchanges between prefill and decode.
type Layout struct {
	Format Format `json:"format"`
	// Order is NHD or HND for VLLM and FlashInfer; MLA and SGLang are
	// token-major and take NHD (the zero value).
	Order Order `json:"order"`
	DType DType `json:"dtype"`

	NumBlocks int `json:"num_blocks"` // blocks (SGLang: pages) per layer
	BlockSize int `json:"block_size"` // tokens per block (SGLang: page_size)
	NumHeads  int `json:"num_heads"`  // KV heads held here; MLA: 0 or 1
	HeadDim   int `json:"head_dim"`   // elements per head; MLA: the latent dim

	// HeadStart is the model-wide index of the first KV head this rank
	// holds; with tensor parallelism rank r of tp holds heads
	// [r*H/tp, (r+1)*H/tp) (see HeadRange). TotalHeads is the model's KV
	// head count (0: unknown, not checked).
	HeadStart  int `json:"head_start,omitempty"`
	TotalHeads int `json:"total_heads,omitempty"`

	FirstLayer int `json:"first_layer,omitempty"`

	// Bases holds one address per layer for formats that keep a layer in
	// one tensor (VLLM, FlashInfer, MLA). KBases and VBases hold the K and V
	// tensors' addresses per layer when they are separate (SGLang always,
	// VLLM optionally). Give one or the other.
	Bases  []uint64 `json:"bases,omitempty"`
	KBases []uint64 `json:"k_bases,omitempty"`
	VBases []uint64 `json:"v_bases,omitempty"`
}

// Region is a range of memory a layout occupies: what to register.
type Region struct {
	Addr   uint64
	Length uint64
}

// geom is a validated layout reduced to strides: the address of element
// (layer l, component c, block b, token t, local head h, dim 0) is
// base[l][c] + b*blockStride + t*tokStride + h*headStride, and a head's
// HeadDim elements are contiguous (row bytes).
type geom struct {
	comps       int
	heads       int // heads held (1 for MLA)
	headStart   int
	row         uint64 // HeadDim * element size
	compBytes   uint64 // one block of one component: BlockSize*heads*row
	compAll     uint64 // one component over all blocks: NumBlocks*compBytes
	blockStride uint64
	tokStride   uint64
	headStride  uint64
	first       int
	base        [][2]uint64
	regions     []Region
}

// limit bounds every dimension so that products of a few of them are
// checked cheaply and indexes fit in an int everywhere.
const limit = 1 << 31

func checkedMul(xs ...uint64) (uint64, bool) {
	p := uint64(1)
	for _, x := range xs {
		hi, lo := bits.Mul64(p, x)
		if hi != 0 {
			return 0, false
		}
		p = lo
	}
	return p, true
}

func invalid(format string, args ...any) *errs.Error {
	return errs.New(errs.InvalidArgument, "kvcache", format, args...)
}

// NumLayers returns how many layers the layout holds.
func (l *Layout) NumLayers() int {
	if len(l.Bases) > 0 {
		return len(l.Bases)
	}
	return len(l.KBases)
}

// Components returns 2 (K and V) or 1 (MLA).
func (l *Layout) Components() int {
	if l.Format == MLA {
		return 1
	}
	return 2
}

// Validate checks the layout: known format, dtype and order, non-zero
// dimensions, base addresses for every layer in the form the format needs,
// no arithmetic overflow, no two tensors overlapping.
func (l *Layout) Validate() error {
	_, err := l.compile()
	return err
}

// BlockBytes returns the bytes of one block of one component (K or V; the
// whole block for MLA). It needs the shape only, not the base addresses.
func (l *Layout) BlockBytes() (uint64, error) {
	g, err := l.shape()
	if err != nil {
		return 0, err
	}
	return g.compBytes, nil
}

// LayerBytes returns the bytes one layer takes: K and V of every block
// (the latent cache for MLA). Where K and V are separate tensors (SGLang,
// VLLM with KBases/VBases) each takes half. It needs the shape only, not
// the base addresses, so it sizes allocations.
func (l *Layout) LayerBytes() (uint64, error) {
	g, err := l.shape()
	if err != nil {
		return 0, err
	}
	return uint64(g.comps) * g.compAll, nil
}

// Regions returns the memory the layout occupies, one entry per tensor (per
// layer, or per layer and K/V when they are separate), in layer order. These
// are the ranges to register with the engine.
func (l *Layout) Regions() ([]Region, error) {
	g, err := l.compile()
	if err != nil {
		return nil, err
	}
	return slices.Clone(g.regions), nil
}

// Addr returns the address of element 0 of head `head` (a model-wide head
// index) of token `token` in block `block` of component kv (0 = K, 1 = V) of
// layer `layer` (model-wide). The HeadDim elements of that head follow it.
// Addr checks the shape and the indexes in constant time but not how the
// tensors sit relative to each other: call Validate once for that.
func (l *Layout) Addr(layer, kv, block, token, head int) (uint64, error) {
	g, err := l.shape()
	if err != nil {
		return 0, err
	}
	if err := l.checkBases(); err != nil {
		return 0, err
	}
	li := layer - g.first
	h := head - g.headStart
	switch {
	case li < 0 || li >= l.NumLayers():
		return 0, invalid("layer %d outside %d..%d", layer, g.first, g.first+l.NumLayers()-1)
	case kv < 0 || kv >= g.comps:
		return 0, invalid("component %d outside 0..%d", kv, g.comps-1)
	case block < 0 || block >= l.NumBlocks:
		return 0, invalid("block %d outside 0..%d", block, l.NumBlocks-1)
	case token < 0 || token >= l.BlockSize:
		return 0, invalid("token %d outside 0..%d", token, l.BlockSize-1)
	case h < 0 || h >= g.heads:
		return 0, invalid("head %d outside the held heads %d..%d", head, g.headStart, g.headStart+g.heads-1)
	}
	return l.bases(g, li)[kv] + uint64(block)*g.blockStride + uint64(token)*g.tokStride + uint64(h)*g.headStride, nil
}

// bases returns the addresses of layer li's K and V (MLA: the layer, 0).
func (l *Layout) bases(g *geom, li int) [2]uint64 {
	switch {
	case len(l.KBases) > 0:
		return [2]uint64{l.KBases[li], l.VBases[li]}
	case l.Format == MLA:
		return [2]uint64{l.Bases[li], 0}
	case l.Format == FlashInfer:
		return [2]uint64{l.Bases[li], l.Bases[li] + g.compBytes}
	}
	return [2]uint64{l.Bases[li], l.Bases[li] + g.compAll}
}

// shape checks everything but the base addresses' values and reduces the
// layout to strides.
func (l *Layout) shape() (*geom, error) {
	if !l.Format.valid() {
		return nil, invalid("layout format %d is not one of vllm, flashinfer, mla, sglang", uint8(l.Format))
	}
	if !l.DType.valid() {
		return nil, invalid("%s layout: dtype not set or unknown (%d)", l.Format, uint8(l.DType))
	}
	if l.Order > HND {
		return nil, invalid("%s layout: order %d is neither NHD nor HND", l.Format, uint8(l.Order))
	}
	if (l.Format == MLA || l.Format == SGLang) && l.Order != NHD {
		return nil, invalid("%s layout is token-major: order must be NHD, not %s", l.Format, l.Order)
	}
	heads := l.NumHeads
	if l.Format == MLA {
		if heads != 0 && heads != 1 || l.HeadStart != 0 || l.TotalHeads > 1 {
			return nil, invalid("mla layout has no heads: num_heads must be 0 or 1, head_start and total_heads 0")
		}
		heads = 1
	}
	for _, d := range []struct {
		name string
		v    int
	}{{"num_blocks", l.NumBlocks}, {"block_size", l.BlockSize}, {"num_heads", heads}, {"head_dim", l.HeadDim}} {
		if d.v <= 0 || d.v >= limit {
			return nil, invalid("%s layout: %s %d outside 1..%d", l.Format, d.name, d.v, limit-1)
		}
	}
	if l.HeadStart < 0 || l.HeadStart >= limit || l.TotalHeads < 0 || l.TotalHeads >= limit {
		return nil, invalid("%s layout: head_start %d / total_heads %d out of range", l.Format, l.HeadStart, l.TotalHeads)
	}
	if l.TotalHeads > 0 && l.HeadStart+heads > l.TotalHeads {
		return nil, invalid("%s layout: heads %d..%d exceed total_heads %d", l.Format, l.HeadStart, l.HeadStart+heads-1, l.TotalHeads)
	}
	if l.FirstLayer < 0 || l.FirstLayer >= limit {
		return nil, invalid("%s layout: first_layer %d out of range", l.Format, l.FirstLayer)
	}

	esize := uint64(l.DType.Size())
	row := uint64(l.HeadDim) * esize // both < 2^31: no overflow
	comp, ok := checkedMul(uint64(l.BlockSize), uint64(heads), row)
	if !ok {
		return nil, invalid("%s layout: block of %d tokens x %d heads x %d bytes overflows", l.Format, l.BlockSize, heads, row)
	}
	g := &geom{comps: l.Components(), heads: heads, headStart: l.HeadStart, row: row, compBytes: comp, first: l.FirstLayer}
	if l.Order == HND {
		g.headStride, g.tokStride = uint64(l.BlockSize)*row, row
	} else {
		g.headStride, g.tokStride = row, uint64(heads)*row
	}
	g.blockStride = comp
	if l.Format == FlashInfer {
		g.blockStride = 2 * comp
	}
	compAll, ok := checkedMul(comp, uint64(l.NumBlocks), 2) // fits even for two components
	if !ok {
		return nil, invalid("%s layout: %d blocks of %d bytes overflow", l.Format, l.NumBlocks, comp)
	}
	g.compAll = compAll / 2 // bytes of one component over all blocks
	return g, nil
}

// checkBases checks that the base addresses come in the form the format
// needs, one per layer.
func (l *Layout) checkBases() error {
	split := len(l.KBases) > 0 || len(l.VBases) > 0
	switch {
	case split && len(l.Bases) > 0:
		return invalid("%s layout: give bases or k_bases/v_bases, not both", l.Format)
	case split && len(l.KBases) != len(l.VBases):
		return invalid("%s layout: %d k_bases but %d v_bases", l.Format, len(l.KBases), len(l.VBases))
	case split && (l.Format == FlashInfer || l.Format == MLA):
		return invalid("%s layout keeps a layer in one tensor: give bases, not k_bases/v_bases", l.Format)
	case !split && l.Format == SGLang:
		return invalid("sglang layout has separate K and V pools: give k_bases and v_bases")
	case l.NumLayers() == 0:
		return invalid("%s layout: no layer base addresses", l.Format)
	case l.NumLayers() >= limit || l.FirstLayer+l.NumLayers() >= limit:
		return invalid("%s layout: first_layer %d + %d layers exceed %d", l.Format, l.FirstLayer, l.NumLayers(), limit-1)
	}
	return nil
}

func (l *Layout) compile() (*geom, error) {
	g, err := l.shape()
	if err != nil {
		return nil, err
	}
	if err := l.checkBases(); err != nil {
		return nil, err
	}
	split := len(l.KBases) > 0
	compAll := g.compAll
	n := l.NumLayers()
	g.base = make([][2]uint64, n)
	add := func(what string, layer int, addr, size uint64) error {
		if addr == 0 {
			return invalid("%s layout: %s address of layer %d is 0", l.Format, what, l.FirstLayer+layer)
		}
		if addr+size < addr {
			return invalid("%s layout: %s tensor of layer %d at %#x + %d bytes overflows the address space", l.Format, what, l.FirstLayer+layer, addr, size)
		}
		g.regions = append(g.regions, Region{addr, size})
		return nil
	}
	for i := 0; i < n; i++ {
		switch {
		case split:
			if err := add("K", i, l.KBases[i], compAll); err != nil {
				return nil, err
			}
			if err := add("V", i, l.VBases[i], compAll); err != nil {
				return nil, err
			}
		case l.Format == MLA:
			if err := add("layer", i, l.Bases[i], compAll); err != nil {
				return nil, err
			}
		default:
			if err := add("layer", i, l.Bases[i], 2*compAll); err != nil {
				return nil, err
			}
		}
		g.base[i] = l.bases(g, i)
	}
	// Overlapping tensors mean wrong base addresses: a plan would write the
	// same bytes twice.
	rs := slices.Clone(g.regions)
	slices.SortFunc(rs, func(a, b Region) int {
		switch {
		case a.Addr < b.Addr:
			return -1
		case a.Addr > b.Addr:
			return 1
		}
		return 0
	})
	for i := 1; i < len(rs); i++ {
		if rs[i].Addr < rs[i-1].Addr+rs[i-1].Length {
			return nil, invalid("%s layout: tensors at %#x (+%d) and %#x overlap", l.Format, rs[i-1].Addr, rs[i-1].Length, rs[i].Addr)
		}
	}
	return g, nil
}
