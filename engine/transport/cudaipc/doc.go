// Package cudaipc is te's same-host GPU transport, "cudaipc".
//
// It serves every GPU runtime te has through gpu.Driver (CUDA for cuda:N,
// HIP for hip:N); the name stays "cudaipc" for compatibility. An engine
// exports each remote-accessible GPU buffer it registers: the runtime's IPC
// handle of the allocation that holds it goes into the buffer's descriptor
// (BufferDesc.Extra: cuda_ipc, cuda_ipc_off, cuda_uuid; hip_ipc, ... for
// HIP memory, so a handle is only opened with the runtime that made it;
// memory of two runtimes never pairs). A peer
// engine on the same host (same boot id and pid namespace) opens each handle
// once, on first use, keeps the mapping in a cache, and copies device to
// device (or host to device) with the driver; the owner's CPU is not
// involved in the data path.
//
// Because the owner cannot check those copies, unregistering follows the
// design's rule for such transports: before the handle is opened the peer
// tells the owner (control kind wire.KindCUDA, op open); the owner's
// Unregister asks every peer that opened the buffer to close its mapping (op
// close) and returns only when each has confirmed (its copies into the
// buffer have ended and the handle is closed) or has exited. See
// internal/wire/spec.md, "cuda control messages".
//
// Cancel ends a request whose copy has not been enqueued yet at once. A copy
// on a stream cannot be withdrawn or torn mid-way, so its request completes,
// with its real outcome, once the stream has synchronised, and never
// earlier. The goroutine a Submit starts and Cancel both claim a request's
// state before touching it, so a request Cancel ended (and whose slot the
// engine may have reused since) is never read again. A copy into another
// engine whose process has exited fails with PeerUnreachable instead of
// landing in a mapping that outlived it. Quiesce has nothing to cut: the close protocol Unregister runs is
// the fence for peers' mappings. Close fails what is not enqueued and waits
// for every stream synchronisation in flight.
//
// Multi-node NVLink (MNNVL): with an NVLink domain (EnvDomain,
// TE_MNNVL_DOMAIN, or the param cudaipc.mnnvl_domain; unset, the cluster
// UUID and clique id NVML reports for the CUDA devices once the fabric
// manager registered them, internal/sys/nvml), a CUDA buffer whose
// allocation was made fabric-capable (cuMemCreate with
// CU_MEM_HANDLE_TYPE_FABRIC) is also exported with its CUmemFabricHandle
// (Extra: cuda_fabric, cuda_fabric_off, cuda_fabric_size), and the segment
// publishes its domain (Desc.Endpoints["cudaipc.mnnvl"]). An engine of the
// same domain, on any host, imports and maps that handle once and copies
// with the copy engine, under the same open/close protocol, so Unregister
// remains a fence. This is a mode of cudaipc rather than a transport of
// its own: it shares the mapping cache, cancel, the proven-caller checks
// and the close protocol, and ranks above rdma. cuMemAlloc memory has no
// fabric handle: its registration logs why and counts fabric_refused
// (Engine.TransportStats()["cudaipc"]), and peers of other hosts reach it
// through rdma or tcp; so do engines of other domains.
//
// Requests inside one engine (source and target registered with the same
// engine) are copied by the runtime directly: a process cannot open its own
// IPC handles.
//
// The transport starts only when some GPU runtime loads and sees a device;
// otherwise Start fails with TransportUnavailable and the reason, and the
// engine runs without it. The engine sends it only requests that touch GPU
// memory (see transport.DeviceMover).
package cudaipc
