"""NIXL's test helpers (nixl._utils): raw host memory by address.

malloc_passthru(size) / free_passthru(addr) allocate and free with the C
library's malloc and free; ba_buf fills a buffer with a byte pattern;
verify_transfer compares two buffers and raises AssertionError, naming the
first differing offset, when they differ.
"""

import ctypes

_libc = ctypes.CDLL(None)
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.malloc.restype = ctypes.c_void_p
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None
_libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
_libc.memset.restype = ctypes.c_void_p

_PATTERN = bytes(range(256))


def malloc_passthru(size):
    """Address of size bytes from malloc; MemoryError when it fails."""
    size = int(size)
    if size <= 0:
        raise ValueError(f"size {size} must be positive")
    p = _libc.malloc(size)
    if not p:
        raise MemoryError(f"malloc({size}) failed")
    return int(p)


def free_passthru(addr):
    _libc.free(ctypes.c_void_p(int(addr)))


def ba_buf(addr, size, start=0):
    """Fill size bytes at addr with (start + i) mod 256."""
    size = int(size)
    start %= 256
    data = (_PATTERN[start:] + _PATTERN[:start]) * (size // 256 + 1)
    ctypes.memmove(int(addr), data, size)


def set_buf(addr, size, value):
    """memset."""
    _libc.memset(int(addr), int(value) & 0xFF, int(size))


def read_buf(addr, size):
    """The size bytes at addr."""
    return ctypes.string_at(int(addr), int(size))


def verify_transfer(addr1, addr2, size):
    a, b = read_buf(addr1, size), read_buf(addr2, size)
    if a != b:
        i = next(k for k in range(size) if a[k] != b[k])
        raise AssertionError(f"buffers differ at offset {i} of {size}: {a[i]:#04x} != {b[i]:#04x}")
    return True
