"""Tests of the native binding (python/te) against a real libte.so."""

import ctypes
import os
import select
import subprocess
import sys
import threading
import time
import unittest

import te
from peers import MB, first_diff, pattern, te_target
from util import HERE, Peer, requires_numpy


def engine():
    return te.Engine(listen_addr="127.0.0.1:0", rpc_timeout=3)


class FakeTensor:
    """The part of a torch tensor te uses: data_ptr, numel, element_size."""

    def __init__(self, n):
        self._buf = (ctypes.c_float * n)()
        self._n = n

    def data_ptr(self):
        return ctypes.addressof(self._buf)

    def numel(self):
        return self._n

    def element_size(self):
        return 4


class LoaderTest(unittest.TestCase):
    def test_version_and_prototypes(self):
        self.assertEqual(te.abi_version()[0], te.ABI_MAJOR)
        lib = te.load()
        for name, args in te._lib.PROTOTYPES.items():
            f = getattr(lib, name)
            self.assertEqual(f.argtypes, args, name)
            self.assertIs(f.restype, ctypes.c_int, name)

    def test_prototypes_cover_header(self):
        header = os.path.join(HERE, "..", "..", "include", "te.h")
        if not os.path.exists(header):
            self.skipTest("te.h not found next to this checkout")
        import re

        with open(header) as f:
            declared = set(re.findall(r"(?m)^int (te_\w+)\(", f.read()))
        self.assertEqual(declared, set(te._lib.PROTOTYPES))

    def test_te_library_env_is_honoured(self):
        # A fresh interpreter with TE_LIBRARY pointing nowhere must fail to
        # load, not fall back to another library.
        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(te.__file__)))
        env = dict(os.environ, TE_LIBRARY="/nonexistent/libte.so", PYTHONPATH=pkg_root)
        code = "import te\ntry:\n te.load()\nexcept te.LibraryError as e:\n print('refused', e)\n"
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=HERE, capture_output=True, text=True,
                             timeout=60)
        self.assertIn("refused", out.stdout, out.stderr)
        self.assertIn("/nonexistent/libte.so", out.stdout)

    def test_candidates_order(self):
        c = te._lib.candidates()
        self.assertTrue(str(c[-1]).endswith(os.path.join("build", "libte.so")))
        self.assertTrue(str(c[-2]).endswith(os.path.join("te", "libte.so")))


