// Package std installs te's standard transports (local, file, shm, tcp,
// rdma, cudaipc) and metadata stores (etcd://, http://, redis://) in an engine
// built by this program. Import it for its side effects:
//
//	import _ "github.com/tecache/te/engine/std"
//
// Package engine names none of them: each transport and store registers
// itself from its own package, and this one imports them all, so that a
// program that wants fewer (a tool with tcp alone, a build without etcd's
// client) imports the ones it needs instead. libte.so, te-bench and te-demo
// import std.
package std
