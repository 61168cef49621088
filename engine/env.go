package engine

import (
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/tlog"
)

// The environment reaches every Config field, so that users of the C
// library, the Python binding and the Mooncake drop-in, who may not be able
// to set a field, can set a variable instead. A field the caller set wins;
// the environment fills the ones left at their zero value (the booleans are
// turned on by either). A value that does not parse is refused by New with
// an InvalidArgument error naming the variable. README.md's "Environment"
// table lists every variable.

// Environment variables New reads (besides TE_AUTH_SECRET, TE_AUTH_SECRET_FILE,
// TE_LOG_LEVEL and TE_LOG_FORMAT, named in their packages).
const (
	EnvSegmentName             = "TE_SEGMENT_NAME"
	EnvMetadata                = "TE_METADATA"
	EnvListenAddr              = "TE_LISTEN_ADDR"
	EnvHostname                = "TE_HOSTNAME"
	EnvTransports              = "TE_TRANSPORTS"
	EnvForceTransport          = "TE_FORCE_TRANSPORT"
	EnvTransferTimeout         = "TE_TRANSFER_TIMEOUT"
	EnvRPCTimeout              = "TE_RPC_TIMEOUT"
	EnvMaxNotifies             = "TE_MAX_NOTIFIES"
	EnvAllowMooncakeWithSecret = "TE_ALLOW_MOONCAKE_WITH_SECRET"
	EnvEncrypt                 = "TE_ENCRYPT"
	EnvIntegrity               = "TE_INTEGRITY"
	EnvUnregisterGrace         = "TE_UNREGISTER_GRACE"
	EnvMetricsAddr             = "TE_METRICS_ADDR"
	EnvMaxConns                = "TE_MAX_CONNS"
	EnvMaxConnsPerHost         = "TE_MAX_CONNS_PER_HOST"
	EnvIdleTimeout             = "TE_IDLE_TIMEOUT"
	EnvHandshakeTimeout        = "TE_HANDSHAKE_TIMEOUT"
	EnvProgressTimeout         = "TE_PROGRESS_TIMEOUT"
	EnvMaxFrame                = "TE_MAX_FRAME"
	EnvMaxCallsPerConn         = "TE_MAX_CALLS_PER_CONN"
	EnvMaxCalls                = "TE_MAX_CALLS"
	EnvNotifyBytes             = "TE_NOTIFY_BYTES"
	EnvNotifyBytesPerSender    = "TE_NOTIFY_BYTES_PER_SENDER"
	EnvPeerIdleTimeout         = "TE_PEER_IDLE_TIMEOUT"
	// EnvTCPListen pins the tcp data listener (the tcp.listen parameter).
	EnvTCPListen = "TE_TCP_LISTEN"
	// EnvTCPDevices names the NICs the tcp transport publishes an
	// endpoint for and stripes over (the tcp.devices parameter).
	EnvTCPDevices = "TE_TCP_DEVICES"
	// EnvParamPrefix starts a transport parameter: TE_PARAM_tcp_conns=4 is
	// Params["tcp.conns"] = "4". The name after the prefix is the
	// parameter's with its first "." written "_"; upper case is accepted
	// (TE_PARAM_TCP_CONNS).
	EnvParamPrefix = "TE_PARAM_"
)

// envError is the error of a variable whose value New refuses.
func envError(name, value, want string) error {
	return errs.New(errs.InvalidArgument, "new", "%s=%q: %s", name, value, want)
}

// parseBool reads the values a yes/no variable takes.
func parseBool(name, v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, envError(name, v, "want 1 or 0 (also true/false, yes/no, on/off)")
}

// parseDuration reads a Go duration ("30s", "500ms") in [lo, hi]; never
// allows "off" (or "never", "none"), which returns -1. A value outside the
// range is refused with it: 1ns cannot bound a network exchange, and a
// bound of years is none.
func parseDuration(name, v string, never bool, lo, hi time.Duration) (time.Duration, error) {
	s := strings.ToLower(strings.TrimSpace(v))
	if never && (s == "off" || s == "never" || s == "none") {
		return -1, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < lo || d > hi {
		want := "want a duration from " + lo.String() + " to " + hi.String() + " such as 30s or 500ms"
		if never {
			want += ", or off"
		}
		return 0, envError(name, v, want)
	}
	return d, nil
}

func parseCount(name, v string, limit int) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 || n > limit {
		return 0, envError(name, v, "want an integer from 1 to "+strconv.Itoa(limit))
	}
	return n, nil
}

// parseBytes reads a byte count: a number, optionally with B, KiB, MiB or
// GiB (K, M, G: the same powers of two).
func parseBytes(name, v string) (uint64, error) {
	n, err := transport.ParseSize(v)
	if err != nil || n == 0 {
		return 0, envError(name, v, "want a positive byte count such as 65536, 64KiB or 16MiB")
	}
	return n, nil
}

// envParam turns TE_PARAM_tcp_conns into tcp.conns.
func envParam(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, EnvParamPrefix)
	if !ok {
		return "", false
	}
	t, k, ok := strings.Cut(strings.ToLower(rest), "_")
	if !ok || t == "" || k == "" {
		return "", false
	}
	return t + "." + k, true
}

