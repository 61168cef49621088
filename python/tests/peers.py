"""Target processes for the two-process tests. They run in a child started
with multiprocessing's "spawn" method (never fork: libte holds a Go runtime)
and take commands over a Pipe."""

import random

MB = 1 << 20


def pattern(seed, n):
    """n deterministic bytes: any offset error shows as a mismatch."""
    return random.Random(seed).randbytes(n)


def first_diff(a, b):
    if a == b:
        return -1
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def te_target(conn, size, seed_own, seed_peer):
    """A te.Engine with one buffer: first half its own pattern, second half
    to be written by the peer."""
    import te

    e = te.Engine(listen_addr="127.0.0.1:0", rpc_timeout=5)
    half = size // 2
    buf = bytearray(size)
    buf[:half] = pattern(seed_own, half)
    addr = e.register(buf)
    conn.send((e.name, addr, size))
    while True:
        cmd = conn.recv()
        if cmd == "check":
            conn.send({
                "peer_half": first_diff(bytes(buf[half:]), pattern(seed_peer, half)),
                "own_half": first_diff(bytes(buf[:half]), pattern(seed_own, half)),
                "notifies": e.notifies(),
            })
        elif cmd == "exit":
            e.unregister(buf)
            e.close()
            conn.send("bye")
            return


def mooncake_target(conn, sizes, seeds, protocol):
    """A mooncake TransferEngine set up the way vLLM's connector does: P2P
    handshake, KV buffers registered with batch_register_memory."""
    import ctypes
    import mmap

    from mooncake.engine import TransferEngine

    eng = TransferEngine()
    rc = eng.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "")
    if rc != 0:
        conn.send(("init failed", rc))
        return
    maps = [mmap.mmap(-1, n) for n in sizes]
    addrs = [ctypes.addressof(ctypes.c_char.from_buffer(m)) for m in maps]
    for m, n, s in zip(maps, sizes, seeds):
        m[:] = pattern(s, n)
    rc = eng.batch_register_memory(addrs, list(sizes))
    conn.send((f"127.0.0.1:{eng.get_rpc_port()}", addrs, rc))
    while True:
        cmd = conn.recv()
        if cmd[0] == "read":
            _, i = cmd
            conn.send(eng.read_bytes_from_buffer(addrs[i], sizes[i]))
        elif cmd[0] == "notifies":
            conn.send([(n.name, n.msg) for n in eng.get_notifies()])
        elif cmd[0] == "exit":
            conn.send(eng.batch_unregister_memory(addrs))
            eng.close()
            return


def mooncake_conventions_target(conn, protocol):
    """Mooncake's own transfer_engine_target.py, on a free port: initialize,
    and when the segment has no buffer yet, allocate_managed_buffer(64 MiB)
    as the fallback buffer the initiator writes into."""
    from mooncake.engine import TransferEngine

    eng = TransferEngine()
    rc = eng.initialize("127.0.0.1:0", "P2PHANDSHAKE", protocol, "")
    if rc != 0:
        conn.send(("init failed", 0, rc))
        return
    name = f"127.0.0.1:{eng.get_rpc_port()}"
    addr = eng.get_first_buffer_address(name)
    if addr == 0:
        addr = eng.allocate_managed_buffer(64 << 20)
    conn.send((name, addr, 0 if addr else -1))
    while True:
        cmd = conn.recv()
        if cmd[0] == "read":
            _, off, n = cmd
            conn.send(eng.read_bytes_from_buffer(addr + off, n))
        elif cmd[0] == "exit":
            conn.send(eng.free_managed_buffer(addr, 64 << 20))
            eng.close()
            return


def te_secret_target(conn, size, fill):
    """A te.Engine over tcp with a buffer of size bytes filled with fill; its
    cluster secret (if any) comes from the environment. Reports its pid so
    the test can stop and continue it."""
    import os

    import te

    e = te.Engine(listen_addr="127.0.0.1:0", hostname="127.0.0.1", transports="tcp", rpc_timeout=5)
    buf = bytearray([fill]) * size
    addr = e.register(buf)
    conn.send((e.name, addr, os.getpid()))
    while True:
        cmd = conn.recv()
        if cmd == "exit":
            e.unregister(buf)
            e.close()
            conn.send("bye")
            return


def file_node(conn, path, size, secret):
    """A storage node: a te.Engine that registers a file (by fd) and serves
    it to peers over tcp, behind the cluster secret."""
    import os

    import te

    e = te.Engine(listen_addr="127.0.0.1:0", rpc_timeout=5, auth_secret=secret)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, size)
    addr = e.register_file(fd=fd, length=size)
    os.close(fd)  # the library keeps its own descriptors
    conn.send((e.name, addr))
    while True:
        cmd = conn.recv()
        if cmd == "stats":
            conn.send(e.stats().get("transport_stats", {}).get("file", {}))
        elif cmd == "exit":
            e.unregister(addr)
            e.close()
            conn.send("bye")
            return


def cxl_target(conn, size, seed):
    """A te.Engine with the cxl and tcp transports whose buffer is the first
    size bytes of the shared CXL device (TE_CXL_DEVICE), filled from seed.
    Answers ("crc", off, n) with the CRC-32 of its bytes there."""
    import ctypes
    import random
    import zlib

    import te

    e = te.Engine(listen_addr="127.0.0.1:0", hostname="127.0.0.1", transports="cxl,tcp", rpc_timeout=5)
    base, n = e.cxl_memory()
    assert n >= size
    view = (ctypes.c_char * size).from_address(base)
    view[:] = random.Random(seed).randbytes(size)
    e.register(base, size)
    conn.send((e.name, base, zlib.crc32(bytes(view))))
    while True:
        cmd = conn.recv()
        if cmd == "exit":
            e.unregister(base)
            e.close()
            conn.send("bye")
            return
        _, off, k = cmd
        conn.send(zlib.crc32(bytes(view[off:off + k])))
