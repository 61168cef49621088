"""Descriptor lists: nixlXferDList (address, length, device) and nixlRegDList
(the same plus per-descriptor metadata, e.g. a file path).

A list keeps its descriptors in one flat (n, 3) uint64 numpy array, so the
agent slices, checks and turns them into te requests with array operations
and never a Python loop per descriptor. Lists pickle, compare equal by
content, and serialize to a bounded binary form (serialize / deserialize)
that carries no code, unlike pickle, so a list received from a peer cannot
run anything.
"""

import itertools
import struct

import numpy as np

from ._types import MEM_NAME, mem_type_of, nixl_mem_t

_U64 = np.uint64
_MAGIC = b"TNXD"
_VERSION = 1
_HEAD = struct.Struct("<4sBBBBQ")  # magic, version, kind, mem type, flags, count
_MAX_META = 1 << 20  # bytes of one descriptor's metadata in a serialized list


def _as_int(v, what):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be an int, not {type(v).__name__}")
    v = int(v)
    if v < 0 or v >= 1 << 64:
        raise ValueError(f"{what} {v} is outside 0..2**64-1")
    return v


def _rows(descs, width):
    """An (n, 3) uint64 array from a sequence of width-tuples (width 3 or 4;
    the 4th item is returned separately)."""
    n = len(descs)
    if n == 0:
        return np.zeros((0, 3), dtype=_U64), []
    widths = set(map(len, descs))
    if widths != {width}:
        raise ValueError(f"descriptors must be {width}-tuples; got lengths {sorted(widths)}")
    if width == 3:
        try:
            # fromiter over the flattened tuples: several times faster than
            # np.array on a list of tuples (NIXL's desc_perf.py makes 1.5M).
            # int64 first, so a negative number is caught rather than wrapped.
            arr = np.fromiter(itertools.chain.from_iterable(descs), dtype=np.int64, count=3 * n)
        except (OverflowError, ValueError, TypeError) as e:
            raise ValueError(f"descriptors must be (address, length, device) integers: {e}") from None
        if arr.min() < 0:
            raise ValueError("descriptors must be (address, length, device) integers, not negative")
        return arr.view(_U64).reshape(n, 3), []
    cols = list(zip(*descs))
    arr = np.empty((n, 3), dtype=np.int64)
    try:
        for i in range(3):
            arr[:, i] = np.fromiter(cols[i], dtype=np.int64, count=n)
    except (OverflowError, ValueError, TypeError) as e:
        raise ValueError(f"descriptors must be (address, length, device, metadata): {e}") from None
    if arr.min() < 0:
        raise ValueError("descriptors must be (address, length, device, metadata), not negative")
    return arr.view(_U64), list(cols[3])


def _from_numpy(a, reg):
    if a.ndim != 2 or a.shape[1] not in ((3, 4) if reg else (3,)):
        want = "Nx3 or Nx4" if reg else "Nx3"
        raise ValueError(f"a numpy descriptor array must be {want}, not {a.shape}")
    if a.dtype.kind not in "iu":
        raise ValueError(f"a numpy descriptor array must hold integers, not {a.dtype}")
    if a.dtype.kind == "i" and a.size and int(a.min()) < 0:
        raise ValueError("a numpy descriptor array holds a negative value")
    rows = np.array(a[:, :3], dtype=_U64)  # a copy: later changes to a do not reach the list
    metas = [str(int(v)) for v in a[:, 3]] if a.shape[1] == 4 else [""] * len(rows)
    return rows, metas


