/*
 * te.h - the C interface of te, a KV-cache transfer engine.
 *
 * Link with -lte (CMake: find_package(te 1.3) and target te::te; pkg-config:
 * te). The package version is this header's ABI version. A program linked
 * with -lte finds libte.so.1 through the loader's path: install it where the
 * loader looks (ldconfig), link with an rpath (-Wl,-rpath,<libdir>; CMake's
 * te::te does this in the build tree), or set LD_LIBRARY_PATH.
 * This header is written by hand and versioned; the one cgo generates while
 * building libte.so is not part of the interface.
 *
 * Conventions (they hold for every function unless its comment says
 * otherwise):
 *
 *  - Return value: 0 on success, or a negative TE_ERR_* code. The message of
 *    the last failed call on the calling thread is read with te_last_error.
 *  - Handles (te_engine_t, te_segment_t, te_batch_t and, from ABI 1.1,
 *    te_layout_t, te_plan_t, te_handoff_t, te_xfer_t) are opaque, typed 64-bit
 *    integers; 0 is never a valid handle. A handle of the wrong kind, a closed
 *    or freed handle, or a made-up one is TE_ERR_INVALID_ARGUMENT, never a
 *    crash. Destroying an engine invalidates every segment, batch and
 *    handoff-client handle it gave out (and those clients' transfers).
 *  - Pointers: a NULL pointer where an object is required is
 *    TE_ERR_INVALID_ARGUMENT; a pointer to unmapped memory is caught where
 *    the library reads or writes it and returned as TE_ERR_INTERNAL (a best
 *    effort: do not rely on it). Memory passed in belongs to the caller and is
 *    not kept after the call returns (registered memory excepted: it must stay
 *    valid until it is unregistered). Memory the library hands out has a
 *    matching free function (te_notify_free); every handle has its free or
 *    destroy function.
 *  - Thread safety: every function may be called from any thread at any time,
 *    concurrently with any other (calls on one batch from several threads
 *    are serialised by the library). Destroying an engine, closing a segment
 *    or freeing a batch while another thread still uses that handle is safe:
 *    the other call completes, or fails cleanly with TE_ERR_INVALID_ARGUMENT
 *    or TE_ERR_CLOSED.
 *  - Blocking: each function says whether it blocks ("Blocks: yes" waits for
 *    the network, at most the engine's RPC timeout, or for transfers); the
 *    others return promptly.
 *  - Strings: NUL-terminated UTF-8. Output strings are always NUL-terminated
 *    when the buffer has room for at least one byte; a string cut short
 *    returns TE_ERR_BUFFER_TOO_SMALL (the truncated text is still written).
 *  - Processes: libte contains a Go runtime, which starts when the library
 *    is loaded (at program start when linked with -lte). Load it once per
 *    process and never unload it. The runtime cannot run in a forked child:
 *    in a child forked from a process that has loaded the library, every
 *    function returns TE_ERR_FORKED at once without entering the runtime
 *    (te_last_error says why; nothing hangs), except te_abi_version,
 *    te_last_error and te_notify_free, which work as usual. Such a child
 *    must exec() (use posix_spawn, or Python's "spawn" start method). Only a
 *    process that has never loaded the library (it dlopen()s libte later)
 *    may fork children that load and use it, create engines included.
 *    The library never exits the process and installs no handler for
 *    SIGINT/SIGTERM; like every Go shared library it handles SIGURG
 *    (goroutine preemption) and turns faults inside its own code into errors
 *    or, if it cannot, into a crash report.
 */
#ifndef TE_H
#define TE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version: te_abi_version() returns (MAJOR << 16) | MINOR. A library
 * with the same MAJOR and a MINOR at least the one compiled against serves
 * this header. The CMake and pkg-config packages carry it as their version
 * (MAJOR.MINOR.0). 1.2 added the TE_ERR_AUTH, _FORKED and
 * _RESOURCE_EXHAUSTED codes, the te_config_t fields after max_notifies and
 * te_local_topology, and renamed some struct tags (the _t names stay). 1.3
 * added storage buffers (te_register_file, TE_FILE_* flags) and the
 * TE_ERR_IO and TE_ERR_NO_SPACE codes, te_version and te_metrics. 1.4
 * added te_cxl_memory, te_warmup_segment, the te_store_* functions,
 * te_notify_drain_from, te_range_t, te_grant_window_to,
 * te_grant_window_to_first, te_bind_window, te_revoke_window,
 * te_submit_windows, te_submit_windows_with_notify and private files
 * (te_register_file without TE_FILE_REMOTE). */
#define TE_ABI_VERSION_MAJOR 1
#define TE_ABI_VERSION_MINOR 4
#define TE_ABI_VERSION ((TE_ABI_VERSION_MAJOR << 16) | TE_ABI_VERSION_MINOR)

/* Error codes: stable, never renumbered. Functions return them negated. */
#define TE_OK 0
#define TE_ERR_INVALID_ARGUMENT (-1)
#define TE_ERR_ADDRESS_NOT_REGISTERED (-2)
#define TE_ERR_ADDRESS_OVERLAPPED (-3)
#define TE_ERR_BATCH_BUSY (-4)
#define TE_ERR_SEGMENT_NOT_FOUND (-5)
#define TE_ERR_TRANSPORT_UNAVAILABLE (-6)
#define TE_ERR_PEER_UNREACHABLE (-7)
#define TE_ERR_TIMEOUT (-8)
#define TE_ERR_METADATA (-9)
#define TE_ERR_NOT_SUPPORTED (-10)
#define TE_ERR_CLOSED (-11)
#define TE_ERR_STALE_DESCRIPTOR (-12)
#define TE_ERR_ACCESS_DENIED (-13)
#define TE_ERR_TOO_LARGE (-14)
#define TE_ERR_PROTOCOL (-15)
#define TE_ERR_CANCELED (-16)
#define TE_ERR_NO_MEMORY (-17)
#define TE_ERR_INTERNAL (-18)
#define TE_ERR_NOT_FOUND (-19)
#define TE_ERR_BUFFER_TOO_SMALL (-20)
#define TE_ERR_TRANSFER_LOST (-21) /* a handoff transfer is gone from the sidecar that held it */
/* ABI 1.2 */
#define TE_ERR_AUTH (-22)               /* a peer failed (or refused) cluster-secret authentication */
#define TE_ERR_FORKED (-23)             /* called in a child forked after the library was used */
#define TE_ERR_RESOURCE_EXHAUSTED (-24) /* over a bound (connections, calls, notification bytes) */
#define TE_ERR_IO (-25)                 /* storage failed a read or write (EIO, a truncated file) */
#define TE_ERR_NO_SPACE (-26)           /* storage is full (ENOSPC, EDQUOT, the file size limit) */

/* Opcodes, numbered as in Mooncake. */
#define TE_READ 0  /* copy from the target segment into local memory */
#define TE_WRITE 1 /* copy local memory into the target segment */

/* Task and batch states, numbered as in Mooncake. */
#define TE_TASK_WAITING 0   /* nothing submitted yet */
#define TE_TASK_PENDING 1   /* submitted, not finished */
#define TE_TASK_INVALID 2   /* no such task */
#define TE_TASK_CANCELED 3
#define TE_TASK_COMPLETED 4 /* every byte arrived (WRITE: in the target's memory) */
#define TE_TASK_TIMEOUT 5
#define TE_TASK_FAILED 6

/* Log levels for te_config_t.log_level. */
#define TE_LOG_DEFAULT 0 /* warnings and errors */
#define TE_LOG_DEBUG 1
#define TE_LOG_INFO 2
#define TE_LOG_WARN 3
#define TE_LOG_ERROR 4
#define TE_LOG_OFF 5

typedef uint64_t te_engine_t;
typedef uint64_t te_segment_t;
typedef uint64_t te_batch_t;

/*
 * Engine configuration. Initialise with TE_CONFIG_INIT (it sets size to the
 * size this header declares and every other field to its default) and set
 * what you need:
 *
 *     te_config_t cfg = TE_CONFIG_INIT;
 *     cfg.listen_addr = "127.0.0.1:0";
 *
 * size lets newer libraries accept older callers: fields past size are
 * treated as unset. NULL strings and zero numbers mean "default".
 */
