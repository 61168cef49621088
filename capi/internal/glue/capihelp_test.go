package glue

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tecache/te/internal/errs"
)

func TestTableHandles(t *testing.T) {
	engines := NewTable[string](KindEngine)
	batches := NewTable[string](KindBatch)
	a := engines.Put(0, "a")
	b := engines.Put(0, "b")
	if a == 0 || b == 0 || a == b {
		t.Fatalf("handles %#x %#x", a, b)
	}
	if KindOf(a) != KindEngine {
		t.Fatalf("kind of %#x is %v", a, KindOf(a))
	}
	if v, _, err := engines.Get("get", a); err != nil || v != "a" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	for _, tc := range []struct {
		h    uint64
		want string
	}{
		{0, "handle is 0"},
		{a, "is an engine handle, not a batch handle"},
		{uint64(99)<<56 | 1, "is a handle of unknown kind, not a batch handle"},
		{uint64(KindBatch)<<56 | 12345, "not open"},
	} {
		_, _, err := batches.Get("get", tc.h)
		if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Get(%#x) = %v, want invalid argument with %q", tc.h, err, tc.want)
		}
	}
	if _, err := engines.Delete("del", a); err != nil {
		t.Fatal(err)
	}
	if _, err := engines.Delete("del", a); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("second Delete = %v", err)
	}
	// Handles are not reused: a stale handle never names a new object.
	c := engines.Put(0, "c")
	if c == a {
		t.Fatal("handle reused")
	}
}

func TestTableDropOwnerAndDeleteIf(t *testing.T) {
	segs := NewTable[int](KindSegment)
	h1 := segs.Put(7, 1)
	segs.Put(7, 2)
	h3 := segs.Put(8, 3)
	if got := segs.DropOwner(7); len(got) != 2 {
		t.Fatalf("DropOwner = %v", got)
	}
	if _, _, err := segs.Get("get", h1); err == nil {
		t.Fatal("dropped handle still valid")
	}
	busy := errs.New(errs.BatchBusy, "free", "busy")
	if err := segs.DeleteIf("free", h3, func(int) error { return busy }); err != busy {
		t.Fatalf("DeleteIf = %v", err)
	}
	if segs.Len() != 1 {
		t.Fatal("refused DeleteIf removed the handle")
	}
	if err := segs.DeleteIf("free", h3, func(int) error { return nil }); err != nil || segs.Len() != 0 {
		t.Fatalf("DeleteIf = %v, len %d", err, segs.Len())
	}
	if err := segs.DeleteIf("free", h3, func(int) error { return nil }); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("DeleteIf on a freed handle = %v", err)
	}
}

func TestTableConcurrent(t *testing.T) {
	tb := NewTable[int](KindBatch)
	var wg sync.WaitGroup
	seen := sync.Map{}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				h := tb.Put(1, i)
				if _, dup := seen.LoadOrStore(h, true); dup {
					t.Errorf("handle %#x issued twice", h)
				}
				if v, _, err := tb.Get("get", h); err != nil || v != i {
					t.Errorf("Get = %d, %v", v, err)
				}
				if i%2 == 0 {
					tb.Delete("del", h)
				}
			}
		}()
	}
	wg.Wait()
	if tb.Len() != 8*250 {
		t.Fatalf("Len = %d", tb.Len())
	}
}

func TestCutMessage(t *testing.T) {
	if got := CutMessage("short", 10); got != "short" {
		t.Fatalf("short: %q", got)
	}
	long := strings.Repeat("x", 3*4096)
	if got := CutMessage(long, 4095); len(got) != 4095 {
		t.Fatalf("not bounded: %d", len(got))
	}
	// Never cuts inside a UTF-8 character.
	if got := CutMessage("ab€€", 4); got != "ab" || !utf8.ValidString(got) {
		t.Fatalf("cut to %q", got)
	}
	if got := CutMessage("€", 0); got != "" {
		t.Fatalf("max 0: %q", got)
	}
}

func TestCopyString(t *testing.T) {
	buf := make([]byte, 8)
	if CopyString(buf, "abc") || string(buf[:4]) != "abc\x00" {
		t.Fatalf("short: %q", buf)
	}
	if !CopyString(buf, "abcdefghij") || string(buf) != "abcdefg\x00" {
		t.Fatalf("long: %q", buf)
	}
	if CopyString(buf, "abcdefg") || string(buf) != "abcdefg\x00" {
		t.Fatalf("exact: %q", buf)
	}
	// Never cuts inside a UTF-8 character.
	buf = make([]byte, 5)
	if !CopyString(buf, "ab€€") {
		t.Fatal("not reported as cut")
	}
	s := string(buf[:bytes.IndexByte(buf, 0)])
	if s != "ab" || !utf8.ValidString(s) {
		t.Fatalf("cut to %q", s)
	}
	if !CopyString(nil, "x") || CopyString(nil, "") {
		t.Fatal("empty destination")
	}
}

