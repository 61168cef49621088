"""nixlAgent: NIXL's agent (the C++-style API of nixl._bindings) on one te
engine.

One agent is one te.Engine. Its RPC listener is the NIXL listener: with
enable_listen_thread the engine binds listen_port, and metadata requests,
pushes and invalidations travel as te notifications under reserved names
("nixl/md/..."), so they are authenticated by te's cluster secret like
everything else te carries. User notifications travel as "nixl/n/<sender
agent>". A background thread drains the engine's notifications while the
listener is on (te has no blocking notification wait; it polls every
5 ms) and runs the agent's own sends; every API call that reads
notifications drains them as well. Replies to peers' metadata requests run
on a thread and queue of their own, and what each source of listener
messages can make the agent hold or queue is bounded (nixl._bounds).

Transfers: a prepared list keeps its descriptors as a (n, 3) uint64 array;
make_prepped_xfer turns the selected pairs into one array of te_request_t
(merging pairs that are contiguous on both sides within one registration)
and a post is one te_submit (or te_submit_with_notify) of that array.

Files (FILE_SEG, the POSIX/GDS/GDS_MT backends) are te file segments of the
agent's own segment (nixl._files): a storage transfer names the agent
itself as the remote side, and its file descriptors (offset, length, device
id) become te addresses when the list is prepared, so it is posted like
any other transfer.
"""

import ctypes
import itertools
import json
import logging
import os
import threading
import time
import weakref
from ctypes import byref, c_char_p, c_int, c_size_t, c_uint64, c_void_p

import numpy as np

import te
from te import _lib

from . import _backends, _bounds, _etcd, _files, _meta
from ._descs import nixlRegDList, nixlXferDList
from ._types import (MEM_NAME, from_te, nixl_mem_t, nixl_status_t, nixl_thread_sync_t, nixlBackendError,
                     nixlInvalidParamError, nixlNoTelemetryError, nixlNotAllowedError, nixlNotFoundError,
                     nixlNotSupportedError, nixlRepostActiveError, status_of_te_code)

log = logging.getLogger("nixl")

INIT_AGENT = "NIXL_INIT_AGENT"
NOTIF_PREFIX = "nixl/n/"
CTRL_PREFIX = "nixl/md/"
MAX_REMOTE_AGENTS = 65536
# Bounds on what peers can make an agent hold beyond te's own: notification
# bytes drained but not yet taken by get_new_notifs (past it the listener
# stops draining, so te's budget and its refusals apply again), ranges of
# one peer's metadata, and queued background sends.
MAX_PENDING_NOTIF_BYTES = 64 << 20
MAX_REMOTE_RANGES = 1 << 21
MAX_TASKS = 4096
# Per source of listener messages (nixl._bounds: the proven sending
# segment with a secret, else the identity a message claims): agents announced, ranges their metadata holds, and
# replies to metadata requests queued; and the ranges every source's
# metadata holds in all. Metadata the application loads itself
# (add_remote_agent, etcd) is not charged to a source.
MAX_AGENTS_PER_SOURCE = 16
MAX_RANGES_PER_SOURCE = MAX_REMOTE_RANGES
MAX_LISTENER_RANGES = 1 << 22
MAX_REPLIES = 64
MAX_REPLIES_PER_SOURCE = 1
# A background job not started this long after it was queued is dropped
# (logged): the agent's own sends, and replies to metadata requests, which
# have their own queue and thread so that no flood of requests delays the
# agent's own sends. A started send ends within te's RPC timeout (5 s), so
# a send to a silent peer gives up at most TTL + 5 s after it was queued.
TASK_TTL_S = 60.0
REPLY_TTL_S = 10.0
MAX_REPLY_TARGET = 1024  # characters of a reply segment name
ETCD_WATCH_POLL_S = 0.05
MAX_ETCD_FETCHES = 64  # etcd fetches waiting at once (each up to _etcd.WATCH_TIMEOUT_S)
LISTEN_POLL_S = 0.005

# te_request_t, field for field (te.h); checked against te._lib.Request below.
REQ_DTYPE = np.dtype([("opcode", "<i4"), ("reserved", "<i4"), ("local", "<u8"), ("segment", "<u8"),
                      ("remote", "<u8"), ("length", "<u8")])
assert REQ_DTYPE.itemsize == ctypes.sizeof(_lib.Request)

_U64 = np.uint64
_SUCCESS = int(nixl_status_t.NIXL_SUCCESS)
_IN_PROG = int(nixl_status_t.NIXL_IN_PROG)

# te errors after which a peer may have restarted: its metadata is checked.
# (te's own list for refetching a descriptor.)
_PEER_CHANGED = {te.PeerUnreachable.code, te.StaleDescriptor.code, te.AddressNotRegistered.code,
                 te.SegmentNotFound.code, te.AccessDenied.code}

_fast = None

_LOCAL_FILES = ("FILE_SEG registrations are local storage, as with NIXL's storage backends: they are not in the "
                "agent's metadata, and another agent's files cannot be reached")


def _fast_calls():
    """te_submit and te_submit_with_notify with a plain pointer for the
    request array, so a numpy array goes in without a ctypes cast."""
    global _fast
    if _fast is None:
        lib = _lib.load()
        submit = ctypes.CFUNCTYPE(c_int, c_uint64, c_void_p, c_size_t)(("te_submit", lib))
        submit_n = ctypes.CFUNCTYPE(c_int, c_uint64, c_void_p, c_size_t, c_char_p, c_char_p, c_char_p, c_size_t)(
            ("te_submit_with_notify", lib))
        _fast = (lib, submit, submit_n)
    return _fast


def _text(name):
    """Agent names arrive as str or (from add_remote_agent) bytes."""
    if isinstance(name, (bytes, bytearray)):
        return bytes(name).decode()
    if not isinstance(name, str):
        raise TypeError(f"an agent name is str or bytes, not {type(name).__name__}")
    return name


def _bytes(msg):
    if msg is None:
        return b""
    if isinstance(msg, str):
        return msg.encode()
    return bytes(msg)


def _segment_for(ip, port):
    ip = _text(ip)
    if not ip:
        raise nixlNotSupportedError(f"no peer ip_addr and no central metadata server: give the peer's ip_addr and "
                                    f"port, or set {_etcd.ENV_ENDPOINTS} to exchange metadata through etcd")
    port = int(port)
    if not 0 < port < 65536:
        raise nixlInvalidParamError(f"port {port} out of range")
    if ":" in ip and not ip.startswith("["):
        ip = f"[{ip}]"
    return f"{ip}:{port}"


