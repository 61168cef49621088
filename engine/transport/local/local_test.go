package local_test

import (
	_ "github.com/tecache/te/engine/std"

	"testing"

	"github.com/tecache/te/engine/transport/transporttest"
)

func TestMain(m *testing.M) { transporttest.Main(m) }

func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.Setup{Transport: "local"})
}
