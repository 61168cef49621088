package kvcache_test

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/kvcache"
)

// llama returns a Llama-3-8B-shaped vLLM cache (32 layers, 8 KV heads, head
// dim 128, bf16, 16-token blocks) with its layers back to back from base.
// Planning needs no memory, only addresses.
func llama(order kvcache.Order, blocks int, base uint64) *kvcache.Layout {
	l := &kvcache.Layout{Format: kvcache.VLLM, Order: order, DType: kvcache.BF16, NumBlocks: blocks,
		BlockSize: 16, NumHeads: 8, TotalHeads: 8, HeadDim: 128}
	layerBytes := uint64(2 * blocks * 16 * 8 * 128 * 2)
	for i := range 32 {
		l.Bases = append(l.Bases, base+uint64(i)*layerBytes)
	}
	return l
}

// A 4k-token prompt occupies 256 blocks. The decode side got a run of
// consecutive blocks; the prefill side's blocks are consecutive too but
// elsewhere: each layer's K and V each become one transfer.
func ExampleNewPlan() {
	prefill := llama(kvcache.HND, 1024, 1<<40)
	decode := llama(kvcache.HND, 2048, 1<<41)
	src, dst := make([]int, 256), make([]int, 256)
	for i := range src {
		src[i], dst[i] = 100+i, 1000+i
	}
	p, err := kvcache.NewPlan(prefill, decode, src, dst, kvcache.LayerRange{})
	if err != nil {
		fmt.Println(err)
		return
	}
	st := p.Stats()
	fmt.Printf("%d layers, %d MiB\n", st.Layers, st.Bytes>>20)
	fmt.Printf("requests: %d per block, %d coalesced\n", st.BlockRequests, st.Requests)
	fmt.Printf("layer 5: %d transfers of %d KiB\n", len(p.Layer(5)), p.Layer(5)[0].Length>>10)
	// Output:
	// 32 layers, 512 MiB
	// requests: 16384 per block, 64 coalesced
	// layer 5: 2 transfers of 8192 KiB
}

// Decode runs with tensor parallelism 4, prefill with 2: decode rank 3 holds
// heads 6..7, which prefill rank 1 holds as its heads 2..3. With HND blocks
// those heads are one contiguous slice of each prefill block.
func ExampleHeadRange() {
	const heads = 8
	ranks, _ := kvcache.SourceRanks(heads, 2, 4, 3)
	ps, pn, _ := kvcache.HeadRange(heads, 2, ranks[0])
	ds, dn, _ := kvcache.HeadRange(heads, 4, 3)
	fmt.Printf("decode rank 3 reads prefill rank %v: heads %d..%d of %d..%d\n", ranks, ds, ds+dn-1, ps, ps+pn-1)

	prefill := llama(kvcache.HND, 1024, 1<<40)
	prefill.NumHeads, prefill.HeadStart = pn, ps
	decode := llama(kvcache.HND, 1024, 1<<41)
	decode.NumHeads, decode.HeadStart = dn, ds
	p, err := kvcache.NewPlan(prefill, decode, []int{7, 3}, []int{0, 1}, kvcache.Layers(0, 1))
	if err != nil {
		fmt.Println(err)
		return
	}
	// Per block and K/V: 8 KiB (2 heads x 16 tokens x 128 x 2 bytes) at
	// head offset 2 of the prefill block, the whole decode block.
	for _, t := range p.Layer(0) {
		fmt.Printf("src +%d dst +%d len %d\n", t.Src-prefill.Bases[0], t.Dst-decode.Bases[0], t.Length)
	}
	// Output:
	// decode rank 3 reads prefill rank [1]: heads 6..7 of 4..7
	// src +57344 dst +8192 len 8192
	// src +122880 dst +0 len 8192
	// src +16834560 dst +8396800 len 8192
	// src +16900096 dst +8388608 len 8192
}

// Decode describes its cache to prefill as JSON.
func ExampleLayout_json() {
	l := kvcache.Layout{Format: kvcache.SGLang, DType: kvcache.BF16, NumBlocks: 64, BlockSize: 32,
		NumHeads: 8, HeadDim: 128, KBases: []uint64{0x7f0000000000}, VBases: []uint64{0x7f0001000000}}
	b, _ := json.Marshal(l)
	fmt.Println(string(b))
	var back kvcache.Layout
	err := json.Unmarshal(b, &back)
	fmt.Println(err, back.Validate())
	// Output:
	// {"format":"sglang","order":"NHD","dtype":"bf16","num_blocks":64,"block_size":32,"num_heads":8,"head_dim":128,"k_bases":[139637976727552],"v_bases":[139637993504768]}
	// <nil> <nil>
}

// Prefill pushes each layer as soon as it is computed, so the transfer of
// layer i overlaps the computation of layer i+1, then waits once.
func ExampleSubmitLayer() {
	// Four layers back to back in one allocation per side.
	shape := kvcache.Layout{Format: kvcache.FlashInfer, DType: kvcache.FP16, NumBlocks: 8, BlockSize: 16, NumHeads: 2, HeadDim: 64}
	layerBytes, err := shape.LayerBytes()
	if err != nil {
		fmt.Println(err)
		return
	}
	alloc := func() (kvcache.Layout, []byte) {
		l := shape
		buf := mem.MustAlloc(int(layerBytes) * 4)
		for i := range 4 {
			l.Bases = append(l.Bases, mem.Addr(buf)+uint64(i)*layerBytes)
		}
		return l, buf
	}
	src, sbuf := alloc()
	defer mem.Free(sbuf)
	dst, dbuf := alloc()
	defer mem.Free(dbuf)

	// Both engines live in this process here, so the local transport moves
	// the bytes; across processes or hosts the same calls use shm or tcp.
	cfg := engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"local"}}
	prefill, err := engine.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer prefill.Close()
	decode, err := engine.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer decode.Close()
	if err := prefill.RegisterMemory(mem.Addr(sbuf), uint64(len(sbuf)), "cpu", true); err != nil {
		fmt.Println(err)
		return
	}
	if err := decode.RegisterMemory(mem.Addr(dbuf), uint64(len(dbuf)), "cpu", true); err != nil {
		fmt.Println(err)
		return
	}

	p, err := kvcache.NewPlan(&src, &dst, []int{0, 1, 2}, []int{5, 6, 7}, kvcache.LayerRange{})
	if err != nil {
		fmt.Println(err)
		return
	}
	seg, err := prefill.OpenSegment(decode.Name())
	if err != nil {
		fmt.Println(err)
		return
	}
	batch, err := prefill.AllocateBatch(p.Stats().Requests)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer batch.Free()
	for l := p.Layers().Start; l < p.Layers().End; l++ {
		// ... compute layer l into blocks 0..2 ...
		if err := kvcache.SubmitLayer(batch, seg, p, l, engine.Write); err != nil {
			fmt.Println(err)
			return
		}
	}
	st, err := batch.Wait(5 * time.Second)
	fmt.Println(st.State, st.Tasks, st.Transferred, err)
	// Output:
	// COMPLETED 4 98304 <nil>
}
