// Package testexec starts programs built for the architecture of the running
// test binary: another copy of the test binary (a peer process), or a C
// program a test compiled with $CC. Natively that is a plain exec. When the
// test suites run arm64 binaries on an x86-64 machine under qemu-user
// (make test-arm64), it is not: qemu-user does not follow execve into a
// foreign binary, and without a binfmt_misc entry for it the kernel refuses
// one with ENOEXEC. The suite then names the emulator in TE_TEST_EXEC
// (qemu-aarch64-static, with QEMU_LD_PREFIX for the libraries) and Command
// runs the program under it. The child is one process either way: qemu-user
// runs the guest in its own process, so its pid and signals are the
// program's.
package testexec
