// Package layouttest checks Go mirrors of C structures and constants against
// the C compiler: the tests of packages that hand Go memory to C through
// purego or system calls (ibv, uring, fabric, hip) list what their Go types claim, and
// Check compiles a program against the real header that prints what C says,
// and compares. A golden file of the same output, written on amd64, keeps
// the comparison on machines without the compiler or the header.
package layouttest
