package engine_test

import (
	"context"
	"fmt"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
)

// Two engines in one process: the initiator writes 1 MiB into the target's
// registered buffer and tells it so.
func Example() {
	target, _ := engine.New(engine.Config{ListenAddr: "127.0.0.1:0"})
	defer target.Close()
	initiator, _ := engine.New(engine.Config{ListenAddr: "127.0.0.1:0"})
	defer initiator.Close()

	dst := mem.MustAlloc(1 << 20)
	src := mem.MustAlloc(1 << 20)
	defer mem.Free(dst)
	defer mem.Free(src)
	copy(src, "hello, decode")
	target.RegisterMemory(mem.Addr(dst), 1<<20, "cpu:0", true)
	initiator.RegisterMemory(mem.Addr(src), 1<<20, "cpu:0", false)

	seg, err := initiator.OpenSegment(target.Name())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer initiator.CloseSegment(seg)
	batch, _ := initiator.AllocateBatch(1)
	defer batch.Free()
	err = batch.SubmitWithNotify(target.Name(), "req-1", "kv ready", engine.Request{
		Op: engine.Write, Local: mem.Addr(src), Segment: seg, Remote: mem.Addr(dst), Length: 1 << 20,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	st, _ := batch.Wait(5 * time.Second)
	// The notify was delivered before the batch reported COMPLETED.
	fmt.Println(st.State, st.Transferred, string(dst[:13]), len(target.Notifies()))
	// Output: COMPLETED 1048576 hello, decode 1
}

// Errors carry stable codes; errors.Is matches the sentinels.
func ExampleEngine_RegisterMemory() {
	e, _ := engine.New(engine.Config{ListenAddr: "127.0.0.1:0"})
	defer e.Close()
	buf := mem.MustAlloc(8192)
	defer mem.Free(buf)
	fmt.Println(e.RegisterMemory(mem.Addr(buf), 8192, "cpu:0", true))
	fmt.Println(e.RegisterMemory(mem.Addr(buf), 8192, "cpu:0", true)) // identical: fine
	err := e.RegisterMemory(mem.Addr(buf)+4096, 8192, "cpu:0", true)
	fmt.Println(engine.CodeOf(err) == engine.ErrAddressOverlapped.Code())
	// Output:
	// <nil>
	// <nil>
	// true
}

// A batch reused with Reset allocates nothing per request: the slots are the
// batch's own.
func ExampleBatch_Reset() {
	e, _ := engine.New(engine.Config{ListenAddr: "127.0.0.1:0"})
	defer e.Close()
	buf := mem.MustAlloc(2 << 20)
	defer mem.Free(buf)
	e.RegisterMemory(mem.Addr(buf), 2<<20, "cpu:0", true)
	self, _ := e.OpenSegment(e.Name())
	batch, _ := e.AllocateBatch(16)
	defer batch.Free()
	for layer := 0; layer < 3; layer++ {
		var reqs []engine.Request
		for i := 0; i < 16; i++ {
			off := uint64(layer*16+i) * 4096
			reqs = append(reqs, engine.Request{Op: engine.Write, Local: mem.Addr(buf) + off, Segment: self,
				Remote: mem.Addr(buf) + 1<<20 + off, Length: 4096})
		}
		batch.Submit(reqs...)
		st, _ := batch.Wait(time.Second)
		fmt.Println(layer, st.State, st.Completed)
		batch.Reset()
	}
	// Output:
	// 0 COMPLETED 16
	// 1 COMPLETED 16
	// 2 COMPLETED 16
}

// A window grants one transfer access to a few blocks of registered memory
// under its own key; revoking it is the transfer's fence: after RevokeWindow
// returns, no byte of it lands, while the memory stays registered.
func ExampleEngine_GrantWindow() {
	decode, _ := engine.New(engine.Config{ListenAddr: "127.0.0.1:0"})
	defer decode.Close()
	prefill, _ := engine.New(engine.Config{ListenAddr: "127.0.0.1:0"})
	defer prefill.Close()
	pool := mem.MustAlloc(1 << 20) // decode's KV pool
	kv := mem.MustAlloc(64 << 10)  // prefill's blocks
	defer mem.Free(pool)
	defer mem.Free(kv)
	decode.RegisterMemory(mem.Addr(pool), 1<<20, "cpu:0", true)
	prefill.RegisterMemory(mem.Addr(kv), 64<<10, "cpu:0", false)

	// Decode grants blocks 3 and 7 (16 KiB each) to this transfer.
	block := func(i uint64) uint64 { return mem.Addr(pool) + i*16<<10 }
	key, _ := decode.GrantWindow([]engine.Range{{Addr: block(3), Length: 16 << 10}, {Addr: block(7), Length: 16 << 10}})

	seg, _ := prefill.OpenSegment(decode.Name())
	defer prefill.CloseSegment(seg)
	batch, _ := prefill.AllocateBatch(2)
	defer batch.Free()
	batch.Submit(
		engine.Request{Op: engine.Write, Local: mem.Addr(kv), Segment: seg, Remote: block(3), Length: 16 << 10, Window: key},
		engine.Request{Op: engine.Write, Local: mem.Addr(kv), Segment: seg, Remote: block(5), Length: 16 << 10, Window: key},
	)
	batch.Wait(5 * time.Second)
	a, _ := batch.TaskStatus(0)
	b, _ := batch.TaskStatus(1)
	fmt.Println(a.State, b.State, engine.CodeOf(b.Err) == engine.ErrAccessDenied.Code())
	fmt.Println(decode.RevokeWindow(key))
	// Output:
	// COMPLETED FAILED true
	// <nil>
}

// An engine that Mooncake Transfer Engine peers can read and write over tcp
// (their transfer_engine_bench, a Mooncake Store client): its descriptor
// advertises Mooncake's acknowledged framing. Accepting Mooncake peers trusts
// the network: they carry no key and cannot authenticate.
func ExampleConfig_acceptMooncakePeers() {
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"tcp"}, AcceptMooncakePeers: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	d := e.Descriptor()
	fmt.Println(d.Protocol, d.TCPProtoVersion, d.TCPDataPort > 0)
	// Output: tcp 2 true
}

// Warmup connects to a peer ahead of the first transfer: over tcp, every
// striped connection is dialed and authenticated, so the first request
// dials nothing.
func ExampleEngine_Warmup() {
	cfg := engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"tcp"}, Params: map[string]string{"tcp.conns": "2"}}
	target, _ := engine.New(cfg)
	defer target.Close()
	initiator, _ := engine.New(cfg)
	defer initiator.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fmt.Println(initiator.Warmup(ctx, target.Name()))
	fmt.Println(initiator.TransportStats()["tcp"]["peer_conns_dialed"])
	// Output:
	// <nil>
	// 2
}
