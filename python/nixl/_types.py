"""NIXL's status codes, memory types, operations and exception classes, and
the mapping of te's error codes onto them.

The numbers are NIXL's (nixl_types.h): code that compares a status with
nixl._bindings.NIXL_SUCCESS or a memory type with DRAM_SEG sees the values
it expects.
"""

import enum

import te


class nixl_status_t(enum.IntEnum):
    NIXL_IN_PROG = 1
    NIXL_SUCCESS = 0
    NIXL_ERR_NOT_POSTED = -1
    NIXL_ERR_INVALID_PARAM = -2
    NIXL_ERR_BACKEND = -3
    NIXL_ERR_NOT_FOUND = -4
    NIXL_ERR_MISMATCH = -5
    NIXL_ERR_NOT_ALLOWED = -6
    NIXL_ERR_REPOST_ACTIVE = -7
    NIXL_ERR_UNKNOWN = -8
    NIXL_ERR_NOT_SUPPORTED = -9
    NIXL_ERR_REMOTE_DISCONNECT = -10
    NIXL_ERR_CANCELED = -11
    NIXL_ERR_NO_TELEMETRY = -12


class nixl_mem_t(enum.IntEnum):
    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4
    UNKNOWN_SEG = 5


class nixl_xfer_op_t(enum.IntEnum):
    # te's opcodes have the same values (TE_READ 0, TE_WRITE 1).
    NIXL_READ = 0
    NIXL_WRITE = 1


class nixl_thread_sync_t(enum.IntEnum):
    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2


# Memory type names of the Python API ("cpu" and "cuda" are its aliases).
MEM_BY_NAME = {
    "DRAM": nixl_mem_t.DRAM_SEG,
    "VRAM": nixl_mem_t.VRAM_SEG,
    "BLK": nixl_mem_t.BLK_SEG,
    "BLOCK": nixl_mem_t.BLK_SEG,
    "OBJ": nixl_mem_t.OBJ_SEG,
    "FILE": nixl_mem_t.FILE_SEG,
    "cpu": nixl_mem_t.DRAM_SEG,
    "cuda": nixl_mem_t.VRAM_SEG,
}
MEM_NAME = {
    nixl_mem_t.DRAM_SEG: "DRAM",
    nixl_mem_t.VRAM_SEG: "VRAM",
    nixl_mem_t.BLK_SEG: "BLK",
    nixl_mem_t.OBJ_SEG: "OBJ",
    nixl_mem_t.FILE_SEG: "FILE",
    nixl_mem_t.UNKNOWN_SEG: "UNKNOWN",
}
OP_BY_NAME = {"READ": nixl_xfer_op_t.NIXL_READ, "WRITE": nixl_xfer_op_t.NIXL_WRITE}


def mem_type_of(value):
    """A nixl_mem_t from an int (or nixl_mem_t); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"memory type must be a nixl_mem_t, not {type(value).__name__}")
    return nixl_mem_t(int(value))


class nixlError(Exception):
    """Base of the exceptions below (NIXL raises one class per status; te
    adds this common base). status is the nixl_status_t."""

    status = nixl_status_t.NIXL_ERR_UNKNOWN


def _exc(name, status, *bases):
    return type(name, (nixlError,) + bases, {"status": status, "__doc__": f"NIXL status {status.name}."})


nixlNotPostedError = _exc("nixlNotPostedError", nixl_status_t.NIXL_ERR_NOT_POSTED)
nixlInvalidParamError = _exc("nixlInvalidParamError", nixl_status_t.NIXL_ERR_INVALID_PARAM)
nixlBackendError = _exc("nixlBackendError", nixl_status_t.NIXL_ERR_BACKEND)
nixlNotFoundError = _exc("nixlNotFoundError", nixl_status_t.NIXL_ERR_NOT_FOUND)
nixlMismatchError = _exc("nixlMismatchError", nixl_status_t.NIXL_ERR_MISMATCH)
nixlNotAllowedError = _exc("nixlNotAllowedError", nixl_status_t.NIXL_ERR_NOT_ALLOWED)
nixlRepostActiveError = _exc("nixlRepostActiveError", nixl_status_t.NIXL_ERR_REPOST_ACTIVE)
nixlUnknownError = _exc("nixlUnknownError", nixl_status_t.NIXL_ERR_UNKNOWN)
nixlNotSupportedError = _exc("nixlNotSupportedError", nixl_status_t.NIXL_ERR_NOT_SUPPORTED)
nixlRemoteDisconnectError = _exc("nixlRemoteDisconnectError", nixl_status_t.NIXL_ERR_REMOTE_DISCONNECT)
nixlCancelledError = _exc("nixlCancelledError", nixl_status_t.NIXL_ERR_CANCELED)
nixlNoTelemetryError = _exc("nixlNoTelemetryError", nixl_status_t.NIXL_ERR_NO_TELEMETRY)
nixlCanceledError = nixlCancelledError  # both spellings are in use

EXC_BY_STATUS = {c.status: c for c in (
    nixlNotPostedError, nixlInvalidParamError, nixlBackendError, nixlNotFoundError, nixlMismatchError,
    nixlNotAllowedError, nixlRepostActiveError, nixlUnknownError, nixlNotSupportedError,
    nixlRemoteDisconnectError, nixlCancelledError, nixlNoTelemetryError)}

# te error class -> the NIXL status a caller of NIXL would have seen.
_STATUS_BY_TE = {
    te.InvalidArgument: nixl_status_t.NIXL_ERR_INVALID_PARAM,
    te.AddressNotRegistered: nixl_status_t.NIXL_ERR_NOT_FOUND,
    te.AddressOverlapped: nixl_status_t.NIXL_ERR_INVALID_PARAM,
    te.BatchBusy: nixl_status_t.NIXL_ERR_REPOST_ACTIVE,
    te.SegmentNotFound: nixl_status_t.NIXL_ERR_NOT_FOUND,
    te.TransportUnavailable: nixl_status_t.NIXL_ERR_BACKEND,
    te.PeerUnreachable: nixl_status_t.NIXL_ERR_REMOTE_DISCONNECT,
    te.Timeout: nixl_status_t.NIXL_ERR_BACKEND,
    te.NotSupported: nixl_status_t.NIXL_ERR_NOT_SUPPORTED,
    te.StaleDescriptor: nixl_status_t.NIXL_ERR_NOT_FOUND,
    te.AccessDenied: nixl_status_t.NIXL_ERR_NOT_ALLOWED,
    te.AuthError: nixl_status_t.NIXL_ERR_NOT_ALLOWED,
    te.Canceled: nixl_status_t.NIXL_ERR_CANCELED,
    te.NotFound: nixl_status_t.NIXL_ERR_NOT_FOUND,
}


def status_of_te_code(code):
    """The nixl_status_t for a positive te error code."""
    cls = te.BY_CODE.get(code)
    return _STATUS_BY_TE.get(cls, nixl_status_t.NIXL_ERR_BACKEND)


def from_te(err, what=""):
    """The NIXL exception for a te.TeError (raise it `from err`)."""
    status = _STATUS_BY_TE.get(type(err), nixl_status_t.NIXL_ERR_BACKEND)
    msg = f"{what}: {err}" if what else str(err)
    return EXC_BY_STATUS[status](msg)


def raise_status(status, msg):
    raise EXC_BY_STATUS.get(status, nixlUnknownError)(msg)
