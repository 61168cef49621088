"""mooncake.engine on top of te: Mooncake's TransferEngine Python API.

Method names, arguments, defaults and return conventions follow Mooncake's
binding (mooncake-integration/transfer_engine/transfer_engine_py.cpp):
methods return 0 on success and a negative number on failure (never raise
for a failed transfer); the asynchronous calls (batch_transfer_async*,
transfer_submit_write) return a batch id that is 0 on failure;
allocate_managed_buffer returns 0 on failure. The negative numbers are te's
error codes (te.h TE_ERR_*), more specific than Mooncake's -1; callers that
test "!= 0" or "< 0" see no difference.

Authentication: the engine reads $TE_AUTH_SECRET_FILE or $TE_AUTH_SECRET
(the cluster secret) and $TE_ACCEPT_MOONCAKE_PEERS=1 (let real Mooncake
peers in over tcp) itself; set them in the environment of every process,
before initialize: the engine reads te's variables when it is created.

Differences a caller may notice:

* protocol is advisory among what te has: te picks the best transport both
  engines have (local, shm, rdma, tcp, cuda). "rdma" on a machine without
  RDMA, "nvlink" or "nvlink_intra" log a warning and fall back.
  MC_FORCE_TCP=1 forces tcp, as in Mooncake.
* Refused (initialize returns TE_ERR_NOT_SUPPORTED, -10, with a log line
  saying why): protocols of hardware te has no transport for: "ascend"
  (Ascend NPUs; also SGLang's hostname form host:port:npu_N with it),
  "efa", "hip", "musa", "cxi", "xgmi". With another protocol, the
  host:port:npu_N form is taken as host:port and the NPU is ignored, with
  a warning. The module flags SUPPORT_EFA, SUPPORT_HIP, SUPPORT_MNNVL,
  SUPPORT_MUSA and SUPPORT_INTRA_NVLINK are False; SUPPORT_CUDA is True
  when the CUDA driver can be loaded (te then moves GPU memory).
* get_engine() returns te's engine (a te.Engine), not Mooncake's C++ one:
  mooncake.store (SGLang's HiCache with SGLANG_HICACHE_MOONCAKE_REUSE_TE)
  cannot share it and rejects it; let the store start its own engine.
  get_engine_ptr() returns 0 for the same reason, which mooncake.pg and
  mooncake.ep read as "no engine to share".
* transfer_*_on_cuda (CUDA-stream-triggered transfers) are not provided.
* Files: Mooncake's TransferEngine binding has no call that registers a
  file (its nvmeof/GDS/io_uring backends are reached through Mooncake Store
  and segment configuration, not this API), so there is nothing to mirror;
  te's storage buffers are reached through te.Engine.register_file, and a
  segment that holds one is read and written here like any other.
* transport_hint is accepted and ignored, as in Mooncake builds without TENT.
* allocate_managed_buffer pools like Mooncake: sizes up to 256 MiB come
  from power-of-two classes (8 KiB and up) carved from 2 GiB mappings
  registered once; larger buffers are mapped and registered on their own.
  free_managed_buffer of an address it did not hand out returns 0 (as
  Mooncake) and logs a warning; a freed address is never handed out twice.
* MC_TRANSFER_TIMEOUT (seconds, at least 5) bounds each transfer, as in
  Mooncake; sync calls block until their transfers end. A value that is not
  a whole number of seconds, or an MC_FORCE_TCP that is not 1/0 (true/false,
  yes/no, on/off), makes initialize return TE_ERR_INVALID_ARGUMENT (-1) and
  log the variable, rather than be ignored.
* Every te engine setting has an environment variable (README.md,
  "Environment"): TE_ALLOW_MOONCAKE_WITH_SECRET=1, TE_TCP_LISTEN=host:port
  (pins the tcp data port), TE_TCP_DEVICES=eth0,eth1 (a tcp data endpoint per
  NIC, striped over; docs/tcp-multi-nic.md), TE_PARAM_tcp_conns=8, TE_MAX_CONNS, TE_LOG_LEVEL
  (also the level of this module's Python logger), TE_METRICS_ADDR, ...
  initialize refuses (TE_ERR_INVALID_ARGUMENT, logged) a value that does
  not parse, naming the variable. local_hostname's port, when given, pins
  the RPC port; without one TE_LISTEN_ADDR may.
* Calls before initialize (get_rpc_port, register_memory, transfers...)
  return TE_ERR_INVALID_ARGUMENT (-1), or 0 where Mooncake's sentinel is 0,
  and log "initialize first"; Mooncake's binding crashes there.

GPU memory: as in Mooncake, register_memory(tensor.data_ptr(), tensor.nbytes)
and batch_register_memory(ptrs, sizes) register with location "*", so te
detects device memory from the pointer (cuda:N, or hip:N for AMD GPUs)
through the GPU runtimes that load.
Tensor objects themselves are accepted too (capacity may then be omitted):
they register at their own device, "cuda:N" for a CUDA tensor, which fails
cleanly (NotSupported, -10) in a process without CUDA.
"""

