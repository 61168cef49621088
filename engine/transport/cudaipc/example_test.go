package cudaipc_test

import (
	"fmt"

	"github.com/tecache/te/engine/transport/cudaipc"
	"github.com/tecache/te/internal/sys/cuda"
)

// A GPU buffer's IPC handle travels in its descriptor as base64 under
// te_extra.cuda_ipc.
func ExampleEncodeHandle() {
	var h cuda.IPCMemHandle
	h.Reserved[0] = 0xff
	s := cudaipc.EncodeHandle(h)
	back, err := cudaipc.DecodeHandle(s)
	fmt.Println(len(s), back == h, err)
	// Output: 88 true <nil>
}
