// Package fabric is the transport over libfabric: AWS EFA (provider efa)
// and HPE Slingshot (cxi) in production, and libfabric's tcp, shm and
// sockets providers, which run on any host and are what its tests use.
//
// One domain per NIC of the chosen provider (fabric.provider, else
// FI_PROVIDER, else efa, then cxi; tcp, sockets and shm only when named),
// the one whose address is the engine's (fabric.addr, else its advertised
// host: an engine on 127.0.0.1 opens the tcp provider's lo domain). Each NIC has
// one address vector, one completion queue and an endpoint that peers
// address their one-sided reads and writes to; an engine opens one more
// endpoint per peer NIC it sends to, so that closing it flushes that
// peer's operations and no other's. Endpoint addresses are exchanged over
// the engine's control plane (authenticated with a cluster secret); the
// descriptor publishes each NIC's name, provider and addressing, and each
// buffer's keys, one per NIC (BufferDesc.Extra "fabric.keys").
//
// With more than one NIC (fabric.addr listing an address per NIC), NIC k
// is paired with the peer's NIC k (the shorter list wrapping around), and
// a request larger than a slice is split over the pairs by their load
// (internal/rails: measured rate and bytes outstanding). A pair whose
// operations fail (an error completion, or the stall watchdog below while
// the owner still holds the keys) is cooled down, and its operations, once
// their completion was read or their endpoint closed (the flush), go again
// over the healthy pair that would finish them first; a request fails only
// when no pair is left. The stall watchdog runs by default then
// (RailStall): a pair that went silent reports nothing else. Pairs to a
// peer that keep failing with no bytes moved between them (three endpoint
// failures within 10 s, over a second at least; an endpoint's operations
// failing together count once) make the peer unreachable over fabric for a
// cooldown
// (internal/rails.Peer, as rdma does): the engine takes another transport
// for it meanwhile.
//
// Memory-registration modes: FI_MR_LOCAL (local descriptors from the
// local region's registration), FI_MR_VIRT_ADDR or offsets from the
// buffer's start, FI_MR_PROV_KEY or random keys te draws, FI_MR_ALLOCATED
// (registered memory is always mapped), FI_MR_ENDPOINT (regions bound to
// the NIC's endpoint, which then carries every operation), FI_MR_HMEM.
// A provider asking for another mode is refused at Start by name.
//
// Every data-path call of a NIC is made by its poller goroutine: it posts
// queued operations while the provider has room (-FI_EAGAIN: read
// completions, then post again), reads completions, and keeps reading
// while peers are connected when the provider needs the application to
// progress incoming RMA (FI_PROGRESS_MANUAL: tcp, shm). A request ends
// once every operation of it has completed or its endpoint was closed:
// the fence of a terminal state.
//
// GPU memory (cuda:N, hip:N) is registered with the NIC where the
// provider was opened with FI_HMEM (fabric.hmem: by default asked of every
// provider but shm, whose FI_HMEM endpoints give up cross-memory attach):
// fi_mr_regattr with FI_HMEM_CUDA or FI_HMEM_ROCR and the device ordinal,
// and the NIC moves it like host memory (gpu_hmem in Stats). Where the
// provider has no FI_HMEM or refuses the region (libfabric built without
// that runtime, no peer-memory or dma-buf path), the region gets no keys
// (gpu_staged, the reason logged) and the engine moves requests on it over
// a staging transport (tcp's pinned rings).
//
// A refused key (the owner re-registered) ends an operation with
// StaleDescriptor, and the engine fetches the descriptor again. Providers
// that drop such an access without completing it (shm) are covered by a
// stall watchdog: when an endpoint's posted operations see no completion
// for fabric.stall_timeout (250 ms there, plus the time their bytes take at
// 64 MiB/s), te asks the owner whether it still holds their keys; if not,
// the endpoint is closed and they end with StaleDescriptor.
//
// Closing an endpoint is the flush on every provider but shm, whose peer
// works through the commands in its queue whatever became of the sender
// (and, in libfabric 1.17, crashes on a connection request from an
// endpoint closed meanwhile). There a used endpoint is drained first: a
// small READ of the peer NIC's probe region, exchanged with its address,
// goes behind its commands, and the close waits for its completion (the
// peer took every command before it), for 2 s at most.
//
// Before libfabric first initializes its providers, te sets the provider
// parameters in internal/sys/fabric.ProviderDefaults that the environment
// does not: ofi_rxm's default receive pool costs each endpoint tens of
// MiB and up to a second to open, and te opens one per peer.
package fabric