class EngineTest(unittest.TestCase):
    def setUp(self):
        self.e = engine()
        self.addCleanup(self.e.close)

    def test_local_write_read_every_byte(self):
        src = bytearray(pattern(1, 3 * MB))
        dst = bytearray(3 * MB)
        back = bytearray(3 * MB)
        self.e.register(src)
        self.e.register(dst)
        self.e.register(back, remote=False)
        seg = self.e.open_segment(self.e.name)
        dst_addr = te.address_of(dst)[0]
        # Odd-sized requests so every boundary is covered.
        chunk = 100003
        reqs = [(te.WRITE, te.address_of(src)[0] + off, seg, dst_addr + off, min(chunk, len(src) - off))
                for off in range(0, len(src), chunk)]
        st = self.e.transfer(reqs)
        self.assertEqual((st.state, st.completed, st.transferred), (te.COMPLETED, len(reqs), len(src)))
        self.assertEqual(first_diff(dst, src), -1)
        self.e.read(seg, back, dst_addr)
        self.assertEqual(first_diff(back, src), -1)
        self.assertEqual(sorted(b[0] for b in seg.buffers()), sorted([te.address_of(src)[0], dst_addr]))
        seg.close()

    def test_errors_map_to_classes(self):
        buf = bytearray(1 << 16)
        addr = self.e.register(buf)
        with self.assertRaises(te.InvalidArgument) as cm:
            self.e.register(addr + (1 << 16), 0)
        self.assertIsInstance(cm.exception, ValueError)
        self.assertEqual(cm.exception.code, 1)
        self.assertIn("length", str(cm.exception))
        with self.assertRaises(te.AddressOverlapped):
            self.e.register(addr + 4096, 4096)
        self.e.register(buf)  # identical: fine
        with self.assertRaises(te.AddressNotRegistered):
            self.e.unregister(addr + 1)
        with self.assertRaises(te.SegmentNotFound):
            self.e.open_segment("127.0.0.1:1")
        with self.assertRaises(te.InvalidArgument):
            self.e.open_segment("no-port-here")
        seg = self.e.open_segment(self.e.name)
        other = bytearray(4096)  # not registered
        with self.assertRaises(te.AddressNotRegistered):
            self.e.write(seg, other, addr)
        with self.assertRaises(te.InvalidArgument):
            self.e.write(seg, addr, addr + 8192, 0)
        b = self.e.allocate_batch(1)
        with self.assertRaises(te.InvalidArgument):
            b.task_status(0)
        b.free()
        with self.assertRaises(te.InvalidArgument):
            b.handle = 12345
            b.status()
        with self.assertRaises(te.InvalidArgument):
            self.e.register(b"read-only bytes")
        with self.assertRaises(TypeError):
            self.e.register(object())
        with self.assertRaises(te.InvalidArgument):
            self.e.register(addr)  # int without length

    def test_error_messages_are_per_thread(self):
        bad = []

        def worker(i):
            name = f"thread-{i}-no-port"
            for _ in range(50):
                try:
                    self.e.open_segment(name)
                except te.InvalidArgument as e:
                    if name not in str(e):
                        bad.append(str(e))
                else:
                    bad.append("no error")

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(bad, [])

    def test_data_ptr_objects(self):
        t1, t2 = FakeTensor(1024), FakeTensor(1024)
        ctypes.memmove(t1.data_ptr(), pattern(3, 4096), 4096)
        self.e.register(t1)
        self.e.register(t2)
        seg = self.e.open_segment(self.e.name)
        self.e.write(seg, t1, t2.data_ptr())
        self.assertEqual(ctypes.string_at(t2.data_ptr(), 4096), pattern(3, 4096))
        self.e.unregister(t1)
        self.e.unregister(t2)

    @requires_numpy
    def test_numpy_arrays(self):
        import numpy as np

        a = np.frombuffer(pattern(4, 1 << 20), dtype=np.uint8).copy().view(np.float32)
        b = np.zeros_like(a)
        self.e.register_batch([a, b])
        seg = self.e.open_segment(self.e.name)
        self.e.write(seg, a, b.ctypes.data)
        self.assertTrue(np.array_equal(a.view(np.uint8), b.view(np.uint8)))
        with self.assertRaises(te.InvalidArgument):
            self.e.register(np.zeros((64, 64), dtype=np.uint8)[:, ::2])  # not contiguous
        self.e.unregister_batch([a, b])

    def test_batch_api_and_notify(self):
        src, dst = bytearray(pattern(5, 8192)), bytearray(8192)
        self.e.register_batch([src, dst])
        seg = self.e.open_segment(self.e.name)
        with self.e.allocate_batch(2) as b:
            half = 4096
            fd = b.fileno()
            b.submit([(te.WRITE, src, seg, te.address_of(dst)[0], half)])
            r, _, _ = select.select([fd], [], [], 10)
            self.assertEqual(r, [fd])
            self.assertGreaterEqual(int.from_bytes(os.read(fd, 8), "little"), 1)
            b.submit([(te.WRITE, te.address_of(src)[0] + half, seg, te.address_of(dst)[0] + half, half)],
                     notify=(self.e.name, "kv-ready", b"req-1"))
            st = b.wait(10)
            self.assertEqual(st.state_name, "COMPLETED")
            state, err, n, transport = b.task_status(1)
            self.assertEqual((state, err, n), (te.COMPLETED, 0, half))
            self.assertTrue(transport)
        self.assertEqual(dst, src)
        for _ in range(200):  # the batch notify is sent after completion
            got = self.e.notifies()
            if got:
                break
            threading.Event().wait(0.01)
        self.assertEqual(got, [("kv-ready", b"req-1")])
        self.e.send_notify(self.e.name, "n", "msg")
        self.assertEqual(self.e.notifies(), [("n", b"msg")])
        p = self.e.probe(self.e.name)
        self.assertEqual(len(p["instance"]), 32)
        s = self.e.stats()
        self.assertGreaterEqual(s["bytes_transferred"], 8192)
        self.assertEqual(s["segment"], self.e.name)

    def test_closed_engine(self):
        e = engine()
        e.close()
        e.close()  # idempotent in Python
        self.assertTrue(e.closed)
        with self.assertRaises(te.InvalidArgument):
            e.register(bytearray(10))


class TwoProcessTest(unittest.TestCase):
    """A real second process: READ its data, WRITE ours, READ it back."""

    def run_pair(self, **kw):
        size = 4 * MB
        half = size // 2
        peer = Peer(te_target, size, 21, 22)
        try:
            name, raddr, rlen = peer.recv()
            self.assertEqual(rlen, size)
            with te.Engine(listen_addr="127.0.0.1:0", **kw) as e:
                mine = bytearray(pattern(22, half))
                got = bytearray(half)
                back = bytearray(half)
                e.register_batch([mine, got, back], remote=False)
                seg = e.open_segment(name)
                e.read(seg, got, raddr)
                self.assertEqual(first_diff(got, pattern(21, half)), -1)
                st = e.transfer([(te.WRITE, mine, seg, raddr + half, None)], notify=(name, "done", b"w"))
                self.assertEqual(st.transferred, half)
                e.read(seg, back, raddr + half)
                self.assertEqual(first_diff(back, mine), -1)
                e.send_notify(name, "direct", b"\x00\x01")
                notes = []
                for _ in range(200):  # the batch's notify is sent after completion
                    res = peer.ask("check")
                    notes += res["notifies"]
                    if len(notes) >= 2:
                        break
                    time.sleep(0.01)
                self.assertEqual(sorted(notes), [("direct", b"\x00\x01"), ("done", b"w")])
                self.assertEqual(res["peer_half"], -1)
                self.assertEqual(res["own_half"], -1)
                with self.assertRaises(te.TeError):  # past the end of the peer's buffer
                    e.read(seg, got, raddr + size - 10, 20)
                if "force_transport" in kw:
                    b = e.allocate_batch(1)
                    b.submit([(te.READ, got, seg, raddr, 4096)])
                    b.wait()
                    self.assertEqual(b.task_status(0)[3], kw["force_transport"])
                    b.free()
            self.assertEqual(peer.ask("exit"), "bye")
        finally:
            peer.close()

    def test_tcp(self):
        self.run_pair(force_transport="tcp")

    def test_auto(self):
        self.run_pair()


if __name__ == "__main__":
    unittest.main()
