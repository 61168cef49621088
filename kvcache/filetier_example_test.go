package kvcache_test

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/kvcache"
)

// Offload a finished request's blocks to a file laid out like the KV pool,
// reuse the pool's blocks, then onboard the request again into other blocks.
func ExampleNewFileTier() {
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"local", "file"}, Logger: quiet})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	// A small vLLM pool: 2 layers of 64 blocks, in one mapping.
	pool := &kvcache.Layout{Format: kvcache.VLLM, DType: kvcache.BF16, NumBlocks: 64, BlockSize: 16, NumHeads: 2, HeadDim: 64}
	lb := uint64(2 * 64 * 16 * 2 * 64 * 2)
	buf := mem.MustAlloc(int(2 * lb))
	defer mem.Free(buf)
	pool.Bases = []uint64{mem.Addr(buf), mem.Addr(buf) + lb}
	e.RegisterMemory(mem.Addr(buf), 2*lb, "cpu", false)

	dir, _ := os.MkdirTemp("", "kv-tier-")
	defer os.RemoveAll(dir)
	tier, err := kvcache.NewFileTier(e, filepath.Join(dir, "kv"), pool, engine.FileOptions{})
	if err != nil {
		panic(err)
	}
	defer tier.Close()
	fmt.Println("file bytes:", tier.Size())

	b, _ := tier.Offload(pool, []int{3, 4, 5}, []int{0, 1, 2}, kvcache.LayerRange{})
	fmt.Println("offload:", kvcache.WaitAndFree(b, 10*time.Second))
	b, _ = tier.Onboard(pool, []int{0, 1, 2}, []int{40, 41, 42}, kvcache.LayerRange{})
	fmt.Println("onboard:", kvcache.WaitAndFree(b, 10*time.Second))
	// Output:
	// file bytes: 1048576
	// offload: <nil>
	// onboard: <nil>
}