typedef struct te_config {
    uint32_t size;               /* sizeof(te_config_t); required */
    int32_t log_level;           /* TE_LOG_*; logs go to stderr */
    const char *segment_name;    /* default (and in P2P mode required): host:port of the RPC listener */
    const char *metadata;        /* "P2PHANDSHAKE" (default), "mem://NAME", "etcd://h1:p1,h2:p2", ... */
    const char *listen_addr;     /* RPC listener; default (or ":port"): the advertised hostname, a free port. "0.0.0.0:P" binds every interface */
    const char *hostname;        /* host peers reach this engine at; default: listener host or first non-loopback IPv4 */
    const char *transports;      /* comma-separated list to install, e.g. "local,tcp"; default: all available */
    const char *force_transport; /* use this transport for every request, e.g. "tcp" */
    const char *params;          /* transport parameters "key=value" separated by ',' ';' or newlines, e.g. "tcp.conns=4" */
    int64_t transfer_timeout_ms; /* per request; 0: 30 s; negative: none */
    int64_t rpc_timeout_ms;      /* control-plane calls; 0 (or negative): 5 s */
    uint64_t max_frame;          /* limit of a control frame carrying a descriptor, in bytes; 0: 16 MiB */
    int64_t max_notifies;        /* queue of received notifications; 0 (or negative): 65536 */
    /* ABI 1.2: authentication, Mooncake peers and the bounds on what peers
     * can make the engine hold. */
    const char *auth_secret;      /* cluster secret (a second line: an older one still accepted); NULL: auth_secret_file */
    const char *auth_secret_file; /* file holding it; both NULL: $TE_AUTH_SECRET_FILE, then $TE_AUTH_SECRET, else none */
    int32_t accept_mooncake_peers;      /* non-zero: Mooncake peers may access remote memory over tcp (also TE_ACCEPT_MOONCAKE_PEERS=1) */
    int32_t allow_mooncake_with_secret; /* non-zero: accept them even with a cluster secret set (they bypass it) */
    int64_t unregister_grace_ms;  /* in-flight remote accesses get this long at unregister/destroy, then are cut; 0: 2 s */
    int32_t max_conns;            /* accepted connections per listener; 0: 1024 */
    int32_t max_conns_per_host;   /* accepted connections per remote address per listener; 0: 256 */
    int64_t idle_timeout_ms;      /* close an accepted connection idle this long; 0: 5 min */
    int64_t progress_timeout_ms;  /* cut a connection whose payload makes no progress this long; 0: 10 s */
    uint64_t notify_bytes;        /* bytes of received, undrained notifications; 0: 64 MiB */
    uint64_t notify_bytes_per_sender; /* the same per sender (its proven instance, else its address); 0: 16 MiB + 4 KiB */
    /* ABI 1.3: with a cluster secret every control and tcp data connection
     * between two engines is an authenticated session (frame headers and
     * control messages sealed); encrypt seals data payloads too. */
    int32_t encrypt; /* non-zero: encrypt payloads with AES-128-GCM (either engine asking is enough; also
                      * TE_ENCRYPT=1); needs the cluster secret: te_create fails with TE_ERR_INVALID_ARGUMENT without one */
} te_config_t;

/* Every field spelled out, so -Wmissing-field-initializers stays quiet. No
 * cast: sizeof is a constant that fits, which C and C++ (even in braces)
 * convert without a warning. */
#define TE_CONFIG_INIT                                                                                  \
    {sizeof(te_config_t), TE_LOG_DEFAULT, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0, 0, 0, NULL, NULL, 0, \
     0, 0, 0, 0, 0, 0, 0, 0, 0}

/* One range for te_register_batch. */
typedef struct te_region {
    void *addr;
    uint64_t length;
    const char *location; /* "cpu", "cpu:N", "cuda:N", "hip:N" or "*"; NULL means "cpu" */
    int32_t remote;       /* non-zero: peers may access it */
    int32_t reserved;     /* set to 0 */
} te_region_t;

/* One transfer: length bytes between local memory at local and address
 * remote of segment (for RAM segments the remote virtual address, as in
 * Mooncake). */
typedef struct te_request {
    int32_t opcode;       /* TE_READ or TE_WRITE */
    int32_t reserved;     /* set to 0 */
    void *local;          /* inside memory registered with this engine */
    te_segment_t segment; /* from te_open_segment on the batch's engine */
    uint64_t remote;      /* inside one buffer of the segment */
    uint64_t length;      /* non-zero */
} te_request_t;

/* The tags of the structs that share their name with a function
 * (te_task_status, te_batch_status, te_probe, te_stats, te_layout_info,
 * te_plan_stats, te_handoff_status) end in _s since ABI 1.2, so that C++
 * sees no name hidden by another; use the _t names. */
typedef struct te_task_status_s {
    int32_t state;        /* TE_TASK_* */
    int32_t error;        /* TE_ERR_* why it did not complete, else 0 */
    uint64_t transferred; /* bytes */
    char transport[16];   /* transport that carried it, NUL-terminated */
} te_task_status_t;

typedef struct te_batch_status_s {
    int32_t state;        /* TE_TASK_PENDING while any task is; else the worst outcome */
    int32_t error;        /* code of the first failed task, else 0 */
    uint64_t transferred; /* bytes of completed tasks */
    uint64_t tasks;       /* submitted so far */
    uint64_t completed;
    uint64_t failed;      /* FAILED, TIMEOUT and CANCELED together */
} te_batch_status_t;

/* One received notification, owned by the library (see te_notify_drain). */
typedef struct te_notify {
    const char *name; /* NUL-terminated */
    const char *msg;  /* msg_len bytes, followed by a NUL */
    uint64_t msg_len;
} te_notify_t;

/* One received notification with its sender, owned by the library (see
 * te_notify_drain_from). (ABI 1.4) */
typedef struct te_notify_from {
    const char *name;     /* NUL-terminated */
    const char *msg;      /* msg_len bytes, followed by a NUL */
    uint64_t msg_len;
    /* The sending engine's segment name and instance id as its
     * authenticated session proved them (NUL-terminated); "" where nothing
     * is proven: without a cluster secret, from Mooncake peers, and (sender
     * only) for an engine that has no segment. Act on who sent a
     * notification by these, never by name or msg. */
    const char *sender;
    const char *sender_instance;
} te_notify_from_t;

typedef struct te_probe_s {
    uint64_t rtt_ns;   /* round-trip time of the probe */
    uint64_t version;  /* version of the peer's published descriptor */
    char instance[40]; /* peer's random per-start identity, NUL-terminated */
} te_probe_t;

/* One buffer of a segment's descriptor. */
typedef struct te_buffer_desc {
    uint64_t addr;
    uint64_t length;
    char location[32]; /* e.g. "cpu:0", NUL-terminated (cut if longer) */
} te_buffer_desc_t;

/* Engine counters. Set size to sizeof(te_stats_t) before te_stats; fields
 * past size are not written. */
typedef struct te_stats_s {
    uint32_t size;
    uint32_t buffers; /* registered ranges */
    uint64_t tasks_completed;
    uint64_t tasks_failed;
    uint64_t tasks_timed_out;
    uint64_t bytes_transferred;
    uint64_t notifies_sent;
    uint64_t notifies_received;
} te_stats_t;

/* ==== KV-cache layouts, transfer plans and the handoff (ABI 1.1) ==========
 *
 * A layout (te_layout_t) is one rank's KV cache: format, dtype, shape, the
 * KV heads it holds and the base address of every layer, given as the JSON
 * form of te's Go kvcache.Layout, for example
 *
 *     {"format":"vllm","order":"HND","dtype":"bf16","num_blocks":512,
 *      "block_size":16,"num_heads":8,"head_dim":128,"bases":[140200000,...]}
 *
 * format: "vllm" ([2, num_blocks, ...] per layer; K/V split with "k_bases"
 * and "v_bases"), "flashinfer" ([num_blocks, 2, ...]), "mla"
 * ([num_blocks, block_size, dim]), "sglang" (per-layer K and V pools by page,
 * "k_bases"/"v_bases"); order: "NHD" (default) or "HND"; dtype: "fp16",
 * "bf16", "fp8_e4m3", "fp8_e5m2", "fp32"; optional "head_start",
 * "total_heads" (tensor parallelism: the heads this rank holds) and
 * "first_layer". Addresses are decimal numbers.
 *
 * A plan (te_plan_t) maps source blocks to destination blocks for a range of
 * layers, K and V, coalescing runs that are consecutive on both sides; it is
 * submitted to an engine batch layer by layer (so that layer i moves while
 * layer i+1 is computed) or whole.
 *
 * The handoff moves one request's KV from a prefill process to a decode
 * process through te-sidecar. Decode declares where it goes
 * (te_handoff_expect), prefill that it is ready (te_handoff_ready); in push
 * mode (the default) prefill writes (te_handoff_send_layer as layers are
 * computed, then te_handoff_send), in pull mode decode reads (in its
 * te_handoff_wait). te_handoff_wait on the other side returns once the bytes
 * are there. Both layouts' memory must be registered, remote-accessible,
 * with the engines (te_layout_regions lists it) for the whole transfer.
 *
 * Layout and plan handles belong to no engine: te_destroy leaves them valid.
 * A handoff client belongs to its engine, a transfer (te_xfer_t) to its
 * client: te_destroy and te_handoff_destroy abort the unfinished transfers
 * and invalidate their handles. A handoff client reads its engine's
 * notifications; te_notify_drain on that engine still returns the ones that
 * are not handoff completions. Use one handoff client per engine. */

