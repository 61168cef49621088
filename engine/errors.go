package engine

import "github.com/tecache/te/internal/errs"

// Error is the error type of every engine operation; see package errs.
type Error = errs.Error

// Code is a stable error code; the C ABI returns it negated.
type Code = errs.Code

// Sentinel is the type of the Err* constants.
type Sentinel = errs.Sentinel

// Sentinel errors for errors.Is; every error the engine returns matches one.
// They are constants: nothing can change what they match.
const (
	ErrInvalidArgument      = errs.ErrInvalidArgument
	ErrAddressNotRegistered = errs.ErrAddressNotRegistered
	ErrAddressOverlapped    = errs.ErrAddressOverlapped
	ErrBatchBusy            = errs.ErrBatchBusy
	ErrSegmentNotFound      = errs.ErrSegmentNotFound
	ErrTransportUnavailable = errs.ErrTransportUnavailable
	ErrPeerUnreachable      = errs.ErrPeerUnreachable
	ErrTimeout              = errs.ErrTimeout
	ErrMetadata             = errs.ErrMetadata
	ErrNotSupported         = errs.ErrNotSupported
	ErrClosed               = errs.ErrClosed
	ErrStaleDescriptor      = errs.ErrStaleDescriptor
	ErrAccessDenied         = errs.ErrAccessDenied
	ErrTooLarge             = errs.ErrTooLarge
	ErrProtocol             = errs.ErrProtocol
	ErrCanceled             = errs.ErrCanceled
	ErrNotFound             = errs.ErrNotFound
	ErrUnauthenticated      = errs.ErrUnauthenticated
	ErrForked               = errs.ErrForked
	ErrResourceExhausted    = errs.ErrResourceExhausted
	ErrIO                   = errs.ErrIO
	ErrNoSpace              = errs.ErrNoSpace
)

// CodeOf returns the stable code of err (0 for nil).
func CodeOf(err error) Code { return errs.CodeOf(err) }
