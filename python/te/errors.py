"""Exceptions raised for libte's error codes."""


class TeError(Exception):
    """A te call failed. code is te's stable error code (positive; the C
    functions return it negated), message the library's description."""

    code = 0

    def __init__(self, message="", code=None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    def __str__(self):
        return f"{self.message} [te error {self.code}]"


class LibraryError(TeError, ImportError):
    """libte.so could not be found or does not match this binding."""


def _cls(name, code, *bases, doc=""):
    return type(name, (TeError,) + bases, {"code": code, "__doc__": doc})


InvalidArgument = _cls("InvalidArgument", 1, ValueError, doc="A bad argument: handle, pointer, length, opcode.")
AddressNotRegistered = _cls("AddressNotRegistered", 2, doc="The address is not inside registered memory.")
AddressOverlapped = _cls("AddressOverlapped", 3, doc="The range overlaps a registered range.")
BatchBusy = _cls("BatchBusy", 4, doc="The batch still has transfers in flight.")
SegmentNotFound = _cls("SegmentNotFound", 5, LookupError, doc="No such segment, or it does not answer.")
TransportUnavailable = _cls("TransportUnavailable", 6, doc="No installed transport can do this.")
PeerUnreachable = _cls("PeerUnreachable", 7, ConnectionError, doc="The peer cannot be reached.")
Timeout = _cls("Timeout", 8, TimeoutError, doc="It did not finish in time.")
MetadataError = _cls("MetadataError", 9, doc="The metadata store failed.")
NotSupported = _cls("NotSupported", 10, doc="Not supported here.")
Closed = _cls("Closed", 11, doc="The engine is closed.")
StaleDescriptor = _cls("StaleDescriptor", 12, doc="The peer's descriptor changed.")
AccessDenied = _cls("AccessDenied", 13, PermissionError, doc="The peer refused the access.")
TooLarge = _cls("TooLarge", 14, doc="Over a size limit.")
ProtocolError = _cls("ProtocolError", 15, doc="A malformed message.")
Canceled = _cls("Canceled", 16, doc="Canceled.")
NoMemory = _cls("NoMemory", 17, MemoryError, doc="Out of memory (TE_ERR_NO_MEMORY); a full queue is ResourceExhausted.")
InternalError = _cls("InternalError", 18, doc="A bug in te.")
NotFound = _cls("NotFound", 19, LookupError, doc="Not found.")
BufferTooSmall = _cls("BufferTooSmall", 20, doc="An output buffer was too small.")
TransferLost = _cls("TransferLost", 21, doc="A handoff transfer is gone from the sidecar that held it.")
AuthError = _cls("AuthError", 22, PermissionError,
                 doc="A peer failed, or refused, cluster-secret authentication (TE_ERR_AUTH).")
ForkError = _cls("ForkError", 23, RuntimeError,
                 doc="Called in a child forked after libte was loaded: its Go runtime cannot run there "
                     "(TE_ERR_FORKED). Use multiprocessing's \"spawn\" start method.")
ResourceExhausted = _cls("ResourceExhausted", 24,
                         doc="Over a bound on connections, calls, notification bytes or a receiver's queue (TE_ERR_RESOURCE_EXHAUSTED).")
StorageError = _cls("StorageError", 25, OSError,
                    doc="Storage failed a read or write: EIO, a file truncated while registered (TE_ERR_IO).")
NoSpace = _cls("NoSpace", 26, OSError, doc="Storage is full: ENOSPC, EDQUOT, the file size limit (TE_ERR_NO_SPACE).")

BY_CODE = {c.code: c for c in (InvalidArgument, AddressNotRegistered, AddressOverlapped, BatchBusy, SegmentNotFound,
                               TransportUnavailable, PeerUnreachable, Timeout, MetadataError, NotSupported, Closed,
                               StaleDescriptor, AccessDenied, TooLarge, ProtocolError, Canceled, NoMemory,
                               InternalError, NotFound, BufferTooSmall, TransferLost, AuthError, ForkError,
                               ResourceExhausted, StorageError, NoSpace)}


def error_for(code, message):
    """The exception for a positive te error code."""
    cls = BY_CODE.get(code)
    if cls is None:
        return TeError(message, code)
    return cls(message)
