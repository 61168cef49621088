package transport

import (
	"strconv"
	"strings"

	"github.com/tecache/te/internal/errs"
)

// ParseSize parses a byte count as transport parameters and environment
// variables write it: a plain number or one with a unit (B, KiB, MiB, GiB,
// or K, M, G and KB, MB, GB meaning the same powers of two), in any case,
// with or without a space before the unit.
func ParseSize(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	i := len(s)
	for i > 0 && (s[i-1] < '0' || s[i-1] > '9') {
		i--
	}
	n, err := strconv.ParseUint(s[:i], 10, 64)
	if err != nil {
		return 0, errs.New(errs.InvalidArgument, "size", "%q is not a size", s)
	}
	var shift uint
	switch strings.ToLower(strings.TrimSpace(s[i:])) {
	case "", "b":
	case "k", "kb", "kib":
		shift = 10
	case "m", "mb", "mib":
		shift = 20
	case "g", "gb", "gib":
		shift = 30
	default:
		return 0, errs.New(errs.InvalidArgument, "size", "%q has an unknown unit", s)
	}
	if n > (^uint64(0))>>shift {
		return 0, errs.New(errs.InvalidArgument, "size", "%q overflows", s)
	}
	return n << shift, nil
}
