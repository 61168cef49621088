package capihelp

import (
	"sync"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// maxThreads bounds the error store: threads that failed once and then went
// away leave an entry behind, so past this many the store is emptied of
// other threads' entries rather than growing with every thread ever seen.
const maxThreads = 1 << 14

// maxMessage bounds one stored message.
const maxMessage = 4096

// Errors keeps the last error message per OS thread. A cgo call from C runs
// on the calling C thread for its whole duration, so the kernel thread id at
// the export's entry identifies the caller for te_last_error.
type Errors struct {
	mu sync.Mutex
	m  map[int]string
}

// NewErrors returns an empty store.
func NewErrors() *Errors { return &Errors{m: map[int]string{}} }

// Tid returns the calling OS thread's id.
func Tid() int { return unix.Gettid() }

// Set stores msg as thread tid's last error.
func (s *Errors) Set(tid int, msg string) {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[tid]; !ok && len(s.m) >= maxThreads {
		clear(s.m)
	}
	s.m[tid] = msg
}

// Get returns thread tid's last error ("" if none).
func (s *Errors) Get(tid int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[tid]
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
