package kvcache_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/kvcache"
)

// spec describes a test cache: a layout shape plus how to place its tensors
// in one mmap buffer.
type spec struct {
	format     kvcache.Format
	order      kvcache.Order
	dtype      kvcache.DType
	blocks     int
	blockSize  int
	heads      int // held here
	headStart  int
	totalHeads int
	headDim    int
	firstLayer int
	layers     int
	split      bool // separate K and V tensors per layer
	gap        int  // bytes between tensors (0: back to back)
	reverse    bool // place the layers in reverse address order
}

// cache is a layout over real memory.
type cache struct {
	spec
	l   kvcache.Layout
	buf []byte
}

// tensorBytes is the size of one tensor, from the shapes in the package
// documentation (not from the package's code).
func (s spec) tensorBytes() int {
	e := s.dtype.Size()
	switch {
	case s.format == kvcache.MLA:
		return s.blocks * s.blockSize * s.headDim * e
	case s.split || s.format == kvcache.SGLang:
		return s.blocks * s.blockSize * s.heads * s.headDim * e
	}
	return 2 * s.blocks * s.blockSize * s.heads * s.headDim * e
}

func (s spec) perLayer() int {
	if s.split || s.format == kvcache.SGLang {
		return 2
	}
	return 1
}

func newCache(t testing.TB, s spec) *cache {
	t.Helper()
	tb := s.tensorBytes()
	n := s.layers * s.perLayer()
	size := n*(tb+s.gap) + 64
	buf, err := mem.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Free(buf) })
	c := &cache{spec: s, buf: buf}
	heads := s.heads
	if s.format == kvcache.MLA {
		heads = 0
	}
	c.l = kvcache.Layout{Format: s.format, Order: s.order, DType: s.dtype, NumBlocks: s.blocks,
		BlockSize: s.blockSize, NumHeads: heads, HeadDim: s.headDim, HeadStart: s.headStart,
		TotalHeads: s.totalHeads, FirstLayer: s.firstLayer}
	base := mem.Addr(buf) + 16 // not page aligned on purpose
	addrs := make([]uint64, n)
	for i := range n {
		addrs[i] = base + uint64(i*(tb+s.gap))
	}
	if s.reverse {
		for i, j := 0, n-1; i < j; i, j = i+1, j-1 {
			addrs[i], addrs[j] = addrs[j], addrs[i]
		}
	}
	for i := range s.layers {
		if s.perLayer() == 2 {
			c.l.KBases = append(c.l.KBases, addrs[2*i])
			c.l.VBases = append(c.l.VBases, addrs[2*i+1])
		} else {
			c.l.Bases = append(c.l.Bases, addrs[i])
		}
	}
	return c
}

// addr is the test's own index function: row-major offset into the
// documented shape of each format.
func (c *cache) addr(layer, kv, block, tok, head, dim int) uint64 {
	s := c.spec
	li := layer - s.firstLayer
	h := head - s.headStart
	if s.format == kvcache.MLA {
		h = 0
	}
	var shape, idx []int
	var base uint64
	hnd := s.order == kvcache.HND
	switch {
	case s.format == kvcache.MLA:
		base = c.l.Bases[li]
		shape, idx = []int{s.blocks, s.blockSize, s.headDim}, []int{block, tok, dim}
	case s.format == kvcache.SGLang:
		base = []uint64{c.l.KBases[li], c.l.VBases[li]}[kv]
		shape, idx = []int{s.blocks * s.blockSize, s.heads, s.headDim}, []int{block*s.blockSize + tok, h, dim}
	case s.split:
		base = []uint64{c.l.KBases[li], c.l.VBases[li]}[kv]
		shape, idx = []int{s.blocks, s.blockSize, s.heads, s.headDim}, []int{block, tok, h, dim}
		if hnd {
			shape, idx = []int{s.blocks, s.heads, s.blockSize, s.headDim}, []int{block, h, tok, dim}
		}
	case s.format == kvcache.VLLM:
		base = c.l.Bases[li]
		shape, idx = []int{2, s.blocks, s.blockSize, s.heads, s.headDim}, []int{kv, block, tok, h, dim}
		if hnd {
			shape, idx = []int{2, s.blocks, s.heads, s.blockSize, s.headDim}, []int{kv, block, h, tok, dim}
		}
	case s.format == kvcache.FlashInfer:
		base = c.l.Bases[li]
		shape, idx = []int{s.blocks, 2, s.blockSize, s.heads, s.headDim}, []int{block, kv, tok, h, dim}
		if hnd {
			shape, idx = []int{s.blocks, 2, s.heads, s.blockSize, s.headDim}, []int{block, kv, h, tok, dim}
		}
	default:
		panic("format")
	}
	off := 0
	for i := range shape {
		if idx[i] < 0 || idx[i] >= shape[i] {
			panic(fmt.Sprintf("index %v outside shape %v", idx, shape))
		}
		off = off*shape[i] + idx[i]
	}
	return base + uint64(off*s.dtype.Size())
}

