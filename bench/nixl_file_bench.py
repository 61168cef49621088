#!/usr/bin/env python3
"""NIXL's FILE_SEG on te against te's own file segments and fio, in one run.

    PYTHONPATH=python TE_LIBRARY=build/libte.so /usr/bin/python3 bench/nixl_file_bench.py \
        [--dir /var/tmp] [--size-mib 512] [--rounds 8] [--round-s 0.5] [--json]

One process, one nixl agent with the POSIX backend and a file opened
O_DIRECT (fd mode, as NIXL's storage examples do). For each workload
(operation, block size, blocks per batch, sequential or random offsets) three
ways take turns in short rounds so they share the machine's load:

  nixl  a make_prepped_xfer made once, then transfer() and wait_xfer()
        for each batch: the file registered through register_memory;
  te    te.Engine's Python API on the agent's engine: the same file
        registered with register_file, a Batch of the same requests
        submitted and waited for;
  fio   fio on the same file, same block size, queue depth = blocks per
        batch, io_uring, O_DIRECT: the device's rate, the reference.

GB/s are totals over the rounds (10^9 bytes per second); each ratio is the
median of the rounds' own ratios. nixl/te is what the NIXL layer costs over
te's own API; both against fio is where te's file path stands on the disk.
A batch is waited for before the next is posted, so the queue empties at the
end of each batch, which fio's steady queue never does.
"""

import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TE_NIXL_HOST", "127.0.0.1")

MIB = 1 << 20
# (op, block, blocks per batch, pattern)
WORKLOADS = [("READ", MIB, 16, "seq"), ("WRITE", MIB, 16, "seq"), ("READ", 4096, 32, "rand"),
             ("READ", 64 << 10, 32, "rand")]


