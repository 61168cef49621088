package kvtest

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/kvcache"
)

// Shape is a vLLM FlashAttention NHD cache: per layer one tensor
// [2, Blocks, BlockSize, Heads, HeadDim] of DType.
type Shape struct {
	Layers    int           `json:"layers"`
	Blocks    int           `json:"blocks"`
	BlockSize int           `json:"block_size"`
	Heads     int           `json:"heads"`
	HeadDim   int           `json:"head_dim"`
	DType     kvcache.DType `json:"dtype"`
}

// Llama3_8B is Llama-3-8B's cache shape (32 layers, 8 KV heads, head dim
// 128, bf16, 16-token blocks) with the given number of blocks.
func Llama3_8B(blocks int) Shape {
	return Shape{Layers: 32, Blocks: blocks, BlockSize: 16, Heads: 8, HeadDim: 128, DType: kvcache.BF16}
}

// BlockBytes is the size of one block of K (or V) of one layer.
func (s Shape) BlockBytes() uint64 {
	return uint64(s.BlockSize) * uint64(s.Heads) * uint64(s.HeadDim) * uint64(s.DType.Size())
}

// LayerBytes is the size of one layer's tensor.
func (s Shape) LayerBytes() uint64 { return 2 * uint64(s.Blocks) * s.BlockBytes() }

// Cache is a cache of some Shape over one mmap'ed buffer: the layers' tensors
// lie a page apart (vLLM allocates one tensor per layer), at an offset that
// is not page aligned.
type Cache struct {
	Shape
	Layout kvcache.Layout
	buf    []byte
	bases  []uint64
}

// gap separates the layers' tensors, so that nothing coalesces across
// layers by accident.
const gap = 4096 + 64

// New allocates a cache.
func New(s Shape) (*Cache, error) {
	if s.Layers <= 0 || s.Blocks <= 0 || s.BlockSize <= 0 || s.Heads <= 0 || s.HeadDim <= 0 || s.DType.Size() == 0 {
		return nil, errs.New(errs.InvalidArgument, "pattern", "bad shape %+v", s)
	}
	lb := s.LayerBytes()
	if lb%8 != 0 {
		return nil, errs.New(errs.InvalidArgument, "pattern", "layer bytes %d not a multiple of 8", lb)
	}
	size := uint64(s.Layers)*(lb+gap) + 64
	buf, err := mem.Alloc(int(size))
	if err != nil {
		return nil, err
	}
	c := &Cache{Shape: s, buf: buf}
	c.Layout = kvcache.Layout{Format: kvcache.VLLM, Order: kvcache.NHD, DType: s.DType, NumBlocks: s.Blocks,
		BlockSize: s.BlockSize, NumHeads: s.Heads, HeadDim: s.HeadDim, TotalHeads: s.Heads}
	base := mem.Addr(buf) + 64
	for l := range s.Layers {
		c.bases = append(c.bases, base+uint64(l)*(lb+gap))
	}
	c.Layout.Bases = append([]uint64(nil), c.bases...)
	return c, nil
}

// Free unmaps the cache; unregister it first.
func (c *Cache) Free() { mem.Free(c.buf); c.buf = nil }

// Bytes is the size of the cache's tensors.
func (c *Cache) Bytes() uint64 { return uint64(c.Layers) * c.LayerBytes() }

// Register registers every layer's tensor with e, remote-accessible.
func (c *Cache) Register(e *engine.Engine) error {
	var rs []engine.MemoryRegion
	for _, b := range c.bases {
		rs = append(rs, engine.MemoryRegion{Addr: b, Length: c.LayerBytes(), Location: "cpu:0", Remote: true})
	}
	return e.RegisterMemoryBatch(rs)
}

// Unregister undoes Register.
func (c *Cache) Unregister(e *engine.Engine) error { return e.UnregisterMemoryBatch(c.bases) }

