package rdma_test

import (
	"os"
	"testing"

	_ "github.com/tecache/te/engine/std" // the engines these tests build install every standard transport
	"github.com/tecache/te/engine/transport/transporttest"
)

func TestMain(m *testing.M) {
	if os.Getenv(envNode) != "" {
		os.Exit(runNode()) // a node of the two-process tests (node_test.go)
	}
	transporttest.Main(m)
}
