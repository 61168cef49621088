"""The drop-in mooncake.engine.TransferEngine, driven the way Mooncake's own
tests (mooncake-wheel/tests/transfer_engine_initiator_test.py and its
target) and vLLM's and SGLang's Mooncake connectors drive it, against a real
second process."""

import ctypes
import json
import logging
import mmap
import os
import random
import string
import subprocess
import sys
import tempfile
import textwrap
import unittest

import mooncake.engine as mc
import te
from mooncake.engine import Read, TransferEngine, TransferNotify, TransferOpcode, Write
from peers import MB, first_diff, mooncake_conventions_target, mooncake_target, pattern
from util import Peer, requires_numpy, wait_until

SIZES = [2 * MB, 1 * MB + 12345]
SEEDS = [31, 32]
_log = logging.getLogger("mooncake.engine")


def setUpModule():
    # The failure tests make the engine log errors on purpose; keep them out
    # of the test output (assertLogs still sees what it asks for).
    _log.setLevel(logging.CRITICAL)


def tearDownModule():
    _log.setLevel(logging.NOTSET)


def local_buffer(n, seed=None):
    m = mmap.mmap(-1, n)
    if seed is not None:
        m[:] = pattern(seed, n)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def new_engine(test, protocol="tcp", hostname="127.0.0.1"):
    eng = TransferEngine()
    test.assertEqual(eng.initialize(hostname, "P2PHANDSHAKE", protocol, ""), 0)
    test.addCleanup(eng.close)
    return eng


def random_text(n):
    chars = string.ascii_letters + string.digits + string.punctuation
    return "".join(random.choices(chars, k=n))


