package sidecar

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"go.uber.org/automaxprocs/maxprocs"

	"github.com/tecache/te/cmd/te-sidecar/rendezvous"
	"github.com/tecache/te/internal/authsecret"
)

// Options are te-sidecar's settings. Each has a flag and an environment
// variable; a flag given on the command line wins over the variable, which
// wins over the default.
type Options struct {
	Addr            string        // -addr, TE_SIDECAR_ADDR ("" picks by secret: $POD_IP:8080 or :8080 with one, 127.0.0.1:8080 without)
	Version         bool          // -version: print the version and exit
	LogLevel        string        // -log-level, TE_LOG_LEVEL: debug, info, warn, error
	LogFormat       string        // -log-format, TE_LOG_FORMAT: text or json
	AuthSecretFile  string        // -auth-secret-file, TE_AUTH_SECRET_FILE (else the value in TE_AUTH_SECRET)
	Insecure        bool          // -insecure, TE_SIDECAR_INSECURE: serve a non-loopback address without a secret
	Token           string        // -metadata-token, MC_METADATA_HTTP_TOKEN
	MaxValue        int           // -max-value, TE_SIDECAR_MAX_VALUE (bytes)
	MaxKeys         int           // -max-keys, TE_SIDECAR_MAX_KEYS
	MaxMetaBytes    int           // -max-metadata-bytes, TE_SIDECAR_MAX_METADATA_BYTES
	MaxConns        int           // -max-conns, TE_SIDECAR_MAX_CONNS
	MaxConnsPerIP   int           // -max-conns-per-ip, TE_SIDECAR_MAX_CONNS_PER_IP
	ReservedConns   int           // -reserved-conns, TE_SIDECAR_RESERVED_CONNS
	MaxPendingPerIP int           // -max-pending-conns-per-ip, TE_SIDECAR_MAX_PENDING_CONNS_PER_IP
	HeaderTimeout   time.Duration // -header-timeout, TE_SIDECAR_HEADER_TIMEOUT
	RefusalLogRate  float64       // -log-refusals-per-second, TE_SIDECAR_LOG_REFUSALS_PER_SECOND
	MaxBodyInFlight int           // -max-body-in-flight, TE_SIDECAR_MAX_BODY_IN_FLIGHT (bytes)
	ShutdownTimeout time.Duration // -shutdown-timeout, TE_SIDECAR_SHUTDOWN_TIMEOUT

	HandoffMaxBody         int // -handoff-max-body, TE_SIDECAR_HANDOFF_MAX_BODY (bytes)
	HandoffMaxTransfers    int // -handoff-max-transfers, TE_SIDECAR_HANDOFF_MAX_TRANSFERS
	HandoffMaxBytes        int // -handoff-max-bytes, TE_SIDECAR_HANDOFF_MAX_BYTES
	HandoffClientTransfers int // -handoff-client-transfers, TE_SIDECAR_HANDOFF_CLIENT_TRANSFERS
	HandoffClientBytes     int // -handoff-client-bytes, TE_SIDECAR_HANDOFF_CLIENT_BYTES
	// -handoff-settle-grace, TE_SIDECAR_HANDOFF_SETTLE_GRACE
	HandoffSettleGrace time.Duration

	secret *authsecret.Secrets
}

