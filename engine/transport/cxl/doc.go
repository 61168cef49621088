// Package cxl is the transport over shared CXL memory: every engine maps the
// same DAX device (TE_CXL_DEVICE, or Mooncake's MC_CXL_DEV_PATH), buffers
// allocated from the mapping (Engine.CXLMemory, te_cxl_memory) are
// registered, and a transfer is a memcpy between local memory and this
// process's view of the peer's buffer.
//
// # The device
//
// The size mapped is TE_CXL_SIZE (or MC_CXL_DEV_SIZE), else for a DAX
// character device /sys/bus/dax/devices/daxX.Y/size (TE_SYSFS_ROOT replaces
// /sys), else for a regular file its size: a file in /dev/shm stands in for
// the device in tests and on machines without one. Engines of one process
// that name one device share one mapping, unmapped when the last closes.
// Engine params "cxl.device", "cxl.size" and "cxl.id" override the
// environment.
//
// # Descriptors and reach
//
// An engine publishes Mooncake's cxl_name (the path) and cxl_base_addr
// (where it mapped the device), and for each buffer inside the mapping its
// offset in the device; te adds the device's identity (te_cxl_id: boot,
// device and inode for a file; name and size for a DAX device; TE_CXL_ID
// where hosts sharing a pooled device name it differently) and size. Only
// engines with the same identity reach each other over cxl, and only for
// buffers inside the owner's mapping (transport.BufferReacher): the owner's
// address less its base is the offset, and that offset from our base is the
// same memory. A Mooncake descriptor's buffers, published by offset alone,
// are given the owner's address (base + offset) when decoded.
//
// Registration accepts only host memory inside the mapping; another range
// is refused with NotSupported ("outside the CXL mapping"), and the engine
// keeps it registered with its other transports, which serve it. With cxl
// alone the registration fails.
//
// # Fences and ordering
//
// A peer writes into the owner's memory without the owner seeing each
// access, exactly as shm's process_vm_writev does, so cxl runs shm's
// protocol (sessions, validation of every key before its first use,
// revocation on Unregister and window revoke, leases; see package shm),
// its messages as wire.KindCXL calls, and only the copy differs. The lease
// and Close are checked before every 4 MiB of a copy.
//
// The ordering a shared memory needs: a WRITE's stores are made visible
// before its completion is reported (a full barrier, an atomic
// read-modify-write, follows the copies of every job and precedes the
// completion; Go's memmove ends its non-temporal stores with SFENCE), so a
// peer told of the completion (a notify sent after the batch completed, a
// reply over a socket, both after the barrier) reads the new bytes. A READ
// starts after the request was submitted, so it sees every store the owner
// made before telling the initiator to read. te assumes a coherent mapping
// (one host, or CXL 3 shared memory with hardware coherence) as Mooncake
// does; it does not flush caches for a pooled device without coherence.
//
// # Mooncake peers
//
// Descriptor fields are read and written as Mooncake names them. A Mooncake
// engine runs none of te's protocol, so te reaches a Mooncake owner over
// tcp, not cxl (it cannot be told to stop before memory goes away).
package cxl
