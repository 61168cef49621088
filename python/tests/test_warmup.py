"""Warm first transfer: te.Engine.warmup and the drop-in's warmup_segment
connect ahead of the first request (every tcp connection dialed and
authenticated), so the first transfer dials nothing."""

import ctypes
import statistics
import time
import unittest

import mooncake.engine as mc
import te


def tcp_engine(test, conns=4):
    e = te.Engine(listen_addr="127.0.0.1:0", transports="tcp", params={"tcp.conns": conns}, rpc_timeout=3)
    test.addCleanup(e.close)
    return e


def dialed(e):
    return e.stats()["transport_stats"]["tcp"]["peer_conns_dialed"]


class WarmupTest(unittest.TestCase):
    def setUp(self):
        self.target, self.init = tcp_engine(self), tcp_engine(self)
        self.dst = ctypes.create_string_buffer(1 << 16)
        self.src = ctypes.create_string_buffer(1 << 16)
        self.dst_addr = self.target.register(self.dst)
        self.src_addr = self.init.register(self.src)

    def test_warmup_opens_every_connection(self):
        name = self.target.name
        self.assertEqual(dialed(self.init), 0)
        self.init.warmup(name)
        self.assertEqual(dialed(self.init), 4)
        self.init.warmup(name)  # again: nothing new
        seg = self.init.open_segment(name)
        self.addCleanup(seg.close)
        self.src[:5] = b"hello"
        for _ in range(8):  # every stripe
            self.init.transfer([(te.WRITE, self.src_addr, seg, self.dst_addr, 4096)], timeout=10)
        self.assertEqual(self.dst[:5], b"hello")
        self.assertEqual(dialed(self.init), 4)

    def test_warmup_errors(self):
        with self.assertRaises(te.SegmentNotFound):
            self.init.warmup("127.0.0.1:1")
        with self.assertRaises(te.InvalidArgument):
            self.init.warmup("")
        self.assertEqual(dialed(self.init), 0)

    def test_first_transfer_figure(self):
        # Reported, not asserted: a shared machine's timing is no test.
        name = self.target.name
        seg = self.init.open_segment(name)
        self.addCleanup(seg.close)
        self.init.warmup(name)
        b = self.init.allocate_batch(1)
        self.addCleanup(b.free)
        times = []
        for _ in range(101):
            b.reset()
            t0 = time.perf_counter()
            b.submit([(te.WRITE, self.src_addr, seg, self.dst_addr, 4096)])
            b.wait(10)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times[1:])
        print(f"\nwarm first 4 KiB write {times[0] * 1e6:.0f} us, median of next 100 {med * 1e6:.0f} us, "
              f"ratio {times[0] / med:.2f}")


class MooncakeWarmupTest(unittest.TestCase):
    def test_warmup_segment(self):
        target, init = mc.TransferEngine(), mc.TransferEngine()
        for eng in (target, init):
            self.assertEqual(eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
            self.addCleanup(eng.close)
        name = f"127.0.0.1:{target.get_rpc_port()}"
        self.assertEqual(init.warmup_segment(name), 0)
        self.assertEqual(init.warmup_efa_segment(name), 0)  # delegates
        # Mooncake's convention: a negative code on failure.
        self.assertEqual(init.warmup_segment("127.0.0.1:1"), -te.SegmentNotFound.code)
        self.assertEqual(init.warmup_efa_segment("127.0.0.1:1"), -te.SegmentNotFound.code)


if __name__ == "__main__":
    unittest.main()
