package cudaipc_test

import (
	"fmt"

	"github.com/tecache/te/engine/transport/cudaipc"
	"github.com/tecache/te/internal/sys/gpu"
)

// A GPU buffer's IPC handle travels in its descriptor as base64 under
// te_extra.cuda_ipc (te_extra.hip_ipc for HIP memory).
func ExampleEncodeHandle() {
	var h gpu.IPCHandle
	h[0] = 0xff
	s := cudaipc.EncodeHandle(h)
	back, err := cudaipc.DecodeHandle(s)
	fmt.Println(len(s), back == h, err)
	fmt.Println(cudaipc.ExtraKeys("hip"))
	// Output:
	// 88 true <nil>
	// hip_ipc hip_ipc_off hip_uuid
}