class MooncakeTwoProcessTest(unittest.TestCase):
    """vLLM's and SGLang's call sequences against a target set up the way
    vLLM's connector sets one up."""

    @classmethod
    def setUpClass(cls):
        cls.peer = Peer(mooncake_target, SIZES, SEEDS, "tcp")
        cls.session, cls.raddrs, rc = cls.peer.recv()
        assert rc == 0, rc

    @classmethod
    def tearDownClass(cls):
        try:
            assert cls.peer.ask(("exit",)) == 0
        finally:
            cls.peer.close()

    def remote(self, i):
        return self.peer.ask(("read", i))

    def notifies(self, n):
        got = []

        def enough():
            got.extend(self.peer.ask(("notifies",)))
            return len(got) >= n

        wait_until(enough, what=f"{n} notification(s)")
        return got

    def test_vllm_sequence(self):
        # vLLM: initialize(ip, "P2PHANDSHAKE", protocol, device), get_rpc_port,
        # batch_register_memory of the KV caches, batch_transfer_sync_write.
        eng = new_engine(self, "rdma")  # no RDMA here: falls back with a warning
        port = eng.get_rpc_port()
        self.assertGreater(port, 0)
        kv = [local_buffer(n, 40 + i) for i, n in enumerate(SIZES)]
        self.assertEqual(eng.batch_register_memory([a for _, a in kv], SIZES), 0)
        block = 64 * 1024
        srcs, dsts, lens = [], [], []
        for (_, a), r, n in zip(kv, self.raddrs, SIZES):
            for off in range(0, n, block):
                srcs.append(a + off)
                dsts.append(r + off)
                lens.append(min(block, n - off))
        self.assertEqual(eng.batch_transfer_sync_write(self.session, srcs, dsts, lens), 0)
        for i, n in enumerate(SIZES):
            self.assertEqual(first_diff(self.remote(i), pattern(40 + i, n)), -1)
        # And read it back through the batch read.
        back = [local_buffer(n) for n in SIZES]
        self.assertEqual(eng.batch_register_memory([a for _, a in back], SIZES), 0)
        self.assertEqual(eng.batch_transfer_sync_read(self.session, [a for _, a in back], self.raddrs, SIZES), 0)
        for (m, _), i in zip(back, range(len(SIZES))):
            self.assertEqual(first_diff(m[:], pattern(40 + i, SIZES[i])), -1)
        self.assertEqual(eng.batch_unregister_memory([a for _, a in kv + back]), 0)

    def test_sglang_sequence(self):
        # SGLang's MooncakeTransferEngine: initialize(hostname, "P2PHANDSHAKE",
        # MOONCAKE_PROTOCOL (default rdma), ib_device); session_id is
        # hostname:get_rpc_port(); register / transfer_sync_write (its
        # transfer_sync) / batch_transfer_sync_write / send_probe /
        # unregister_memory; notifications on the target side.
        eng = new_engine(self, "rdma")
        session_id = f"127.0.0.1:{eng.get_rpc_port()}"
        self.assertEqual(eng.send_probe(session_id), 0)
        m, a = local_buffer(SIZES[1], 50)
        self.assertEqual(eng.register_memory(a, SIZES[1]), 0)
        self.assertEqual(eng.send_probe(self.session), 0)
        self.assertEqual(eng.transfer_sync_write(self.session, a, self.raddrs[1], SIZES[1]), 0)
        self.assertEqual(first_diff(self.remote(1), pattern(50, SIZES[1])), -1)
        half = SIZES[1] // 2
        self.assertEqual(eng.batch_transfer_sync_write(self.session, [a, a + half], [self.raddrs[1], self.raddrs[1] + half],
                                                       [half, SIZES[1] - half]), 0)
        note = TransferNotify("req-7", "kv done")
        self.assertEqual(eng.transfer_sync(self.session, a, self.raddrs[1], 4096, TransferOpcode.Write, note), 0)
        self.assertEqual(self.notifies(1), [("req-7", "kv done")])
        self.assertEqual(eng.transfer_sync_read(self.session, a, self.raddrs[0], 4096), 0)
        self.assertEqual(m[:4096], self.remote(0)[:4096])
        self.assertEqual(eng.get_first_buffer_address(self.session), min(self.raddrs))
        self.assertEqual(eng.unregister_memory(a), 0)
        self.assertLess(eng.unregister_memory(a), 0)

    def test_async_calls(self):
        eng = new_engine(self)
        m, a = local_buffer(SIZES[0], 60)
        self.assertEqual(eng.register_memory(a, SIZES[0]), 0)
        half = SIZES[0] // 2
        b1 = eng.batch_transfer_async_write(self.session, [a], [self.raddrs[0]], [half])
        b2 = eng.batch_transfer_async_write(self.session, [a + half], [self.raddrs[0] + half], [half])
        self.assertNotEqual(b1, 0)
        self.assertNotEqual(b2, 0)
        self.assertEqual(eng.get_batch_transfer_status([b1, b2]), 0)
        self.assertEqual(first_diff(self.remote(0), pattern(60, SIZES[0])), -1)
        bid = eng.transfer_submit_write(self.session, a, self.raddrs[0], 4096)
        self.assertGreater(bid, 0)
        rc = wait_until(lambda: eng.transfer_check_status(bid), what="the submitted write to end")
        self.assertEqual(rc, 1)
        b3 = eng.batch_transfer_async_read(self.session, [a], [self.raddrs[1]], [SIZES[1]])
        self.assertEqual(eng.get_batch_transfer_status([b3]), 0)
        self.assertEqual(m[:SIZES[1]], self.remote(1))
        b4 = eng.batch_transfer_async(self.session, [a], [self.raddrs[1]], [10], Read)
        self.assertEqual(eng.get_batch_transfer_status([b4]), 0)
        # batch_transfer_sync with opcode and a completion notification.
        m[:4096] = pattern(61, 4096)
        note = TransferNotify("batch", "sync")
        self.assertEqual(eng.batch_transfer_sync(self.session, [a, a + 2048], [self.raddrs[1], self.raddrs[1] + 2048],
                                                 [2048, 2048], Write, note), 0)
        self.assertEqual(self.remote(1)[:4096], pattern(61, 4096))
        self.assertEqual(self.notifies(1), [("batch", "sync")])

    def test_failures_return_codes(self):
        eng = new_engine(self)
        m, a = local_buffer(8192)
        self.assertEqual(eng.register_memory(a, 8192), 0)
        self.assertLess(eng.register_memory(a + 4096, 8192), 0)  # overlap
        self.assertLess(eng.register_memory(a + 8192, 0), 0)
        # Unknown peer: negative, not an exception; async calls: batch id 0.
        self.assertLess(eng.transfer_sync_write("127.0.0.1:1", a, 0x1000, 10), 0)
        self.assertEqual(eng.batch_transfer_async_write("127.0.0.1:1", [a], [0x1000], [10]), 0)
        self.assertEqual(eng.transfer_submit_write("127.0.0.1:1", a, 0x1000, 10), 0)
        self.assertLess(eng.send_probe("127.0.0.1:1"), 0)
        # Mismatched lists, unregistered local memory, out-of-range remote.
        self.assertLess(eng.batch_transfer_sync_write(self.session, [a, a], [self.raddrs[0]], [1, 1]), 0)
        self.assertEqual(eng.batch_transfer_async_write(self.session, [a], [], [1]), 0)
        other, oa = local_buffer(4096)
        self.assertLess(eng.transfer_sync_write(self.session, oa, self.raddrs[0], 4096), 0)
        self.assertEqual(eng.transfer_submit_write(self.session, oa, self.raddrs[0], 4096), 0)
        self.assertLess(eng.transfer_sync_read(self.session, a, self.raddrs[1] + SIZES[1] - 1, 2), 0)
        self.assertLess(eng.get_batch_transfer_status([12345]), 0)
        self.assertEqual(eng.transfer_check_status(12345), -1)
        self.assertEqual(eng.get_first_buffer_address("127.0.0.1:1"), 0)


