// Package rdma is te's RDMA transport: one-sided RDMA READ and WRITE over
// reliable-connected (RC) queue pairs, through libibverbs loaded at run time
// (package internal/sys/ibv), in the shape of Mooncake's RDMA transport.
//
//   - One context per NIC, chosen by an allow-list (parameter rdma.devices,
//     or the environment variables TE_RDMA_DEVICES / MC_TE_FILTERS).
//   - Registering memory registers one memory region per NIC and publishes
//     the per-NIC keys in the buffer descriptor as Mooncake does: rkey[i] and
//     lkey[i] belong to devices[i]. Regions of 4 GiB and more are pre-faulted
//     and registered on all NICs in parallel.
//   - Queue pairs are created per endpoint (a local NIC paired with a peer's
//     NIC) and exchanged over the engine's control plane (message kind
//     wire.KindRDMA; the payload is specified in engine/wire/spec.md).
//   - A request is cut into slices (64 KiB by default, rdma.slice) spread
//     over the NIC pairs; each slice is one work request with the local
//     triple (addr, length, lkey) in its SGE and the remote pair
//     (remote_addr, rkey) in wr.rdma.
//   - A poller goroutine per NIC drains the completion queue. A failed slice
//     is retried on the next NIC pair; the failed endpoint is torn down and
//     the next slice to that peer connects a fresh one.
//
// Without libibverbs or without an RDMA device, Start returns a NotSupported
// error saying which, and the engine installs its other transports; Probe
// reports the same reason without starting anything.
package rdma
