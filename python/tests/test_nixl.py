"""te's nixl package: NIXL's Python API on te, driven the way vLLM's
NixlConnector and SGLang's nixl backend drive it, with real engines, real
sockets on 127.0.0.1 and real second processes. NIXL's own suite runs
against it too (make test-nixl)."""

import ctypes
import gc
import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

os.environ["TE_NIXL_HOST"] = "127.0.0.1"  # before any agent: tests stay on loopback

try:
    import numpy as np
except ImportError:  # nixl needs numpy
    np = None

if np is not None:
    import nixl
    import nixl._bindings as nb
    import te
    from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t
    from nixl_peers import (get_flooder, kv_prefill, listener_target, listener_victim, plain_target, rdma_pair,
                            sglang_decode, vram_reader, vram_target)

from peers import MB, pattern
from util import HERE, Peer, stop, wait_until

SECRET = "nixl-test-cluster-secret-0123456789"
_log = logging.getLogger("nixl")


def setUpModule():
    if np is None:
        raise unittest.SkipTest("numpy is not installed for this python3 (nixl needs it)")
    # Failure tests make agents log warnings on purpose.
    _log.setLevel(logging.CRITICAL if not os.environ.get("TE_NIXL_TEST_LOG") else logging.DEBUG)


def tearDownModule():
    _log.setLevel(logging.NOTSET)


def agent(test, name, **conf):
    a = nixl_agent(name, nixl_agent_config(**conf))
    test.addCleanup(a.close)
    return a


def buf(n, seed=None):
    b = np.zeros(n, dtype=np.uint8)
    if seed is not None:
        b[:] = np.frombuffer(pattern(seed, n), dtype=np.uint8)
    return b


def wait_state(a, x, timeout=30):
    deadline = time.monotonic() + timeout
    st = a.check_xfer_state(x)
    while st == "PROC":
        if time.monotonic() > deadline:
            raise AssertionError(f"transfer still PROC after {timeout}s")
        time.sleep(0.001)
        st = a.check_xfer_state(x)
    return st


def rows(base, count, size, dev=0, stride=None):
    r = np.zeros((count, 3), dtype=np.uint64)
    r[:, 0] = base + np.arange(count, dtype=np.uint64) * (stride or size)
    r[:, 1] = size
    r[:, 2] = dev
    return r


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DescListTest(unittest.TestCase):
    def test_forms_and_values(self):
        t = [(1000, 105, 0), (2000, 30, 1), (1010, 20, 0)]
        a = nb.nixlXferDList(nb.DRAM_SEG, t)
        n = nb.nixlXferDList(nb.DRAM_SEG, np.array(t, dtype=np.uint64))
        self.assertEqual(a, n)
        self.assertEqual([a[i] for i in range(3)], t)
        self.assertEqual(a[-1], t[-1])
        self.assertEqual(a.getType(), nb.DRAM_SEG)
        r = nb.nixlRegDList(nb.VRAM_SEG, [(1, 2, 3, "m"), (4, 5, 6, b"\x00x")])
        self.assertEqual(r[1], (4, 5, 6, b"\x00x"))
        self.assertEqual(r.trim(), nb.nixlXferDList(nb.VRAM_SEG, [(1, 2, 3), (4, 5, 6)]))
        r4 = nb.nixlRegDList(nb.DRAM_SEG, np.array([[1, 2, 0, 7]], dtype=np.int64))
        self.assertEqual(r4[0], (1, 2, 0, "7"))
        self.assertNotEqual(a, nb.nixlXferDList(nb.VRAM_SEG, t))
        self.assertNotEqual(r, nb.nixlRegDList(nb.VRAM_SEG, [(1, 2, 3, "m"), (4, 5, 6, b"other")]))

    def test_bad_descriptors(self):
        for bad in ([(1, 2)], [(1, 2, 3, 4)], [(-1, 2, 3)], [("a", 2, 3)], [(1, 2, 3), (1, 2)], [(2 ** 64, 1, 0)]):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                nb.nixlXferDList(nb.DRAM_SEG, bad)
        for bad in ([(1, 2, 3)], [(1, 2, 3, 4)], [(-5, 1, 0, "")]):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                nb.nixlRegDList(nb.DRAM_SEG, bad)
        for bad in (np.zeros((2, 4), dtype=np.uint64), np.zeros(3, dtype=np.uint64), np.zeros((1, 3)),
                    np.array([[-1, 1, 0]])):
            with self.subTest(shape=bad.shape), self.assertRaises(ValueError):
                nb.nixlXferDList(nb.DRAM_SEG, bad)
        with self.assertRaises(TypeError):
            nb.nixlXferDList(nb.DRAM_SEG, "1,2,3")
        with self.assertRaises(ValueError):
            nb.nixlXferDList(99)
        d = nb.nixlXferDList(nb.DRAM_SEG)
        for bad in ((1, 2), (1, -2, 0), (1, 2, 3, 4), "x"):
            with self.subTest(desc=bad), self.assertRaises((ValueError, TypeError)):
                d.addDesc(bad)
        self.assertTrue(d.isEmpty())

    def test_edit(self):
        d = nb.nixlXferDList(nb.DRAM_SEG)
        for i in range(20):  # past the first growth of the buffer
            d.addDesc((i * 10, 10, 0))
        self.assertEqual(d.descCount(), 20)
        d.remDesc(0)
        self.assertEqual(d[0], (10, 10, 0))
        d[0] = (5, 5, 5)
        self.assertEqual(d.getIndex((5, 5, 5)), 0)
        self.assertEqual(d.getIndex((1, 1, 1)), -1)
        with self.assertRaises(IndexError):
            d[19]
        d.clear()
        self.assertTrue(d.isEmpty())
        self.assertTrue(bool(d))  # a list is a result, even when empty

    def test_pickle_and_serialized_form(self):
        r = nb.nixlRegDList(nb.FILE_SEG, [(0, 100, 3, "ro:/tmp/x"), (5, 6, 7, b"\xff")], True)
        for copy in (pickle.loads(pickle.dumps(r)), nb.deserialize(nb.serialize(r))):
            self.assertEqual(copy, r)
            self.assertTrue(copy.isSorted())
            self.assertEqual(copy[0][3], "ro:/tmp/x")
        blob = nb.serialize(r)
        # Every cut, a lying count, bad magic and trailing bytes are refused
        # before anything is allocated for them.
        for cut in range(len(blob)):
            with self.assertRaises(ValueError):
                nb.deserialize(blob[:cut])
        huge = bytearray(nb.serialize(nb.nixlXferDList(nb.DRAM_SEG, [(1, 2, 3)])))
        huge[8:16] = (1 << 60).to_bytes(8, "little")
        for bad in (bytes(huge), b"XXXX" + blob[4:], blob + b"\0", pickle.dumps(r)):
            with self.assertRaises(ValueError):
                nb.deserialize(bad)


