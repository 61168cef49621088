"""Child processes for the FILE_SEG tests of te's nixl package: a process
under a file size limit (setrlimit applies to the whole process) and one
with the fake CUDA driver loaded. Started with "spawn", driven over a Pipe."""

import os
import resource
import time

MB = 1 << 20


def _wait(agent, x, timeout=60):
    deadline = time.monotonic() + timeout
    st = agent.check_xfer_state(x)
    while st == "PROC" and time.monotonic() < deadline:
        time.sleep(0.001)
        st = agent.check_xfer_state(x)
    return st


def fsize_limited(conn, path, limit):
    """A 4*limit-byte file, then RLIMIT_FSIZE = limit (the kernel fails
    writes at or past it with EFBIG, as a full disk fails them with
    ENOSPC): WRITE one block below the limit and one past it. Replies
    (states, te error code and message of the failed one, whether the
    first block landed)."""
    import numpy as np
    from nixl._api import nixl_agent, nixl_agent_config

    from peers import pattern

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, 4 * limit)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes get EFBIG
    a = nixl_agent("fsize", nixl_agent_config(backends=["POSIX"]))
    src = np.frombuffer(pattern(71, 2 * 4096), dtype=np.uint8).copy()
    a.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    freg = a.register_memory([(0, 4 * limit, fd, "")], "FILE")
    ok = a.initialize_xfer("WRITE", a.get_xfer_descs([(src.ctypes.data, 4096, 0)], "DRAM"),
                           a.get_xfer_descs([(4096, 4096, fd)], "FILE"), "fsize")
    full = a.initialize_xfer("WRITE", a.get_xfer_descs([(src.ctypes.data + 4096, 4096, 0)], "DRAM"),
                             a.get_xfer_descs([(2 * limit, 4096, fd)], "FILE"), "fsize")
    states = []
    for x in (ok, full):
        a.transfer(x)
        states.append(_wait(a, x))
    landed = os.pread(fd, 4096, 4096) == src[:4096].tobytes()
    conn.send((states, full.err, full.err_msg, landed))
    a.release_xfer_handle(ok)
    a.release_xfer_handle(full)
    a.deregister_memory(freg)
    a.close()
    os.close(fd)


def vram_files(conn, fake, path, size):
    """Device memory of the fake CUDA driver to a file and back through a
    GDS agent (te stages through pinned host memory), in 4 KiB and 1 MiB
    descriptors; a POSIX-only agent is refused VRAM. Replies (states, file
    bytes == device bytes, read-back == written, POSIX refusal class name)."""
    import numpy as np
    import nixl._bindings as nb
    from nixl._api import nixl_agent, nixl_agent_config

    from nixl_peers import FakeCuda
    from peers import pattern

    cu = FakeCuda(fake)
    data = pattern(91, size)
    src = cu.alloc(size, data)
    dst = cu.alloc(size, b"\0" * size)
    a = nixl_agent("gds", nixl_agent_config(backends=["GDS"]))
    vreg = a.register_memory([(src, size, 0, ""), (dst, size, 0, "")], "VRAM")
    freg = a.register_memory([(0, size, 3, "rw,create:" + path)], "FILE")
    states, files_ok, back_ok = [], [], []
    for bs in (4096, MB):
        n = size // bs
        perm = np.random.default_rng(bs).permutation(n).astype(np.uint64)
        mem = np.zeros((n, 3), dtype=np.uint64)
        mem[:, 0] = src + np.arange(n, dtype=np.uint64) * bs
        mem[:, 1] = bs
        fil = mem.copy()
        fil[:, 0] = perm * np.uint64(bs)
        fil[:, 2] = 3
        w = a.initialize_xfer("WRITE", a.get_xfer_descs(mem, "VRAM"), a.get_xfer_descs(fil, "FILE"), "gds")
        a.transfer(w)
        states.append(_wait(a, w))
        with open(path, "rb") as f:
            disk = f.read()
        files_ok.append(all(disk[int(p) * bs:(int(p) + 1) * bs] == data[i * bs:(i + 1) * bs]
                            for i, p in enumerate(perm)))
        mem[:, 0] = dst + np.arange(n, dtype=np.uint64) * bs
        r = a.initialize_xfer("READ", a.get_xfer_descs(mem, "VRAM"), a.get_xfer_descs(fil, "FILE"), "gds")
        a.transfer(r)
        states.append(_wait(a, r))
        back_ok.append(cu.get(dst, size) == data)
        cu.put(dst, b"\0" * size)
        a.release_xfer_handle(w)
        a.release_xfer_handle(r)
    backend = a.query_xfer_backend(w)
    p = nixl_agent("posix-only", nixl_agent_config(backends=["POSIX"]))
    refused = None
    try:
        p.register_memory([(src, size, 0, "")], "VRAM")
    except nb.nixlError as e:
        refused = type(e).__name__
    p.close()
    a.deregister_memory(freg)
    a.deregister_memory(vreg)
    a.close()
    conn.send((states, files_ok, back_ok, backend, refused))


def file_thief(conn, secret, segment, targets):
    """Another process's te engine with the cluster secret, which knows an
    agent's te segment and where its files are (targets: [(te address,
    length)]): lists the segment's buffers, then READs each target into its
    own memory and WRITEs 0xEE over it. Replies (the file buffers it saw,
    [(op, address, outcome, bytes read)]), outcome being "COMPLETED" or the
    te error class that refused it."""
    import ctypes

    import te

    e = te.Engine(listen_addr="127.0.0.1:0", rpc_timeout=5, auth_secret=secret)
    n = max(length for _, length in targets)
    buf = ctypes.create_string_buffer(b"\xee" * n, n)
    local = e.register(ctypes.addressof(buf), n)
    seg = e.open_segment(segment)
    seen = [b for b in seg.buffers() if b[2] == "file"]
    out = []
    for addr, length in targets:
        for op in ("read", "write"):
            ctypes.memset(buf, 0xEE, n)
            try:
                st = getattr(e, op)(seg, local, addr, length, timeout=30)
                outcome = te.STATE_NAMES.get(st.state, str(st.state))
            except te.TeError as err:
                outcome = type(err).__name__
            out.append((op, addr, outcome, buf.raw[:length] if op == "read" else b""))
    seg.close()
    e.close()
    conn.send((seen, out))
