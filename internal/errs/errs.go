// Package errs holds te's error codes and the error type every layer returns.
//
// The codes are stable: the C ABI returns them negated, the Python binding maps
// them to exception classes, and they travel on the wire in completion frames.
// They live in their own package so transports and the engine share them
// without an import cycle; package engine re-exports them.
package errs

import (
	"errors"
	"fmt"
	"strings"
)

// Code is a stable error code. The C ABI returns -Code.
type Code int32

// Stable codes. Never renumber: they are part of the C ABI and the wire format.
const (
	OK                   Code = 0
	InvalidArgument      Code = 1
	AddressNotRegistered Code = 2
	AddressOverlapped    Code = 3
	BatchBusy            Code = 4
	SegmentNotFound      Code = 5
	TransportUnavailable Code = 6
	PeerUnreachable      Code = 7
	Timeout              Code = 8
	Metadata             Code = 9
	NotSupported         Code = 10
	Closed               Code = 11
	StaleDescriptor      Code = 12
	AccessDenied         Code = 13
	TooLarge             Code = 14
	Protocol             Code = 15
	Canceled             Code = 16
	NoMemory             Code = 17
	Internal             Code = 18
	NotFound             Code = 19
	BufferTooSmall       Code = 20
	// TransferLost means a handoff transfer is gone from the sidecar that
	// held it (it restarted or no longer knows the id): release the blocks
	// and retry or fail the request rather than wait.
	TransferLost Code = 21
	// Unauthenticated means a peer did not prove it holds the cluster
	// secret (or this side could not prove it to the peer): the message
	// says which side refused. Nothing was learned or touched.
	Unauthenticated Code = 22
	// Forked means the call came from a child process forked after the
	// library was initialized in its parent; the Go runtime cannot run
	// there, so every entry point refuses at once.
	Forked Code = 23
	// ResourceExhausted means a bound on what a peer may make te hold
	// (connections, calls in flight, notification bytes, declarations)
	// was reached; the refusal is for this peer, the others carry on.
	ResourceExhausted Code = 24
	// IO means storage failed a read or write (EIO, a file shorter than
	// its registration because it was truncated or removed): the task's
	// bytes are not (all) there; other tasks carry on.
	IO Code = 25
	// NoSpace means the storage is full (ENOSPC, EDQUOT, or the file size
	// limit: EFBIG): nothing but the task that hit it failed.
	NoSpace Code = 26
)

var names = map[Code]string{
	OK:                   "ok",
	InvalidArgument:      "invalid argument",
	AddressNotRegistered: "address not registered",
	AddressOverlapped:    "address overlapped",
	BatchBusy:            "batch busy",
	SegmentNotFound:      "segment not found",
	TransportUnavailable: "transport unavailable",
	PeerUnreachable:      "peer unreachable",
	Timeout:              "timeout",
	Metadata:             "metadata error",
	NotSupported:         "not supported",
	Closed:               "engine closed",
	StaleDescriptor:      "stale descriptor",
	AccessDenied:         "access denied",
	TooLarge:             "too large",
	Protocol:             "protocol error",
	Canceled:             "canceled",
	NoMemory:             "out of memory",
	Internal:             "internal error",
	NotFound:             "not found",
	BufferTooSmall:       "buffer too small",
	TransferLost:         "transfer lost",
	Unauthenticated:      "unauthenticated",
	Forked:               "forked",
	ResourceExhausted:    "resource exhausted",
	IO:                   "i/o error",
	NoSpace:              "no space left",
}

// String names the code.
func (c Code) String() string {
	if s, ok := names[c]; ok {
		return s
	}
	return fmt.Sprintf("code(%d)", int32(c))
}

// Error is the error value of every te operation: a stable Code, the operation
// that failed, a message, an optional hint on what to do, and the cause.
type Error struct {
	Code Code
	Op   string
	Msg  string
	Hint string
	Err  error
}

// Error reads "op: code: message: cause (hint)". A cause that is itself an
// *Error with the same code or op does not say them again, so a chain of
// wraps reads "auth: invalid argument: secret: from TE_AUTH_SECRET: the
// secret is 5 bytes", not every layer's "invalid argument".
func (e *Error) Error() string {
	var b strings.Builder
	e.render(&b, "", 0, false)
	return b.String()
}

