"""te.kvcache layouts and plans against a real libte.so: shapes, error
paths, tensor-parallel head slices, and plans submitted through an engine
with every byte checked."""

import ctypes
import json
import unittest

import te
from peers import pattern
from te.kvcache import ALL_LAYERS, Layout, Plan

SHAPE = dict(format="vllm", order="NHD", dtype="bf16", block_size=16, num_heads=2, head_dim=64)
BB = 16 * 2 * 64 * 2


class FakeTensor:
    """data_ptr() and nbytes over host memory, like a CPU torch tensor."""

    def __init__(self, n):
        self.buf = (ctypes.c_char * n)()
        self.nbytes = n
        self.device = "cpu"

    def data_ptr(self):
        return ctypes.addressof(self.buf)


class LayoutTest(unittest.TestCase):
    def test_shape_only(self):
        l = Layout(num_blocks=10, **SHAPE)
        self.assertEqual((l.block_bytes, l.layer_bytes), (BB, 2 * 10 * BB))
        self.assertEqual(Layout(format="mla", dtype="fp8_e4m3", num_blocks=4, block_size=16, head_dim=576).layer_bytes,
                         4 * 16 * 576)
        with self.assertRaises(te.InvalidArgument):
            l.regions()  # no addresses yet

    def test_addresses_info_regions(self):
        l = Layout(num_blocks=10, bases=[1 << 30, (1 << 30) + 2 * 10 * BB], **SHAPE)
        self.assertEqual(l.info(), {"num_layers": 2, "first_layer": 0, "num_blocks": 10, "components": 2,
                                    "regions": 2, "block_bytes": BB, "layer_bytes": 2 * 10 * BB})
        self.assertEqual(l.regions(), [(1 << 30, 2 * 10 * BB), ((1 << 30) + 2 * 10 * BB, 2 * 10 * BB)])
        again = Layout.from_json(l.to_json())
        self.assertEqual(json.loads(again.to_json()), json.loads(l.to_json()))
        t = FakeTensor(2 * 10 * BB)
        self.assertEqual(l.with_bases(bases=[t]).regions(), [(t.data_ptr(), 2 * 10 * BB)])
        sg = Layout(format="sglang", dtype="fp16", num_blocks=4, block_size=1, num_heads=8, head_dim=128,
                    k_bases=[1 << 30], v_bases=[1 << 31])
        self.assertEqual(sg.info()["regions"], 2)
        l.close()
        l.close()  # idempotent
        with self.assertRaises(te.InvalidArgument):
            l.info()

    def test_errors(self):
        for kw in (dict(SHAPE, dtype="int4"), dict(SHAPE, format="paged"), dict(SHAPE, order="HDN"),
                   dict(SHAPE, head_dim=0), dict(SHAPE, format="mla", order="HND")):
            with self.subTest(kw=kw), self.assertRaises(te.InvalidArgument):
                Layout(num_blocks=4, **kw)
        with self.assertRaisesRegex(te.InvalidArgument, "overlap"):
            Layout(num_blocks=4, bases=[1 << 30, (1 << 30) + 8], **SHAPE)
        with self.assertRaisesRegex(te.InvalidArgument, "unknown field"):
            Layout.from_json('{"format":"vllm","dtype":"bf16","num_blocks":4,"block_size":16,"num_heads":1,'
                             '"head_dim":8,"base":[4096]}')
        with self.assertRaises(TypeError):
            Layout(num_blocks=4, bases=["0x1000"], **SHAPE)


