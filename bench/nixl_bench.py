#!/usr/bin/env python3
"""NIXL's Python API on te against te's own Python API, in one run.

    PYTHONPATH=python TE_LIBRARY=build/libte.so /usr/bin/python3 bench/nixl_bench.py [--json] [--seconds S]

Two processes on 127.0.0.1: a target holding a nixl agent with one
registered buffer, and this initiator. For each transport (shm, tcp: te's
engine forced to it), operation (READ, WRITE) and block size (64 KiB,
1 MiB) the initiator moves batches of blocks two ways through the same te
engine (the nixl agent's), taking turns in short rounds so both see the
same load:

  nixl     one make_prepped_xfer made once, then transfer() and
           check_xfer_state() polled (20 µs pauses, --poll-us) to DONE;
  te poll  te.Engine's Python API: Batch.submit of (op, local, segment,
           remote, length) tuples, Batch.status() polled the same way,
           Batch.reset: the same waiting, so nixl/poll is the APIs' cost;
  nixl w   transfer() then nixl_agent.wait_xfer() (te's addition to the
           API: a blocking wait);
  te wait  te's Batch.submit with the blocking Batch.wait().

GB/s are totals over the rounds; each ratio is the median of the rounds'
own ratios (the ways take turns in short rounds, so a ratio compares runs
that shared the machine's load).

It also times preparation: prep_xfer_dlist (local and remote) plus
make_prepped_xfer for 1,000 descriptors, transfer() of them, and te's
Batch.submit of the same 1,000 requests, and reports memcpy bandwidth in the
same process as the machine's reference. GB/s is 10^9 bytes per second.
"""

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TE_NIXL_HOST", "127.0.0.1")

BUF = 64 << 20
BLOCKS = {64 << 10: 128, 1 << 20: 32}  # block size -> blocks per batch (8 MiB, 32 MiB)
POLL_PAUSE = 20e-6  # --poll-us


def target(conn):
    import numpy as np
    from nixl._api import nixl_agent

    a = nixl_agent("bench-target")
    buf = np.ones(BUF, dtype=np.uint8)
    a.register_memory([(buf.ctypes.data, BUF, 0, "")], "DRAM")
    conn.send((a.get_agent_metadata(), buf.ctypes.data))
    conn.recv()
    a.close()


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memcpy_gbps(np, seconds):
    a, b = np.ones(BUF, dtype=np.uint8), np.zeros(BUF, dtype=np.uint8)
    np.copyto(b, a)  # fault both in first
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        np.copyto(b, a)
        n += BUF
    return n / (time.perf_counter() - t0) / 1e9


