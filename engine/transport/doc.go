// Package transport defines the interface every data path implements (local
// memcpy, same-host shm, tcp, rdma, cuda) and the registry of available ones.
//
// The engine validates each request before a transport sees it (local range
// registered, target range inside one buffer of the peer's descriptor);
// transports that write into a peer's memory must still have the owner check
// the access, since a descriptor can be stale. Every transport runs the
// conformance suite in package transporttest.
package transport
