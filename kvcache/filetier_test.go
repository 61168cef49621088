package kvcache_test

import (
	"bytes"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestFileTierOffloadOnboard offloads a request's blocks from one pool into
// a file laid out like the pool and onboards them into other blocks of a
// second pool, for each format; every destination byte is checked.
func TestFileTierOffloadOnboard(t *testing.T) {
	base := spec{dtype: kvcache.BF16, blocks: 16, blockSize: 4, heads: 2, totalHeads: 2, headDim: 16, layers: 3, firstLayer: 1}
	with := func(s spec, f func(*spec)) spec { f(&s); return s }
	for _, tc := range []struct {
		name string
		s    spec
	}{
		{"vllm NHD", with(base, func(s *spec) { s.format = kvcache.VLLM })},
		{"vllm HND split", with(base, func(s *spec) { s.format, s.order, s.split = kvcache.VLLM, kvcache.HND, true })},
		{"flashinfer", with(base, func(s *spec) { s.format = kvcache.FlashInfer })},
		{"mla", with(base, func(s *spec) { s.format, s.heads, s.totalHeads = kvcache.MLA, 1, 0 })},
		{"sglang", with(base, func(s *spec) { s.format = kvcache.SGLang })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"local", "file"}, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			a, b := newCache(t, tc.s), newCache(t, tc.s)
			register(t, e, a)
			register(t, e, b)
			a.fill()
			b.noise(9)
			tier, err := kvcache.NewFileTier(e, filepath.Join(t.TempDir(), "kv"), &a.l, engine.FileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer tier.Close()
			lb, _ := a.l.LayerBytes()
			if tier.Size() != uint64(tc.s.layers)*lb || tier.Layout().NumBlocks != tc.s.blocks {
				t.Fatalf("file of %d bytes for %d layers of %d", tier.Size(), tc.s.layers, lb)
			}
			sb, fb, db := []int{1, 2, 3, 9, 15}, []int{0, 1, 2, 5, 6}, []int{4, 5, 6, 0, 11}
			want := expect(a, b, sb, db, tc.s.firstLayer, tc.s.firstLayer+tc.s.layers)
			bt, err := tier.Offload(&a.l, sb, fb, kvcache.LayerRange{})
			if err != nil {
				t.Fatal(err)
			}
			if err := kvcache.WaitAndFree(bt, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			a.noise(3) // the pool's blocks are reused: the file keeps them
			bt, err = tier.Onboard(&b.l, fb, db, kvcache.LayerRange{})
			if err != nil {
				t.Fatal(err)
			}
			if err := kvcache.WaitAndFree(bt, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b.buf, want) {
				t.Fatal("onboarded blocks differ from the offloaded ones")
			}
			// Blocks outside the file are refused before anything moves.
			if _, err := tier.Onboard(&b.l, []int{tc.s.blocks}, []int{0}, kvcache.LayerRange{}); errs.CodeOf(err) != errs.InvalidArgument {
				t.Fatalf("block past the file: %v", err)
			}
		})
	}
	if _, _, err := kvcache.FileLayout(nil, 4096); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("FileLayout(nil): %v", err)
	}
}
