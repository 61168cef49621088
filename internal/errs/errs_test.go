package errs

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestIsAndCodeOf(t *testing.T) {
	e := Wrap(Timeout, "wait", io.EOF, "batch %d", 3).WithHint("raise the timeout")
	if !errors.Is(e, ErrTimeout) || errors.Is(e, ErrClosed) {
		t.Fatal("Is does not match by code")
	}
	if !errors.Is(e, io.EOF) {
		t.Fatal("Unwrap lost the cause")
	}
	wrapped := fmt.Errorf("outer: %w", e)
	if CodeOf(wrapped) != Timeout || CodeOf(nil) != OK || CodeOf(io.EOF) != Internal {
		t.Fatal("CodeOf")
	}
	if s := e.Error(); s != "wait: timeout: batch 3: EOF (raise the timeout)" {
		t.Fatalf("message %q", s)
	}
	// A specific error is not a sentinel for another specific error.
	if errors.Is(e, New(Timeout, "other", "x")) {
		t.Fatal("two specific errors matched")
	}
}

func TestEveryCodeNamed(t *testing.T) {
	for c := OK; c <= NoSpace; c++ {
		if strings.HasPrefix(c.String(), "code(") {
			t.Errorf("code %d has no name", c)
		}
	}
	if Code(999).String() != "code(999)" {
		t.Fatal("unknown code")
	}
}

// TestValuesDoNotChange: WithHint copies, so an error value shared by many
// callers (a sentinel's match, a cached refusal) never shows another
// caller's hint; sentinels are constants and match by code alone.
func TestValuesDoNotChange(t *testing.T) {
	base := New(PeerUnreachable, "dial", "peer %s", "a")
	hinted := base.WithHint("check the firewall")
	if base.Hint != "" || hinted.Hint != "check the firewall" || hinted == base {
		t.Fatalf("WithHint changed its receiver: %q / %q", base.Hint, hinted.Hint)
	}
	const s = ErrPeerUnreachable // compiles only because sentinels are constants
	if !errors.Is(hinted, s) || !errors.Is(fmt.Errorf("x: %w", base), s) || CodeOf(s) != PeerUnreachable || s.Code() != PeerUnreachable {
		t.Fatal("sentinel does not match its code")
	}
	if errors.Is(base, ErrTimeout) || s.Error() != "peer unreachable" {
		t.Fatalf("sentinel %q", s.Error())
	}
}

// TestNoRepeatedPrefixes: a chain of wraps with one code says the code once,
// and an op its cause shares once.
func TestNoRepeatedPrefixes(t *testing.T) {
	inner := New(InvalidArgument, "secret", "the secret is 5 bytes").WithHint("generate one")
	mid := Wrap(InvalidArgument, "secret", inner, "from TE_AUTH_SECRET")
	top := Wrap(InvalidArgument, "auth", mid, "")
	want := "auth: invalid argument: secret: from TE_AUTH_SECRET: the secret is 5 bytes (generate one)"
	if got := top.Error(); got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	// Another code is said: it is news.
	other := Wrap(TransportUnavailable, "new", New(InvalidArgument, "tcp", "parameter tcp.conns=\"x\""), "transport tcp")
	if got := other.Error(); got != `new: transport unavailable: transport tcp: tcp: invalid argument: parameter tcp.conns="x"` {
		t.Fatalf("got %q", got)
	}
	if got := Wrap(Timeout, "wait", io.EOF, "").Error(); got != "wait: timeout: EOF" {
		t.Fatalf("got %q", got)
	}
}
