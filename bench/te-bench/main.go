// Command te-bench measures te's transfer throughput and latency against the
// physical references of the same machine (raw loopback TCP, memcpy). See
// bench/README.md and `te-bench help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/tecache/te/bench/tebench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	code := tebench.Main(ctx, exe, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
