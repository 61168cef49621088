package tlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/internal/errs"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFromEnv(t *testing.T) {
	def := Options{Level: slog.LevelWarn}
	o, set, err := FromEnv(env(nil), def)
	if err != nil || set || o != def {
		t.Fatalf("empty env: %+v %v %v", o, set, err)
	}
	o, set, err = FromEnv(env(map[string]string{EnvLevel: "DEBUG", EnvFormat: "json"}), def)
	if err != nil || !set || o.Level != slog.LevelDebug || !o.JSON || o.Off {
		t.Fatalf("debug json: %+v %v %v", o, set, err)
	}
	o, _, _ = FromEnv(env(map[string]string{EnvLevel: "off"}), def)
	if !o.Off {
		t.Fatal("off")
	}
	for k, v := range map[string]string{EnvLevel: "loud", EnvFormat: "xml"} {
		_, _, err := FromEnv(env(map[string]string{k: v}), def)
		if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), k+`="`+v+`"`) {
			t.Errorf("%s=%s: %v", k, v, err)
		}
	}
}

func TestDurationsAsDurations(t *testing.T) {
	var buf bytes.Buffer
	New(&buf, Options{Level: slog.LevelInfo, JSON: true}).Info("m", "elapsed", 1500*time.Millisecond)
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m["elapsed"] != "1.5s" {
		t.Fatalf("json duration %v", m["elapsed"])
	}
	buf.Reset()
	New(&buf, Options{Level: slog.LevelInfo}).Info("m", "elapsed", 2*time.Second)
	if !strings.Contains(buf.String(), "elapsed=2s") || !strings.HasPrefix(buf.String(), "time=") {
		t.Fatalf("text line %q", buf.String())
	}
	buf.Reset()
	New(&buf, Options{Off: true}).Error("x")
	l := New(&buf, Options{Level: slog.LevelWarn})
	l.Info("quiet")
	if buf.Len() != 0 {
		t.Fatalf("wrote %q", buf.String())
	}
}
