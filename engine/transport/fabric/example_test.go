package fabric_test

import (
	"errors"
	"fmt"

	"github.com/tecache/te/engine/transport/fabric"
	"github.com/tecache/te/internal/errs"
)

// Probe says whether this machine can run the fabric transport with a
// provider at an address (here libfabric's tcp provider on loopback, the
// lo domain), and if not, why: no libfabric, no such provider, or a
// provider whose registration modes te cannot meet.
func ExampleProbe() {
	domains, err := fabric.Probe("127.0.0.1", "tcp")
	if errors.Is(err, errs.ErrNotSupported) {
		fmt.Println("fabric unavailable:", err)
		return
	}
	fmt.Println("fabric domains:", domains)
}
