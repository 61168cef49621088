package glue

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/tlog"
)

// Log levels of te_config_t.log_level.
const (
	LogDefault = 0
	LogDebug   = 1
	LogInfo    = 2
	LogWarn    = 3
	LogError   = 4
	LogOff     = 5
)

// Config is te_config_t after the C strings were copied: "" and 0 mean
// default.
type Config struct {
	LogLevel          int
	SegmentName       string
	Metadata          string
	ListenAddr        string
	Hostname          string
	Transports        string // comma-separated
	ForceTransport    string
	Params            string // key=value separated by ',', ';' or newlines
	TransferTimeoutMS int64
	RPCTimeoutMS      int64
	MaxFrame          uint64
	MaxNotifies       int64

	// ABI 1.2
	AuthSecret              string
	AuthSecretFile          string
	AcceptMooncakePeers     bool
	AllowMooncakeWithSecret bool
	UnregisterGraceMS       int64
	MaxConns                int32
	MaxConnsPerHost         int32
	IdleTimeoutMS           int64
	ProgressTimeoutMS       int64
	NotifyBytes             uint64
	NotifyBytesPerSender    uint64

	// ABI 1.3
	Encrypt bool
}

// maxMS bounds the millisecond fields (about 34 years) so that none
// overflows a time.Duration.
const maxMS = 1 << 40

func millis(field string, ms int64) (time.Duration, error) {
	if ms < 0 || ms > maxMS {
		return 0, errs.New(errs.InvalidArgument, "create", "%s %d outside 0..%d (0: default)", field, ms, int64(maxMS))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// EngineConfig validates c and turns it into an engine.Config.
func (c Config) EngineConfig() (engine.Config, error) {
	params, err := ParseParams(c.Params)
	if err != nil {
		return engine.Config{}, err
	}
	logger, err := LoggerEnv(c.LogLevel, os.Stderr, os.Getenv)
	if err != nil {
		return engine.Config{}, err
	}
	ec := engine.Config{
		SegmentName:    c.SegmentName,
		Metadata:       c.Metadata,
		ListenAddr:     c.ListenAddr,
		Hostname:       c.Hostname,
		ForceTransport: strings.TrimSpace(strings.ToLower(c.ForceTransport)),
		Params:         params,
		MaxFrame:       c.MaxFrame,
		Logger:         logger,
	}
	for _, t := range strings.Split(c.Transports, ",") {
		if t = strings.TrimSpace(t); t != "" {
			ec.Transports = append(ec.Transports, t)
		}
	}
	switch {
	case c.TransferTimeoutMS < 0:
		ec.TransferTimeout = -1
	case c.TransferTimeoutMS > 0:
		ec.TransferTimeout = time.Duration(c.TransferTimeoutMS) * time.Millisecond
	}
	if c.RPCTimeoutMS > 0 {
		ec.RPCTimeout = time.Duration(c.RPCTimeoutMS) * time.Millisecond
	}
	if c.MaxNotifies > 0 {
		if c.MaxNotifies > 1<<30 {
			return engine.Config{}, errs.New(errs.InvalidArgument, "create", "max_notifies %d exceeds %d", c.MaxNotifies, 1<<30)
		}
		ec.MaxNotifies = int(c.MaxNotifies)
	}
	// Empty secrets leave engine.New to read TE_AUTH_SECRET_FILE and
	// TE_AUTH_SECRET; a false AcceptMooncakePeers leaves it to read
	// TE_ACCEPT_MOONCAKE_PEERS.
	ec.AuthSecret = c.AuthSecret
	ec.AuthSecretFile = c.AuthSecretFile
	ec.AcceptMooncakePeers = c.AcceptMooncakePeers
	ec.AllowMooncakeWithSecret = c.AllowMooncakeWithSecret
	ec.Encrypt = c.Encrypt // false leaves engine.New to read TE_ENCRYPT
	if c.MaxConns < 0 || c.MaxConnsPerHost < 0 {
		return engine.Config{}, errs.New(errs.InvalidArgument, "create", "max_conns %d, max_conns_per_host %d: negative", c.MaxConns, c.MaxConnsPerHost)
	}
	ec.Limits.MaxConns = int(c.MaxConns)
	ec.Limits.MaxConnsPerHost = int(c.MaxConnsPerHost)
	ec.Limits.NotifyBytes = c.NotifyBytes
	ec.Limits.NotifyBytesPerSender = c.NotifyBytesPerSender
	for _, d := range []struct {
		field string
		ms    int64
		dst   *time.Duration
	}{
		{"unregister_grace_ms", c.UnregisterGraceMS, &ec.UnregisterGrace},
		{"idle_timeout_ms", c.IdleTimeoutMS, &ec.Limits.IdleTimeout},
		{"progress_timeout_ms", c.ProgressTimeoutMS, &ec.Limits.ProgressTimeout},
	} {
		v, err := millis(d.field, d.ms)
		if err != nil {
			return engine.Config{}, err
		}
		*d.dst = v
	}
	return ec, nil
}

// ParseParams parses "k=v" pairs separated by ',', ';' or newlines; blank
// items are skipped, and a later key wins.
func ParseParams(s string) (map[string]string, error) {
	items := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ';' || r == '\n' || r == '\r' })
	if len(items) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(items))
	for _, it := range items {
		it = strings.TrimSpace(it)
		if it == "" {
			continue
		}
		k, v, ok := strings.Cut(it, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, errs.New(errs.InvalidArgument, "create", "parameter %q is not key=value", it)
		}
		m[k] = strings.TrimSpace(v)
	}
	if len(m) == 0 {
		return nil, nil
	}
	return m, nil
}

// Logger returns the logger for a te_config_t.log_level, writing text lines
// to w.
func Logger(level int, w io.Writer) (*slog.Logger, error) { return LoggerEnv(level, w, nil) }

// LoggerEnv returns the logger for a te_config_t.log_level, writing to w in
// te's log style (internal/tlog): TE_LOG_LEVEL (read through getenv) sets
// the level when log_level is TE_LOG_DEFAULT, TE_LOG_FORMAT=json makes the
// lines JSON. The default level is warn: libte lives in someone else's
// process.
func LoggerEnv(level int, w io.Writer, getenv func(string) string) (*slog.Logger, error) {
	o := tlog.Options{Level: slog.LevelWarn}
	switch level {
	case LogDefault, LogWarn:
	case LogDebug:
		o.Level = slog.LevelDebug
	case LogInfo:
		o.Level = slog.LevelInfo
	case LogError:
		o.Level = slog.LevelError
	case LogOff:
		o.Off = true
	default:
		return nil, errs.New(errs.InvalidArgument, "create", "log_level %d outside 0..5", level)
	}
	env, _, err := tlog.FromEnv(getenv, o)
	if err != nil {
		return nil, err
	}
	if level == LogDefault {
		o = env
	} else {
		o.JSON = env.JSON
	}
	return tlog.New(w, o), nil
}