// ParseOptions reads args and the environment (through getenv).
// EnvPodIP is the pod's IP (Kubernetes' downward API, status.podIP): with
// a secret and no -addr the sidecar binds it rather than every interface.
const EnvPodIP = "POD_IP"

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
			bad = append(bad, fmt.Sprintf("%s=%q: want a whole number such as %d", name, v, def))
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
			bad = append(bad, fmt.Sprintf("%s=%q: want a duration with its unit such as %s", name, v, def))
			return def
		}
		return d
	}
	envFloat := func(name string, def float64) float64 {
		v := getenv(name)
		if v == "" {
			return def
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s=%q: want a number such as %g", name, v, def))
			return def
		}
		return f
	}
	envBool := func(name string) bool {
		switch v := getenv(name); v {
		case "", "0", "false":
			return false
		case "1", "true":
			return true
		default:
			bad = append(bad, fmt.Sprintf("%s=%q: want 1, true, 0 or false", name, v))
			return false
		}
	}
	fs.StringVar(&o.Addr, "addr", getenv("TE_SIDECAR_ADDR"),
		"listen address (env TE_SIDECAR_ADDR; default without a secret 127.0.0.1:8080; with one $POD_IP:8080 when POD_IP is set, else :8080, every interface of the host or pod)")
	fs.BoolVar(&o.Version, "version", false, "print the version and exit")
	fs.StringVar(&o.LogLevel, "log-level", env("TE_LOG_LEVEL", "info"), "debug, info, warn or error (env TE_LOG_LEVEL)")
	fs.StringVar(&o.LogFormat, "log-format", env("TE_LOG_FORMAT", "text"), "text (log/slog's key=value) or json (env TE_LOG_FORMAT)")
	fs.StringVar(&o.AuthSecretFile, "auth-secret-file", getenv(authsecret.EnvSecretFile),
		"file with the cluster secret, optionally a second line with the previous one (env "+authsecret.EnvSecretFile+
			"; else the secret itself in "+authsecret.EnvSecret+"). Every route but "+OpenRoutes+" then needs "+
			"Authorization: Bearer hex(HMAC-SHA256(secret, \""+authsecret.TokenMessage+"\"))")
	fs.BoolVar(&o.Insecure, "insecure", envBool("TE_SIDECAR_INSECURE"),
		"serve a non-loopback address without a secret: anyone who reaches it can use every route (env TE_SIDECAR_INSECURE=1)")
	fs.StringVar(&o.Token, "metadata-token", getenv("MC_METADATA_HTTP_TOKEN"),
		"bearer token also accepted on /metadata, as Mooncake's metadata server (env MC_METADATA_HTTP_TOKEN)")
	fs.IntVar(&o.MaxValue, "max-value", envInt("TE_SIDECAR_MAX_VALUE", 16<<20), "largest metadata value in bytes (env TE_SIDECAR_MAX_VALUE)")
	fs.IntVar(&o.MaxKeys, "max-keys", envInt("TE_SIDECAR_MAX_KEYS", 1<<20), "most metadata keys held (env TE_SIDECAR_MAX_KEYS)")
	fs.IntVar(&o.MaxMetaBytes, "max-metadata-bytes", envInt("TE_SIDECAR_MAX_METADATA_BYTES", 256<<20),
		"bytes of metadata keys and values held (env TE_SIDECAR_MAX_METADATA_BYTES)")
	fs.IntVar(&o.MaxConns, "max-conns", envInt("TE_SIDECAR_MAX_CONNS", 4096), "most connections open at once (env TE_SIDECAR_MAX_CONNS)")
	fs.IntVar(&o.MaxConnsPerIP, "max-conns-per-ip", envInt("TE_SIDECAR_MAX_CONNS_PER_IP", 0),
		"most connections from one IP address (env TE_SIDECAR_MAX_CONNS_PER_IP; default half of -max-conns)")
	fs.IntVar(&o.ReservedConns, "reserved-conns", envInt("TE_SIDECAR_RESERVED_CONNS", 0),
		"connection slots only connections that authenticated may take (env TE_SIDECAR_RESERVED_CONNS; default a quarter of -max-conns)")
	fs.IntVar(&o.MaxPendingPerIP, "max-pending-conns-per-ip", envInt("TE_SIDECAR_MAX_PENDING_CONNS_PER_IP", 64),
		"connections from one IP address that have not authenticated yet; past it the oldest is closed (env TE_SIDECAR_MAX_PENDING_CONNS_PER_IP)")
	fs.DurationVar(&o.HeaderTimeout, "header-timeout", envDur("TE_SIDECAR_HEADER_TIMEOUT", 2*time.Second),
		"time for a request line and headers, and for every read of a connection that has not authenticated yet (env TE_SIDECAR_HEADER_TIMEOUT)")
	fs.Float64Var(&o.RefusalLogRate, "log-refusals-per-second", envFloat("TE_SIDECAR_LOG_REFUSALS_PER_SECOND", 10),
		"most log lines a second about refused requests; the others are counted (env TE_SIDECAR_LOG_REFUSALS_PER_SECOND)")
	fs.IntVar(&o.MaxBodyInFlight, "max-body-in-flight", envInt("TE_SIDECAR_MAX_BODY_IN_FLIGHT", 32<<20),
		"bytes of request bodies read at once; past it requests get 503 (env TE_SIDECAR_MAX_BODY_IN_FLIGHT)")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", envDur("TE_SIDECAR_SHUTDOWN_TIMEOUT", 10*time.Second), "time requests in flight get at shutdown (env TE_SIDECAR_SHUTDOWN_TIMEOUT)")
	fs.IntVar(&o.HandoffMaxBody, "handoff-max-body", envInt("TE_SIDECAR_HANDOFF_MAX_BODY", rendezvous.DefaultMaxBody),
		"largest body of a handoff request in bytes; larger ones get 413 (env TE_SIDECAR_HANDOFF_MAX_BODY)")
	fs.IntVar(&o.HandoffMaxTransfers, "handoff-max-transfers", envInt("TE_SIDECAR_HANDOFF_MAX_TRANSFERS", 1<<16),
		"handoff transfers held, finished ones included (env TE_SIDECAR_HANDOFF_MAX_TRANSFERS)")
	fs.IntVar(&o.HandoffMaxBytes, "handoff-max-bytes", envInt("TE_SIDECAR_HANDOFF_MAX_BYTES", 128<<20),
		"memory held by the declarations of live handoff transfers, in bytes (env TE_SIDECAR_HANDOFF_MAX_BYTES)")
	fs.IntVar(&o.HandoffClientTransfers, "handoff-client-transfers", envInt("TE_SIDECAR_HANDOFF_CLIENT_TRANSFERS", 4096),
		"unpaired handoff transfers one client may hold; past it, 429 (env TE_SIDECAR_HANDOFF_CLIENT_TRANSFERS)")
	fs.IntVar(&o.HandoffClientBytes, "handoff-client-bytes", envInt("TE_SIDECAR_HANDOFF_CLIENT_BYTES", 32<<20),
		"declaration bytes of one client's live handoff transfers; past it, 429 (env TE_SIDECAR_HANDOFF_CLIENT_BYTES)")
	fs.DurationVar(&o.HandoffSettleGrace, "handoff-settle-grace", envDur("TE_SIDECAR_HANDOFF_SETTLE_GRACE", 40*time.Second),
		"how long a handoff that expired or was aborted while its mover was moving waits for the mover's report before "+
			"the other side may reuse its blocks; keep it over the engines' transfer timeout (env TE_SIDECAR_HANDOFF_SETTLE_GRACE)")
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
	if o.Version {
		return o, nil
	}
	if o.LogFormat != "json" && o.LogFormat != "text" {
		return o, fmt.Errorf("log format %q is not text or json", o.LogFormat)
	}
	if o.MaxConnsPerIP < 0 || o.ReservedConns < 0 || o.ReservedConns >= o.MaxConns {
		return o, errors.New("-max-conns-per-ip must not be negative, -reserved-conns must be 0..max-conns-1")
	}
	if err := positive(fs); err != nil {
		return o, err
	}
	if err := checkRanges(o); err != nil {
		return o, err
	}
	sec, err := authsecret.Load("", o.AuthSecretFile, getenv)
	if err != nil {
		return o, err
	}
	o.secret = sec
	if o.Addr == "" {
		o.Addr = "127.0.0.1:8080"
		if sec != nil {
			// The pod's own address when Kubernetes gives it (the
			// downward API's status.podIP), else every interface.
			o.Addr = ":8080"
			if ip := net.ParseIP(strings.TrimSpace(getenv(EnvPodIP))); ip != nil {
				o.Addr = net.JoinHostPort(ip.String(), "8080")
			}
		}
	}
	if sec == nil && !o.Insecure && !Loopback(o.Addr) {
		return o, fmt.Errorf("refusing to serve %s without a cluster secret: set %s (or %s), listen on 127.0.0.1, "+
			"or pass -insecure to trust the network", o.Addr, authsecret.EnvSecretFile, authsecret.EnvSecret)
	}
	return o, nil
}