func TestParseParams(t *testing.T) {
	m, err := ParseParams(" tcp.conns=4, tcp.slice = 512KiB;\nx=\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 3 || m["tcp.conns"] != "4" || m["tcp.slice"] != "512KiB" || m["x"] != "" {
		t.Fatalf("%v", m)
	}
	if m, err := ParseParams(" ,; "); err != nil || m != nil {
		t.Fatalf("blank: %v %v", m, err)
	}
	for _, bad := range []string{"novalue", "=v", "a=1,b"} {
		if _, err := ParseParams(bad); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("ParseParams(%q) = %v", bad, err)
		}
	}
}

func TestEngineConfig(t *testing.T) {
	ec, err := Config{
		Transports: " local , tcp,", ForceTransport: " TCP ", Params: "a=b",
		TransferTimeoutMS: -1, RPCTimeoutMS: 1500, MaxNotifies: 10, LogLevel: LogOff,
	}.EngineConfig()
	if err != nil {
		t.Fatal(err)
	}
	if len(ec.Transports) != 2 || ec.Transports[1] != "tcp" || ec.ForceTransport != "tcp" || ec.Params["a"] != "b" {
		t.Fatalf("%+v", ec)
	}
	if ec.TransferTimeout >= 0 || ec.RPCTimeout != 1500*time.Millisecond || ec.MaxNotifies != 10 || ec.Logger == nil {
		t.Fatalf("%+v", ec)
	}
	ec, err = Config{TransferTimeoutMS: 250}.EngineConfig()
	if err != nil || ec.TransferTimeout != 250*time.Millisecond || ec.RPCTimeout != 0 {
		t.Fatalf("%+v %v", ec, err)
	}
	for _, c := range []Config{{LogLevel: 9}, {LogLevel: -1}, {Params: "x"}, {MaxNotifies: 1 << 40}} {
		if _, err := c.EngineConfig(); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	l, err := Logger(LogDefault, &buf)
	if err != nil {
		t.Fatal(err)
	}
	l.Info("quiet")
	l.Warn("loud")
	if strings.Contains(buf.String(), "quiet") || !strings.Contains(buf.String(), "loud") {
		t.Fatalf("default level wrote %q", buf.String())
	}
	buf.Reset()
	l, _ = Logger(LogOff, &buf)
	l.Error("nothing")
	if buf.Len() != 0 {
		t.Fatalf("off wrote %q", buf.String())
	}
}

func TestCode(t *testing.T) {
	if Code(nil) != 0 || Code(errs.New(errs.Timeout, "x", "y")) != -int32(errs.Timeout) ||
		Code(errors.New("plain")) != -int32(errs.Internal) {
		t.Fatal("codes")
	}
	err := FromPanic("submit", "boom")
	if !errors.Is(err, errs.ErrInternal) || !strings.Contains(err.Error(), "boom") {
		t.Fatal(err)
	}
}

func TestLoggerEnv(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	var buf bytes.Buffer
	l, err := LoggerEnv(LogDefault, &buf, env(map[string]string{"TE_LOG_LEVEL": "debug", "TE_LOG_FORMAT": "json"}))
	if err != nil {
		t.Fatal(err)
	}
	l.Debug("shown", "elapsed", 1500*time.Millisecond)
	if !strings.Contains(buf.String(), `"msg":"shown"`) || !strings.Contains(buf.String(), `"elapsed":"1.5s"`) {
		t.Fatalf("env level/format not applied: %q", buf.String())
	}
	// An explicit log_level wins over TE_LOG_LEVEL; the format still applies.
	buf.Reset()
	l, _ = LoggerEnv(LogError, &buf, env(map[string]string{"TE_LOG_LEVEL": "debug", "TE_LOG_FORMAT": "json"}))
	l.Warn("hidden")
	l.Error("shown")
	if strings.Contains(buf.String(), "hidden") || !strings.HasPrefix(buf.String(), "{") {
		t.Fatalf("explicit level: %q", buf.String())
	}
	for _, bad := range []map[string]string{{"TE_LOG_LEVEL": "chatty"}, {"TE_LOG_FORMAT": "yaml"}} {
		if _, err := LoggerEnv(LogDefault, &buf, env(bad)); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%v: %v", bad, err)
		}
	}
}
