// Package proc stops and continues processes for tests that play a hung
// peer. kill(SIGSTOP) only queues the signal; a thread already running can
// serve one more request before it stops, which on a busy machine is enough
// to complete a transfer a test expects to stall. Stop returns only once
// every thread of the process is stopped.
package proc

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tecache/te/internal/errs"
)

// Stop sends SIGSTOP to pid and waits, at most timeout, until every thread of
// it is in the stopped state.
func Stop(pid int, timeout time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return errs.Wrap(errs.InvalidArgument, "stop", err, "process %d", pid)
	}
	deadline := time.Now().Add(timeout)
	for !Stopped(pid) {
		if time.Now().After(deadline) {
			return errs.New(errs.Timeout, "stop", "process %d not stopped after %v", pid, timeout)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// Continue sends SIGCONT to pid.
func Continue(pid int) error { return syscall.Kill(pid, syscall.SIGCONT) }

// Stopped reports whether every thread of pid is stopped (state T or t in
// /proc/PID/task/TID/stat); false if pid does not exist.
func Stopped(pid int) bool {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		// The state follows the parenthesised command name.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
			return false
		}
	}
	return true
}
