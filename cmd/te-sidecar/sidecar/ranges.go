package sidecar

import (
	"fmt"
	"time"
)

// Header timeout range: under 100 ms no client gets its request line and
// headers in (every request would be 408); over 10 minutes a connection
// that never authenticates holds its slot for nothing.
const (
	minHeaderTimeout = 100 * time.Millisecond
	maxHeaderTimeout = 10 * time.Minute
)

// checkRanges refuses values that parse but cannot work, naming the flag,
// its variable and the range.
func checkRanges(o Options) error {
	if d := o.HeaderTimeout; d < minHeaderTimeout || d > maxHeaderTimeout {
		return fmt.Errorf("-header-timeout (TE_SIDECAR_HEADER_TIMEOUT) = %v is out of range: want %v to %v", d, minHeaderTimeout, maxHeaderTimeout)
	}
	return nil
}
