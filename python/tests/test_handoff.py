"""The prefill-to-decode handoff through a real te-sidecar, with prefill in a
second process (started with "spawn") and decode in this one: push (layer by
layer and whole), pull, aborts, timeouts; decode checks every byte."""

import os
import threading
import unittest

import te
from handoff_peers import DST_BLOCKS, LAYERS, SHAPE, SRC_BLOCKS, layer_pattern, prefill
from sidecar import Sidecar
from te.kvcache import Handoff, Layout
from util import Peer, wait_until

SENTINEL = 0xEE


class HandoffTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sidecar = Sidecar()
        try:
            cls.peer = Peer(prefill, cls.sidecar.addr, timeout=120)
            assert cls.peer.recv() == "ready"
        except BaseException:
            cls.sidecar.stop()
            raise
        cls.e = te.Engine(listen_addr="127.0.0.1:0", hostname="127.0.0.1", rpc_timeout=10, transfer_timeout=60)
        shape = Layout(num_blocks=DST_BLOCKS, **SHAPE)
        cls.lb, cls.bb = shape.layer_bytes, shape.block_bytes
        cls.bufs = [bytearray([SENTINEL]) * cls.lb for _ in range(LAYERS)]
        cls.layout = shape.with_bases(bases=[te.address_of(b)[0] for b in cls.bufs])
        cls.e.register_batch(cls.layout.regions())
        cls.h = Handoff(cls.e, cls.sidecar.addr)
        cls.src = [layer_pattern(l, 2 * SRC_BLOCKS * cls.bb) for l in range(LAYERS)]
        cls.n = 0

    @classmethod
    def tearDownClass(cls):
        try:
            cls.peer.ask(("exit",))
            cls.peer.close()
            cls.h.close()
            cls.e.close()
        finally:
            cls.sidecar.stop()

    def tid(self):
        HandoffTest.n += 1
        return f"{self._testMethodName}-{os.getpid()}-{HandoffTest.n}"

    def ask(self, *cmd):
        r = self.peer.ask(cmd)
        self.assertEqual(r[0], "ok", r)
        return r[1]

    def check_blocks(self, src_blocks, dst_blocks):
        """Every byte of the destination blocks, for every layer and K/V."""
        bb = self.bb
        for l in range(LAYERS):
            for c in range(2):
                for s, d in zip(src_blocks, dst_blocks):
                    got = bytes(self.bufs[l][(c * DST_BLOCKS + d) * bb:(c * DST_BLOCKS + d + 1) * bb])
                    want = self.src[l][(c * SRC_BLOCKS + s) * bb:(c * SRC_BLOCKS + s + 1) * bb]
                    self.assertEqual(got, want, f"layer {l} {'KV'[c]} block {s} -> {d}")

    def check_untouched(self, blocks):
        bb = self.bb
        for l in range(LAYERS):
            for c in range(2):
                for d in blocks:
                    chunk = self.bufs[l][(c * DST_BLOCKS + d) * bb:(c * DST_BLOCKS + d + 1) * bb]
                    self.assertEqual(chunk.count(SENTINEL), bb, f"layer {l} block {d} was written")

    def reset(self, blocks):
        bb = self.bb
        for l in range(LAYERS):
            for c in range(2):
                for d in blocks:
                    self.bufs[l][(c * DST_BLOCKS + d) * bb:(c * DST_BLOCKS + d + 1) * bb] = bytes([SENTINEL]) * bb

    def run_push(self, layered):
        tid = self.tid()
        src, dst = [3, 4, 5, 0, 11], [9, 10, 11, 2, 6]
        self.reset(dst)
        x = self.h.expect(tid, self.layout, dst, mode="push", timeout=60)
        self.addCleanup(x.close)
        self.peer.conn.send(("push", tid, src, layered))
        r = x.wait(timeout=90)
        sent = self.peer.recv()
        self.assertEqual(sent[0], "ok", sent)
        sent = sent[1]
        want = LAYERS * 2 * len(src) * self.bb
        self.assertEqual((r.mode, r.mover, r.bytes), ("push", False, want))
        self.assertEqual((sent["mode"], sent["mover"], sent["bytes"]), ("push", True, want))
        self.assertTrue(0 < sent["requests"] <= sent["block_requests"], sent)
        self.assertTrue(sent["transport"], sent)
        self.check_blocks(src, dst)
        self.check_untouched([1, 3, 5, 7, 8, 12])  # no test writes these
        st = x.status()
        self.assertEqual((st.state, st.settled, st.error), ("done", True, 0))

    def test_push_layer_by_layer(self):
        self.run_push(layered=True)

    def test_push_whole(self):
        self.run_push(layered=False)

    def test_pull(self):
        tid = self.tid()
        src, dst = [7, 1, 2, 8, 9], [0, 13, 14, 4, 15]
        self.reset(dst)
        x = self.h.expect(tid, self.layout, dst, mode="pull", timeout=60)
        self.addCleanup(x.close)
        self.peer.conn.send(("pull", tid, src))
        r = x.wait(timeout=90)
        sent = self.peer.recv()
        self.assertEqual(sent[0], "ok", sent)
        want = LAYERS * 2 * len(src) * self.bb
        self.assertEqual((r.mode, r.mover, r.bytes), ("pull", True, want))
        self.assertTrue(r.transport and 0 < r.requests <= r.block_requests, r)
        self.assertEqual((sent[1]["mover"], sent[1]["bytes"]), (False, want))
        self.check_blocks(src, dst)
        self.assertTrue(self.ask("check"), "prefill's blocks changed")

    def test_decode_aborts_before_prefill(self):
        tid = self.tid()
        x = self.h.expect(tid, self.layout, [1, 7], timeout=60)
        with self.assertRaises(te.Timeout):
            x.wait(timeout=0.05)  # unpaired: a short wait times out, the transfer goes on
        self.assertEqual(x.status().state, "waiting")
        x.abort("decode gave up")
        st = x.status()
        self.assertEqual((st.state, st.error, st.settled), ("aborted", te.Canceled.code, True))
        self.assertIn("decode gave up", st.reason)
        r = self.peer.ask(("push", tid, [0, 1], False))
        self.assertEqual(r[:2], ("error", "Canceled"), r)
        with self.assertRaises(te.Canceled):
            x.wait(timeout=5)
        x.close()
        self.check_untouched([1, 7])

    def test_decode_frees_after_pairing(self):
        # Both sides declared; decode frees its handle without waiting. The
        # free aborts the transfer and returns once prefill, the mover, has
        # stopped: prefill's send fails with Canceled and settles it.
        tid = self.tid()
        self.assertIsNone(self.ask("ready", tid, [0, 1]))
        x = self.h.expect(tid, self.layout, [12, 3], timeout=60)
        done = threading.Event()
        t = threading.Thread(target=lambda: (x.close(), done.set()), daemon=True)
        t.start()
        wait_until(lambda: self.ask("status", tid)["state"] == "aborted", 60, "the free aborting the transfer")
        r = self.peer.ask(("send", tid))
        self.assertEqual(r[:2], ("error", "Canceled"), r)
        t.join(60)
        self.assertTrue(done.is_set(), "free did not return after the mover stopped")
        with self.assertRaises(te.Canceled):
            self.h.expect(tid, self.layout, [12, 3], timeout=60)
        self.check_untouched([12, 3])

    def test_bad_declarations(self):
        with self.assertRaises(te.InvalidArgument):
            self.h.expect(self.tid(), self.layout, [], timeout=5)
        with self.assertRaises(te.InvalidArgument):
            self.h.expect(self.tid(), self.layout, [1], mode="sideways")
        with self.assertRaises(te.InvalidArgument):
            self.h.expect(self.tid(), self.layout, [1 << 40])
        shape_only = Layout(num_blocks=4, **SHAPE)
        with self.assertRaises(te.InvalidArgument):
            self.h.expect(self.tid(), shape_only, [1])
        # A block id past the layout is refused at once.
        with self.assertRaisesRegex(te.InvalidArgument, "outside"):
            self.h.expect(self.tid(), self.layout, [DST_BLOCKS + 3], timeout=30)
        # Block lists of different lengths: refused when both sides have
        # declared, and both learn it.
        tid = self.tid()
        x = self.h.expect(tid, self.layout, [5, 8], timeout=30)
        self.addCleanup(x.close)
        r = self.peer.ask(("push", tid, [0], False))
        self.assertEqual(r[:2], ("error", "InvalidArgument"), r)
        with self.assertRaises(te.InvalidArgument):
            x.wait(timeout=60)
        self.check_untouched([5, 8])

if __name__ == "__main__":
    unittest.main()
