"""KV-cache layouts, transfer plans and the prefill-to-decode handoff.

A layout describes one rank's KV cache; registered, its tensors are what
peers read and write (here two layers in host memory; vLLM's tensors'
data_ptr() in a server):

```python
import te
from te.kvcache import Layout

shape = Layout(format="vllm", order="HND", dtype="bf16", num_blocks=64, block_size=16,
               num_heads=8, head_dim=128)
kv_caches = [bytearray(shape.layer_bytes) for _ in range(2)]  # one buffer per layer
with te.Engine(listen_addr="127.0.0.1:0") as engine:
    layout = shape.with_bases(bases=[te.address_of(t)[0] for t in kv_caches])
    layout.register(engine)  # its tensors, remote-accessible
    assert layout.info()["num_layers"] == 2
    layout.unregister(engine)
```

The handoff pairs decode's and prefill's declarations through the pod's
te-sidecar; each side runs in its own process with its engine and layout:

<!-- docs-test: skip (needs te-sidecar on 127.0.0.1:8080 and the other side's process) -->
```python
from te.kvcache import Handoff

# decode
h = Handoff(engine, "127.0.0.1:8080")
x = h.expect("req-1", layout, [7, 3, 9])
x.wait(timeout=30)

# prefill
h = Handoff(engine, "127.0.0.1:8080")
x = h.ready("req-1", layout, [0, 1, 2])
for layer in range(2):
    x.send_layer(layer)
x.send(timeout=30)
```

Layouts, plans and transfers hold library handles; close() (or a with block)
releases them, and garbage collection does too. A Transfer that no wait or
abort ended is aborted when it is closed, so blocks are never left in use.
Blocking calls (expect, ready, send_layer, wait, send, abort, status) release
the GIL.
"""

import ctypes
import json
import weakref
from ctypes import byref, c_int32, c_size_t, c_uint64

from . import _lib
from ._wait import sliced
from .core import READ, WRITE, Batch, Segment, check  # noqa: F401
from .errors import InvalidArgument

PUSH = "push"
PULL = "pull"
_MODES = {None: 0, "": 0, PUSH: 1, PULL: 2}
_MODE_NAMES = {0: None, 1: PUSH, 2: PULL}

#: Handoff states (te.h TE_HANDOFF_*), in order.
STATES = ("waiting", "transferring", "done", "failed", "aborted", "expired")

#: te.h TE_PLAN_ALL_LAYERS.
ALL_LAYERS = -1


def _free(fn, handle):
    try:
        getattr(_lib.load(), fn)(handle)
    except Exception:
        pass


def _addr(x):
    """An address: an int, or a tensor-like object's data_ptr()."""
    if isinstance(x, bool):
        raise TypeError("a bool is not an address")
    if isinstance(x, int):
        return x
    if hasattr(x, "data_ptr"):
        return int(x.data_ptr())
    raise TypeError(f"{type(x).__name__} is not an address")


def _blocks(ids, what):
    ids = [int(b) for b in ids]
    if not ids:
        raise InvalidArgument(f"{what} block list is empty")
    for b in ids:
        if not -(1 << 31) <= b < (1 << 31):
            raise InvalidArgument(f"{what} block id {b} does not fit in 32 bits")
    return (c_int32 * len(ids))(*ids), len(ids)


def _timeout_ms(timeout):
    """seconds (None: no limit) -> te's milliseconds (negative: no limit)."""
    return -1 if timeout is None else max(0, int(timeout * 1000))


