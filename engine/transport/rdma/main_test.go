package rdma_test

import (
	_ "github.com/tecache/te/engine/std" // the engines these tests build install every standard transport

	"testing"

	"github.com/tecache/te/engine/transport/transporttest"
)

func TestMain(m *testing.M) { transporttest.Main(m) }
