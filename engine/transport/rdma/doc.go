// Package rdma is te's RDMA transport: one-sided RDMA READ and WRITE over
// reliable-connected (RC) queue pairs, through libibverbs loaded at run time
// (package internal/sys/ibv), in the shape of Mooncake's RDMA transport.
//
//   - One context per NIC, chosen by an allow-list (parameter rdma.devices,
//     or the environment variables TE_RDMA_DEVICES / MC_TE_FILTERS).
//   - Registering memory registers one memory region per NIC and publishes
//     the per-NIC keys in the buffer descriptor as Mooncake does: rkey[i] and
//     lkey[i] belong to devices[i]. Regions of 4 GiB and more are pre-faulted
//     and registered on all NICs in parallel. GPU memory is registered
//     through a dma-buf of its allocation, else by address (nvidia-peermem);
//     a GPU buffer the NICs refuse stays without keys and is staged by tcp
//     (DeviceMemory tells the engine which requests rdma can move).
//   - Package internal/sys/topo says which NICs are near each memory
//     location (same PCIe switch, else NUMA node); every buffer names its
//     near NICs in the descriptor (ExtraNear).
//   - Queue pairs are created per endpoint (a local NIC paired with a peer's
//     NIC) and exchanged over the engine's control plane (message kind
//     wire.KindRDMA; the payload is specified in internal/wire/spec.md).
//   - A rail is a local NIC paired with a peer NIC. A request goes over the
//     rails of its plan: tier 0 pairs the NICs near its local memory with
//     those near the target buffer, tier 1 is the rest. It is cut into
//     slices (64 KiB by default, rdma.slice), one work request each with
//     the local triple (addr, length, lkey) in its SGE and the remote pair
//     (remote_addr, rkey) in wr.rdma; a one-slice request goes to the rail
//     that finishes first, a larger one is split in runs weighted by each
//     rail's measured throughput less its backlog.
//   - All slices of one Submit bound for one endpoint are posted as one
//     chain of work requests: one ibv_post_send (doorbell) per endpoint per
//     submit, more only when a queue pair's send queue or the NIC's
//     completion queue is full. Every 16th work request and the last of
//     each chain are signaled; a completion accounts for every earlier work
//     request of its queue pair (an RC send queue completes in order).
//   - The peer's NIC list and the NIC pairs are parsed once per descriptor.
//     A submit makes one span per request and NIC pair; slices are
//     generated when posted, so it costs per request, not per slice, takes
//     no transport-wide lock once endpoints are up and allocates per
//     submit (two slabs), not per request or slice.
//   - A poller goroutine per NIC drains the completion queue. A failed slice
//     (its completion polled, so its first attempt can no longer touch
//     memory) is retried on another rail of its tier, then tier 1; the
//     failed endpoint is torn down and the next slice to that rail connects
//     a fresh one. A rail with repeated errors cools down and is probed
//     back; a peer whose rails keep failing is unreachable for a cooldown
//     (Reachable), so the engine takes tcp. Stats counts per rail and NIC.
//   - A dead link fails nothing by itself until the NIC's retry timer runs
//     out (about half a second as queue pairs are set up here). A watchdog
//     (rdma.stall_timeout, 20 ms; 0 turns it off) fails an endpoint that
//     has completed nothing for that long (or eight times what its queued
//     bytes should take at the rail's measured rate) while another rail to
//     the same peer completed work: its queue pairs go to the error state,
//     and each slice moves to another rail only once its flushed completion
//     came back, so the fence holds. On a heavily loaded host a
//     descheduled poller can look like a stall: the slices then take a
//     detour, nothing is lost (the stalls stat counts them).
//   - Each NIC's completion poller polls the CQ while completions come
//     within a few microseconds and otherwise sleeps on the completion
//     channel in Go's network poller; rdma.poll=busy keeps it polling
//     while work is outstanding and for 2 ms after, trading a core per NIC
//     for no interrupt, channel read or wake-up per batch.
//
// # Cancellation and unregistering
//
// Cancel ends slices not yet posted at once. Slices already posted cannot
// be taken back from a NIC: the endpoint carrying them goes to the error
// state, the NIC flushes its outstanding work requests, and a canceled
// request completes once the flushed completions of all its slices have
// been polled, that is once the NIC will not touch its memory again. The
// other requests on that endpoint go again over a new one. Close does the
// same for everything, and completes what a dead device never flushed only
// after destroying its queue pairs.
//
// Peers reach this engine's memory with one-sided operations the owner does
// not see, so Quiesce has nothing to count or cut; Unregister deregisters
// the region's memory regions on every NIC, and once ibv_dereg_mr has
// returned the NIC refuses their rkeys: no access of a peer lands after it.
//
// With rdma.mr_cache=on (off by default) a host region takes the keys of a
// window of its mapping registered once per NIC (at most max_mr_size long;
// the NICs register it in parallel), shared and reference-counted by every
// region inside it that needs no more access, as NIXL and Mooncake
// register whole allocations: 1,265 tensors of one allocation cost one
// memory region per NIC per window instead of one per tensor and NIC. A
// window is shared only within the mapping it was registered for (same
// file and offset or anonymous, device, inode, permissions, asked with
// PROCMAP_QUERY or read from /proc/self/maps), so a file mapped again is
// not served by a region pinning the old pages, and it is deregistered
// with its last region. Its
// rkey reaches the whole window at the NIC: te still refuses any request
// outside a registered buffer, but after Unregister of one region the
// window's keys keep working until the last region of it is gone, which
// is why it is opt-in. A region longer than max_mr_size is registered on
// its own, split as below. GPU regions exported as a dma-buf
// share a window of their whole allocation (its size is the dma-buf's),
// registered on every NIC through the one fd; by address (peer memory),
// or when the allocation is longer than max_mr_size, each region is
// registered on its own.
//
// A region longer than the NICs' max_mr_size is registered as overlapping
// memory regions of at most max_mr_size on every NIC (the overlap is half
// a region, at most 64 MiB), and the descriptor carries every region's
// keys; an initiator cuts slices no longer than the overlaps, so each lies
// inside one region on each side, and takes its keys from those regions.
//
// Without libibverbs or without an RDMA device, Start returns a NotSupported
// error saying which, and the engine installs its other transports; Probe
// reports the same reason without starting anything.
package rdma