class _DList:
    """Common part of the two list classes."""

    _reg = False

    def __init__(self, mem_type, descs=None, sorted=False):
        self._type = mem_type_of(mem_type)
        self._sorted = bool(sorted)
        self._buf = np.zeros((0, 3), dtype=_U64)
        self._n = 0
        self._meta = [] if self._reg else None
        if descs is None:
            return
        if isinstance(descs, _DList):
            rows = descs._rows().copy()
            metas = list(descs._meta) if (self._reg and descs._reg) else [""] * len(rows)
        elif isinstance(descs, np.ndarray):
            rows, metas = _from_numpy(descs, self._reg)
        elif isinstance(descs, (list, tuple)):
            rows, metas = _rows(descs, 4 if self._reg else 3)
            if self._reg:
                metas = [self._check_meta(m) for m in metas]
        else:
            raise TypeError(f"descriptors must be a list of tuples, a numpy array or a descriptor list, "
                            f"not {type(descs).__name__}")
        self._buf, self._n = rows, len(rows)
        if self._reg:
            self._meta = metas

    @classmethod
    def _of_rows(cls, mem_type, rows, metas=None, sorted=False):
        """A list around rows (an (n, 3) uint64 array it takes over)."""
        obj = cls.__new__(cls)
        obj._type = mem_type_of(mem_type)
        obj._sorted = bool(sorted)
        obj._buf, obj._n = rows, len(rows)
        obj._meta = (list(metas) if metas is not None else [""] * len(rows)) if cls._reg else None
        return obj

    @staticmethod
    def _check_meta(m):
        if not isinstance(m, (str, bytes)):
            raise ValueError(f"descriptor metadata must be str or bytes, not {type(m).__name__}")
        return m

    # -- array views for the agent ----------------------------------------
    def _rows(self):
        return self._buf[:self._n]

    def _addr(self):
        return self._buf[:self._n, 0]

    def _len(self):
        return self._buf[:self._n, 1]

    def _dev(self):
        return self._buf[:self._n, 2]

    # -- NIXL's list API ---------------------------------------------------
    def getType(self):
        return self._type

    def descCount(self):
        return self._n

    def __len__(self):
        return self._n

    def isEmpty(self):
        return self._n == 0

    def isSorted(self):
        return self._sorted

    def _index(self, i):
        i = int(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"descriptor index {i} out of range 0..{self._n - 1}")
        return i

    def _parse(self, desc):
        want = 4 if self._reg else 3
        if not isinstance(desc, (tuple, list)) or len(desc) != want:
            raise ValueError(f"a descriptor is a {want}-tuple")
        row = [_as_int(desc[0], "address"), _as_int(desc[1], "length"), _as_int(desc[2], "device id")]
        return row, (self._check_meta(desc[3]) if self._reg else None)

    def __getitem__(self, i):
        i = self._index(i)
        a, n, d = (int(x) for x in self._buf[i])
        return (a, n, d, self._meta[i]) if self._reg else (a, n, d)

    def __setitem__(self, i, desc):
        i = self._index(i)
        row, meta = self._parse(desc)
        self._buf[i] = row
        if self._reg:
            self._meta[i] = meta

    def __iter__(self):
        for i in range(self._n):
            yield self[i]

    def addDesc(self, desc):
        row, meta = self._parse(desc)
        if self._n == len(self._buf):
            grown = np.zeros((max(8, 2 * len(self._buf)), 3), dtype=_U64)
            grown[:self._n] = self._buf[:self._n]
            self._buf = grown
        self._buf[self._n] = row
        self._n += 1
        if self._reg:
            self._meta.append(meta)

    append = addDesc

    def remDesc(self, i):
        i = self._index(i)
        self._buf = np.delete(self._buf[:self._n], i, axis=0)
        self._n -= 1
        if self._reg:
            del self._meta[i]

    def clear(self):
        self._buf = np.zeros((0, 3), dtype=_U64)
        self._n = 0
        if self._reg:
            self._meta = []

    def getIndex(self, desc):
        """Index of the first descriptor equal to desc (metadata ignored), or -1."""
        want = 4 if self._reg else 3
        if not isinstance(desc, (tuple, list)) or len(desc) not in (3, want):
            raise ValueError(f"a descriptor is a {want}-tuple")
        row = np.array([_as_int(desc[0], "address"), _as_int(desc[1], "length"), _as_int(desc[2], "device id")],
                       dtype=_U64)
        hit = np.flatnonzero((self._rows() == row).all(axis=1))
        return int(hit[0]) if len(hit) else -1

    def print(self):
        print(self)

    def __repr__(self):
        kind = "nixlRegDList" if self._reg else "nixlXferDList"
        shown = ", ".join(repr(self[i]) for i in range(min(self._n, 8)))
        more = f", ... ({self._n} in all)" if self._n > 8 else ""
        return f"{kind}({MEM_NAME.get(self._type, self._type)}, [{shown}{more}])"

    __str__ = __repr__

    def __eq__(self, other):
        if not isinstance(other, _DList) or other._reg != self._reg:
            return NotImplemented
        if self._type != other._type or self._n != other._n:
            return False
        if not np.array_equal(self._rows(), other._rows()):
            return False
        return not self._reg or [_b(m) for m in self._meta] == [_b(m) for m in other._meta]

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __reduce__(self):
        return (deserialize, (serialize(self),))

    def __bool__(self):
        # A list object is a result, not a container test: NIXL callers write
        # `if not descs:` to catch a failed conversion (None), and an empty
        # list is still a valid result.
        return True


