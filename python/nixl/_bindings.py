"""NIXL's low-level Python module (nixl._bindings) on te: the C++-style
agent (nixlAgent with createBackend, registerMem, getLocalMD, loadRemoteMD,
createXferReq, postXferReq, getXferStatus, getNotifs, ...), descriptor
lists, status codes, memory types, the sync-mode values, telemetry and the
exception classes, under NIXL's names. nixl._api builds the Pythonic
nixl_agent on it, as NIXL does.
"""

from ._agent import (INIT_AGENT, nixlAgent, nixlAgentConfig, nixlBackendH, nixlXferTelemetry)  # noqa: F401
from ._descs import deserialize, nixlRegDList, nixlXferDList, serialize  # noqa: F401
from ._types import (nixl_mem_t, nixl_status_t, nixl_thread_sync_t, nixl_xfer_op_t, nixlBackendError,  # noqa: F401
                     nixlCanceledError, nixlCancelledError, nixlError, nixlInvalidParamError, nixlMismatchError,
                     nixlNoTelemetryError, nixlNotAllowedError, nixlNotFoundError, nixlNotPostedError,
                     nixlNotSupportedError, nixlRemoteDisconnectError, nixlRepostActiveError, nixlUnknownError)

DRAM_SEG = nixl_mem_t.DRAM_SEG
VRAM_SEG = nixl_mem_t.VRAM_SEG
BLK_SEG = nixl_mem_t.BLK_SEG
OBJ_SEG = nixl_mem_t.OBJ_SEG
FILE_SEG = nixl_mem_t.FILE_SEG
UNKNOWN_SEG = nixl_mem_t.UNKNOWN_SEG

NIXL_READ = nixl_xfer_op_t.NIXL_READ
NIXL_WRITE = nixl_xfer_op_t.NIXL_WRITE

NIXL_THREAD_SYNC_NONE = nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
NIXL_THREAD_SYNC_STRICT = nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
NIXL_THREAD_SYNC_RW = nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
NIXL_THREAD_SYNC_DEFAULT = nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE

NIXL_IN_PROG = nixl_status_t.NIXL_IN_PROG
NIXL_SUCCESS = nixl_status_t.NIXL_SUCCESS
NIXL_ERR_NOT_POSTED = nixl_status_t.NIXL_ERR_NOT_POSTED
NIXL_ERR_INVALID_PARAM = nixl_status_t.NIXL_ERR_INVALID_PARAM
NIXL_ERR_BACKEND = nixl_status_t.NIXL_ERR_BACKEND
NIXL_ERR_NOT_FOUND = nixl_status_t.NIXL_ERR_NOT_FOUND
NIXL_ERR_MISMATCH = nixl_status_t.NIXL_ERR_MISMATCH
NIXL_ERR_NOT_ALLOWED = nixl_status_t.NIXL_ERR_NOT_ALLOWED
NIXL_ERR_REPOST_ACTIVE = nixl_status_t.NIXL_ERR_REPOST_ACTIVE
NIXL_ERR_UNKNOWN = nixl_status_t.NIXL_ERR_UNKNOWN
NIXL_ERR_NOT_SUPPORTED = nixl_status_t.NIXL_ERR_NOT_SUPPORTED
NIXL_ERR_REMOTE_DISCONNECT = nixl_status_t.NIXL_ERR_REMOTE_DISCONNECT
NIXL_ERR_CANCELED = nixl_status_t.NIXL_ERR_CANCELED
NIXL_ERR_NO_TELEMETRY = nixl_status_t.NIXL_ERR_NO_TELEMETRY

# NIXL built against a UCX with the GPU device API exposes memory views
# (prep_mem_view); te has no such API.
HAVE_UCX_GPU_DEVICE_API = False

# NIXL's default listener port.
DEFAULT_COMM_PORT = 8888
