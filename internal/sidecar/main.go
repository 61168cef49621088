package sidecar

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"go.uber.org/automaxprocs/maxprocs"
)

// Options are te-sidecar's settings. Each has a flag and an environment
// variable; a flag given on the command line wins over the variable, which
// wins over the default.
type Options struct {
	Addr            string        // -addr, TE_SIDECAR_ADDR
	LogLevel        string        // -log-level, TE_SIDECAR_LOG_LEVEL: debug, info, warn, error
	LogFormat       string        // -log-format, TE_SIDECAR_LOG_FORMAT: json or text
	Token           string        // -metadata-token, MC_METADATA_HTTP_TOKEN
	MaxValue        int           // -max-value, TE_SIDECAR_MAX_VALUE (bytes)
	MaxKeys         int           // -max-keys, TE_SIDECAR_MAX_KEYS
	ShutdownTimeout time.Duration // -shutdown-timeout, TE_SIDECAR_SHUTDOWN_TIMEOUT
}

// ParseOptions reads args and the environment (through getenv).
func ParseOptions(args []string, getenv func(string) string, out io.Writer) (Options, error) {
	var o Options
	fs := flag.NewFlagSet("te-sidecar", flag.ContinueOnError)
	fs.SetOutput(out)
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	var bad []string
	envInt := func(name string, def int) int {
		v := getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			bad = append(bad, name+"="+v)
			return def
		}
		return n
	}
	envDur := func(name string, def time.Duration) time.Duration {
		v := getenv(name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			bad = append(bad, name+"="+v)
			return def
		}
		return d
	}
	fs.StringVar(&o.Addr, "addr", env("TE_SIDECAR_ADDR", ":8080"), "listen address (env TE_SIDECAR_ADDR)")
	fs.StringVar(&o.LogLevel, "log-level", env("TE_SIDECAR_LOG_LEVEL", "info"), "debug, info, warn or error (env TE_SIDECAR_LOG_LEVEL)")
	fs.StringVar(&o.LogFormat, "log-format", env("TE_SIDECAR_LOG_FORMAT", "json"), "json or text (env TE_SIDECAR_LOG_FORMAT)")
	fs.StringVar(&o.Token, "metadata-token", getenv("MC_METADATA_HTTP_TOKEN"), "bearer token required on /metadata (env MC_METADATA_HTTP_TOKEN)")
	fs.IntVar(&o.MaxValue, "max-value", envInt("TE_SIDECAR_MAX_VALUE", 16<<20), "largest metadata value in bytes (env TE_SIDECAR_MAX_VALUE)")
	fs.IntVar(&o.MaxKeys, "max-keys", envInt("TE_SIDECAR_MAX_KEYS", 1<<20), "most metadata keys held (env TE_SIDECAR_MAX_KEYS)")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", envDur("TE_SIDECAR_SHUTDOWN_TIMEOUT", 10*time.Second), "time requests in flight get at shutdown (env TE_SIDECAR_SHUTDOWN_TIMEOUT)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if len(bad) > 0 {
		return o, fmt.Errorf("invalid environment: %s", strings.Join(bad, ", "))
	}
	if _, err := parseLevel(o.LogLevel); err != nil {
		return o, err
	}
	if o.LogFormat != "json" && o.LogFormat != "text" {
		return o, fmt.Errorf("log format %q is not json or text", o.LogFormat)
	}
	if o.MaxValue <= 0 || o.MaxKeys <= 0 || o.ShutdownTimeout <= 0 {
		return o, errors.New("max-value, max-keys and shutdown-timeout must be positive")
	}
	return o, nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log level %q is not debug, info, warn or error", s)
	}
	return l, nil
}

// Version is te-sidecar's version, set at link time
// (-ldflags "-X github.com/tecache/te/internal/sidecar.Version=...").
var Version = "dev"

// Main runs te-sidecar until ctx ends (cmd/te-sidecar cancels it on SIGTERM
// or SIGINT), then shuts down gracefully. Logs go to logOut. It returns the
// process exit code: 0 after a clean shutdown, 1 when serving failed, 2 for
// bad flags or environment.
func Main(ctx context.Context, args []string, getenv func(string) string, logOut io.Writer) int {
	o, err := ParseOptions(args, getenv, logOut)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(logOut, "te-sidecar:", err)
		return 2
	}
	level, _ := parseLevel(o.LogLevel)
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewJSONHandler(logOut, hopts)
	if o.LogFormat == "text" {
		h = slog.NewTextHandler(logOut, hopts)
	}
	log := slog.New(h).With("service", "te-sidecar")

	// Not undone at exit: the process ends with Main.
	if _, err := maxprocs.Set(maxprocs.Logger(func(format string, args ...any) {
		log.Info(fmt.Sprintf(format, args...))
	})); err != nil {
		log.Warn("GOMAXPROCS from cgroup", "err", err)
	}

	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		log.Error("listen", "addr", o.Addr, "err", err)
		return 1
	}
	s := New(Config{Token: o.Token, MaxValue: o.MaxValue, MaxKeys: o.MaxKeys, Logger: log, Version: Version})
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String(), "version", Version, "metadata_auth", o.Token != "")

	select {
	case err := <-errc:
		log.Error("serving stopped", "err", err)
		return 1
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", o.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
	defer cancel()
	code := 0
	if err := s.Shutdown(sctx); err != nil {
		log.Warn("shutdown cut requests short", "err", err)
		code = 1
	}
	if err := <-errc; err != nil {
		log.Error("serving stopped", "err", err)
		code = 1
	}
	log.Info("stopped")
	return code
}
