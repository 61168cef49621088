"""Loading libte.so and declaring every function of te.h for ctypes.

libte.so holds a Go runtime, which starts when the library is loaded and
cannot run in a child forked afterwards. A child forked from a process that
has loaded it gets te.ForkError from every call, at once (the library itself
returns TE_ERR_FORKED too); a child of a process that only imported te, and
never called into it, loads its own copy and works."""

import ctypes
import os
import threading
from ctypes import (POINTER, Structure, c_char, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint32, c_uint64,
                    c_void_p)
from pathlib import Path

#: te.h's TE_ABI_VERSION_MAJOR / _MINOR this binding was written against.
ABI_MAJOR = 1
ABI_MINOR = 4

engine_t = c_uint64
segment_t = c_uint64
batch_t = c_uint64
layout_t = c_uint64
plan_t = c_uint64
handoff_t = c_uint64
store_t = c_uint64
xfer_t = c_uint64


class Config(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("log_level", c_int32),
        ("segment_name", c_char_p),
        ("metadata", c_char_p),
        ("listen_addr", c_char_p),
        ("hostname", c_char_p),
        ("transports", c_char_p),
        ("force_transport", c_char_p),
        ("params", c_char_p),
        ("transfer_timeout_ms", c_int64),
        ("rpc_timeout_ms", c_int64),
        ("max_frame", c_uint64),
        ("max_notifies", c_int64),
        # ABI 1.2
        ("auth_secret", c_char_p),
        ("auth_secret_file", c_char_p),
        ("accept_mooncake_peers", c_int32),
        ("allow_mooncake_with_secret", c_int32),
        ("unregister_grace_ms", c_int64),
        ("max_conns", c_int32),
        ("max_conns_per_host", c_int32),
        ("idle_timeout_ms", c_int64),
        ("progress_timeout_ms", c_int64),
        ("notify_bytes", c_uint64),
        ("notify_bytes_per_sender", c_uint64),
        # ABI 1.3
        ("encrypt", c_int32),
    ]


class Region(Structure):
    _fields_ = [("addr", c_void_p), ("length", c_uint64), ("location", c_char_p), ("remote", c_int32),
                ("reserved", c_int32)]


class Range(Structure):
    _fields_ = [("addr", c_uint64), ("length", c_uint64)]


class Request(Structure):
    _fields_ = [("opcode", c_int32), ("reserved", c_int32), ("local", c_void_p), ("segment", segment_t),
                ("remote", c_uint64), ("length", c_uint64)]


class TaskStatus(Structure):
    _fields_ = [("state", c_int32), ("error", c_int32), ("transferred", c_uint64), ("transport", c_char * 16)]


class BatchStatus(Structure):
    _fields_ = [("state", c_int32), ("error", c_int32), ("transferred", c_uint64), ("tasks", c_uint64),
                ("completed", c_uint64), ("failed", c_uint64)]


class Notify(Structure):
    _fields_ = [("name", c_char_p), ("msg", c_void_p), ("msg_len", c_uint64)]


class NotifyFrom(Structure):
    _fields_ = [("name", c_char_p), ("msg", c_void_p), ("msg_len", c_uint64),
                ("sender", c_char_p), ("sender_instance", c_char_p)]


class Probe(Structure):
    _fields_ = [("rtt_ns", c_uint64), ("version", c_uint64), ("instance", c_char * 40)]


class BufferDesc(Structure):
    _fields_ = [("addr", c_uint64), ("length", c_uint64), ("location", c_char * 32)]


class Stats(Structure):
    _fields_ = [("size", c_uint32), ("buffers", c_uint32), ("tasks_completed", c_uint64), ("tasks_failed", c_uint64),
                ("tasks_timed_out", c_uint64), ("bytes_transferred", c_uint64), ("notifies_sent", c_uint64),
                ("notifies_received", c_uint64)]


class LayoutInfo(Structure):
    _fields_ = [("size", c_uint32), ("num_layers", c_int32), ("first_layer", c_int32), ("num_blocks", c_int32),
                ("components", c_int32), ("regions", c_int32), ("block_bytes", c_uint64), ("layer_bytes", c_uint64)]


class Span(Structure):
    _fields_ = [("addr", c_uint64), ("length", c_uint64)]


class PlanTransfer(Structure):
    _fields_ = [("src", c_uint64), ("dst", c_uint64), ("length", c_uint64)]


class PlanStats(Structure):
    _fields_ = [("size", c_uint32), ("layers", c_int32), ("layer_begin", c_int32), ("layer_end", c_int32),
                ("blocks", c_int32), ("pieces", c_int32), ("bytes", c_uint64), ("block_requests", c_uint64),
                ("requests", c_uint64), ("merged", c_uint64), ("max_layer_requests", c_uint64)]


