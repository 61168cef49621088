"""Storage buffers through the Python binding: te.Engine.register_file,
locally and from another process over tcp."""

import ctypes
import mmap
import os
import tempfile
import unittest

import te
from peers import MB, file_node, first_diff, pattern
from util import Peer

SECRET = "python-file-test-secret-0123456789"
SIZE = 4 * MB


def engine(secret=SECRET):
    return te.Engine(listen_addr="127.0.0.1:0", rpc_timeout=5, auth_secret=secret)


def direct_dir():
    """A temporary directory, on a file system that takes O_DIRECT if the
    working directory's or the temp dir's does."""
    for base in (None, os.getcwd()):
        d = tempfile.mkdtemp(dir=base)
        try:
            fd = os.open(os.path.join(d, "probe"), os.O_CREAT | os.O_RDWR | getattr(os, "O_DIRECT", 0))
            os.close(fd)
            os.unlink(os.path.join(d, "probe"))
            return d
        except OSError:
            os.rmdir(d)
    return tempfile.mkdtemp()


class Buf:
    """Page-aligned memory (mmap), as KV pools are."""

    def __init__(self, n):
        self.m = mmap.mmap(-1, n)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.m))
        self.n = n

    def set(self, data, off=0):
        self.m[off:off + len(data)] = data

    def get(self, off=0, n=None):
        return bytes(self.m[off:off + (self.n if n is None else n)])


def move(e, seg, op, local, remote, n, bs):
    reqs = [(op, local + o, seg, remote + o, min(bs, n - o)) for o in range(0, n, bs)]
    return e.transfer(reqs, timeout=60)


class LocalFileTest(unittest.TestCase):
    def setUp(self):
        self.dir = direct_dir()
        self.e = engine()
        self.src, self.dst = Buf(SIZE), Buf(SIZE)
        self.e.register(self.src.addr, SIZE)
        self.e.register(self.dst.addr, SIZE)
        self.seg = self.e.open_segment(self.e.name)

    def tearDown(self):
        self.e.close()

    def test_round_trip_every_byte(self):
        for direct in (True, False):
            for bs in (4096, MB):
                with self.subTest(direct=direct, bs=bs):
                    path = os.path.join(self.dir, f"f-{direct}-{bs}")
                    fa = self.e.register_file(path, offset=4096, length=SIZE, create=True, direct=direct)
                    data = pattern(bs + direct, SIZE)
                    self.src.set(data)
                    self.assertEqual(move(self.e, self.seg, te.WRITE, self.src.addr, fa, SIZE, bs).state, te.COMPLETED)
                    self.assertEqual(move(self.e, self.seg, te.READ, self.dst.addr, fa, SIZE, bs).state, te.COMPLETED)
                    self.assertEqual(first_diff(self.dst.get(), data), -1)
                    with open(path, "rb") as f:
                        f.seek(4096)
                        self.assertEqual(first_diff(f.read(SIZE), data), -1)
                    self.e.unregister(fa)

    def test_misaligned_and_truncated(self):
        path = os.path.join(self.dir, "mis")
        fa = self.e.register_file(path, length=SIZE, create=True)
        data = pattern(5, 10000)
        self.src.set(data, 1)
        self.e.write(self.seg, self.src.addr + 1, fa + 4097, 9999)
        self.e.read(self.seg, self.dst.addr + 3, fa + 4097, 9999)
        self.assertEqual(self.dst.get(3, 9999), data[:9999])
        os.truncate(path, MB)
        st = self.e.read(self.seg, self.dst.addr, fa, 4096)
        self.assertEqual(st.state, te.COMPLETED)
        with self.assertRaises(te.StorageError) as cm:
            self.e.read(self.seg, self.dst.addr, fa + 2 * MB, 4096)
        self.assertIn("shorter than its registered range", str(cm.exception))
        self.e.unregister(fa)

    def test_stats_say_io_uring_or_pool(self):
        fa = self.e.register_file(os.path.join(self.dir, "st"), length=MB, create=True)
        self.e.write(self.seg, self.src.addr, fa, MB)
        st = self.e.stats()["transport_stats"]["file"]
        self.assertIn(st["io_uring"], (0, 1))
        self.assertGreater(st["ops"], 0)
        self.e.unregister(fa)

    def test_private_file(self):
        # remote=False: this engine's own requests reach the file through
        # its own segment; peers never see it (test_nixl_file.py,
        # PrivateFilesTest: another process with the secret is refused).
        fa = self.e.register_file(os.path.join(self.dir, "private"), length=MB, create=True, remote=False)
        data = pattern(8, MB)
        self.src.set(data)
        self.assertEqual(move(self.e, self.seg, te.WRITE, self.src.addr, fa, MB, MB).state, te.COMPLETED)
        self.assertEqual(move(self.e, self.seg, te.READ, self.dst.addr, fa, MB, 64 << 10).state, te.COMPLETED)
        self.assertEqual(first_diff(self.dst.get(0, MB), data), -1)
        self.assertIn((fa, MB, "file"), self.seg.buffers())
        self.e.unregister(fa)

    def test_errors(self):
        with self.assertRaises(te.InvalidArgument):
            self.e.register_file()
        with self.assertRaises(te.InvalidArgument):
            self.e.register_file("x", fd=3)
        with self.assertRaises(te.NotFound):
            self.e.register_file(os.path.join(self.dir, "absent"), length=4096)


class RemoteFileTest(unittest.TestCase):
    def test_peer_file_over_tcp(self):
        # The node's file I/O runs on the pread/pwrite fallback, as where
        # io_uring is switched off (TE_FILE_POOL=1); local tests use io_uring.
        d = direct_dir()
        node = Peer(file_node, os.path.join(d, "node"), SIZE, SECRET, env={"TE_FILE_POOL": "1"})
        try:
            name, fa = node.recv()
            e = engine()
            try:
                src, dst = Buf(SIZE), Buf(SIZE)
                e.register(src.addr, SIZE)
                e.register(dst.addr, SIZE)
                seg = e.open_segment(name)
                self.assertEqual(seg.buffers(), [(fa, SIZE, "file")])
                for bs in (4096, MB):
                    data = pattern(bs, SIZE)
                    src.set(data)
                    self.assertEqual(move(e, seg, te.WRITE, src.addr, fa, SIZE, bs).state, te.COMPLETED)
                    self.assertEqual(move(e, seg, te.READ, dst.addr, fa, SIZE, bs).state, te.COMPLETED)
                    self.assertEqual(first_diff(dst.get(), data), -1)
            finally:
                e.close()
            bad = engine("not-the-cluster-secret-0123456789")
            try:
                with self.assertRaises(te.AuthError):
                    bad.open_segment(name)
            finally:
                bad.close()
            st = node.ask("stats")
            self.assertEqual(st.get("io_uring"), 0, st)
            self.assertGreater(st.get("ops", 0), 0, st)
            self.assertEqual(node.ask("exit"), "bye")
        finally:
            node.close()


if __name__ == "__main__":
    unittest.main()