typedef uint64_t te_layout_t;
typedef uint64_t te_plan_t;
typedef uint64_t te_handoff_t; /* a handoff client: one engine and one te-sidecar */
typedef uint64_t te_xfer_t;    /* one handoff transfer, as one side sees it */

/* te_plan_transfers: every layer, coalesced across layers too. */
#define TE_PLAN_ALL_LAYERS (-1)

/* Who moves the bytes. DEFAULT: push on the decode side; on the prefill
 * side, whatever decode chose (naming a mode has a mismatch refused). */
#define TE_HANDOFF_MODE_DEFAULT 0
#define TE_HANDOFF_MODE_PUSH 1 /* prefill WRITEs into decode (Mooncake, SGLang) */
#define TE_HANDOFF_MODE_PULL 2 /* decode READs from prefill (NIXL) */

/* Handoff transfer states. DONE, FAILED, ABORTED and EXPIRED are final. */
#define TE_HANDOFF_WAITING 0      /* one side declared, the other not yet */
#define TE_HANDOFF_TRANSFERRING 1 /* both declared; the mover moves the KV */
#define TE_HANDOFF_DONE 2
#define TE_HANDOFF_FAILED 3
#define TE_HANDOFF_ABORTED 4
#define TE_HANDOFF_EXPIRED 5

/* A layout's summary. Set size to sizeof(te_layout_info_t); fields past
 * size are not written. */
typedef struct te_layout_info_s {
    uint32_t size;
    int32_t num_layers;
    int32_t first_layer;  /* model-wide index of the first layer */
    int32_t num_blocks;
    int32_t components;   /* 2 (K and V) or 1 (MLA) */
    int32_t regions;      /* tensors, see te_layout_regions */
    uint64_t block_bytes; /* one block of one component */
    uint64_t layer_bytes; /* one layer: every block, K and V */
} te_layout_info_t;

/* A range of memory. */
typedef struct te_span {
    uint64_t addr;
    uint64_t length;
} te_span_t;

/* One copy of a plan: length bytes from source address src to destination
 * address dst. */
typedef struct te_plan_transfer {
    uint64_t src;
    uint64_t dst;
    uint64_t length;
} te_plan_transfer_t;

/* A plan's numbers. Set size to sizeof(te_plan_stats_t). */
typedef struct te_plan_stats_s {
    uint32_t size;
    int32_t layers;               /* layers covered: [layer_begin, layer_end) */
    int32_t layer_begin;
    int32_t layer_end;
    int32_t blocks;               /* block pairs */
    int32_t pieces;               /* contiguous runs per block and component (NHD head slices: block_size) */
    uint64_t bytes;               /* bytes moved */
    uint64_t block_requests;      /* requests before coalescing */
    uint64_t requests;            /* after coalescing within each layer: what te_plan_submit_layer submits in all */
    uint64_t merged;              /* after coalescing across layers too: what te_plan_submit submits */
    uint64_t max_layer_requests;  /* the most requests one layer submits */
} te_plan_stats_t;

/* The outcome of a handoff transfer on this side. Set size to
 * sizeof(te_handoff_result_t). */
typedef struct te_handoff_result {
    uint32_t size;
    int32_t mode;            /* TE_HANDOFF_MODE_PUSH or _PULL */
    int32_t mover;           /* 1 on the side that moved the bytes */
    int32_t recorded;        /* 0: the bytes moved but te-sidecar lost the record */
    uint64_t bytes;
    uint64_t block_requests; /* mover: requests before coalescing */
    uint64_t requests;       /* mover: requests submitted */
    uint64_t elapsed_ns;     /* mover: first submit to last byte; other side: time waited */
    char transport[16];      /* mover: the transport that moved the bytes */
} te_handoff_result_t;

/* A handoff transfer as te-sidecar holds it. Set size to
 * sizeof(te_handoff_status_t). */
typedef struct te_handoff_status_s {
    uint32_t size;
    int32_t state;    /* TE_HANDOFF_WAITING .. TE_HANDOFF_EXPIRED (-1: a state this library does not know) */
    int32_t mode;     /* TE_HANDOFF_MODE_*; DEFAULT until both sides declared */
    int32_t error;    /* TE_ERR_* of a failed, aborted (TE_ERR_CANCELED) or expired (TE_ERR_TIMEOUT) transfer */
    int32_t settled;  /* 1 once the mover no longer touches either side's memory for it */
    int32_t reserved;
    uint64_t bytes;
    char reason[256]; /* why it failed, was aborted or expired; NUL-terminated, cut to fit */
} te_handoff_status_t;

/* ---- Functions ----------------------------------------------------------
 * Each comment ends with a line of the form
 *   Blocks: ... | Thread-safe: ... | Errors: ...
 * "Errors" lists the codes the function itself decides; every function that
 * takes a handle or pointer also returns TE_ERR_INVALID_ARGUMENT for a bad
 * handle or a NULL pointer, and TE_ERR_INTERNAL for a bug caught inside. */

/* ---- Library ----------------------------------------------------------- */

/* te_abi_version returns TE_ABI_VERSION of the loaded library, a positive
 * number (the one exception to the return convention).
 * Blocks: no | Thread-safe: yes | Errors: none, never fails. */
int te_abi_version(void);

/* te_last_error copies the message of the last call that failed on the
 * calling thread into buf (len bytes, NUL-terminated). Successful calls do
 * not clear it; a thread with no failure gets "". Reading it does not change
 * it, and a failure of te_last_error itself is not recorded. Each thread's
 * message (at most 4095 bytes) lives in that thread's own storage, so
 * threads never see or wait for each other's, however many there are; it
 * also works in a forked child.
 * Blocks: no | Thread-safe: yes (per thread) | Errors: TE_ERR_BUFFER_TOO_SMALL
 * (the message was cut to fit), TE_ERR_INVALID_ARGUMENT (buf NULL or len 0). */
int te_last_error(char *buf, size_t len);

/* te_version writes the library's version into buf (len bytes,
 * NUL-terminated): te.h's ABI version as MAJOR.MINOR.0, then, for a build
 * of an untagged commit, "+g" and the commit (e.g. "1.4.0+g1a2b3c4d5e6f"),
 * or "+dev" for a build that did not record one. te.__version__ and
 * `te-bench -version` of the same build print the same string. (ABI 1.3)
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_BUFFER_TOO_SMALL (cut to
 * fit; 64 bytes always suffice), TE_ERR_INVALID_ARGUMENT (buf NULL or len 0). */
int te_version(char *buf, size_t len);

/* te_local_topology writes, as a JSON object in Mooncake's topology shape,
 * the memory locations of this machine and the RDMA NICs te would use for
 * each: {"cpu:0": [[preferred NICs], [other NICs]], "cuda:0": [[...], [...]]}
 * (AMD devices as "hip:N").
 * CPU locations are the NUMA nodes (a NIC on the node is preferred), GPU
 * locations the devices each GPU runtime reports (preferred: the NICs behind
 * the GPU's PCIe switch, else those on its NUMA node). It reads sysfs, or
 * the tree TE_SYSFS_ROOT names instead of /sys. The rdma transport spreads
 * each request over these preferred NICs. devices is a comma-separated list
 * of NIC names to consider (NULL or "": those TE_RDMA_DEVICES or
 * MC_TE_FILTERS allow, else all). Without libibverbs or NICs
 * the lists are empty; without a CUDA driver there are no cuda entries. It
 * needs no engine.
 * Blocks: briefly (reads sysfs; the first call loads libibverbs and the CUDA
 * driver when present) | Thread-safe: yes | Errors: TE_ERR_BUFFER_TOO_SMALL. */
int te_local_topology(const char *devices, char *buf, size_t len);

/* ---- Engines ----------------------------------------------------------- */

