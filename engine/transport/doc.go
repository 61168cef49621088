// Package transport defines the interface every data path implements (local
// memcpy, same-host shm, tcp, rdma, cudaipc) and the registry of available
// ones.
//
// The engine validates each request before a transport sees it (local range
// registered, target range inside one buffer of the peer's descriptor);
// transports that write into a peer's memory must still have the owner check
// the access, since a descriptor can be stale.
//
// A request's slot belongs to the engine and is reused as soon as the
// request is complete: a transport reaches a request only through state of
// its own, claimed before use, and completes it through the Ticket it kept
// from Submit (see Request). Every transport runs the conformance suite and
// the fence torture in package transporttest.
package transport