class PlanTest(unittest.TestCase):
    def setUp(self):
        self.e = te.Engine(listen_addr="127.0.0.1:0", hostname="127.0.0.1")
        self.addCleanup(self.e.close)

    def cache(self, layout, seed=None):
        bufs = [bytearray(pattern(seed + i, layout.layer_bytes)) if seed is not None else bytearray(layout.layer_bytes)
                for i in range(3)]
        l = layout.with_bases(bases=[te.address_of(b)[0] for b in bufs])
        l.register(self.e)
        self.addCleanup(l.unregister, self.e)
        return l, bufs

    def test_errors(self):
        src = Layout(num_blocks=6, bases=[1 << 30], **SHAPE)
        dst = Layout(num_blocks=8, bases=[1 << 31], **SHAPE)
        fp16 = Layout(num_blocks=8, bases=[1 << 32], **dict(SHAPE, dtype="fp16"))
        for args, msg in (((src, fp16, [0], [0]), "dtype"), ((src, dst, [6], [0]), "outside"),
                          ((src, dst, [0, 1], [3, 3]), "twice"), ((src, dst, [0, 1], [0]), "block ids"),
                          ((src, dst, [], []), "empty"), ((src, dst, [0], [1 << 33]), "32 bits")):
            with self.subTest(msg=msg), self.assertRaisesRegex(te.InvalidArgument, msg):
                Plan(*args)
        for layers in ((1, 1), (0, 2), (-1, 1), (0, 0)):
            with self.subTest(layers=layers), self.assertRaises(te.InvalidArgument):
                Plan(src, dst, [0], [0], layers=layers)
        p = Plan(src, dst, [0], [0])
        with self.assertRaises(te.InvalidArgument):
            p.transfers(layer=1)
        p.close()
        with self.assertRaises(te.InvalidArgument):
            p.stats

    def test_layer_by_layer_and_whole(self):
        src, sbufs = self.cache(Layout(num_blocks=6, **SHAPE), seed=40)
        dst, dbufs = self.cache(Layout(num_blocks=10, **SHAPE))
        sb, db = [0, 1, 2, 5], [4, 5, 6, 0]
        p = Plan(src, dst, sb, db)
        st = p.stats
        self.assertEqual((st.layers, st.blocks, st.bytes, st.block_requests), (3, 4, 3 * 2 * 4 * BB, 3 * 2 * 4))
        self.assertEqual((st.requests, st.max_layer_requests), (3 * 4, 4))
        self.assertEqual(sum(t[2] for t in p.transfers(1)), 2 * 4 * BB)
        self.assertEqual(len(p.transfers()), st.merged)

        seg = self.e.open_segment(self.e.name)
        self.addCleanup(seg.close)

        def check():
            for l in range(3):
                for c in range(2):
                    for s, d in zip(sb, db):
                        got = dbufs[l][(c * 10 + d) * BB:(c * 10 + d + 1) * BB]
                        want = sbufs[l][(c * 6 + s) * BB:(c * 6 + s + 1) * BB]
                        self.assertEqual(got, want, (l, c, s, d))

        with self.e.allocate_batch(st.requests) as b:
            for layer in range(3):
                p.submit_layer(b, seg, layer, te.WRITE)
            self.assertEqual(b.wait(60).transferred, st.bytes)
        check()
        for buf in dbufs:
            buf[:] = bytes(len(buf))
        with self.e.allocate_batch(st.merged) as b:
            p.submit(b, seg, te.READ)
            b.wait(60)
        check()
        with self.e.allocate_batch(1) as b, self.assertRaises(te.InvalidArgument):
            p.submit_layer(b, seg, 0, 5)  # opcode

    def test_tensor_parallel_head_slice(self):
        # Prefill TP 1 holds heads 0..3 (HND); decode rank 1 of TP 2 holds
        # heads 2..3: each block's second half of heads is one run.
        hnd = dict(SHAPE, order="HND", num_heads=4, total_heads=4)
        src, sbufs = self.cache(Layout(num_blocks=4, **hnd), seed=50)
        dst, dbufs = self.cache(Layout(num_blocks=4, **dict(hnd, num_heads=2, head_start=2)))
        p = Plan(src, dst, [3, 1], [0, 2])
        st = p.stats
        self.assertEqual((st.pieces, st.bytes), (1, 3 * 2 * 2 * BB))
        seg = self.e.open_segment(self.e.name)
        self.addCleanup(seg.close)
        with self.e.allocate_batch(st.merged) as b:
            p.submit(b, seg, te.WRITE)
            b.wait(60)
        sblock = 2 * BB  # four heads
        for l in range(3):
            for c in range(2):
                for s, d in ((3, 0), (1, 2)):
                    start = (c * 4 + s) * sblock + sblock // 2
                    want = sbufs[l][start:start + sblock // 2]
                    got = dbufs[l][(c * 4 + d) * BB:(c * 4 + d + 1) * BB]
                    self.assertEqual(got, want, (l, c, s, d))
        self.assertEqual(ALL_LAYERS, -1)


if __name__ == "__main__":
    unittest.main()
