"""Shared test helpers."""

import multiprocessing
import os
import signal
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import numpy  # noqa: F401
    HAVE_NUMPY = True
except ImportError:
    HAVE_NUMPY = False


class Peer:
    """A target process started with "spawn", driven over a Pipe; every
    receive is bounded so a broken peer fails the test instead of hanging."""

    def __init__(self, target, *args, timeout=60, env=None):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child,) + args, daemon=True)
        # The child takes the environment at start: add env for it only.
        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            self.proc.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        child.close()
        self.timeout = timeout

    def recv(self):
        if not self.conn.poll(self.timeout):
            raise AssertionError(f"peer sent nothing within {self.timeout}s (exit code {self.proc.exitcode})")
        return self.conn.recv()

    def ask(self, msg):
        self.conn.send(msg)
        return self.recv()

    def close(self):
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
            raise AssertionError("peer did not exit")
        if self.proc.exitcode != 0:
            raise AssertionError(f"peer exited with {self.proc.exitcode}")


def requires_numpy(f):
    return unittest.skipUnless(HAVE_NUMPY, "numpy is not installed for this python3")(f)


def wait_until(poll, timeout=30, what="condition"):
    """Call poll() until it returns a true value and return that value;
    fail after timeout seconds. Polls with short pauses: for results that
    arrive asynchronously (a notification sent after completion)."""
    deadline = time.monotonic() + timeout
    while True:
        v = poll()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.005)


def stop(pid, timeout=10):
    """SIGSTOP pid and return once every thread of it is stopped: the
    signal is only queued when kill returns, and on a busy machine a thread
    already running can still serve a request before it stops."""
    os.kill(pid, signal.SIGSTOP)

    def stopped():
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                        return False
        except FileNotFoundError:
            return False
        return True

    wait_until(stopped, timeout, f"process {pid} stopped")
