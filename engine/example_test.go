package engine_test

import (
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
	fmt.Println(st.State, st.Transferred, string(dst[:13]))
	for len(target.Notifies()) == 0 {
		time.Sleep(time.Millisecond)
	}
	// Output: COMPLETED 1048576 hello, decode
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
	fmt.Println(engine.CodeOf(err) == engine.ErrAddressOverlapped.Code)
	// Output:
	// <nil>
	// <nil>
	// true
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