class HandoffResult(Structure):
    _fields_ = [("size", c_uint32), ("mode", c_int32), ("mover", c_int32), ("recorded", c_int32),
                ("bytes", c_uint64), ("block_requests", c_uint64), ("requests", c_uint64),
                ("elapsed_ns", c_uint64), ("transport", c_char * 16)]


class HandoffStatus(Structure):
    _fields_ = [("size", c_uint32), ("state", c_int32), ("mode", c_int32), ("error", c_int32),
                ("settled", c_int32), ("reserved", c_int32), ("bytes", c_uint64), ("reason", c_char * 256)]


# Every function of te.h: name -> argument types. All return int.
PROTOTYPES = {
    "te_abi_version": [],
    "te_last_error": [c_char_p, c_size_t],
    "te_local_topology": [c_char_p, c_char_p, c_size_t],  # ABI 1.2
    "te_create": [POINTER(Config), POINTER(engine_t)],
    "te_destroy": [engine_t],
    "te_segment_name": [engine_t, c_char_p, c_size_t],
    "te_rpc_port": [engine_t, POINTER(c_int32)],
    "te_cxl_memory": [engine_t, POINTER(c_uint64), POINTER(c_uint64)],  # ABI 1.4
    "te_stats": [engine_t, POINTER(Stats)],
    "te_stats_json": [engine_t, c_char_p, c_size_t],
    "te_version": [c_char_p, c_size_t],  # ABI 1.3
    "te_metrics": [engine_t, c_char_p, c_size_t, POINTER(c_size_t)],  # ABI 1.3
    "te_register": [engine_t, c_void_p, c_uint64, c_char_p, c_int32],
    "te_unregister": [engine_t, c_void_p],
    "te_register_file": [engine_t, c_char_p, c_int32, c_uint64, c_uint64, c_uint32, POINTER(c_void_p)],  # ABI 1.3
    "te_register_batch": [engine_t, POINTER(Region), c_size_t],
    "te_unregister_batch": [engine_t, POINTER(c_void_p), c_size_t],
    "te_open_segment": [engine_t, c_char_p, POINTER(segment_t)],
    "te_close_segment": [segment_t],
    "te_warmup_segment": [engine_t, c_char_p],  # ABI 1.4
    "te_grant_window_to": [engine_t, c_char_p, POINTER(Range), c_size_t, POINTER(c_uint64)],  # ABI 1.4
    "te_grant_window_to_first": [engine_t, POINTER(Range), c_size_t, POINTER(c_uint64)],  # ABI 1.4
    "te_bind_window": [engine_t, c_uint64, c_char_p],  # ABI 1.4
    "te_revoke_window": [engine_t, c_uint64],  # ABI 1.4
    "te_segment_buffers": [segment_t, POINTER(BufferDesc), c_size_t, POINTER(c_size_t)],
    "te_allocate_batch": [engine_t, c_size_t, POINTER(batch_t)],
    "te_submit": [batch_t, POINTER(Request), c_size_t],
    "te_submit_with_notify": [batch_t, POINTER(Request), c_size_t, c_char_p, c_char_p, c_char_p, c_size_t],
    "te_submit_windows": [batch_t, POINTER(Request), POINTER(c_uint64), c_size_t],  # ABI 1.4
    "te_submit_windows_with_notify": [batch_t, POINTER(Request), POINTER(c_uint64), c_size_t, c_char_p, c_char_p,
                                      c_char_p, c_size_t],  # ABI 1.4
    "te_task_status": [batch_t, c_size_t, POINTER(TaskStatus)],
    "te_batch_status": [batch_t, POINTER(BatchStatus)],
    "te_wait": [batch_t, c_int64, POINTER(BatchStatus)],
    "te_batch_fd": [batch_t, POINTER(c_int32)],
    "te_batch_cancel": [batch_t],
    "te_batch_reset": [batch_t],
    "te_free_batch": [batch_t],
    "te_notify_send": [engine_t, c_char_p, c_char_p, c_char_p, c_size_t],
    "te_notify_drain": [engine_t, POINTER(POINTER(Notify)), POINTER(c_size_t)],
    "te_notify_drain_from": [engine_t, POINTER(POINTER(NotifyFrom)), POINTER(c_size_t)],
    "te_notify_free": [c_void_p],
    "te_probe": [engine_t, c_char_p, POINTER(Probe)],
    # ABI 1.1: layouts, plans, handoff
    "te_layout_create": [c_char_p, POINTER(layout_t)],
    "te_layout_bytes": [c_char_p, POINTER(c_uint64), POINTER(c_uint64)],
    "te_layout_info": [layout_t, POINTER(LayoutInfo)],
    "te_layout_regions": [layout_t, POINTER(Span), c_size_t, POINTER(c_size_t)],
    "te_layout_free": [layout_t],
    "te_plan_create": [layout_t, layout_t, POINTER(c_int32), c_size_t, POINTER(c_int32), c_size_t, c_int32, c_int32,
                       POINTER(plan_t)],
    "te_plan_stats": [plan_t, POINTER(PlanStats)],
    "te_plan_transfers": [plan_t, c_int32, POINTER(PlanTransfer), c_size_t, POINTER(c_size_t)],
    "te_plan_submit_layer": [batch_t, segment_t, plan_t, c_int32, c_int32],
    "te_plan_submit": [batch_t, segment_t, plan_t, c_int32],
    "te_plan_free": [plan_t],
    "te_handoff_create": [engine_t, c_char_p, POINTER(handoff_t)],
    "te_handoff_destroy": [handoff_t],
    "te_handoff_expect": [handoff_t, c_char_p, layout_t, POINTER(c_int32), c_size_t, c_int32, c_int64,
                          POINTER(xfer_t)],
    "te_handoff_ready": [handoff_t, c_char_p, layout_t, POINTER(c_int32), c_size_t, c_int32, c_int64,
                         POINTER(xfer_t)],
    "te_handoff_send_layer": [xfer_t, c_int32, c_int64],
    "te_handoff_wait": [xfer_t, c_int64, POINTER(HandoffResult)],
    "te_handoff_send": [xfer_t, c_int64, POINTER(HandoffResult)],
    "te_handoff_abort": [xfer_t, c_char_p],
    "te_handoff_status": [xfer_t, POINTER(HandoffStatus)],
    "te_handoff_free": [xfer_t],
    # ABI 1.4: metadata stores
    "te_store_open": [c_char_p, POINTER(store_t)],
    "te_store_put": [store_t, c_char_p, c_char_p, c_size_t],
    "te_store_get": [store_t, c_char_p, c_void_p, c_size_t, POINTER(c_size_t)],
    "te_store_delete": [store_t, c_char_p],
    "te_store_watch": [store_t, c_char_p],
    "te_store_unwatch": [store_t, c_char_p],
    "te_store_changes": [store_t, c_char_p, c_size_t, POINTER(c_size_t)],
    "te_store_close": [store_t],
}

