"""FILE_SEG: files as NIXL describes them, registered as te file segments.

A FILE_SEG registration descriptor is (offset, length, device id, metadata).
NIXL has two modes: path mode, when the metadata reads
"<access>[,<flag>...]:<path>" (access ro or rw; flags direct, sync, noatime,
create), where the agent opens the file itself; otherwise fd mode, where the
device id is a file descriptor the caller opened. parse() tells them apart.

Each registration becomes one private te file segment (te.Engine.register_file
with remote=False on a descriptor: the caller's in fd mode, the one the
agent opened with NIXL's flags in path mode, closed again at once since te
works on duplicates and closes them when the range is unregistered). te
answers with an address; byte k of the file is at address + (k - offset).
Private: the file is in no te descriptor a peer reads, and te refuses every
request to it but the agent's own engine's, even from an engine with the
cluster secret that knows the address and key; NIXL's storage backends are
local too. Path mode's "create" opens O_NOFOLLOW: a symbolic link at the
path is refused (nixlBackendError) rather than followed.

Transfer descriptors name the file as NIXL's do: (file offset, length,
device id), the device id being the registration's (the fd in fd mode, the
caller's unique id in path mode). FileRegistry.locate turns them into te
addresses of the agent's own segment, so a storage transfer is one te
submit like any other. What differs from NIXL's POSIX and GDS backends:

* A registered range past the end of a file open for writing extends the
  file (sparse) when it is registered: te reserves the range's addresses
  then. A read-only file must hold the range. Length 0 (NIXL: no bound)
  covers the file as it is when registered.
* O_DIRECT exactly when NIXL would use it (path mode's "direct", an fd
  opened O_DIRECT); te then still moves misaligned requests through the
  page cache instead of failing them. "sync" and "noatime" apply to the
  agent's open, which te duplicates; the descriptors te reopens (its
  O_DIRECT twin, or the buffered one of an fd opened O_DIRECT) lack them.
* Registrations are checked when made (a closed fd, a directory, a missing
  file, an fd opened O_APPEND, whose writes would ignore their offsets,
  fail then, not at the first transfer), and overlapping ranges of one
  device id are refused. A transfer made before its file was deregistered
  refuses to run (nixlNotFoundError) rather than reach whatever te reserved
  there since.
"""

import errno
import fcntl
import itertools
import os
import stat

import numpy as np

import te

from ._types import from_te, nixlBackendError, nixlInvalidParamError, nixlNotFoundError

_ACCESS = ("ro", "rw")
_FLAGS = ("direct", "sync", "noatime", "create")
_OPEN_FLAGS = {"direct": getattr(os, "O_DIRECT", 0), "sync": os.O_SYNC, "noatime": getattr(os, "O_NOATIME", 0),
               "create": os.O_CREAT}
_MAX_FD = 0x7FFFFFFF
_U64 = np.uint64


class FileDesc:
    """One FILE_SEG descriptor, resolved: path (path mode) or fd (fd mode)."""

    __slots__ = ("offset", "length", "dev", "path", "fd", "access", "flags")

    def __init__(self, offset, length, dev, path=None, fd=None, access=None, flags=()):
        self.offset, self.length, self.dev = offset, length, dev
        self.path, self.fd, self.access, self.flags = path, fd, access, flags


def _text(meta):
    return meta.decode("utf-8", "replace") if isinstance(meta, bytes) else (meta or "")


def parse(offset, length, dev, meta, strict=False):
    """A FileDesc from a registration descriptor (see the module doc).
    strict: metadata that starts like path mode ("ro"/"rw", then "," or
    ":") but does not parse is an error instead of fd mode, so a typo in a
    flag never registers whatever file the device id happens to be."""
    text = _text(meta)
    head, sep, path = text.partition(":")
    parts = head.split(",")
    if sep and path and parts[0] in _ACCESS and all(f in _FLAGS for f in parts[1:]):
        return FileDesc(offset, length, dev, path=path, access=parts[0], flags=tuple(parts[1:]))
    if strict and sep and parts[0] in _ACCESS:
        bad = [f for f in parts[1:] if f not in _FLAGS]
        why = f"unknown flag {bad[0]!r}" if bad else "no path"
        raise nixlInvalidParamError(f"FILE_SEG metadata {text!r} reads like path mode but has {why}: "
                                    f"'<ro|rw>[,direct][,sync][,noatime][,create]:<path>'")
    if dev > _MAX_FD:
        raise nixlInvalidParamError(f"FILE_SEG descriptor: device id {dev} is not a file descriptor and metadata "
                                    f"{text!r} is not '<ro|rw>[,flags]:<path>'")
    return FileDesc(offset, length, dev, fd=int(dev))


