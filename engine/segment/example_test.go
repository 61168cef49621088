package segment_test

import (
	"fmt"

	"github.com/tecache/te/engine/segment"
)

func ExampleDesc_ForMooncake() {
	d := &segment.Desc{Name: "10.0.0.5:12001", Protocol: "rdma", TCPDataPort: 15001, TCPProtoVersion: 2,
		Instance: "8f1c", Transports: []string{"rdma", "tcp"},
		Buffers: []segment.BufferDesc{{Name: "cpu:0", Addr: 0x7f0000000000, Length: 1 << 30, Key: 0x5eed}}}
	v := d.ForMooncake()
	fmt.Println(v.Protocol, v.TCPProtoVersion, v.Buffers[0].Key, v.IsMooncake(), d.Buffers[0].Key != 0)
	m := &segment.Desc{Name: "mc", Protocol: "tcp", TCPDataPort: 15002}
	fmt.Println(m.IsMooncake(), m.HasTransport("tcp"), m.HasTransport("shm"))
	// Output:
	// tcp 2 0 false true
	// true true false
}
