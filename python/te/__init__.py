"""te: a KV-cache transfer engine, through its C ABI (libte.so, te.h).

```python
import te

with te.Engine(listen_addr="127.0.0.1:0") as e:
    src, dst = bytearray(b"kv" * (1 << 19)), bytearray(1 << 20)
    src_addr, dst_addr = e.register(src), e.register(dst)  # addresses
    seg = e.open_segment(e.name)  # a peer's segment name (host:port) in real use
    e.write(seg, src_addr, dst_addr, len(src))
    assert dst == src
```

Install with `pip install .` at the repository root: the wheel carries
libte.so inside this package, so nothing needs to be set. $TE_LIBRARY still
overrides it; in a source checkout the repository's build/ folder is tried
last. libte.so contains a Go runtime, loaded on the first call and never
unloaded; a child forked after that gets te.ForkError from every call (use
multiprocessing's "spawn" start method). Blocking calls release the GIL.
Errors are raised as subclasses of te.TeError carrying te's stable code.

te.kvcache has KV-cache layouts, transfer plans and the prefill-to-decode
handoff through te-sidecar. Tensor-like objects (torch tensors: data_ptr(),
.device) register at their device's location, "cuda:N" for GPU memory.
"""

from ._lib import ABI_MAJOR, ABI_MINOR, forked, load, path as library_path  # noqa: F401
from .core import (CANCELED, COMPLETED, FAILED, INVALID, PENDING, READ, STATE_NAMES, TIMEOUT, WAITING,  # noqa: F401
                   WRITE, Batch, BatchStatus, Engine, Limits, Segment, address_of, check, local_topology)
from .errors import *  # noqa: F401,F403
from .errors import BY_CODE, LibraryError, TeError, error_for  # noqa: F401
from .tensors import device_of, location_of  # noqa: F401
from . import kvcache  # noqa: F401,E402
from .store import Store  # noqa: F401,E402
from ._version_info import version_string as _version_string
from ._logging import apply_env_level as _apply_env_level

_apply_env_level()

#: te's version, as te_version() of the bundled libte.so says (the wheel's
#: te/_version.py). In a source checkout without a wheel: what
#: mk/version.sh says, as make stamps it into libte.so and te-sidecar.
#: Reading it does not load the library.
__version__ = _version_string()


def abi_version():
    """(major, minor) of the loaded library."""
    v = load().te_abi_version()
    return v >> 16, v & 0xFFFF


def version():
    """te_version() of the loaded library (loads it): the same string as
    __version__ for the library the wheel bundles."""
    import ctypes

    lib = load()
    buf = ctypes.create_string_buffer(256)
    check(lib.te_version(buf, len(buf)), lib)
    return buf.value.decode()
