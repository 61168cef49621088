"""Run NIXL's two-peer example (examples/basic_two_peers.py) between two
processes on loopback against te's nixl package, and fail unless both exit
0 and the initiator verified the bytes it READ (the example itself exits 0
even when verification fails, so its log line is what proves it):

    python two_peers.py NIXL_DIR

The target starts first; the initiator starts once the target logged that
its agent (and so its listener) is up. Every wait is bounded.
"""

import os
import random
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEADLINE_S = 120


def free_port():
    """A port free on every address, below the kernel's ephemeral range, so
    that no connection of another process gets it as its source port between
    this check and the target's listen (it listens on 0.0.0.0)."""
    lo = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, lo - 12000), lo)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise SystemExit("no free port below the ephemeral range")


# Another process may still take the port first; the target then exits
# saying so, and the run starts again on another port (this many times).
ATTEMPTS = 3


def main(nixl_dir):
    for attempt in range(ATTEMPTS):
        if run(nixl_dir, last=attempt == ATTEMPTS - 1):
            return


def run(nixl_dir, last):
    example = os.path.join(nixl_dir, "examples", "basic_two_peers.py")
    runner = os.path.join(HERE, "run_example.py")
    # No TE_NIXL_HOST: the example runs as NIXL's users run it, the target
    # listening on its listen_port and the initiator dialling 127.0.0.1.
    env = dict(os.environ, NIXL_LOG_LEVEL="INFO", PYTHONUNBUFFERED="1")
    env.pop("TE_NIXL_HOST", None)
    port = str(free_port())
    cmd = [sys.executable, runner, example, "--ip", "127.0.0.1", "--port", port, "--mode"]
    target = subprocess.Popen(cmd + ["target"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = {"target": [], "initiator": []}
    try:
        deadline = time.monotonic() + DEADLINE_S
        for line in target.stdout:
            out["target"].append(line)
            if "Running test with tensor shape" in line:
                break
            if time.monotonic() > deadline:
                raise SystemExit("target did not come up")
        else:
            log = "".join(out["target"])
            target.wait()
            if "address already in use" in log and not last:
                print(f"two-peer example: port {port} taken before the target listened; again on another")
                return False
            raise SystemExit("target exited before its agent came up:\n" + log)
        init = subprocess.run(cmd + ["initiator"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=DEADLINE_S)
        out["initiator"] = init.stdout.splitlines(keepends=True)
        rest, _ = target.communicate(timeout=DEADLINE_S)
        out["target"].append(rest)
    except subprocess.TimeoutExpired as e:
        target.kill()
        target.communicate()
        raise SystemExit(f"two-peer example did not finish in {DEADLINE_S}s: {e}")
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
    logs = {k: "".join(v) for k, v in out.items()}
    ok = (init.returncode == 0 and target.returncode == 0 and
          "initiator Data verification passed" in logs["initiator"] and
          "Test Complete." in logs["initiator"] and "Test Complete." in logs["target"])
    for k in ("target", "initiator"):
        print(f"--- {k} ---\n{logs[k]}", end="")
    if not ok:
        raise SystemExit(f"two-peer example failed (target rc {target.returncode}, initiator rc {init.returncode})")
    print("two-peer example: READ between two processes, notification, bytes verified")
    return True


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: two_peers.py NIXL_DIR")
    main(sys.argv[1])
