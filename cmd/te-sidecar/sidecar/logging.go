package sidecar

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// NewLogger returns te-sidecar's logger: log/slog's text format ("text")
// or JSON ("json") at level, to w. Durations are written as durations
// ("1.5s"), not as nanosecond integers, in both.
func NewLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			a.Value = slog.StringValue(a.Value.Duration().String())
		}
		return a
	}}
	switch strings.ToLower(format) {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q is not text or json", format)
}

// refusalLog writes one info line per refused request (401, 403, 413, 429,
// 503, and connections refused for want of a slot) with its route, source
// and reason, at most rate lines a second (bursts of 5x): a flood of
// refusals cannot fill the disk. Lines left out are counted, and the next
// line says how many.
type refusalLog struct {
	l          *slog.Logger
	lim        *rate.Limiter
	suppressed atomic.Int64
	count      Counter
}

func newRefusalLog(log *slog.Logger, perSecond float64, suppressed Counter) *refusalLog {
	return &refusalLog{l: log, lim: rate.NewLimiter(rate.Limit(perSecond), max(1, int(5*perSecond))), count: suppressed}
}

func (r *refusalLog) note(route, method, source string, status int, reason string) {
	if !r.lim.AllowN(time.Now(), 1) {
		r.suppressed.Add(1)
		r.count.Inc()
		return
	}
	attrs := []any{"status", status, "route", route, "method", method, "source", source, "reason", reason}
	if n := r.suppressed.Swap(0); n > 0 {
		attrs = append(attrs, "suppressed_before", n)
	}
	r.l.Info("request refused", attrs...)
}
