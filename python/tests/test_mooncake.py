"""The drop-in mooncake.engine.TransferEngine, driven the way vLLM's and
SGLang's Mooncake connectors drive it, against a real second process."""

import ctypes
import logging
import mmap
import time
import unittest

from mooncake.engine import Read, TransferEngine, TransferNotify, TransferOpcode, Write
from peers import MB, first_diff, mooncake_target, pattern
from util import Peer, requires_numpy

SIZES = [2 * MB, 1 * MB + 12345]
_log = logging.getLogger("mooncake.engine")


def setUpModule():
    # The failure tests make the engine log errors on purpose; keep them out
    # of the test output (assertLogs still sees what it asks for).
    _log.setLevel(logging.CRITICAL)


def tearDownModule():
    _log.setLevel(logging.NOTSET)
SEEDS = [31, 32]


def local_buffer(n, seed=None):
    m = mmap.mmap(-1, n)
    if seed is not None:
        m[:] = pattern(seed, n)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


class MooncakeTwoProcessTest(unittest.TestCase):
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

    def engine(self, protocol="tcp"):
        eng = TransferEngine()
        self.assertEqual(eng.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, ""), 0)
        self.addCleanup(eng.close)
        return eng

    def remote(self, i):
        return self.peer.ask(("read", i))

    def test_vllm_sequence(self):
        # vLLM: initialize(ip, "P2PHANDSHAKE", protocol, device), get_rpc_port,
        # batch_register_memory of the KV caches, batch_transfer_sync_write.
        eng = self.engine("rdma")  # no RDMA here: falls back with a warning
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
        # SGLang: register_memory / transfer_sync_write / send_probe /
        # unregister_memory, plus notifications on the target side.
        eng = self.engine()
        m, a = local_buffer(SIZES[1], 50)
        self.assertEqual(eng.register_memory(a, SIZES[1]), 0)
        self.assertEqual(eng.send_probe(self.session), 0)
        self.assertEqual(eng.transfer_sync_write(self.session, a, self.raddrs[1], SIZES[1]), 0)
        self.assertEqual(first_diff(self.remote(1), pattern(50, SIZES[1])), -1)
        note = TransferNotify("req-7", "kv done")
        self.assertEqual(eng.transfer_sync(self.session, a, self.raddrs[1], 4096, TransferOpcode.WRITE, note), 0)
        got = []
        for _ in range(100):
            got += self.peer.ask(("notifies",))
            if got:
                break
            time.sleep(0.01)
        self.assertEqual(got, [("req-7", "kv done")])
        self.assertEqual(eng.transfer_sync_read(self.session, a, self.raddrs[0], 4096), 0)
        self.assertEqual(m[:4096], self.remote(0)[:4096])
        self.assertEqual(eng.get_first_buffer_address(self.session), min(self.raddrs))
        self.assertEqual(eng.unregister_memory(a), 0)
        self.assertLess(eng.unregister_memory(a), 0)

    def test_async_calls(self):
        eng = self.engine()
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
        for _ in range(10000):
            rc = eng.transfer_check_status(bid)
            if rc != 0:
                break
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
        got = []
        for _ in range(100):
            got += self.peer.ask(("notifies",))
            if got:
                break
            time.sleep(0.01)
        self.assertEqual(got, [("batch", "sync")])

    def test_failures_return_codes(self):
        eng = self.engine()
        m, a = local_buffer(8192)
        self.assertEqual(eng.register_memory(a, 8192), 0)
        self.assertLess(eng.register_memory(a + 4096, 8192), 0)  # overlap
        self.assertLess(eng.register_memory(a + 8192, 0), 0)
        # Unknown peer: negative, not an exception; async: batch id 0.
        self.assertLess(eng.transfer_sync_write("127.0.0.1:1", a, 0x1000, 10), 0)
        self.assertEqual(eng.batch_transfer_async_write("127.0.0.1:1", [a], [0x1000], [10]), 0)
        self.assertLess(eng.send_probe("127.0.0.1:1"), 0)
        # Mismatched lists, unregistered local memory, out-of-range remote.
        self.assertLess(eng.batch_transfer_sync_write(self.session, [a, a], [self.raddrs[0]], [1, 1]), 0)
        self.assertEqual(eng.batch_transfer_async_write(self.session, [a], [], [1]), 0)
        other, oa = local_buffer(4096)
        self.assertLess(eng.transfer_sync_write(self.session, oa, self.raddrs[0], 4096), 0)
        self.assertLess(eng.transfer_sync_read(self.session, a, self.raddrs[1] + SIZES[1] - 1, 2), 0)
        self.assertLess(eng.get_batch_transfer_status([12345]), 0)
        self.assertEqual(eng.transfer_check_status(12345), -1)
        self.assertEqual(eng.get_first_buffer_address("127.0.0.1:1"), 0)


class MooncakeLocalTest(unittest.TestCase):
    def test_rdma_falls_back_with_warning(self):
        eng = TransferEngine()
        with self.assertLogs("mooncake.engine", logging.WARNING) as cm:
            self.assertEqual(eng.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0"), 0)
        self.addCleanup(eng.close)
        self.assertTrue(any("falling back" in r for r in cm.output), cm.output)

    def test_managed_buffers(self):
        eng = TransferEngine()
        self.assertEqual(eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        self.addCleanup(eng.close)
        a = eng.allocate_managed_buffer(1 << 20)
        b = eng.allocate_managed_buffer(1 << 20)
        self.assertNotEqual(a, 0)
        data = pattern(70, 1 << 20)
        self.assertEqual(eng.write_bytes_to_buffer(a, data, len(data)), 0)
        self.assertEqual(eng.read_bytes_from_buffer(a, 16), data[:16])
        me = f"127.0.0.1:{eng.get_rpc_port()}"
        self.assertEqual(eng.transfer_sync_write(me, a, b, 1 << 20), 0)  # local transport
        self.assertEqual(eng.read_bytes_from_buffer(b, 1 << 20), data)
        self.assertEqual(eng.free_managed_buffer(a, 1 << 20), 0)
        self.assertLess(eng.free_managed_buffer(a, 1 << 20), 0)
        self.assertEqual(eng.free_managed_buffer(b, 1 << 20), 0)
        self.assertLess(eng.write_bytes_to_buffer(a, b"x", 2), 0)

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
        self.assertEqual(_split_host("10.1.2.3"), ("10.1.2.3", 0))
        self.assertEqual(_split_host("10.1.2.3:1234"), ("10.1.2.3", 1234))
        self.assertEqual(_split_host("[::1]:99"), ("::1", 99))
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

        eng = TransferEngine()
        self.assertEqual(eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        self.addCleanup(eng.close)
        src = np.frombuffer(pattern(80, 1 << 20), dtype=np.uint8).copy()
        dst = np.zeros(1 << 20, dtype=np.uint8)
        self.assertEqual(eng.batch_register_memory([src.ctypes.data, dst.ctypes.data], [src.nbytes, dst.nbytes]), 0)
        me = f"127.0.0.1:{eng.get_rpc_port()}"
        self.assertEqual(eng.transfer_sync_write(me, src.ctypes.data, dst.ctypes.data, src.nbytes), 0)
        self.assertTrue(np.array_equal(src, dst))
        self.assertEqual(eng.batch_unregister_memory([src.ctypes.data, dst.ctypes.data]), 0)


if __name__ == "__main__":
    unittest.main()
