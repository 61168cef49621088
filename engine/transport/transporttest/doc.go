// Package transporttest is the conformance suite every transport passes: sizes
// from 1 B to 64 MiB at unaligned addresses checked byte for byte, hundreds of
// concurrent batches, requests refused before anything moves, stale
// descriptors refused by the memory owner, a peer that vanishes mid-batch,
// cancellation, timeouts and unregistration as fences, windows, and the fence
// torture. The target runs in this process or in a child process (the test
// binary re-executed; call Main from TestMain), its buffer in host memory or,
// for a transport that moves device memory, in GPU memory (Setup.GPU).
//
// The fence torture (Run's "Torture" case) drives random interleavings of
// Submit, Cancel, Wait, TaskStatus, Reset, Free, resubmission,
// UnregisterMemory on both sides, GrantWindow/RevokeWindow and Close from
// several goroutines, and fences memory the moment te says nothing touches it:
// mprotect(PROT_NONE), so that a late copy in this process faults and a late
// system call fails, or a canary checked before the memory is used again. It
// runs for -torture.time (TE_TORTURE_TIME; 2 s by default, what make test
// spends per transport) with the seed -torture.seed (TE_TORTURE_SEED; the
// clock by default), which it logs:
//
//	go test -race -run 'Conformance/Torture|suite/Torture' ./engine/transport/shm -torture.time=1m
//	TE_TORTURE_TIME=5m TE_TORTURE_SEED=42 go test -race -p 1 -run 'Conformance/Torture|suite/Torture' ./engine/transport/...
package transporttest
