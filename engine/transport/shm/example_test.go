package shm_test

import (
	"fmt"
	"slices"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/shm"
)

// An engine installs shm by default; requests to a segment of another
// process on this host use it whenever the kernel allows, else the next
// transport. Params tune it; TransportStats shows what it did.
func Example() {
	e, err := engine.New(engine.Config{
		ListenAddr: "127.0.0.1:0",
		Params:     map[string]string{"shm.lease": "10s", "shm.revoke_timeout": "1s"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	fmt.Println(slices.Contains(e.Transports(), shm.Name))
	fmt.Println(e.TransportStats()[shm.Name]["probe_refused"])
	// Output:
	// true
	// 0
}

func ExampleDefaultOptions() {
	o := shm.DefaultOptions()
	fmt.Println(o.Lease, o.RevokeTimeout, o.JobBytes>>20, "MiB")
	// Output: 5s 2s 8 MiB
}
