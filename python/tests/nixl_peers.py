"""Peer processes for test_nixl.py: NIXL agents on te in a child started
with multiprocessing's "spawn" method, driven over a Pipe. Each binds
127.0.0.1 (TE_NIXL_HOST) and answers every command; every wait is bounded."""

import ctypes
import os
import time

import numpy as np

from peers import first_diff, pattern

os.environ.setdefault("TE_NIXL_HOST", "127.0.0.1")


def _buf(n, seed=None, avoid=()):
    """A numpy byte buffer of n bytes (pattern(seed) when seed is given), at
    an address not in avoid."""
    keep = []
    for _ in range(16):
        b = np.zeros(n, dtype=np.uint8)
        if b.ctypes.data not in avoid:
            break
        keep.append(b)  # hold it so the next allocation lands elsewhere
    if seed is not None:
        b[:] = np.frombuffer(pattern(seed, n), dtype=np.uint8)
    return b


def kv_prefill(conn, name, layers, blocks, block_len, seed, listen_port=0):
    """vLLM's prefill side: one KV region per layer (blocks x block_len,
    DRAM), registered the way NixlConnector registers them; its metadata
    and region addresses go to the decode side, which READs blocks and
    attaches one notification per request. Commands:
      ("notifs", count, timeout) -> {agent: [msgs]} once count arrived
      ("region", layer) -> bytes of that layer's region
      ("exit",) -> "bye" after deregistering and closing."""
    from nixl._api import nixl_agent, nixl_agent_config

    conf = nixl_agent_config(backends=["UCX"], enable_listen_thread=bool(listen_port), listen_port=listen_port)
    agent = nixl_agent(name, conf)
    regions = [_buf(blocks * block_len, seed + i) for i in range(layers)]
    caches = [(r.ctypes.data, r.nbytes, 0, "") for r in regions]
    descs = agent.get_reg_descs(caches, "DRAM")
    agent.register_memory(descs, backends=["UCX"])
    conn.send((agent.get_agent_metadata(), [r.ctypes.data for r in regions]))
    got = {}
    while True:
        cmd = conn.recv()
        if cmd[0] == "notifs":
            _, count, timeout = cmd
            deadline = time.monotonic() + timeout
            while sum(map(len, got.values())) < count and time.monotonic() < deadline:
                for k, v in agent.get_new_notifs().items():
                    got.setdefault(k, []).extend(v)
                time.sleep(0.002)
            conn.send(got)
            got = {}
        elif cmd[0] == "region":
            conn.send(regions[cmd[1]].tobytes())
        elif cmd[0] == "exit":
            agent.deregister_memory(descs)
            agent.close()
            conn.send("bye")
            return


def sglang_decode(conn, name, layers, pages, page_len, aux_len):
    """SGLang's decode side (NixlKVReceiver / NixlKVManager): KV pages per
    layer registered as one list, the aux buffer as another (DRAM); its
    metadata and buffer pointers go to prefill, which WRITEs chunks and
    attaches "<room>_kv_<chunk>_<is_last>" and "<room>_aux" notifications.
    Commands:
      ("wait", room, timeout) -> (chunks received, aux received, is_last seen)
      ("check", layer, page, seed) -> first differing offset of a page (-1: equal)
      ("check_aux", seed) -> the same for the aux buffer
      ("exit",) -> "bye"."""
    from nixl._api import nixl_agent

    agent = nixl_agent(name)  # SGLang's form: default config (UCX)
    kv = [_buf(pages * page_len) for _ in range(layers)]
    aux = _buf(aux_len)
    kv_descs = agent.register_memory([(b.ctypes.data, b.nbytes, 0, "") for b in kv], "DRAM")
    aux_descs = agent.register_memory([(aux.ctypes.data, aux.nbytes, 0, "")], "DRAM")
    if not kv_descs or not aux_descs:
        conn.send(("error", "registration failed"))
        return
    conn.send((agent.get_agent_metadata(), [b.ctypes.data for b in kv], aux.ctypes.data))
    status = {}
    while True:
        cmd = conn.recv()
        if cmd[0] == "wait":
            _, room, timeout = cmd
            deadline = time.monotonic() + timeout
            st = status.setdefault(room, {"kvs": set(), "expected": None, "aux": False})
            while time.monotonic() < deadline and not (st["aux"] and st["expected"] is not None and
                                                       len(st["kvs"]) == st["expected"]):
                for _peer, msgs in agent.get_new_notifs().items():
                    for m in msgs:
                        parts = m.decode("ascii").split("_")
                        s = status.setdefault(int(parts[0]), {"kvs": set(), "expected": None, "aux": False})
                        if parts[1] == "kv":
                            s["kvs"].add(int(parts[2]))
                            if int(parts[3]):
                                s["expected"] = int(parts[2]) + 1
                        elif parts[1] == "aux":
                            s["aux"] = True
                time.sleep(0.002)
            conn.send((sorted(st["kvs"]), st["aux"], st["expected"]))
        elif cmd[0] == "check":
            _, layer, page, seed = cmd
            got = kv[layer][page * page_len:(page + 1) * page_len].tobytes()
            conn.send(first_diff(got, pattern(seed, page_len)))
        elif cmd[0] == "check_aux":
            conn.send(first_diff(aux.tobytes(), pattern(cmd[1], aux_len)))
        elif cmd[0] == "exit":
            agent.deregister_memory(kv_descs)
            agent.deregister_memory(aux_descs)
            agent.close()
            conn.send("bye")
            return


