"""NVIDIA NIXL's Python API on te.

    from nixl._api import nixl_agent, nixl_agent_config

Code written for NIXL (vLLM's NixlConnector, SGLang's nixl backend,
Dynamo, LMCache, Ray) runs on te unchanged: nixl._api (nixl_agent,
nixl_agent_config, nixl_thread_sync_t), nixl._bindings (the C++-style
nixlAgent, nixlXferDList, nixlRegDList, DRAM_SEG..FILE_SEG, NIXL_* status
codes, nixlXferTelemetry, the nixl*Error exceptions), nixl._utils and
nixl.logging. Each agent is one te engine.

Backend names (get_plugin_list). te picks the data path per request itself
(local > shm > rdma > tcp; GPU memory through its cuda paths), so the
network names all mean the same engine:

    UCX, LIBFABRIC, MOONCAKE, UCCL, TE   DRAM and VRAM, every te transport
    POSIX                                DRAM <-> FILE_SEG, te's file transport
    GDS, GDS_MT                          DRAM and VRAM <-> FILE_SEG; VRAM is
                                         staged through pinned host memory
                                         (te does not use cuFile for transfers)

Any other name (OBJ, HF3FS, GUSLI, a typo...) is a plugin that is not here:
create_backend raises nixlNotFoundError and a config naming it logs a
warning and skips it, as NIXL does for a plugin it cannot find.

What differs from NIXL:

* Metadata is te's: get_agent_metadata() returns bytes naming the agent's te
  segment (host:port), its te instance and its registered ranges; te fetches
  the segment's descriptor and capability keys itself, over its
  authenticated control plane. It is not interchangeable with NIXL's own
  metadata: both peers must run te.
* The listener is te's RPC listener: with enable_listen_thread the engine
  binds listen_port, and fetch_remote_metadata / send_local_metadata /
  send_partial_agent_metadata / invalidate_local_metadata travel as te
  notifications to ip_addr:port. These calls need the listener on
  (nixlNotAllowedError otherwise).
* etcd (nixl._etcd has the details): with NIXL_ETCD_ENDPOINTS set, the same
  calls without ip_addr publish to, read from and remove from etcd under
  NIXL's keys (NIXL_ETCD_NAMESPACE, default "/nixl/agents/"; labels
  "metadata" and, for partial metadata, the caller's), listener or not.
  etcd is reached through libte's client (te.Store): https:// endpoints
  and te's TE_ETCD_* TLS and user settings work. Sends and invalidation
  raise when etcd cannot be reached (after 5 s) rather than only logging;
  keys go when the agent closes (a lease), not only on invalidation; a
  fetch waits up to 5 s for the key, in the background, and logs why it
  failed; a peer loaded from etcd is watched, as NIXL does, and dropped
  when its keys are deleted (invalidated, closed, or its lease ran out).
  Without NIXL_ETCD_ENDPOINTS, ip_addr "" is refused
  (nixlNotSupportedError).
* Host: with the listener on, te binds every address (0.0.0.0) as NIXL's
  listener does, so peers reach it on 127.0.0.1 as well as on the host's
  addresses; with it off, the host it advertises (its first non-loopback
  IPv4 address). TE_NIXL_HOST sets it (127.0.0.1 keeps an agent on one
  machine).
  TE_NIXL_TRANSPORTS / TE_NIXL_FORCE_TRANSPORT choose te's transports
  (e.g. TE_NIXL_FORCE_TRANSPORT=tcp), TE_NIXL_PARAMS passes te transport
  parameters (e.g. rdma.devices=mlx5_0).
* Security: with a cluster secret (TE_AUTH_SECRET_FILE or TE_AUTH_SECRET,
  read when an agent is made) every peer proves it holds the secret before
  it learns or touches anything; an agent without it cannot load, reach or
  notify the others. Among agents holding it, what reaches the listener is
  taken only from the engine it speaks for, as te's session proves it:
  metadata pushed for agent P must name its sender's own te segment and
  instance, and once P is loaded, updates, invalidations and "nixl/n/P"
  notifications come only from P's engine (metadata from another engine
  replaces P only after P's engine stops answering as that instance: a
  restart elsewhere); metadata requests are answered only to the engine
  that asked. Without a secret nothing is proven and the network is
  trusted, as in NIXL. Descriptor lists sent with get_serialized_descs use a
  bounded binary format, not pickle, so a peer's list cannot run code.
* Restarts (NIXL issue 1267): add_remote_agent with newer metadata of an
  agent already loaded replaces it (full metadata) or adds to it (partial);
  metadata from a restarted peer (a new te instance) replaces the old one,
  whose prepared lists and transfers then refuse to run (nixlNotFoundError /
  "ERR") instead of touching the new process's memory. A transfer that fails
  makes the agent probe the peer; if it restarted at the same address its
  metadata turns stale (check_remote_metadata returns False) and, when both
  listeners are on, fresh metadata is fetched by itself.
* A peer that dies mid-transfer gives "ERR" (te's transfer timeout bounds
  it; a reset connection ends it at once), never a hang. Releasing a
  transfer still in flight cancels it and returns once nothing touches its
  memory.
* Registration: DRAM registers at te location "*" (te asks the CUDA
  driver, so a device pointer declared DRAM is still moved safely), VRAM at
  "cuda:<device id>" (te checks the driver agrees). A descriptor registered
  twice needs two deregistrations. Overlapping, non-identical ranges are
  refused (te).
* Telemetry: kept in process (capture_telemetry, or NIXL_TELEMETRY_ENABLE
  which wins when set); NIXL_TELEMETRY_DIR is ignored. Durations are
  microseconds, measured around te's submit and to the status check that saw
  the transfer complete.
* Threads: te progresses transfers itself (enable_prog_thread and
  num_threads are accepted). With the listener on, a thread drains te's
  notifications every 5 ms. Every sync mode is thread-safe.
* send_notif returns once the peer's te engine has queued the
  notification (a peer that does not answer: an error after te's RPC
  timeout, 5 s). A transfer's notification is sent after its last byte
  landed, and the transfer is DONE only once it was delivered.
* Bounds: what peers can make an agent hold is bounded beyond te's own
  limits: 64 MiB of notifications drained but not yet taken by
  get_new_notifs (the listener then leaves the rest in te, whose budget
  refuses senders), metadata of 65,536 agents, 2M ranges per agent, 4,096
  queued background sends. Per source of listener messages (with a cluster
  secret the sending engine's segment as te's session proved it; without
  one the te segment a message claims: its agent's for pushed metadata,
  the reply's for a metadata request):
  16 agents announced, 2M ranges held, one queued reply; 4M ranges for
  every source's pushed metadata together. Metadata past a bound is
  refused (logged). Replies to peers' metadata requests have their own
  queue (64) and thread, so no flood of requests delays the agent's own
  sends; a queued job not started within its deadline (own sends 60 s,
  replies 10 s) is dropped with a warning, and a started send gives up
  after te's RPC timeout (5 s).
* Files (FILE_SEG) are te file segments. register_memory takes NIXL's two
  modes: path mode ("<ro|rw>[,direct][,sync][,noatime][,create]:<path>" in
  the metadata, a device id of its own per file; the agent opens the file
  with those flags, mode 0644 when created) and fd mode (the device id is
  an open fd, which te duplicates). Transfers are local, as with NIXL's
  POSIX/GDS backends: memory on the local side, the file list (file
  offset, length, device id) on the remote side with the agent's own name;
  READ reads the file into memory, WRITE writes memory into it; no
  notification (nixlBackendError, as NIXL). Differences: a range registered
  past the end of a writable file extends it (sparse) at registration;
  length 0 means the file as it is when registered (NIXL: no bound);
  O_DIRECT exactly when NIXL would (the "direct" flag, an fd opened
  O_DIRECT), misaligned requests then going through the page cache instead
  of failing; a closed fd, a directory, a missing file, a typo in the
  flags or an fd opened O_APPEND fail at registration; overlapping ranges
  of one device id are refused; a transfer made before its file was deregistered refuses to run
  (nixlNotFoundError, "ERR"), and deregistration returns once te no longer
  touches the file. Files are not in the agent metadata and another agent
  cannot reach them (nixlNotSupportedError), as with NIXL's storage
  backends: they are private te file segments, in no te descriptor a peer
  reads, and te refuses every request to them but the agent's own, even
  from an engine with the cluster secret that knows their address and
  key. Path mode's "create" opens O_NOFOLLOW: a symbolic link at the path
  is refused (nixlBackendError), not followed.
* Not here: memory views (prep_mem_view), estimate_xfer_cost
  (nixlNotSupportedError), OBJ/BLK memory.
* Not in NIXL: nixl_agent.close() stops an agent at once;
  nixl_agent.wait_xfer(handle, timeout) blocks until a transfer is DONE or
  ERR without spending CPU (NIXL callers poll check_xfer_state, which on a
  busy machine takes CPU from te's own transfer threads).

Namespace: like `mooncake`, this package extends its __path__
(pkgutil.extend_path), so it can sit beside NVIDIA's nixl wheel; the folder
first on sys.path serves `nixl._api` and the rest.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

try:
    import numpy  # noqa: F401,E402
except ImportError as e:  # say so rather than fail deep inside an import
    raise ImportError("te's nixl package needs numpy, as NIXL does: pip install numpy (or te[nixl])") from e

from ._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t  # noqa: E402,F401