// applyEnv fills the fields of c the caller left unset from the
// environment (getenv), and records in envParams which variable set each
// transport parameter.
func (c *Config) applyEnv(getenv func(string) string, environ []string) (envParams map[string]string, fromEnv []envValue, err error) {
	str := func(name string, dst *string) {
		if *dst == "" {
			*dst = strings.TrimSpace(getenv(name))
			if *dst != "" {
				fromEnv = append(fromEnv, envValue{name: name, value: *dst})
			}
		}
	}
	str(EnvSegmentName, &c.SegmentName)
	str(EnvMetadata, &c.Metadata)
	str(EnvListenAddr, &c.ListenAddr)
	str(EnvHostname, &c.Hostname)
	str(EnvForceTransport, &c.ForceTransport)
	c.ForceTransport = strings.ToLower(c.ForceTransport)
	str(EnvMetricsAddr, &c.MetricsAddr)
	if v := getenv(EnvTransports); v != "" && len(c.Transports) == 0 {
		fromEnv = append(fromEnv, envValue{name: EnvTransports, value: v})
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				c.Transports = append(c.Transports, t)
			}
		}
	}

	bools := []struct {
		name string
		dst  *bool
	}{
		{EnvAcceptMooncakePeers, &c.AcceptMooncakePeers},
		{EnvAllowMooncakeWithSecret, &c.AllowMooncakeWithSecret},
		{EnvEncrypt, &c.Encrypt},
	}
	for _, b := range bools {
		if v := getenv(b.name); v != "" {
			on, err := parseBool(b.name, v)
			if err != nil {
				return nil, nil, err
			}
			*b.dst = *b.dst || on
		}
	}

	if v := getenv(EnvIntegrity); v != "" {
		fromEnv = append(fromEnv, envValue{name: EnvIntegrity, value: v})
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "headers":
			c.HeadersOnly = true
		case "payload":
		default:
			return nil, nil, envError(EnvIntegrity, v, "want payload (the default: payloads authenticated) or headers (headers only, payloads unauthenticated)")
		}
	}

	l := &c.Limits
	const ms, day = time.Millisecond, 24 * time.Hour
	durs := []struct {
		name   string
		dst    *time.Duration
		never  bool // "off" allowed: a negative value, never
		lo, hi time.Duration
	}{
		{EnvTransferTimeout, &c.TransferTimeout, true, ms, day},
		{EnvRPCTimeout, &c.RPCTimeout, false, 10 * ms, time.Hour},
		{EnvUnregisterGrace, &c.UnregisterGrace, false, ms, time.Hour},
		{EnvIdleTimeout, &l.IdleTimeout, true, time.Second, day},
		{EnvHandshakeTimeout, &l.HandshakeTimeout, false, 10 * ms, time.Hour},
		{EnvProgressTimeout, &l.ProgressTimeout, false, 10 * ms, time.Hour},
		{EnvPeerIdleTimeout, &l.PeerIdleTimeout, true, time.Second, day},
	}
	for _, d := range durs {
		if v := getenv(d.name); v != "" {
			x, err := parseDuration(d.name, v, d.never, d.lo, d.hi)
			if err != nil {
				return nil, nil, err
			}
			if *d.dst == 0 {
				*d.dst = x
			}
		}
	}
	counts := []struct {
		name  string
		dst   *int
		limit int
	}{
		{EnvMaxNotifies, &c.MaxNotifies, 1 << 30},
		{EnvMaxConns, &l.MaxConns, 1 << 20},
		{EnvMaxConnsPerHost, &l.MaxConnsPerHost, 1 << 20},
		{EnvMaxCallsPerConn, &l.MaxCallsPerConn, 1 << 20},
		{EnvMaxCalls, &l.MaxCalls, 1 << 24},
	}
	for _, n := range counts {
		if v := getenv(n.name); v != "" {
			x, err := parseCount(n.name, v, n.limit)
			if err != nil {
				return nil, nil, err
			}
			if *n.dst == 0 {
				*n.dst = x
			}
		}
	}
	sizes := []struct {
		name string
		dst  *uint64
	}{
		{EnvMaxFrame, &l.MaxFrame},
		{EnvNotifyBytes, &l.NotifyBytes},
		{EnvNotifyBytesPerSender, &l.NotifyBytesPerSender},
	}
	for _, s := range sizes {
		if v := getenv(s.name); v != "" {
			x, err := parseBytes(s.name, v)
			if err != nil {
				return nil, nil, err
			}
			if s.dst == &l.MaxFrame && (x < MinMaxFrame || x > MaxMaxFrame) {
				return nil, nil, envError(s.name, v, "want a size from 4KiB to 1GiB (the largest descriptor a peer may send)")
			}
			if *s.dst == 0 && (s.dst != &l.MaxFrame || c.MaxFrame == 0) {
				*s.dst = x
			}
		}
	}

	// Transport parameters: TE_TCP_LISTEN and TE_PARAM_*.
	envParams = map[string]string{}
	set := func(name, key, v string) error {
		t, _, _ := strings.Cut(key, ".")
		if _, ok := transport.Lookup(t); !ok {
			return errs.New(errs.InvalidArgument, "new", "%s: no transport is named %q", name, t).
				WithHint("transports: " + strings.Join(transport.Names(), ", ") + "; the variable is " +
					EnvParamPrefix + "<transport>_<parameter>, e.g. TE_PARAM_tcp_conns=4")
		}
		if t == "limits" || t == "mooncake" {
			return errs.New(errs.InvalidArgument, "new", "%s: %s is not a transport parameter", name, key)
		}
		if _, ok := c.Params[key]; ok {
			return nil // the caller's value wins
		}
		if c.Params == nil {
			c.Params = map[string]string{}
		} else if len(envParams) == 0 {
			c.Params = maps(c.Params) // never write into the caller's map
		}
		c.Params[key] = strings.TrimSpace(v)
		envParams[key] = name
		return nil
	}
	if v := getenv(EnvTCPListen); v != "" {
		if err := set(EnvTCPListen, "tcp.listen", v); err != nil {
			return nil, nil, err
		}
	}
	if v := getenv(EnvTCPDevices); v != "" {
		if err := set(EnvTCPDevices, "tcp.devices", v); err != nil {
			return nil, nil, err
		}
	}
	names := []string{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvParamPrefix) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		key, ok := envParam(name)
		if !ok {
			return nil, nil, errs.New(errs.InvalidArgument, "new", "%s: want %s<transport>_<parameter>, e.g. TE_PARAM_tcp_conns=4",
				name, EnvParamPrefix)
		}
		if key == "tcp.listen" && envParams[key] != "" {
			return nil, nil, errs.New(errs.InvalidArgument, "new", "%s and %s both set tcp.listen", EnvTCPListen, name)
		}
		if key == "tcp.devices" && envParams[key] != "" {
			return nil, nil, errs.New(errs.InvalidArgument, "new", "%s and %s both set tcp.devices", EnvTCPDevices, name)
		}
		if err := set(name, key, getenv(name)); err != nil {
			return nil, nil, err
		}
	}
	return envParams, fromEnv, nil
}