def listener_target(conn, name, port, size, seed, avoid=()):
    """An agent with its listener on port and one registered buffer of
    pattern(seed). Replies (address,); then ("exit",) -> "bye". Used for the
    restarted-peer test: a second one with the same name and port is the
    restarted peer."""
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent(name, nixl_agent_config(True, True, port))
    buf = _buf(size, seed, avoid=set(avoid))
    descs = agent.register_memory([(buf.ctypes.data, size, 0, "")], "DRAM")
    conn.send((buf.ctypes.data,))
    while True:
        cmd = conn.recv()
        if cmd[0] == "exit":
            agent.deregister_memory(descs)
            agent.close()
            conn.send("bye")
            return


def plain_target(conn, name, size, seed):
    """An agent with one registered buffer; replies (metadata, address) and
    then serves until killed or told ("exit",)."""
    from nixl._api import nixl_agent

    agent = nixl_agent(name)
    buf = _buf(size, seed)
    descs = agent.register_memory([(buf.ctypes.data, size, 0, "")], "DRAM")
    conn.send((agent.get_agent_metadata(), buf.ctypes.data, os.getpid()))
    while True:
        cmd = conn.recv()
        if cmd[0] == "exit":
            agent.deregister_memory(descs)
            agent.close()
            conn.send("bye")
            return


def rdma_pair(conn, size):
    """Two agents in this process over te's rdma transport (forced, on the
    fake verbs library the parent put in TE_IBV_LIBRARY): a WRITE and a READ
    with notifications. Replies (transports, write ok, read ok, notifs)."""
    from nixl._api import nixl_agent

    a, b = nixl_agent("rdma-a"), nixl_agent("rdma-b")
    src, dst, back = _buf(size, 21), _buf(size), _buf(size)
    a.register_memory([(src.ctypes.data, size, 0, ""), (back.ctypes.data, size, 0, "")], "DRAM")
    b.register_memory([(dst.ctypes.data, size, 0, "")], "DRAM")
    a.add_remote_agent(b.get_agent_metadata())
    half = size // 2
    results = []
    for op, local, note in (("WRITE", src, b"w"), ("READ", back, b"r")):
        x = a.initialize_xfer(op, a.get_xfer_descs([(local.ctypes.data, half, 0), (local.ctypes.data + half, half, 0)],
                                                   "DRAM"),
                              a.get_xfer_descs([(dst.ctypes.data + half, half, 0), (dst.ctypes.data, half, 0)], "DRAM"),
                              "rdma-b", note)
        a.transfer(x)
        results.append(a.wait_xfer(x, 60))
        a.release_xfer_handle(x)
    swapped = np.concatenate([src[half:], src[:half]])
    deadline = time.monotonic() + 30
    notifs = {}
    while sum(map(len, notifs.values())) < 2 and time.monotonic() < deadline:
        for k, v in b.get_new_notifs().items():
            notifs.setdefault(k, []).extend(v)
        time.sleep(0.002)
    conn.send((a.agent._engine.stats()["transports"], results, bool((dst == swapped).all()),
               bool((back == src).all()), notifs))
    a.close()
    b.close()


