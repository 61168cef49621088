"""FILE_SEG: files as NIXL describes them, and the hook where te's file
segments plug in.

A FILE_SEG registration descriptor is (offset, length, device id, metadata).
NIXL has two modes: path mode, when the metadata reads
"<access>[,<flag>...]:<path>" (access ro or rw; flags direct, sync, noatime,
create), where the backend opens the file itself; otherwise fd mode, where
the device id is an open file descriptor. parse() tells them apart.

te has no file segments yet. register_file_segments is the one place that
changes when te.Engine.register_file(path|fd, offset, length) arrives: until
then it raises nixlNotSupportedError, and query() (stat of the named files)
works without it.
"""

import os
import stat

from ._types import nixlInvalidParamError, nixlNotSupportedError

_ACCESS = ("ro", "rw")
_FLAGS = ("direct", "sync", "noatime", "create")


class FileDesc:
    """One FILE_SEG descriptor, resolved: path (path mode) or fd (fd mode)."""

    __slots__ = ("offset", "length", "path", "fd", "access", "flags")

    def __init__(self, offset, length, path=None, fd=None, access=None, flags=()):
        self.offset, self.length, self.path, self.fd, self.access, self.flags = offset, length, path, fd, access, flags

    def target(self):
        """What te.Engine.register_file takes: the path or the fd."""
        return self.path if self.path is not None else self.fd


def parse(offset, length, dev, meta):
    """A FileDesc from a registration descriptor (see the module doc)."""
    text = meta.decode("utf-8", "replace") if isinstance(meta, bytes) else (meta or "")
    head, sep, path = text.partition(":")
    if sep and path:
        parts = head.split(",")
        if parts[0] in _ACCESS and all(f in _FLAGS for f in parts[1:]):
            return FileDesc(offset, length, path=path, access=parts[0], flags=tuple(parts[1:]))
    if dev > 0x7FFFFFFF:
        raise nixlInvalidParamError(f"FILE_SEG descriptor: device id {dev} is not a file descriptor and metadata "
                                    f"{text!r} is not '<ro|rw>[,flags]:<path>'")
    return FileDesc(offset, length, fd=int(dev))


def register_file_segments(engine, dlist):
    """HOOK(te register_file): register the FILE_SEG descriptors of dlist
    with te. When te.Engine.register_file(path|fd, offset, length) exists,
    replace the raise with:

        for d in descs:
            engine.register_file(d.target(), d.offset, d.length)

    (and the matching unregister in deregistration)."""
    descs = [parse(*dlist[i]) for i in range(dlist.descCount())]
    raise nixlNotSupportedError(
        f"FILE_SEG: te has no file segments yet, so {len(descs)} file descriptor(s) cannot be registered; "
        f"DRAM and VRAM work (query_memory works for files)")


def query(dlist):
    """query_memory for FILE_SEG: per descriptor a dict with the file's size
    and mode, or None when it cannot be found. As in NIXL's query, the
    metadata names the file (a plain path, or path mode's
    "<access>:<path>"); with no metadata the device id is an open fd."""
    out = []
    for i in range(dlist.descCount()):
        offset, length, dev, meta = dlist[i]
        text = meta.decode("utf-8", "replace") if isinstance(meta, bytes) else (meta or "")
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
