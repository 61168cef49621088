"""Ctrl-C during a wait on a frozen peer: Batch.wait(None) blocks in te's C
wait, where Python cannot run a signal handler; it waits in short slices, so
SIGINT raises KeyboardInterrupt within about a second instead of once te's
own timeout ends the transfer."""

import os
import signal
import subprocess
import sys
import time
import unittest

from peers import te_secret_target
from util import HERE, Peer, stop

# The waiter: an engine whose transfer to the (frozen) target would hold for
# 60 s; it says "ready" once a first read went through, reads "go", submits,
# says "waiting" and waits without a limit.
WAITER = r"""
import sys, time
import te
name, raddr = sys.argv[1], int(sys.argv[2])
e = te.Engine(listen_addr="127.0.0.1:0", hostname="127.0.0.1", transports="tcp", force_transport="tcp",
              transfer_timeout=60, limits=te.Limits(progress_timeout=60))
local = bytearray(1 << 20)
e.register(local, remote=False)
seg = e.open_segment(name)
b = e.allocate_batch(1)
req = (te.READ, te.address_of(local)[0], seg, raddr, 4096)
b.submit([req])
b.wait(20)
b.reset()
print("ready", flush=True)
sys.stdin.readline()
b.submit([req])
print("waiting", flush=True)
t0 = time.monotonic()
try:
    b.wait(None)
    print("returned %.3f" % (time.monotonic() - t0), flush=True)
except KeyboardInterrupt:
    print("interrupted %.3f" % (time.monotonic() - t0), flush=True)
"""


class SigintTest(unittest.TestCase):
    def test_ctrl_c_during_wait_on_frozen_peer(self):
        peer = Peer(te_secret_target, 1 << 20, 0x5A)
        name, raddr, pid = peer.recv()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        w = subprocess.Popen([sys.executable, "-c", WAITER, name, str(raddr)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env, cwd=HERE)
        stopped = False
        try:
            self.assertEqual(w.stdout.readline().strip(), "ready")
            stop(pid)
            stopped = True
            w.stdin.write("go\n")
            w.stdin.flush()
            self.assertEqual(w.stdout.readline().strip(), "waiting")
            time.sleep(0.5)  # well into the wait
            t0 = time.monotonic()
            w.send_signal(signal.SIGINT)
            line = w.stdout.readline().strip()
            took = time.monotonic() - t0
            self.assertTrue(line.startswith("interrupted"), f"waiter said {line!r}, want KeyboardInterrupt")
            self.assertLess(took, 1.5, f"KeyboardInterrupt came {took:.2f}s after SIGINT")
            w.wait(30)  # its engine closes (the frozen peer's transfer is cut)
        finally:
            if w.poll() is None:
                w.kill()
                w.wait()
            w.stdout.close()
            w.stdin.close()
            if stopped:
                os.kill(pid, signal.SIGCONT)
            peer.ask("exit")
            peer.close()


if __name__ == "__main__":
    unittest.main()
