package tlog

import (
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/tecache/te/internal/errs"
)

// The environment variables that set the level and the format.
const (
	EnvLevel  = "TE_LOG_LEVEL"
	EnvFormat = "TE_LOG_FORMAT"
)

// Options are a logger's level and format.
type Options struct {
	Level slog.Level
	Off   bool // log nothing
	JSON  bool // JSON lines instead of text
}

// ParseLevel parses debug, info, warn (warning), error or off.
func ParseLevel(s string) (level slog.Level, off bool, ok bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		return slog.LevelDebug, false, true
	case "info":
		return slog.LevelInfo, false, true
	case "warn", "warning":
		return slog.LevelWarn, false, true
	case "error":
		return slog.LevelError, false, true
	case "off", "none":
		return 0, true, true
	}
	return 0, false, false
}

// ParseFormat parses text or json.
func ParseFormat(s string) (json bool, ok bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "text":
		return false, true
	case "json":
		return true, true
	}
	return false, false
}

// FromEnv returns def with the level and format the environment sets
// (getenv nil reads none), and whether it set either. A value it does not
// know is an InvalidArgument error naming the variable.
func FromEnv(getenv func(string) string, def Options) (Options, bool, error) {
	o, set := def, false
	if getenv == nil {
		return o, false, nil
	}
	if v := getenv(EnvLevel); v != "" {
		l, off, ok := ParseLevel(v)
		if !ok {
			return def, false, errs.New(errs.InvalidArgument, "log", "%s=%q: want debug, info, warn, error or off", EnvLevel, v)
		}
		o.Level, o.Off, set = l, off, true
	}
	if v := getenv(EnvFormat); v != "" {
		j, ok := ParseFormat(v)
		if !ok {
			return def, false, errs.New(errs.InvalidArgument, "log", "%s=%q: want text or json", EnvFormat, v)
		}
		o.JSON, set = j, true
	}
	return o, set, nil
}

// New returns a logger writing to w as o says.
func New(w io.Writer, o Options) *slog.Logger {
	if o.Off {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(Handler(w, o))
}

// Handler returns the slog handler of New.
func Handler(w io.Writer, o Options) slog.Handler {
	ho := &slog.HandlerOptions{Level: o.Level, ReplaceAttr: durations}
	if o.JSON {
		return slog.NewJSONHandler(w, ho)
	}
	return slog.NewTextHandler(w, ho)
}

// durations writes time.Duration values as "1.5s" rather than a count of
// nanoseconds (JSONHandler's choice); the text handler already does.
func durations(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// Since is a duration attribute for "elapsed" fields, rounded to the
// microsecond so lines stay short.
func Since(key string, t time.Time) slog.Attr {
	return slog.Duration(key, time.Since(t).Round(time.Microsecond))
}
