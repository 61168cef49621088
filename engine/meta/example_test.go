package meta_test

import (
	"context"
	"fmt"
	"testing"

	"go.uber.org/goleak"

	"github.com/tecache/te/engine/meta"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ExampleOpenWith() {
	// An engine passes its cluster secret: the HTTP store derives
	// te-sidecar's token from it. The in-process store needs nothing.
	s, err := meta.OpenWith("mem://example", meta.Options{AuthSecret: "0123456789abcdef-cluster"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	s.Put(context.Background(), meta.KeyRAM("seg"), []byte(`{"name":"seg"}`))
	v, _ := s.Get(context.Background(), meta.KeyRAM("seg"))
	fmt.Println(string(v))
	_, err = meta.OpenWith("nope://x", meta.Options{})
	fmt.Println(err != nil)
	// Output:
	// {"name":"seg"}
	// true
}