class Layout:
    """One rank's KV cache (see te.h and the Go package kvcache for the
    formats). Arguments are the JSON fields of the layout; bases, k_bases and
    v_bases take ints or tensors (their data_ptr()). Without base addresses
    a Layout only describes a shape: block_bytes and layer_bytes work, the
    rest needs addresses (with_bases)."""

    def __init__(self, format="vllm", dtype="bf16", num_blocks=0, block_size=0, num_heads=0, head_dim=0,
                 order="NHD", head_start=0, total_heads=0, first_layer=0, bases=None, k_bases=None, v_bases=None):
        spec = {"format": format, "order": order, "dtype": dtype, "num_blocks": int(num_blocks),
                "block_size": int(block_size), "num_heads": int(num_heads), "head_dim": int(head_dim)}
        for k, v in (("head_start", head_start), ("total_heads", total_heads), ("first_layer", first_layer)):
            if v:
                spec[k] = int(v)
        for k, v in (("bases", bases), ("k_bases", k_bases), ("v_bases", v_bases)):
            if v is not None:
                spec[k] = [_addr(a) for a in v]
        self._init(spec)

    def _init(self, spec):
        self.spec = spec
        self.handle = 0
        self._finalizer = None
        if any(k in spec for k in ("bases", "k_bases", "v_bases")):
            lib = _lib.load()
            h = _lib.layout_t()
            check(lib.te_layout_create(self.to_json().encode(), byref(h)), lib)
            self.handle = h.value
            self._finalizer = weakref.finalize(self, _free, "te_layout_free", self.handle)
        else:
            self._shape()  # validates the shape now

    @classmethod
    def from_json(cls, s):
        """A Layout from its JSON form (str, bytes or dict)."""
        spec = dict(s) if isinstance(s, dict) else json.loads(s)
        obj = cls.__new__(cls)
        obj._init(spec)
        return obj

    def to_json(self):
        """The layout as te's JSON form (what te_layout_create takes)."""
        return json.dumps(self.spec, separators=(",", ":"))

    def with_bases(self, bases=None, k_bases=None, v_bases=None):
        """A copy of this layout at the given addresses."""
        spec = {k: v for k, v in self.spec.items() if k not in ("bases", "k_bases", "v_bases")}
        for k, v in (("bases", bases), ("k_bases", k_bases), ("v_bases", v_bases)):
            if v is not None:
                spec[k] = [_addr(a) for a in v]
        return Layout.from_json(spec)

    def _shape(self):
        lib = _lib.load()
        b, l = c_uint64(), c_uint64()
        check(lib.te_layout_bytes(self.to_json().encode(), byref(b), byref(l)), lib)
        return b.value, l.value

    @property
    def block_bytes(self):
        """Bytes of one block of one component (K or V; MLA: the block)."""
        return self._shape()[0]

    @property
    def layer_bytes(self):
        """Bytes of one layer: every block, K and V."""
        return self._shape()[1]

    def _need(self):
        if not self.handle:
            raise InvalidArgument("layout has no base addresses (or is closed); use with_bases")
        return self.handle

    def info(self):
        """{num_layers, first_layer, num_blocks, components, regions,
        block_bytes, layer_bytes}."""
        lib = _lib.load()
        out = _lib.LayoutInfo(size=ctypes.sizeof(_lib.LayoutInfo))
        check(lib.te_layout_info(self._need(), byref(out)), lib)
        return {k: getattr(out, k) for k, _ in _lib.LayoutInfo._fields_ if k != "size"}

    def regions(self):
        """[(addr, length)]: the tensors the layout occupies."""
        lib = _lib.load()
        n = c_size_t()
        check(lib.te_layout_regions(self._need(), None, 0, byref(n)), lib)
        arr = (_lib.Span * max(n.value, 1))()
        check(lib.te_layout_regions(self.handle, arr, n.value, byref(n)), lib)
        return [(s.addr, s.length) for s in arr[:n.value]]

    def register(self, engine, location="*"):
        """Register the layout's tensors with engine (remote-accessible, all
        or none). location "*" lets te detect GPU memory."""
        return engine.register_batch(self.regions(), location=location)

    def unregister(self, engine):
        """Unregister the layout's tensors from engine (the inverse of register)."""
        engine.unregister_batch([a for a, _ in self.regions()])

    def close(self):
        """Release the layout's handle; plans made from it keep their own copy."""
        if self._finalizer is not None and self._finalizer.detach():
            check(_lib.load().te_layout_free(self.handle))
        self.handle = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Layout({self.to_json()})"


class PlanStats:
    """A plan's numbers (te_plan_stats_t)."""

    def __init__(self, s):
        for k, _ in _lib.PlanStats._fields_:
            if k != "size":
                setattr(self, k, getattr(s, k))

    def __repr__(self):
        return (f"PlanStats(layers={self.layers}, blocks={self.blocks}, bytes={self.bytes}, "
                f"block_requests={self.block_requests}, requests={self.requests}, merged={self.merged})")


