package handoff_test

import (
	"context"
	"fmt"
	"net"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/kvcache"
	"github.com/tecache/te/kvcache/handoff"
)

// cacheOf allocates a small vLLM cache (2 layers, 8 blocks of 16 tokens, 2
// KV heads of 64 bf16) and registers it with e.
func cacheOf(e *engine.Engine) (*kvcache.Layout, func()) {
	l := &kvcache.Layout{Format: kvcache.VLLM, DType: kvcache.BF16, NumBlocks: 8, BlockSize: 16, NumHeads: 2, HeadDim: 64}
	per, _ := l.LayerBytes()
	buf := mem.MustAlloc(int(2 * per))
	l.Bases = []uint64{mem.Addr(buf), mem.Addr(buf) + per}
	regions, _ := l.Regions()
	for _, r := range regions {
		e.RegisterMemory(r.Addr, r.Length, "cpu:0", true)
	}
	return l, func() { mem.Free(buf) }
}

// A push handoff: decode expects blocks 5, 6 and 2; prefill declares its
// blocks 0, 1 and 3 ready and sends them; decode's Wait returns once the
// bytes are there. Here both engines live in one process; in a deployment
// each is in its own process and te-sidecar runs beside them.
func Example() {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := sidecar.New(sidecar.Config{})
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())

	cfg := engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"}}
	pe, _ := engine.New(cfg)
	defer pe.Close()
	de, _ := engine.New(cfg)
	defer de.Close()
	pl, freeP := cacheOf(pe)
	defer freeP()
	dl, freeD := cacheOf(de)
	defer freeD()

	ctx := context.Background()
	prefill, _ := handoff.New(pe, handoff.Options{Sidecar: ln.Addr().String()})
	defer prefill.Close()
	decode, _ := handoff.New(de, handoff.Options{Sidecar: ln.Addr().String()})
	defer decode.Close()

	// Decode: where the KV goes.
	dt, err := decode.Expect(ctx, handoff.Request{ID: "req-42", Layout: dl, Blocks: []int{5, 6, 2}, Mode: handoff.Push})
	if err != nil {
		fmt.Println(err)
		return
	}
	got := make(chan handoff.Result, 1)
	go func() {
		r, err := dt.Wait(ctx)
		if err != nil {
			fmt.Println(err)
		}
		got <- r
	}()

	// Prefill: the KV is ready; send it.
	pt, err := prefill.Ready(ctx, handoff.Request{ID: "req-42", Layout: pl, Blocks: []int{0, 1, 3}})
	if err != nil {
		fmt.Println(err)
		return
	}
	sent, err := pt.Send(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	r := <-got
	fmt.Printf("prefill moved %d bytes over %s in %d requests (%d before coalescing)\n",
		sent.Bytes, sent.Transport, sent.Requests, sent.BlockRequests)
	fmt.Printf("decode received %d bytes\n", r.Bytes)
	// Output:
	// prefill moved 49152 bytes over tcp in 8 requests (12 before coalescing)
	// decode received 49152 bytes
}