# -- VRAM through a fake CUDA driver ---------------------------------------------

class FakeCuda:
    """The fake driver (internal/sys/cuda/cudatest/testdata/fakecuda.c)
    through ctypes: the same library te loads (TE_CUDA_LIBRARY), so the
    "device memory" allocated here is device memory to te."""

    def __init__(self, path):
        c = ctypes.CDLL(path)
        self.c = c
        if c.cuInit(0) != 0:
            raise RuntimeError("cuInit failed")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        if c.cuDeviceGet(ctypes.byref(dev), 0) or c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) or \
                c.cuCtxSetCurrent(ctx):
            raise RuntimeError("no context")

    def alloc(self, n, data):
        p = ctypes.c_ulonglong()
        if self.c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)):
            raise RuntimeError("cuMemAlloc failed")
        self.put(p.value, data)
        return p.value

    def put(self, p, data):
        src = ctypes.create_string_buffer(bytes(data), len(data))
        if self.c.cuMemcpyHtoD_v2(ctypes.c_ulonglong(p), src, ctypes.c_size_t(len(data))):
            raise RuntimeError("cuMemcpyHtoD failed")

    def get(self, p, n):
        dst = ctypes.create_string_buffer(n)
        if self.c.cuMemcpyDtoH_v2(dst, ctypes.c_ulonglong(p), ctypes.c_size_t(n)):
            raise RuntimeError("cuMemcpyDtoH failed")
        return dst.raw


def vram_target(conn, fake, name, blocks, block_len, seed, mem="VRAM"):
    """VRAM KV blocks on fake device 0, registered as mem (VRAM, or DRAM
    to play a caller that mislabels device memory); replies (metadata,
    device address, te transports)."""
    from nixl._api import nixl_agent

    cu = FakeCuda(fake)
    n = blocks * block_len
    dptr = cu.alloc(n, pattern(seed, n))
    agent = nixl_agent(name)
    descs = agent.register_memory([(dptr, n, 0, "")], mem)
    conn.send((agent.get_agent_metadata(), dptr, agent.agent._engine.stats()["transports"]))
    while True:
        cmd = conn.recv()
        if cmd[0] == "notifs":
            deadline = time.monotonic() + cmd[2]
            got = {}
            while sum(map(len, got.values())) < cmd[1] and time.monotonic() < deadline:
                for k, v in agent.get_new_notifs().items():
                    got.setdefault(k, []).extend(v)
                time.sleep(0.002)
            conn.send(got)
        elif cmd[0] == "exit":
            agent.deregister_memory(descs)
            agent.close()
            conn.send("bye")
            return


def vram_reader(conn, fake, name, blocks, block_len, md, rptr, read_blocks, rmem="VRAM"):
    """The decode side in VRAM: registers its device blocks, loads the
    target's metadata and READs read_blocks (block i of the target into
    block i here) with a notification; replies (state, bytes of each read
    block as the reader's device holds them, telemetry descCount)."""
    from nixl._api import nixl_agent, nixl_agent_config

    cu = FakeCuda(fake)
    n = blocks * block_len
    dptr = cu.alloc(n, b"\0" * n)
    agent = nixl_agent(name, nixl_agent_config(capture_telemetry=True))
    descs = agent.register_memory([(dptr, n, 0, "")], "VRAM")
    peer = agent.add_remote_agent(md)
    mk = np.zeros((blocks, 3), dtype=np.uint64)
    mk[:, 1] = block_len
    local, remote = mk.copy(), mk.copy()
    local[:, 0] = dptr + np.arange(blocks, dtype=np.uint64) * block_len
    remote[:, 0] = rptr + np.arange(blocks, dtype=np.uint64) * block_len
    lh = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, "VRAM")
    rh = agent.prep_xfer_dlist(peer, remote, rmem)
    x = agent.make_prepped_xfer("READ", lh, read_blocks, rh, read_blocks, b"vram-done")
    state = agent.transfer(x)
    deadline = time.monotonic() + 60
    while state == "PROC" and time.monotonic() < deadline:
        state = agent.check_xfer_state(x)
        time.sleep(0.001)
    got = [cu.get(dptr + b * block_len, block_len) for b in read_blocks]
    tel = agent.get_xfer_telemetry(x).descCount if state == "DONE" else None
    agent.release_xfer_handle(x)
    agent.deregister_memory(descs)
    agent.close()
    conn.send((state, got, tel))


