"""The native te API: Engine, Segment and Batch over libte's C ABI."""

import ctypes
import json
import os
import threading
import weakref
from ctypes import byref, c_int32, c_size_t, c_uint64, c_void_p

from . import _lib
from ._wait import sliced
from .errors import BufferTooSmall, InvalidArgument, TeError, error_for
from .tensors import is_tensor, resolve_location

READ = 0
WRITE = 1

# Task and batch states (te.h TE_TASK_*).
WAITING, PENDING, INVALID, CANCELED, COMPLETED, TIMEOUT, FAILED = range(7)
STATE_NAMES = {WAITING: "WAITING", PENDING: "PENDING", INVALID: "INVALID", CANCELED: "CANCELED",
               COMPLETED: "COMPLETED", TIMEOUT: "TIMEOUT", FAILED: "FAILED"}

LOG_LEVELS = {None: 0, "default": 0, "debug": 1, "info": 2, "warn": 3, "warning": 3, "error": 4, "off": 5}


def check(rc, lib=None):
    """Return rc when it is not negative; otherwise raise the exception class
    of its code, carrying the calling thread's last error message."""
    if rc >= 0:
        return rc
    raise error_for(-rc, _lib.last_error(lib))


def _b(s):
    if s is None:
        return None
    return s.encode() if isinstance(s, str) else bytes(s)


def address_of(obj, length=None):
    """(address, length) of a buffer: an int address (length must be given),
    an object with .data_ptr() (torch-like tensors: length from nbytes or
    numel()*element_size()), or a writable C-contiguous object with the buffer
    protocol (bytearray, numpy array, mmap, array.array). A tensor may live on
    a GPU (see te.tensors); it must be contiguous."""
    if isinstance(obj, bool):
        raise TypeError("a bool is not an address")
    if isinstance(obj, int):
        if length is None:
            raise InvalidArgument("length is required with an int address")
        return obj, int(length)
    if is_tensor(obj):
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            # data_ptr() + nbytes would not cover a strided view's elements.
            raise InvalidArgument("tensor is not contiguous; register its base tensor or a .contiguous() copy")
        addr = int(obj.data_ptr())
        if length is None:
            if hasattr(obj, "nbytes"):
                length = int(obj.nbytes)
            else:
                length = int(obj.numel()) * int(obj.element_size())
        return addr, int(length)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"{type(obj).__name__} is neither an address, a buffer nor has data_ptr()") from None
    with mv:
        if mv.readonly:
            raise InvalidArgument(f"{type(obj).__name__} buffer is read-only")
        if not mv.c_contiguous:
            raise InvalidArgument("buffer is not C-contiguous")
        n = mv.nbytes
        if n == 0:
            raise InvalidArgument("buffer is empty")
    addr = ctypes.addressof(ctypes.c_char.from_buffer(obj))
    return addr, n if length is None else int(length)