def _open(d):
    """Open a path-mode file as NIXL's backends do; the descriptor."""
    fl = (os.O_RDONLY if d.access == "ro" else os.O_RDWR) | os.O_CLOEXEC
    for f in d.flags:
        fl |= _OPEN_FLAGS[f]
    if fl & os.O_CREAT:
        # A link planted where a file is to be created would make the
        # agent extend and write whatever it points at (ELOOP instead).
        fl |= os.O_NOFOLLOW
    try:
        return os.open(d.path, fl, 0o644)
    except OSError as e:
        # NIXL's backends answer a failed open with NIXL_ERR_BACKEND.
        flags = ",".join((d.access,) + d.flags)
        raise nixlBackendError(f"FILE_SEG path mode: cannot open {d.path!r} ({flags}): {e.strerror} "
                               f"({errno.errorcode.get(e.errno, e.errno)})") from None


def _status(fd):
    """The fd's status flags, 0 when it is not open (te reports that)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        return 0


class FileReg:
    """One FILE_SEG registration held by te."""

    __slots__ = ("id", "key", "meta", "path_mode", "offset", "length", "dev", "addr", "count", "live")

    def __init__(self, rid, key, meta, path_mode, offset, length, dev, addr):
        self.id, self.key, self.meta, self.path_mode = rid, key, meta, path_mode
        self.offset, self.length, self.dev, self.addr = offset, length, dev, addr
        self.count = 1
        self.live = True

    def __repr__(self):
        return f"FileReg(dev={self.dev}, [{self.offset},+{self.length}), te {self.addr:#x})"


class _DevTable:
    __slots__ = ("starts", "ends", "addrs", "ids")

    def __init__(self, regs):
        regs = sorted(regs, key=lambda r: r.offset)
        self.starts = np.array([r.offset for r in regs], dtype=_U64)
        self.ends = self.starts + np.array([r.length for r in regs], dtype=_U64)
        self.addrs = np.array([r.addr for r in regs], dtype=_U64)
        self.ids = np.array([r.id for r in regs], dtype=np.int64)


class FileRegistry:
    """An agent's FILE_SEG registrations. Not locked: the agent calls it
    under its own lock."""

    def __init__(self):
        self.regs = {}  # (offset, length, dev) -> FileReg
        self.by_id = {}
        self._ids = itertools.count(1)
        self._by_dev = {}  # dev -> [FileReg]
        self._tables = {}

    def register(self, engine, dlist):
        """Register every descriptor of dlist (all or none). A descriptor
        registered already counts once more."""
        n = dlist.descCount()
        descs = []
        for i in range(n):
            offset, length, dev, meta = dlist[i]
            descs.append((parse(offset, length, dev, meta, strict=True), meta))
        fresh, seen = [], {}
        for d, meta in descs:
            k = (d.offset, d.length, d.dev)
            old = self.regs.get(k) or seen.get(k)
            if old is not None:
                old_meta = old.meta if isinstance(old, FileReg) else old[1]
                if _text(old_meta) != _text(meta):
                    raise nixlInvalidParamError(f"FILE_SEG {k} is registered already with metadata "
                                                f"{_text(old_meta)!r}, not {_text(meta)!r}")
                continue
            seen[k] = (d, meta)
            fresh.append((d, meta))
        done, pending = [], {}
        try:
            for d, meta in fresh:
                r = self._one(engine, d, meta, self._by_dev.get(d.dev, []) + pending.get(d.dev, []))
                done.append(r)
                pending.setdefault(r.dev, []).append(r)
        except BaseException:
            if done:
                try:
                    engine.unregister_batch([r.addr for r in done])
                except te.TeError:
                    pass  # the engine is closing: it drops them itself
            raise
        for r in done:
            r.count = 0
            self.regs[r.key] = r
            self.by_id[r.id] = r
        for d, _ in descs:
            self.regs[(d.offset, d.length, d.dev)].count += 1
        self._rebuild()

    def _one(self, engine, d, meta, others):
        """Register one fresh descriptor with te (others: the registrations
        of its device id); its FileReg."""
        path_mode = d.path is not None
        if others and (path_mode or any(r.path_mode for r in others)):
            raise nixlInvalidParamError(f"FILE_SEG path mode needs a device id of its own per file: {d.dev} names "
                                        f"a registration already ({others[0]!r})")
        owned = None
        if path_mode:
            owned = fd = _open(d)
        else:
            fd = d.fd
        try:
            length = d.length
            if length == 0:
                # NIXL's "no bound": te reserves addresses for a fixed range,
                # so the range is the file as it is now.
                try:
                    size = os.fstat(fd).st_size
                except OSError as e:
                    raise nixlInvalidParamError(f"FILE_SEG fd {fd}: {e.strerror}") from None
                if size <= d.offset:
                    raise nixlInvalidParamError(f"FILE_SEG {self._name(d)}: length 0 registers up to the file's end, "
                                                f"and the file is {size} bytes, nothing past offset {d.offset}: give "
                                                f"the length to register")
                length = size - d.offset
            end = d.offset + length
            for r in others:
                if d.offset < r.offset + r.length and r.offset < end:
                    raise nixlInvalidParamError(f"FILE_SEG [{d.offset},+{length}) of device id {d.dev} overlaps "
                                                f"{r!r}")
            fl = _status(fd)
            if fl & os.O_APPEND and fl & os.O_ACCMODE != os.O_RDONLY:
                # te duplicates the fd: every write would go to the file's end.
                raise nixlInvalidParamError(f"FILE_SEG {self._name(d)} is open O_APPEND: writes would land at the "
                                            f"file's end, not at their offsets; open it without O_APPEND")
            try:
                # Private (remote=False): in no descriptor a peer reads, and
                # te refuses every request to it but this engine's own.
                addr = engine.register_file(fd=fd, offset=d.offset, length=length, create=True, remote=False,
                                            direct=bool(fl & _OPEN_FLAGS["direct"]))
            except te.TeError as e:
                raise from_te(e, f"FILE_SEG {self._name(d)}") from e
        finally:
            if owned is not None:
                os.close(owned)  # te holds its own duplicates until unregistered
        return FileReg(next(self._ids), (d.offset, d.length, d.dev), meta, path_mode, d.offset, length, d.dev, addr)

    @staticmethod
    def _name(d):
        return repr(d.path) if d.path is not None else f"fd {d.fd}"

    def deregister(self, engine, dlist):
        """Undo one registration of each descriptor (all must be registered;
        if one is not, nothing changes). Returns once te stopped touching
        the files dropped: te's unregister waits for their I/O in flight."""
        need = {}
        for i in range(dlist.descCount()):
            k = tuple(dlist[i][:3])
            need[k] = need.get(k, 0) + 1
        for k, c in need.items():
            r = self.regs.get(k)
            if r is None or r.count < c:
                raise nixlNotFoundError(f"FILE_SEG descriptor {k} is not registered")
        gone = [self.regs[k] for k, c in need.items() if self.regs[k].count == c]
        if gone:
            for r in gone:
                r.live = False  # transfers made on it refuse to run from now on
            try:
                engine.unregister_batch([r.addr for r in gone])
            except te.TeError as e:
                for r in gone:
                    r.live = True
                raise from_te(e, "deregister FILE_SEG") from e
        for k, c in need.items():
            r = self.regs[k]
            r.count -= c
            if r.count == 0:
                del self.regs[k]
                del self.by_id[r.id]
        self._rebuild()

    def _rebuild(self):
        by_dev = {}
        for r in self.regs.values():
            by_dev.setdefault(r.dev, []).append(r)
        self._by_dev = by_dev
        self._tables = {d: _DevTable(rs) for d, rs in by_dev.items()}

    def locate(self, rows):
        """For transfer descriptors (offset, length, device id): (ok mask,
        te address of each, te address of its registration, registration
        id). A descriptor is ok when one registration of its device id holds
        all of it."""
        n = len(rows)
        ok = np.zeros(n, dtype=bool)
        base = np.zeros(n, dtype=_U64)
        start = np.zeros(n, dtype=_U64)
        ids = np.zeros(n, dtype=np.int64)
        if n == 0 or not self._tables:
            return ok, base.copy(), base, ids
        off, ln, dev = rows[:, 0], rows[:, 1], rows[:, 2]
        if dev.min() == dev.max():  # the common case: one file
            groups = [slice(None)]
        else:
            order = np.argsort(dev, kind="stable")
            groups = np.split(order, np.flatnonzero(np.diff(dev[order])) + 1)
        for m in groups:
            t = self._tables.get(int(dev[m][0]))
            if t is None:
                continue
            a, e = off[m], off[m] + ln[m]
            i = np.searchsorted(t.starts, a, side="right").astype(np.int64) - 1
            ic = np.maximum(i, 0)
            ok[m] = (i >= 0) & (ln[m] > 0) & (e >= a) & (e <= t.ends[ic])
            base[m], start[m], ids[m] = t.addrs[ic], t.starts[ic], t.ids[ic]
        addr = np.where(ok, base + (off - start), _U64(0))
        return ok, addr, base, ids

    def regs_of(self, ids):
        """The registrations behind registration ids (from locate); raises
        nixlNotFoundError when one was deregistered since."""
        out = []
        for i in (ids[:1] if len(ids) and ids.min() == ids.max() else np.unique(ids)):
            r = self.by_id.get(int(i))
            if r is None or not r.live:
                raise nixlNotFoundError("a FILE_SEG registration of the prepared list was deregistered since it was "
                                        "prepared: register the file and prepare the list again")
            out.append(r)
        return tuple(out)


def query(dlist):
    """query_memory for FILE_SEG: per descriptor a dict with the file's size
    and mode, or None when it cannot be found. As in NIXL's query, the
    metadata names the file (a plain path, or path mode's
    "<access>:<path>"); with no metadata the device id is an open fd."""
    out = []
    for i in range(dlist.descCount()):
        offset, length, dev, meta = dlist[i]
        text = _text(meta)
        try:
            if text:
                d = parse(offset, length, dev, text)
                st = os.stat(d.path if d.path is not None else text)
            else:
                st = os.fstat(int(dev))
        except (OSError, ValueError, OverflowError, nixlInvalidParamError):
            out.append(None)
            continue
        out.append({"size": str(st.st_size), "mode": oct(stat.S_IMODE(st.st_mode)), "type": _kind(st.st_mode)})
    return out


def _kind(mode):
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "block" if stat.S_ISBLK(mode) else "other"
