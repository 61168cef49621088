"""NIXL's metadata exchange through etcd (NIXL_ETCD_ENDPOINTS), on te: two
agents in two processes find each other only through a real etcd started
here on loopback, then WRITE and READ with notifications.

Needs /usr/bin/etcd (Debian's etcd-server, `make deps`): skipped without
it, failed instead when CI is set, as te's other etcd tests do.
"""

import base64
import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

os.environ["TE_NIXL_HOST"] = "127.0.0.1"  # before any agent: tests stay on loopback

try:
    import numpy as np
except ImportError:  # nixl needs numpy
    np = None

if np is not None:
    import nixl._bindings as nb
    from nixl._api import nixl_agent, nixl_agent_config
    from nixl_peers import etcd_target

from peers import pattern
from util import Peer, wait_until

ETCD = "/usr/bin/etcd"
SIZE = 1 << 20


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Env:
    """Sets environment variables for a with block, restoring them after."""

    def __init__(self, **kv):
        self.kv = kv

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.kv}
        for k, v in self.kv.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _wait_state(agent, x, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = agent.check_xfer_state(x)
        if s != "PROC":
            return s
        time.sleep(0.001)
    raise AssertionError("transfer did not finish")


@unittest.skipIf(np is None, "numpy is not installed for this python3 (nixl needs it)")
class EtcdExchange(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.access(ETCD, os.X_OK):
            if os.environ.get("CI"):
                raise AssertionError(f"{ETCD} is missing and CI is set (install etcd-server: make deps)")
            raise unittest.SkipTest(f"{ETCD} is not installed (etcd-server; make deps)")
        cls.dir = tempfile.mkdtemp(prefix="te-nixl-etcd-")
        port, peer = _free_port(), _free_port()
        cls.url = f"http://127.0.0.1:{port}"
        peer_url = f"http://127.0.0.1:{peer}"
        cls.log = open(os.path.join(cls.dir, "etcd.log"), "w+b")
        cls.etcd = subprocess.Popen(
            [ETCD, "--name", "te-test", "--data-dir", os.path.join(cls.dir, "data"), "--listen-client-urls",
             cls.url, "--advertise-client-urls", cls.url, "--listen-peer-urls", peer_url,
             "--initial-advertise-peer-urls", peer_url, "--initial-cluster", "te-test=" + peer_url,
             "--initial-cluster-state", "new", "--log-level", "error", "--logger", "zap"],
            stdout=cls.log, stderr=subprocess.STDOUT)
        try:
            wait_until(cls._healthy, timeout=20, what="etcd healthy")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _healthy(cls):
        if cls.etcd.poll() is not None:
            cls.log.seek(0)
            raise AssertionError(f"etcd exited: {cls.log.read().decode(errors='replace')}")
        try:
            with urllib.request.urlopen(cls.url + "/health", timeout=1) as r:
                return b'"health":"true"' in r.read()
        except OSError:
            return False

    @classmethod
    def tearDownClass(cls):
        cls.etcd.kill()
        cls.etcd.wait()
        cls.log.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def setUp(self):
        # A namespace per test: keys of one test never meet another's.
        self.ns = f"/te-test/{self.id().rsplit('.', 1)[-1]}/{os.getpid()}"
        self.env = {"NIXL_ETCD_ENDPOINTS": self.url, "NIXL_ETCD_NAMESPACE": self.ns}

    def raw(self, key):
        """The value at key read by etcd's own JSON gateway (not te's client),
        or None: checks NIXL's key layout independently of the code under
        test."""
        body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
        req = urllib.request.Request(self.url + "/v3/kv/range", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            kvs = json.load(r).get("kvs") or []
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def agent(self, name, **env):
        with _Env(**{**self.env, **env}):
            return nixl_agent(name, nixl_agent_config(backends=["UCX"]))

    def test_write_read_through_etcd_then_invalidate(self):
        peer = Peer(etcd_target, "etcd-target", SIZE, 7, env=self.env)
        try:
            addr, size = peer.recv()
            key = f"{self.ns}/etcd-target/metadata"
            md = self.raw(key)
            self.assertIsNotNone(md, f"no key {key}")
            self.assertEqual(md[:4], b"TNXM")
            self.assertEqual(self.raw(f"{self.ns}/etcd-target/"), b"")  # the agent's prefix key, as NIXL writes it

            a = self.agent("etcd-initiator")
            try:
                self.assertFalse(a.check_remote_metadata("etcd-target"))
                a.fetch_remote_metadata("etcd-target")  # no address: etcd
                wait_until(lambda: a.check_remote_metadata("etcd-target"), timeout=15, what="metadata from etcd")

                src = np.frombuffer(pattern(11, SIZE), dtype=np.uint8).copy()
                back = np.zeros(SIZE, dtype=np.uint8)
                a.register_memory(a.get_reg_descs([(src.ctypes.data, SIZE, 0, ""), (back.ctypes.data, SIZE, 0, "")],
                                                  "DRAM"))
                remote = a.get_xfer_descs([(addr, size, 0)], "DRAM")
                x = a.initialize_xfer("WRITE", a.get_xfer_descs([(src.ctypes.data, SIZE, 0)], "DRAM"), remote,
                                      "etcd-target", b"wrote")
                a.transfer(x)
                self.assertEqual(_wait_state(a, x), "DONE")
                got = peer.ask(("notifs", 1, 20))
                self.assertEqual(got, {"etcd-initiator": [b"wrote"]})
                self.assertEqual(peer.ask(("bytes",)), src.tobytes())

                r = a.initialize_xfer("READ", a.get_xfer_descs([(back.ctypes.data, SIZE, 0)], "DRAM"), remote,
                                      "etcd-target", b"read")
                a.transfer(r)
                self.assertEqual(_wait_state(a, r), "DONE")
                self.assertEqual(back.tobytes(), src.tobytes())
                self.assertEqual(peer.ask(("notifs", 1, 20)), {"etcd-initiator": [b"read"]})

                # Partial metadata goes under the caller's label; a put under
                # the watched prefix keeps the loaded metadata.
                peer.ask(("partial", "blocks"))
                self.assertEqual(self.raw(f"{self.ns}/etcd-target/blocks")[:4], b"TNXM")
                time.sleep(0.5)
                self.assertTrue(a.check_remote_metadata("etcd-target"))

                # Invalidation removes the keys; the initiator, watching
                # them, drops the metadata (NIXL's watcher), and a fresh
                # fetch finds nothing (after NIXL's 5 s wait).
                peer.ask(("invalidate",))
                self.assertIsNone(self.raw(key))
                self.assertIsNone(self.raw(f"{self.ns}/etcd-target/blocks"))
                self.assertIsNone(self.raw(f"{self.ns}/etcd-target/"))
                wait_until(lambda: not a.check_remote_metadata("etcd-target"), timeout=10,
                           what="metadata dropped after the peer's keys left etcd")
                with self.assertRaises(nb.nixlNotFoundError):
                    a.initialize_xfer("READ", a.get_xfer_descs([(back.ctypes.data, SIZE, 0)], "DRAM"), remote,
                                      "etcd-target")
                t0 = time.monotonic()
                with self.assertLogs("nixl", "ERROR") as logs:
                    a.fetch_remote_metadata("etcd-target")
                    wait_until(lambda: any("etcd-target" in m for m in logs.output), timeout=15,
                               what="fetch failure logged")
                self.assertGreaterEqual(time.monotonic() - t0, 4.5)  # it waited for the key
                self.assertIn("no metadata at", "\n".join(logs.output))
                self.assertFalse(a.check_remote_metadata("etcd-target"))
            finally:
                a.close()
            self.assertEqual(peer.ask(("exit",)), "bye")
        finally:
            peer.close()

    def test_peer_close_drops_metadata(self):
        peer = Peer(etcd_target, "etcd-leaving", 4096, 5, env=self.env)
        try:
            peer.recv()
            a = self.agent("etcd-staying")
            try:
                a.fetch_remote_metadata("etcd-leaving")
                wait_until(lambda: a.check_remote_metadata("etcd-leaving"), timeout=15, what="metadata from etcd")
                self.assertEqual(peer.ask(("exit",)), "bye")  # close: the lease goes, and the keys with it
                wait_until(lambda: not a.check_remote_metadata("etcd-leaving"), timeout=10,
                           what="metadata dropped after the peer closed")
            finally:
                a.close()
        finally:
            peer.close()

    def test_store_watch(self):
        import te

        with te.Store("etcd://" + self.url[len("http://"):]) as s, \
                te.Store("etcd://" + self.url[len("http://"):]) as w:
            w.watch(self.ns + "/w/")
            s.put(self.ns + "/w/a", b"1")
            s.put(self.ns + "/other", b"1")  # not watched
            s.delete(self.ns + "/w/a")
            seen = []
            wait_until(lambda: seen.extend(w.changes()) or seen, timeout=10, what="watch event")
            time.sleep(0.3)
            seen += w.changes()
            self.assertEqual(set(seen), {self.ns + "/w/a"})  # the put and the delete; /other unseen
            w.unwatch(self.ns + "/w/")
            s.put(self.ns + "/w/b", b"1")
            time.sleep(0.3)
            self.assertEqual(w.changes(), [])

    def test_close_removes_metadata(self):
        a = self.agent("etcd-closing")
        key = f"{self.ns}/etcd-closing/metadata"
        a.send_local_metadata()
        self.assertEqual(self.raw(key)[:4], b"TNXM")
        a.close()  # revokes the lease: the keys go now, not one TTL later
        self.assertIsNone(self.raw(key))
        self.assertIsNone(self.raw(f"{self.ns}/etcd-closing/"))

        # Dropped without close: the finalizer does the same.
        a = self.agent("etcd-dropped")
        a.send_local_metadata()
        key = f"{self.ns}/etcd-dropped/metadata"
        self.assertIsNotNone(self.raw(key))
        del a
        gc.collect()
        wait_until(lambda: self.raw(key) is None, timeout=10, what="key of a dropped agent removed")

        # A process that exits without closing: removed at its exit, well
        # before the lease's 10 s would run out.
        code = ("from nixl._api import nixl_agent; a = nixl_agent('etcd-exiting'); a.send_local_metadata(); "
                "print('sent', flush=True)")
        key = f"{self.ns}/etcd-exiting/metadata"
        out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **self.env), capture_output=True,
                             text=True, timeout=60)
        self.assertIn("sent", out.stdout, out.stderr)
        self.assertIsNone(self.raw(key))

    def test_default_namespace_and_labels(self):
        a = self.agent("etcd-default", NIXL_ETCD_NAMESPACE=None)
        try:
            a.send_local_metadata()
            # NIXL's default namespace "/nixl/agents/" joined with "/".
            self.assertEqual(self.raw("/nixl/agents//etcd-default/metadata")[:4], b"TNXM")
            descs = a.get_reg_descs([], "DRAM")
            with self.assertRaisesRegex(nb.nixlInvalidParamError, "label is required"):
                a.send_partial_agent_metadata(descs, True)
            a.invalidate_local_metadata()
            self.assertIsNone(self.raw("/nixl/agents//etcd-default/metadata"))
            a.invalidate_local_metadata()  # nothing left: still fine
        finally:
            a.close()

    def test_bad_endpoints_refused(self):
        for bad in ("ftp://127.0.0.1:1", "http://127.0.0.1:1/path", " , ", "http://a:1,https://b:2"):
            with self.subTest(endpoints=bad):
                with self.assertRaisesRegex(nb.nixlInvalidParamError, "NIXL_ETCD_ENDPOINTS"):
                    self.agent("etcd-bad", NIXL_ETCD_ENDPOINTS=bad)

    def test_unreachable_etcd_is_a_clear_error(self):
        # Nothing listens there: the send fails within te's store timeout
        # (5 s), saying where etcd was looked for, instead of hanging.
        dead = f"http://127.0.0.1:{_free_port()}"
        a = self.agent("etcd-lonely", NIXL_ETCD_ENDPOINTS=f"{dead},{dead}")
        try:
            t0 = time.monotonic()
            with self.assertRaisesRegex(nb.nixlBackendError, "etcd at .*127.0.0.1"):
                a.send_local_metadata()
            self.assertLess(time.monotonic() - t0, 15)
        finally:
            t0 = time.monotonic()
            a.close()
            self.assertLess(time.monotonic() - t0, 15)


if __name__ == "__main__":
    unittest.main()
