"""te.Store: a connection to one of te's metadata stores (te_store_* of
te.h), for records a program keeps beside te's segments.

    with te.Store("etcd://127.0.0.1:2379") as s:
        s.put("/app/key", b"value")
        s.get("/app/key")      # b"value"; te.NotFound when absent
        s.delete("/app/key")
        s.watch("/app/")       # etcd only
        s.changes()            # ["/app/key", ...]: put or deleted since the last call

On etcd every key put lives under the handle's lease: it goes when the store
is closed, or one lease TTL (10 s by default) after the process dies.
Every call blocks at most the store's timeout (5 s by default; ?timeout= in
the connection string).
"""

import ctypes
import weakref
from ctypes import byref, c_size_t

from . import _lib
from .core import check
from .errors import BufferTooSmall, Closed


def _key(k):
    return k.encode() if isinstance(k, str) else bytes(k)


def _close(h):
    try:
        _lib.load().te_store_close(h)
    except Exception:
        pass


class Store:
    """A store handle. Thread-safe; close() (or the with block, or garbage
    collection) releases it."""

    def __init__(self, conn):
        lib = _lib.load()
        h = _lib.store_t()
        check(lib.te_store_open(_key(conn), byref(h)), lib)
        self.handle = h.value
        self.conn = conn
        self._finalizer = weakref.finalize(self, _close, self.handle)

    def _h(self):
        if not self._finalizer.alive:
            raise Closed(f"store {self.conn!r} is closed")
        return self.handle

    def put(self, key, value):
        """Write value (bytes-like) at key; on etcd under the handle's lease."""
        lib = _lib.load()
        value = bytes(value)
        check(lib.te_store_put(self._h(), _key(key), value, len(value)), lib)

    def get(self, key):
        """The value at key (bytes); te.NotFound when there is none."""
        lib = _lib.load()
        n = c_size_t()
        cap = 64 << 10
        for _ in range(3):  # the value may grow between the calls
            buf = ctypes.create_string_buffer(cap)
            rc = lib.te_store_get(self._h(), _key(key), buf, cap, byref(n))
            if rc == -BufferTooSmall.code and n.value > cap:
                cap = n.value
                continue
            check(rc, lib)
            return buf.raw[:n.value]
        check(rc, lib)

    def delete(self, key):
        """Remove key; a key that is not there is no error."""
        lib = _lib.load()
        check(lib.te_store_delete(self._h(), _key(key)), lib)

    def watch(self, prefix):
        """Watch every key under prefix until unwatch or close; changes()
        lists what changed. te.NotSupported for stores that do not push
        changes (only etcd does)."""
        lib = _lib.load()
        check(lib.te_store_watch(self._h(), _key(prefix)), lib)

    def unwatch(self, prefix):
        lib = _lib.load()
        check(lib.te_store_unwatch(self._h(), _key(prefix)), lib)

    def changes(self):
        """The keys (str) put or deleted under watched prefixes since the
        last call, each once; a watched prefix itself when changes may have
        been missed (treat every key under it as changed)."""
        lib = _lib.load()
        n = c_size_t()
        cap = 4096
        for _ in range(3):  # more may arrive between the calls
            buf = ctypes.create_string_buffer(cap)
            rc = lib.te_store_changes(self._h(), buf, cap, byref(n))
            if rc == -BufferTooSmall.code and n.value > cap:
                cap = n.value + 4096
                continue
            check(rc, lib)
            return [k.decode(errors="replace") for k in buf.raw[:n.value].split(b"\0")[:-1]]
        check(rc, lib)

    def close(self):
        """Release the handle (on etcd, the keys it put go with it)."""
        self._finalizer()

    @property
    def closed(self):
        return not self._finalizer.alive

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Store({self.conn!r})"

