package kvtest

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/kvcache"
)

// TestCheck copies blocks by hand and checks that Check accepts exactly
// the right copy: a flipped byte, a block from the wrong source and a stray
// write to an untouched block are all found.
func TestCheck(t *testing.T) {
	s := Shape{Layers: 3, Blocks: 10, BlockSize: 4, Heads: 2, HeadDim: 8, DType: kvcache.FP16}
	src, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Free()
	dst, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	if err := src.Layout.Validate(); err != nil {
		t.Fatal(err)
	}
	sb, db := []int{1, 2, 7}, []int{9, 0, 4}
	src.Fill(sb)
	cp := func() {
		for l := range s.Layers {
			for kv := range 2 {
				for i := range sb {
					copy(dst.chunk(l, kv, db[i]), src.chunk(l, kv, sb[i]))
				}
			}
		}
	}
	cp()
	if bad, first := dst.Check(sb, db, 0); bad != 0 {
		t.Fatalf("a correct copy: %d bad, %s", bad, first)
	}
	dst.chunk(2, 1, 4)[5] ^= 1
	if bad, _ := dst.Check(sb, db, 0); bad != 1 {
		t.Fatalf("flipped byte: %d bad words", bad)
	}
	cp()
	copy(dst.chunk(1, 0, 0), src.chunk(1, 0, 1)) // block 1's data where block 2's belongs
	if bad, _ := dst.Check(sb, db, 0); bad == 0 {
		t.Fatal("a block from the wrong source passed")
	}
	cp()
	mem.Bytes(dst.Layout.Bases[0]+dst.BlockBytes()*3, 1)[0] = 1 // block 3 was not sent
	if bad, _ := dst.Check(sb, db, 0); bad != 1 {
		t.Fatalf("stray write: %d bad words", bad)
	}
}

func TestBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	b := Blocks(100, 130, r)
	if len(b) != 100 || slices.IsSorted(b) {
		t.Fatalf("blocks %v", b)
	}
	s := slices.Clone(b)
	slices.Sort(s)
	if len(slices.Compact(s)) != 100 || s[0] < 0 || s[99] >= 130 {
		t.Fatalf("not 100 distinct ids in range: %v", b)
	}
	if Blocks(5, 4, r) != nil {
		t.Fatal("more blocks than the cache has")
	}
}
