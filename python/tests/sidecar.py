"""A real te-sidecar process for the handoff tests.

The binary is $TE_SIDECAR, else the repository's build/te-sidecar (make
te-sidecar), else one built with `go build` into a temporary folder; tests
skip when none can be had. The sidecar listens on a free loopback port, which
is read from its "serving" log line (no port is reserved and released)."""

import atexit
import os
import shutil
import subprocess
import tempfile
import threading
import unittest

from util import HERE

REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
_built = None


def binary():
    global _built
    env = os.environ.get("TE_SIDECAR")
    if env:
        return env
    p = os.path.join(REPO, "build", "te-sidecar")
    if os.access(p, os.X_OK):
        return p
    if _built:
        return _built
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if go is None or not os.path.exists(os.path.join(REPO, "cmd", "te-sidecar")):
        raise unittest.SkipTest("no te-sidecar binary (set TE_SIDECAR or run `make te-sidecar`) and no Go toolchain")
    d = tempfile.mkdtemp(prefix="te-sidecar-")
    atexit.register(shutil.rmtree, d, True)
    out = os.path.join(d, "te-sidecar")
    subprocess.run([go, "build", "-o", out, "./cmd/te-sidecar"], cwd=REPO, check=True, timeout=600,
                   capture_output=True)
    _built = out
    return out


class Sidecar:
    """te-sidecar on 127.0.0.1 with a free port; stop() ends it."""

    def __init__(self, timeout=60):
        self.proc = subprocess.Popen([binary(), "-addr", "127.0.0.1:0", "-log-level", "info", "-log-format", "text"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.addr = None
        self.log = []
        found = threading.Event()

        def read():
            for line in self.proc.stderr:
                if self.addr is None and "msg=serving" in line and " addr=" in line:
                    self.addr = line.split(" addr=", 1)[1].split()[0]
                    found.set()
                elif "level=INFO" not in line:
                    self.log.append(line)
            found.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not found.wait(timeout) or self.addr is None:
            self.stop()
            raise AssertionError(f"te-sidecar did not start: {''.join(self.log)}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        return self.proc.returncode