def etcd_target(conn, name, size, seed):
    """An agent that publishes its metadata only to etcd (NIXL_ETCD_ENDPOINTS
    in its environment; no listener, no address given to anyone). Sends
    (buffer address, size) once published. Commands:
      ("notifs", count, timeout) -> {agent: [msgs]} once count arrived
      ("bytes",) -> the buffer's bytes
      ("partial", label) -> None once partial metadata is published under label
      ("invalidate",) -> None once its metadata is removed from etcd
      ("exit",) -> "bye" after closing."""
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent(name, nixl_agent_config(backends=["UCX"]))
    buf = _buf(size, seed)
    descs = agent.get_reg_descs([(buf.ctypes.data, size, 0, "")], "DRAM")
    agent.register_memory(descs)
    agent.send_local_metadata()
    conn.send((buf.ctypes.data, size))
    got = {}
    while True:
        cmd = conn.recv()
        if cmd[0] == "notifs":
            _, count, timeout = cmd
            deadline = time.monotonic() + timeout
            while sum(map(len, got.values())) < count and time.monotonic() < deadline:
                for k, v in agent.get_new_notifs().items():
                    got.setdefault(k, []).extend(v)
                time.sleep(0.002)
            conn.send(got)
            got = {}
        elif cmd[0] == "bytes":
            conn.send(buf.tobytes())
        elif cmd[0] == "partial":
            agent.send_partial_agent_metadata(descs, True, label=cmd[1])
            conn.send(None)
        elif cmd[0] == "invalidate":
            agent.invalidate_local_metadata()
            conn.send(None)
        elif cmd[0] == "exit":
            agent.close()
            conn.send("bye")
            return


def _rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def listener_victim(conn, secret):
    """An agent "victim" with its listener on, under the cluster secret.
    Sends (its te segment, its RSS in bytes); then answers "state" with
    {remotes, ranges (held for its remotes), refused (listener metadata
    refused over a per-source bound), rss} and "exit" with "bye"."""
    os.environ["TE_AUTH_SECRET"] = secret
    from nixl._api import nixl_agent, nixl_agent_config

    a = nixl_agent("victim", nixl_agent_config(enable_listen_thread=True, listen_port=0))
    ag = a.agent
    conn.send((ag._segname, _rss()))
    while True:
        cmd = conn.recv()
        if cmd == "state":
            with ag._lock:
                remotes = list(ag._remotes.values())
                ranges = sum(sum(len(t.starts) for t in r.tables.values()) for r in remotes)
            sources = getattr(ag, "_sources", None)
            conn.send({"remotes": len(remotes), "ranges": ranges, "refused": sources.refused if sources else 0,
                       "rss": _rss()})
        elif cmd == "exit":
            a.close()
            conn.send("bye")
            return


def get_flooder(conn, secret, segment, want, reply, count):
    """Another engine with the cluster secret sends count metadata requests
    ("nixl/md/get") for agent want at segment, each asking for the reply at
    reply. Replies the number te delivered (a receiver over its budget
    refuses some; they are not retried)."""
    import json

    import te

    e = te.Engine(listen_addr="127.0.0.1:0", rpc_timeout=5, auth_secret=secret)
    req = json.dumps({"want": want, "from": "flooder", "reply": reply}).encode()
    sent = 0
    for _ in range(count):
        try:
            e.send_notify(segment, "nixl/md/get", req)
            sent += 1
        except te.ResourceExhausted:
            pass
    e.close()
    conn.send(sent)