class MooncakeInitiatorConventionsTest(unittest.TestCase):
    """Mooncake's transfer_engine_initiator_test.py, replayed: a target that
    falls back to allocate_managed_buffer(64 MiB), an initiator that does the
    same for its source, random strings written and read back one by one, in
    batches of 100 and asynchronously, failure sentinels and probes."""

    CIRCLE = 100  # Mooncake's default is 1000; every round is the same path
    DEFAULT_BUFFER_CAPACITY = 64 * 1024 * 1024

    @classmethod
    def setUpClass(cls):
        cls.peer = Peer(mooncake_conventions_target, "tcp")
        cls.target_server_name, cls.target_addr, rc = cls.peer.recv()
        assert rc == 0, rc
        cls.adaptor = TransferEngine()
        ret = cls.adaptor.initialize("127.0.0.1:0", "P2PHANDSHAKE", "tcp", "")
        if ret != 0:
            raise RuntimeError(f"Initialization failed with code {ret}")
        # P2P: the initiator's own name carries the RPC port it got.
        cls.initiator_server_name = f"127.0.0.1:{cls.adaptor.get_rpc_port()}"
        cls._fallback_buffer_addr = None

    @classmethod
    def tearDownClass(cls):
        try:
            if cls._fallback_buffer_addr is not None:
                assert cls.adaptor.free_managed_buffer(cls._fallback_buffer_addr, cls.DEFAULT_BUFFER_CAPACITY) == 0
            cls.adaptor.close()
            assert cls.peer.ask(("exit",)) == 0
        finally:
            cls.peer.close()

    @classmethod
    def _ensure_buffer_available(cls):
        src_addr = cls.adaptor.get_first_buffer_address(cls.initiator_server_name)
        if src_addr == 0:
            cls._fallback_buffer_addr = cls.adaptor.allocate_managed_buffer(cls.DEFAULT_BUFFER_CAPACITY)
            if cls._fallback_buffer_addr == 0:
                raise RuntimeError("Failed to allocate fallback buffer")
            src_addr = cls._fallback_buffer_addr
        return src_addr

    def test_random_write_circle_times(self):
        adaptor = self.adaptor
        src_addr = self._ensure_buffer_available()
        dst_addr = adaptor.get_first_buffer_address(self.target_server_name)
        self.assertNotEqual(dst_addr, 0, "Target server has no registered buffers")
        self.assertEqual(dst_addr, self.target_addr)
        for i in range(self.CIRCLE):
            src_data = random_text(random.randint(16, 256)).encode("utf-8")
            n = len(src_data)
            self.assertEqual(adaptor.write_bytes_to_buffer(src_addr, src_data, n), 0, f"[{i}] write_bytes_to_buffer")
            self.assertEqual(adaptor.transfer_sync_write(self.target_server_name, src_addr, dst_addr, n), 0, f"[{i}]")
            self.assertEqual(adaptor.write_bytes_to_buffer(src_addr, bytes(n), n), 0)
            self.assertEqual(adaptor.transfer_sync_read(self.target_server_name, src_addr, dst_addr, n), 0, f"[{i}]")
            self.assertEqual(adaptor.read_bytes_from_buffer(src_addr, n), src_data, f"[{i}] Data mismatch")
        # What the target holds is the last string.
        self.assertEqual(self.peer.ask(("read", 0, n)), src_data)

    def _batches(self, sync):
        adaptor = self.adaptor
        batch_size, offset_size = 100, 1024
        base_src = self._ensure_buffer_available()
        base_dst = adaptor.get_first_buffer_address(self.target_server_name)
        self.assertNotEqual(base_dst, 0)
        srcs = [base_src + i * offset_size for i in range(batch_size)]
        dsts = [base_dst + i * offset_size for i in range(batch_size)]
        for i in range(max(2, self.CIRCLE // 100)):
            data = [random_text(random.randint(32, offset_size)).encode("utf-8") for _ in range(batch_size)]
            lens = [len(d) for d in data]
            for s, d, n in zip(srcs, data, lens):
                self.assertEqual(adaptor.write_bytes_to_buffer(s, d, n), 0)
            if sync:
                self.assertEqual(adaptor.batch_transfer_sync_write(self.target_server_name, srcs, dsts, lens), 0)
            else:
                bid = adaptor.batch_transfer_async_write(self.target_server_name, srcs, dsts, lens)
                self.assertNotEqual(bid, 0)
                self.assertEqual(adaptor.get_batch_transfer_status([bid]), 0)
            for s, n in zip(srcs, lens):
                self.assertEqual(adaptor.write_bytes_to_buffer(s, bytes(n), n), 0)
            if sync:
                self.assertEqual(adaptor.batch_transfer_sync_read(self.target_server_name, srcs, dsts, lens), 0)
            else:
                bid = adaptor.batch_transfer_async_read(self.target_server_name, srcs, dsts, lens)
                self.assertNotEqual(bid, 0)
                self.assertEqual(adaptor.get_batch_transfer_status([bid]), 0)
            for j, (s, n) in enumerate(zip(srcs, lens)):
                self.assertEqual(adaptor.read_bytes_from_buffer(s, n), data[j], f"[{i}-{j}] Data mismatch")

    def test_batch_write_read(self):
        self._batches(sync=True)

    def test_async_batch_write_read(self):
        self._batches(sync=False)

    def test_async_submit_to_unknown_peer_returns_zero(self):
        self.assertEqual(self.adaptor.batch_transfer_async_write("unreachable_peer:9", [0], [0], [16]), 0)
        self.assertEqual(self.adaptor.transfer_submit_write("unreachable_peer:9", 0, 0, 16), 0)

    def test_send_probe_reachable_peer(self):
        self.assertEqual(self.adaptor.send_probe(self.target_server_name), 0)

    def test_send_probe_unknown_peer(self):
        self.assertNotEqual(self.adaptor.send_probe("unreachable_peer:9"), 0)


class MooncakeAuthEnvTest(unittest.TestCase):
    def test_secret_from_environment(self):
        # Neither side passes a secret: each engine reads TE_AUTH_SECRET from
        # its environment (the drop-in leaves the config fields empty).
        env = {"TE_AUTH_SECRET": "drop-in-test-secret"}
        peer = Peer(mooncake_conventions_target, "tcp", env=env)
        try:
            name, addr, rc = peer.recv()
            self.assertEqual(rc, 0)
            code = textwrap.dedent(f"""
                from mooncake.engine import TransferEngine
                e = TransferEngine()
                assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
                a = e.allocate_managed_buffer(4096)
                assert e.write_bytes_to_buffer(a, "secret-ok", 9) == 0
                assert e.transfer_sync_write({name!r}, a, {addr}, 9) == 0
                e.close()
                print("ok")
            """)
            out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True,
                                 text=True, timeout=120)
            self.assertEqual(out.stdout.strip(), "ok", out.stderr)
            self.assertEqual(peer.ask(("read", 0, 9)), b"secret-ok")
            self.assertEqual(peer.ask(("exit",)), 0)
        finally:
            peer.close()


class MooncakeLocalTest(unittest.TestCase):
    def test_rdma_falls_back_with_warning(self):
        eng = TransferEngine()
        with self.assertLogs("mooncake.engine", logging.WARNING) as cm:
            self.assertEqual(eng.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0"), 0)
        self.addCleanup(eng.close)
        self.assertTrue(any("falling back" in r for r in cm.output), cm.output)

    def test_refused_protocols(self):
        # Hardware te has no transport for: refused, saying so.
        for proto in ("ascend", "efa", "hip", "musa"):
            eng = TransferEngine()
            with self.assertLogs("mooncake.engine", logging.ERROR) as cm:
                self.assertEqual(eng.initialize("127.0.0.1", "P2PHANDSHAKE", proto, ""), -te.NotSupported.code)
            self.assertTrue(any("no transport" in r for r in cm.output), cm.output)
            self.assertIsNone(eng.get_engine())

    def test_sglang_ascend_hostname(self):
        # SGLang with ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE: host:port:npu_N
        # and protocol "ascend": refused, so SGLang raises its
        # "initialization failed" at once rather than misbehaving later.
        eng = TransferEngine()
        self.assertEqual(eng.initialize("127.0.0.1:0:npu_3", "P2PHANDSHAKE", "ascend", ""), -te.NotSupported.code)
        # The same form with a protocol te has: host:port, NPU ignored.
        eng = TransferEngine()
        with self.assertLogs("mooncake.engine", logging.WARNING) as cm:
            self.assertEqual(eng.initialize("127.0.0.1:0:npu_3", "P2PHANDSHAKE", "tcp", ""), 0)
        self.addCleanup(eng.close)
        self.assertTrue(any("NPU 3" in r for r in cm.output), cm.output)
        self.assertTrue(eng.get_engine().name.startswith("127.0.0.1:"))
        self.assertEqual(eng.send_probe(f"127.0.0.1:{eng.get_rpc_port()}"), 0)

    def test_module_flags_and_engine_handles(self):
        for flag in ("SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_MUSA", "SUPPORT_INTRA_NVLINK"):
            self.assertIs(getattr(mc, flag), False, flag)
        self.assertIsInstance(mc.SUPPORT_CUDA, bool)
        from mooncake.engine import SUPPORT_CUDA  # noqa: F401 (importable by name too)
        with self.assertRaises(AttributeError):
            mc.SUPPORT_NOTHING
        eng = new_engine(self)
        self.assertEqual(eng.get_engine_ptr(), 0)  # nothing native to share
        inner = eng.get_engine()
        self.assertIsInstance(inner, te.Engine)
        self.assertIn("not Mooncake's", repr(inner))
        # It delegates to warmup_segment: a peer nobody serves is a negative code.
        self.assertEqual(eng.warmup_efa_segment("127.0.0.1:1"), -te.SegmentNotFound.code)

    def test_local_topology(self):
        topo = json.loads(TransferEngine.get_local_topology())
        self.assertIsInstance(topo, dict)
        nodes = [d for d in os.listdir("/sys/devices/system/node") if d.startswith("node") and d[4:].isdigit()] \
            if os.path.isdir("/sys/devices/system/node") else []
        for n in nodes:
            self.assertIn("cpu:" + n[4:], topo)
        for loc, lists in topo.items():
            self.assertRegex(loc, r"^(cpu|cuda):\d+$")
            self.assertEqual(len(lists), 2, loc)
            self.assertTrue(all(isinstance(x, str) for x in lists[0] + lists[1]), lists)
        self.assertEqual(topo, te.local_topology())
        # A filter naming no NIC there is leaves every list empty.
        filtered = json.loads(new_engine(self).get_local_topology("no-such-nic"))
        self.assertEqual(set(filtered), set(topo))
        self.assertTrue(all(lists == [[], []] for lists in filtered.values()), filtered)

    def test_managed_buffers(self):
        eng = new_engine(self)
        a = eng.allocate_managed_buffer(1 << 20)
        b = eng.allocate_managed_buffer(1 << 20)
        self.assertNotEqual(a, 0)
        self.assertNotEqual(b, 0)
        data = pattern(70, 1 << 20)
        self.assertEqual(eng.write_bytes_to_buffer(a, data, len(data)), 0)
        self.assertEqual(eng.read_bytes_from_buffer(a, 16), data[:16])
        me = f"127.0.0.1:{eng.get_rpc_port()}"
        self.assertEqual(eng.transfer_sync_write(me, a, b, 1 << 20), 0)  # local transport
        self.assertEqual(eng.read_bytes_from_buffer(b, 1 << 20), data)
        self.assertEqual(eng.free_managed_buffer(a, 1 << 20), 0)
        self.assertEqual(eng.free_managed_buffer(a, 1 << 20), 0)  # twice: ignored, as Mooncake
        self.assertEqual(eng.free_managed_buffer(0x1234000, 4096), 0)  # never allocated
        self.assertEqual(eng.free_managed_buffer(b, 1 << 20), 0)
        self.assertLess(eng.write_bytes_to_buffer(a, b"x", 2), 0)
        # A str is written as its UTF-8 bytes, as Mooncake's binding does.
        c = eng.allocate_managed_buffer(100)
        self.assertEqual(eng.write_bytes_to_buffer(c, "héllo", 6), 0)
        self.assertEqual(eng.read_bytes_from_buffer(c, 6), "héllo".encode())

    def test_managed_buffers_pool(self):
        eng = new_engine(self)
        regions = eng.get_engine().stats()["buffers"]
        sizes = [1, 8 << 10, (8 << 10) + 1, 100 << 10, 3 << 20, 64 << 20, 256 << 20]
        addrs = [eng.allocate_managed_buffer(n) for n in sizes]
        self.assertTrue(all(addrs), addrs)
        # Carved from one registered 2 GiB mapping, without overlaps.
        self.assertEqual(eng.get_engine().stats()["buffers"], regions + 1)
        self.assertLess(max(addrs) - min(addrs), 2 << 30)
        spans = sorted((a, a + max(n, 8 << 10)) for a, n in zip(addrs, sizes))
        for (_, end), (start, _) in zip(spans, spans[1:]):
            self.assertLessEqual(end, start)
        # A freed buffer is reused by the next one of its class; a double
        # free does not hand it out twice.
        self.assertEqual(eng.free_managed_buffer(addrs[3], sizes[3]), 0)
        self.assertEqual(eng.free_managed_buffer(addrs[3], sizes[3]), 0)
        again = eng.allocate_managed_buffer(sizes[3])
        self.assertEqual(again, addrs[3])
        self.assertNotEqual(eng.allocate_managed_buffer(sizes[3]), again)
        # Over 256 MiB: a registration of its own, gone when freed.
        big = eng.allocate_managed_buffer((256 << 20) + 1)
        self.assertNotEqual(big, 0)
        self.assertEqual(eng.get_engine().stats()["buffers"], regions + 2)
        self.assertEqual(eng.free_managed_buffer(big, (256 << 20) + 1), 0)
        self.assertEqual(eng.get_engine().stats()["buffers"], regions + 1)
        # Every pooled buffer moves bytes (one registration covers them).
        me = f"127.0.0.1:{eng.get_rpc_port()}"
        data = pattern(71, 8 << 10)
        self.assertEqual(eng.write_bytes_to_buffer(addrs[1], data, len(data)), 0)
        self.assertEqual(eng.transfer_sync_write(me, addrs[1], addrs[5], len(data)), 0)
        self.assertEqual(eng.read_bytes_from_buffer(addrs[5], len(data)), data)
        self.assertEqual(TransferEngine().allocate_managed_buffer(4096), 0)  # not initialized

    def test_initialize_ext(self):
        eng = TransferEngine()
        self.assertEqual(eng.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "p2p"), 0)
        self.addCleanup(eng.close)
        self.assertEqual(eng.send_probe(f"127.0.0.1:{eng.get_rpc_port()}"), 0)

    def test_binds_the_given_host(self):
        # The RPC listener binds local_hostname only (the tcp data listener
        # follows it): another address of this host, 127.0.0.2 on loopback,
        # does not reach it.
        import socket

        eng = TransferEngine()
        self.assertEqual(eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        self.addCleanup(eng.close)
        port = eng.get_rpc_port()
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", port), timeout=5)

    def test_metadata_strings(self):
        from mooncake.engine import _conn_string, _split_host

        self.assertEqual(_conn_string("P2PHANDSHAKE", ""), "P2PHANDSHAKE")
        self.assertEqual(_conn_string("10.0.0.1:2379", "etcd"), "etcd://10.0.0.1:2379")
        self.assertEqual(_conn_string("http://h:8080/metadata", "http"), "http://h:8080/metadata")
        self.assertEqual(_split_host("10.1.2.3"), ("10.1.2.3", 0, None))
        self.assertEqual(_split_host("10.1.2.3:1234"), ("10.1.2.3", 1234, None))
        self.assertEqual(_split_host("[::1]:99"), ("::1", 99, None))
        self.assertEqual(_split_host("10.1.2.3:5000:npu_7"), ("10.1.2.3", 5000, 7))
        self.assertEqual(_split_host("[::1]:5000:npu_0"), ("::1", 5000, 0))
        eng = TransferEngine()
        self.assertLess(eng.initialize("127.0.0.1", "nosuch://x", "tcp", ""), 0)

    def test_opcodes(self):
        self.assertEqual(int(TransferOpcode.Read), 0)
        self.assertEqual(int(TransferOpcode.Write), 1)
        self.assertIs(TransferOpcode.READ, Read)
        self.assertIs(TransferOpcode.WRITE, Write)
        self.assertIs(TransferEngine.TransferOpcode, TransferOpcode)
        self.assertEqual(TransferNotify("a", "b"), TransferNotify(name="a", msg="b"))

    @requires_numpy
    def test_numpy_buffers(self):
        import numpy as np

        eng = new_engine(self)
        src = np.frombuffer(pattern(80, 1 << 20), dtype=np.uint8).copy()
        dst = np.zeros(1 << 20, dtype=np.uint8)
        self.assertEqual(eng.batch_register_memory([src.ctypes.data, dst.ctypes.data], [src.nbytes, dst.nbytes]), 0)
        me = f"127.0.0.1:{eng.get_rpc_port()}"
        self.assertEqual(eng.transfer_sync_write(me, src.ctypes.data, dst.ctypes.data, src.nbytes), 0)
        self.assertTrue(np.array_equal(src, dst))
        self.assertEqual(eng.batch_unregister_memory([src.ctypes.data, dst.ctypes.data]), 0)


class NamespaceTest(unittest.TestCase):
    """mooncake is namespace-friendly: beside a package laid out like the
    real Mooncake wheel (its own __init__ with extend_path, store and a
    compiled engine), mooncake.store always comes from the wheel and
    mooncake.engine from whichever folder is first on sys.path."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.wheel = tmp.name
        pkg = os.path.join(self.wheel, "mooncake")
        os.mkdir(pkg)
        files = {
            "__init__.py": "from pkgutil import extend_path\n"
                           "from mooncake.buffer_pool import BufferPool, RegisteredBufferPool\n"
                           "__path__ = extend_path(__path__, __name__)\n",
            "buffer_pool.py": "class BufferPool:\n    pass\nRegisteredBufferPool = BufferPool\n",
            "store.py": "WHO = 'wheel'\nclass MooncakeDistributedStore:\n    pass\n",
            "engine.py": "WHO = 'wheel'\n",
        }
        for name, text in files.items():
            with open(os.path.join(pkg, name), "w") as f:
                f.write(text)
        self.te_dir = os.path.dirname(os.path.dirname(os.path.abspath(mc.__file__)))
        self.cwd = os.path.join(self.wheel, "elsewhere")
        os.mkdir(self.cwd)

    def run_with_path(self, first, second):
        code = textwrap.dedent("""
            import mooncake.engine, mooncake.store
            from mooncake import BufferPool, RegisteredBufferPool
            assert BufferPool is RegisteredBufferPool
            print(getattr(mooncake.engine, "WHO", "te"), mooncake.store.WHO)
        """)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = os.pathsep.join([first, second])
        # Not the wheel's folder as cwd: "python -c" puts the cwd first.
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=self.cwd, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.split()

    def test_te_first(self):
        self.assertEqual(self.run_with_path(self.te_dir, self.wheel), ["te", "wheel"])

    def test_wheel_first(self):
        self.assertEqual(self.run_with_path(self.wheel, self.te_dir), ["wheel", "wheel"])


class ForkTest(unittest.TestCase):
    """te's fork rule through Python: a child of a process that has loaded
    libte gets te.ForkError (the drop-in: a negative return) at once; a
    child of one that only imported te uses te normally. Each case runs in a
    fresh interpreter so that this test process's own state does not matter,
    and every wait has a deadline, so a hang fails."""

    def run_script(self, code):
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return out.stdout

    def test_child_after_load_is_refused(self):
        out = self.run_script("""
            import os, time, ctypes
            import te
            from mooncake.engine import TransferEngine

            e = te.Engine(listen_addr="127.0.0.1:0")
            mc = TransferEngine()
            assert mc.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
            lib = te.load()
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                def refuse_all():
                    start = time.monotonic()
                    errs = []
                    for call in (lambda: te.Engine(listen_addr="127.0.0.1:0"), e.stats, lambda: e.name,
                                 lambda: te.local_topology()):
                        try:
                            call()
                            errs.append("no error")
                        except te.ForkError as x:
                            errs.append("ForkError" if "spawn" in str(x) else "no hint")
                    rc = mc.transfer_sync_write("127.0.0.1:1", 0, 0, 1)
                    # Under the binding, the library refuses too, without Go.
                    h = ctypes.c_uint64()
                    crc = lib.te_create(None, ctypes.byref(h))
                    return errs, rc, crc, time.monotonic() - start
                # Every round must be refused; the time limit must hold in
                # one of three, so a busy machine does not fail the test
                # while a call that blocks still does.
                rounds = [refuse_all()]
                while rounds[-1][3] >= 0.1 and len(rounds) < 3:
                    rounds.append(refuse_all())
                bad = [r for r in rounds if r[:3] != rounds[0][:3]]
                os.write(w, repr(rounds[0][:3] + (min(r[3] for r in rounds), len(bad))).encode())
                os._exit(0)
            os.close(w)
            deadline = time.monotonic() + 20
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    raise SystemExit("child hung")
                time.sleep(0.005)
            errs, rc, crc, took, differing = eval(os.read(r, 4096).decode())
            assert differing == 0, differing
            assert errs == ["ForkError"] * 4, errs
            assert rc == -te.ForkError.code, rc
            assert crc == -te.ForkError.code, crc
            assert took < 0.1, took
            # The parent carries on.
            assert e.stats()["segment"]
            e.close()
            mc.close()
            print("refused in %.1f ms" % (took * 1000))
        """)
        self.assertIn("refused in", out)

    def test_child_of_unloaded_parent_works(self):
        out = self.run_script("""
            import os, time
            import te  # imported, never called: libte is not loaded
            from mooncake.engine import TransferEngine
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    eng = TransferEngine()
                    assert eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
                    a = eng.allocate_managed_buffer(4096)
                    b = eng.allocate_managed_buffer(4096)
                    assert eng.write_bytes_to_buffer(a, b"child-bytes", 11) == 0
                    assert eng.transfer_sync_write(f"127.0.0.1:{eng.get_rpc_port()}", a, b, 11) == 0
                    assert eng.read_bytes_from_buffer(b, 11) == b"child-bytes"
                    eng.close()
                    code = 0
                finally:
                    os._exit(code)
            deadline = time.monotonic() + 60
            while True:
                p, status = os.waitpid(pid, os.WNOHANG)
                if p == pid:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    raise SystemExit("child hung")
                time.sleep(0.005)
            assert os.waitstatus_to_exitcode(status) == 0, status
            # And the parent may load te afterwards.
            with te.Engine(listen_addr="127.0.0.1:0") as e:
                assert e.name
            print("child used te")
        """)
        self.assertIn("child used te", out)


if __name__ == "__main__":
    unittest.main()