_lock = threading.Lock()
_lib = None
_path = None
_forked = False


def _after_fork_in_child():
    # The parent had loaded the library: its Go runtime cannot run here.
    global _forked
    if _lib is not None:
        _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked():
    """True in a child forked from a process that had loaded libte."""
    return _forked


def _refuse_forked():
    from .errors import ForkError

    raise ForkError("te was loaded in the parent of this forked process and its Go runtime cannot run here; "
                    "start workers with multiprocessing's \"spawn\" method (or exec), or load te only in the child")


def candidates():
    """Where load() looks, in order: $TE_LIBRARY, this package's folder (an
    installed wheel has libte.so there), and, in a source checkout, the
    repository's build/ folder."""
    here = Path(__file__).resolve().parent
    out = []
    env = os.environ.get("TE_LIBRARY")
    if env:
        out.append(Path(env))
    out.append(here / "libte.so")
    repo = here.parent.parent
    if (repo / "go.mod").exists() and (repo / "include" / "te.h").exists():
        out.append(repo / "build" / "libte.so")
    return out


def load():
    """Return the loaded libte (loading it on first use). The library holds a
    Go runtime: it is loaded once per process and never unloaded. Raises
    te.ForkError in a child forked after the parent loaded it."""
    global _lib, _path
    if _forked:
        _refuse_forked()
    with _lock:
        if _lib is not None:
            return _lib
        from .errors import LibraryError

        env = os.environ.get("TE_LIBRARY")
        paths = candidates()
        if env:
            # An explicit choice is not silently replaced by another library.
            paths = paths[:1]
        tried = []
        for p in paths:
            if not p.exists():
                tried.append(f"{p} (missing)")
                continue
            try:
                lib = ctypes.CDLL(str(p))
            except OSError as e:
                tried.append(f"{p} ({e})")
                continue
            _declare(lib)
            v = lib.te_abi_version()
            major, minor = v >> 16, v & 0xFFFF
            if major != ABI_MAJOR or minor < ABI_MINOR:
                raise LibraryError(f"{p} has ABI {major}.{minor}; this binding needs {ABI_MAJOR}.{ABI_MINOR} or a later "
                                   f"{ABI_MAJOR}.x")
            _lib, _path = lib, p
            return lib
        raise LibraryError("libte.so not found; tried: " + "; ".join(tried) +
                           ". Install te (pip install .), build it with `make`, or set TE_LIBRARY to its path.")


def path():
    """Path of the loaded library (None before load())."""
    return _path


def _declare(lib):
    for name, args in PROTOTYPES.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = c_int


def last_error(lib=None):
    """The calling thread's last error message from libte."""
    lib = lib or load()
    buf = ctypes.create_string_buffer(4096)
    lib.te_last_error(buf, len(buf))
    return buf.value.decode("utf-8", "replace")
