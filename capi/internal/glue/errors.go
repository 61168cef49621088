package glue

import (
	"fmt"

	"github.com/tecache/te/internal/errs"
)

// Code returns the value a C function returns for err: 0 for nil, else the
// negated stable code (Internal for an error that is not a te error).
func Code(err error) int32 {
	return -int32(errs.CodeOf(err))
}

// FromPanic turns a recovered panic value into an Internal error, so a bug
// behind the C ABI becomes an error code instead of killing the host process.
func FromPanic(op string, v any) error {
	return errs.New(errs.Internal, op, "panic: %v", fmt.Sprint(v))
}
