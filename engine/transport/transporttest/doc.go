// Package transporttest is the conformance suite every transport passes: sizes
// from 1 B to 64 MiB at unaligned addresses checked byte for byte, hundreds of
// concurrent batches, requests refused before anything moves, stale
// descriptors refused by the memory owner, and a peer that vanishes
// mid-batch. The target runs in this process or in a child process (the test
// binary re-executed; call Main from TestMain).
package transporttest