def _ceil_us(ns):
    return max(1, -(-ns // 1000))


class nixlAgentConfig:
    """nixlAgent's configuration (the fields of NIXL's nixlAgentConfig that
    mean something here; the others are accepted and kept)."""

    def __init__(self, useProgThread=True, useListenThread=False, listenPort=0,
                 syncMode=int(nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE), captureTelemetry=False, numThreads=0,
                 **others):
        self.useProgThread = bool(useProgThread)
        self.useListenThread = bool(useListenThread)
        self.listenPort = int(listenPort)
        self.syncMode = int(syncMode)
        self.captureTelemetry = bool(captureTelemetry)
        self.numThreads = int(numThreads)
        for k, v in others.items():
            setattr(self, k, v)

    def __repr__(self):
        return (f"nixlAgentConfig(useProgThread={self.useProgThread}, useListenThread={self.useListenThread}, "
                f"listenPort={self.listenPort}, syncMode={self.syncMode}, captureTelemetry={self.captureTelemetry})")


class nixlXferTelemetry:
    """One transfer's numbers: startTime (µs since the epoch), postDuration
    and xferDuration (µs from the start of the post to the post's return,
    and to the status check that saw it complete), totalBytes, descCount,
    backendName."""

    __slots__ = ("startTime", "postDuration", "xferDuration", "totalBytes", "descCount", "backendName")

    def __init__(self, startTime=0, postDuration=0, xferDuration=0, totalBytes=0, descCount=0, backendName=""):
        self.startTime, self.postDuration, self.xferDuration = startTime, postDuration, xferDuration
        self.totalBytes, self.descCount, self.backendName = totalBytes, descCount, backendName

    def __repr__(self):
        return (f"nixlXferTelemetry(startTime={self.startTime}, postDuration={self.postDuration}, "
                f"xferDuration={self.xferDuration}, totalBytes={self.totalBytes}, descCount={self.descCount}, "
                f"backendName={self.backendName!r})")


class nixlBackendH:
    """A created backend (create_backend's result)."""

    __slots__ = ("name", "params", "mems")

    def __init__(self, plugin, params):
        self.name = plugin.name
        self.params = dict(params)
        self.mems = plugin.mems

    def getType(self):
        return self.name

    def __repr__(self):
        return f"nixlBackendH({self.name!r})"


class _Table:
    """Registered ranges of one memory type, sorted, for containment checks
    with array operations. Ranges registered with te never overlap."""

    __slots__ = ("starts", "ends", "devs")

    def __init__(self, rows):
        rows = np.asarray(rows, dtype=_U64).reshape(-1, 3)
        if len(rows):
            rows = np.unique(rows, axis=0)  # sorted by address, duplicates gone
        self.starts = np.ascontiguousarray(rows[:, 0])
        self.ends = self.starts + rows[:, 1]
        self.devs = np.ascontiguousarray(rows[:, 2])

    def rows(self):
        return np.stack([self.starts, self.ends - self.starts, self.devs], axis=1) if len(self.starts) else \
            np.zeros((0, 3), dtype=_U64)

    def locate(self, rows):
        """(ok mask, start of the enclosing range) for each row."""
        a, n, d = rows[:, 0], rows[:, 1], rows[:, 2]
        if len(self.starts) == 0:
            return np.zeros(len(rows), dtype=bool), np.zeros(len(rows), dtype=_U64)
        i = np.searchsorted(self.starts, a, side="right").astype(np.int64) - 1
        ic = np.maximum(i, 0)
        e = a + n
        ok = (i >= 0) & (n > 0) & (e >= a) & (e <= self.ends[ic]) & (self.devs[ic] == d)
        return ok, self.starts[ic]


def _union(old, new):
    return new if old is None or len(old) == 0 else np.concatenate([old, new])


class _Moved(Exception):
    """Pushed metadata of a known agent came from another engine than the
    one its loaded metadata names (the agent may have restarted elsewhere)."""

    def __init__(self, remote):
        super().__init__(remote.name)
        self.remote = remote


class _Remote:
    """What an agent knows of a peer: its te segment, instance, the ranges
    its metadata listed, and the open segment handle."""

    __slots__ = ("name", "segment", "instance", "listener", "tables", "seg", "gen", "stale", "checking", "source",
                 "charged", "__weakref__")

    def __init__(self, name, segment, instance, listener, gen):
        self.name, self.segment, self.instance, self.listener, self.gen = name, segment, instance, listener, gen
        self.tables = {}
        self.seg = None
        self.stale = False
        self.checking = False
        self.source = None  # the listener source its ranges are charged to (nixl._bounds)
        self.charged = 0

    def build(self, sections, partial):
        """The tables this metadata makes (added to the current ones when
        partial) and their range count; nothing changes yet."""
        if partial:
            tables = dict(self.tables)
            for mt, rows in sections.items():
                old = tables.get(mt)
                tables[mt] = _Table(_union(old.rows() if old else None, rows))
        else:
            tables = {mt: _Table(rows) for mt, rows in sections.items()}
        n = sum(len(t.starts) for t in tables.values())
        if n > MAX_REMOTE_RANGES:
            raise nixlNotAllowedError(f"metadata of {self.name!r} would hold {n} ranges, over {MAX_REMOTE_RANGES}")
        return tables, n

    def contains(self, mt, rows):
        t = self.tables.get(mt)
        if t is None:
            return np.zeros(len(rows), dtype=bool), np.zeros(len(rows), dtype=_U64)
        return t.locate(rows)


class _Prepped:
    """A prepared descriptor list (prep_xfer_dlist's result). release()
    drops it; transfers made from it are unaffected."""

    __slots__ = ("_agent", "mem", "rows", "regstart", "remote", "gen", "local", "fids", "released", "__weakref__")

    def __init__(self, agent, mem, rows, regstart, remote, local, fids=None):
        self._agent = agent
        self.mem, self.rows, self.regstart = mem, rows, regstart
        self.remote = remote  # _Remote (None: the local side)
        self.gen = remote.gen if remote is not None else 0
        self.local = local
        # FILE_SEG: rows hold te addresses; fids the registration of each.
        self.fids = fids
        self.released = False

    def descCount(self):
        return len(self.rows)

    def release(self):
        self.released = True

    def __bool__(self):
        return True

    def __repr__(self):
        side = "local" if self.local else f"remote {self.remote.name!r}"
        return f"nixl_prepped_dlist_handle({side}, {len(self.rows)} {MEM_NAME.get(self.mem)} descriptors)"


class _Xfer:
    """A transfer request (make_prepped_xfer's and initialize_xfer's result).
    Owns one te batch once posted; release() (or garbage collection) frees
    it, cancelling what is still in flight first."""

    __slots__ = ("_agent", "op", "reqs", "remote", "gen", "seg_h", "notif", "notif_seg", "total", "count", "backend",
                 "files", "batch", "state", "err", "err_msg", "start_us", "t0", "post_ns", "xfer_ns", "released",
                 "__weakref__")

    def __init__(self, agent, op, reqs, remote, notif, total, count, backend, files=()):
        self._agent = agent
        self.files = files  # FILE_SEG registrations it reaches: checked live at each post
        self.op, self.reqs, self.remote, self.gen = op, reqs, remote, remote.gen
        self.seg_h = int(reqs["segment"][0])
        self.notif = notif
        self.notif_seg = remote.segment.encode()
        self.total, self.count, self.backend = total, count, backend
        self.batch = 0
        self.state = None  # None: never posted; else a nixl_status_t value
        self.err = 0
        self.err_msg = ""
        self.start_us = self.t0 = self.post_ns = self.xfer_ns = 0
        self.released = False

    def release(self):
        a = self._agent()
        if a is not None:
            a.releaseXferReq(self)

    def __del__(self):
        # Dropped without release(): free the te batch on the agent's next
        # call (a finalizer must not block on in-flight transfers).
        try:
            if self.batch and not self.released:
                a = self._agent()
                if a is not None:
                    a._deferred.append(self.batch)
                self.batch = 0
        except Exception:
            pass

    def __bool__(self):
        return True

    def __repr__(self):
        return f"nixl_xfer_handle({self.count} descriptors to {self.remote.name!r})"


class nixlAgent:
    """NIXL's agent over te. Thread-safe in every sync mode: te is, and the
    agent's own tables are guarded by a lock."""

    def __init__(self, name, config=None):
        name = _text(name)
        if not name:
            raise ValueError("agent name must not be empty")
        if len(name.encode()) > _meta.MAX_NAME:
            raise ValueError(f"agent name longer than {_meta.MAX_NAME} bytes")
        cfg = config if config is not None else nixlAgentConfig()
        self.name = name
        self.config = cfg
        self._lock = threading.RLock()
        self._listening = bool(getattr(cfg, "useListenThread", False))
        env = os.environ.get("NIXL_TELEMETRY_ENABLE")
        if env is not None:
            self._telemetry = env.strip().lower() in ("y", "yes", "1", "true", "on")
        else:
            self._telemetry = bool(getattr(cfg, "captureTelemetry", False))
        self._engine = te.Engine(**_engine_args(cfg, self._listening))
        self._segname = self._engine.name
        self._instance = None
        self._backends = {}
        self._regs = {}  # (mem, addr, len, dev) -> registration count
        self._tables = {}  # DRAM and VRAM only: what the metadata lists
        self._files = _files.FileRegistry()
        self._pins = {}  # (addr, len) -> objects kept alive while registered
        self._remotes = {}
        self._gen = itertools.count(1)
        self._self_remote = None
        self._notifs = {}
        self._deferred = []  # te batches of transfer handles dropped without release
        self._tasks = _bounds.Jobs(MAX_TASKS)  # the agent's own sends and probes
        self._replies = _bounds.Jobs(MAX_REPLIES, MAX_REPLIES_PER_SOURCE)  # answers to peers' requests
        self._sources = _bounds.Sources(MAX_AGENTS_PER_SOURCE, MAX_RANGES_PER_SOURCE, MAX_LISTENER_RANGES)
        self._pending_bytes = 0
        self._stop = threading.Event()
        self._worker = None
        self._replier = None
        self._warned = set()
        # Messages refused because their proven sender is not the engine
        # of the agent they speak for (see _from_agent).
        self.refused_from = 0
        self._fetches = threading.BoundedSemaphore(MAX_ETCD_FETCHES)
        self._etcd_watcher = None
        try:
            self._etcd = _etcd.EtcdMD(name) if _etcd.configured() else None
        except Exception:
            self._engine.close()
            raise
        self._finalizer = weakref.finalize(self, _shutdown, self._engine, self._stop, None, self._etcd)
        self._finalizer.atexit = True
        if self._listening:
            self._start_worker()
        log.debug("nixl agent %s on te segment %s (listener %s)", name, self._segname,
                  "on" if self._listening else "off")

    # -- lifetime ----------------------------------------------------------
    def _start_worker(self):
        with self._lock:
            if self._worker is None and not self._stop.is_set():
                t = threading.Thread(target=_worker_main, args=(weakref.ref(self), self._tasks, self._stop),
                                     name=f"nixl-agent-{self.name}", daemon=True)
                self._worker = t
                self._finalizer.detach()
                self._finalizer = weakref.finalize(self, _shutdown, self._engine, self._stop, t, self._etcd)
                self._finalizer.atexit = True
                t.start()

    def _post_task(self, fn, what="send"):
        """Queue one of the agent's own background jobs (TASK_TTL_S to
        start); nixlBackendError when MAX_TASKS are queued."""
        self._start_worker()
        try:
            self._tasks.put(fn, what, TASK_TTL_S)
        except nixlBackendError as e:
            raise nixlBackendError(f"agent {self.name!r}: {e}") from None

    def _post_reply(self, fn, what, source, target):
        """Queue a reply to a peer's request on the replies' own queue and
        thread (REPLY_TTL_S to start, MAX_REPLIES in all, MAX_REPLIES_PER_SOURCE
        per source, one per target: a request repeated while its reply
        waits is answered by that reply). Refusals are logged, not raised:
        the peer's message is what is refused."""
        try:
            self._replies.put(fn, what, REPLY_TTL_S, source=source, key=target)
        except nixlBackendError as e:
            log.debug("nixl agent %s: %s", self.name, e)
            return
        with self._lock:
            if self._replier is None and not self._stop.is_set():
                t = threading.Thread(target=_reply_main, args=(weakref.ref(self), self._replies, self._stop),
                                     name=f"nixl-reply-{self.name}", daemon=True)
                self._replier = t
                t.start()

    def close(self):
        """Stop the agent: its engine, listener and every transfer (te ends
        in-flight ones FAILED once nothing touches their memory). Its
        metadata in etcd goes with it (the keys' lease is revoked)."""
        self._finalizer()

    @property
    def closed(self):
        return not self._finalizer.alive

    def _live(self):
        if not self._finalizer.alive:
            raise nixlBackendError(f"agent {self.name!r} is closed")
        if self._deferred:
            self._reap()

    def _reap(self):
        lib = _lib.load()
        keep = []
        while self._deferred:
            b = self._deferred.pop()
            if lib.te_free_batch(b) == -te.BatchBusy.code:
                lib.te_batch_cancel(b)
                keep.append(b)
        self._deferred.extend(keep)

    # -- plugins and backends ------------------------------------------------
    def getAvailPlugins(self):
        return _backends.names()

    def getPluginParams(self, name):
        p = _backends.PLUGINS.get(_text(name))
        if p is None:
            raise nixlNotFoundError(f"no backend plugin {name!r} here; te's nixl knows {_backends.names()}")
        return dict(p.params), list(p.mems)

    def createBackend(self, name, params=None):
        self._live()
        name = _text(name)
        p = _backends.PLUGINS.get(name)
        if p is None:
            raise nixlNotFoundError(f"no backend plugin {name!r} here; te's nixl knows {_backends.names()}")
        params = dict(params or {})
        for k, v in params.items():
            if not isinstance(k, str):
                raise nixlInvalidParamError(f"backend parameter names are str, not {type(k).__name__}")
        with self._lock:
            if name in self._backends:
                raise nixlInvalidParamError(f"backend {name} was already created for agent {self.name!r}")
            h = nixlBackendH(p, {**p.params, **{k: str(v) for k, v in params.items()}})
            self._backends[name] = h
        return h

    def getBackendParams(self, backend):
        h = self._backend(backend)
        return dict(h.params), list(h.mems)

    def _backend(self, backend):
        name = backend.name if isinstance(backend, nixlBackendH) else _text(backend)
        h = self._backends.get(name)
        if h is None:
            raise nixlNotFoundError(f"backend {name!r} was not created for agent {self.name!r}")
        return h

    def _pick(self, backends, mems, network, kind=None):
        """The backends (handles or names) to use: those given, else every
        created one; those left must serve each memory type in mems (and be
        of kind, or network ones when network)."""
        kind = _backends.NETWORK if network else kind
        hs = [self._backend(b) for b in backends] if backends else list(self._backends.values())
        ok = [h for h in hs if all(m in h.mems for m in mems) and
              (kind is None or _backends.PLUGINS[h.name].kind == kind)]
        if not ok:
            what = "/".join(MEM_NAME.get(m, str(m)) for m in mems)
            have = [h.name for h in hs] or "none"
            verb = "hold" if kind is None else "transfer"
            raise nixlNotFoundError(f"no backend of agent {self.name!r} can {verb} {what} (backends: {have})")
        return ok

    # -- memory --------------------------------------------------------------
    def registerMem(self, descs, backends=None, _pins=None):
        """Register a nixlRegDList with te (DRAM at location "*", which te
        resolves to host or device memory; VRAM as "cuda:<device id>"), all
        or none. A descriptor registered again
        counts once more and needs one more deregistration."""
        self._live()
        if not isinstance(descs, nixlRegDList):
            raise nixlInvalidParamError(f"registerMem takes a nixlRegDList, not {type(descs).__name__}")
        mem = descs.getType()
        self._pick(backends, (mem,), network=False)
        if mem == nixl_mem_t.FILE_SEG:
            with self._lock:
                self._files.register(self._engine, descs)
            return _SUCCESS
        if mem not in (nixl_mem_t.DRAM_SEG, nixl_mem_t.VRAM_SEG):
            raise nixlNotSupportedError(f"{MEM_NAME.get(mem)} memory: te moves DRAM, VRAM and files (FILE_SEG) only")
        rows = descs._rows()
        if len(rows) == 0:
            return _SUCCESS
        if (rows[:, 1] == 0).any():
            raise nixlInvalidParamError(f"descriptor {int(np.flatnonzero(rows[:, 1] == 0)[0])} has length 0")
        keys = [(mem,) + tuple(r) for r in rows.tolist()]
        with self._lock:
            fresh = []
            seen = set()
            for k in keys:
                if k not in self._regs and k not in seen:
                    seen.add(k)
                    fresh.append(k)
            if fresh:
                regions = (_lib.Region * len(fresh))()
                locs = []
                for i, (_, addr, n, dev) in enumerate(fresh):
                    # DRAM as "*": te asks the CUDA driver (when there is
                    # one), so device memory declared DRAM is still only
                    # handed to transports that can move it. VRAM names its
                    # device, which te checks against the driver.
                    locs.append(b"*" if mem == nixl_mem_t.DRAM_SEG else f"cuda:{dev}".encode())
                    regions[i].addr, regions[i].length, regions[i].location, regions[i].remote = addr, n, locs[-1], 1
                lib = _lib.load()
                rc = lib.te_register_batch(self._engine.handle, regions, len(fresh))
                if rc < 0:
                    raise from_te(te.error_for(-rc, _lib.last_error(lib)), "registerMem")
            for k in keys:
                self._regs[k] = self._regs.get(k, 0) + 1
            if _pins:
                for (addr, n), obj in _pins.items():
                    self._pins.setdefault((addr, n), []).append(obj)
            self._rebuild(mem)
        return _SUCCESS

    def deregisterMem(self, descs, backends=None):
        """Undo one registration of each descriptor (all must be registered;
        if one is not, nothing changes). te's unregister returns once
        nothing touches the range any more."""
        self._live()
        if not isinstance(descs, nixlRegDList):
            raise nixlInvalidParamError(f"deregisterMem takes a nixlRegDList, not {type(descs).__name__}")
        mem = descs.getType()
        if mem == nixl_mem_t.FILE_SEG:
            with self._lock:
                self._files.deregister(self._engine, descs)
            return _SUCCESS
        keys = [(mem,) + tuple(r) for r in descs._rows().tolist()]
        with self._lock:
            need = {}
            for k in keys:
                need[k] = need.get(k, 0) + 1
            for k, c in need.items():
                if self._regs.get(k, 0) < c:
                    raise nixlNotFoundError(f"descriptor {k[1:]} ({MEM_NAME.get(mem)}) is not registered")
            gone = [k for k, c in need.items() if self._regs[k] == c]
            if gone:
                arr = (c_void_p * len(gone))(*[k[1] for k in gone])
                lib = _lib.load()
                rc = lib.te_unregister_batch(self._engine.handle, arr, len(gone))
                if rc < 0:
                    raise from_te(te.error_for(-rc, _lib.last_error(lib)), "deregisterMem")
            for k, c in need.items():
                self._regs[k] -= c
                if self._regs[k] == 0:
                    del self._regs[k]
                    pins = self._pins.get((k[1], k[2]))
                    if pins:
                        pins.pop()
                        if not pins:
                            del self._pins[(k[1], k[2])]
            self._rebuild(mem)
        return _SUCCESS

    def _rebuild(self, mem):
        rows = [k[1:] for k in self._regs if k[0] == mem]
        self._tables[mem] = _Table(np.array(rows, dtype=_U64).reshape(-1, 3))

    def _local_rows(self, mem):
        t = self._tables.get(mem)
        return t.rows() if t is not None else np.zeros((0, 3), dtype=_U64)

    def queryMem(self, descs, backend):
        self._live()
        if not isinstance(descs, nixlRegDList):
            raise nixlInvalidParamError(f"queryMem takes a nixlRegDList, not {type(descs).__name__}")
        h = self._backend(backend)
        mem = descs.getType()
        if mem not in h.mems:
            raise nixlNotSupportedError(f"backend {h.name} does not hold {MEM_NAME.get(mem)} memory")
        if mem == nixl_mem_t.FILE_SEG:
            return _files.query(descs)
        rows = descs._rows()
        with self._lock:
            t = self._tables.get(mem)
            ok = t.locate(rows)[0] if t is not None else np.zeros(len(rows), dtype=bool)
        loc = "cpu" if mem == nixl_mem_t.DRAM_SEG else "cuda"
        return [{"size": str(int(r[1])), "location": loc if mem == nixl_mem_t.DRAM_SEG else f"{loc}:{int(r[2])}"}
                if k else None for r, k in zip(rows, ok)]

    # -- notifications and the listener ---------------------------------------
    def _pump(self, taking=False):
        """Drain te's notifications: user ones into the pending map, control
        ones handled. Cheap when there are none (one te call). Unless the
        caller is taking the pending ones (get_new_notifs), nothing is
        drained while they hold MAX_PENDING_NOTIF_BYTES."""
        with self._lock:
            if not taking and self._pending_bytes >= MAX_PENDING_NOTIF_BYTES:
                return
            try:
                items = self._engine.notifies(senders=True)
            except te.TeError as e:
                raise from_te(e, "notifications") from e
            for name, msg, seg, inst in items:
                # The engine that sent it, as its te session proved it;
                # None without a cluster secret (nothing is proven: te then
                # trusts the network, as NIXL does).
                sender = (seg, inst) if inst else None
                if name.startswith(CTRL_PREFIX):
                    self._control(name[len(CTRL_PREFIX):], msg, sender)
                    continue
                if name.startswith(NOTIF_PREFIX):
                    name = name[len(NOTIF_PREFIX):]
                    if not self._from_agent(name, sender):
                        continue
                self._notifs.setdefault(name, []).append(msg)
                self._pending_bytes += len(msg) + len(name)

    def _from_agent(self, agent, sender):
        """Whether a message that says it comes from agent came from that
        agent's engine: with a proven sender, a known agent's messages are
        taken only from the te segment its metadata was loaded from (an
        agent not known yet cannot be checked and is taken). Called under
        the lock."""
        r = self._remotes.get(agent)
        if sender is None or r is None or r.segment == sender[0]:
            return True
        self.refused_from += 1
        if ("from", agent) not in self._warned and len(self._warned) < 1024:
            self._warned.add(("from", agent))
            log.warning("nixl agent %s: refused a message for agent %s sent by te segment %s (%s): %s's "
                        "metadata names %s", self.name, agent, sender[0], sender[1], agent, r.segment)
        return False

    def _control(self, kind, msg, sender=None):
        if not self._listening:
            if "ctrl" not in self._warned:
                self._warned.add("ctrl")
                log.warning("nixl agent %s: dropped a metadata message (%s): its listener is off "
                            "(nixl_agent_config(enable_listen_thread=True))", self.name, kind)
            return
        try:
            if kind == "put":
                try:
                    name = self._load(msg, eager=False, listener=True, sender=sender)
                except _Moved as m:
                    # Another engine speaks for a known agent: taken only once
                    # the engine its metadata names no longer answers as that
                    # instance (the agent restarted elsewhere), checked by the
                    # worker since probing must not happen under the lock.
                    self._post_task(lambda a, b=msg, r=m.remote: a._load_moved(b, sender, r), "metadata check")
                    return
                log.debug("nixl agent %s: loaded metadata of %s from the listener", self.name, name)
            elif kind == "get":
                req = _json(msg)
                want, reply = req.get("want"), req.get("reply")
                if want != self.name or not isinstance(reply, str) or not reply or len(reply) > MAX_REPLY_TARGET:
                    log.debug("nixl agent %s: metadata request for %r ignored", self.name, want)
                    return
                if sender is not None and reply != sender[0]:
                    # Replies go only to the engine that asked: a request
                    # cannot aim this agent's sends at a third party.
                    self.refused_from += 1
                    log.debug("nixl agent %s: metadata request from %s with replies to %s ignored",
                              self.name, sender[0], reply)
                    return
                # Made and sent by the reply thread: it probes te, which
                # must not happen under the lock a drain holds.
                self._post_reply(lambda a, s=reply: a._send_ctrl(s, "put", a.getLocalMD()), "metadata reply",
                                 _bounds.source_of(sender, reply), reply)
            elif kind == "inv":
                req = _json(msg)
                name, inst = req.get("name"), req.get("instance")
                r = self._remotes.get(name)
                if r is not None and sender is not None and (sender[0] != r.segment or sender[1] != r.instance):
                    self.refused_from += 1
                    log.warning("nixl agent %s: refused an invalidation of %s sent by te segment %s (%s): %s is "
                                "%s (%s)", self.name, name, sender[0], sender[1], name, r.segment, r.instance)
                    return
                if r is not None and (inst is None or inst == r.instance):
                    self._drop(r)
                    log.debug("nixl agent %s: %s invalidated its metadata", self.name, name)
            else:
                log.debug("nixl agent %s: unknown control message %r", self.name, kind)
        except Exception as e:  # a peer's bad message must not break the caller's drain
            log.warning("nixl agent %s: metadata message (%s) refused: %s", self.name, kind, e)

    def _send_ctrl(self, segment, kind, payload):
        try:
            self._engine.send_notify(segment, CTRL_PREFIX + kind, payload)
        except te.TeError as e:
            log.warning("nixl agent %s: sending metadata (%s) to %s failed: %s", self.name, kind, segment, e)

    def genNotif(self, remote, msg, backend=None):
        """Send a notification to a remote agent (or to this agent by its
        own name). Blocks until the peer's te engine queued it."""
        self._live()
        remote = _text(remote)
        r = self._remote_for(remote, need_conn=True)
        try:
            self._engine.send_notify(r.segment, NOTIF_PREFIX + self.name, _bytes(msg))
        except te.TeError as e:
            raise from_te(e, f"notification to {remote!r}") from e
        return _SUCCESS

    def getNotifs(self, notif_map=None, backends=None):
        """Move the notifications received so far into notif_map
        ({agent: [bytes]}) and return it."""
        self._live()
        out = notif_map if notif_map is not None else {}
        with self._lock:
            self._pump(taking=True)
            pending, self._notifs, self._pending_bytes = self._notifs, {}, 0
        for k, v in pending.items():
            out.setdefault(k, []).extend(v)
        return out

    # -- metadata ---------------------------------------------------------------
    def _own_instance(self):
        if self._instance is None:
            try:
                self._instance = self._engine.probe(self._segname)["instance"]
            except te.TeError as e:
                raise from_te(e, "own te instance") from e
        return self._instance

    def _md(self, sections, conn, partial):
        return _meta.encode(_meta.Metadata(self.name, conn, self._segname, self._own_instance() if conn else None,
                                           self._listening, partial, sections))

    def getLocalMD(self):
        self._live()
        with self._lock:
            sections = {m: t.rows() for m, t in self._tables.items() if len(t.starts)}
        return self._md(sections, True, False)

    def getLocalPartialMD(self, descs, inc_conn_info=False, backends=None):
        self._live()
        if not isinstance(descs, (nixlRegDList, nixlXferDList)):
            raise nixlInvalidParamError(f"partial metadata takes a descriptor list, not {type(descs).__name__}")
        rows = descs._rows()
        mem = descs.getType()
        if mem == nixl_mem_t.FILE_SEG:
            raise nixlNotSupportedError(_LOCAL_FILES)
        if len(rows):
            with self._lock:
                t = self._tables.get(mem)
                ok = t.locate(rows)[0] if t is not None else np.zeros(len(rows), dtype=bool)
            if not ok.all():
                bad = int(np.flatnonzero(~ok)[0])
                raise nixlNotFoundError(f"descriptor {bad} {descs[bad][:3]} is not registered with agent {self.name!r}")
        return self._md({mem: rows.copy()} if len(rows) else {}, bool(inc_conn_info), True)

    def loadRemoteMD(self, md):
        """Load a peer's metadata; returns its name (bytes). Metadata of an
        agent already known replaces what is known (full metadata) or adds
        to it (partial); metadata from a restarted peer (another te
        instance) replaces the old peer, whose prepared lists then refuse
        to make transfers. The peer's segment is opened here, so a peer
        that cannot be reached or authenticated fails now."""
        self._live()
        return self._load(md, eager=True).encode()

    def _load(self, blob, eager, listener=False, sender=None, moved_from=None):
        """Load metadata. listener: it came through the listener, from
        sender (the (segment, instance) te's session proved, None without a
        secret), and is charged to its source (nixl._bounds), refused past
        the source's bounds. Pushed metadata must name its sender's own
        segment and instance, and updates an agent only from the segment it
        was loaded from (else _Moved; moved_from is the remote that a check
        found gone, which may then be replaced)."""
        md = _meta.decode(blob)
        if md.name == self.name:
            return md.name  # this agent itself: loopback needs no metadata
        created = False
        with self._lock:
            r = self._remotes.get(md.name)
            if sender is not None:
                seg, inst = sender
                if md.conn and (md.segment != seg or md.instance != inst):
                    self.refused_from += 1
                    raise nixlNotAllowedError(f"metadata of {md.name!r} names te segment {md.segment} ({md.instance}) "
                                              f"but was sent by {seg} ({inst})")
                if r is not None and r.segment != seg and r is not moved_from:
                    if not md.conn:
                        self.refused_from += 1
                        raise nixlNotAllowedError(f"partial metadata of {md.name!r} sent by te segment {seg}, "
                                                  f"not by its engine at {r.segment}")
                    raise _Moved(r)
                if r is not None and not md.conn and r.instance != inst:
                    self.refused_from += 1
                    raise nixlNotAllowedError(f"partial metadata of {md.name!r} sent by te instance {inst}, "
                                              f"not by the one its metadata names ({r.instance})")
            source = None
            if listener:
                claimed = md.segment if md.conn else (r.source or r.segment) if r is not None else None
                source = _bounds.source_of(sender, claimed)
                incoming = sum(len(v) for v in md.sections.values())
                if incoming > MAX_RANGES_PER_SOURCE:  # refused before any table is built
                    self._sources.refused += 1
                    raise nixlNotAllowedError(f"metadata of {md.name!r} from {source!r} holds {incoming} ranges, over "
                                              f"{MAX_RANGES_PER_SOURCE} per source")
            if md.conn and (r is None or r.instance != md.instance or r.segment != md.segment):
                if r is None and len(self._remotes) >= MAX_REMOTE_AGENTS:
                    raise nixlNotAllowedError(f"agent {self.name!r} holds metadata of {MAX_REMOTE_AGENTS} agents")
                fresh = _Remote(md.name, md.segment, md.instance, md.listener, next(self._gen))
                # Either may refuse: nothing changed then.
                fresh.tables, n = fresh.build(md.sections, md.partial)
                self._sources.check(source, r, n, md.name)
                if r is not None:
                    log.info("nixl agent %s: %s restarted or moved (te instance %s at %s -> %s at %s): metadata "
                             "refreshed", self.name, md.name, r.instance, r.segment, md.instance, md.segment)
                    self._drop(r)
                r = fresh
                self._remotes[md.name] = r
                self._sources.charge(r, source, n)
                created = True
            elif r is None or (r.stale and not md.conn):
                raise nixlNotFoundError(f"metadata of {md.name!r} without connection info, and no earlier metadata "
                                        f"with it: send it with inc_conn_info=True first")
            else:
                tables, n = r.build(md.sections, md.partial)
                self._sources.check(source, r, n, md.name)
                r.tables = tables
                self._sources.charge(r, source, n)
                if r.seg is not None:
                    # The same peer with new registrations: te's cached
                    # descriptor may lack them (te refetches a descriptor on
                    # a missing address only every so often), so the handle
                    # goes and the next use opens the segment afresh.
                    seg, r.seg = r.seg, None
                    _close(seg)
            if md.conn:
                r.listener = md.listener
                r.stale = False
        if eager and r.segment:
            try:
                self._open(r)
            except Exception:
                if created:
                    with self._lock:
                        if self._remotes.get(md.name) is r:
                            self._drop(r)
                raise
        return md.name

    def _open(self, r):
        """The te segment handle of a remote (opened on first use). Checks
        that the peer is the instance the metadata came from."""
        if r.seg is not None:
            return r.seg
        try:
            seg = self._engine.open_segment(r.segment)
        except te.TeError as e:
            raise from_te(e, f"agent {r.name!r} at te segment {r.segment}") from e
        try:
            inst = self._engine.probe(r.segment)["instance"]
        except te.TeError as e:
            seg.close()
            raise from_te(e, f"agent {r.name!r} at te segment {r.segment}") from e
        with self._lock:
            if inst != r.instance:
                seg.close()
                r.stale = True
                raise nixlNotFoundError(f"agent {r.name!r} at {r.segment} restarted since its metadata was made "
                                        f"(te instance {inst}, metadata says {r.instance}): load its new metadata")
            if r.seg is None and self._remotes.get(r.name) is r:
                r.seg = seg
                return seg
        seg.close()  # another thread opened it first, or r was dropped meanwhile
        if r.seg is None:
            raise nixlNotFoundError(f"metadata of agent {r.name!r} was removed")
        return r.seg

    def _load_moved(self, blob, sender, old):
        """Metadata for a known agent from another engine (worker thread):
        loaded only if the engine its metadata names is gone or restarted."""
        try:
            alive = self._engine.probe(old.segment)["instance"] == old.instance
        except te.TeError:
            alive = False
        if alive:
            with self._lock:
                self.refused_from += 1
            log.warning("nixl agent %s: refused metadata of %s sent by te segment %s: %s still answers at %s",
                        self.name, old.name, sender[0], old.name, old.segment)
            return
        try:
            self._load(blob, eager=False, listener=True, sender=sender, moved_from=old)
        except Exception as e:
            log.warning("nixl agent %s: metadata message (put) refused: %s", self.name, e)

    def _drop(self, r):
        if self._remotes.get(r.name) is r:
            del self._remotes[r.name]
            self._sources.release(r)
        r.gen = -1
        seg, r.seg = r.seg, None
        _close(seg)

    def invalidateRemoteMD(self, name):
        self._live()
        name = _text(name)
        with self._lock:
            r = self._remotes.get(name)
            if r is None:
                raise nixlNotFoundError(f"no metadata of agent {name!r} loaded")
            self._drop(r)
        return _SUCCESS

    def checkRemoteMD(self, name, descs=None):
        """Whether metadata of name is loaded (and covers descs)."""
        self._live()
        name = _text(name)
        self._pump()
        with self._lock:
            r = self._remotes.get(name)
            if r is None or r.stale:
                return False
            if descs is None or descs.descCount() == 0:
                return True
            return bool(r.contains(descs.getType(), descs._rows())[0].all())

    def _need_listener(self, what):
        if not self._listening:
            raise nixlNotAllowedError(f"{what} needs the agent's listener: "
                                      f"nixl_agent_config(enable_listen_thread=True)")

    def _central(self, ip_addr):
        """Whether a call without a peer address goes to etcd (an address
        wins over etcd, as in NIXL)."""
        return self._etcd is not None and not _text(ip_addr)

    def sendLocalMD(self, ip_addr="", port=0):
        self._live()
        if self._central(ip_addr):
            self._etcd.publish(_etcd.DEFAULT_LABEL, self.getLocalMD())
            return _SUCCESS
        self._need_listener("send_local_metadata")
        seg = _segment_for(ip_addr, port)
        md = self.getLocalMD()
        self._post_task(lambda a: a._send_ctrl(seg, "put", md))
        return _SUCCESS

    def sendLocalPartialMD(self, descs, inc_conn_info=False, backends=None, ip_addr="", port=0, label=""):
        self._live()
        if self._central(ip_addr):
            label = _text(label)
            if not label:
                raise nixlInvalidParamError("a metadata label is required to send partial metadata to etcd")
            self._etcd.publish(label, self.getLocalPartialMD(descs, inc_conn_info, backends))
            return _SUCCESS
        self._need_listener("send_partial_agent_metadata")
        seg = _segment_for(ip_addr, port)
        md = self.getLocalPartialMD(descs, inc_conn_info, backends)
        self._post_task(lambda a: a._send_ctrl(seg, "put", md))
        return _SUCCESS

    def fetchRemoteMD(self, name, ip_addr="", port=0, label=""):
        self._live()
        if self._central(ip_addr):
            self._etcd_fetch(_text(name), _text(label) or _etcd.DEFAULT_LABEL)
            return _SUCCESS
        self._need_listener("fetch_remote_metadata")
        seg = _segment_for(ip_addr, port)
        req = json.dumps({"want": _text(name), "from": self.name, "reply": self._segname}).encode()
        self._post_task(lambda a: a._send_ctrl(seg, "get", req))
        return _SUCCESS

    def invalidateLocalMD(self, ip_addr="", port=0):
        self._live()
        if self._central(ip_addr):
            self._etcd.invalidate()
            return _SUCCESS
        self._need_listener("invalidate_local_metadata")
        seg = _segment_for(ip_addr, port)
        req = json.dumps({"name": self.name, "instance": self._own_instance()}).encode()
        self._post_task(lambda a: a._send_ctrl(seg, "inv", req))
        return _SUCCESS

    def _etcd_fetch(self, name, label):
        """Read name's metadata from etcd in the background, waiting for it
        as NIXL does; check_remote_metadata turns True once it is loaded."""
        if not name:
            raise nixlInvalidParamError("empty agent name")
        if not self._fetches.acquire(blocking=False):
            raise nixlBackendError(f"agent {self.name!r} has {MAX_ETCD_FETCHES} etcd fetches waiting; fetch refused")
        t = threading.Thread(target=_etcd_fetch_main, args=(weakref.ref(self), self._etcd, self._stop,
                                                              self._fetches, name, label),
                             name=f"nixl-etcd-{self.name}", daemon=True)
        try:
            t.start()
        except Exception:
            self._fetches.release()
            raise

    def _start_etcd_watcher(self):
        with self._lock:
            if self._etcd_watcher is None and not self._stop.is_set():
                t = threading.Thread(target=_etcd_watch_main, args=(weakref.ref(self), self._etcd, self._stop),
                                     name=f"nixl-etcd-watch-{self.name}", daemon=True)
                self._etcd_watcher = t
                t.start()

    def makeConnection(self, name, backends=None):
        self._live()
        r = self._remote_for(_text(name), need_conn=True)
        self._open(r)
        return _SUCCESS

    def _remote_for(self, name, need_conn=False):
        if name == self.name:
            return self._loopback()
        r = self._remotes.get(name)
        if r is None or r.stale:
            self._pump()  # a listener push may be waiting to be read
            r = self._remotes.get(name)
        if r is None:
            raise nixlNotFoundError(f"no metadata of agent {name!r} loaded (add_remote_agent or "
                                    f"fetch_remote_metadata first)")
        if r.stale:
            raise nixlNotFoundError(f"metadata of agent {name!r} is stale: the peer restarted; load its new metadata")
        return r

    def _loopback(self):
        r = self._self_remote
        if r is None:
            r = _Remote(self.name, self._segname, None, self._listening, 0)
            self._self_remote = r
        return r

    # -- prepared lists and transfers -------------------------------------------
    def prepXferDlist(self, agent_name, descs, backends=None):
        """Check descs against the registrations of the side they are on
        (this agent for "" / NIXL_INIT_AGENT / its own name, else the loaded
        metadata of agent_name) and keep them for make_prepped_xfer."""
        self._live()
        if not isinstance(descs, nixlXferDList):
            raise nixlInvalidParamError(f"prep_xfer_dlist takes a nixlXferDList, not {type(descs).__name__}")
        agent_name = _text(agent_name)
        mem = descs.getType()
        rows = descs._rows().copy()
        local = agent_name in ("", INIT_AGENT)
        own = local or agent_name == self.name
        if mem == nixl_mem_t.FILE_SEG and not own:
            raise nixlNotSupportedError(_LOCAL_FILES + f" (prepare FILE_SEG lists with this agent's own name, "
                                        f"{self.name!r})")
        # This agent's own lists may be the local side of a storage transfer
        # too; another agent's lists are reached over the network.
        self._pick(backends, (mem,), network=not own)
        if mem == nixl_mem_t.FILE_SEG:
            with self._lock:
                ok, addrs, start, fids = self._files.locate(rows)
            if not ok.all():
                bad = int(np.flatnonzero(~ok)[0])
                raise nixlNotFoundError(f"FILE_SEG descriptor {bad} {tuple(int(x) for x in rows[bad])} (offset, "
                                        f"length, device id) is not inside a file registered with agent {self.name!r}")
            rows[:, 0] = addrs
            return _Prepped(self, mem, rows, start, None if local else self._loopback(), local, fids)
        if own:
            with self._lock:
                t = self._tables.get(mem)
                ok, start = t.locate(rows) if t is not None else (np.zeros(len(rows), dtype=bool), None)
            remote = None if local else self._loopback()
            owner = self.name
        else:
            remote = self._remote_for(agent_name)
            with self._lock:
                ok, start = remote.contains(mem, rows)
            if not ok.all():
                self._pump()  # partial metadata may just have arrived
                with self._lock:
                    ok, start = remote.contains(mem, rows)
            owner = agent_name
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise nixlNotFoundError(f"descriptor {bad} {tuple(int(x) for x in rows[bad])} is not inside memory "
                                    f"{owner!r} registered as {MEM_NAME.get(mem)}"
                                    + ("" if remote is None or remote.name == self.name else " (per its metadata)"))
        return _Prepped(self, mem, rows, start, remote, local)

    def makeXferReq(self, op, local, local_indices, remote, remote_indices, notif=b"", backends=None,
                    skip_desc_merge=False):
        self._live()
        op = int(op)
        if not isinstance(local, _Prepped) or not isinstance(remote, _Prepped):
            raise nixlInvalidParamError("make_prepped_xfer takes two handles from prep_xfer_dlist")
        if local._agent is not self or remote._agent is not self:
            raise nixlInvalidParamError("a prepared list of another agent")
        if local.released or remote.released:
            raise nixlInvalidParamError("a prepared list was released")
        if not local.local or remote.local:
            raise nixlInvalidParamError("the first list must be prepared locally (\"\" or NIXL_INIT_AGENT), the "
                                        "second for the remote agent")
        r = remote.remote
        if r.gen != remote.gen or r.stale:
            raise nixlNotFoundError(f"metadata of agent {r.name!r} changed since the list was prepared (the peer "
                                    f"restarted or was removed): prepare it again")
        li = _indices(local_indices, len(local.rows), "local")
        ri = _indices(remote_indices, len(remote.rows), "remote")
        if len(li) != len(ri):
            raise nixlInvalidParamError(f"{len(li)} local and {len(ri)} remote indices")
        if len(li) == 0:
            raise nixlInvalidParamError("no descriptors to transfer")
        files = ()
        if local.mem == nixl_mem_t.FILE_SEG:
            raise nixlInvalidParamError("FILE_SEG is the remote side of a storage transfer: the local list is DRAM or "
                                        "VRAM, the remote one the file's, prepared with this agent's own name")
        if remote.mem == nixl_mem_t.FILE_SEG:
            backend = self._pick(backends, (local.mem, remote.mem), network=False, kind=_backends.STORAGE)[0].name
            if notif:
                raise nixlBackendError(f"the selected backend {backend!r} does not support notifications")
            with self._lock:
                files = self._files.regs_of(remote.fids[ri])
        else:
            backend = self._pick(backends, (local.mem, remote.mem), network=True)[0].name
        lrows, rrows = local.rows[li], remote.rows[ri]
        ln = lrows[:, 1]
        if not np.array_equal(ln, rrows[:, 1]):
            bad = int(np.flatnonzero(ln != rrows[:, 1])[0])
            raise nixlInvalidParamError(f"length mismatch at index pair {bad}: local {int(ln[bad])}, remote "
                                        f"{int(rrows[bad, 1])}")
        la, ra = lrows[:, 0], rrows[:, 0]
        if len(li) > 1 and not skip_desc_merge:
            ls, rs = local.regstart[li], remote.regstart[ri]
            cont = ((la[:-1] + ln[:-1] == la[1:]) & (ra[:-1] + ln[:-1] == ra[1:]) &
                    (ls[:-1] == ls[1:]) & (rs[:-1] == rs[1:]))
            if cont.any():
                first = np.flatnonzero(np.concatenate(([True], ~cont)))
                la, ra, ln = la[first], ra[first], np.add.reduceat(ln, first)
        seg = self._open(r) if r is not self._self_remote else self._self_segment()
        reqs = np.empty(len(la), dtype=REQ_DTYPE)
        reqs["opcode"] = op
        reqs["reserved"] = 0
        reqs["local"] = la
        reqs["segment"] = seg.handle
        reqs["remote"] = ra
        reqs["length"] = ln
        return _Xfer(weakref.ref(self), op, reqs, r, _bytes(notif), int(ln.sum()), len(li), backend, files)

    def _self_segment(self):
        r = self._loopback()
        if r.seg is None:
            seg = self._engine.open_segment(self._segname)
            with self._lock:
                if r.seg is None:
                    r.seg = seg
                    return seg
            seg.close()
        return r.seg

    def createXferReq(self, op, local_descs, remote_descs, remote_name, notif=b"", backends=None):
        lh = self.prepXferDlist(INIT_AGENT, local_descs, backends)
        rh = self.prepXferDlist(remote_name, remote_descs, backends)
        n = local_descs.descCount()
        if remote_descs.descCount() != n:
            raise nixlInvalidParamError(f"{n} local and {remote_descs.descCount()} remote descriptors")
        idx = np.arange(n)
        return self.makeXferReq(op, lh, idx, rh, idx, notif, backends)

    def postXferReq(self, x, notif=None):
        """Start (or restart, once it ended) a transfer: one te submit of
        its requests. Returns NIXL_IN_PROG or NIXL_SUCCESS, or a negative
        status when te refused it (the transfer is then in error)."""
        self._live()
        if not isinstance(x, _Xfer) or x._agent() is not self:
            raise nixlInvalidParamError("not a transfer handle of this agent")
        if x.released:
            raise nixlInvalidParamError("transfer handle was released")
        if x.state == _IN_PROG and self._refresh(x) == _IN_PROG:
            raise nixlRepostActiveError("transfer is still in progress: wait for DONE or ERR before posting it again")
        if notif:
            if x.files:
                raise nixlBackendError(f"the selected backend {x.backend!r} does not support notifications")
            x.notif = _bytes(notif)
        lib, submit, submit_n = _fast_calls()
        r = x.remote
        if r.gen != x.gen or r.stale:
            return self._fail(x, int(nixl_status_t.NIXL_ERR_NOT_FOUND),
                              f"metadata of agent {r.name!r} changed since the transfer was made (the peer restarted "
                              f"or was removed): make the transfer again")
        if r is not self._self_remote and (r.seg is None or r.seg.handle != x.seg_h):
            # New metadata of the same peer replaced the segment handle.
            seg = self._open(r)
            x.reqs["segment"] = seg.handle
            x.seg_h = seg.handle
        if x.batch:
            rc = lib.te_batch_reset(x.batch)
        else:
            b = _lib.batch_t()
            rc = lib.te_allocate_batch(self._engine.handle, len(x.reqs), byref(b))
            x.batch = b.value
        if rc < 0:
            raise from_te(te.error_for(-rc, _lib.last_error(lib)), "transfer")
        x.err, x.err_msg, x.xfer_ns = 0, "", 0
        x.start_us = time.time_ns() // 1000
        t0 = time.perf_counter_ns()
        if x.files:
            # Checked and submitted under the lock deregistration takes: a
            # file's te addresses are never reached once it was dropped.
            with self._lock:
                gone = [f for f in x.files if not f.live]
                if not gone:
                    rc = submit(x.batch, x.reqs.ctypes.data, len(x.reqs))
            if gone:
                x.t0 = t0
                return self._fail(x, int(nixl_status_t.NIXL_ERR_NOT_FOUND),
                                  f"FILE_SEG {gone[0]!r} was deregistered since the transfer was made")
        elif x.notif:
            rc = submit_n(x.batch, x.reqs.ctypes.data, len(x.reqs), x.notif_seg, (NOTIF_PREFIX + self.name).encode(),
                          x.notif, len(x.notif))
        else:
            rc = submit(x.batch, x.reqs.ctypes.data, len(x.reqs))
        x.post_ns = time.perf_counter_ns() - t0
        x.t0 = t0
        if rc < 0:
            return self._fail(x, int(status_of_te_code(-rc)), _lib.last_error(lib), code=-rc)
        x.state = _IN_PROG
        return self._refresh(x)

    def _refresh(self, x):
        if x.state != _IN_PROG:
            return x.state
        lib = _lib.load()
        st = _lib.BatchStatus()
        lib.te_batch_status(x.batch, byref(st))
        if st.state == te.PENDING:
            return _IN_PROG
        if st.state == te.COMPLETED:
            x.xfer_ns = time.perf_counter_ns() - x.t0
            x.state = _SUCCESS
            return _SUCCESS
        # The first failure's message: te_wait(0) on a finished batch returns
        # its code and leaves the message in te_last_error.
        rc = lib.te_wait(x.batch, 0, None)
        code = -rc if rc < 0 else (-st.error if st.error else te.InternalError.code)
        return self._fail(x, int(status_of_te_code(code)), _lib.last_error(lib) if rc < 0 else
                          f"transfer ended {te.STATE_NAMES.get(st.state, st.state)}", code=code)

    def _fail(self, x, status, msg, code=0):
        x.state, x.err, x.err_msg = status, code, msg
        x.xfer_ns = time.perf_counter_ns() - x.t0 if x.t0 else 0
        log.warning("nixl agent %s: transfer to %s failed: %s", self.name, x.remote.name, msg)
        r = x.remote
        if code in _PEER_CHANGED and r is not self._self_remote and not r.checking and r.gen == x.gen:
            r.checking = True
            try:
                self._post_task(lambda a, rr=r: a._check_peer(rr), "peer check")
            except nixlBackendError:
                r.checking = False
        return status

    def _check_peer(self, r):
        """After a failed transfer: has the peer restarted at the same
        address? Then its metadata is stale (check_remote_metadata turns
        False) and, when both listeners are on, fresh metadata is asked for."""
        try:
            inst = self._engine.probe(r.segment)["instance"]
        except te.TeError as e:
            log.info("nixl agent %s: %s does not answer at %s (%s); its metadata stays until replaced", self.name,
                     r.name, r.segment, e)
            inst = None
        with self._lock:
            r.checking = False
            if inst is None or inst == r.instance or self._remotes.get(r.name) is not r:
                return
            r.stale = True
            seg, r.seg = r.seg, None
        _close(seg)
        log.warning("nixl agent %s: %s restarted at %s (te instance %s -> %s): its metadata is stale", self.name,
                    r.name, r.segment, r.instance, inst)
        if r.listener and self._listening:
            req = json.dumps({"want": r.name, "from": self.name, "reply": self._segname}).encode()
            self._send_ctrl(r.segment, "get", req)

    def getXferStatus(self, x):
        self._live()
        if not isinstance(x, _Xfer) or x._agent() is not self:
            raise nixlInvalidParamError("not a transfer handle of this agent")
        if x.released:
            raise nixlInvalidParamError("transfer handle was released")
        if x.state is None:
            return int(nixl_status_t.NIXL_ERR_NOT_POSTED)
        return self._refresh(x)

    def waitXferReq(self, x, timeout=None):
        """Block until the transfer is no longer in progress or timeout
        seconds passed (None: no limit; te's transfer timeout still ends
        every transfer). Returns its status as getXferStatus does. Not in
        NIXL: a caller that would otherwise poll check_xfer_state in a loop
        spends no CPU while it waits."""
        st = self.getXferStatus(x)
        if st != _IN_PROG:
            return st
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        _lib.load().te_wait(x.batch, ms, None)  # the outcome is read by _refresh
        return self._refresh(x)

    def getXferTelemetry(self, x):
        if not self._telemetry:
            raise nixlNoTelemetryError(f"telemetry is off for agent {self.name!r} (nixl_agent_config("
                                       f"capture_telemetry=True) or NIXL_TELEMETRY_ENABLE=y)")
        if not isinstance(x, _Xfer) or x.state is None:
            raise nixlNoTelemetryError("the transfer was not posted")
        return nixlXferTelemetry(x.start_us, _ceil_us(x.post_ns), _ceil_us(x.xfer_ns) if x.xfer_ns else 0, x.total,
                                 x.count, x.backend)

    def queryXferBackend(self, x):
        return x.backend

    def releaseXferReq(self, x):
        """Free the transfer. One still in flight is cancelled first and
        waited for: te ends it only once nothing touches its memory."""
        if not isinstance(x, _Xfer):
            raise nixlInvalidParamError("not a transfer handle")
        if x.released:
            return _SUCCESS
        x.released = True
        b, x.batch = x.batch, 0
        if b and not self.closed:
            lib = _lib.load()
            if lib.te_free_batch(b) == -te.BatchBusy.code:
                lib.te_batch_cancel(b)
                lib.te_wait(b, -1, None)  # bounded by te's transfer timeout
                if lib.te_free_batch(b) < 0:
                    self._deferred.append(b)
        return _SUCCESS

    def releasedDlistH(self, h):
        if not isinstance(h, _Prepped):
            raise nixlInvalidParamError("not a prepared list handle")
        h.release()
        return _SUCCESS

    def estimateXferCost(self, x):
        raise nixlNotSupportedError("te has no transfer cost estimator")


def _close(seg):
    if seg is not None:
        try:
            seg.close()
        except te.TeError:
            pass


def _indices(v, n, side):
    a = np.asarray(v)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise nixlInvalidParamError(f"{side} indices must be a list or 1-D array of ints")
    a = a.astype(np.int64, copy=False)
    if a.size and (a.min() < 0 or a.max() >= n):
        raise nixlInvalidParamError(f"{side} index out of range 0..{n - 1}")
    return a


def _json(msg):
    if len(msg) > 64 << 10:
        raise ValueError("control message too large")
    v = json.loads(msg)
    if not isinstance(v, dict):
        raise ValueError("control message is not an object")
    return v


def _engine_args(cfg, listening):
    """te.Engine keyword arguments for an agent.

    TE_NIXL_HOST: the host te binds (default with the listener on: every
    address, 0.0.0.0, as NIXL's own listener accepts wherever its users
    dial, 127.0.0.1 included; with it off, te's own choice, the first
    non-loopback IPv4 address). Every connection to it authenticates when
    there is a cluster secret; without one te trusts the network, as NIXL
    does, and says so in its log. The listener port is listen_port when
    the listener is on, else a free port. TE_NIXL_TRANSPORTS and
    TE_NIXL_FORCE_TRANSPORT pick te's transports, TE_NIXL_PARAMS passes
    transport parameters ("rdma.devices=mlx5_0,tcp.conns=4"). The cluster secret comes
    from TE_AUTH_SECRET_FILE or TE_AUTH_SECRET, read when the agent is made.
    """
    host = os.environ.get("TE_NIXL_HOST", "").strip()
    if not host and listening:
        host = "0.0.0.0"
    port = int(getattr(cfg, "listenPort", 0)) if listening else 0
    if not 0 <= port < 65536:
        raise nixlInvalidParamError(f"listen_port {port} out of range")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    args = {"listen_addr": f"{host}:{port}" if (host or port) else None}
    if os.environ.get("TE_NIXL_TRANSPORTS"):
        args["transports"] = os.environ["TE_NIXL_TRANSPORTS"]
    if os.environ.get("TE_NIXL_FORCE_TRANSPORT"):
        args["force_transport"] = os.environ["TE_NIXL_FORCE_TRANSPORT"]
    if os.environ.get("TE_NIXL_PARAMS"):
        args["params"] = os.environ["TE_NIXL_PARAMS"]
    if os.environ.get("TE_AUTH_SECRET_FILE"):
        args["auth_secret_file"] = os.environ["TE_AUTH_SECRET_FILE"]
    elif os.environ.get("TE_AUTH_SECRET"):
        args["auth_secret"] = os.environ["TE_AUTH_SECRET"]
    return args


def _run(a, q, job, stop):
    if q.expire(job):
        log.warning("nixl agent %s: %s dropped: not started within its %.0f s", a.name, job.what,
                    TASK_TTL_S if q is a._tasks else REPLY_TTL_S)
        return
    try:
        job.fn(a)
    except Exception as e:
        if not stop.is_set():
            log.warning("nixl agent %s: background %s failed: %s", a.name, job.what, e)


def _worker_main(ref, q, stop):
    """The agent's background thread: runs its own queued sends and
    probes, and drains the listener while it is on. Holds the agent only
    weakly."""
    while not stop.is_set():
        job = q.get(LISTEN_POLL_S)
        a = ref()
        if a is None:
            return
        try:
            if job is not None:
                _run(a, q, job, stop)
            if a._listening and not stop.is_set():
                a._pump()
        except Exception as e:
            if not stop.is_set():
                log.warning("nixl agent %s: background task failed: %s", a.name, e)
        finally:
            del a


def _reply_main(ref, q, stop):
    """Runs replies to peers' requests, apart from the agent's own sends:
    a reply to a silent peer holds this thread only (te's RPC timeout).
    Holds the agent only weakly."""
    while not stop.is_set():
        job = q.get(0.1)
        if job is None:
            continue
        a = ref()
        if a is None:
            return
        try:
            _run(a, q, job, stop)
        finally:
            del a


def _etcd_fetch_main(ref, etcd, stop, slots, name, label):
    try:
        # The watch comes first: a peer that leaves right after its
        # metadata loaded must be seen leaving (its keys' deletion would
        # otherwise happen before anyone watched them).
        try:
            etcd.watch(name, label)
            watched = True
        except Exception as e:
            log.warning("nixl agent %s: %s; its metadata stays loaded until removed by hand", etcd.agent, e)
            watched = False
        if watched:
            a = ref()
            if a is not None:
                a._start_etcd_watcher()
                del a
        try:
            blob = etcd.fetch(name, label, stop)
            found = _meta.decode(blob).name
        except Exception as e:
            if not stop.is_set():
                log.error("nixl agent %s: fetching metadata of %s from etcd failed: %s", etcd.agent, name, e)
            if watched:
                etcd.unwatch(name, label)
            return
        if found != name:
            log.error("nixl agent %s: metadata at %s names agent %r, not %r: not loaded", etcd.agent,
                      etcd.key(name, label), found, name)
            if watched:
                etcd.unwatch(name, label)
            return
        a = ref()
        if a is None or stop.is_set():
            return
        try:
            a._load(blob, eager=False)
            log.debug("nixl agent %s: loaded metadata of %s from etcd", a.name, name)
            if watched and not etcd.loaded(name, label):
                # The keys left between the read and the load: the watch
                # counts deletions only from now, so drop it here.
                etcd.unwatch(name, label)
                with a._lock:
                    r = a._remotes.get(name)
                    if r is not None:
                        a._drop(r)
                log.info("nixl agent %s: metadata of %s left etcd while it loaded: dropped", a.name, name)
        except Exception as e:
            log.error("nixl agent %s: metadata of %s from etcd refused: %s", a.name, name, e)
            if watched:
                etcd.unwatch(name, label)
            return
        finally:
            del a
    finally:
        slots.release()


def _etcd_watch_main(ref, etcd, stop):
    """Drops the metadata of agents whose keys left etcd (NIXL's watcher).
    Holds the agent only weakly; ends with it."""
    while not stop.wait(ETCD_WATCH_POLL_S):
        try:
            gone = etcd.gone()
        except Exception as e:
            if not stop.is_set():
                log.warning("nixl agent %s: reading etcd changes failed: %s", etcd.agent, e)
            continue
        if not gone:
            continue
        a = ref()
        if a is None:
            return
        try:
            with a._lock:
                for name in gone:
                    r = a._remotes.get(name)
                    if r is not None:
                        a._drop(r)
                        log.info("nixl agent %s: metadata of %s left etcd: dropped", a.name, name)
        finally:
            del a


def _shutdown(engine, stop, worker, etcd=None):
    stop.set()
    if isinstance(worker, threading.Thread) and worker is not threading.current_thread() and worker.is_alive():
        worker.join(timeout=10)
    if etcd is not None:
        try:
            etcd.close()  # revokes the lease: the agent's keys go now
        except Exception:
            pass
    try:
        engine.close()
    except Exception:
        pass