// mustBePositive names the flags whose value must be over zero: sizes,
// counts, rates and timeouts.
var mustBePositive = []string{"max-value", "max-keys", "max-metadata-bytes", "max-conns", "max-pending-conns-per-ip",
	"header-timeout", "log-refusals-per-second", "max-body-in-flight", "shutdown-timeout", "handoff-max-body",
	"handoff-max-transfers", "handoff-max-bytes", "handoff-client-transfers", "handoff-client-bytes", "handoff-settle-grace"}

// positive refuses the first flag of mustBePositive that is not over
// zero, naming it and, when the value came from there, its variable.
func positive(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range mustBePositive {
		f := fs.Lookup(name)
		g, ok := f.Value.(flag.Getter)
		if !ok {
			continue
		}
		var over bool
		switch v := g.Get().(type) {
		case int:
			over = v > 0
		case float64:
			over = v > 0
		case time.Duration:
			over = v > 0
		default:
			continue
		}
		if over {
			continue
		}
		from := "-" + name + "=" + f.Value.String()
		if !given[name] {
			if env, ok := envOf(f.Usage); ok {
				from = env + "=" + f.Value.String()
			}
		}
		want := "a whole number of at least 1"
		if _, ok := g.Get().(time.Duration); ok {
			want = "a duration over 0 such as " + f.DefValue
		} else if _, ok := g.Get().(float64); ok {
			want = "a number over 0 such as " + f.DefValue
		}
		return fmt.Errorf("%s: must be positive: want %s (-%s: %s)", from, want, name, f.Usage)
	}
	return nil
}