def offsets(size, block, n, pattern, rng):
    if pattern == "seq":
        start = int(rng.integers(0, size // (block * n))) * block * n
        return [start + i * block for i in range(n)]
    return [int(x) * block for x in rng.choice(size // block, n, replace=False)]


def fio(path, size, op, block, depth, pattern, seconds):
    rw = {("READ", "seq"): "read", ("WRITE", "seq"): "write", ("READ", "rand"): "randread",
          ("WRITE", "rand"): "randwrite"}[(op, pattern)]
    out = subprocess.run(["fio", "--name=ref", f"--filename={path}", f"--size={size}", f"--rw={rw}",
                          f"--bs={block}", f"--iodepth={depth}", "--ioengine=io_uring", "--direct=1", "--numjobs=1",
                          "--time_based", f"--runtime={seconds}s", "--output-format=json"],
                         capture_output=True, text=True, timeout=120, check=True)
    job = json.loads(out.stdout)["jobs"][0]["read" if op == "READ" else "write"]
    return job["io_bytes"], job["runtime"] / 1000.0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/var/tmp", help="where the file goes (O_DIRECT must work there)")
    p.add_argument("--size-mib", type=int, default=512)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--round-s", type=float, default=0.5, help="seconds per way per round")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    import numpy as np
    import te
    from nixl._api import nixl_agent, nixl_agent_config

    size = args.size_mib * MIB
    d = tempfile.mkdtemp(prefix="te-nixl-file-bench-", dir=args.dir)
    try:
        path = os.path.join(d, "f")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
        chunk = mmap.mmap(-1, 64 * MIB)
        chunk.write(os.urandom(64 * MIB))
        for off in range(0, size, 64 * MIB):
            os.pwrite(fd, chunk, off)
        os.fsync(fd)
        a = nixl_agent("file-bench", nixl_agent_config(backends=["POSIX"]))
        eng = a.agent._engine
        span = max(b * n for _, b, n, _ in WORKLOADS)
        mem = np.frombuffer(mmap.mmap(-1, span), dtype=np.uint8)
        a.register_memory([(mem.ctypes.data, span, 0, "")], "DRAM")
        freg = a.register_memory([(0, size, fd, "")], "FILE")
        taddr = eng.register_file(fd=fd, offset=0, length=size)
        seg = eng.open_segment(eng.name)
        rng = np.random.default_rng(7)
        results = []
        for op, block, n, pattern in WORKLOADS:
            opc = te.READ if op == "READ" else te.WRITE
            local = [mem.ctypes.data + i * block for i in range(n)]
            lh = a.prep_xfer_dlist("", [(x, block, 0) for x in local], "DRAM")
            tot = {"nixl": [0, 0.0], "te": [0, 0.0], "fio": [0, 0.0]}
            ratios = {"nixl/te": [], "nixl/fio": [], "te/fio": []}
            for _ in range(args.rounds):
                rate = {}
                # nixl: fresh offsets per batch from a pool of prepared lists
                t_end = time.perf_counter() + args.round_s
                moved, t0 = 0, time.perf_counter()
                while time.perf_counter() < t_end:
                    offs = offsets(size, block, n, pattern, rng)
                    rh = a.prep_xfer_dlist(a.name, [(o, block, fd) for o in offs], "FILE")
                    x = a.make_prepped_xfer(op, lh, list(range(n)), rh, list(range(n)))
                    a.transfer(x)
                    if a.wait_xfer(x) != "DONE":
                        raise SystemExit(f"nixl transfer failed: {x.err_msg}")
                    a.release_xfer_handle(x)
                    moved += block * n
                dt = time.perf_counter() - t0
                tot["nixl"][0] += moved
                tot["nixl"][1] += dt
                rate["nixl"] = moved / dt
                t_end = time.perf_counter() + args.round_s
                moved, t0 = 0, time.perf_counter()
                with eng.allocate_batch(n) as b:
                    while time.perf_counter() < t_end:
                        offs = offsets(size, block, n, pattern, rng)
                        b.submit([(opc, lo, seg, taddr + o, block) for lo, o in zip(local, offs)])
                        st = b.wait(timeout=60)
                        if st.state != te.COMPLETED:
                            raise SystemExit(f"te batch ended {st}")
                        b.reset()
                        moved += block * n
                dt = time.perf_counter() - t0
                tot["te"][0] += moved
                tot["te"][1] += dt
                rate["te"] = moved / dt
                nb, dt = fio(path, size, op, block, n, pattern, max(1, round(args.round_s)))
                tot["fio"][0] += nb
                tot["fio"][1] += dt
                rate["fio"] = nb / dt
                ratios["nixl/te"].append(rate["nixl"] / rate["te"])
                ratios["nixl/fio"].append(rate["nixl"] / rate["fio"])
                ratios["te/fio"].append(rate["te"] / rate["fio"])
            row = {"op": op, "block": block, "batch": n, "pattern": pattern}
            row.update({f"{k}_gbps": round(v[0] / v[1] / 1e9, 3) for k, v in tot.items()})
            row.update({k: round(statistics.median(v), 2) for k, v in ratios.items()})
            results.append(row)
            if not args.json:
                print(f"{op:5} {block >> 10:5} KiB x{n:3} {pattern:4}  nixl {row['nixl_gbps']:.3f}  te "
                      f"{row['te_gbps']:.3f}  fio {row['fio_gbps']:.3f} GB/s   nixl/te {row['nixl/te']:.2f}  "
                      f"nixl/fio {row['nixl/fio']:.2f}  te/fio {row['te/fio']:.2f}", flush=True)
        fstats = eng.stats()["transport_stats"]["file"]
        seg.close()
        eng.unregister(taddr)
        a.deregister_memory(freg)
        a.close()
        os.close(fd)
        out = {"workloads": results, "file_stats": fstats, "load": os.getloadavg(), "cpus": os.cpu_count()}
        if args.json:
            json.dump(out, sys.stdout, indent=1)
            print()
        else:
            print(f"load {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs; te file stats: buffered_ios "
                  f"{fstats.get('buffered_ios')}, direct_ios {fstats.get('direct_ios')}, "
                  f"io_uring {fstats.get('io_uring')}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
