// Package uring is a minimal io_uring binding over raw system calls: ring
// setup and mapping, read/write (plain and on registered buffers), poll,
// cancel and no-op submissions, buffer registration, and the completion queue.
//
// Why raw system calls rather than a module: the kernel interface is three
// system calls (io_uring_setup, io_uring_enter, io_uring_register) and two
// shared rings, all reachable through golang.org/x/sys/unix, which te already
// depends on. The Go io_uring modules either wrap liburing with cgo (libte
// must build and load without a C toolchain on the target) or are ports of
// liburing that have been unmaintained for years and cover networking we do
// not use. te needs about a dozen operations, and keeping them here lets the
// struct layouts be checked against the kernel header (layout_test.go reads
// linux/io_uring.h with the C compiler) instead of trusting a third party's.
//
// A Ring is not safe for concurrent use: one goroutine (with its OS thread
// locked, so the ring can be set up single-issuer) submits and reaps. Every
// address put into a submission must be memory the Go collector does not own
// (mmap or C memory): the kernel reads and writes it after Submit returns.
//
// io_uring can be absent or switched off (kernel.io_uring_disabled, seccomp
// filters in containers): Setup then returns an error whose code is
// errs.NotSupported, and Disabled says why without creating a ring.
package uring
