package cxl_test

import (
	"fmt"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
)

// An application allocates its KV buffers from the shared device
// (Engine.CXLMemory) and registers them; engines that map the same device
// (TE_CXL_DEVICE) reach them with a memcpy, the others over tcp.
func Example() {
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"cxl", "tcp"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	base, size, err := e.CXLMemory()
	if err != nil {
		fmt.Println(err) // no device: TE_CXL_DEVICE is unset
		return
	}
	kv := mem.Bytes(base, 1<<20) // the first MiB of the device
	if err := e.RegisterMemory(mem.Addr(kv), uint64(len(kv)), "cpu:0", true); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(size >= 1<<20, e.TransportStats()["cxl"] != nil)
	// Output: true true
}