import ctypes
import enum
import json
import logging
import mmap
import os
import re
import threading

import te

log = logging.getLogger("mooncake.engine")

P2PHANDSHAKE = "P2PHANDSHAKE"

# Mooncake's build flags: which transports and memories this module serves.
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False

# Protocols of hardware te has no transport for: initialize refuses them.
_REFUSED_PROTOCOLS = {
    "ascend": "Ascend NPUs",
    "efa": "AWS EFA",
    "hip": "AMD GPUs (HIP)",
    "musa": "Moore Threads GPUs (MUSA)",
    "cxi": "HPE Slingshot (CXI)",
    "xgmi": "AMD xGMI",
}


def _cuda_loadable():
    """Whether the CUDA driver loads here: te's cuda transport then moves GPU
    memory. Loads the driver library only (no libte, no cuInit)."""
    try:
        ctypes.CDLL(os.environ.get("TE_CUDA_LIBRARY") or "libcuda.so.1")
        return True
    except OSError:
        return False


_lazy = {}


def __getattr__(name):
    # SUPPORT_CUDA is computed on first use, not at import.
    if name == "SUPPORT_CUDA":
        if name not in _lazy:
            _lazy[name] = _cuda_loadable()
        return _lazy[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TransferOpcode(enum.IntEnum):
    """Read or Write (also READ, WRITE), numbered as Mooncake's opcodes."""

    Read = 0
    Write = 1
    READ = 0
    WRITE = 1


Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification: (name, msg)."""

    def __init__(self, name="", msg=""):
        self.name = name
        self.msg = msg

    def __eq__(self, other):
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name, other.msg)

    def __repr__(self):
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"


_NPU_FORM = re.compile(r"^(.*):(\d+):npu_(\d+)$")


def _split_host(local_hostname):
    """host, port (0 when absent) and NPU id (None when absent) of "host",
    "host:port", "[v6]:port" or SGLang's Ascend form "host:port:npu_N"."""
    s = local_hostname or ""
    npu = None
    m = _NPU_FORM.match(s)
    if m:
        s, npu = f"{m.group(1)}:{m.group(2)}", int(m.group(3))
    if s.startswith("["):
        host, _, rest = s[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:] else 0, npu
    if s.count(":") == 1:
        host, port = s.split(":")
        return host, int(port) if port else 0, npu
    return s, 0, npu


def _conn_string(metadata_server, metadata_type):
    if metadata_server == P2PHANDSHAKE:
        return P2PHANDSHAKE
    if "://" in metadata_server:
        return metadata_server
    return f"{metadata_type}://{metadata_server}"


def _show(addr):
    if te.tensors.is_tensor(addr):
        return f"tensor at {int(addr.data_ptr()):#x} on {te.location_of(addr)}"
    try:
        return f"{int(addr):#x}"
    except (TypeError, ValueError):
        return repr(addr)


class _Engine(te.Engine):
    """te's engine under the drop-in. Its repr says what it is, because
    pybind11 shows it when Mooncake's own modules (mooncake.store) are handed
    it in place of their C++ engine and refuse it."""

    def __repr__(self):
        return (f"<te.Engine {self.name!r}: te's engine, not Mooncake's C++ TransferEngine; "
                "mooncake.store and mooncake.pg cannot share it>") if not self.closed else "<te.Engine (closed)>"


def _rc(e):
    """The negative return value for a te error (or -1 for anything else)."""
    if isinstance(e, te.TeError) and e.code:
        return -e.code
    return -1


# Managed-buffer pool: Mooncake's size classes (8 KiB << i, i < 16) and the
# size of the mappings they are carved from.
_CLASS_BYTES = [(8 << 10) << i for i in range(16)]
_POOL_BYTES = 2 << 30


class _Pool:
    """allocate_managed_buffer's memory. Each class keeps a stack of free
    buffers; an empty class splits a buffer of the next class, the largest
    class takes a fresh 2 GiB mapping registered with the engine once.
    Anonymous mappings reserve no memory until touched. Not thread-safe:
    the caller holds a lock."""

    def __init__(self, owner):
        self._owner = owner
        self._free = [[] for _ in _CLASS_BYTES]
        self._slabs = []  # pooled mappings, registered
        self._large = {}  # address -> mapping of a buffer over the largest class
        self._used = {}  # address -> class of a buffer handed out

    @staticmethod
    def _class_of(n):
        for i, size in enumerate(_CLASS_BYTES):
            if n <= size:
                return i
        return -1

    def _map(self, n):
        m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0))
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        try:
            self._owner._engine.register(addr, n, location="*")
        except BaseException:
            m.close()
            raise
        return m, addr

    def _split(self, c):
        """Refill class c from class c+1 (or a new mapping for the largest)."""
        if c == len(_CLASS_BYTES) - 1:
            m, addr = self._map(_POOL_BYTES)
            self._slabs.append(m)
            size = _CLASS_BYTES[c]
            self._free[c].extend(addr + off for off in range(_POOL_BYTES - size, -1, -size))
            return
        if not self._free[c + 1]:
            self._split(c + 1)
        base = self._free[c + 1].pop()
        self._free[c].extend((base + _CLASS_BYTES[c], base))

    def allocate(self, n):
        c = self._class_of(n)
        if c < 0:
            m, addr = self._map(n)
            self._large[addr] = m
            return addr
        if not self._free[c]:
            self._split(c)
        addr = self._free[c].pop()
        self._used[addr] = c
        return addr

    def free(self, addr):
        c = self._used.pop(addr, None)
        if c is not None:
            self._free[c].append(addr)
            return True
        m = self._large.pop(addr, None)
        if m is None:
            return False
        try:
            self._owner._engine.unregister(addr)
        except te.TeError as e:
            log.error("free_managed_buffer(%#x): %s", addr, e)
        m.close()
        return True

    def close(self):
        """Unmap everything (the engine, closed first, unregistered it)."""
        for m in self._slabs + list(self._large.values()):
            m.close()
        self._slabs, self._large, self._used = [], {}, {}
        self._free = [[] for _ in _CLASS_BYTES]


