package glue

import (
	_ "github.com/tecache/te/engine/std" // the engines these tests build install every standard transport

	"testing"

	"go.uber.org/goleak"
)

// The handoff tests run a sidecar (fasthttp); its worker-pool cleaner and
// date updater are process-wide goroutines that outlive a server, by design.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"))
}
