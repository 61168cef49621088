"""Tensor-like objects (torch tensors and look-alikes) as te buffers.

te never imports torch. An object counts as a tensor when it has
data_ptr(); its device comes from .device (a torch.device, or a string such
as "cuda:1") with .device.index or .get_device() for the ordinal, or from
.is_cuda. A tensor on a CUDA device registers at location "cuda:N", so the
engine treats it as GPU memory (and refuses it cleanly with NotSupported
where CUDA is not available); a CPU tensor registers as "cpu".
"""

import sys

from .errors import InvalidArgument, NotSupported


def is_tensor(obj):
    """Whether obj is tensor-like (has data_ptr())."""
    return hasattr(obj, "data_ptr") and not isinstance(obj, (int, bytes, bytearray, memoryview))


def _parse(dev):
    """(type, index or None) of a torch.device-like object or a string."""
    if isinstance(dev, str):
        kind, _, idx = dev.partition(":")
        return kind.strip().lower(), int(idx) if idx.strip() else None
    kind = getattr(dev, "type", None)
    if kind is None:
        return None, None
    return str(kind).lower(), getattr(dev, "index", None)


def _current_cuda_device():
    # Only when torch is already loaded: te never imports it.
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return int(torch.cuda.current_device())
        except Exception:
            pass
    return 0


def device_of(obj):
    """("cuda", N) for a tensor on CUDA device N, ("cpu", None) for one in
    host memory, None for an object that is not tensor-like. Other devices
    (mps, xpu, meta, ...) raise NotSupported."""
    if not is_tensor(obj):
        return None
    dev = getattr(obj, "device", None)
    kind, index = _parse(dev) if dev is not None else (None, None)
    if kind is None:
        kind = "cuda" if getattr(obj, "is_cuda", False) else "cpu"
    if kind == "cpu":
        return "cpu", None
    if kind != "cuda":
        raise NotSupported(f"tensor on device {kind!r}: te moves host and CUDA memory only")
    if index is None and hasattr(obj, "get_device"):
        try:
            g = int(obj.get_device())
        except Exception:
            g = -1
        if g >= 0:
            index = g
    if index is None:
        index = _current_cuda_device()
    if int(index) < 0:
        raise InvalidArgument(f"tensor reports CUDA device index {index}")
    return "cuda", int(index)


def location_of(obj):
    """The registration location of a tensor-like object ("cuda:N" or
    "cpu"), or None for other objects."""
    d = device_of(obj)
    if d is None:
        return None
    return "cpu" if d[0] == "cpu" else f"cuda:{d[1]}"


def resolve_location(obj, location):
    """The location to register obj at, given the caller's location (None or
    "*": let te decide). For a tensor, None and "*" mean the tensor's own
    device; an explicit location that names another kind of memory or another
    GPU is refused, since registering GPU memory as host memory (or the
    reverse) would let transports touch it the wrong way."""
    own = location_of(obj)
    if own is None:
        return "cpu" if location is None else location
    if location is None or location == "*":
        return own
    kind, _, idx = location.partition(":")
    okind, _, oidx = own.partition(":")
    if kind.lower() != okind or (okind == "cuda" and idx.strip() and idx.strip() != oidx):
        raise InvalidArgument(f"location {location!r} given for a tensor on {own}")
    return location
