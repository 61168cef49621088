package sidecar_test

import (
	"io"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
)

// TestHeaderTimeoutRange: a header timeout no client can meet (1ns: every
// request 408) or one of hours is refused, naming the flag, the variable
// and the range.
func TestHeaderTimeoutRange(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
	}{
		{nil, map[string]string{"TE_SIDECAR_HEADER_TIMEOUT": "1ns"}},
		{[]string{"-header-timeout", "50ms"}, nil},
		{[]string{"-header-timeout", "3h"}, nil},
	} {
		_, err := sidecar.ParseOptions(c.args, func(k string) string { return c.env[k] }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "TE_SIDECAR_HEADER_TIMEOUT") || !strings.Contains(err.Error(), "-header-timeout") ||
			!strings.Contains(err.Error(), "100ms to 10m0s") {
			t.Errorf("%v %v: %v, want a refusal naming -header-timeout, its variable and the range", c.args, c.env, err)
		}
	}
	if o, err := sidecar.ParseOptions([]string{"-header-timeout", "100ms"}, func(string) string { return "" }, io.Discard); err != nil ||
		o.HeaderTimeout != 100*time.Millisecond {
		t.Fatalf("100ms refused: %v", err)
	}
}

// TestSecretFileFIFO: TE_AUTH_SECRET_FILE naming a FIFO nobody writes is
// refused at once; it used to block the start (which then ignored SIGTERM).
func TestSecretFileFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "secret")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"TE_AUTH_SECRET_FILE": fifo}
	done := make(chan error, 1)
	go func() {
		_, err := sidecar.ParseOptions(nil, func(k string) string { return env[k] }, io.Discard)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("%v, want a refusal saying the secret file is not a regular file", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("te-sidecar's start blocked on a FIFO secret file")
	}
}