// envValue is a string field the environment set; op, when set, is the
// operation whose errors are about it whatever they quote.
type envValue struct{ name, value, op string }

// blameEnv names the variable behind a failure of New whose message shows
// a value the environment set (TE_METADATA=gopher://x: unknown scheme).
func blameEnv(err error, fromEnv []envValue) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	te, _ := err.(*errs.Error)
	for _, v := range fromEnv {
		if v.name == EnvMetadata {
			v.op = "metadata" // the stores' errors quote the scheme or the host alone
		}
		about := strings.Contains(msg, v.value) || (te != nil && v.op != "" && te.Op == v.op)
		if about && !strings.Contains(msg, v.name) {
			if te != nil {
				hint := "set by " + v.name + "=" + v.value
				if te.Hint != "" {
					hint = te.Hint + "; " + hint
				}
				return te.WithHint(hint)
			}
		}
	}
	return err
}

func maps(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// envLogger is the logger of a Config without one: te's log style on
// stderr (time=... level=... msg="te: ..." key=value, or JSON lines), at
// the level and in the format TE_LOG_LEVEL and TE_LOG_FORMAT set (info and
// text by default), as every other te program logs. An application that
// wants its own slog.Default() passes it as Config.Logger.
func envLogger(c *Config, getenv func(string) string) error {
	o, _, err := tlog.FromEnv(getenv, tlog.Options{Level: slog.LevelInfo})
	if err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = tlog.New(os.Stderr, o)
	}
	return nil
}

// checkEnvParams refuses a TE_PARAM_ variable for an installed transport
// that never asked for that parameter while it started: a misspelt name
// would otherwise change nothing, silently.
func (e *Engine) checkEnvParams() error {
	keys := make([]string, 0, len(e.envParams))
	for k := range e.envParams {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		t, _, _ := strings.Cut(key, ".")
		if e.byName[t] == nil {
			continue // not installed here: nothing reads it
		}
		if _, asked := e.paramsAsked.Load(key); !asked {
			return errs.New(errs.InvalidArgument, "new", "%s: transport %s has no parameter %q", e.envParams[key], t, key).
				WithHint("README.md, \"Environment\", lists the parameters of each transport")
		}
	}
	return nil
}

// envParamRefused names the variable behind transport name's failure to
// start, when the transport refused a parameter the environment set: New
// then fails rather than run without the transport.
func (e *Engine) envParamRefused(name string, err error) string {
	if errs.CodeOf(err) != errs.InvalidArgument {
		return "" // e.g. no NIC for rdma: skipped as without the variable
	}
	msg := err.Error()
	var vars []string
	for key, v := range e.envParams {
		if t, _, _ := strings.Cut(key, "."); t == name && strings.Contains(msg, key) {
			vars = append(vars, v)
		}
	}
	if len(vars) == 0 {
		for key, v := range e.envParams {
			if t, _, _ := strings.Cut(key, "."); t == name {
				vars = append(vars, v)
			}
		}
	}
	slices.Sort(vars)
	return strings.Join(vars, ", ")
}
