"""Processes of the fake-fabric test (test_rdma_fabric.py): each runs one
te.Engine on the fake libibverbs and holds fake GPU memory it allocates
through the fake CUDA driver with ctypes, as an application would with
cuMemAlloc. Started with multiprocessing's "spawn" method, driven over a
Pipe."""

import ctypes
import os
import random

HALF = 2 << 20


def pattern(seed, n):
    return random.Random(seed).randbytes(n)


class FakeGPU:
    """Device memory from the driver at TE_CUDA_LIBRARY."""

    def __init__(self):
        self.cu = ctypes.CDLL(os.environ.get("TE_CUDA_LIBRARY") or "libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        self.check("cuInit", ctypes.c_uint(0))

    def check(self, name, *args):
        rc = getattr(self.cu, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name}: CUresult {rc}")

    def alloc(self, dev, n):
        d, ctx, p = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_ulonglong()
        self.check("cuDeviceGet", ctypes.byref(d), ctypes.c_int(dev))
        self.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), d)
        self.check("cuCtxSetCurrent", ctx)
        self.check("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(n))
        return p.value

    def put(self, addr, data):
        self.check("cuMemcpyHtoD_v2", ctypes.c_ulonglong(addr), ctypes.c_char_p(data), ctypes.c_size_t(len(data)))

    def get(self, addr, n):
        b = ctypes.create_string_buffer(n)
        self.check("cuMemcpyDtoH_v2", b, ctypes.c_ulonglong(addr), ctypes.c_size_t(n))
        return b.raw

    def free(self, addr):
        self.check("cuMemFree_v2", ctypes.c_ulonglong(addr))


def target(conn, seed_own, seed_peer, dev=5, transports="rdma,tcp"):
    """GPU dev's memory: its first half holds seed_own, the second half is
    for the initiator to write."""
    import te

    gpu = FakeGPU()
    e = te.Engine(listen_addr="127.0.0.1:0", transports=transports, rpc_timeout=5)
    g = gpu.alloc(dev, 2 * HALF)
    gpu.put(g, pattern(seed_own, HALF) + bytes(HALF))
    e.register(g, 2 * HALF, location=f"cuda:{dev}")
    conn.send((e.name, g))
    while True:
        cmd = conn.recv()
        if cmd == "check":
            conn.send(gpu.get(g + HALF, HALF) == pattern(seed_peer, HALF))
        elif cmd == "exit":
            e.unregister(g)
            e.close()
            gpu.free(g)
            conn.send("bye")
            return


def initiator(conn, name, raddr, seed_own, seed_peer, dev=3, transports="rdma,tcp", force="rdma"):
    """GPU dev's memory and host memory on socket 1: READ the target's
    first half into the GPU, WRITE the GPU's pattern into its second half,
    then host memory into it; report what went where."""
    import te

    gpu = FakeGPU()
    e = te.Engine(listen_addr="127.0.0.1:0", transports=transports, force_transport=force, rpc_timeout=5)
    g = gpu.alloc(dev, 2 * HALF)
    gpu.put(g, bytes(HALF) + pattern(seed_own, HALF))
    e.register(g, 2 * HALF, location=f"cuda:{dev}")
    host = bytearray(pattern(seed_own, HALF))
    e.register(host, location="cpu:1")
    seg = e.open_segment(name)
    out = {"transports": set(), "states": []}

    def run(reqs):
        b = e.allocate_batch(len(reqs))
        b.submit(reqs)
        st = b.wait(30)
        out["states"].append(st.state_name)
        for i in range(len(reqs)):
            out["transports"].add(b.task_status(i)[3])
        b.free()

    chunk = 300007
    run([(te.READ, g + off, seg, raddr + off, min(chunk, HALF - off)) for off in range(0, HALF, chunk)])
    out["read_ok"] = gpu.get(g, HALF) == pattern(seed_peer, HALF)
    rdma = lambda: e.stats().get("transport_stats", {}).get("rdma", {})  # noqa: E731
    before = rdma()
    run([(te.WRITE, g + HALF + off, seg, raddr + HALF + off, min(chunk, HALF - off)) for off in range(0, HALF, chunk)])
    out["gpu_write"] = {k: v - before.get(k, 0) for k, v in rdma().items()
                        if k.startswith("rail.") and v != before.get(k, 0)}
    conn.send(("written", None))
    out["target_ok"] = conn.recv()
    before = rdma()
    run([(te.WRITE, host, seg, raddr + HALF, HALF)])
    out["host_write"] = {k: v - before.get(k, 0) for k, v in rdma().items()
                         if k.startswith("rail.") and v != before.get(k, 0)}
    # Under a window: a transport that cannot enforce one (rdma, cudaipc) is
    # refused at submit (NotSupported, nothing started); any key will do.
    b = e.allocate_batch(1)
    try:
        b.submit([(te.WRITE, host, seg, raddr + HALF, 4096)], window=0x1234567890ABCDEF)
        b.wait(30)
        out["window"] = "sent"
    except te.TeError as err:
        out["window"] = (type(err).__name__, "window" in str(err), b.status().tasks)
    b.free()
    out["topology"] = e.topology()
    out["gpu_dmabuf"] = rdma().get("gpu_dmabuf")
    out["transports"] = sorted(out["transports"])
    seg.close()
    e.unregister(g)
    e.unregister(host)
    e.close()
    gpu.free(g)
    conn.send(("done", out))
