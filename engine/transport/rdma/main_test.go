package rdma_test

import (
	"testing"

	"github.com/tecache/te/engine/transport/transporttest"
)

func TestMain(m *testing.M) { transporttest.Main(m) }