class Side:
    """One initiator agent (its te engine forced to a transport), with both
    ways to drive it."""

    def __init__(self, transport, md, raddr):
        import numpy as np
        from nixl._api import nixl_agent

        os.environ["TE_NIXL_FORCE_TRANSPORT"] = transport
        try:
            self.a = nixl_agent(f"bench-{transport}")
        finally:
            del os.environ["TE_NIXL_FORCE_TRANSPORT"]
        self.np = np
        self.buf = np.zeros(BUF, dtype=np.uint8)
        self.laddr, self.raddr = self.buf.ctypes.data, raddr
        self.a.register_memory([(self.laddr, BUF, 0, "")], "DRAM")
        self.peer = self.a.add_remote_agent(md)
        self.eng = self.a.agent._engine  # the same te engine, through te's own API
        from nixl import _meta

        self.seg = self.eng.open_segment(_meta.decode(md).segment)  # the target agent's te segment

    def rows(self, base, n, size):
        r = self.np.zeros((n, 3), dtype=self.np.uint64)
        r[:, 0] = base + self.np.arange(n, dtype=self.np.uint64) * size
        r[:, 1] = size
        return r

    def nixl_xfer(self, op, block, n):
        lh = self.a.prep_xfer_dlist("NIXL_INIT_AGENT", self.rows(self.laddr, BUF // block, block), "DRAM")
        rh = self.a.prep_xfer_dlist(self.peer, self.rows(self.raddr, BUF // block, block), "DRAM")
        # Every other block, so that no two pairs are contiguous: n te
        # requests, as for te's own API below.
        ids = self.np.arange(0, 2 * n, 2)
        return self.a.make_prepped_xfer(op, lh, ids, rh, ids)

    def nixl_round(self, x, seconds, wait=False):
        a, moved, t0, pause = self.a, 0, time.perf_counter(), POLL_PAUSE
        while time.perf_counter() - t0 < seconds:
            st = a.transfer(x)
            if wait:
                st = a.wait_xfer(x)
            while st == "PROC":
                if pause:
                    time.sleep(pause)
                st = a.check_xfer_state(x)
            if st != "DONE":
                raise RuntimeError(f"nixl transfer ended {st}")
            moved += int(x.total)
        return moved, time.perf_counter() - t0

    def te_round(self, op, block, n, batch, seconds, poll):
        import te

        code = te.READ if op == "READ" else te.WRITE
        reqs = [(code, self.laddr + 2 * i * block, self.seg, self.raddr + 2 * i * block, block) for i in range(n)]
        moved, t0, pause = 0, time.perf_counter(), POLL_PAUSE
        while time.perf_counter() - t0 < seconds:
            batch.submit(reqs)
            if poll:  # the way a NIXL caller waits: look at the status now and then
                while batch.status().state == te.PENDING:
                    if pause:
                        time.sleep(pause)
            st = batch.wait()
            if st.state != te.COMPLETED:
                raise RuntimeError(f"te batch ended {st}")
            batch.reset()
            moved += n * block
        return moved, time.perf_counter() - t0


def run_transfers(side, transport, seconds, rounds):
    out = []
    for op in ("READ", "WRITE"):
        for block, n in BLOCKS.items():
            x = side.nixl_xfer(op, block, n)
            batch = side.eng.allocate_batch(n)
            ways = {"nixl": lambda d: side.nixl_round(x, d),
                    "nixl_wait": lambda d: side.nixl_round(x, d, wait=True),
                    "te_poll": lambda d: side.te_round(op, block, n, batch, d, True),
                    "te_wait": lambda d: side.te_round(op, block, n, batch, d, False)}
            acc = {k: [0, 0.0] for k in ways}
            per_round = {"poll": [], "wait": [], "nixl_wait": []}
            for fn in ways.values():  # warm every way
                fn(seconds / rounds / 4)
            for i in range(rounds):
                got = {}
                # Rotate the order, so no way always follows the same one.
                for way in list(ways)[i % 4:] + list(ways)[:i % 4]:
                    m, t = ways[way](seconds / rounds)
                    acc[way][0] += m
                    acc[way][1] += t
                    got[way] = m / t
                per_round["poll"].append(got["nixl"] / got["te_poll"])
                per_round["wait"].append(got["nixl"] / got["te_wait"])
                per_round["nixl_wait"].append(got["nixl_wait"] / got["te_wait"])
            side.a.release_xfer_handle(x)
            batch.free()
            g = {k: v[0] / v[1] / 1e9 for k, v in acc.items()}
            # The ratio is the median of the rounds' ratios: neighbouring
            # rounds share the machine's load, whole runs often do not.
            out.append({"transport": transport, "op": op, "block": block, "batch": n,
                        **{f"{k}_gbps": round(v, 3) for k, v in g.items()},
                        "ratio_poll": round(statistics.median(per_round["poll"]), 3),
                        "ratio_wait": round(statistics.median(per_round["wait"]), 3),
                        "ratio_nixl_wait": round(statistics.median(per_round["nixl_wait"]), 3)})
    return out


def prep_timing(side, iters=300):
    """µs (median) for 1,000 descriptors: prep_xfer_dlist local + remote +
    make_prepped_xfer; transfer() of them; te's Batch.submit of the same."""
    import te

    np, a, n, block = side.np, side.a, 1000, 4096
    ld = a.get_xfer_descs(side.rows(side.laddr, n, block), "DRAM")
    rd = a.get_xfer_descs(side.rows(side.raddr, n, block), "DRAM")
    ids = np.arange(n)[::-1].copy()  # reversed: 1,000 te requests, nothing merged
    prep, post, tsub = [], [], []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        lh = a.prep_xfer_dlist("NIXL_INIT_AGENT", ld)
        rh = a.prep_xfer_dlist(side.peer, rd)
        x = a.make_prepped_xfer("READ", lh, ids, rh, ids)
        prep.append((time.perf_counter_ns() - t0) / 1e3)
    for _ in range(iters // 3):
        x = a.make_prepped_xfer("READ", lh, ids, rh, ids)
        t0 = time.perf_counter_ns()
        st = a.transfer(x)
        post.append((time.perf_counter_ns() - t0) / 1e3)
        while st == "PROC":
            st = a.check_xfer_state(x)
        a.release_xfer_handle(x)
    reqs = [(te.READ, side.laddr + int(i) * block, side.seg, side.raddr + int(i) * block, block) for i in ids]
    b = side.eng.allocate_batch(n)
    for _ in range(iters // 3):
        t0 = time.perf_counter_ns()
        b.submit(reqs)
        tsub.append((time.perf_counter_ns() - t0) / 1e3)
        b.wait()
        b.reset()
    b.free()
    return {"descs": n, "prep_make_us": round(statistics.median(prep), 1),
            "prep_make_p90_us": round(sorted(prep)[int(0.9 * len(prep))], 1),
            "nixl_post_us": round(statistics.median(post), 1), "te_submit_us": round(statistics.median(tsub), 1)}


def set_timer_slack(ns):
    """prctl(PR_SET_TIMERSLACK) for the calling thread (the one that polls)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(29, ctypes.c_ulong(ns), 0, 0, 0) != 0:
        print(f"prctl(PR_SET_TIMERSLACK) failed: errno {ctypes.get_errno()}", file=sys.stderr)


def nixl_scripts(nixl_dir):
    """Run NIXL's descriptor timing scripts against this nixl package; their
    timing lines by script (empty when the folder is not there)."""
    import subprocess

    test = os.path.join(nixl_dir, "test")
    if not os.path.exists(os.path.join(test, "desc_perf.py")):
        return {}
    out = {}
    env = dict(os.environ, NIXL_LOG_LEVEL="INFO")
    for name, argv in (("desc_perf.py", []), ("prep_xfer_perf.py list", ["list"]),
                       ("prep_xfer_perf.py array", ["array"])):
        script = os.path.join(test, name.split()[0])
        r = subprocess.run([sys.executable, script] + argv, env=env, capture_output=True, text=True, timeout=600)
        lines = [ln.split(" ", 3)[-1].strip().replace("\t", " ") for ln in (r.stdout + r.stderr).splitlines()
                 if ln.startswith("NIXL INFO") and ("sec" in ln or " us" in ln)]
        out[name] = lines if r.returncode == 0 else [f"failed with exit code {r.returncode}"]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=3.0, help="measured time per configuration and way")
    p.add_argument("--rounds", type=int, default=12, help="turns each way takes per configuration")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--poll-us", type=float, default=20, help="pause between check_xfer_state polls (0: none)")
    p.add_argument("--timer-slack-ns", type=int, default=0,
                   help="this thread's timer slack (prctl), so a 20 µs pause is not Linux's default 50 µs "
                        "longer; 0 leaves it")
    p.add_argument("--transports", default="shm,tcp")
    p.add_argument("--nixl-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                       "shared", "interop", "nixl"),
                   help="NIXL's suite (its test/desc_perf.py and test/prep_xfer_perf.py are run too, when there)")
    args = p.parse_args()
    global POLL_PAUSE
    POLL_PAUSE = args.poll_us / 1e6
    if args.timer_slack_ns:
        set_timer_slack(args.timer_slack_ns)

    import numpy as np

    ctx = multiprocessing.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child,), daemon=True)
    proc.start()
    if not conn.poll(60):
        sys.exit("target did not start")
    md, raddr = conn.recv()
    results = []
    try:
        machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "memcpy_gbps": round(memcpy_gbps(np, 0.5), 2)}
        sides = {t: Side(t, md, raddr) for t in args.transports.split(",")}
        timing = prep_timing(next(iter(sides.values())))
        for t, s in sides.items():
            results += run_transfers(s, t, args.seconds, args.rounds)
    finally:
        conn.send("exit")
        proc.join(30)
    machine["poll_us"] = args.poll_us
    machine["timer_slack_ns"] = args.timer_slack_ns
    scripts = nixl_scripts(args.nixl_dir)
    if args.json:
        print(json.dumps({"machine": machine}))
        print(json.dumps({"prep": timing}))
        if scripts:
            print(json.dumps({"nixl_scripts": scripts}))
        for r in results:
            print(json.dumps(r))
        return
    print(f"machine: {machine['cpu']}, {machine['cores']} cores; memcpy {machine['memcpy_gbps']} GB/s (one thread); "
          f"polls pause {args.poll_us:g} µs (timer slack {args.timer_slack_ns} ns)")
    print(f"1,000 descriptors: prep_xfer_dlist x2 + make_prepped_xfer {timing['prep_make_us']} µs "
          f"(p90 {timing['prep_make_p90_us']}); transfer() {timing['nixl_post_us']} µs; "
          f"te Batch.submit {timing['te_submit_us']} µs")
    for name, lines in scripts.items():
        print(f"NIXL's {name}: " + "; ".join(lines))
    print(f"{'transport':9} {'op':5} {'block':>6} {'batch':>5} {'nixl':>6} {'te poll':>7} {'nixl w':>6} "
          f"{'te wait':>7} {'nixl/poll':>9} {'nixl/wait':>9} {'nixl w/wait':>11}   (GB/s)")
    for r in results:
        blk = f"{r['block'] >> 10}KiB" if r["block"] < 1 << 20 else f"{r['block'] >> 20}MiB"
        print(f"{r['transport']:9} {r['op']:5} {blk:>6} {r['batch']:>5} {r['nixl_gbps']:>6.2f} "
              f"{r['te_poll_gbps']:>7.2f} {r['nixl_wait_gbps']:>6.2f} {r['te_wait_gbps']:>7.2f} "
              f"{r['ratio_poll']:>9.2f} {r['ratio_wait']:>9.2f} {r['ratio_nixl_wait']:>11.2f}")


if __name__ == "__main__":
    main()