// envOf is the variable a flag's usage names ("env TE_SIDECAR_...").
func envOf(usage string) (string, bool) {
	_, rest, ok := strings.Cut(usage, "(env ")
	if !ok {
		return "", false
	}
	end := strings.IndexAny(rest, ";)= ")
	if end < 0 {
		return "", false
	}
	return rest[:end], true
}

// Loopback reports whether addr (host:port) listens on loopback only.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log level %q is not debug, info, warn or error", s)
	}
	return l, nil
}

// Version is te-sidecar's version, set at link time
// (-ldflags "-X github.com/tecache/te/cmd/te-sidecar/sidecar.Version=...").
var Version = "dev"

// versionOut is where -version prints (a variable for tests).
var versionOut io.Writer = os.Stdout

// Main runs te-sidecar until ctx ends (cmd/te-sidecar cancels it on SIGTERM
// or SIGINT), then shuts down gracefully. Logs go to logOut; -version
// prints to standard output. It returns the process exit code: 0 after a
// clean shutdown (or -version), 1 when serving failed, 2 for bad flags or
// environment.
func Main(ctx context.Context, args []string, getenv func(string) string, logOut io.Writer) int {
	o, err := ParseOptions(args, getenv, logOut)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(logOut, "te-sidecar:", err)
		return 2
	}
	if o.Version {
		fmt.Fprintf(versionOut, "te-sidecar %s (%s)\n", Version, runtime.Version())
		return 0
	}
	level, _ := parseLevel(o.LogLevel)
	log, _ := NewLogger(logOut, o.LogFormat, level)
	log = log.With("service", "te-sidecar")

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
	s := New(Config{Secret: o.secret, Token: o.Token, MaxValue: o.MaxValue, MaxKeys: o.MaxKeys, MaxMetadataBytes: o.MaxMetaBytes,
		MaxConns: o.MaxConns, MaxConnsPerIP: o.MaxConnsPerIP, ReservedConns: o.ReservedConns, MaxPendingConnsPerIP: o.MaxPendingPerIP,
		HeaderTimeout: o.HeaderTimeout, RefusalLogRate: o.RefusalLogRate,
		MaxBodyInFlight: int64(o.MaxBodyInFlight), Logger: log, Version: Version,
		Handoff: rendezvous.Config{MaxBody: o.HandoffMaxBody, MaxTransfers: o.HandoffMaxTransfers,
			MaxBytes: int64(o.HandoffMaxBytes), ClientTransfers: o.HandoffClientTransfers, ClientBytes: int64(o.HandoffClientBytes),
			SettleGrace: o.HandoffSettleGrace}})
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	switch {
	case o.secret != nil:
		log.Info("authentication on: every route but "+OpenRoutes+" needs the cluster secret's token",
			"rotation", o.secret.Previous != nil, "metadata_token", o.Token != "")
	case !Loopback(o.Addr):
		log.Warn("no cluster secret and -insecure: te-sidecar trusts the network, anyone who reaches it can use every route",
			"addr", o.Addr)
	default:
		log.Warn("no cluster secret: serving loopback only, every local process can use every route", "metadata_token", o.Token != "")
	}
	log.Info("serving", "addr", ln.Addr().String(), "version", Version, "auth", o.secret != nil, "metadata_auth", o.Token != "" || o.secret != nil)

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