class Plan:
    """The copies that move src_blocks[i] of src to dst_blocks[i] of dst for
    layers (a (begin, end) pair of model-wide indexes; None: every layer of
    the source), K and V."""

    def __init__(self, src, dst, src_blocks, dst_blocks, layers=None):
        sb, ns = _blocks(src_blocks, "source")
        db, nd = _blocks(dst_blocks, "destination")
        begin, end = (0, 0) if layers is None else (int(layers[0]), int(layers[1]))
        if layers is not None and begin == 0 and end == 0:
            raise InvalidArgument("empty layer range (0, 0)")
        lib = _lib.load()
        h = _lib.plan_t()
        check(lib.te_plan_create(src._need(), dst._need(), sb, ns, db, nd, begin, end, byref(h)), lib)
        self.handle = h.value
        self._finalizer = weakref.finalize(self, _free, "te_plan_free", self.handle)

    @property
    def stats(self):
        """The plan's numbers (a PlanStats): layers, blocks, bytes, requests before and after coalescing."""
        lib = _lib.load()
        s = _lib.PlanStats(size=ctypes.sizeof(_lib.PlanStats))
        check(lib.te_plan_stats(self.handle, byref(s)), lib)
        return PlanStats(s)

    def transfers(self, layer=None):
        """[(src, dst, length)] of one layer, or of the whole plan (coalesced
        across layers) when layer is None."""
        lib = _lib.load()
        lay = ALL_LAYERS if layer is None else int(layer)
        n = c_size_t()
        check(lib.te_plan_transfers(self.handle, lay, None, 0, byref(n)), lib)
        arr = (_lib.PlanTransfer * max(n.value, 1))()
        check(lib.te_plan_transfers(self.handle, lay, arr, n.value, byref(n)), lib)
        return [(t.src, t.dst, t.length) for t in arr[:n.value]]

    @staticmethod
    def _handles(batch, segment):
        b = batch.handle if isinstance(batch, Batch) else int(batch)
        s = segment.handle if isinstance(segment, Segment) else int(segment)
        return b, s

    def submit_layer(self, batch, segment, layer, op=WRITE):
        """Submit one layer to batch without waiting. op WRITE: this process
        holds the source and segment is the destination's (push); READ: the
        reverse (pull)."""
        b, s = self._handles(batch, segment)
        lib = _lib.load()
        check(lib.te_plan_submit_layer(b, s, self.handle, int(layer), int(op)), lib)

    def submit(self, batch, segment, op=WRITE):
        """Submit the whole plan to batch without waiting."""
        b, s = self._handles(batch, segment)
        lib = _lib.load()
        check(lib.te_plan_submit(b, s, self.handle, int(op)), lib)

    def close(self):
        """Release the plan's handle."""
        if self._finalizer.detach():
            check(_lib.load().te_plan_free(self.handle))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Result:
    """How a handoff transfer ended on this side (te_handoff_result_t)."""

    def __init__(self, r):
        self.mode = _MODE_NAMES.get(r.mode)
        self.mover = bool(r.mover)
        self.recorded = bool(r.recorded)
        self.bytes = r.bytes
        self.block_requests = r.block_requests
        self.requests = r.requests
        self.elapsed = r.elapsed_ns / 1e9
        self.transport = r.transport.decode()

    def __repr__(self):
        return (f"Result(mode={self.mode}, mover={self.mover}, bytes={self.bytes}, requests={self.requests}, "
                f"transport={self.transport!r}, elapsed={self.elapsed:.6f})")


class Status:
    """A transfer's state as te-sidecar holds it (te_handoff_status_t)."""

    def __init__(self, s):
        self.state = STATES[s.state] if 0 <= s.state < len(STATES) else "unknown"
        self.mode = _MODE_NAMES.get(s.mode)
        self.error = -s.error
        self.settled = bool(s.settled)
        self.bytes = s.bytes
        self.reason = s.reason.decode("utf-8", "replace")

    def __repr__(self):
        return f"Status({self.state}, mode={self.mode}, settled={self.settled}, error={self.error})"


