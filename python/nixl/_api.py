"""NIXL's Python API (nixl._api): nixl_agent and nixl_agent_config, on te.

    from nixl._api import nixl_agent, nixl_agent_config
    agent = nixl_agent("decode-0", nixl_agent_config(backends=["UCX"]))

Method names, arguments, defaults and return values follow NIXL's Python
API; nixl/__init__.py lists what differs on te.
"""

import numpy as np

import te

from . import _bindings as nixlBind
from . import _descs
from ._types import MEM_BY_NAME, OP_BY_NAME, nixl_status_t, nixl_thread_sync_t, nixlInvalidParamError, \
    nixlNotSupportedError
from .logging import get_logger

logger = get_logger("nixl")

DEFAULT_COMM_PORT = nixlBind.DEFAULT_COMM_PORT

# The handle types prep_xfer_dlist and make_prepped_xfer / initialize_xfer
# return (NIXL's names); both have release().
from ._agent import _Prepped as nixl_prepped_dlist_handle  # noqa: E402
from ._agent import _Xfer as nixl_xfer_handle  # noqa: E402

nixl_backend_handle = nixlBind.nixlBackendH

_STATE = {int(nixl_status_t.NIXL_SUCCESS): "DONE", int(nixl_status_t.NIXL_IN_PROG): "PROC"}


class nixl_agent_config:
    """Agent configuration.

    enable_prog_thread: accepted (te progresses transfers itself).
    enable_listen_thread: the agent answers and sends metadata over its
        listener (te's RPC listener at listen_port).
    listen_port: the listener's port when it is on (0: a free one).
    capture_telemetry: keep per-transfer telemetry (NIXL_TELEMETRY_ENABLE,
        when set, decides instead).
    num_threads: accepted and passed to the backends' parameters (te sizes
        its own workers).
    backends: backend names created with the agent (see nixl/__init__.py).
    sync_mode: a nixl_thread_sync_t, or None: STRICT with a listener, NONE
        without (te's agent is thread-safe in every mode)."""

    def __init__(self, enable_prog_thread=True, enable_listen_thread=False, listen_port=DEFAULT_COMM_PORT,
                 capture_telemetry=False, num_threads=0, backends=None, sync_mode=None):
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError(f"sync_mode must be a nixl_thread_sync_t or None, not {type(sync_mode).__name__}")
        self.enable_prog_thread = enable_prog_thread
        self.enable_listen_thread = enable_listen_thread
        self.listen_port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.backends = ["UCX"] if backends is None else list(backends)
        self.sync_mode = sync_mode

    def __repr__(self):
        return (f"nixl_agent_config(enable_prog_thread={self.enable_prog_thread}, enable_listen_thread="
                f"{self.enable_listen_thread}, listen_port={self.listen_port}, capture_telemetry="
                f"{self.capture_telemetry}, num_threads={self.num_threads}, backends={self.backends}, "
                f"sync_mode={self.sync_mode})")


def _names(backends):
    return [b.decode() if isinstance(b, bytes) else b for b in (backends or [])]


def _is_tensor(obj):
    return hasattr(obj, "data_ptr") and not isinstance(obj, (int, bytes, bytearray, memoryview, np.ndarray))


def _tensor_desc(t):
    """(address, bytes, nixl_mem_t, device id) of a contiguous tensor, or
    None (logged) for one that is not contiguous or not on a CPU or GPU."""
    if hasattr(t, "is_contiguous") and not t.is_contiguous():
        logger.error("a tensor is not contiguous: its data_ptr() and size would not cover its elements")
        return None
    try:
        kind, index = te.device_of(t)
    except te.TeError as e:
        logger.error("%s", e)
        return None
    n = int(t.nbytes) if hasattr(t, "nbytes") else int(t.numel()) * int(t.element_size())
    if kind == "cpu":
        return int(t.data_ptr()), n, nixlBind.DRAM_SEG, 0
    return int(t.data_ptr()), n, nixlBind.VRAM_SEG, int(index)


def _tensors(descs):
    """Rows and memory type of a tensor or list of tensors (None: not
    tensors; False: tensors that cannot be described)."""
    ts = [descs] if _is_tensor(descs) else None
    if ts is None and isinstance(descs, (list, tuple)) and descs and all(_is_tensor(t) for t in descs):
        ts = list(descs)
    if ts is None:
        return None
    rows = []
    mem = None
    for t in ts:
        d = _tensor_desc(t)
        if d is None:
            return False
        if mem is not None and d[2] != mem:
            logger.error("tensors on different kinds of memory in one list")
            return False
        mem = d[2]
        rows.append((d[0], d[1], d[3]))
    return rows, mem, ts