// chunk returns the bytes of block b of component kv of layer l, from the
// documented shape: base[l] + (kv*Blocks + b) * BlockBytes.
func (c *Cache) chunk(l, kv, b int) []byte {
	bb := c.BlockBytes()
	off := c.bases[l] - mem.Addr(c.buf) + (uint64(kv)*uint64(c.Blocks)+uint64(b))*bb
	return c.buf[off : off+bb]
}

// seed mixes (layer, kv, source block) into the first 8-byte word of a
// chunk's pattern; word i is seed + i*step.
func seed(l, kv, src int) uint64 {
	x := uint64(l)<<40 ^ uint64(kv)<<39 ^ uint64(src)<<8 ^ 0x5bd1e995
	x ^= x >> 31
	x *= 0x9e3779b97f4a7c15
	x ^= x >> 29
	x *= 0xbf58476d1ce4e5b9
	return x ^ x>>32
}

// step makes consecutive words of a chunk differ (an odd constant, so no
// two words of a chunk are equal).
const step = 0x9e3779b97f4a7c15

// Fill writes the pattern into the given blocks of every layer, K and V.
func (c *Cache) Fill(blocks []int) {
	for l := range c.Layers {
		c.FillLayer(l, blocks)
	}
}

// FillLayer writes the pattern into the given blocks of layer l.
func (c *Cache) FillLayer(l int, blocks []int) {
	for kv := range 2 {
		for _, b := range blocks {
			ch := c.chunk(l, kv, b)
			w := seed(l, kv, b)
			for i := 0; i < len(ch); i += 8 {
				binary.LittleEndian.PutUint64(ch[i:], w)
				w += step
			}
		}
	}
}

// Clear sets every byte of the cache to v.
func (c *Cache) Clear(v byte) {
	if len(c.buf) == 0 {
		return
	}
	c.buf[0] = v
	for n := 1; n < len(c.buf); n *= 2 {
		copy(c.buf[n:], c.buf[:n])
	}
}

// Check verifies that destination block dst[i] of every layer holds the
// pattern of source block src[i], byte for byte, and that every other block
// still holds only the byte untouched. It returns the number of mismatching
// 8-byte words and a description of the first.
func (c *Cache) Check(src, dst []int, untouched byte) (int, string) {
	if len(src) != len(dst) {
		return 1, fmt.Sprintf("%d source blocks for %d destination blocks", len(src), len(dst))
	}
	from := map[int]int{}
	for i, d := range dst {
		from[d] = src[i]
	}
	u := uint64(untouched) * 0x0101010101010101
	bad, first := 0, ""
	for l := range c.Layers {
		for kv := range 2 {
			for b := range c.Blocks {
				ch := c.chunk(l, kv, b)
				s, moved := from[b]
				w := seed(l, kv, s)
				for i := 0; i < len(ch); i += 8 {
					want := u
					if moved {
						want = w
						w += step
					}
					if got := binary.LittleEndian.Uint64(ch[i:]); got != want {
						if bad == 0 {
							first = fmt.Sprintf("layer %d kv %d block %d byte %d: %#016x, want %#016x (moved=%v)", l, kv, b, i, got, want, moved)
						}
						bad++
					}
				}
			}
		}
	}
	return bad, first
}

// Blocks returns the prompt's block ids on one side: n of the cache's
// blocks, with the others left out at random (blocks held by other
// requests), cut into runs at the gaps and the runs shuffled, the way a
// paged allocator hands blocks out after a while.
func Blocks(n, cacheBlocks int, r *rand.Rand) []int {
	if n > cacheBlocks {
		return nil
	}
	taken := make([]bool, cacheBlocks)
	for _, b := range r.Perm(cacheBlocks)[:n] {
		taken[b] = true
	}
	var runs [][]int
	for b := 0; b < cacheBlocks; b++ {
		if !taken[b] {
			continue
		}
		if b > 0 && taken[b-1] {
			runs[len(runs)-1] = append(runs[len(runs)-1], b)
		} else {
			runs = append(runs, []int{b})
		}
	}
	r.Shuffle(len(runs), func(i, j int) { runs[i], runs[j] = runs[j], runs[i] })
	var out []int
	for _, run := range runs {
		out = append(out, run...)
	}
	return out
}