/* te_create starts an engine: binds its RPC listener, starts the transports
 * and publishes an empty segment. cfg may be NULL for defaults; otherwise
 * cfg->size must be set (TE_CONFIG_INIT). On success *out is the handle, on
 * failure 0.
 * Blocks: yes (metadata store, up to the RPC timeout) | Thread-safe: yes |
 * Errors: TE_ERR_INVALID_ARGUMENT (size, log_level, params, listen address,
 * a negative limit or timeout),
 * TE_ERR_NOT_SUPPORTED (a newer header's field is set, unknown metadata
 * scheme), TE_ERR_TRANSPORT_UNAVAILABLE (a listed or forced transport cannot
 * start), TE_ERR_METADATA. */
int te_create(const te_config_t *cfg, te_engine_t *out);

/* te_destroy stops the engine: in-flight transfers end FAILED, listeners,
 * connections and threads are gone, and every segment and batch handle of
 * the engine becomes invalid: its batches are freed and their eventfds
 * (te_batch_fd) closed, as if te_free_batch had been called on each. Calls
 * blocked in te_wait on its batches return. A te_task_status or other batch
 * call racing it on another thread gets TE_ERR_INVALID_ARGUMENT, never
 * another batch's data.
 * Blocks: yes, until the engine is down | Thread-safe: yes | Errors:
 * TE_ERR_INVALID_ARGUMENT (also for a second call on the same handle),
 * TE_ERR_BATCH_BUSY (a batch could not be freed within 10 s, because a
 * te_submit on it never returned: the engine is down, but that batch's
 * memory and eventfd stay allocated). */
int te_destroy(te_engine_t engine);

/* te_segment_name writes the engine's own segment name (peers open it by
 * this name; with P2PHANDSHAKE it is host:port).
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_BUFFER_TOO_SMALL. */
int te_segment_name(te_engine_t engine, char *buf, size_t len);

/* te_cxl_memory stores where the shared CXL memory device (TE_CXL_DEVICE or
 * MC_CXL_DEV_PATH, mapped by the cxl transport) lies in this process and its
 * size in bytes. Buffers allocated from [*addr, *addr + *size) and registered
 * are reached by engines that map the same device with a memcpy; ranges
 * outside it go over the engine's other transports. The mapping stays until
 * the engine is destroyed (the last engine of the process naming the device
 * unmaps it): stop using it before te_destroy.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_NOT_SUPPORTED (no device
 * mapped: the variable is unset or the device could not be mapped; the
 * engine's log says why), TE_ERR_INVALID_ARGUMENT (a NULL pointer). */
int te_cxl_memory(te_engine_t engine, uint64_t *addr, uint64_t *size);

/* te_rpc_port stores the RPC listener's port in *port.
 * Blocks: no | Thread-safe: yes | Errors: handle and pointer only. */
int te_rpc_port(te_engine_t engine, int32_t *port);

/* te_stats fills the counters that fit in out->size bytes.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT (size not
 * set). */
int te_stats(te_engine_t engine, te_stats_t *out);

/* te_stats_json writes the engine's counters, segment name and installed
 * transports as a JSON object; "transport_stats" holds the transports' own
 * counters (rdma: bytes, errors, retries and cooldowns per rail and NIC),
 * "live" what peers cost the engine now, per transport (gauges: "peers",
 * "conns_dialed", "conns_accepted", "endpoints", "queue_pairs"; they fall
 * back when a peer goes or restarts under its name), "control" the control
 * plane's counters with its dialled "peers" and "peer_conns_open", and
 * "topology" the NICs near each memory location as rdma uses them (in
 * te_local_topology's shape; absent without rdma).
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_BUFFER_TOO_SMALL. */
int te_stats_json(te_engine_t engine, char *buf, size_t len);

/* te_metrics writes the engine's metrics in Prometheus's text exposition
 * format (version 0.0.4) into the caller's buffer: tasks by final state,
 * bytes, notifications, control-plane connections and refusals
 * (authentication, limits), per-transport counters, what peers cost now
 * (te_transport_peers, te_transport_connections{direction},
 * te_transport_endpoints, te_transport_queue_pairs,
 * te_control_peer_connections, te_control_peers), routes, and
 * te_task_duration_seconds, a histogram of the time from a task's submit to
 * its batch's completion (what a caller of te_wait sees) per transport and
 * peer class, and te_batch_stage_seconds, where that time goes per
 * transport (stage: submit, transfer, wakeup). Every family has HELP and
 * TYPE lines. The text
 * is NUL-terminated like te_last_error's; when needed is not NULL it
 * receives the bytes the whole text takes, NUL included, on success and on
 * TE_ERR_BUFFER_TOO_SMALL, so a caller can size the buffer: buf may be NULL
 * with len 0 to ask for the size alone (the call then returns
 * TE_ERR_BUFFER_TOO_SMALL). The text grows with open segments and
 * transports: a few KiB, 64 KiB is ample for most engines. Set
 * TE_METRICS_ADDR to have the engine serve the same text over HTTP at
 * /metrics instead. (ABI 1.3)
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_BUFFER_TOO_SMALL (the text
 * was cut to fit, or buf is NULL), TE_ERR_INVALID_ARGUMENT (buf NULL with len
 * non-zero, or buf NULL and needed NULL). */
int te_metrics(te_engine_t engine, char *buf, size_t len, size_t *needed);

/* ---- Memory ------------------------------------------------------------ */

/* te_register registers [addr, addr+length) with every installed transport
 * and, when remote is non-zero, publishes it so peers may access it.
 * Registering the identical range again succeeds and changes nothing.
 * location: "cpu", "cpu:N", "cuda:N" (CUDA device N), "hip:N" (AMD device N,
 * through the HIP runtime), "*" (detect: device memory of any runtime that
 * loads is published as its KIND:N) or NULL (cpu). Device memory needs its
 * runtime in the process (TE_ERR_NOT_SUPPORTED otherwise) and must be that
 * device's (TE_ERR_INVALID_ARGUMENT otherwise).
 * Blocks: yes (publishing to the metadata store) | Thread-safe: yes |
 * Errors: TE_ERR_INVALID_ARGUMENT (NULL addr, zero length, bad location),
 * TE_ERR_ADDRESS_OVERLAPPED (overlaps a registered range), and a transport's
 * refusal (e.g. TE_ERR_NOT_SUPPORTED). */
int te_register(te_engine_t engine, void *addr, uint64_t length, const char *location, int32_t remote);

/* te_unregister unregisters the range registered at addr: it stops new
 * accesses, waits for those in flight and publishes the new descriptor before
 * it returns, so the memory may be freed afterwards.
 * Blocks: yes (in-flight transfers, metadata) | Thread-safe: yes | Errors:
 * TE_ERR_ADDRESS_NOT_REGISTERED (addr does not start a registered range). */
int te_unregister(te_engine_t engine, void *addr);

/* Flags of te_register_file. */
#define TE_FILE_REMOTE 1u    /* publish the buffer: peers reach it; without it the file is private */
#define TE_FILE_CREATE 2u    /* create the file (mode 0600) if missing, extend it to hold the range */
#define TE_FILE_READ_ONLY 4u /* refuse writes into the file */
#define TE_FILE_NO_DIRECT 8u /* keep every I/O in the page cache, even where O_DIRECT works */

/* te_register_file registers [offset, offset+length) of a file as a storage
 * buffer of the segment and stores in *addr the address the range starts at:
 * requests address byte k of the range as addr + k, like memory (a READ
 * copies from the file into local memory, a WRITE from local memory into the
 * file), with the same batches, statuses, timeouts, cancel and fences; a task
 * ends only once the kernel no longer touches its memory. The address is
 * reserved, never mapped: never dereference it, and never use it as a
 * request's local side. length 0 means up to the file's current end.
 * Requests, this engine's own included, address it through the engine's
 * segment. With TE_FILE_REMOTE the buffer is published (location "file",
 * with its direct-I/O alignment) and peers reach it over tcp, behind the
 * cluster secret and the buffer's key. Without it (ABI 1.4; 1.3 refused it
 * with TE_ERR_INVALID_ARGUMENT) the file is private: it is in no descriptor
 * a peer reads, and the owner refuses every request to it but this
 * engine's own (TE_ERR_ACCESS_DENIED, even with the right address and key),
 * so only this process moves its bytes; te_segment_buffers of the engine's
 * own segment lists it.
 * path names the file (the library opens it); with path NULL, fd is a file
 * descriptor open for reading (and writing), which the library duplicates:
 * the caller may close it on return. Aligned I/O goes O_DIRECT where the file
 * system takes it, misaligned I/O through the page cache (counted in
 * te_stats_json: transport_stats.file.buffered_ios; transport_stats.file
 * .io_uring is 0 where the pread/pwrite fallback runs). te_unregister(engine, *addr) waits for
 * the I/O in flight, closes the library's descriptors and releases the
 * address.
 * Blocks: yes (opening the file, publishing) | Thread-safe: yes | Errors:
 * TE_ERR_INVALID_ARGUMENT (NULL addr, both or neither of path and fd, a
 * range past the end of a file opened without TE_FILE_CREATE, not a regular
 * file or block device, unknown flags), TE_ERR_NOT_FOUND (no such file),
 * TE_ERR_ACCESS_DENIED, TE_ERR_NO_SPACE (extending it),
 * TE_ERR_TRANSPORT_UNAVAILABLE (the file transport is not installed). */