class nixl_agent:
    """A NIXL agent backed by a te engine (see nixl/__init__.py)."""

    def __init__(self, agent_name, nixl_conf=None, instantiate_all=False):
        if isinstance(agent_name, bytes):
            agent_name = agent_name.decode()
        if not agent_name:
            raise ValueError("agent name must not be empty")
        conf = nixl_conf if nixl_conf is not None else nixl_agent_config()
        sync = conf.sync_mode
        if sync is None:
            sync = (nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT if conf.enable_listen_thread
                    else nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE)
        cfg = nixlBind.nixlAgentConfig(conf.enable_prog_thread, conf.enable_listen_thread, conf.listen_port,
                                       sync.value, conf.capture_telemetry, conf.num_threads)
        self.agent = nixlBind.nixlAgent(agent_name, cfg)
        self.name = agent_name
        self.notifs = {}
        self.backends = {}
        self.backend_mems = {}
        self.backend_options = {}
        self.nixl_mems = dict(MEM_BY_NAME)
        self.nixl_ops = dict(OP_BY_NAME)
        self.plugin_list = self.agent.getAvailPlugins()
        self.plugin_b_options = {}
        self.plugin_mem_types = {}
        for plugin in self.plugin_list:
            params, mems = self.agent.getPluginParams(plugin)
            self.plugin_b_options[plugin] = params
            self.plugin_mem_types[plugin] = [nixlBind_mem_name(m) for m in mems]
        wanted = list(self.plugin_list) if instantiate_all else conf.backends
        for b in wanted:
            if b not in self.plugin_list:
                logger.warning("backend %s is not available here (te's nixl knows %s); skipped", b, self.plugin_list)
                continue
            params = dict(self.plugin_b_options[b])
            if conf.num_threads and "num_threads" in params:
                params["num_threads"] = str(conf.num_threads)
            self.create_backend(b, params)
        logger.debug("initialized NIXL agent %s on te", agent_name)

    # -- plugins and backends ------------------------------------------------
    def get_plugin_list(self):
        return list(self.plugin_list)

    def get_plugin_mem_types(self, backend):
        return list(self.plugin_mem_types.get(backend, []))

    def get_plugin_params(self, backend):
        return dict(self.plugin_b_options.get(backend, {}))

    def get_backend_mem_types(self, backend):
        return list(self.backend_mems.get(backend, []))

    def get_backend_params(self, backend):
        return dict(self.backend_options.get(backend, {}))

    def create_backend(self, backend, initParams=None):
        h = self.agent.createBackend(backend, dict(initParams or {}))
        self.backends[backend] = h
        params, mems = self.agent.getBackendParams(h)
        self.backend_options[backend] = params
        self.backend_mems[backend] = [nixlBind_mem_name(m) for m in mems]
        logger.debug("backend %s was instantiated", backend)
        return h

    def _handles(self, backends):
        return [self.backends[b] for b in _names(backends)]

    # -- descriptors -----------------------------------------------------------
    def _mem(self, mem_type):
        if mem_type is None:
            return None
        return self.nixl_mems[mem_type]  # KeyError for an unknown name, as NIXL

    def get_xfer_descs(self, descs, mem_type=None, is_sorted=False):
        """A nixlXferDList from a nixlXferDList, a tensor or list of tensors,
        an Nx3 numpy array or a list of (address, length, device) tuples (the
        last two need mem_type). None (logged) when descs is none of these."""
        mem = self._mem(mem_type)
        if isinstance(descs, nixlBind.nixlXferDList):
            return descs
        if isinstance(descs, nixlBind.nixlRegDList):
            logger.error("get_xfer_descs got registration descriptors; use their trim()")
            return None
        t = _tensors(descs)
        if t is False:
            return None
        try:
            if t is not None:
                return nixlBind.nixlXferDList(t[1], t[0], is_sorted)
            if mem is None:
                logger.error("get_xfer_descs needs mem_type for %s", type(descs).__name__)
                return None
            if isinstance(descs, (np.ndarray, list, tuple)):
                return nixlBind.nixlXferDList(mem, descs if isinstance(descs, np.ndarray) else list(descs),
                                              is_sorted)
        except (ValueError, TypeError) as e:
            logger.error("bad transfer descriptors: %s", e)
            return None
        logger.error("get_xfer_descs cannot use %s", type(descs).__name__)
        return None

    def get_reg_descs(self, descs, mem_type=None, is_sorted=False):
        """A nixlRegDList from a nixlRegDList, a tensor or list of tensors,
        an Nx3 (or Nx4) numpy array or a list of (address, length, device,
        metadata) tuples (the last two need mem_type). None (logged) when
        descs is none of these."""
        mem = self._mem(mem_type)
        if isinstance(descs, nixlBind.nixlRegDList):
            return descs
        if isinstance(descs, nixlBind.nixlXferDList):
            logger.error("get_reg_descs got transfer descriptors")
            return None
        t = _tensors(descs)
        if t is False:
            return None
        try:
            if t is not None:
                return nixlBind.nixlRegDList(t[1], [r + ("",) for r in t[0]], is_sorted)
            if mem is None:
                logger.error("get_reg_descs needs mem_type for %s", type(descs).__name__)
                return None
            if isinstance(descs, (np.ndarray, list, tuple)):
                return nixlBind.nixlRegDList(mem, descs if isinstance(descs, np.ndarray) else list(descs), is_sorted)
        except (ValueError, TypeError) as e:
            logger.error("bad registration descriptors: %s", e)
            return None
        logger.error("get_reg_descs cannot use %s", type(descs).__name__)
        return None

    def get_serialized_descs(self, descs):
        """A descriptor list as bytes (te's bounded format, not pickle: a
        list a peer sends cannot run code here)."""
        return _descs.serialize(descs)

    def deserialize_descs(self, serdes):
        try:
            return _descs.deserialize(serdes)
        except ValueError as e:
            raise nixlInvalidParamError(str(e)) from None

    # -- memory ------------------------------------------------------------------
    def register_memory(self, reg_list, mem_type=None, backends=None):
        """Register memory with te; returns the nixlRegDList (pass it to
        deregister_memory), or None when reg_list cannot be described."""
        descs = self.get_reg_descs(reg_list, mem_type)
        if descs is None:
            return None
        pins = None
        t = _tensors(reg_list)
        if t:
            pins = {(r[0], r[1]): obj for r, obj in zip(t[0], t[2])}
        self.agent.registerMem(descs, self._handles(backends), _pins=pins)
        return descs

    def deregister_memory(self, dereg_list, backends=None):
        descs = self.get_reg_descs(dereg_list)
        if descs is None:
            raise nixlInvalidParamError("deregister_memory takes what register_memory returned")
        self.agent.deregisterMem(descs, self._handles(backends))

    def query_memory(self, reg_list, backend, mem_type=None):
        descs = self.get_reg_descs(reg_list, mem_type)
        if descs is None:
            raise nixlInvalidParamError("query_memory could not describe reg_list")
        return self.agent.queryMem(descs, self.backends[backend])

    def make_connection(self, remote_agent, backends=None):
        self.agent.makeConnection(remote_agent, self._handles(backends))

    # -- transfers -----------------------------------------------------------------
    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, backends=None):
        descs = self.get_xfer_descs(xfer_list, mem_type)
        if descs is None:
            raise nixlInvalidParamError("prep_xfer_dlist could not describe xfer_list")
        return self.agent.prepXferDlist(agent_name, descs, self._handles(backends))

    def make_prepped_xfer(self, operation, local_xfer_side, local_indices, remote_xfer_side, remote_indices,
                          notif_msg=b"", backends=None, skip_desc_merge=False):
        op = self.nixl_ops[operation]
        return self.agent.makeXferReq(op, local_xfer_side, local_indices, remote_xfer_side, remote_indices,
                                      notif_msg, self._handles(backends), skip_desc_merge)

    def initialize_xfer(self, operation, local_descs, remote_descs, remote_agent, notif_msg=b"", backends=None):
        op = self.nixl_ops[operation]
        ld, rd = self.get_xfer_descs(local_descs), self.get_xfer_descs(remote_descs)
        if ld is None or rd is None:
            raise nixlInvalidParamError("initialize_xfer takes transfer descriptor lists (get_xfer_descs)")
        return self.agent.createXferReq(op, ld, rd, remote_agent, notif_msg, self._handles(backends))

    def transfer(self, handle, notif_msg=b""):
        return _STATE.get(self.agent.postXferReq(handle, notif_msg), "ERR")

    def check_xfer_state(self, handle):
        return _STATE.get(self.agent.getXferStatus(handle), "ERR")

    def wait_xfer(self, handle, timeout=None):
        """Wait (releasing the GIL, spending no CPU) until the transfer is
        DONE or ERR, or timeout seconds passed; returns check_xfer_state's
        string. Not in NIXL, whose callers poll check_xfer_state."""
        return _STATE.get(self.agent.waitXferReq(handle, timeout), "ERR")

    def get_xfer_telemetry(self, handle):
        return self.agent.getXferTelemetry(handle)

    def query_xfer_backend(self, handle):
        return self.agent.queryXferBackend(handle)

    def estimate_xfer_cost(self, req_handle):
        return self.agent.estimateXferCost(req_handle)

    def release_xfer_handle(self, handle):
        self.agent.releaseXferReq(handle)

    def release_dlist_handle(self, handle):
        self.agent.releasedDlistH(handle)

    def prep_mem_view(self, *args, **kwargs):
        raise nixlNotSupportedError("memory views need NIXL's UCX GPU device API, which te does not have")

    def release_mem_view(self, *args, **kwargs):
        raise nixlNotSupportedError("memory views need NIXL's UCX GPU device API, which te does not have")

    def get_remote_descs(self, *args, **kwargs):
        raise nixlNotSupportedError("remote descriptor lists are for memory views, which te does not have")

    # -- notifications --------------------------------------------------------------
    def get_new_notifs(self, backends=None):
        return self.agent.getNotifs({}, self._handles(backends))

    def update_notifs(self, backends=None):
        self.notifs = self.agent.getNotifs(self.notifs, self._handles(backends))
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name, lookup_tag, backends=None, tag_is_prefix=True):
        """Whether a notification from remote_agent_name starting with (or,
        tag_is_prefix=False, containing) lookup_tag has arrived; the first
        such one is removed."""
        if isinstance(remote_agent_name, bytes):
            remote_agent_name = remote_agent_name.decode()
        tag = lookup_tag.encode() if isinstance(lookup_tag, str) else bytes(lookup_tag)
        self.update_notifs(backends)
        msgs = self.notifs.get(remote_agent_name)
        if not msgs:
            return False
        for i, m in enumerate(msgs):
            if (m.startswith(tag) if tag_is_prefix else tag in m):
                del msgs[i]
                return True
        return False

    def send_notif(self, remote_agent_name, notif_msg, backend=None):
        self.agent.genNotif(remote_agent_name, notif_msg, self.backends[backend] if backend else None)

    # -- metadata ----------------------------------------------------------------------
    def get_agent_metadata(self):
        return self.agent.getLocalMD()

    def get_partial_agent_metadata(self, descs, inc_conn_info=False, backends=None):
        return self.agent.getLocalPartialMD(descs, inc_conn_info, self._handles(backends))

    def add_remote_agent(self, metadata):
        return self.agent.loadRemoteMD(metadata)

    def remove_remote_agent(self, agent):
        self.agent.invalidateRemoteMD(agent)

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        self.agent.sendLocalMD(ip_addr, port)

    def send_partial_agent_metadata(self, descs, inc_conn_info=False, backends=None, ip_addr="",
                                    port=DEFAULT_COMM_PORT, label=""):
        self.agent.sendLocalPartialMD(descs, inc_conn_info, self._handles(backends), ip_addr, port, label)

    def fetch_remote_metadata(self, remote_agent, ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        self.agent.fetchRemoteMD(remote_agent, ip_addr, port, label)

    def invalidate_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        self.agent.invalidateLocalMD(ip_addr, port)

    def check_remote_metadata(self, agent, descs=None):
        if descs is not None and not isinstance(descs, (nixlBind.nixlXferDList, nixlBind.nixlRegDList)):
            converted = self.get_xfer_descs(descs)
            if converted is None:
                raise nixlInvalidParamError("check_remote_metadata takes a descriptor list")
            descs = converted
        return self.agent.checkRemoteMD(agent, descs)

    # -- te additions --------------------------------------------------------------------
    def close(self):
        """Stop the agent now (its te engine, listener and transfers) rather
        than when it is garbage-collected. Not in NIXL."""
        self.agent.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def nixlBind_mem_name(m):
    from ._types import MEM_NAME

    return MEM_NAME[m]
