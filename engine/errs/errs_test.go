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
