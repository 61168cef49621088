package ibv_test

import (
	"errors"
	"fmt"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv"
)

// Probe loads libibverbs and lists the RDMA devices, or says why there are
// none to use.
func ExampleProbe() {
	names, err := ibv.Probe()
	if errors.Is(err, errs.ErrNotSupported) {
		fmt.Println("no verbs here:", err)
		return
	}
	fmt.Println(names)
}
