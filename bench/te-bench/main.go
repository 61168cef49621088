// Command te-bench measures te's transfer throughput and latency against the
// physical references of the same machine (raw loopback TCP, memcpy). See
// bench/README.md and `te-bench help`.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/tecache/te/bench/tebench"
	"github.com/tecache/te/internal/tlog"
)

func main() {
	// The engines log through slog.Default (their Config.Logger is nil):
	// te's style, level and format from TE_LOG_LEVEL and TE_LOG_FORMAT.
	lo, _, err := tlog.FromEnv(os.Getenv, tlog.Options{Level: slog.LevelInfo})
	if err != nil {
		fmt.Fprintln(os.Stderr, "te-bench:", err)
		os.Exit(2)
	}
	slog.SetDefault(tlog.New(os.Stderr, lo))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	code := tebench.Main(ctx, exe, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
