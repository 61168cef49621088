// Command te-sidecar is te's per-pod daemon: it serves the prefill-to-decode
// handoff rendezvous, Mooncake's HTTP metadata protocol, /healthz and
// Prometheus /metrics. With a cluster secret (-auth-secret-file,
// TE_AUTH_SECRET_FILE or TE_AUTH_SECRET) every other route needs the token
// derived from it; without one it listens on loopback only unless -insecure
// is given. Run te-sidecar -h for its flags and environment variables; the
// logic is in cmd/te-sidecar/sidecar.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := sidecar.Main(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	os.Exit(code)
}
