"""The cxl transport from Python, across two processes sharing one file in
/dev/shm as the CXL device: each maps it at its own address, registers
buffers from Engine.cxl_memory(), and moves bytes by memcpy at the
offsets the descriptors carry; a range outside the mapping goes over tcp
(or is refused when cxl is forced)."""

import ctypes
import os
import random
import tempfile
import unittest
import zlib

import te

from peers import cxl_target
from util import Peer

SIZE = 8 << 20
DEV = 32 << 20


class CXLTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        fd, cls.path = tempfile.mkstemp(prefix="te-cxl-py-", dir="/dev/shm")
        os.ftruncate(fd, DEV)
        os.close(fd)
        cls.saved = os.environ.get("TE_CXL_DEVICE")
        os.environ["TE_CXL_DEVICE"] = cls.path
        cls.peer = Peer(cxl_target, SIZE, 7)
        cls.name, cls.raddr, cls.crc = cls.peer.recv()

    @classmethod
    def tearDownClass(cls):
        cls.peer.ask("exit")
        cls.peer.close()
        os.unlink(cls.path)
        if cls.saved is None:
            os.environ.pop("TE_CXL_DEVICE", None)
        else:
            os.environ["TE_CXL_DEVICE"] = cls.saved

    def engine(self, force="cxl"):
        e = te.Engine(listen_addr="127.0.0.1:0", hostname="127.0.0.1", transports="cxl,tcp", force_transport=force,
                      rpc_timeout=5)
        self.addCleanup(e.close)
        return e

    def test_byte_exact_both_ways(self):
        e = self.engine()
        base, n = e.cxl_memory()
        self.assertEqual(n, DEV)
        # The peer's buffer is the first SIZE bytes of the device; ours
        # starts after it, so the two never overlap.
        mine = base + SIZE
        local = (ctypes.c_char * SIZE).from_address(mine)
        e.register(mine, SIZE)
        seg = e.open_segment(self.name)
        st = e.read(seg, mine, self.raddr, SIZE, timeout=30)
        self.assertEqual(st.state, te.COMPLETED)
        self.assertEqual(zlib.crc32(bytes(local)), self.crc)
        data = random.Random(11).randbytes(SIZE)
        local[:] = data
        st = e.write(seg, mine + 3, self.raddr + 5, SIZE - 8, timeout=30)
        self.assertEqual(st.state, te.COMPLETED)
        self.assertEqual(self.peer.ask(("crc", 5, SIZE - 8)), zlib.crc32(data[3:SIZE - 5]))
        self.assertGreater(e.stats()["transport_stats"]["cxl"]["bytes_written"], 0)
        seg.close()
        e.unregister(mine)

    def test_private_memory_falls_back(self):
        # A buffer outside the mapping registers (tcp serves it); forcing
        # cxl onto a peer's range outside its mapping is refused.
        e = self.engine(force=None)
        buf = bytearray(4096)
        addr = e.register(buf)
        seg = e.open_segment(self.name)
        st = e.read(seg, addr, self.raddr, 4096, timeout=30)
        self.assertEqual(st.state, te.COMPLETED)
        seg.close()
        e.unregister(buf)

    def test_cxl_alone_refuses_private_memory(self):
        e = te.Engine(listen_addr="127.0.0.1:0", hostname="127.0.0.1", transports="cxl", rpc_timeout=5)
        self.addCleanup(e.close)
        buf = bytearray(4096)
        with self.assertRaises(te.NotSupported) as cm:
            e.register(buf)
        self.assertIn("outside the CXL mapping", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
