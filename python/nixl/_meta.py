"""Agent metadata: the opaque bytes get_agent_metadata returns and
add_remote_agent loads.

    magic "TNXM", version (u8), header length (u32), header (JSON),
    section count (u32), then per section its length (u32) and a
    serialized descriptor list (nixl._descs.serialize) of the registered
    ranges of one memory type.

The header carries te's segment reference: the segment name the agent's te
engine publishes (host:port of its RPC listener, where te fetches the
descriptor and its capability keys from over its own authenticated control
plane), the engine's instance (its random per-start identity, so a
restarted peer is told apart from the one the metadata came from), whether
the agent's NIXL listener is on (the engine then answers metadata requests),
and the agent name. Decoding checks every length before it allocates.
"""

import json
import struct

from . import _descs
from ._types import nixl_mem_t, nixlInvalidParamError

MAGIC = b"TNXM"
VERSION = 1
MAX_BYTES = 16 << 20  # te's notification limit: metadata must fit one
MAX_HEADER = 64 << 10
MAX_NAME = 1024


class Metadata:
    __slots__ = ("name", "conn", "segment", "instance", "listener", "partial", "sections")

    def __init__(self, name, conn, segment, instance, listener, partial, sections):
        self.name = name
        self.conn = conn
        self.segment = segment
        self.instance = instance
        self.listener = listener
        self.partial = partial
        self.sections = sections  # nixl_mem_t -> (n, 3) uint64 rows


def encode(md):
    header = {"name": md.name, "conn": bool(md.conn), "partial": bool(md.partial)}
    if md.conn:
        header.update(segment=md.segment, instance=md.instance, listener=bool(md.listener))
    hb = json.dumps(header, separators=(",", ":")).encode()
    parts = [MAGIC, struct.pack("<BI", VERSION, len(hb)), hb, struct.pack("<I", len(md.sections))]
    for mt, rows in sorted(md.sections.items()):
        blob = _descs.serialize(_descs.nixlXferDList._of_rows(mt, rows))
        parts += [struct.pack("<I", len(blob)), blob]
    out = b"".join(parts)
    if len(out) > MAX_BYTES:
        raise nixlInvalidParamError(f"agent metadata of {len(out)} bytes exceeds {MAX_BYTES}: too many registrations "
                                    f"for one message; send partial metadata in parts")
    return out


def _bad(why):
    return nixlInvalidParamError(f"not te nixl agent metadata: {why}")


def decode(data):
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise nixlInvalidParamError(f"agent metadata must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_BYTES + MAX_HEADER:
        raise _bad(f"{len(data)} bytes is over the limit")
    if len(data) < 9 or data[:4] != MAGIC:
        raise _bad("bad magic (metadata from NIXL itself or another library cannot be loaded by te)")
    version, hlen = struct.unpack_from("<BI", data, 4)
    if version != VERSION:
        raise _bad(f"version {version}, this library reads {VERSION}")
    off = 9
    if hlen > MAX_HEADER or off + hlen + 4 > len(data):
        raise _bad("header out of bounds")
    try:
        h = json.loads(data[off:off + hlen])
    except ValueError as e:
        raise _bad(f"header is not JSON ({e})") from None
    off += hlen
    if not isinstance(h, dict):
        raise _bad("header is not an object")
    name = h.get("name")
    if not isinstance(name, str) or not name or len(name.encode()) > MAX_NAME:
        raise _bad("missing or bad agent name")
    conn = h.get("conn") is True
    segment = instance = None
    listener = False
    if conn:
        segment, instance, listener = h.get("segment"), h.get("instance"), h.get("listener") is True
        if not isinstance(segment, str) or not segment or not isinstance(instance, str) or not instance:
            raise _bad("connection info without segment or instance")
    (nsec,) = struct.unpack_from("<I", data, off)
    off += 4
    if nsec > len(nixl_mem_t):
        raise _bad(f"{nsec} sections")
    sections = {}
    for _ in range(nsec):
        if off + 4 > len(data):
            raise _bad("cut short")
        (blen,) = struct.unpack_from("<I", data, off)
        off += 4
        if off + blen > len(data):
            raise _bad("section out of bounds")
        try:
            dl = _descs.deserialize(data[off:off + blen])
        except ValueError as e:
            raise _bad(str(e)) from None
        off += blen
        if dl._reg or dl.getType() in sections:
            raise _bad("malformed section")
        sections[dl.getType()] = dl._rows()
    if off != len(data):
        raise _bad("trailing bytes")
    return Metadata(name, conn, segment, instance, listener, h.get("partial") is True, sections)