class Transfer:
    """One handoff transfer as this side sees it."""

    def __init__(self, client, handle, id):
        self._client = client  # keeps the client (and its engine) alive
        self.handle = handle
        self.id = id
        self._finalizer = weakref.finalize(self, _free, "te_handoff_free", handle)

    def send_layer(self, layer, timeout=None):
        """Push one layer as soon as it is computed (prefill, push mode).
        The first call waits up to timeout seconds for decode to declare."""
        lib = _lib.load()
        check(lib.te_handoff_send_layer(self.handle, int(layer), _timeout_ms(timeout)), lib)

    def wait(self, timeout=None):
        """Finish the transfer on this side; returns a Result. Raises Timeout
        when timeout seconds pass first (the transfer goes on), Canceled when
        it was aborted, TransferLost when te-sidecar lost it."""
        lib = _lib.load()
        r = _lib.HandoffResult(size=ctypes.sizeof(_lib.HandoffResult))
        check(sliced(lambda ms: lib.te_handoff_wait(self.handle, ms, byref(r)), timeout, "handoff transfer"), lib)
        return Result(r)

    send = wait

    def abort(self, reason=""):
        """Give the transfer up; returns once neither side's memory is
        touched for it."""
        lib = _lib.load()
        check(lib.te_handoff_abort(self.handle, (reason or "").encode()), lib)

    def status(self):
        """The transfer as te-sidecar holds it now (a Status); raises TransferLost if it is gone."""
        lib = _lib.load()
        s = _lib.HandoffStatus(size=ctypes.sizeof(_lib.HandoffStatus))
        check(lib.te_handoff_status(self.handle, byref(s)), lib)
        return Status(s)

    def close(self):
        """Release the handle (aborting the transfer if nothing ended it)."""
        if self._finalizer.detach():
            lib = _lib.load()
            rc = lib.te_handoff_free(self.handle)
            if rc < 0 and self._client.closed:
                return  # the client (or its engine) went first and took the handle with it
            check(rc, lib)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Transfer({self.id!r})"


class Handoff:
    """A handoff client: one engine (te.Engine) and one te-sidecar
    ("host:port" or "http://host:port"). Use one per engine. With the
    cluster secret in $TE_AUTH_SECRET_FILE or $TE_AUTH_SECRET, it sends the
    token derived from it only to a sidecar that proves it holds the secret;
    any other server gets nothing and expect/ready raise AuthError."""

    def __init__(self, engine, sidecar):
        lib = _lib.load()
        h = _lib.handoff_t()
        check(lib.te_handoff_create(engine.handle, str(sidecar).encode(), byref(h)), lib)
        self.engine = engine
        self.handle = h.value
        self._finalizer = weakref.finalize(self, _free, "te_handoff_destroy", self.handle)

    def _declare(self, fn, id, layout, blocks, mode, timeout):
        if mode not in _MODES:
            raise InvalidArgument(f"mode {mode!r} is not push, pull or None")
        if timeout is not None and timeout < 0:
            raise InvalidArgument("negative timeout")
        arr, n = _blocks(blocks, "")
        ms = 0 if timeout is None else max(1, int(timeout * 1000))
        lib = _lib.load()
        x = _lib.xfer_t()
        check(getattr(lib, fn)(self.handle, str(id).encode(), layout._need(), arr, n, _MODES[mode], ms, byref(x)), lib)
        return Transfer(self, x.value, str(id))

    def expect(self, id, layout, blocks, mode=PUSH, timeout=None):
        """Decode: where transfer id's KV goes. timeout (seconds; None: the
        sidecar's default) bounds the whole transfer."""
        return self._declare("te_handoff_expect", id, layout, blocks, mode, timeout)

    def ready(self, id, layout, blocks, mode=None, timeout=None):
        """Prefill: transfer id's KV can be taken from these blocks. mode
        None accepts decode's choice."""
        return self._declare("te_handoff_ready", id, layout, blocks, mode, timeout)

    @property
    def closed(self):
        """True once close() ran."""
        return not self._finalizer.alive or self.engine.closed

    def close(self):
        """Release the client; its unfinished transfers are aborted."""
        if self._finalizer.detach():
            lib = _lib.load()
            rc = lib.te_handoff_destroy(self.handle)
            if rc < 0 and self.engine.closed:
                return  # te_destroy released it with the engine
            check(rc, lib)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