int te_register_file(te_engine_t engine, const char *path, int32_t fd, uint64_t offset, uint64_t length,
                     uint32_t flags, void **addr);

/* te_register_batch registers n ranges, all or none, publishing once.
 * Blocks: yes, like te_register | Thread-safe: yes | Errors: as te_register,
 * plus TE_ERR_INVALID_ARGUMENT for n == 0 and TE_ERR_ADDRESS_OVERLAPPED for
 * ranges of the batch that overlap each other. */
int te_register_batch(te_engine_t engine, const te_region_t *regions, size_t n);

/* te_unregister_batch unregisters n ranges (each must be registered; if one
 * is not, none is unregistered) and publishes once.
 * Blocks: yes, like te_unregister | Thread-safe: yes | Errors:
 * TE_ERR_INVALID_ARGUMENT (n == 0, a NULL address),
 * TE_ERR_ADDRESS_NOT_REGISTERED. */
int te_unregister_batch(te_engine_t engine, void *const *addrs, size_t n);

/* ---- Windows (ABI 1.4) --------------------------------------------------- */

/* [addr, addr+length) of registered memory. */
typedef struct te_range {
    uint64_t addr;
    uint64_t length;
} te_range_t;

/* te_grant_window_to grants a window over n ranges of this engine's
 * registered, remote-accessible memory (each inside registered buffers) and
 * stores its key in *key. A peer presents the key instead of the buffer's
 * (te_submit_windows; Go's engine.Request.Window; the handoff does so
 * itself); the engine checks every access against the ranges, and
 * te_revoke_window ends the grant. peer is the segment name of the only
 * engine that may use the window: with a cluster secret, an access from
 * any other engine (checked against the identity its connection proved)
 * is refused with TE_ERR_ACCESS_DENIED and lands nothing. peer NULL or ""
 * grants to whoever holds the key (a bearer key). Without a secret nothing
 * about a remote peer is proven and a bound window is a bearer key over
 * tcp, shm and cxl; in one process it is always checked. A request under
 * a window goes only over transports that enforce windows (local, shm,
 * cxl, tcp), never rdma, cudaipc or fabric. On failure *key is 0.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT (NULL
 * ranges or key, n == 0, an empty or overflowing range, a peer name over
 * 4096 bytes), TE_ERR_ADDRESS_NOT_REGISTERED, TE_ERR_ACCESS_DENIED (a
 * buffer that is not remote-accessible), TE_ERR_RESOURCE_EXHAUSTED (65536
 * windows granted already). */
int te_grant_window_to(te_engine_t engine, const char *peer, const te_range_t *ranges, size_t n, uint64_t *key);

/* te_grant_window_to_first grants a window as te_grant_window_to does, to
 * the first engine that uses it, for an owner that does not know yet which
 * engine that will be: with a cluster secret, the first access under it by
 * an engine whose connection proved its segment and instance binds the
 * window to that engine, atomically, and from then on an access from any
 * other engine is refused with TE_ERR_ACCESS_DENIED and lands nothing.
 * te_bind_window binds it to the engine the owner learns of, or says that
 * another used it first. Without a secret no remote access is proven, none
 * binds the window over tcp, shm and cxl, and the key is a bearer key; in
 * one process it is always checked. On failure *key is 0.
 * Blocks: no | Thread-safe: yes | Errors: as te_grant_window_to. */
int te_grant_window_to_first(te_engine_t engine, const te_range_t *ranges, size_t n, uint64_t *key);

/* te_bind_window binds the window granted as key with
 * te_grant_window_to_first to the engine whose segment is named peer,
 * unless an engine used it first. It returns 0 when the window is bound to
 * peer, now or already (by peer's first access, or granted to it with
 * te_grant_window_to); TE_ERR_ACCESS_DENIED, naming the engine that used
 * it first, when that is another one: the owner should then fail what the
 * window was for rather than trust what landed.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT (NULL or
 * empty peer, a peer name over 4096 bytes, a bearer window granted with
 * peer NULL, which cannot be bound after the fact), TE_ERR_NOT_FOUND (no
 * such window), TE_ERR_ACCESS_DENIED. */
int te_bind_window(te_engine_t engine, uint64_t key, const char *peer);

/* te_revoke_window ends the window granted as key: accesses under it are
 * refused at once, those in flight get the unregister grace, then the
 * transports cut what still holds them. It returns 0 once no access under
 * the window can touch memory any more; on an error the window stays
 * revoked-but-known and calling it again retries.
 * Blocks: yes (up to the unregister grace and the revocation of peers) |
 * Thread-safe: yes | Errors: TE_ERR_NOT_FOUND (no such window). */
int te_revoke_window(te_engine_t engine, uint64_t key);

/* ---- Segments ---------------------------------------------------------- */

/* te_open_segment returns a handle to the named segment (a peer's, or the
 * engine's own), fetching its descriptor unless one is cached. On failure
 * *out is 0.
 * Blocks: yes (RPC timeout) | Thread-safe: yes | Errors:
 * TE_ERR_INVALID_ARGUMENT (empty name; with P2PHANDSHAKE a name that is not
 * host:port), TE_ERR_SEGMENT_NOT_FOUND (unknown or not answering),
 * TE_ERR_METADATA, TE_ERR_AUTH (the peer holds another cluster secret). */
int te_open_segment(te_engine_t engine, const char *name, te_segment_t *out);

/* te_warmup_segment connects to the named segment ahead of its first
 * transfer: the transport that would carry host memory to it sets up what
 * the first request would (tcp: every striped connection dialed,
 * authenticated, session keys agreed; rdma: the queue pairs of every NIC
 * pair connected). Transports with nothing to set up (local, shm) make it
 * a no-op that succeeds, as does the engine's own name. The segment is
 * opened for the call only: open it with te_open_segment first to keep its
 * descriptor cached. Connections already up cost nothing, so calling it
 * again is cheap. Connections left unused are reclaimed like other idle
 * ones (peer_idle_timeout, 2 minutes): warm up shortly before the transfers.
 * Since ABI 1.3 (added without a minor bump).
 * Blocks: yes, until every connection is up or one failed (RPC timeout for
 * the open, then the transport's connect and handshake timeouts) |
 * Thread-safe: yes | Returns: 0, or TE_ERR_INVALID_ARGUMENT (NULL or empty
 * name; with P2PHANDSHAKE a name that is not host:port),
 * TE_ERR_SEGMENT_NOT_FOUND (unknown or not answering),
 * TE_ERR_TRANSPORT_UNAVAILABLE (no transport reaches it),
 * TE_ERR_PEER_UNREACHABLE (a connect or handshake failed), TE_ERR_AUTH,
 * TE_ERR_METADATA, TE_ERR_FORKED, TE_ERR_CLOSED. */
int te_warmup_segment(te_engine_t engine, const char *name);

/* te_close_segment releases a segment handle.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT (also for
 * a handle closed before). */
int te_close_segment(te_segment_t segment);

/* te_segment_buffers copies up to cap buffer descriptions of the segment's
 * current descriptor into out (out may be NULL when cap is 0) and stores the
 * total number of buffers in *count.
 * Blocks: only when a transfer marked the descriptor stale and it is fetched
 * again (RPC timeout) | Thread-safe: yes | Errors: TE_ERR_SEGMENT_NOT_FOUND
 * (refetch failed). */
int te_segment_buffers(te_segment_t segment, te_buffer_desc_t *out, size_t cap, size_t *count);

/* ---- Batches ----------------------------------------------------------- */

/* te_allocate_batch returns an empty batch for up to capacity requests
 * (1 .. 16777216). On failure *out is 0.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT
 * (capacity), TE_ERR_CLOSED. */
int te_allocate_batch(te_engine_t engine, size_t capacity, te_batch_t *out);