func (c *cache) comps() int {
	if c.format == kvcache.MLA {
		return 1
	}
	return 2
}

func (c *cache) heldHeads() (int, int) {
	if c.format == kvcache.MLA {
		return 0, 1
	}
	return c.headStart, c.heads
}

// pattern is the byte that element byte e of (layer, kv, block, token,
// head, dim) holds in a source cache.
func pattern(layer, kv, block, tok, head, dim, e int) byte {
	x := uint64(layer)<<48 ^ uint64(kv)<<44 ^ uint64(block)<<28 ^ uint64(tok)<<18 ^ uint64(head)<<12 ^ uint64(dim)<<2 ^ uint64(e)
	x ^= x >> 31
	x *= 0x9e3779b97f4a7c15
	x ^= x >> 29
	return byte(x)
}

func (c *cache) off(a uint64) int { return int(a - mem.Addr(c.buf)) }

// fill writes the pattern into every element of the cache.
func (c *cache) fill() {
	hs, hn := c.heldHeads()
	e := c.dtype.Size()
	for l := c.firstLayer; l < c.firstLayer+c.layers; l++ {
		for kv := range c.comps() {
			for b := range c.blocks {
				for tk := range c.blockSize {
					for h := hs; h < hs+hn; h++ {
						for d := range c.headDim {
							o := c.off(c.addr(l, kv, b, tk, h, d))
							for i := range e {
								c.buf[o+i] = pattern(l, kv, b, tk, h, d, i)
							}
						}
					}
				}
			}
		}
	}
}

// noise fills the buffer with bytes unrelated to the pattern.
func (c *cache) noise(seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range c.buf {
		c.buf[i] = byte(r.Uint32())
	}
}

// expect returns what dst's buffer must hold after copying src blocks to dst
// blocks for layers [l0, l1): the element values the source pattern gives
// for the common heads, and dst's current bytes everywhere else.
func expect(src, dst *cache, sb, db []int, l0, l1 int) []byte {
	want := bytes.Clone(dst.buf)
	shs, shn := src.heldHeads()
	dhs, dhn := dst.heldHeads()
	lo, hi := max(shs, dhs), min(shs+shn, dhs+dhn)
	e := src.dtype.Size()
	for l := l0; l < l1; l++ {
		for kv := range dst.comps() {
			for i := range db {
				for tk := range dst.blockSize {
					for h := lo; h < hi; h++ {
						for d := range dst.headDim {
							o := dst.off(dst.addr(l, kv, db[i], tk, h, d))
							for j := range e {
								want[o+j] = pattern(l, kv, sb[i], tk, h, d, j)
							}
						}
					}
				}
			}
		}
	}
	return want
}

// within checks that every transfer stays inside both buffers.
func within(t *testing.T, src, dst *cache, ts []kvcache.Transfer) {
	t.Helper()
	for _, x := range ts {
		if x.Length == 0 || x.Src < mem.Addr(src.buf) || x.Src+x.Length > mem.Addr(src.buf)+uint64(len(src.buf)) ||
			x.Dst < mem.Addr(dst.buf) || x.Dst+x.Length > mem.Addr(dst.buf)+uint64(len(dst.buf)) {
			t.Fatalf("transfer %+v outside the buffers", x)
		}
	}
}

// compare reports the first differing byte with the element it belongs to.
func compare(t *testing.T, dst *cache, want []byte) {
	t.Helper()
	if bytes.Equal(dst.buf, want) {
		return
	}
	bad := 0
	for i := range want {
		if dst.buf[i] != want[i] {
			bad++
		}
	}
	for i := range want {
		if dst.buf[i] != want[i] {
			t.Fatalf("%d bytes differ; first at buffer offset %d: got %#02x want %#02x (%s)", bad, i, dst.buf[i], want[i], dst.locate(i))
		}
	}
}

// locate names the element at a buffer offset, for failure messages.
func (c *cache) locate(off int) string {
	hs, hn := c.heldHeads()
	for l := c.firstLayer; l < c.firstLayer+c.layers; l++ {
		for kv := range c.comps() {
			for b := range c.blocks {
				for tk := range c.blockSize {
					for h := hs; h < hs+hn; h++ {
						o := c.off(c.addr(l, kv, b, tk, h, 0))
						if off >= o && off < o+c.headDim*c.dtype.Size() {
							return fmt.Sprintf("layer %d kv %d block %d token %d head %d byte %d", l, kv, b, tk, h, off-o)
						}
					}
				}
			}
		}
	}
	return "outside every element"
}

func memcpyAll(ts []kvcache.Transfer) {
	for _, x := range ts {
		mem.Copy(x.Dst, x.Src, x.Length)
	}
}
