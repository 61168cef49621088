package sigkeep

import (
	"sync"
	"syscall"
	"unsafe"
)

// action is the kernel's struct sigaction, kept as opaque words: it is only
// read back and rewritten, never interpreted, so its field order does not
// matter. 32 bytes on amd64 and arm64 (handler, flags, restorer, 64-bit
// mask); the spare words absorb any larger layout.
type action [8]uint64

// maskSize is the sigsetsize argument rt_sigaction requires: the kernel's
// 64-signal set.
const maskSize = 8

// kept are the signals Around guards: those of faults, which libraries
// take over for crash reports. Signals a program subscribes to at run time
// (os/signal's SIGINT, SIGTERM, ...) are left out, so a subscription made by
// another goroutine during fn is not undone.
var kept = [...]syscall.Signal{syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGILL, syscall.SIGFPE, syscall.SIGABRT, syscall.SIGTRAP, syscall.SIGSYS}

// mu serializes Around: two calls interleaving would restore each other's
// snapshots.
var mu sync.Mutex

func get(sig int, a *action) bool {
	_, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), 0, uintptr(unsafe.Pointer(a)), maskSize, 0, 0)
	return e == 0
}

func set(sig int, a *action) bool {
	_, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(a)), 0, maskSize, 0, 0)
	return e == 0
}

// Around calls fn and then restores the disposition of every signal fn
// changed. It returns the signals it restored (none when fn left them
// alone), for the caller to log.
func Around(fn func()) []syscall.Signal {
	mu.Lock()
	defer mu.Unlock()
	var before [len(kept)]action
	var have [len(kept)]bool
	for i, sig := range kept {
		have[i] = get(int(sig), &before[i])
	}
	fn()
	var restored []syscall.Signal
	for i, sig := range kept {
		var now action
		if !have[i] || !get(int(sig), &now) || now == before[i] {
			continue
		}
		if set(int(sig), &before[i]) {
			restored = append(restored, sig)
		}
	}
	return restored
}