/* te_submit validates all n requests, then starts them; if one is invalid
 * none is started and the message names its index. Requests may be submitted
 * in several calls up to the capacity; tasks are numbered in submission
 * order. It does not wait for the transfers.
 * Blocks: only to refetch a stale descriptor (RPC timeout) | Thread-safe:
 * yes | Errors: TE_ERR_INVALID_ARGUMENT (n == 0, over capacity, zero length,
 * bad opcode, bad or foreign segment handle, freed batch),
 * TE_ERR_ADDRESS_NOT_REGISTERED (local range not registered, or remote range
 * not inside one buffer of the segment), TE_ERR_TRANSPORT_UNAVAILABLE (no
 * transport reaches the peer), TE_ERR_CLOSED. */
int te_submit(te_batch_t batch, const te_request_t *requests, size_t n);

/* te_submit_with_notify submits like te_submit and, once every task of the
 * batch has COMPLETED, sends the notification (name, msg) to the named
 * segment. No notification is sent when a task fails. msg is msg_len bytes
 * (may be NULL when msg_len is 0).
 * Blocks: like te_submit | Thread-safe: yes | Errors: as te_submit, plus
 * TE_ERR_TOO_LARGE (name over 4096 bytes or msg over 16 MiB). */
int te_submit_with_notify(te_batch_t batch, const te_request_t *requests, size_t n, const char *segment,
                          const char *name, const char *msg, size_t msg_len);

/* te_submit_windows submits like te_submit, request i under the window
 * whose key is windows[i]: a key the target segment's engine granted with
 * te_grant_window_to (to this engine, or to whoever holds it) and passed to
 * this process. windows is an array of n keys parallel to requests (which
 * stay te_request_t, so arrays built for te_submit serve as they are); a 0
 * key sends that request under the buffer's own key, as te_submit does, and
 * windows NULL is exactly te_submit. A request under a window presents its
 * key instead of the buffer's and goes only over a transport that enforces
 * windows (local, shm, cxl, tcp), chosen among them as te_submit chooses;
 * when none reaches the peer (or the forced transport is not one) the call
 * fails with TE_ERR_NOT_SUPPORTED and starts nothing: the buffer's own key
 * never stands in for the window. The remote range must still lie inside
 * one buffer of the segment's descriptor. The target checks every access:
 * a range not inside the window's ranges, a window revoked or never granted
 * (window keys are marked as such, so the target tells them from buffer
 * keys), or (with a cluster secret) one granted to another engine fails the
 * task with TE_ERR_ACCESS_DENIED (te_wait, te_task_status), never with
 * TE_ERR_STALE_DESCRIPTOR: a fresh descriptor would not help. A refused
 * task lands nothing. (ABI 1.4)
 * Blocks: like te_submit | Thread-safe: yes | Errors: as te_submit, plus
 * TE_ERR_NOT_SUPPORTED (a request under a window and no transport that
 * enforces windows reaches its peer). */
int te_submit_windows(te_batch_t batch, const te_request_t *requests, const uint64_t *windows, size_t n);

/* te_submit_windows_with_notify submits like te_submit_windows and sends
 * the notification as te_submit_with_notify does (windows NULL: exactly
 * te_submit_with_notify). (ABI 1.4)
 * Blocks: like te_submit | Thread-safe: yes | Errors: as
 * te_submit_windows, plus TE_ERR_TOO_LARGE (name over 4096 bytes or msg
 * over 16 MiB). */
int te_submit_windows_with_notify(te_batch_t batch, const te_request_t *requests, const uint64_t *windows, size_t n,
                                  const char *segment, const char *name, const char *msg, size_t msg_len);

/* te_task_status fills *out with the state of task index.
 * Blocks: no | Thread-safe: yes, also against te_batch_reset, te_free_batch
 * and te_destroy on other threads (the task is then TE_TASK_INVALID) |
 * Errors: TE_ERR_INVALID_ARGUMENT (index not yet submitted, batch reset or
 * freed, handle not open). On every error but a NULL out, out->state is
 * TE_TASK_INVALID. */
int te_task_status(te_batch_t batch, size_t index, te_task_status_t *out);

/* te_batch_status fills *out with the batch's summary.
 * Blocks: no | Thread-safe: yes | Errors: handle and pointer only. */
int te_batch_status(te_batch_t batch, te_batch_status_t *out);

/* te_wait waits until every submitted task has finished or timeout_ms has
 * passed (negative: no limit; 0: just look). out may be NULL; when given it
 * is filled in every case. A batch with nothing submitted returns 0 at once.
 * Blocks: yes, up to timeout_ms (tasks themselves end within the engine's
 * transfer timeout) | Thread-safe: yes, several threads may wait on one
 * batch | Errors: TE_ERR_TIMEOUT (time ran out first; the tasks go on), else
 * the code of the first task that did not complete (e.g.
 * TE_ERR_PEER_UNREACHABLE, TE_ERR_ACCESS_DENIED, TE_ERR_TIMEOUT). */
int te_wait(te_batch_t batch, int64_t timeout_ms, te_batch_status_t *out);

/* te_batch_fd stores in *fd an eventfd that becomes readable each time every
 * task submitted so far has finished, for event loops (epoll, poll, asyncio's
 * add_reader): wait for readability, then read 8 bytes to reset it and look
 * at te_batch_status. The batch owns the fd: do not close it; te_free_batch
 * does. The same fd is returned on every call.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_NO_MEMORY (no eventfd). */
int te_batch_fd(te_batch_t batch, int32_t *fd);

/* te_batch_cancel ends every pending task of the batch early: each ends
 * TE_TASK_CANCELED (or with its real outcome if it finished first) once its
 * transport has stopped touching its memory, which te_wait then reports. A
 * task's terminal state is always such a fence. Tasks of a te_submit still
 * running in another thread are not yet pending and are not canceled.
 * (ABI 1.2)
 * Blocks: no (does not wait for the tasks to end, nor for a te_submit on the
 * network) | Thread-safe: yes | Errors: handle only. */
int te_batch_cancel(te_batch_t batch);

/* te_batch_reset empties a finished batch so its slots take new requests:
 * a reused batch allocates nothing per request. (ABI 1.2)
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_BATCH_BUSY (tasks pending:
 * wait first; or a te_submit on the batch is running in another thread). */
int te_batch_reset(te_batch_t batch);

/* te_free_batch releases the batch and its handle.
 * Blocks: no (not even while a te_submit on the batch waits on the network
 * in another thread) | Thread-safe: yes | Errors: TE_ERR_BATCH_BUSY (tasks
 * pending: wait first; or a te_submit on the batch is running: the handle
 * stays valid), TE_ERR_INVALID_ARGUMENT (also for a batch freed before). */
int te_free_batch(te_batch_t batch);

/* ---- Notifications and probes ------------------------------------------ */

/* te_notify_send delivers (name, msg) to the named segment's engine and
 * waits until it is queued there. msg is msg_len bytes (NULL when 0).
 * 0 means queued once: a send whose reply was lost with its connection is
 * resent with the same id, and the receiver does not queue it twice (a
 * peer of a version before 1.4 gets no id: the lost reply is an error).
 * Blocks: yes (RPC timeout) | Thread-safe: yes | Errors: TE_ERR_TOO_LARGE
 * (name over 4096 bytes, msg over 16 MiB), TE_ERR_PEER_UNREACHABLE,
 * TE_ERR_TIMEOUT, TE_ERR_RESOURCE_EXHAUSTED (the receiver's queue or its
 * notification bytes for this sender are full: nothing was queued),
 * TE_ERR_AUTH (the peer holds another cluster secret),
 * TE_ERR_INVALID_ARGUMENT (segment name not host:port in P2P mode). */
int te_notify_send(te_engine_t engine, const char *segment, const char *name, const char *msg, size_t msg_len);

/* te_notify_drain removes the notifications received so far and returns them
 * oldest first: *out points to *count entries in one block allocated by the
 * library (NULL when *count is 0). Free it with te_notify_free.
 * Blocks: no | Thread-safe: yes (each notification goes to one caller) |
 * Errors: TE_ERR_NO_MEMORY (allocation failed; the drained notifications are
 * lost). */
int te_notify_drain(te_engine_t engine, te_notify_t **out, size_t *count);

/* te_notify_drain_from is te_notify_drain with each notification's proven
 * sender (te_notify_from_t). Free the block with te_notify_free.
 * Blocks: no | Thread-safe: yes (each notification goes to one caller) |
 * Errors: as te_notify_drain. (ABI 1.4) */
int te_notify_drain_from(te_engine_t engine, te_notify_from_t **out, size_t *count);

/* te_notify_free frees what te_notify_drain or te_notify_drain_from
 * returned (cast the latter's pointer); NULL is accepted.
 * Blocks: no | Thread-safe: yes | Errors: none. */
int te_notify_free(te_notify_t *list);