class _NotInitialized:
    """TransferEngine's engine before initialize: every use raises
    te.InvalidArgument, which the methods turn into their failure value."""

    def __bool__(self):
        return False

    def __getattr__(self, name):
        raise te.InvalidArgument("TransferEngine is not initialized: call initialize() first")


_NOT_INITIALIZED = _NotInitialized()

_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
               "off": False}


def _env_bool(name):
    """The value of a yes/no variable (False when unset); ValueError names
    the variable when it says neither."""
    v = os.environ.get(name, "").strip().lower()
    if v == "":
        return False
    if v not in _BOOL_WORDS:
        raise ValueError(f"{name}={os.environ[name]!r}: want 1 or 0 (also true/false, yes/no, on/off)")
    return _BOOL_WORDS[v]


class TransferEngine:
    """Mooncake's TransferEngine on te: create it, initialize() it, then
    register memory and transfer as with Mooncake's binding (the module
    docstring says what differs)."""

    TransferOpcode = TransferOpcode

    def __init__(self):
        self._engine = _NOT_INITIALIZED
        self._segments = {}
        self._seg_lock = threading.Lock()
        self._pool = _Pool(self)
        self._managed_lock = threading.Lock()
        self._batches = {}  # batch id -> te.Batch of the async calls

    # -- initialisation ---------------------------------------------------
    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        """Start the engine. metadata_server: "P2PHANDSHAKE", a URL with a
        scheme (etcd://, http://, redis://), or host:port of etcd."""
        if metadata_server == P2PHANDSHAKE:
            return self.initialize_ext(local_hostname, P2PHANDSHAKE, protocol, device_name, "")
        if "://" in metadata_server:
            scheme, _, rest = metadata_server.partition("://")
            return self.initialize_ext(local_hostname, rest, protocol, device_name, scheme)
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "etcd")

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name, metadata_type):
        """initialize with the metadata type given apart ("etcd", "http", "redis"; "" with
        P2PHANDSHAKE); 0 on success, a negative te error code on failure (logged)."""
        if self._engine:
            log.warning("TransferEngine.initialize called twice; keeping the first engine")
            return 0
        proto = (protocol or "").lower()
        if proto in _REFUSED_PROTOCOLS:
            log.error("protocol %r: te has no transport for %s; use rdma or tcp (te.h, README: what te refuses)",
                      protocol, _REFUSED_PROTOCOLS[proto])
            return -te.NotSupported.code
        conn = _conn_string(metadata_server, metadata_type)
        try:
            host, port, npu = _split_host(local_hostname)
        except ValueError:
            log.error("local_hostname %r is not host[:port]", local_hostname)
            return -te.InvalidArgument.code
        if npu is not None:
            log.warning("local_hostname %r names Ascend NPU %d; te has no NPU support and uses %s:%d", local_hostname,
                        npu, host, port)
            local_hostname = f"{host}:{port}"
        # ":port" binds the host the engine advertises (local_hostname),
        # not every interface. Without a port the engine picks one, or
        # TE_LISTEN_ADDR does.
        kw = {"metadata": conn, "hostname": host or None}
        if port:
            kw["listen_addr"] = f":{port}"
        if conn != P2PHANDSHAKE:
            kw["segment_name"] = local_hostname
        t = os.environ.get("MC_TRANSFER_TIMEOUT", "").strip()
        if t:
            try:
                kw["transfer_timeout"] = max(5, int(t))
            except ValueError:
                log.error("initialize: MC_TRANSFER_TIMEOUT=%r: want a whole number of seconds", t)
                return -te.InvalidArgument.code
        try:
            force_tcp = _env_bool("MC_FORCE_TCP")
        except ValueError as e:
            log.error("initialize: %s", e)
            return -te.InvalidArgument.code
        if force_tcp:
            kw["force_transport"] = "tcp"
        if device_name:
            # Mooncake's device filter: the RDMA NICs to use.
            kw["params"] = {"rdma.devices": device_name}
        # No auth arguments: the engine reads TE_AUTH_SECRET_FILE,
        # TE_AUTH_SECRET and TE_ACCEPT_MOONCAKE_PEERS itself.
        try:
            self._engine = _Engine(**kw)
        except te.TeError as e:
            log.error("initialize: %s", e)
            return _rc(e)
        have = self._engine.stats().get("transports", [])
        if proto and proto not in have:
            log.warning("protocol %r is not available here (have %s); falling back to the best available transport",
                        protocol, ", ".join(have))
        return 0

    def get_rpc_port(self):
        """The RPC port peers reach this engine at; before initialize,
        TE_ERR_INVALID_ARGUMENT (-1) with an error logged (Mooncake's binding
        dereferences a null engine there)."""
        try:
            return self._engine.rpc_port
        except te.TeError as e:
            log.error("get_rpc_port: %s", e)
            return _rc(e)

    def get_engine(self):
        """The underlying te.Engine (None before initialize). Mooncake returns
        its C++ engine here, which mooncake.store can share; te's cannot be
        shared with it."""
        return self._engine or None

    def get_engine_ptr(self):
        """0: te has no Mooncake C++ engine whose address native Mooncake code
        (mooncake.pg, mooncake.ep) could use; they read 0 as "none given" and
        start their own."""
        log.warning("get_engine_ptr: te's engine is not a Mooncake C++ engine; returning 0 (nothing to share)")
        return 0

    @staticmethod
    def get_local_topology(device_name=None):
        """This machine's topology as Mooncake's JSON string: every NUMA node
        ("cpu:N") and GPU ("cuda:N") with [[preferred NICs], [other NICs]]
        among the RDMA NICs te sees (device_name: a comma-separated filter)."""
        try:
            return json.dumps(te.local_topology(device_name or None), indent=2, sort_keys=True)
        except te.TeError as e:
            log.error("get_local_topology: %s", e)
            return "{}"

    def warmup_segment(self, segment_name):
        """Connect to segment_name ahead of the first transfer (every tcp
        connection dialed and authenticated, every rdma queue pair
        connected); the segment stays open for the transfers after. Blocks
        until the connections are up. 0, or a negative code."""
        try:
            self._segment(segment_name)
            self._engine.warmup(segment_name)
            return 0
        except te.TeError as e:
            log.error("warmup_segment(%s): %s", segment_name, e)
            self._forget(segment_name, e)
            return _rc(e)

    def warmup_efa_segment(self, segment_name):
        """Mooncake's EFA warm-up: te warms whichever transport reaches the
        segment (warmup_segment). 0, or a negative code."""
        return self.warmup_segment(segment_name)

    # -- memory -----------------------------------------------------------
    def register_memory(self, buffer_addr, capacity=None, location="*"):
        """Register [buffer_addr, +capacity) (or a tensor) for transfers and for peers; 0 or a
        negative code."""
        try:
            if te.tensors.is_tensor(buffer_addr):
                self._engine.register(buffer_addr, capacity, location=location)
                return 0
            self._engine.register(int(buffer_addr), int(capacity), location=location or "*")
            return 0
        except te.TeError as e:
            log.error("register_memory(%s, %s): %s", _show(buffer_addr), capacity, e)
            return _rc(e)

    def unregister_memory(self, buffer_addr):
        """Unregister the range registered at buffer_addr (or the tensor); 0 or a negative code."""
        try:
            self._engine.unregister(buffer_addr if te.tensors.is_tensor(buffer_addr) else int(buffer_addr))
            return 0
        except te.TeError as e:
            log.error("unregister_memory(%s): %s", _show(buffer_addr), e)
            return _rc(e)

    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        """Register several ranges (or tensors) at once, all or none; 0 or a negative code."""
        if len(buffer_addresses) != len(capacities):
            log.error("batch_register_memory: %d addresses, %d capacities", len(buffer_addresses), len(capacities))
            return -te.InvalidArgument.code
        try:
            self._engine.register_batch([(a if te.tensors.is_tensor(a) else int(a), None if c is None else int(c))
                                         for a, c in zip(buffer_addresses, capacities)],
                                        location=location or "*")
            return 0
        except te.TeError as e:
            log.error("batch_register_memory: %s", e)
            return _rc(e)

    def batch_unregister_memory(self, buffer_addresses):
        """Unregister several ranges at once; 0 or a negative code."""
        try:
            self._engine.unregister_batch([a if te.tensors.is_tensor(a) else int(a) for a in buffer_addresses])
            return 0
        except te.TeError as e:
            log.error("batch_unregister_memory: %s", e)
            return _rc(e)

    # -- segments -----------------------------------------------------------
    def _segment(self, name):
        with self._seg_lock:
            s = self._segments.get(name)
            if s is None:
                s = self._engine.open_segment(name)
                self._segments[name] = s
            return s

    def _forget(self, name, err):
        # A peer that is gone or changed: drop the cached handle so the next
        # call opens the segment afresh, as Mooncake does.
        if isinstance(err, (te.SegmentNotFound, te.PeerUnreachable, te.StaleDescriptor)):
            with self._seg_lock:
                s = self._segments.pop(name, None)
            if s is not None:
                try:
                    s.close()
                except te.TeError:
                    pass

    def get_first_buffer_address(self, segment_name):
        """The address of the first buffer the segment publishes, 0 on failure."""
        try:
            bufs = self._segment(segment_name).buffers()
        except te.TeError as e:
            log.error("get_first_buffer_address(%s): %s", segment_name, e)
            return 0
        return bufs[0][0] if bufs else 0

    # -- transfers ----------------------------------------------------------
    def _requests(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode):
        if not (len(buffers) == len(peer_buffer_addresses) == len(lengths)):
            raise te.InvalidArgument("buffers, peer_buffer_addresses and lengths have different sizes")
        if not buffers:
            raise te.InvalidArgument("no buffers")
        seg = self._segment(target_hostname)
        op = te.WRITE if int(opcode) == TransferOpcode.Write else te.READ
        return [(op, int(b), seg, int(p), int(n)) for b, p, n in zip(buffers, peer_buffer_addresses, lengths)]

    def _sync(self, what, target_hostname, buffers, peers, lengths, opcode, notify):
        try:
            reqs = self._requests(target_hostname, buffers, peers, lengths, opcode)
            n = None if notify is None else (target_hostname, notify.name, notify.msg)
            self._engine.transfer(reqs, notify=n)
            return 0
        except te.TeError as e:
            log.error("%s to %s: %s", what, target_hostname, e)
            self._forget(target_hostname, e)
            return _rc(e)

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        """Write length bytes at buffer to peer_buffer_address of target_hostname and wait; 0 or a
        negative code."""
        return self._sync("transfer_sync_write", target_hostname, [buffer], [peer_buffer_address], [length],
                          TransferOpcode.Write, None)

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        """Read length bytes at peer_buffer_address of target_hostname into buffer and wait; 0 or a
        negative code."""
        return self._sync("transfer_sync_read", target_hostname, [buffer], [peer_buffer_address], [length],
                          TransferOpcode.Read, None)

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode, notify=None,
                      transport_hint=""):
        """One transfer of opcode (TransferOpcode.Read or .Write), with an optional TransferNotify
        sent on success, waited for; 0 or a negative code."""
        return self._sync("transfer_sync", target_hostname, [buffer], [peer_buffer_address], [length], opcode,
                          notify)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                  transport_hint=""):
        """Write buffers[i] to peer_buffer_addresses[i] (lengths[i] bytes) in one batch and wait; 0
        or a negative code."""
        return self._sync("batch_transfer_sync_write", target_hostname, buffers, peer_buffer_addresses, lengths,
                          TransferOpcode.Write, None)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        """Read peer_buffer_addresses[i] into buffers[i] in one batch and wait; 0 or a negative code."""
        return self._sync("batch_transfer_sync_read", target_hostname, buffers, peer_buffer_addresses, lengths,
                          TransferOpcode.Read, None)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify=None,
                            transport_hint=""):
        """One batch of opcode, with an optional TransferNotify sent once every transfer completed,
        waited for; 0 or a negative code."""
        return self._sync("batch_transfer_sync", target_hostname, buffers, peer_buffer_addresses, lengths, opcode,
                          notify)

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode,
                             transport_hint=""):
        """Submit and return a batch id (0 on failure) for
        get_batch_transfer_status."""
        b = None
        try:
            reqs = self._requests(target_hostname, buffers, peer_buffer_addresses, lengths, opcode)
            b = self._engine.allocate_batch(len(reqs))
            b.submit(reqs)
        except te.TeError as e:
            log.error("batch_transfer_async to %s: %s", target_hostname, e)
            self._forget(target_hostname, e)
            if b is not None:
                b.free()
            return 0
        self._batches[b.handle] = b
        return b.handle

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                   transport_hint=""):
        """batch_transfer_async with TransferOpcode.Write: a batch id, 0 on failure."""
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses, lengths,
                                         TransferOpcode.Write)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        """batch_transfer_async with TransferOpcode.Read: a batch id, 0 on failure."""
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses, lengths,
                                         TransferOpcode.Read)

    def get_batch_transfer_status(self, batch_ids):
        """Wait for the batches; 0 when all completed, negative when one
        failed. The batches are released either way."""
        rc = 0
        for bid in batch_ids:
            b = self._batches.pop(bid, None)
            if b is None:
                log.error("get_batch_transfer_status: unknown batch id %#x", bid)
                rc = rc or -te.InvalidArgument.code
                continue
            try:
                b.wait()
            except te.TeError as e:
                log.error("batch %#x: %s", bid, e)
                rc = rc or _rc(e)
            finally:
                try:
                    b.free()
                except te.TeError:
                    pass
        return rc

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        """Submit one WRITE; returns a batch id for transfer_check_status, or 0
        on failure (Mooncake's sentinel: batch ids are unsigned)."""
        return self.batch_transfer_async(target_hostname, [buffer], [peer_buffer_address], [length],
                                         TransferOpcode.Write)

    def transfer_check_status(self, batch_id):
        """1 completed, 0 in progress, -1 failed, -2 timed out (the batch is
        released once it ended)."""
        b = self._batches.get(batch_id)
        if b is None:
            return -1
        st = b.status()
        if st.state == te.PENDING:
            return 0
        self._batches.pop(batch_id, None)
        try:
            b.free()
        except te.TeError:
            pass
        if st.state == te.COMPLETED:
            return 1
        return -2 if st.state == te.TIMEOUT else -1

    # -- notifications and probes -----------------------------------------
    def get_notifies(self):
        """The notifications received since the last call, as TransferNotify objects (an empty list
        on failure)."""
        try:
            return [TransferNotify(n, m.decode("utf-8", "surrogateescape")) for n, m in self._engine.notifies()]
        except te.TeError as e:
            log.error("get_notifies: %s", e)
            return []

    def send_probe(self, peer_server_name):
        """0 when the peer answers, negative otherwise."""
        try:
            self._engine.probe(peer_server_name)
            return 0
        except te.TeError as e:
            log.warning("send_probe(%s): %s", peer_server_name, e)
            return _rc(e)

    # -- managed buffers ------------------------------------------------------
    def allocate_managed_buffer(self, length):
        """A registered buffer of length bytes; returns its address or 0.
        Up to 256 MiB it comes from a pool of power-of-two classes (8 KiB to
        256 MiB) carved from 2 GiB mappings registered once, as in Mooncake;
        larger buffers are mapped and registered on their own."""
        length = int(length)
        if not self._engine:
            log.error("allocate_managed_buffer(%d): initialize first", length)
            return 0
        if length <= 0:
            log.error("allocate_managed_buffer(%d): length must be positive", length)
            return 0
        with self._managed_lock:
            try:
                return self._pool.allocate(length)
            except (OSError, ValueError, te.TeError) as e:
                log.error("allocate_managed_buffer(%d): %s", length, e)
                return 0

    def free_managed_buffer(self, buffer_addr, length):
        """Return a buffer of allocate_managed_buffer; 0 always (as Mooncake).
        An address this engine did not hand out is logged and ignored."""
        with self._managed_lock:
            if not self._pool.free(int(buffer_addr)):
                log.warning("free_managed_buffer(%#x, %d): not a managed buffer of this engine; ignored",
                            int(buffer_addr), int(length))
        return 0

    @staticmethod
    def write_bytes_to_buffer(dest_address, src_ptr, length):
        """Copy length bytes of src_ptr (bytes-like, or str: its UTF-8 bytes,
        as Mooncake's binding converts it) to dest_address."""
        data = src_ptr.encode("utf-8") if isinstance(src_ptr, str) else bytes(src_ptr)
        if int(length) > len(data):
            log.error("write_bytes_to_buffer: %d bytes asked, %d given", length, len(data))
            return -te.InvalidArgument.code
        ctypes.memmove(int(dest_address), data, int(length))
        return 0

    @staticmethod
    def read_bytes_from_buffer(source_address, length):
        """length bytes at source_address, as bytes."""
        return ctypes.string_at(int(source_address), int(length))

    # -- lifetime (not in Mooncake's API; useful in tests) ----------------------
    def close(self):
        """Stop the engine and unmap the managed buffers (not in Mooncake's API; tests and short
        programs use it)."""
        with self._seg_lock:
            segs, self._segments = list(self._segments.values()), {}
        for s in segs:
            try:
                s.close()
            except te.TeError:
                pass
        if self._engine:
            self._engine.close()
        with self._managed_lock:
            self._pool.close()
