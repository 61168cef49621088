"""Drop-in replacement for Mooncake's Python transfer engine, backed by te.

    from mooncake.engine import TransferEngine

Connectors written for Mooncake (vLLM's and SGLang's) run unchanged; see
mooncake/engine.py for the methods, their return conventions and what te
refuses.

This is a namespace-friendly package (pkgutil.extend_path), so it can sit
beside the real Mooncake wheel: `mooncake.store` and the wheel's other
modules are found in the wheel's folder, while `mooncake.engine` comes from
whichever folder is first on sys.path. te's drop-in wins only when te is
installed in a folder that precedes the wheel's (a PYTHONPATH entry, or
`pip install --target DIR` with DIR first). If both are installed into one
site-packages folder, the wheel's compiled engine module takes precedence
over te's engine.py, and its __init__ replaces this one.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)


def __getattr__(name):
    # The real wheel's __init__ exports its buffer pools; when this __init__
    # runs instead (te first on the path), find them in the wheel's module.
    if name in ("BufferPool", "RegisteredBufferPool"):
        from . import buffer_pool

        return getattr(buffer_pool, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