class AgentTest(unittest.TestCase):
    """One process, two agents over te (local/shm)."""

    def setUp(self):
        self.a = agent(self, "agent-a")
        self.b = agent(self, "agent-b", capture_telemetry=True)
        self.abuf, self.bbuf = buf(1 * MB, 1), buf(1 * MB, 2)
        self.areg = self.a.register_memory([(self.abuf.ctypes.data, self.abuf.nbytes, 0, "")], "DRAM")
        self.breg = self.b.register_memory([(self.bbuf.ctypes.data, self.bbuf.nbytes, 0, "")], "DRAM")
        self.assertEqual(self.b.add_remote_agent(self.a.get_agent_metadata()), b"agent-a")

    def test_plugins_and_backends(self):
        a = self.a
        self.assertTrue({"UCX", "LIBFABRIC", "MOONCAKE", "POSIX", "GDS"} <= set(a.get_plugin_list()))
        self.assertEqual(a.get_plugin_mem_types("UCX"), ["DRAM", "VRAM"])
        self.assertEqual(a.get_plugin_mem_types("POSIX"), ["DRAM", "FILE"])
        self.assertEqual(a.get_backend_mem_types("UCX"), ["DRAM", "VRAM"])
        self.assertEqual(a.get_backend_params("UCX"), {"num_threads": "0"})
        self.assertEqual((a.get_plugin_params("UVX"), a.get_backend_mem_types("LIBFABRIC")), ({}, []))
        with self.assertRaises(nb.nixlInvalidParamError):
            a.create_backend("UCX")
        for name in ("OBJ", "UVX", "ucx"):
            with self.subTest(name=name), self.assertRaises(nb.nixlNotFoundError):
                a.create_backend(name)
        a.create_backend("LIBFABRIC", {"num_threads": 4})
        self.assertEqual(a.get_backend_params("LIBFABRIC"), {"num_threads": "4"})
        c = agent(self, "only-known", backends=["HF3FS", "MOONCAKE"])  # HF3FS: not here, skipped
        self.assertEqual(list(c.backends), ["MOONCAKE"])
        e = agent(self, "no-backends", backends=[])
        with self.assertRaises(nb.nixlNotFoundError):
            e.register_memory([(self.abuf.ctypes.data, 16, 0, "")], "DRAM")

    def test_config(self):
        self.assertTrue(nixl.nixl_agent is nixl_agent)
        with self.assertRaises(TypeError):
            nixl_agent_config(sync_mode=1)
        with self.assertRaises(ValueError):
            nixl_agent("")
        a = agent(self, "listen-rw", enable_listen_thread=True, listen_port=0,
                  sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_RW)
        self.assertEqual(a.agent.config.syncMode, nixl_thread_sync_t.NIXL_THREAD_SYNC_RW.value)
        self.assertTrue(a.agent._engine.name.startswith("127.0.0.1:"))

    def test_registration_counts(self):
        a = self.a
        x = buf(4096)
        d = a.get_reg_descs([(x.ctypes.data, 4096, 0, "")], "DRAM")
        n0 = a.agent._engine.stats()["buffers"]
        a.register_memory(d)
        a.register_memory(d)  # twice: te holds it once, NIXL counts two
        self.assertEqual(a.agent._engine.stats()["buffers"], n0 + 1)
        a.deregister_memory(d)
        self.assertEqual(a.agent._engine.stats()["buffers"], n0 + 1)
        a.deregister_memory(d)
        self.assertEqual(a.agent._engine.stats()["buffers"], n0)
        with self.assertRaises(nb.nixlNotFoundError):
            a.deregister_memory(d)
        # One unregistered descriptor in a list: nothing is deregistered.
        both = a.get_reg_descs([(self.abuf.ctypes.data, self.abuf.nbytes, 0, ""), (x.ctypes.data, 4096, 0, "")],
                               "DRAM")
        with self.assertRaises(nb.nixlNotFoundError):
            a.deregister_memory(both)
        self.assertEqual(a.agent._engine.stats()["buffers"], n0)

    def test_registration_refused(self):
        a = self.a
        p = self.abuf.ctypes.data
        with self.assertRaises(nb.nixlInvalidParamError):
            a.register_memory([(p, 0, 0, "")], "DRAM")
        with self.assertRaises(nb.nixlInvalidParamError):  # overlaps the registered buffer
            a.register_memory([(p + 16, 4096, 0, "")], "DRAM")
        with self.assertRaises(nb.nixlNotFoundError):  # files need a storage backend (test_nixl_file.py)
            a.register_memory([(0, 100, 0, "rw:/nonexistent/kv.bin")], "FILE")
        with self.assertRaises(nb.nixlNotFoundError):  # no backend holds OBJ memory
            a.register_memory([(0, 100, 0, "")], "OBJ")
        self.assertIsNone(a.register_memory([(1, 2, 3)], "DRAM"))  # 3-tuples are transfer descriptors

    def test_vram_without_cuda(self):
        if "cuda" in self.a.agent._engine.stats()["transports"]:
            self.skipTest("CUDA is available here")
        x = buf(4096)
        with self.assertRaisesRegex(nb.nixlNotSupportedError, "CUDA"):
            self.a.register_memory([(x.ctypes.data, 4096, 0, "")], "VRAM")
        # A VRAM descriptor of an unregistered range is refused at preparation.
        with self.assertRaises(nb.nixlNotFoundError):
            self.a.prep_xfer_dlist("", [(x.ctypes.data, 4096, 0)], "VRAM")

    def test_write_read_and_notification(self):
        a, b = self.a, self.b
        src = b.get_xfer_descs(rows(self.bbuf.ctypes.data, 4, 4096), "DRAM")
        dst = b.get_xfer_descs(rows(self.abuf.ctypes.data + 8192, 4, 4096), "DRAM")
        x = b.initialize_xfer("WRITE", src, dst, "agent-a", b"wrote-4")
        self.assertIn(b.transfer(x), ("PROC", "DONE"))
        self.assertEqual(wait_state(b, x), "DONE")
        self.assertEqual(self.abuf[8192:8192 + 16384].tobytes(), self.bbuf[:16384].tobytes())
        wait_until(lambda: a.check_remote_xfer_done("agent-b", b"wrote"), what="notification")
        self.assertFalse(a.check_remote_xfer_done("agent-b", b"wrote"))  # consumed
        t = b.get_xfer_telemetry(x)
        self.assertEqual((t.descCount, t.totalBytes, t.backendName), (4, 16384, "UCX"))
        self.assertTrue(t.startTime > 0 and 0 < t.postDuration <= t.xferDuration)
        self.assertEqual(b.query_xfer_backend(x), "UCX")
        # Posted again once done, with another notification.
        self.assertIn(b.transfer(x, b"again"), ("PROC", "DONE"))
        self.assertEqual(wait_state(b, x), "DONE")
        wait_until(lambda: a.check_remote_xfer_done("agent-b", b"ag"), what="second notification")
        b.release_xfer_handle(x)
        b.release_xfer_handle(x)  # releasing twice is harmless
        with self.assertRaises(nb.nixlInvalidParamError):
            b.check_xfer_state(x)
        # READ: the notification goes to the agent read from.
        self.bbuf[:] = 0
        r = b.initialize_xfer("READ", src, b.get_xfer_descs(rows(self.abuf.ctypes.data, 4, 4096), "DRAM"), "agent-a",
                              "read-done")
        b.transfer(r)
        self.assertEqual(wait_state(b, r), "DONE")
        self.assertEqual(self.bbuf[:16384].tobytes(), self.abuf[:16384].tobytes())
        wait_until(lambda: a.check_remote_xfer_done("agent-b", b"done", tag_is_prefix=False), what="READ notification")
        with self.assertRaises(nb.nixlNoTelemetryError):  # a has telemetry off
            a.get_xfer_telemetry(r)

    def test_notifications(self):
        a, b = self.a, self.b
        a.add_remote_agent(b.get_agent_metadata())
        a.send_notif("agent-b", b"one")
        a.send_notif(b"agent-b", "two")
        a.send_notif("agent-a", b"self")  # to itself by its own name
        # send_notif returns once the receiver's te engine queued it.
        self.assertEqual(b.get_new_notifs(), {"agent-a": [b"one", b"two"]})
        self.assertEqual(b.get_new_notifs(), {})
        self.assertEqual(a.update_notifs().get("agent-a"), [b"self"])
        self.assertEqual(a.notifs["agent-a"], [b"self"])  # update_notifs accumulates
        with self.assertRaises(nb.nixlNotFoundError):
            a.send_notif("nobody", b"x")

    def test_prepared_lists(self):
        a, b = self.a, self.b
        B = 4096
        lh = b.prep_xfer_dlist("NIXL_INIT_AGENT", rows(self.bbuf.ctypes.data, 16, B), "DRAM")
        rh = b.prep_xfer_dlist(b"agent-a", rows(self.abuf.ctypes.data, 16, B), "DRAM")
        ids = np.array([3, 0, 7])
        x = b.make_prepped_xfer("READ", lh, ids, rh, ids[::-1].copy(), b"n1")
        b.transfer(x)
        self.assertEqual(b.wait_xfer(x, 30), "DONE")  # te's blocking wait
        self.assertEqual(b.wait_xfer(x), "DONE")
        for i, j in zip(ids, ids[::-1]):
            self.assertEqual(self.bbuf[i * B:(i + 1) * B].tobytes(), self.abuf[j * B:(j + 1) * B].tobytes())
        b.release_xfer_handle(x)
        # Preparation checks each side's registrations.
        with self.assertRaises(nb.nixlNotFoundError):
            b.prep_xfer_dlist("", rows(self.abuf.ctypes.data, 1, B), "DRAM")
        with self.assertRaises(nb.nixlNotFoundError):
            b.prep_xfer_dlist("agent-a", rows(self.abuf.ctypes.data + MB - 8, 1, 16), "DRAM")
        with self.assertRaises(nb.nixlNotFoundError):
            b.prep_xfer_dlist("agent-a", rows(self.abuf.ctypes.data, 1, 16, dev=1), "DRAM")
        with self.assertRaises(nb.nixlNotFoundError):
            b.prep_xfer_dlist("nobody", rows(self.abuf.ctypes.data, 1, B), "DRAM")
        with self.assertRaises(nb.nixlInvalidParamError):
            b.prep_xfer_dlist("", [(1, 2, 3)])  # no mem_type: not a list
        short = b.prep_xfer_dlist("agent-a", rows(self.abuf.ctypes.data, 4, B // 2), "DRAM")
        for args, exc in ((("RD", lh, [0], rh, [0]), KeyError),
                          (("READ", lh, [0], short, [0]), nb.nixlInvalidParamError),  # lengths differ
                          (("READ", lh, [16], rh, [0]), nb.nixlInvalidParamError),
                          (("READ", lh, [-1], rh, [0]), nb.nixlInvalidParamError),
                          (("READ", lh, [0, 1], rh, [0]), nb.nixlInvalidParamError),
                          (("READ", lh, [], rh, []), nb.nixlInvalidParamError),
                          (("READ", rh, [0], lh, [0]), nb.nixlInvalidParamError),
                          (("READ", lh, [0.5], rh, [0]), nb.nixlInvalidParamError),
                          (("READ", 0, [0], rh, [0]), nb.nixlInvalidParamError)):
            with self.subTest(args=args[0:1] + args[2:3]), self.assertRaises(exc):
                b.make_prepped_xfer(*args)
        b.release_dlist_handle(rh)
        with self.assertRaises(nb.nixlInvalidParamError):
            b.make_prepped_xfer("READ", lh, [0], rh, [0])
        with self.assertRaises(KeyError):
            b.initialize_xfer("WR", None, None, "agent-a")

    def test_contiguous_pairs_merge(self):
        a, b = self.a, self.b
        B = 1024
        lh = b.prep_xfer_dlist("", rows(self.bbuf.ctypes.data, 64, B), "DRAM")
        rh = b.prep_xfer_dlist("agent-a", rows(self.abuf.ctypes.data, 64, B), "DRAM")
        ids = list(range(8, 40))
        x = b.make_prepped_xfer("READ", lh, ids, rh, ids)
        self.assertEqual(len(x.reqs), 1)  # 32 contiguous pairs: one te request
        y = b.make_prepped_xfer("READ", lh, ids, rh, ids, skip_desc_merge=True)
        self.assertEqual(len(y.reqs), 32)
        b.transfer(x)
        self.assertEqual(wait_state(b, x), "DONE")
        self.assertEqual(b.get_xfer_telemetry(x).descCount, 32)
        self.assertEqual(self.bbuf[8 * B:40 * B].tobytes(), self.abuf[8 * B:40 * B].tobytes())
        # Adjacent registrations are never merged into one request across
        # their boundary (te checks each request against one buffer).
        c = buf(2 * B, 9)
        creg = a.register_memory([(c.ctypes.data, B, 0, ""), (c.ctypes.data + B, B, 0, "")], "DRAM")
        b.add_remote_agent(a.get_agent_metadata())
        rh2 = b.prep_xfer_dlist("agent-a", rows(c.ctypes.data, 2, B), "DRAM")
        z = b.make_prepped_xfer("READ", lh, [0, 1], rh2, [0, 1])
        self.assertEqual(len(z.reqs), 2)
        b.transfer(z)
        self.assertEqual(wait_state(b, z), "DONE")
        self.assertEqual(self.bbuf[:2 * B].tobytes(), c.tobytes())
        for h in (x, y, z):
            b.release_xfer_handle(h)
        a.deregister_memory(creg)

    def test_loopback(self):
        a = self.a
        B = 4096
        lh = a.prep_xfer_dlist("NIXL_INIT_AGENT", rows(self.abuf.ctypes.data, 2, B), "DRAM")
        sh = a.prep_xfer_dlist("agent-a", rows(self.abuf.ctypes.data + 64 * B, 2, B), "DRAM")
        x = a.make_prepped_xfer("WRITE", lh, [0, 1], sh, [1, 0], b"loop")
        a.transfer(x)
        self.assertEqual(wait_state(a, x), "DONE")
        self.assertEqual(self.abuf[65 * B:66 * B].tobytes(), self.abuf[:B].tobytes())
        wait_until(lambda: a.check_remote_xfer_done("agent-a", b"loop"), what="loopback notification")

    def test_metadata_updates(self):
        """NIXL issue 1267: an agent already loaded takes newer metadata."""
        a, b = self.a, self.b
        extra = buf(8192, 3)
        ereg = a.register_memory([(extra.ctypes.data, 8192, 0, "")], "DRAM")
        with self.assertRaises(nb.nixlNotFoundError):
            b.prep_xfer_dlist("agent-a", rows(extra.ctypes.data, 1, 8192), "DRAM")
        self.assertFalse(b.check_remote_metadata("agent-a", b.get_xfer_descs(rows(extra.ctypes.data, 1, 8192), "DRAM")))
        with self.assertRaises(nb.nixlInvalidParamError):  # an array without its memory type
            b.check_remote_metadata("agent-a", rows(extra.ctypes.data, 1, 8192))
        b.add_remote_agent(a.get_agent_metadata())  # full metadata again: replaced, no error
        self.assertTrue(b.check_remote_metadata("agent-a", b.get_xfer_descs(rows(extra.ctypes.data, 1, 8192), "DRAM")))
        a.deregister_memory(ereg)
        b.add_remote_agent(a.get_agent_metadata())  # and the range is gone again
        with self.assertRaises(nb.nixlNotFoundError):
            b.prep_xfer_dlist("agent-a", rows(extra.ctypes.data, 1, 8192), "DRAM")
        # Partial metadata adds to what is loaded.
        ereg = a.register_memory([(extra.ctypes.data, 8192, 0, "")], "DRAM")
        b.add_remote_agent(a.get_partial_agent_metadata(ereg, False))
        rh = b.prep_xfer_dlist("agent-a", rows(extra.ctypes.data, 1, 8192), "DRAM")
        b.prep_xfer_dlist("agent-a", rows(self.abuf.ctypes.data, 1, 8192), "DRAM")
        lh = b.prep_xfer_dlist("", rows(self.bbuf.ctypes.data, 1, 8192), "DRAM")
        x = b.make_prepped_xfer("READ", lh, [0], rh, [0])  # te sees the new range at once
        b.transfer(x)
        self.assertEqual(wait_state(b, x), "DONE")
        self.assertEqual(self.bbuf[:8192].tobytes(), extra.tobytes())
        # Partial metadata without connection info of an unknown agent.
        c = agent(self, "agent-c")
        cb = buf(4096)
        creg = c.register_memory([(cb.ctypes.data, 4096, 0, "")], "DRAM")
        with self.assertRaises(nb.nixlNotFoundError):
            b.add_remote_agent(c.get_partial_agent_metadata(creg, False))
        with self.assertRaises(nb.nixlNotFoundError):  # only registered descriptors
            a.get_partial_agent_metadata(creg, True)
        self.assertEqual(b.add_remote_agent(c.get_partial_agent_metadata(creg, True)), b"agent-c")
        a.deregister_memory(ereg)

    def test_restarted_peer_in_process(self):
        """A peer that restarts under the same name: its new metadata replaces
        the old, and what was prepared for the old one refuses to run."""
        a, b = self.a, self.b
        B = 4096
        lh = b.prep_xfer_dlist("", rows(self.bbuf.ctypes.data, 4, B), "DRAM")
        rh = b.prep_xfer_dlist("agent-a", rows(self.abuf.ctypes.data, 4, B), "DRAM")
        x = b.make_prepped_xfer("READ", lh, [0], rh, [0])
        a.deregister_memory(self.areg)
        a.close()
        a2 = agent(self, "agent-a")
        nbuf = buf(1 * MB, 7)
        a2.register_memory([(nbuf.ctypes.data, nbuf.nbytes, 0, "")], "DRAM")
        self.assertEqual(b.add_remote_agent(a2.get_agent_metadata()), b"agent-a")
        with self.assertRaises(nb.nixlNotFoundError):
            b.make_prepped_xfer("READ", lh, [0], rh, [0])
        self.assertEqual(b.transfer(x), "ERR")
        rh2 = b.prep_xfer_dlist("agent-a", rows(nbuf.ctypes.data, 4, B), "DRAM")
        y = b.make_prepped_xfer("READ", lh, [2], rh2, [2])
        b.transfer(y)
        self.assertEqual(wait_state(b, y), "DONE")
        self.assertEqual(self.bbuf[2 * B:3 * B].tobytes(), nbuf[2 * B:3 * B].tobytes())

    def test_stale_metadata_of_a_restarted_peer_is_refused(self):
        a, b = self.a, self.b
        md = a.get_agent_metadata()
        a.close()  # the peer the metadata describes is gone
        d = agent(self, "agent-d")
        with self.assertRaises((nb.nixlRemoteDisconnectError, nb.nixlNotFoundError, nb.nixlBackendError)):
            d.add_remote_agent(md)
        self.assertFalse(d.check_remote_metadata("agent-a"))

    def test_remove_remote_agent(self):
        b = self.b
        b.remove_remote_agent("agent-a")
        with self.assertRaises(nb.nixlNotFoundError):
            b.prep_xfer_dlist("agent-a", rows(self.abuf.ctypes.data, 1, 16), "DRAM")
        with self.assertRaises(nb.nixlNotFoundError):
            b.send_notif("agent-a", b"x")
        with self.assertRaises(nb.nixlNotFoundError):
            b.remove_remote_agent("agent-a")
        self.assertFalse(b.check_remote_metadata("agent-a"))

    def test_bad_metadata(self):
        md = self.a.get_agent_metadata()
        for bad in (b"", b"junk", md[:-1], md + b"\0", md[:20], b"TNXM" + b"\xff" * 40, pickle.dumps({"name": "x"})):
            with self.subTest(bad=bad[:12]), self.assertRaises(nb.nixlInvalidParamError):
                self.b.add_remote_agent(bad)
        with self.assertRaises(nb.nixlInvalidParamError):
            self.b.add_remote_agent("a string")
        self.assertEqual(self.b.add_remote_agent(self.b.get_agent_metadata()), b"agent-b")  # its own: no-op

    def test_serialized_descriptors(self):
        d = self.a.get_xfer_descs(rows(self.abuf.ctypes.data, 3, 64), "DRAM")
        s = self.a.get_serialized_descs(d)
        self.assertEqual(self.b.deserialize_descs(s), d)

        class Boom:
            def __reduce__(self):
                return (os.system, ("exit 1",))

        with self.assertRaises(nb.nixlInvalidParamError):  # pickle is not accepted: no code runs
            self.b.deserialize_descs(pickle.dumps(Boom()))

    def test_query_memory(self):
        a = self.a
        a.create_backend("POSIX")
        with tempfile.NamedTemporaryFile() as f:
            f.write(b"12345")
            f.flush()
            q = a.query_memory([(0, 0, 0, f.name), (0, 0, 0, "/nonexistent/x"), (0, 0, 0, "ro:" + f.name)], "POSIX",
                               "FILE")
            self.assertEqual([r and r["size"] for r in q], ["5", None, "5"])
            q = a.query_memory([(0, 0, f.fileno(), "")], "POSIX", "FILE")
            self.assertEqual(q[0]["size"], "5")
        q = a.query_memory([(self.abuf.ctypes.data, 64, 0, ""), (1, 64, 0, "")], "UCX", "DRAM")
        self.assertEqual(q[0]["size"], "64")
        self.assertIsNone(q[1])
        with self.assertRaises(nb.nixlNotSupportedError):
            a.query_memory([(0, 0, 0, "/x")], "UCX", "FILE")

    def test_closed_agent(self):
        a = agent(self, "short-lived")
        a.close()
        a.close()
        for call in (a.get_agent_metadata, lambda: a.get_new_notifs(),
                     lambda: a.register_memory([(1, 1, 0, "")], "DRAM")):
            with self.assertRaises(nb.nixlBackendError):
                call()

    def test_dropped_handles_free_their_batches(self):
        b = self.b
        lib = te._lib.load()
        ids = []
        for i in range(4):
            x = b.initialize_xfer("READ", b.get_xfer_descs(rows(self.bbuf.ctypes.data, 1, 64), "DRAM"),
                                  b.get_xfer_descs(rows(self.abuf.ctypes.data, 1, 64), "DRAM"), "agent-a")
            b.transfer(x)
            self.assertEqual(wait_state(b, x), "DONE")
            ids.append(x.batch)
            del x  # no release: SGLang drops its handles
        gc.collect()
        b.get_new_notifs()  # the agent's next call frees them
        st = te._lib.BatchStatus()
        for h in ids:
            self.assertEqual(lib.te_batch_status(h, ctypes.byref(st)), -te.InvalidArgument.code)


class TensorTest(unittest.TestCase):
    """Tensors as NIXL takes them: a tensor or a list of tensors, memory type
    and device from the tensor itself."""

    class GpuLike:
        """A tensor look-alike on a CUDA device (no GPU needed to describe it)."""

        def __init__(self, ptr, n, device):
            self.ptr, self.nbytes, self.device = ptr, n, device

        def data_ptr(self):
            return self.ptr

        def is_contiguous(self):
            return True

    def test_cpu_tensors(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed for this python3")
        a, b = agent(self, "t-a"), agent(self, "t-b")
        src = torch.arange(4096, dtype=torch.int32).reshape(16, 256)
        dst = torch.zeros((16, 256), dtype=torch.int32)
        sreg, dreg = a.register_memory(src), b.register_memory(dst)
        self.assertEqual(sreg[0], (src.data_ptr(), src.numel() * 4, 0, ""))
        a.add_remote_agent(b.get_agent_metadata())
        rows_s = a.get_xfer_descs([src[i, :] for i in range(0, 16, 2)])
        rows_d = a.get_xfer_descs([dst[i, :] for i in range(0, 16, 2)])
        self.assertEqual((rows_s.getType(), rows_s.descCount()), (nb.DRAM_SEG, 8))
        x = a.initialize_xfer("WRITE", rows_s, rows_d, "t-b", b"t")
        a.transfer(x)
        self.assertEqual(wait_state(a, x), "DONE")
        self.assertTrue(torch.equal(dst[::2], src[::2]))
        self.assertTrue(torch.equal(dst[1::2], torch.zeros((8, 256), dtype=torch.int32)))
        self.assertIsNone(a.get_xfer_descs(src.t()))  # not contiguous
        self.assertIsNone(a.get_reg_descs([src, src.t()]))
        a.release_xfer_handle(x)
        a.deregister_memory(sreg)
        b.deregister_memory(dreg)

    def test_gpu_tensor_descriptors(self):
        a = agent(self, "t-gpu")
        ts = [self.GpuLike(1 << 40, 4096, "cuda:3"), self.GpuLike((1 << 40) + 8192, 4096, "cuda:3")]
        x = a.get_xfer_descs(ts)
        self.assertEqual((x.getType(), list(x)), (nb.VRAM_SEG, [(1 << 40, 4096, 3), ((1 << 40) + 8192, 4096, 3)]))
        r = a.get_reg_descs(ts[0])
        self.assertEqual((r.getType(), r[0]), (nb.VRAM_SEG, (1 << 40, 4096, 3, "")))
        mixed = [ts[0], self.GpuLike(4096, 16, "cpu")]
        self.assertIsNone(a.get_xfer_descs(mixed))  # one list, one memory type


class BoundsTest(unittest.TestCase):
    """What a peer can make an agent hold is bounded (the bounds are made
    small here)."""

    def setUp(self):
        import nixl._agent as core

        self.core = core
        self.saved = (core.MAX_PENDING_NOTIF_BYTES, core.MAX_REMOTE_RANGES)
        self.addCleanup(self.restore)

    def restore(self):
        self.core.MAX_PENDING_NOTIF_BYTES, self.core.MAX_REMOTE_RANGES = self.saved

    def test_undelivered_notifications_stay_in_te(self):
        self.core.MAX_PENDING_NOTIF_BYTES = 100
        a = agent(self, "bound-a", enable_listen_thread=True, listen_port=0)
        b = agent(self, "bound-b")
        b.add_remote_agent(a.get_agent_metadata())
        for i in range(3):
            b.send_notif("bound-a", b"%02d" % i + b"x" * 48)
        wait_until(lambda: a.agent._pending_bytes >= 100, what="the listener drained")
        for i in range(3, 6):
            b.send_notif("bound-a", b"%02d" % i + b"x" * 48)
        a.agent._pump()  # what the listener does: nothing more is drained now
        self.assertGreater(a.agent._engine.stats()["control"]["notify_bytes"], 0)
        got = a.get_new_notifs()["bound-b"]  # the caller takes everything, in order
        self.assertEqual([m[:2] for m in got], [b"%02d" % i for i in range(6)])
        self.assertEqual(a.agent._pending_bytes, 0)

    def test_remote_ranges(self):
        self.core.MAX_REMOTE_RANGES = 4
        a, b = agent(self, "ranges-a"), agent(self, "ranges-b")
        x = buf(4096 * 5)
        a.register_memory([(x.ctypes.data + i * 4096, 4096, 0, "") for i in range(4)], "DRAM")
        b.add_remote_agent(a.get_agent_metadata())
        a.register_memory([(x.ctypes.data + 4 * 4096, 4096, 0, "")], "DRAM")
        with self.assertRaises(nb.nixlNotAllowedError):
            b.add_remote_agent(a.get_agent_metadata())
        self.assertTrue(b.check_remote_metadata("ranges-a", b.get_xfer_descs(rows(x.ctypes.data, 4, 4096), "DRAM")))


class ListenerAddressTest(unittest.TestCase):
    """Without TE_NIXL_HOST a listening agent accepts on every address, as
    NIXL's listener does: a peer dialling 127.0.0.1 reaches it."""

    def test_listener_on_every_address(self):
        old = os.environ.pop("TE_NIXL_HOST")
        try:
            a = agent(self, "everywhere", enable_listen_thread=True, listen_port=0)
        finally:
            os.environ["TE_NIXL_HOST"] = old
        self.assertTrue(a.agent._engine.name.split(":")[0] != "0.0.0.0", a.agent._engine.name)
        port = a.agent._engine.rpc_port
        b = agent(self, "dialler", enable_listen_thread=True, listen_port=0)
        b.fetch_remote_metadata("everywhere", "127.0.0.1", port)
        wait_until(lambda: b.check_remote_metadata("everywhere"), 10, "metadata over 127.0.0.1")


class ListenerTest(unittest.TestCase):
    """Metadata over the listener (te's RPC listener at listen_port)."""

    def setUp(self):
        self.t = agent(self, "target", enable_listen_thread=True, listen_port=0)
        self.i = agent(self, "initiator", enable_listen_thread=True, listen_port=0)
        self.tport = self.t.agent._engine.rpc_port
        self.iport = self.i.agent._engine.rpc_port
        self.tb, self.ib = buf(64 * 1024, 11), buf(64 * 1024)

    def test_fetch_send_invalidate(self):
        t, i = self.t, self.i
        treg = t.register_memory([(self.tb.ctypes.data, self.tb.nbytes, 0, "")], "DRAM")
        i.register_memory([(self.ib.ctypes.data, self.ib.nbytes, 0, "")], "DRAM")
        i.fetch_remote_metadata("target", "127.0.0.1", self.tport)
        i.send_local_metadata("127.0.0.1", self.tport)
        wait_until(lambda: i.check_remote_metadata("target", t.get_xfer_descs(treg.trim())), what="fetched metadata")
        wait_until(lambda: t.check_remote_metadata("initiator"), what="sent metadata")
        x = i.initialize_xfer("READ", i.get_xfer_descs(rows(self.ib.ctypes.data, 1, 4096), "DRAM"),
                              i.get_xfer_descs(rows(self.tb.ctypes.data, 1, 4096), "DRAM"), "target", b"r")
        i.transfer(x)
        self.assertEqual(wait_state(i, x), "DONE")
        self.assertEqual(self.ib[:4096].tobytes(), self.tb[:4096].tobytes())
        wait_until(lambda: t.check_remote_xfer_done("initiator", b"r"), what="notification")
        i.invalidate_local_metadata("127.0.0.1", self.tport)
        wait_until(lambda: not t.check_remote_metadata("initiator"), what="invalidation")
        with self.assertRaises(nb.nixlNotFoundError):
            t.send_notif("initiator", b"x")

    def test_partial_metadata_retry_flow(self):
        """NIXL's partial-metadata example: the target sends part of its
        registrations; the initiator's transfer over the rest fails with
        nixlNotFoundError until the second part arrives."""
        t, i = self.t, self.i
        half = self.tb.nbytes // 2
        r1 = t.get_reg_descs([(self.tb.ctypes.data, half, 0, "a")], "DRAM", is_sorted=True)
        r2 = t.get_reg_descs([(self.tb.ctypes.data + half, half, 0, "b")], "DRAM", is_sorted=True)
        t.register_memory(r1)
        t.register_memory(r2)
        ireg = i.register_memory([(self.ib.ctypes.data, half, 0, "")], "DRAM")
        t.send_partial_agent_metadata(r1, True, ["UCX"], "127.0.0.1", self.iport)
        wait_until(lambda: i.check_remote_metadata("target", r1.trim()), what="first part")
        self.assertFalse(i.check_remote_metadata("target", r2.trim()))
        x1 = i.initialize_xfer("READ", ireg.trim(), r1.trim(), "target", b"UUID1")
        i.transfer(x1)
        self.assertEqual(wait_state(i, x1), "DONE")
        with self.assertRaises(nb.nixlNotFoundError):
            i.initialize_xfer("READ", ireg.trim(), r2.trim(), "target", b"UUID2")
        t.send_partial_agent_metadata(r2, True, ["UCX"], "127.0.0.1", self.iport)

        def retry():
            try:
                return i.initialize_xfer("READ", ireg.trim(), r2.trim(), "target", b"UUID2")
            except nb.nixlNotFoundError:
                return None

        x2 = wait_until(retry, what="second part")
        i.transfer(x2)
        self.assertEqual(wait_state(i, x2), "DONE")
        self.assertEqual(self.ib[:half].tobytes(), self.tb[half:].tobytes())
        wait_until(lambda: t.check_remote_xfer_done("initiator", b"UUID2"), what="notification")

    def test_listener_required_and_no_central_server(self):
        plain = agent(self, "plain")
        with self.assertRaises(nb.nixlNotAllowedError):
            plain.fetch_remote_metadata("target", "127.0.0.1", self.tport)
        with self.assertRaises(nb.nixlNotAllowedError):
            plain.send_local_metadata("127.0.0.1", self.tport)
        with self.assertRaises(nb.nixlNotSupportedError):
            self.i.fetch_remote_metadata("target")
        with self.assertRaises(nb.nixlInvalidParamError):
            self.i.send_local_metadata("127.0.0.1", 70000)
        # Metadata pushed at an agent whose listener is off is not loaded.
        self.t.send_local_metadata("127.0.0.1", plain.agent._engine.rpc_port)
        self.t.send_local_metadata("127.0.0.1", self.iport)
        wait_until(lambda: self.i.check_remote_metadata("target"), what="pushed metadata")
        self.assertFalse(plain.check_remote_metadata("target"))


class ListenerFloodTest(unittest.TestCase):
    """te issue 30, item 9: what one source of listener messages can make
    an agent hold, and that requests from peers cannot delay the agent's
    own sends. Every party holds the cluster secret."""

    def agent(self, name):
        old = os.environ.get("TE_AUTH_SECRET")
        os.environ["TE_AUTH_SECRET"] = SECRET  # read when the agent is made
        try:
            return agent(self, name, enable_listen_thread=True, listen_port=0)
        finally:
            if old is None:
                del os.environ["TE_AUTH_SECRET"]
            else:
                os.environ["TE_AUTH_SECRET"] = old

    def test_forged_agents_bounded_per_source(self):
        # One engine announces 30 agents of 330,000 ranges each (what grew
        # an agent from 60 to 406 MiB): past 16 agents or 2M ranges of one
        # source (MAX_AGENTS_PER_SOURCE, MAX_RANGES_PER_SOURCE) the
        # listener refuses the rest, and the agent's memory grows by what
        # those ranges take, not by all of them.
        from nixl import _meta

        victim = Peer(listener_victim, SECRET, timeout=120)
        self.addCleanup(victim.close)
        self.addCleanup(victim.conn.send, "exit")
        seg, rss0 = victim.recv()
        e = te.Engine(listen_addr="127.0.0.1:0", rpc_timeout=5, auth_secret=SECRET)
        self.addCleanup(e.close)
        inst = e.probe(e.name)["instance"]
        n, count = 330_000, 30
        rows = np.zeros((n, 3), dtype=np.uint64)
        rows[:, 0] = (1 << 32) + np.arange(n, dtype=np.uint64) * 4096
        rows[:, 1] = 4096
        for i in range(count):
            blob = _meta.encode(_meta.Metadata(f"forged-{i}", True, e.name, inst, False, False,
                                               {nb.DRAM_SEG: rows}))

            def sent():
                try:
                    e.send_notify(seg, "nixl/md/put", blob)
                    return True
                except te.ResourceExhausted:
                    return False  # the victim's te holds what it has not drained yet

            wait_until(sent, 60, f"forged agent {i} delivered")
        st = wait_until(lambda: (lambda s: s if s["remotes"] + s["refused"] >= count else None)(victim.ask("state")),
                        120, "every forged agent loaded or refused")
        grown = (st["rss"] - rss0) >> 20
        self.assertLessEqual(st["remotes"], 16, st)
        self.assertLessEqual(st["ranges"], 1 << 21, st)
        self.assertGreater(st["refused"], 0, st)
        # 2M ranges take 48 MiB of tables, and the allocators keep some of
        # what decoding the refused ones took (about 130 MiB in all here);
        # all 30 agents took 367 MiB.
        self.assertLess(grown, 200, f"the agent grew by {grown} MiB: {st}")

    def test_get_flood_does_not_delay_own_sends(self):
        # 4,200 metadata requests whose replies go to a port that accepts
        # and never answers (each reply waits te's RPC timeout, 5 s): the
        # agent's own send_local_metadata still arrives at once, and the
        # replies waiting stay bounded.
        import nixl._agent as core

        silent = socket.socket()
        self.addCleanup(silent.close)
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        v, honest = self.agent("victim"), self.agent("honest")
        vseg = v.agent._segname
        flood = Peer(get_flooder, SECRET, vseg, "victim", f"127.0.0.1:{silent.getsockname()[1]}", 4200, timeout=300)
        try:
            sent = flood.recv()
        finally:
            flood.close()
        self.assertGreater(sent, 1000)
        wait_until(lambda: v.agent._engine.stats()["notifies_received"] >= sent, 30, "the requests received")
        wait_until(lambda: v.agent._engine.stats()["control"].get("notify_bytes", 0) == 0, 30,
                   "the requests drained by the listener")
        replies = getattr(v.agent, "_replies", None)
        if replies is not None:
            self.assertLessEqual(len(replies), core.MAX_REPLIES)
        t0 = time.monotonic()
        v.send_local_metadata("127.0.0.1", honest.agent._engine.rpc_port)
        wait_until(lambda: honest.check_remote_metadata("victim"), 60, "the victim's own metadata")
        took = time.monotonic() - t0
        self.assertLess(took, 3.0, f"send_local_metadata arrived after {took:.1f} s")


    def test_queued_replies_expire(self):
        # Requests from three peers whose replies go to three silent ports:
        # the first reply holds the reply thread for te's RPC timeout, and
        # the two queued behind it pass their deadline (REPLY_TTL_S, made
        # short here) and are dropped, not sent. Without a secret: with
        # one, a reply goes only to the engine that asked, so requests
        # aimed elsewhere are refused before they queue (ImpersonationTest).
        import json

        import nixl._agent as core

        saved = core.REPLY_TTL_S
        core.REPLY_TTL_S = 0.2
        self.addCleanup(setattr, core, "REPLY_TTL_S", saved)
        ports = []
        for _ in range(3):
            s = socket.socket()
            self.addCleanup(s.close)
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            ports.append(s.getsockname()[1])
        v = agent(self, "victim", enable_listen_thread=True, listen_port=0)
        e = te.Engine(listen_addr="127.0.0.1:0", rpc_timeout=5)
        self.addCleanup(e.close)
        for p in ports:
            e.send_notify(v.agent._segname, "nixl/md/get",
                          json.dumps({"want": "victim", "from": "x", "reply": f"127.0.0.1:{p}"}).encode())
        q = v.agent._replies
        wait_until(lambda: q.expired >= 2, 30, "two queued replies dropped at their deadline")
        self.assertEqual(len(q), 0)


class ImpersonationTest(unittest.TestCase):
    """With a cluster secret, metadata, invalidations and notifications for
    agent P are taken only from P's engine, as te's session proves it:
    another engine holding the secret (M) cannot redirect V's transfers to
    P, drop P, speak as P, or aim V's metadata replies elsewhere."""

    def setUp(self):
        saved = os.environ.get("TE_AUTH_SECRET")
        os.environ["TE_AUTH_SECRET"] = SECRET  # read when the agents are made
        try:
            self.v = agent(self, "victim", enable_listen_thread=True, listen_port=0)
            self.p = agent(self, "P", enable_listen_thread=True, listen_port=0)
            self.m = agent(self, "mallory", enable_listen_thread=True, listen_port=0)
        finally:
            if saved is None:
                os.environ.pop("TE_AUTH_SECRET", None)
            else:
                os.environ["TE_AUTH_SECRET"] = saved
        self.pb, self.mb, self.vb = buf(64 * 1024), buf(64 * 1024), buf(64 * 1024, 5)
        self.p.register_memory([(self.pb.ctypes.data, self.pb.nbytes, 0, "")], "DRAM")
        self.m.register_memory([(self.mb.ctypes.data, self.mb.nbytes, 0, "")], "DRAM")
        self.vreg = self.v.register_memory([(self.vb.ctypes.data, self.vb.nbytes, 0, "")], "DRAM")
        self.vseg = self.v.agent._engine.name
        self.v.fetch_remote_metadata("P", "127.0.0.1", self.p.agent._engine.rpc_port)
        wait_until(lambda: self.v.check_remote_metadata("P"), what="P's metadata")

    def forged_put(self, addr):
        """M's own metadata renamed P, its memory at P's address: what a
        store of P's metadata pointing at M's segment looks like."""
        md = nixl._meta.decode(self.m.get_agent_metadata())
        md.name = "P"
        md.sections = {k: r.copy() for k, r in md.sections.items()}
        for r in md.sections.values():
            r[:, 0] = addr
        return nixl._meta.encode(md)

    def send_as_m(self, kind, payload):
        self.m.agent._engine.send_notify(self.vseg, kind, payload)

    def refused(self, n):
        wait_until(lambda: self.v.agent.refused_from >= n, what=f"{n} refusals")

    def write_to_p(self, tag):
        x = self.v.initialize_xfer("WRITE", self.v.get_xfer_descs(rows(self.vb.ctypes.data, 1, 4096), "DRAM"),
                                   self.v.get_xfer_descs(rows(self.pb.ctypes.data, 1, 4096), "DRAM"), "P", tag)
        self.v.transfer(x)
        self.assertEqual(wait_state(self.v, x), "DONE")
        self.v.release_xfer_handle(x)

    def test_forged_metadata_does_not_redirect(self):
        # M's memory put where P's is, so a redirected WRITE would succeed.
        self.mb = buf(64 * 1024)
        self.send_as_m("nixl/md/put", self.forged_put(self.pb.ctypes.data))
        self.refused(1)
        self.write_to_p(b"w1")
        self.assertEqual(self.pb[:4096].tobytes(), self.vb[:4096].tobytes(), "P did not get the WRITE")
        self.assertFalse(self.mb.any(), "the WRITE landed in M's memory")
        # Partial metadata for P from M is refused too.
        md = nixl._meta.decode(self.forged_put(self.pb.ctypes.data))
        md.conn, md.partial = False, True
        self.send_as_m("nixl/md/put", nixl._meta.encode(md))
        self.refused(2)
        self.write_to_p(b"w2")

    def test_forged_invalidation_and_notification(self):
        self.send_as_m("nixl/md/inv", b'{"name":"P"}')
        self.refused(1)
        self.assertTrue(self.v.check_remote_metadata("P"))
        self.send_as_m("nixl/n/P", b"fake")
        self.refused(2)
        self.assertNotIn("P", self.v.get_new_notifs())
        # P's own word still counts.
        self.p.fetch_remote_metadata("victim", "127.0.0.1", self.v.agent._engine.rpc_port)
        wait_until(lambda: self.p.check_remote_metadata("victim"), what="victim's metadata")
        self.p.send_notif("victim", b"real")
        notifs = {}
        wait_until(lambda: notifs.update(self.v.get_new_notifs()) or "P" in notifs, what="P's notification")
        self.assertEqual(notifs["P"], [b"real"])
        self.p.invalidate_local_metadata("127.0.0.1", self.v.agent._engine.rpc_port)
        wait_until(lambda: not self.v.check_remote_metadata("P"), what="P's own invalidation")

    def test_metadata_replies_go_to_the_asker(self):
        silent = socket.socket()
        self.addCleanup(silent.close)
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        req = {"want": "victim", "from": "mallory", "reply": "127.0.0.1:%d" % silent.getsockname()[1]}
        self.send_as_m("nixl/md/get", json.dumps(req).encode())
        self.refused(1)
        silent.settimeout(1)
        with self.assertRaises(socket.timeout):
            silent.accept()  # V sent nothing there

    def test_restarted_elsewhere_is_taken(self):
        """P restarted on another port: its new engine's metadata replaces
        the old once the old engine no longer answers."""
        old_seg = self.p.agent._engine.name
        self.p.close()
        saved = os.environ.get("TE_AUTH_SECRET")
        os.environ["TE_AUTH_SECRET"] = SECRET
        try:
            p2 = agent(self, "P", enable_listen_thread=True, listen_port=0)
        finally:
            if saved is None:
                os.environ.pop("TE_AUTH_SECRET", None)
            else:
                os.environ["TE_AUTH_SECRET"] = saved
        self.assertNotEqual(p2.agent._engine.name, old_seg)
        p2.register_memory([(self.pb.ctypes.data, self.pb.nbytes, 0, "")], "DRAM")
        p2.send_local_metadata("127.0.0.1", self.v.agent._engine.rpc_port)
        wait_until(lambda: self.v.agent._remotes.get("P") is not None
                   and self.v.agent._remotes["P"].segment == p2.agent._engine.name, what="P's new metadata")
        self.write_to_p(b"w3")
        self.assertEqual(self.pb[:4096].tobytes(), self.vb[:4096].tobytes())


class VllmTwoProcessTest(unittest.TestCase):
    """vLLM NixlConnector's call sequence against a prefill process: KV
    caches registered per layer, handshake by get_agent_metadata /
    add_remote_agent, prepped READs with one notification per request,
    check_xfer_state polling, telemetry, release."""

    LAYERS, BLOCKS, BLOCK = 3, 32, 8192
    SEED = 100

    @classmethod
    def setUpClass(cls):
        cls.peer = Peer(kv_prefill, "prefill-0", cls.LAYERS, cls.BLOCKS, cls.BLOCK, cls.SEED)
        cls.md, cls.raddrs = cls.peer.recv()

    @classmethod
    def tearDownClass(cls):
        try:
            assert cls.peer.ask(("exit",)) == "bye"
        finally:
            cls.peer.close()

    def prefill_block(self, layer, block, lo=0, hi=None):
        data = pattern(self.SEED + layer, self.BLOCKS * self.BLOCK)
        hi = self.BLOCK if hi is None else hi
        return data[block * self.BLOCK + lo:block * self.BLOCK + hi]

    def decode_side(self, name, block_len):
        d = agent(self, name, backends=["UCX"], capture_telemetry=True)
        caches = [buf(self.BLOCKS * block_len) for _ in range(self.LAYERS)]
        reg = d.get_reg_descs([(c.ctypes.data, c.nbytes, 0, "") for c in caches], "DRAM")
        d.register_memory(reg, backends=["UCX"])
        self.addCleanup(d.deregister_memory, reg)
        remote = d.add_remote_agent(self.md)
        self.assertEqual(remote, b"prefill-0")
        blocks = np.concatenate([rows(c.ctypes.data, self.BLOCKS, block_len) for c in caches])
        local_h = d.prep_xfer_dlist("NIXL_INIT_AGENT", d.get_xfer_descs(blocks, "DRAM"))
        return d, caches, local_h, remote

    def read_requests(self, d, local_h, remote_h, reqs, tag):
        """One prepped READ per request (its block ids), polled to the end."""
        handles = {}
        for rid, blocks in reqs.items():
            ids = np.array([layer * self.BLOCKS + b for layer in range(self.LAYERS) for b in blocks])
            h = d.make_prepped_xfer("READ", local_h, ids, remote_h, ids, notif_msg=f"{rid}:{tag}".encode())
            self.assertIn(d.transfer(h), ("PROC", "DONE"))
            handles[rid] = h
        for rid, h in handles.items():
            self.assertEqual(wait_state(d, h), "DONE", rid)
            t = d.get_xfer_telemetry(h)
            self.assertEqual(t.descCount, self.LAYERS * len(reqs[rid]))
            d.release_xfer_handle(h)
        return handles

    def test_reads_with_notification_per_request(self):
        d, caches, local_h, remote = self.decode_side("decode-0", self.BLOCK)
        rblocks = np.concatenate([rows(a, self.BLOCKS, self.BLOCK) for a in self.raddrs])
        remote_h = d.prep_xfer_dlist(remote, d.get_xfer_descs(rblocks, "DRAM"))
        reqs = {"req-a": [0, 1, 2, 3], "req-b": [9, 4, 17], "req-c": [31]}
        self.read_requests(d, local_h, remote_h, reqs, 1)
        for blocks in reqs.values():
            for layer in range(self.LAYERS):
                for b in blocks:
                    got = caches[layer][b * self.BLOCK:(b + 1) * self.BLOCK].tobytes()
                    self.assertEqual(got, self.prefill_block(layer, b), (layer, b))
        notifs = self.peer.ask(("notifs", len(reqs), 30))
        self.assertEqual(sorted(notifs["decode-0"]), [b"req-a:1", b"req-b:1", b"req-c:1"])
        d.release_dlist_handle(local_h)
        d.release_dlist_handle(remote_h)
        d.remove_remote_agent(remote)

    def test_heterogeneous_tp(self):
        """Decode TP 2 against prefill TP 1: each decode rank reads its half
        of every prefill block (the heads it holds)."""
        half = self.BLOCK // 2
        reqs = {"req-h": [5, 6, 7, 20]}
        for rank in (0, 1):
            d, caches, local_h, remote = self.decode_side(f"decode-tp{rank}", half)
            rblocks = np.concatenate([rows(a + rank * half, self.BLOCKS, half, stride=self.BLOCK)
                                      for a in self.raddrs])
            remote_h = d.prep_xfer_dlist(remote, d.get_xfer_descs(rblocks, "DRAM"))
            self.read_requests(d, local_h, remote_h, reqs, 2)
            for layer in range(self.LAYERS):
                for b in reqs["req-h"]:
                    got = caches[layer][b * half:(b + 1) * half].tobytes()
                    self.assertEqual(got, self.prefill_block(layer, b, rank * half, (rank + 1) * half), (rank, b))
        notifs = self.peer.ask(("notifs", 2, 30))
        self.assertEqual(notifs, {"decode-tp0": [b"req-h:2"], "decode-tp1": [b"req-h:2"]})


class SglangTwoProcessTest(unittest.TestCase):
    """SGLang's nixl backend sequence: the decode process sends its agent
    metadata and buffer pointers; prefill (here) add_remote_agent's it and
    WRITEs KV chunks and the aux data with initialize_xfer, each with its
    "<room>_kv_<chunk>_<last>" or "<room>_aux" notification, polling
    check_xfer_state; decode parses get_new_notifs."""

    LAYERS, PAGES, PAGE, AUX = 2, 16, 4096, 512
    SECRET = None

    @classmethod
    def setUpClass(cls):
        cls.env = {"TE_AUTH_SECRET": cls.SECRET} if cls.SECRET else {}
        cls.saved = os.environ.get("TE_AUTH_SECRET")
        if cls.SECRET:
            os.environ["TE_AUTH_SECRET"] = cls.SECRET  # read when the agents here are made
        cls.peer = Peer(sglang_decode, "sglang-decode", cls.LAYERS, cls.PAGES, cls.PAGE, cls.AUX, env=cls.env)
        cls.md, cls.kv_ptrs, cls.aux_ptr = cls.peer.recv()

    @classmethod
    def tearDownClass(cls):
        try:
            assert cls.peer.ask(("exit",)) == "bye"
        finally:
            cls.peer.close()
            if cls.saved is None:
                os.environ.pop("TE_AUTH_SECRET", None)
            else:
                os.environ["TE_AUTH_SECRET"] = cls.saved

    def test_chunks_and_aux(self):
        p = agent(self, "sglang-prefill")
        kv = [buf(self.PAGES * self.PAGE) for _ in range(self.LAYERS)]
        for layer, k in enumerate(kv):
            for page in range(self.PAGES):
                k[page * self.PAGE:(page + 1) * self.PAGE] = np.frombuffer(pattern(1000 + layer * 100 + page,
                                                                                   self.PAGE), dtype=np.uint8)
        aux = buf(self.AUX, 77)
        p.register_memory([(k.ctypes.data, k.nbytes, 0, "") for k in kv], "DRAM")
        p.register_memory([(aux.ctypes.data, aux.nbytes, 0, "")], "DRAM")
        peer = p.add_remote_agent(self.md).decode()
        room = 4242
        prefill_pages = [[0, 1, 2], [5, 9]]  # two chunks
        decode_pages = [[3, 4, 5], [10, 12]]
        handles = []
        for chunk, (src_pages, dst_pages) in enumerate(zip(prefill_pages, decode_pages)):
            src, dst = [], []
            for layer in range(self.LAYERS):
                for sp, dp in zip(src_pages, dst_pages):
                    src.append((kv[layer].ctypes.data + sp * self.PAGE, self.PAGE, 0))
                    dst.append((self.kv_ptrs[layer] + dp * self.PAGE, self.PAGE, 0))
            last = int(chunk == len(prefill_pages) - 1)
            h = p.initialize_xfer("WRITE", p.get_xfer_descs(src, "DRAM"), p.get_xfer_descs(dst, "DRAM"), peer,
                                  f"{room}_kv_{chunk}_{last}".encode("ascii"))
            self.assertNotEqual(p.transfer(h), "ERR")
            handles.append(h)
        h = p.initialize_xfer("WRITE", p.get_xfer_descs([(aux.ctypes.data, self.AUX, 0)], "DRAM"),
                              p.get_xfer_descs([(self.aux_ptr, self.AUX, 0)], "DRAM"), peer, f"{room}_aux".encode())
        self.assertNotEqual(p.transfer(h), "ERR")
        handles.append(h)
        deadline = time.monotonic() + 30
        while True:
            states = [p.check_xfer_state(x) for x in handles]
            self.assertNotIn("ERR", states)
            if all(s == "DONE" for s in states):
                break
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.001)
        kvs, got_aux, expected = self.peer.ask(("wait", room, 30))
        self.assertEqual((kvs, got_aux, expected), ([0, 1], True, 2))
        for layer in range(self.LAYERS):
            for sps, dps in zip(prefill_pages, decode_pages):
                for sp, dp in zip(sps, dps):
                    self.assertEqual(self.peer.ask(("check", layer, dp, 1000 + layer * 100 + sp)), -1, (layer, dp))
        self.assertEqual(self.peer.ask(("check_aux", 77)), -1)


class SglangWithSecretTest(SglangTwoProcessTest):
    """The same with a cluster secret on both sides; an agent without it (or
    with another) cannot load the decode agent or reach it."""

    SECRET = SECRET

    def test_agents_without_the_secret_are_refused(self):
        for other in (None, "another-secret-of-enough-length-42"):
            with self.subTest(secret=other):
                if other is None:
                    os.environ.pop("TE_AUTH_SECRET")
                else:
                    os.environ["TE_AUTH_SECRET"] = other
                try:
                    intruder = agent(self, f"intruder-{other is None}")
                finally:
                    os.environ["TE_AUTH_SECRET"] = self.SECRET
                with self.assertRaises(nb.nixlNotAllowedError):
                    intruder.add_remote_agent(self.md)
                self.assertFalse(intruder.check_remote_metadata("sglang-decode"))


class RestartedPeerTest(unittest.TestCase):
    """A prefill process restarts (same agent name, same listener port) with
    other memory. Transfers prepared for the old one end "ERR"; the
    initiator notices the new te instance and fetches fresh metadata over
    the listener by itself; transfers prepared again read the new bytes."""

    def test_restart(self):
        port = free_port()
        size = 256 * 1024
        p1 = Peer(listener_target, "prefill", port, size, 1)
        try:
            (addr1,) = p1.recv()
            d = agent(self, "decode", enable_listen_thread=True, listen_port=0)
            local = buf(size)
            d.register_memory([(local.ctypes.data, size, 0, "")], "DRAM")
            d.fetch_remote_metadata("prefill", "127.0.0.1", port)
            wait_until(lambda: d.check_remote_metadata("prefill"), what="metadata")
            lh = d.prep_xfer_dlist("", rows(local.ctypes.data, 4, size // 4), "DRAM")
            rh = d.prep_xfer_dlist("prefill", rows(addr1, 4, size // 4), "DRAM")
            x = d.make_prepped_xfer("READ", lh, [0, 1, 2, 3], rh, [0, 1, 2, 3])
            d.transfer(x)
            self.assertEqual(wait_state(d, x), "DONE")
            self.assertEqual(local.tobytes(), pattern(1, size))
        finally:
            self.assertEqual(p1.ask(("exit",)), "bye")
            p1.close()
        p2 = Peer(listener_target, "prefill", port, size, 2, [addr1])
        try:
            (addr2,) = p2.recv()
            self.assertNotEqual(addr1, addr2)
            d.transfer(x)  # old addresses: refused by the new process
            self.assertEqual(wait_state(d, x), "ERR")
            new = d.get_xfer_descs(rows(addr2, 1, size), "DRAM")
            wait_until(lambda: d.check_remote_metadata("prefill", new), timeout=30,
                       what="fresh metadata fetched after the restart")
            self.assertEqual(d.transfer(x), "ERR")  # made for the old peer: now refuses to run at once
            with self.assertRaises(nb.nixlNotFoundError):
                d.make_prepped_xfer("READ", lh, [0], rh, [0])
            rh2 = d.prep_xfer_dlist("prefill", rows(addr2, 4, size // 4), "DRAM")
            y = d.make_prepped_xfer("READ", lh, [0, 1, 2, 3], rh2, [0, 1, 2, 3])
            d.transfer(y)
            self.assertEqual(wait_state(d, y), "DONE")
            self.assertEqual(local.tobytes(), pattern(2, size))
        finally:
            self.assertEqual(p2.ask(("exit",)), "bye")
            p2.close()


class KilledPeerTest(unittest.TestCase):
    """A peer stopped mid-transfer, then killed: the transfer stays PROC
    while the peer is stopped, refuses a second post, and ends "ERR" once the
    peer is gone, never hanging. Over tcp (shm would read a stopped process's
    memory)."""

    SIZE = 32 * MB

    def setUp(self):
        self.saved = os.environ.get("TE_NIXL_FORCE_TRANSPORT")
        os.environ["TE_NIXL_FORCE_TRANSPORT"] = "tcp"
        self.addCleanup(self.restore)
        self.peer = Peer(plain_target, "victim", self.SIZE, 5, env={"TE_NIXL_FORCE_TRANSPORT": "tcp"})
        self.md, self.raddr, self.pid = self.peer.recv()
        self.addCleanup(self.reap)
        self.d = agent(self, "survivor")
        self.local = buf(self.SIZE)
        self.d.register_memory([(self.local.ctypes.data, self.SIZE, 0, "")], "DRAM")
        self.d.add_remote_agent(self.md)
        self.lh = self.d.prep_xfer_dlist("", rows(self.local.ctypes.data, 16, self.SIZE // 16), "DRAM")
        self.rh = self.d.prep_xfer_dlist("victim", rows(self.raddr, 16, self.SIZE // 16), "DRAM")
        warm = self.d.make_prepped_xfer("READ", self.lh, [0], self.rh, [0])  # connections up before the stop
        self.d.transfer(warm)
        self.assertEqual(wait_state(self.d, warm), "DONE")
        self.d.release_xfer_handle(warm)

    def restore(self):
        if self.saved is None:
            os.environ.pop("TE_NIXL_FORCE_TRANSPORT", None)
        else:
            os.environ["TE_NIXL_FORCE_TRANSPORT"] = self.saved

    def reap(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.peer.proc.join(30)

    def test_killed_mid_transfer(self):
        d = self.d
        ids = list(range(16))
        x = d.make_prepped_xfer("READ", self.lh, ids[::-1], self.rh, ids, b"never")
        stop(self.pid)
        self.assertEqual(d.transfer(x), "PROC")
        self.assertEqual(d.wait_xfer(x, 0.2), "PROC")  # a stopped peer cannot have answered
        self.assertEqual(d.check_xfer_state(x), "PROC")
        with self.assertRaises(nb.nixlRepostActiveError):
            d.transfer(x)
        os.kill(self.pid, signal.SIGKILL)
        self.assertEqual(d.wait_xfer(x, 60), "ERR")
        d.release_xfer_handle(x)
        with self.assertRaises((nb.nixlRemoteDisconnectError, nb.nixlBackendError)):
            d.send_notif("victim", b"are you there")

    def test_release_in_flight(self):
        d = self.d
        x = d.make_prepped_xfer("READ", self.lh, list(range(16)), self.rh, list(range(16)))
        stop(self.pid)
        self.assertEqual(d.transfer(x), "PROC")
        t0 = time.monotonic()
        d.release_xfer_handle(x)  # cancels, and returns once nothing touches the buffer
        self.assertLess(time.monotonic() - t0, 60)
        with self.assertRaises(nb.nixlInvalidParamError):
            d.check_xfer_state(x)
        os.kill(self.pid, signal.SIGKILL)


def build_fake_cuda():
    """The fake CUDA driver of te's Go tests, built with the C compiler; None
    when the source or a compiler is missing."""
    src = os.path.join(HERE, "..", "..", "internal", "sys", "cuda", "cudatest", "testdata", "fakecuda.c")
    if not os.path.exists(src):
        return None
    out_dir = tempfile.mkdtemp(prefix="te-nixl-fakecuda-")
    out = os.path.join(out_dir, "libfakecuda.so")
    cc = os.environ.get("CC", "gcc")
    try:
        subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", out, src, "-lrt"], check=True, capture_output=True,
                       timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return out


class VramFakeCudaTest(unittest.TestCase):
    """VRAM descriptors through te's GPU paths, against the fake CUDA driver
    (internal/sys/cuda/cudatest): device memory no CPU code may touch, CUDA
    IPC between the two processes (or staging over tcp)."""

    @classmethod
    def setUpClass(cls):
        cls.fake = build_fake_cuda()
        if cls.fake is None:
            raise unittest.SkipTest("the fake CUDA driver cannot be built here (no source tree or no C compiler)")

    def run_pair(self, extra_env, mem="VRAM"):
        env = {"TE_CUDA_LIBRARY": self.fake, **extra_env}
        blocks, block = 8, 64 * 1024
        t = Peer(vram_target, self.fake, "vram-prefill", blocks, block, 55, mem, env=env)
        try:
            md, dptr, transports = t.recv()
            self.assertIn("cudaipc", transports)
            r = Peer(vram_reader, self.fake, "vram-decode", blocks, block, md, dptr, [6, 1, 2], mem, env=env)
            state, got, count = r.recv()
            r.close()
            self.assertEqual(state, "DONE")
            self.assertEqual(count, 3)
            data = pattern(55, blocks * block)
            for b, g in zip([6, 1, 2], got):
                self.assertEqual(g, data[b * block:(b + 1) * block], b)
            self.assertEqual(t.ask(("notifs", 1, 30)), {"vram-decode": [b"vram-done"]})
        finally:
            self.assertEqual(t.ask(("exit",)), "bye")
            t.close()

    def test_vram_read(self):
        self.run_pair({})

    def test_vram_read_over_tcp(self):
        self.run_pair({"TE_NIXL_FORCE_TRANSPORT": "tcp"})

    def test_device_memory_declared_dram(self):
        # te registers DRAM at "*" and asks the driver: the device memory is
        # still moved by a transport that can (a CPU copy would fault).
        self.run_pair({}, mem="DRAM")


def build_fake_verbs():
    """The software libibverbs of te's Go tests (internal/sys/ibv/ibvtest),
    built with the C compiler; None when the source, verbs.h or a compiler
    is missing."""
    src = os.path.join(HERE, "..", "..", "internal", "sys", "ibv", "ibvtest", "testdata", "fakeverbs.c")
    if not os.path.exists(src) or not os.path.exists("/usr/include/infiniband/verbs.h"):
        return None
    out = os.path.join(tempfile.mkdtemp(prefix="te-nixl-fakeverbs-"), "libfakeverbs.so")
    try:
        subprocess.run([os.environ.get("CC", "cc"), "-O1", "-shared", "-fPIC", "-Wl,-Bsymbolic", "-o", out, src,
                        "-lpthread"], check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return out


class RdmaFakeVerbsTest(unittest.TestCase):
    """DRAM over te's rdma transport, on the software verbs library of te's
    Go tests (its fabric joins the queue pairs of one process, so both
    agents live in one child process)."""

    def test_write_and_read(self):
        fake = build_fake_verbs()
        if fake is None:
            self.skipTest("the fake libibverbs cannot be built here (no source tree, verbs.h or C compiler)")
        p = Peer(rdma_pair, 1 * MB, env={"TE_IBV_LIBRARY": fake, "TE_NIXL_FORCE_TRANSPORT": "rdma"})
        transports, states, wrote, read, notifs = p.recv()
        p.close()
        self.assertIn("rdma", transports)
        self.assertEqual(states, ["DONE", "DONE"])
        self.assertTrue(wrote and read)
        self.assertEqual(sorted(notifs["rdma-a"]), [b"r", b"w"])


class NamespaceTest(unittest.TestCase):
    """nixl is namespace-friendly: beside a package laid out like NVIDIA's
    wheel, nixl._api comes from whichever folder is first on sys.path and
    the wheel's other modules still come from the wheel."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.wheel = tmp.name
        pkg = os.path.join(self.wheel, "nixl")
        os.mkdir(pkg)
        files = {
            "__init__.py": "from pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n",
            "_api.py": "WHO = 'wheel'\n",
            "_bindings.py": "WHO = 'wheel'\n",
            "nixl_cu12_extra.py": "WHO = 'wheel'\n",
        }
        for name, text in files.items():
            with open(os.path.join(pkg, name), "w") as f:
                f.write(text)
        self.te_dir = os.path.dirname(os.path.dirname(os.path.abspath(nixl.__file__)))
        self.cwd = os.path.join(self.wheel, "elsewhere")
        os.mkdir(self.cwd)

    def run_with_path(self, first, second):
        code = textwrap.dedent("""
            import nixl._api, nixl._bindings, nixl.nixl_cu12_extra
            print(getattr(nixl._api, "WHO", "te"), getattr(nixl._bindings, "WHO", "te"), nixl.nixl_cu12_extra.WHO)
        """)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = os.pathsep.join([first, second])
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=self.cwd, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.split()

    def test_te_first(self):
        self.assertEqual(self.run_with_path(self.te_dir, self.wheel), ["te", "te", "wheel"])

    def test_wheel_first(self):
        self.assertEqual(self.run_with_path(self.wheel, self.te_dir), ["wheel", "wheel", "wheel"])


if __name__ == "__main__":
    unittest.main()