def _b(m):
    return m.encode() if isinstance(m, str) else bytes(m)


class nixlXferDList(_DList):
    """Transfer descriptors: (address, length, device id) of one memory type."""

    _reg = False


class nixlRegDList(_DList):
    """Registration descriptors: (address, length, device id, metadata) of one
    memory type. The metadata (str or bytes) is opaque to te for DRAM and
    VRAM; for FILE_SEG it names the file (see nixl._files)."""

    _reg = True

    def trim(self):
        """The transfer list of the same descriptors, metadata dropped."""
        return nixlXferDList._of_rows(self._type, self._rows().copy(), sorted=self._sorted)


def serialize(dl):
    """The bounded binary form of a descriptor list (see deserialize)."""
    flags = 1 if dl._sorted else 0
    parts = [_HEAD.pack(_MAGIC, _VERSION, 1 if dl._reg else 0, int(dl._type), flags, dl._n),
             np.ascontiguousarray(dl._rows(), dtype="<u8").tobytes()]
    if dl._reg:
        for m in dl._meta:
            raw = _b(m)
            parts.append(struct.pack("<BI", 1 if isinstance(m, str) else 0, len(raw)))
            parts.append(raw)
    return b"".join(parts)


def deserialize(data):
    """A descriptor list from serialize's output. Checks every length against
    the data before it allocates; anything malformed raises ValueError."""
    data = bytes(data)
    if len(data) < _HEAD.size:
        raise ValueError("not a serialized descriptor list: too short")
    magic, version, kind, mtype, flags, count = _HEAD.unpack_from(data)
    if magic != _MAGIC or version != _VERSION or kind not in (0, 1):
        raise ValueError("not a serialized descriptor list (bad magic, version or kind)")
    try:
        mtype = nixl_mem_t(mtype)
    except ValueError:
        raise ValueError(f"serialized descriptor list has unknown memory type {mtype}") from None
    off = _HEAD.size
    if count > (len(data) - off) // 24:
        raise ValueError(f"serialized descriptor list claims {count} descriptors but holds fewer")
    rows = np.frombuffer(data, dtype="<u8", count=3 * count, offset=off).astype(_U64).reshape(count, 3)
    off += 24 * count
    metas = None
    if kind == 1:
        metas = []
        for _ in range(count):
            if off + 5 > len(data):
                raise ValueError("serialized descriptor list is cut short in its metadata")
            is_str, n = struct.unpack_from("<BI", data, off)
            off += 5
            if n > _MAX_META or off + n > len(data):
                raise ValueError("serialized descriptor list has a metadata entry out of bounds")
            raw = data[off:off + n]
            off += n
            if is_str:
                try:
                    metas.append(raw.decode())
                except UnicodeDecodeError:
                    raise ValueError("serialized descriptor list has metadata that is not UTF-8") from None
            else:
                metas.append(raw)
    if off != len(data):
        raise ValueError(f"serialized descriptor list has {len(data) - off} trailing bytes")
    cls = nixlRegDList if kind == 1 else nixlXferDList
    return cls._of_rows(mtype, rows, metas, sorted=bool(flags & 1))
