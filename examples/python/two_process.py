"""Two processes move bytes with te's Python binding.

    python3 examples/python/two_process.py

This process (the initiator) starts a second one (the target) with the same
script, which registers a 1 MiB buffer and prints its segment name and
address. The initiator registers its own buffer, opens the target's segment,
WRITEs a pattern into it, READs it back into a second range and compares;
then the target checks that the bytes landed in its memory. Both engines
hold the same cluster secret, so the connections between them are
authenticated. Install te first (pip install .), or run from a source
checkout after `make` with PYTHONPATH=python.

Processes and te: libte holds a Go runtime that cannot run in a forked
child, so the target is started with subprocess (fork + exec), never
multiprocessing's "fork" method.
"""

import os
import secrets
import subprocess
import sys

import te

SIZE = 1 << 20


def pattern(n, seed):
    return bytes((i * 131 + seed) & 0xFF for i in range(n))


def target(secret):
    with te.Engine(listen_addr="127.0.0.1:0", auth_secret=secret) as e:
        buf = bytearray(SIZE)
        addr = e.register(buf)
        print(e.name, addr, flush=True)
        sys.stdin.readline()  # the initiator is done
        ok = bytes(buf[:SIZE // 2]) == pattern(SIZE // 2, 7)
        print("target: the written bytes are", "correct" if ok else "WRONG", flush=True)
        return 0 if ok else 1


def initiator():
    secret = secrets.token_hex(16)
    child = subprocess.Popen([sys.executable, __file__, "target", secret], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        name, raddr = child.stdout.readline().split()
        raddr = int(raddr)
        with te.Engine(listen_addr="127.0.0.1:0", auth_secret=secret) as e:
            buf = bytearray(SIZE)
            local = e.register(buf)
            buf[:SIZE // 2] = pattern(SIZE // 2, 7)
            seg = e.open_segment(name)
            # Write the first half of buf into the target, then read it back
            # into the second half: two batches of one request each.
            st = e.write(seg, local, raddr, SIZE // 2)
            print(f"initiator: wrote {st.transferred} bytes to {name}")
            e.read(seg, local + SIZE // 2, raddr, SIZE // 2)
            same = buf[SIZE // 2:] == buf[:SIZE // 2]
            print("initiator: read them back:", "equal" if same else "DIFFERENT")
            stats = e.stats()
            print(f"initiator: {stats['tasks_completed']} tasks, {stats['bytes_transferred']} bytes, "
                  f"over {[r['transport'] for r in stats.get('routes', [])]}")
            seg.close()
        child.stdin.write("done\n")
        child.stdin.flush()
        print(child.stdout.readline().strip())
        rc = child.wait(timeout=60)
        return 0 if same and rc == 0 else 1
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "target":
        sys.exit(target(sys.argv[2]))
    rc = initiator()
    print("two_process:", "ok" if rc == 0 else "FAILED")
    sys.exit(rc)