/* te_probe checks that the named segment's engine answers; out (may be NULL)
 * receives its identity and the round-trip time.
 * Blocks: yes (RPC timeout) | Thread-safe: yes | Errors:
 * TE_ERR_PEER_UNREACHABLE, TE_ERR_TIMEOUT, TE_ERR_SEGMENT_NOT_FOUND,
 * TE_ERR_AUTH (the peer holds another cluster secret),
 * TE_ERR_INVALID_ARGUMENT (name not host:port in P2P mode). */
int te_probe(te_engine_t engine, const char *segment, te_probe_t *out);

/* ---- KV-cache layouts (ABI 1.1) ---------------------------------------- */

/* te_layout_create parses and validates a layout (JSON, see above): known
 * format, dtype and order, positive dimensions, one base address per layer
 * in the form the format needs, no overlapping tensors. Unknown JSON fields
 * are refused. On failure *out is 0.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT (the
 * message names the field), TE_ERR_TOO_LARGE (JSON over 16 MiB). */
int te_layout_create(const char *json, te_layout_t *out);

/* te_layout_bytes reads only the shape of a layout JSON (base addresses may
 * be absent) and stores the bytes of one block of one component in
 * *block_bytes and of one layer in *layer_bytes (either may be NULL): what
 * to allocate before the addresses are known.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT,
 * TE_ERR_TOO_LARGE. */
int te_layout_bytes(const char *json, uint64_t *block_bytes, uint64_t *layer_bytes);

/* te_layout_info fills *out (out->size set by the caller) with the layout's
 * summary.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT
 * (out->size not set). */
int te_layout_info(te_layout_t layout, te_layout_info_t *out);

/* te_layout_regions copies up to cap of the memory ranges the layout
 * occupies (one per tensor, in layer order: what to register with
 * te_register_batch) into out (NULL when cap is 0) and stores their number
 * in *count.
 * Blocks: no | Thread-safe: yes | Errors: handle and pointer only. */
int te_layout_regions(te_layout_t layout, te_span_t *out, size_t cap, size_t *count);

/* te_layout_free releases a layout handle. Plans and transfers made from it
 * keep their own copy.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT (also for
 * a handle freed before). */
int te_layout_free(te_layout_t layout);

/* ---- Transfer plans (ABI 1.1) ------------------------------------------ */

/* te_plan_create plans the copy of source block src_blocks[i] to
 * destination block dst_blocks[i] (n_src == n_dst) for layers
 * [layer_begin, layer_end) (model-wide indexes; 0, 0: every layer of the
 * source), K and V, of the KV heads both layouts hold. The layouts must
 * agree on dtype, block size and head dim and be both MLA or both not; they
 * may differ in format, order and tensor-parallel head range. Source ids may
 * repeat, destination ids may not. On failure *out is 0.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT
 * (mismatched layouts, block id out of range, duplicate destination block,
 * empty or unequal lists, layer range outside a layout), TE_ERR_TOO_LARGE
 * (over 16777216 transfers). */
int te_plan_create(te_layout_t src, te_layout_t dst, const int32_t *src_blocks, size_t n_src,
                   const int32_t *dst_blocks, size_t n_dst, int32_t layer_begin, int32_t layer_end,
                   te_plan_t *out);

/* te_plan_stats fills *out (out->size set by the caller).
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT
 * (out->size not set). */
int te_plan_stats(te_plan_t plan, te_plan_stats_t *out);

/* te_plan_transfers copies up to cap copies of model-wide layer `layer`
 * (TE_PLAN_ALL_LAYERS: the whole plan, coalesced across layers) into out
 * (NULL when cap is 0) and stores their number in *count.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT (layer
 * outside the plan). */
int te_plan_transfers(te_plan_t plan, int32_t layer, te_plan_transfer_t *out, size_t cap, size_t *count);

/* te_plan_submit_layer submits layer `layer` of the plan to the batch and
 * returns without waiting (te_wait on the batch after the last layer). The
 * plan runs from source to destination: with TE_WRITE this process holds the
 * source and segment is the destination's engine (push); with TE_READ this
 * process holds the destination and segment is the source's (pull). The
 * batch needs room for the layer's requests (te_plan_stats:
 * max_layer_requests per layer); batch and segment must come from one
 * engine.
 * Blocks: like te_submit | Thread-safe: yes | Errors: as te_submit, plus
 * TE_ERR_INVALID_ARGUMENT (layer outside the plan, opcode, segment of
 * another engine). */
int te_plan_submit_layer(te_batch_t batch, te_segment_t segment, te_plan_t plan, int32_t layer, int32_t opcode);

/* te_plan_submit submits the whole plan (te_plan_stats: merged requests),
 * like te_plan_submit_layer for every layer at once.
 * Blocks: like te_submit | Thread-safe: yes | Errors: as
 * te_plan_submit_layer. */
int te_plan_submit(te_batch_t batch, te_segment_t segment, te_plan_t plan, int32_t opcode);

/* te_plan_free releases a plan handle.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT (also for
 * a handle freed before). */
int te_plan_free(te_plan_t plan);

/* ---- Prefill-to-decode handoff through te-sidecar (ABI 1.1) ------------ */

/* te_handoff_create returns a handoff client for the engine and the
 * te-sidecar at sidecar ("host:port" or "http://host:port"). It contacts
 * nothing yet. On failure *out is 0.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_INVALID_ARGUMENT (empty or
 * malformed address). */
int te_handoff_create(te_engine_t engine, const char *sidecar, te_handoff_t *out);

/* te_handoff_destroy releases the client: transfers of it that no wait or
 * abort has ended are aborted (each waits at most 10 s for its moving side
 * to stop; te-sidecar expires the rest), and its transfer handles become
 * invalid.
 * Blocks: yes, while it aborts | Thread-safe: yes | Errors:
 * TE_ERR_INVALID_ARGUMENT (also for a second call). */
int te_handoff_destroy(te_handoff_t client);

/* te_handoff_expect declares, on the decode side, where transfer `id` (the
 * serving system's request id, at most 256 printable bytes; both sides use
 * the same) must go: this engine's layout and its n block ids in token
 * order. mode is TE_HANDOFF_MODE_DEFAULT (push), _PUSH or _PULL.
 * timeout_ms bounds the transfer from now (0: te-sidecar's default, 30 s):
 * unpaired or unfinished by then it expires. Then call te_handoff_wait. On
 * failure *out is 0.
 * Blocks: yes, one te-sidecar call (5 s at most) | Thread-safe: yes |
 * Errors: TE_ERR_INVALID_ARGUMENT (layout, id, mode, negative timeout, a
 * declaration that does not match prefill's: dtype, block size, block
 * counts), TE_ERR_PEER_UNREACHABLE and TE_ERR_TIMEOUT (te-sidecar),
 * TE_ERR_AUTH (with the cluster secret in the environment, the server at
 * the sidecar address did not prove it holds it: the token was not sent; or
 * te-sidecar refused this process's token), TE_ERR_CANCELED (prefill
 * aborted it first). */
int te_handoff_expect(te_handoff_t client, const char *id, te_layout_t layout, const int32_t *blocks, size_t n,
                      int32_t mode, int64_t timeout_ms, te_xfer_t *out);

/* te_handoff_ready declares, on the prefill side, that transfer `id`'s KV
 * can be taken from these n block ids of this engine's layout, prefill's
 * i-th block going to decode's i-th. In pull mode the KV must be complete
 * now; in push mode it moves with te_handoff_send_layer and te_handoff_send,
 * so ready may come before the layers are computed. mode: DEFAULT accepts
 * decode's choice. Arguments and errors as te_handoff_expect.
 * Blocks: yes, one te-sidecar call | Thread-safe: yes */
int te_handoff_ready(te_handoff_t client, const char *id, te_layout_t layout, const int32_t *blocks, size_t n,
                     int32_t mode, int64_t timeout_ms, te_xfer_t *out);

/* te_handoff_send_layer pushes model-wide layer `layer` as soon as it is
 * computed and returns without waiting for it to arrive, so that it moves
 * while the next layer is computed. Prefill side, push mode only. The first
 * call waits up to timeout_ms (negative: no limit) for decode's declaration.
 * te_handoff_send then sends the layers not sent and waits for all.
 * Blocks: until decode has declared, then like te_submit | Thread-safe: call
 * it and te_handoff_send from one thread | Errors: TE_ERR_INVALID_ARGUMENT
 * (decode side, pull mode, layer outside the layouts or sent before, the
 * transfer finished), TE_ERR_TIMEOUT (decode did not declare in time), the
 * transfer's end (TE_ERR_CANCELED aborted, TE_ERR_TIMEOUT expired), and
 * te_submit's errors. */
