package rdma_test

import (
	"errors"
	"fmt"

	"github.com/tecache/te/engine/transport/rdma"
	"github.com/tecache/te/internal/errs"
)

// Probe says whether this machine can run the rdma transport, and if not,
// why.
func ExampleProbe() {
	devices, err := rdma.Probe()
	if errors.Is(err, errs.ErrNotSupported) {
		fmt.Println("rdma unavailable:", err)
		return
	}
	fmt.Println("RDMA devices:", devices)
}

// ParseOptions reads the rdma.* engine parameters; the device allow-list
// falls back to TE_RDMA_DEVICES and Mooncake's MC_TE_FILTERS.
func ExampleParseOptions() {
	params := map[string]string{"rdma.slice": "256KiB", "rdma.qps": "4"}
	env := map[string]string{"MC_TE_FILTERS": "mlx5_0,mlx5_1"}
	o, err := rdma.ParseOptions(
		func(k string) (string, bool) { v, ok := params[k]; return v, ok },
		func(k string) string { return env[k] })
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(o.Devices, o.Slice, o.QPs, o.Depth)
	// Output: [mlx5_0 mlx5_1] 262144 4 1024
}
