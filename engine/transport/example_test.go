package transport_test

import (
	"fmt"

	"github.com/tecache/te/engine/transport"
)

func ExampleParseSize() {
	n, _ := transport.ParseSize("64KiB")
	fmt.Println(n)
	// Output: 65536
}
