package tcp_test

import (
	"fmt"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/tcp"
	"github.com/tecache/te/internal/sys/mem"
)

// Two engines talking over tcp: four connections per peer, 256 KiB slices.
// The target publishes its data endpoint; the initiator writes 1 MiB, which
// travels as four slices, and COMPLETED means the bytes are in the target's
// memory.
func Example() {
	cfg := engine.Config{
		ListenAddr: "127.0.0.1:0", Transports: []string{"tcp"}, ForceTransport: "tcp",
		Params: map[string]string{"tcp.conns": "4", "tcp.slice": "256KiB"},
	}
	target, _ := engine.New(cfg)
	defer target.Close()
	initiator, _ := engine.New(cfg)
	defer initiator.Close()

	dst, src := mem.MustAlloc(1<<20), mem.MustAlloc(1<<20)
	defer mem.Free(dst)
	defer mem.Free(src)
	target.RegisterMemory(mem.Addr(dst), 1<<20, "cpu", true)
	initiator.RegisterMemory(mem.Addr(src), 1<<20, "cpu", false)
	src[12345] = 42

	fmt.Println("endpoint published:", target.Descriptor().Endpoints[tcp.Name] != "")
	seg, _ := initiator.OpenSegment(target.Name())
	b, _ := initiator.AllocateBatch(1)
	b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(src), Segment: seg, Remote: mem.Addr(dst), Length: 1 << 20})
	st, _ := b.Wait(10 * time.Second)
	fmt.Println(st.State, st.Transferred, dst[12345])
	// Output:
	// endpoint published: true
	// COMPLETED 1048576 42
}
