"""The backend ("plugin") names NIXL users write, and what each means on te.

NIXL picks a backend plugin per transfer; te has one engine that picks its
transport per request itself (local > shm > rdma > tcp, cuda for GPU
memory). So every network backend name below stands for the same thing: te's
engine with every transport it can start. Creating one records the name
(for get_backend_params, query_xfer_backend, ...); it starts nothing new.
Storage backend names stand for te's file transport: FILE_SEG registrations
are te file segments of the agent's own segment (see nixl._files), and a
transfer between memory and them is one te submit like any other. POSIX
moves DRAM; GDS and GDS_MT move VRAM too, staged through pinned host memory
(te does not use cuFile for transfers).

A name not in this table is not a plugin here: create_backend raises
nixlNotFoundError, as NIXL does for a plugin it cannot find.
"""

from ._types import nixl_mem_t

NETWORK = "network"
STORAGE = "storage"

_DRAM, _VRAM, _FILE = nixl_mem_t.DRAM_SEG, nixl_mem_t.VRAM_SEG, nixl_mem_t.FILE_SEG


class Plugin:
    __slots__ = ("name", "kind", "mems", "params", "meaning")

    def __init__(self, name, kind, mems, params, meaning):
        self.name, self.kind, self.mems, self.params, self.meaning = name, kind, tuple(mems), dict(params), meaning


_NET_PARAMS = {"num_threads": "0"}
_NET = "te's engine: local, shm, rdma or tcp per request as te chooses; GPU memory through te's cuda paths"
_POSIX = ("te's file transport: DRAM <-> the agent's own files through io_uring (pread/pwrite threads where io_uring "
          "is off), O_DIRECT when the file was opened with it")
_GDS = _POSIX + "; VRAM <-> files staged through pinned host memory (cuFile is not used)"

PLUGINS = {p.name: p for p in (
    Plugin("UCX", NETWORK, (_DRAM, _VRAM), _NET_PARAMS, _NET),
    Plugin("LIBFABRIC", NETWORK, (_DRAM, _VRAM), _NET_PARAMS, _NET),
    Plugin("MOONCAKE", NETWORK, (_DRAM, _VRAM), _NET_PARAMS, _NET),
    Plugin("UCCL", NETWORK, (_DRAM, _VRAM), _NET_PARAMS, _NET),
    Plugin("TE", NETWORK, (_DRAM, _VRAM), _NET_PARAMS, _NET),
    Plugin("POSIX", STORAGE, (_DRAM, _FILE), {}, _POSIX),
    Plugin("GDS", STORAGE, (_DRAM, _VRAM, _FILE), {}, _GDS),
    Plugin("GDS_MT", STORAGE, (_DRAM, _VRAM, _FILE), {}, _GDS),
)}


def names():
    return list(PLUGINS)