class Segment:
    """An open handle to a (usually remote) segment; close() when done."""

    def __init__(self, engine, handle, name):
        self._engine = engine
        self.handle = handle
        self.name = name

    def buffers(self):
        """[(addr, length, location)] of the segment's current descriptor."""
        lib = _lib.load()
        n = c_size_t()
        check(lib.te_segment_buffers(self.handle, None, 0, byref(n)), lib)
        arr = (_lib.BufferDesc * max(n.value, 1))()
        check(lib.te_segment_buffers(self.handle, arr, n.value, byref(n)), lib)
        return [(b.addr, b.length, b.location.decode()) for b in arr[:n.value]]

    def close(self):
        """Release the handle (the descriptor cache goes with the last handle to the segment)."""
        if self.handle:
            h, self.handle = self.handle, 0
            check(_lib.load().te_close_segment(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Segment({self.name!r})"


class BatchStatus:
    """Summary of a batch (te_batch_status_t)."""

    def __init__(self, s):
        self.state = s.state
        self.error = -s.error
        self.transferred = s.transferred
        self.tasks = s.tasks
        self.completed = s.completed
        self.failed = s.failed

    @property
    def state_name(self):
        """The state as a name: WAITING, PENDING, COMPLETED, FAILED, TIMEOUT, CANCELED."""
        return STATE_NAMES.get(self.state, str(self.state))

    def __repr__(self):
        return (f"BatchStatus({self.state_name}, tasks={self.tasks}, completed={self.completed}, "
                f"failed={self.failed}, transferred={self.transferred})")


class Batch:
    """Requests submitted together and waited on together."""

    def __init__(self, engine, handle, capacity):
        self._engine = engine
        self.handle = handle
        self.capacity = capacity

    @staticmethod
    def _requests(reqs, window=None):
        """The te_request_t array and, when any request names a window, the parallel array of
        window keys (else None: te_submit)."""
        arr = (_lib.Request * len(reqs))()
        keys = None
        for i, r in enumerate(reqs):
            if len(r) == 6:
                op, local, seg, remote, length, win = r
            elif len(r) == 5:
                (op, local, seg, remote, length), win = r, None
            else:
                raise InvalidArgument(f"request {i}: {len(r)} items, want (opcode, local, segment, remote, length"
                                      "[, window])")
            if win is None:
                win = window
            if not isinstance(local, int):
                local, n = address_of(local)
                length = n if length is None else length
            arr[i].opcode = int(op)
            arr[i].local = local
            arr[i].segment = seg.handle if isinstance(seg, Segment) else int(seg)
            arr[i].remote = int(remote)
            arr[i].length = int(length)
            if win:
                if keys is None:
                    keys = (c_uint64 * len(reqs))()
                keys[i] = int(win)
        return arr, keys

    def submit(self, requests, notify=None, window=None):
        """Start requests, a list of (opcode, local, segment, remote, length[, window]);
        local is an address or a buffer (length None: the buffer's size).
        notify=(segment_name, name, msg) is sent once every task completed.
        window is the key of a window the target's engine granted (its Engine.grant_window,
        handed to this process): a request's sixth item, else window= for every request
        that has none; 0 (a sixth item of 0 too) or None: the buffer's own key, as without
        windows. A request under a window presents that key instead of the buffer's
        (te_submit_windows) and goes only over a transport that enforces windows (local,
        shm, cxl, tcp): with none to the peer submit raises NotSupported and starts nothing.
        A request the target refuses (outside the window's ranges, revoked or never granted,
        granted to another engine) fails with AccessDenied in wait(); a refused request lands
        nothing."""
        if not requests:
            raise InvalidArgument("no requests")
        arr, keys = self._requests(requests, window)
        lib = _lib.load()
        if notify is None:
            if keys is None:
                check(lib.te_submit(self.handle, arr, len(arr)), lib)
            else:
                check(lib.te_submit_windows(self.handle, arr, keys, len(arr)), lib)
        else:
            seg, name, msg = notify
            m = _b(msg) or b""
            if keys is None:
                check(lib.te_submit_with_notify(self.handle, arr, len(arr), _b(seg), _b(name), m, len(m)), lib)
            else:
                check(lib.te_submit_windows_with_notify(self.handle, arr, keys, len(arr), _b(seg), _b(name), m,
                                                        len(m)), lib)

    def task_status(self, index):
        """(state, error code, transferred, transport) of task index."""
        lib = _lib.load()
        ts = _lib.TaskStatus()
        check(lib.te_task_status(self.handle, index, byref(ts)), lib)
        return ts.state, -ts.error, ts.transferred, ts.transport.decode()

    def status(self):
        """The batch's summary now (a BatchStatus), without waiting."""
        lib = _lib.load()
        st = _lib.BatchStatus()
        check(lib.te_batch_status(self.handle, byref(st)), lib)
        return BatchStatus(st)

    def wait(self, timeout=None):
        """Block until every task finished (timeout seconds, None: no limit).
        Returns the status; raises Timeout, or the first failure's error.
        Signals are handled while it waits (Ctrl-C raises KeyboardInterrupt
        within 0.1 s); the transfers go on."""
        lib = _lib.load()
        st = _lib.BatchStatus()
        # In slices, so Ctrl-C and other signals are handled during a long
        # wait rather than after it.
        check(sliced(lambda ms: lib.te_wait(self.handle, ms, byref(st)), timeout, "batch"), lib)
        return BatchStatus(st)

    def fileno(self):
        """An eventfd, readable once every task submitted so far finished
        (for select/epoll/asyncio add_reader); read 8 bytes to reset it. The
        batch owns it: free() closes it."""
        lib = _lib.load()
        fd = c_int32()
        check(lib.te_batch_fd(self.handle, byref(fd)), lib)
        return fd.value

    def cancel(self):
        """End every pending task early; wait() reports when each has (its
        transport no longer touches its memory then)."""
        check(_lib.load().te_batch_cancel(self.handle))

    def reset(self):
        """Empty a finished batch so it takes new requests (raises
        BatchBusy while tasks are pending)."""
        check(_lib.load().te_batch_reset(self.handle))

    def free(self):
        """Release the batch; raises BatchBusy while tasks are in flight (wait first)."""
        if self.handle:
            check(_lib.load().te_free_batch(self.handle))
            self.handle = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.handle:
            try:
                self.wait()
            except TeError:
                pass
            self.free()


class Limits:
    """Bounds on what peers can make an engine hold (te_config_t's limit
    fields). None (or 0) keeps te's default; timeouts are in seconds.

    max_conns: accepted connections per listener (1024);
    max_conns_per_host: accepted connections per remote address (256);
    idle_timeout: close an accepted connection idle this long (300 s);
    progress_timeout: cut a connection whose payload stalls this long (10 s);
    notify_bytes: bytes of received, undrained notifications (64 MiB);
    notify_bytes_per_sender: the same per sender name (16 MiB)."""

    FIELDS = ("max_conns", "max_conns_per_host", "idle_timeout", "progress_timeout", "notify_bytes",
              "notify_bytes_per_sender")

    def __init__(self, *, max_conns=None, max_conns_per_host=None, idle_timeout=None, progress_timeout=None,
                 notify_bytes=None, notify_bytes_per_sender=None):
        self.max_conns = max_conns
        self.max_conns_per_host = max_conns_per_host
        self.idle_timeout = idle_timeout
        self.progress_timeout = progress_timeout
        self.notify_bytes = notify_bytes
        self.notify_bytes_per_sender = notify_bytes_per_sender

    @classmethod
    def of(cls, limits):
        """A Limits from a Limits, a dict of its fields, or None."""
        if limits is None or isinstance(limits, Limits):
            return limits or cls()
        if isinstance(limits, dict):
            unknown = set(limits) - set(cls.FIELDS)
            if unknown:
                raise InvalidArgument(f"unknown limits {sorted(unknown)}; known: {list(cls.FIELDS)}")
            return cls(**limits)
        raise TypeError(f"limits must be a te.Limits or a dict, not {type(limits).__name__}")

    def __repr__(self):
        set_ = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS if getattr(self, f) is not None)
        return f"Limits({set_})"


def _ms(name, seconds):
    """Seconds to te_config_t milliseconds (None: 0, the default)."""
    if seconds is None:
        return 0
    if seconds < 0:
        raise InvalidArgument(f"{name} {seconds!r} is negative")
    return max(1, int(seconds * 1000))


def _count(name, v, bits):
    if v is None:
        return 0
    v = int(v)
    if v < 0 or v >= 1 << bits:
        raise InvalidArgument(f"{name} {v} outside 0..{(1 << bits) - 1}")
    return v


def local_topology(devices=None):
    """This machine's memory locations and the RDMA NICs te would use for
    each, as a dict in Mooncake's topology shape: {"cpu:0": [[preferred
    NICs], [other NICs]], "cuda:0": [...]}. devices: NIC names to consider
    (a list or comma-separated string; None: all)."""
    if devices is not None and not isinstance(devices, str):
        devices = ",".join(devices)
    lib = _lib.load()
    size = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(size)
        rc = lib.te_local_topology(_b(devices), buf, size)
        if rc == -BufferTooSmall.code and size < 1 << 24:
            size *= 4
            continue
        check(rc, lib)
        return json.loads(buf.value.decode())


class Engine:
    """A te engine. Keyword arguments follow te_config_t; timeouts are in
    seconds; transports is a list or comma-separated string; params a dict or
    "k=v,k=v" string; log_level one of default, debug, info, warn, error, off.

    Authentication and peers (ABI 1.2): auth_secret (str or bytes; a second
    line is an older secret still accepted) or auth_secret_file; with
    neither, the engine reads $TE_AUTH_SECRET_FILE, then $TE_AUTH_SECRET.
    accept_mooncake_peers=True lets Mooncake peers (which cannot
    authenticate) access remote memory over tcp; None leaves it to
    $TE_ACCEPT_MOONCAKE_PEERS. allow_mooncake_with_secret accepts them even
    with a secret set. unregister_grace (seconds) is how long in-flight
    remote accesses may finish at unregister/close before they are cut.
    limits: a te.Limits or a dict of its fields.

    encrypt=True (ABI 1.3) encrypts data payloads too: with a secret, every
    connection between two engines is an authenticated session whose frame
    headers and control messages are sealed, and payloads cross in the clear
    unless either engine asks for encryption. It needs the cluster secret
    (te.InvalidArgument without one); None leaves it to $TE_ENCRYPT.

    Memory passed to register() as a Python object is kept alive by the
    engine until it is unregistered."""

    def __init__(self, *, segment_name=None, metadata=None, listen_addr=None, hostname=None, transports=None,
                 force_transport=None, params=None, transfer_timeout=None, rpc_timeout=None, max_frame=None,
                 max_notifies=None, log_level=None, auth_secret=None, auth_secret_file=None,
                 accept_mooncake_peers=None, allow_mooncake_with_secret=None, unregister_grace=None, limits=None,
                 encrypt=None):
        lib = _lib.load()
        cfg = _lib.Config()
        cfg.size = ctypes.sizeof(cfg)
        if log_level not in LOG_LEVELS:
            raise InvalidArgument(f"log_level {log_level!r} not in {sorted(k for k in LOG_LEVELS if k)}")
        cfg.log_level = LOG_LEVELS[log_level]
        cfg.segment_name = _b(segment_name)
        cfg.metadata = _b(metadata)
        cfg.listen_addr = _b(listen_addr)
        cfg.hostname = _b(hostname)
        if transports is not None and not isinstance(transports, str):
            transports = ",".join(transports)
        cfg.transports = _b(transports)
        cfg.force_transport = _b(force_transport)
        if isinstance(params, dict):
            params = ",".join(f"{k}={v}" for k, v in params.items())
        cfg.params = _b(params)
        if transfer_timeout is not None:
            cfg.transfer_timeout_ms = -1 if transfer_timeout < 0 else max(1, int(transfer_timeout * 1000))
        if rpc_timeout is not None:
            cfg.rpc_timeout_ms = max(1, int(rpc_timeout * 1000))
        cfg.max_frame = max_frame or 0
        cfg.max_notifies = max_notifies or 0
        cfg.auth_secret = _b(auth_secret)
        cfg.auth_secret_file = _b(None if auth_secret_file is None else os.fspath(auth_secret_file))
        cfg.accept_mooncake_peers = 1 if accept_mooncake_peers else 0
        cfg.allow_mooncake_with_secret = 1 if allow_mooncake_with_secret else 0
        cfg.unregister_grace_ms = _ms("unregister_grace", unregister_grace)
        lim = Limits.of(limits)
        cfg.max_conns = _count("max_conns", lim.max_conns, 31)
        cfg.max_conns_per_host = _count("max_conns_per_host", lim.max_conns_per_host, 31)
        cfg.idle_timeout_ms = _ms("idle_timeout", lim.idle_timeout)
        cfg.progress_timeout_ms = _ms("progress_timeout", lim.progress_timeout)
        cfg.notify_bytes = _count("notify_bytes", lim.notify_bytes, 64)
        cfg.notify_bytes_per_sender = _count("notify_bytes_per_sender", lim.notify_bytes_per_sender, 64)
        cfg.encrypt = 1 if encrypt else 0
        h = _lib.engine_t()
        check(lib.te_create(byref(cfg), byref(h)), lib)
        self.handle = h.value
        self._pins = {}  # address -> objects kept alive while registered
        self._pins_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _destroy, self.handle)

    # -- identity -------------------------------------------------------
    @property
    def name(self):
        """The segment name peers open this engine by."""
        lib = _lib.load()
        buf = ctypes.create_string_buffer(1024)
        check(lib.te_segment_name(self.handle, buf, len(buf)), lib)
        return buf.value.decode()

    @property
    def rpc_port(self):
        """The port of the engine's RPC listener (peers reach the engine at host:port)."""
        lib = _lib.load()
        p = c_int32()
        check(lib.te_rpc_port(self.handle, byref(p)), lib)
        return p.value

    def cxl_memory(self):
        """Where the shared CXL memory device (TE_CXL_DEVICE or
        MC_CXL_DEV_PATH) is mapped in this process, as (addr, size).
        Allocate the KV buffers to register from [addr, addr+size): engines
        that map the same device reach them with a memcpy. The mapping goes
        with the engine; stop using it before close(). Raises
        te.NotSupported when no device is mapped."""
        lib = _lib.load()
        a, n = c_uint64(), c_uint64()
        check(lib.te_cxl_memory(self.handle, byref(a), byref(n)), lib)
        return a.value, n.value

    def stats(self):
        """Counters, segment name and installed transports as a dict;
        "transport_stats" has the transports' own counters (rdma: per rail
        and NIC), "live" what peers cost now per transport (peers,
        conns_dialed, conns_accepted, endpoints, queue_pairs), "topology"
        the NICs rdma uses per memory location."""
        lib = _lib.load()
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            rc = lib.te_stats_json(self.handle, buf, len(buf))
            if rc == -BufferTooSmall.code and size < 1 << 26:
                size *= 4
                continue
            check(rc, lib)
            return json.loads(buf.value.decode())

    def topology(self):
        """The NICs near each memory location as this engine's rdma
        transport uses them, in Mooncake's shape: {"cpu:0": [[preferred],
        [others]], "cuda:0": ...}. Without rdma, te.local_topology()."""
        topo = self.stats().get("topology")
        return topo if topo is not None else local_topology()

    def metrics(self):
        """The engine's metrics in Prometheus's text exposition format (te_metrics):
        tasks by state, bytes, control-plane refusals, per-transport counters,
        routes and a submit-to-completion latency histogram per transport and
        peer class. Serve it from your own /metrics, or set TE_METRICS_ADDR
        and let the engine serve it."""
        lib = _lib.load()
        need = c_size_t()
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            rc = lib.te_metrics(self.handle, buf, size, byref(need))
            if rc == -BufferTooSmall.code and need.value > size:
                size = need.value + 4096  # it may grow meanwhile
                continue
            check(rc, lib)
            return buf.value.decode()

    # -- memory ---------------------------------------------------------
    def register(self, buf, length=None, location=None, remote=True):
        """Register memory (see address_of for what buf may be); returns its
        address. location: "cpu", "cuda:N", "hip:N" (AMD GPU memory, through
        the HIP runtime) or "*" (detect); None means "cpu", or for a tensor
        its own device (a CUDA tensor registers as cuda:N)."""
        addr, n = address_of(buf, length)
        location = resolve_location(buf, location)
        lib = _lib.load()
        check(lib.te_register(self.handle, addr, n, _b(location), 1 if remote else 0), lib)
        if not isinstance(buf, int):
            with self._pins_lock:
                self._pins[addr] = buf
        return addr

    def unregister(self, buf):
        """Unregister the range registered at buf (an address or the object)."""
        addr = buf if isinstance(buf, int) else address_of(buf)[0]
        lib = _lib.load()
        check(lib.te_unregister(self.handle, addr), lib)
        with self._pins_lock:
            self._pins.pop(addr, None)

    def register_file(self, path=None, fd=None, offset=0, length=0, remote=True, create=False, read_only=False,
                      direct=True):
        """Register [offset, offset+length) of a file as a storage buffer and
        return the address the range starts at (ABI 1.3): requests address
        byte k of the range as that address + k, like memory, and unregister
        releases it. Give path (the library opens the file) or fd (an open
        descriptor, duplicated: close yours when you like). length 0: up to
        the file's end. create makes the file and extends it to hold the
        range; direct=False keeps every I/O in the page cache. remote=False
        keeps the file private: in no descriptor a peer reads, and refused
        to every request but this engine's own (which address it through
        the engine's own segment). The address is reserved, never mapped:
        never read or write it from Python."""
        if (path is None) == (fd is None):
            raise InvalidArgument("give a path or an fd, not both or neither")
        flags = (1 if remote else 0) | (2 if create else 0) | (4 if read_only else 0) | (0 if direct else 8)
        out = c_void_p()
        lib = _lib.load()
        check(lib.te_register_file(self.handle, None if path is None else _b(os.fspath(path)),
                                   -1 if fd is None else int(fd), offset, length, flags, byref(out)), lib)
        return out.value

    def register_batch(self, buffers, location=None, remote=True):
        """Register several buffers (objects or (object or address, length)
        pairs), all or none; returns their addresses. location as in
        register, resolved per buffer."""
        if not buffers:
            raise InvalidArgument("no buffers")
        regs = (_lib.Region * len(buffers))()
        locs = []  # keeps the encoded strings alive for the call
        addrs = []
        for i, b in enumerate(buffers):
            addr, n = address_of(*b) if isinstance(b, tuple) else address_of(b)
            locs.append(_b(resolve_location(b[0] if isinstance(b, tuple) else b, location)))
            regs[i].addr, regs[i].length, regs[i].location, regs[i].remote = addr, n, locs[-1], 1 if remote else 0
            addrs.append(addr)
        lib = _lib.load()
        check(lib.te_register_batch(self.handle, regs, len(regs)), lib)
        with self._pins_lock:
            for a, b in zip(addrs, buffers):
                obj = b[0] if isinstance(b, tuple) else b
                if not isinstance(obj, int):
                    self._pins[a] = obj
        return addrs

    def unregister_batch(self, buffers):
        """Unregister several buffers (addresses or objects), all or none; publishes once."""
        if not buffers:
            raise InvalidArgument("no buffers")
        addrs = [b if isinstance(b, int) else address_of(b)[0] for b in buffers]
        arr = (c_void_p * len(addrs))(*addrs)
        lib = _lib.load()
        check(lib.te_unregister_batch(self.handle, arr, len(arr)), lib)
        with self._pins_lock:
            for a in addrs:
                self._pins.pop(a, None)

    # -- segments and batches ---------------------------------------------
    def open_segment(self, name):
        """A handle to the named segment (a peer's host:port with P2PHANDSHAKE, or this engine's
        own name); close() it when done. Raises SegmentNotFound when the peer does not answer."""
        lib = _lib.load()
        h = _lib.segment_t()
        check(lib.te_open_segment(self.handle, _b(name), byref(h)), lib)
        return Segment(self, h.value, name)

    def warmup(self, segment):
        """Connect to the named segment ahead of its first transfer (te_warmup_segment): tcp dials and
        authenticates every striped connection, rdma connects its queue pairs. Blocks until they are up
        (releasing the GIL); a no-op for transports with nothing to set up. Open the segment first to
        keep its descriptor cached. Raises SegmentNotFound, PeerUnreachable, ... on failure."""
        lib = _lib.load()
        check(lib.te_warmup_segment(self.handle, _b(segment)), lib)

    def grant_window(self, ranges, peer=None, first=False):
        """Grant a window over (addr, length) ranges of this engine's registered, remote-accessible
        memory and return its key (te_grant_window_to). With peer (a segment name) only that engine
        may use it: with a cluster secret any other engine is refused (AccessDenied) and nothing
        lands; without a secret it is a bearer key over tcp, shm and cxl. peer None: a bearer key;
        with first=True instead, the window goes to the first engine that uses it
        (te_grant_window_to_first): with a secret its first access binds it to that engine, and
        bind_window binds it to the engine the owner learns of later. The peer sends under it with
        Batch.submit's window (Engine.write/read/transfer window=)."""
        if not ranges:
            raise InvalidArgument("no ranges")
        if first and peer:
            raise InvalidArgument("a window goes to peer or to its first user, not both")
        rs = (_lib.Range * len(ranges))()
        for i, (addr, n) in enumerate(ranges):
            rs[i].addr, rs[i].length = addr, n
        key = c_uint64()
        lib = _lib.load()
        if first:
            check(lib.te_grant_window_to_first(self.handle, rs, len(rs), byref(key)), lib)
        else:
            check(lib.te_grant_window_to(self.handle, _b(peer) if peer else None, rs, len(rs), byref(key)), lib)
        return key.value

    def bind_window(self, key, peer):
        """Bind the window granted as key with grant_window(first=True) to the engine whose segment
        is named peer, unless an engine used it first (te_bind_window). Raises AccessDenied, naming
        that engine, when another engine used it first; InvalidArgument for a bearer window;
        NotFound for an unknown key."""
        lib = _lib.load()
        check(lib.te_bind_window(self.handle, key, _b(peer)), lib)

    def revoke_window(self, key):
        """End the window granted as key (te_revoke_window); returns once no access under it can
        touch memory any more. Blocks (releasing the GIL). Raises NotFound for an unknown key."""
        lib = _lib.load()
        check(lib.te_revoke_window(self.handle, key), lib)

    def allocate_batch(self, capacity):
        """An empty batch for up to capacity requests (1 .. 16777216); free() it, or use it in a
        with block."""
        lib = _lib.load()
        h = _lib.batch_t()
        check(lib.te_allocate_batch(self.handle, int(capacity), byref(h)), lib)
        return Batch(self, h.value, capacity)

    def transfer(self, requests, timeout=None, notify=None, window=None):
        """Submit requests in one batch (Batch.submit: window= for those that name none), wait,
        free it; returns the status."""
        b = self.allocate_batch(len(requests))
        try:
            b.submit(requests, notify=notify, window=window)
            return b.wait(timeout)
        finally:
            try:
                b.free()
            except TeError:
                pass  # still busy after a wait timeout: the engine fails it later

    def write(self, segment, local, remote, length=None, timeout=None, window=None):
        """Copy local memory to remote address of segment (under window, a key it granted) and wait."""
        return self.transfer([(WRITE, local, segment, remote, length)], timeout, window=window)

    def read(self, segment, local, remote, length=None, timeout=None, window=None):
        """Copy from remote address of segment (under window, a key it granted) into local memory and wait."""
        return self.transfer([(READ, local, segment, remote, length)], timeout, window=window)

    # -- notifications and probes -----------------------------------------
    def send_notify(self, segment, name, msg=b""):
        """Deliver (name, msg) to the engine of segment (its name) and wait until it is queued there."""
        m = _b(msg) or b""
        lib = _lib.load()
        check(lib.te_notify_send(self.handle, _b(segment), _b(name), m, len(m)), lib)

    def notifies(self, senders=False):
        """Drain received notifications, oldest first: [(name, msg bytes)],
        or with senders=True [(name, msg bytes, sender, sender_instance)],
        where sender and sender_instance are the sending engine's segment
        name and instance as its authenticated session proved them ("" where
        nothing is proven: no cluster secret, a Mooncake peer). Decide who
        sent a notification by those, never by its name or message."""
        lib = _lib.load()
        p = ctypes.POINTER(_lib.NotifyFrom if senders else _lib.Notify)()
        n = c_size_t()
        drain = lib.te_notify_drain_from if senders else lib.te_notify_drain
        check(drain(self.handle, byref(p), byref(n)), lib)
        if n.value == 0:
            return []
        try:
            out = []
            for i in range(n.value):
                e = p[i]
                item = (e.name.decode("utf-8", "replace"), ctypes.string_at(e.msg, e.msg_len))
                if senders:
                    item += (e.sender.decode("utf-8", "replace"), e.sender_instance.decode("utf-8", "replace"))
                out.append(item)
            return out
        finally:
            lib.te_notify_free(ctypes.cast(p, ctypes.c_void_p))

    def probe(self, segment):
        """Check that the segment's engine answers: {rtt_ns, version, instance}."""
        lib = _lib.load()
        pr = _lib.Probe()
        check(lib.te_probe(self.handle, _b(segment), byref(pr)), lib)
        return {"rtt_ns": pr.rtt_ns, "version": pr.version, "instance": pr.instance.decode()}

    # -- lifetime ---------------------------------------------------------
    def close(self):
        """Stop the engine; its segment and batch handles become invalid."""
        if self._finalizer.detach():
            check(_lib.load().te_destroy(self.handle))
        with self._pins_lock:
            self._pins.clear()

    @property
    def closed(self):
        """True once close() ran."""
        return not self._finalizer.alive

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Engine({self.name!r})" if not self.closed else "Engine(closed)"


def _destroy(handle):
    # Garbage-collected without close(): stop the engine.
    try:
        _lib.load().te_destroy(handle)
    except Exception:
        pass