func (e *Error) render(b *strings.Builder, parentOp string, parentCode Code, nested bool) {
	sep := func() {
		if b.Len() > 0 {
			b.WriteString(": ")
		}
	}
	op := parentOp
	if e.Op != "" && (!nested || e.Op != parentOp) {
		sep()
		b.WriteString(e.Op)
		op = e.Op
	}
	if !nested || e.Code != parentCode {
		sep()
		b.WriteString(e.Code.String())
	}
	if e.Msg != "" {
		sep()
		b.WriteString(e.Msg)
	}
	if c, ok := e.Err.(*Error); ok && c != nil {
		c.render(b, op, e.Code, true)
	} else if e.Err != nil {
		sep()
		b.WriteString(e.Err.Error())
	}
	if e.Hint != "" {
		b.WriteString(" (" + e.Hint + ")")
	}
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is matches the Sentinel of e's code, so errors.Is(err, errs.ErrTimeout)
// works whatever the message, and an *Error that carries only a code.
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case Sentinel:
		return Code(t) == e.Code
	case *Error:
		return t.Code == e.Code && t.Msg == "" && t.Op == ""
	}
	return false
}

// Sentinel is the type of the Err* values: a code alone, for errors.Is. The
// values are constants, so no caller can change what they match.
type Sentinel Code

// Error names the code.
func (s Sentinel) Error() string { return Code(s).String() }

// Code returns the sentinel's code.
func (s Sentinel) Code() Code { return Code(s) }

// Sentinels for errors.Is.
const (
	ErrInvalidArgument      = Sentinel(InvalidArgument)
	ErrAddressNotRegistered = Sentinel(AddressNotRegistered)
	ErrAddressOverlapped    = Sentinel(AddressOverlapped)
	ErrBatchBusy            = Sentinel(BatchBusy)
	ErrSegmentNotFound      = Sentinel(SegmentNotFound)
	ErrTransportUnavailable = Sentinel(TransportUnavailable)
	ErrPeerUnreachable      = Sentinel(PeerUnreachable)
	ErrTimeout              = Sentinel(Timeout)
	ErrMetadata             = Sentinel(Metadata)
	ErrNotSupported         = Sentinel(NotSupported)
	ErrClosed               = Sentinel(Closed)
	ErrStaleDescriptor      = Sentinel(StaleDescriptor)
	ErrAccessDenied         = Sentinel(AccessDenied)
	ErrTooLarge             = Sentinel(TooLarge)
	ErrProtocol             = Sentinel(Protocol)
	ErrCanceled             = Sentinel(Canceled)
	ErrNoMemory             = Sentinel(NoMemory)
	ErrInternal             = Sentinel(Internal)
	ErrNotFound             = Sentinel(NotFound)
	ErrBufferTooSmall       = Sentinel(BufferTooSmall)
	ErrTransferLost         = Sentinel(TransferLost)
	ErrUnauthenticated      = Sentinel(Unauthenticated)
	ErrForked               = Sentinel(Forked)
	ErrResourceExhausted    = Sentinel(ResourceExhausted)
	ErrIO                   = Sentinel(IO)
	ErrNoSpace              = Sentinel(NoSpace)
)

// New builds an *Error.
func New(code Code, op, format string, args ...any) *Error {
	return &Error{Code: code, Op: op, Msg: fmt.Sprintf(format, args...)}
}

// Wrap builds an *Error around a cause.
func Wrap(code Code, op string, cause error, format string, args ...any) *Error {
	return &Error{Code: code, Op: op, Msg: fmt.Sprintf(format, args...), Err: cause}
}

// WithHint returns a copy of e with the hint h; e itself is unchanged, so a
// shared error value never gains another caller's hint.
func (e *Error) WithHint(h string) *Error {
	c := *e
	c.Hint = h
	return &c
}

// CodeOf returns the code carried by err: OK for nil, Internal for an error
// that is not a te error.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	var s Sentinel
	if errors.As(err, &s) {
		return Code(s)
	}
	return Internal
}