int te_handoff_send_layer(te_xfer_t xfer, int32_t layer, int64_t timeout_ms);

/* te_handoff_wait finishes the transfer on this side and returns once this
 * side's memory is no longer touched for it. The moving side (prefill in
 * push mode, decode in pull mode) waits for the pairing, submits what is not
 * yet submitted, waits for its transfers and reports to te-sidecar; the
 * other side waits for the mover's completion notification or for te-sidecar
 * to report a failure, an abort or an expiry. timeout_ms (negative: no
 * limit) bounds the waiting for the peer: when it runs out the call returns
 * TE_ERR_TIMEOUT and the transfer goes on (wait again, or abort). Once the
 * moving side has submitted, it returns only after its transfers ended
 * (within the engine's transfer timeout). out may be NULL; when given
 * (out->size set) it is filled in every case.
 * Blocks: yes | Thread-safe: yes (waits on one transfer are serialised) |
 * Errors: TE_ERR_TIMEOUT (timeout_ms ran out, or the transfer expired),
 * TE_ERR_CANCELED (aborted), TE_ERR_TRANSFER_LOST (te-sidecar restarted or
 * dropped it: release the blocks, do not wait again), TE_ERR_INVALID_ARGUMENT
 * (the two declarations do not match), the mover's transport errors. */
int te_handoff_wait(te_xfer_t xfer, int64_t timeout_ms, te_handoff_result_t *out);

/* te_handoff_send is te_handoff_wait under the name the prefill side uses.
 * Blocks: yes | Thread-safe: yes | Errors: as te_handoff_wait. */
int te_handoff_send(te_xfer_t xfer, int64_t timeout_ms, te_handoff_result_t *out);

/* te_handoff_abort gives the transfer up (reason may be NULL) and returns
 * once neither side's memory is touched for it any more, so the blocks can
 * be released; the peer's wait fails with TE_ERR_CANCELED.
 * Blocks: yes, until the moving side stopped (at most the transfer's
 * timeout) | Thread-safe: yes, also while another thread waits |
 * Errors: TE_ERR_INVALID_ARGUMENT (the transfer is already done),
 * TE_ERR_TRANSFER_LOST, TE_ERR_PEER_UNREACHABLE (te-sidecar). */
int te_handoff_abort(te_xfer_t xfer, const char *reason);

/* te_handoff_status asks te-sidecar for the transfer's state and fills *out
 * (out->size set by the caller).
 * Blocks: yes, one te-sidecar call | Thread-safe: yes | Errors:
 * TE_ERR_TRANSFER_LOST (te-sidecar restarted or no longer knows it),
 * TE_ERR_PEER_UNREACHABLE, TE_ERR_TIMEOUT. */
int te_handoff_status(te_xfer_t xfer, te_handoff_status_t *out);

/* te_handoff_free releases a transfer handle. A transfer that no wait or
 * abort has ended is aborted first (waiting at most 10 s), so a freed handle
 * never leaves blocks in use.
 * Blocks: only to abort | Thread-safe: yes; a wait on it in another thread
 * returns | Errors: TE_ERR_INVALID_ARGUMENT (also for a handle freed
 * before). */
int te_handoff_free(te_xfer_t xfer);

/* ---- Metadata stores (ABI 1.4) ------------------------------------------ */

/* A store handle is a connection to one of te's metadata stores, for
 * programs that keep their own records beside te's segments (NIXL's agent
 * metadata, for one). It belongs to no engine: te_destroy leaves it. Keys
 * are at most 4096 bytes, values at most 64 MiB; the store may hold less
 * (etcd's default request limit is 1.5 MiB). */
typedef uint64_t te_store_t;

/* te_store_open connects to the store conn names: "etcd://h1:p1,h2:p2"
 * (etcds:// for TLS; TE_ETCD_* set the TLS files and etcd's user),
 * "redis://host:port", "http://host:port/metadata" or "mem://NAME" (in this
 * process only), with the options of te_config_t.metadata (?ttl=, timeout=,
 * cluster=). It does not wait for the store to answer (with an etcd user it
 * authenticates first): an unreachable store shows in the first calls. On
 * failure *out is 0.
 * Blocks: no (with an etcd user: up to the timeout) | Thread-safe: yes |
 * Errors: TE_ERR_INVALID_ARGUMENT (P2PHANDSHAKE, a malformed connection
 * string or option), TE_ERR_NOT_SUPPORTED (unknown scheme, or a library
 * built without that store), TE_ERR_METADATA. */
int te_store_open(const char *conn, te_store_t *out);

/* te_store_put writes len bytes of value at key. On etcd the key lives
 * under the handle's lease, kept alive in the background: it disappears when
 * the handle is closed, or one lease TTL (10 s by default) after the process
 * dies. A write that fails because the store is unreachable is still
 * returned as an error, and is made once the store answers again unless a
 * later put or delete of that key replaced it.
 * Blocks: yes, up to the store's timeout (5 s by default) | Thread-safe: yes
 * | Errors: TE_ERR_TOO_LARGE (key or value over the bounds above),
 * TE_ERR_METADATA (the store refused or cannot be reached), TE_ERR_TIMEOUT,
 * TE_ERR_CLOSED. */
int te_store_put(te_store_t store, const char *key, const void *value, size_t len);

/* te_store_get copies the value at key into buf (cap bytes; buf may be NULL
 * when cap is 0) and stores its length in *len. A value longer than cap is
 * TE_ERR_BUFFER_TOO_SMALL with *len its length, so the caller can retry with
 * a buffer that holds it.
 * Blocks: yes, up to the store's timeout | Thread-safe: yes | Errors:
 * TE_ERR_NOT_FOUND (no such key), TE_ERR_BUFFER_TOO_SMALL,
 * TE_ERR_TOO_LARGE (key), TE_ERR_METADATA, TE_ERR_TIMEOUT, TE_ERR_CLOSED. */
int te_store_get(te_store_t store, const char *key, void *buf, size_t cap, size_t *len);

/* te_store_delete removes key; a key that is not there is no error. Fails,
 * and is retried, as te_store_put does.
 * Blocks: yes, up to the store's timeout | Thread-safe: yes | Errors: as
 * te_store_put. */
int te_store_delete(te_store_t store, const char *key);

/* te_store_watch watches every key under prefix (prefix itself included)
 * until te_store_unwatch or te_store_close: te_store_changes then lists the
 * keys that were put or deleted. After a lost connection to the store,
 * when changes may have been missed, the prefix itself is listed: treat
 * every key under it as changed. Watching a prefix watched already is a
 * no-op. At most 4096 prefixes per handle.
 * Blocks: yes, until the store confirmed the watch, at most the store's
 * timeout (the watch then starts when the store answers) | Thread-safe: yes
 * | Errors: TE_ERR_NOT_SUPPORTED (the store does not push changes: only
 * etcd does), TE_ERR_RESOURCE_EXHAUSTED (4096 prefixes watched),
 * TE_ERR_TOO_LARGE (prefix over 4096 bytes), TE_ERR_CLOSED. */
int te_store_watch(te_store_t store, const char *prefix);

/* te_store_unwatch stops watching prefix (its changes not yet read stay
 * listed until read); a prefix not watched is no error.
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_TOO_LARGE (prefix). */
int te_store_unwatch(te_store_t store, const char *prefix);

/* te_store_changes moves the keys changed since the last call into buf,
 * each once and NUL-terminated, one after the other, and stores their
 * total length (NULs included) in *len; 0 when nothing changed. When they
 * do not fit in cap bytes it is TE_ERR_BUFFER_TOO_SMALL, *len the length
 * needed, and nothing is taken. Over 65536 keys or 1 MiB not yet read, the
 * keys are replaced by their watched prefixes (everything changed).
 * Blocks: no | Thread-safe: yes | Errors: TE_ERR_BUFFER_TOO_SMALL. */
int te_store_changes(te_store_t store, char *buf, size_t cap, size_t *len);

/* te_store_close releases the handle and ends its watches: on etcd it
 * revokes the lease, so the keys this handle put are gone when it returns (or, etcd unreachable, at
 * the end of the lease TTL). Calls in flight on the handle in other threads
 * complete or fail with TE_ERR_CLOSED.
 * Blocks: yes, up to the store's timeout | Thread-safe: yes | Errors:
 * TE_ERR_INVALID_ARGUMENT (also for a handle closed before). */
int te_store_close(te_store_t store);

#ifdef __cplusplus
}
#endif

#endif /* TE_H */
