package glue

import "unicode/utf8"

// CutMessage returns s cut to at most max bytes at a character boundary, so
// that a stored error message stays valid UTF-8. The C ABI keeps each
// thread's last message in C thread-local storage of a fixed size.
func CutMessage(s string, max int) string {
	if len(s) <= max {
		return s
	}
	n := max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// CopyString copies s into dst as a NUL-terminated string and reports
// whether it had to be cut. dst must have room for at least the NUL.
func CopyString(dst []byte, s string) (truncated bool) {
	if len(dst) == 0 {
		return len(s) > 0
	}
	n := len(dst) - 1
	if n >= len(s) {
		n = len(s)
	} else {
		// Cut at a character boundary so the result stays valid UTF-8.
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
	}
	copy(dst, s[:n])
	dst[n] = 0
	return n < len(s)
}
