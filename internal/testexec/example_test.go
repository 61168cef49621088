package testexec_test

import (
	"fmt"

	"github.com/tecache/te/internal/testexec"
)

// A test starts another copy of itself as a peer; under make test-arm64 the
// copy runs under qemu-aarch64-static as the test binary does.
func ExampleCommand() {
	cmd := testexec.Command("/bin/true")
	fmt.Println(cmd.Args[len(cmd.Args)-1])
	// Output: /bin/true
}
