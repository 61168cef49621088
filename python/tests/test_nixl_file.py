"""FILE_SEG through te's nixl package: files registered the two ways NIXL
has (path mode, fd mode) become te file segments, and DRAM/VRAM <-> file
transfers run through the POSIX/GDS backend names on te's file transport,
checked byte for byte against the file itself."""

import logging
import mmap
import os
import resource
import shutil
import subprocess
import tempfile
import time
import unittest

os.environ["TE_NIXL_HOST"] = "127.0.0.1"  # before any agent: tests stay on loopback

try:
    import numpy as np
except ImportError:  # nixl needs numpy
    np = None

if np is not None:
    import nixl._bindings as nb
    import te
    from nixl._api import nixl_agent, nixl_agent_config
    from nixl_file_peers import file_thief, fsize_limited, vram_files

from peers import MB, first_diff, pattern
from test_file import direct_dir
from util import Peer

SIZE = 4 * MB
SECRET = "nixl-file-test-cluster-secret-0123456789"
_log = logging.getLogger("nixl")


def setUpModule():
    if np is None:
        raise unittest.SkipTest("numpy is not installed for this python3 (nixl needs it)")
    # Failure tests make agents log warnings on purpose.
    _log.setLevel(logging.CRITICAL if not os.environ.get("TE_NIXL_TEST_LOG") else logging.DEBUG)


def tearDownModule():
    _log.setLevel(logging.NOTSET)


def aligned(n):
    """Page-aligned memory (mmap) as a uint8 array, as KV pools are."""
    m = mmap.mmap(-1, n)
    a = np.frombuffer(m, dtype=np.uint8)
    assert a.ctypes.data % mmap.PAGESIZE == 0
    return a


def wait_state(a, x, timeout=60):
    deadline = time.monotonic() + timeout
    st = a.check_xfer_state(x)
    while st == "PROC":
        if time.monotonic() > deadline:
            raise AssertionError(f"transfer still PROC after {timeout}s")
        time.sleep(0.001)
        st = a.check_xfer_state(x)
    return st


def takes_direct(d):
    try:
        os.close(os.open(os.path.join(d, ".direct-probe"), os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600))
        return True
    except OSError:
        return False
    finally:
        try:
            os.unlink(os.path.join(d, ".direct-probe"))
        except OSError:
            pass


def open_fds_to(path, under=False):
    """The descriptors of this process that name path (under: anything
    below it)."""
    real = os.path.realpath(path)
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if name.startswith(real + os.sep) if under else name == real:
            out.append(int(fd))
    return out


def blocks(base, order, bs, dev=0):
    """Descriptors of blocks base + order[i]*bs: a shuffled order keeps
    them from merging into one request, so each moves as its own I/O."""
    r = np.zeros((len(order), 3), dtype=np.uint64)
    r[:, 0] = np.uint64(base) + np.asarray(order, dtype=np.uint64) * np.uint64(bs)
    r[:, 1] = bs
    r[:, 2] = dev
    return r


class FileSegTest(unittest.TestCase):
    def setUp(self):
        self.dir = direct_dir()
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.a = nixl_agent("files", nixl_agent_config(backends=["POSIX"], capture_telemetry=True))
        self.addCleanup(self.a.close)
        self.src, self.dst = aligned(SIZE + 4096), aligned(SIZE + 4096)
        self.src[:] = np.frombuffer(pattern(3, SIZE + 4096), dtype=np.uint8)
        self.mreg = self.a.register_memory([(self.src.ctypes.data, self.src.nbytes, 0, ""),
                                            (self.dst.ctypes.data, self.dst.nbytes, 0, "")], "DRAM")

    def path(self, name):
        return os.path.join(self.dir, name)

    def buffers(self):
        return self.a.agent._engine.stats()["buffers"]

    def file_stats(self):
        return self.a.agent._engine.stats()["transport_stats"]["file"]

    def round_trip(self, dev, reg_off, bs, path, size=SIZE):
        """WRITE src to the file in shuffled bs-blocks, check the file, READ
        them back into dst, check every byte."""
        a = self.a
        n = size // bs
        order = np.random.default_rng(bs + dev).permutation(n)
        mem = blocks(self.src.ctypes.data, range(n), bs)
        fil = blocks(reg_off, order, bs, dev)
        w = a.initialize_xfer("WRITE", a.get_xfer_descs(mem, "DRAM"), a.get_xfer_descs(fil, "FILE"), a.name)
        self.assertIn(a.transfer(w), ("PROC", "DONE"))
        self.assertEqual(wait_state(a, w), "DONE", w.err_msg)
        self.assertEqual(a.query_xfer_backend(w), "POSIX")
        t = a.get_xfer_telemetry(w)
        self.assertEqual((t.descCount, t.totalBytes, t.backendName), (n, size, "POSIX"))
        with open(path, "rb") as f:
            disk = f.read()
        src = self.src.tobytes()
        for i, b in enumerate(order):
            at = reg_off + int(b) * bs
            self.assertEqual(disk[at:at + bs], src[i * bs:(i + 1) * bs], f"file block {b}")
        self.dst[:] = 0
        r = a.initialize_xfer("READ", a.get_xfer_descs(blocks(self.dst.ctypes.data, range(n), bs), "DRAM"),
                              a.get_xfer_descs(fil, "FILE"), a.name)
        a.transfer(r)
        self.assertEqual(wait_state(a, r), "DONE", r.err_msg)
        self.assertEqual(first_diff(self.dst[:size].tobytes(), src[:size]), -1)
        a.release_xfer_handle(w)
        a.release_xfer_handle(r)

    # -- the two registration modes ------------------------------------------
    def test_path_mode(self):
        direct = takes_direct(self.dir)
        for flags in ("rw,create", "rw,create,direct") if direct else ("rw,create",):
            for bs in (4096, MB):
                with self.subTest(flags=flags, bs=bs):
                    path = self.path(f"p-{flags}-{bs}")
                    n0, b0 = self.buffers(), self.file_stats().get("buffered_ios", 0)
                    freg = self.a.register_memory([(8192, SIZE, 40 + bs, f"{flags}:{path}")], "FILE")
                    self.assertEqual(self.buffers(), n0 + 1)
                    self.assertEqual(os.stat(path).st_mode & 0o777, 0o644 & ~_umask())
                    self.round_trip(40 + bs, 8192, bs, path)
                    if "direct" in flags:  # aligned memory, offsets and lengths: nothing through the page cache
                        self.assertEqual(self.file_stats().get("buffered_ios", 0), b0)
                    self.a.deregister_memory(freg)
                    self.assertEqual(self.buffers(), n0)
                    # The agent's open and te's duplicates are all closed.
                    self.assertEqual(open_fds_to(path), [])

    def test_fd_mode(self):
        for flags in (0, os.O_DIRECT) if takes_direct(self.dir) else (0,):
            for bs in (4096, MB):
                with self.subTest(direct=bool(flags), bs=bs):
                    path = self.path(f"fd-{flags}-{bs}")
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o600)
                    self.addCleanup(os.close, fd)
                    # NIXL's storage examples: a fresh empty file, registered
                    # then written; te extends it to the range at registration.
                    freg = self.a.register_memory([(4096, SIZE, fd, "")], "FILE")
                    self.assertEqual(os.fstat(fd).st_size, 4096 + SIZE)
                    self.round_trip(fd, 4096, bs, path)
                    self.a.deregister_memory(freg)

    def test_length_zero_is_the_file_as_registered(self):
        path = self.path("whole")
        with open(path, "wb") as f:
            f.write(pattern(9, 2 * MB))
        freg = self.a.register_memory([(MB, 0, 7, "ro:" + path)], "FILE")
        a = self.a
        x = a.initialize_xfer("READ", a.get_xfer_descs([(self.dst.ctypes.data, MB, 0)], "DRAM"),
                              a.get_xfer_descs([(MB, MB, 7)], "FILE"), a.name)
        a.transfer(x)
        self.assertEqual(wait_state(a, x), "DONE")
        self.assertEqual(self.dst[:MB].tobytes(), pattern(9, 2 * MB)[MB:])
        with self.assertRaises(nb.nixlNotFoundError):  # past the end it had then
            a.prep_xfer_dlist(a.name, [(2 * MB - 4096, 8192, 7)], "FILE")
        a.release_xfer_handle(x)
        a.deregister_memory(freg)
        empty = self.path("empty")
        open(empty, "wb").close()
        with self.assertRaisesRegex(nb.nixlInvalidParamError, "give the length"):
            a.register_memory([(0, 0, 8, "rw:" + empty)], "FILE")

    def test_unaligned(self):
        path = self.path("odd")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.addCleanup(os.close, fd)
        a = self.a
        freg = a.register_memory([(3, SIZE, fd, "")], "FILE")
        n = 9999
        src = self.src.ctypes.data + 1
        w = a.initialize_xfer("WRITE", a.get_xfer_descs([(src, n, 0), (src + n, 4097, 0)], "DRAM"),
                              a.get_xfer_descs([(4101, n, fd), (3, 4097, fd)], "FILE"), a.name)
        a.transfer(w)
        self.assertEqual(wait_state(a, w), "DONE", w.err_msg)
        data = self.src[1:1 + n + 4097].tobytes()
        self.assertEqual(os.pread(fd, n, 4101), data[:n])
        self.assertEqual(os.pread(fd, 4097, 3), data[n:])
        dst = self.dst.ctypes.data + 5
        r = a.initialize_xfer("READ", a.get_xfer_descs([(dst, n, 0), (dst + n, 4097, 0)], "DRAM"),
                              a.get_xfer_descs([(4101, n, fd), (3, 4097, fd)], "FILE"), a.name)
        a.transfer(r)
        self.assertEqual(wait_state(a, r), "DONE", r.err_msg)
        self.assertEqual(self.dst[5:5 + n + 4097].tobytes(), data)
        a.release_xfer_handle(w)
        a.release_xfer_handle(r)
        a.deregister_memory(freg)

    def test_contiguous_descriptors_merge_within_a_file(self):
        path = self.path("merge")
        freg = self.a.register_memory([(0, MB, 11, "rw,create:" + path)], "FILE")
        a = self.a
        x = a.initialize_xfer("WRITE", a.get_xfer_descs(blocks(self.src.ctypes.data, range(256), 4096), "DRAM"),
                              a.get_xfer_descs(blocks(0, range(256), 4096, 11), "FILE"), a.name)
        self.assertEqual(len(x.reqs), 1)  # one te request for 256 contiguous pairs
        a.transfer(x)
        self.assertEqual(wait_state(a, x), "DONE")
        with open(path, "rb") as f:
            self.assertEqual(f.read(), self.src[:MB].tobytes())
        a.release_xfer_handle(x)
        a.deregister_memory(freg)

    def test_one_list_many_files(self):
        # Descriptors of three files interleaved in one list (and one file
        # registered in two ranges): each lands in its own file.
        a = self.a
        paths = [self.path(f"m{i}") for i in range(3)]
        fd = os.open(paths[2], os.O_RDWR | os.O_CREAT, 0o600)
        self.addCleanup(os.close, fd)
        freg = a.register_memory([(0, MB, 50, "rw,create:" + paths[0]), (0, MB, 51, "rw,create:" + paths[1]),
                                  (0, MB // 2, fd, ""), (MB // 2, MB // 2, fd, "")], "FILE")
        n = 3 * 64
        fil = np.zeros((n, 3), dtype=np.uint64)
        fil[:, 0] = (np.arange(n, dtype=np.uint64) // 3) * 16384
        fil[:, 1] = 4096
        fil[:, 2] = np.array([50, 51, fd] * 64, dtype=np.uint64)
        mem = blocks(self.src.ctypes.data, range(n), 4096)
        x = a.initialize_xfer("WRITE", a.get_xfer_descs(mem, "DRAM"), a.get_xfer_descs(fil, "FILE"), a.name)
        a.transfer(x)
        self.assertEqual(wait_state(a, x), "DONE", x.err_msg)
        src = self.src.tobytes()
        for f, p in enumerate(paths):
            with open(p, "rb") as fh:
                disk = fh.read()
            for k in range(64):
                i = 3 * k + f
                self.assertEqual(disk[k * 16384:k * 16384 + 4096], src[i * 4096:(i + 1) * 4096], (p, k))
        a.release_xfer_handle(x)
        a.deregister_memory(freg)

    # -- deregistration ----------------------------------------------------------
    def test_deregister_idle(self):
        a = self.a
        path = self.path("idle")
        n0 = self.buffers()
        d = a.get_reg_descs([(0, MB, 21, "rw,create:" + path)], "FILE")
        a.register_memory(d)
        a.register_memory(d)  # twice: te holds it once, NIXL counts two
        self.assertEqual(self.buffers(), n0 + 1)
        x = a.initialize_xfer("WRITE", a.get_xfer_descs([(self.src.ctypes.data, 4096, 0)], "DRAM"),
                              a.get_xfer_descs([(0, 4096, 21)], "FILE"), a.name)
        pl = a.prep_xfer_dlist(a.name, [(0, 4096, 21)], "FILE")
        a.deregister_memory(d)
        self.assertEqual(self.buffers(), n0 + 1)
        a.deregister_memory(d)
        self.assertEqual(self.buffers(), n0)
        with self.assertRaises(nb.nixlNotFoundError):
            a.deregister_memory(d)
        # What was made before refuses to run, even once te reserved the
        # same addresses for another file.
        a.register_memory([(0, MB, 22, "rw,create:" + self.path("other"))], "FILE")
        self.assertEqual(a.transfer(x), "ERR")
        self.assertIn("deregistered", x.err_msg)
        lp = a.prep_xfer_dlist("", [(self.src.ctypes.data, 4096, 0)], "DRAM")
        with self.assertRaisesRegex(nb.nixlNotFoundError, "deregistered"):
            a.make_prepped_xfer("WRITE", lp, [0], pl, [0])
        with self.assertRaises(nb.nixlNotFoundError):
            a.prep_xfer_dlist(a.name, [(0, 4096, 21)], "FILE")
        with open(self.path("other"), "rb") as f:
            self.assertEqual(f.read(), b"\0" * MB)
        self.assertEqual(open_fds_to(path), [])
        a.release_xfer_handle(x)

    def test_deregister_in_flight(self):
        # 32 MiB in 8192 separate 4 KiB I/Os, then the file is deregistered
        # at once: deregistration returns only once te no longer touches
        # the file or the memory, and the transfer ends (DONE or ERR).
        a = self.a
        size, bs = 32 * MB, 4096
        big_src, big_dst = aligned(size), aligned(size)
        big_src[:] = 0x5A
        mreg = a.register_memory([(big_src.ctypes.data, size, 0, ""), (big_dst.ctypes.data, size, 0, "")], "DRAM")
        order = np.random.default_rng(1).permutation(size // bs)
        for op, mem in (("READ", big_dst), ("WRITE", big_src)):
            with self.subTest(op=op):
                path = self.path(f"flight-{op}")
                with open(path, "wb") as f:
                    f.write(b"\xa5" * size)
                freg = a.register_memory([(0, size, 31, "rw:" + path)], "FILE")
                x = a.initialize_xfer(op, a.get_xfer_descs(blocks(mem.ctypes.data, range(size // bs), bs), "DRAM"),
                                      a.get_xfer_descs(blocks(0, order, bs, 31), "FILE"), a.name)
                a.transfer(x)
                a.deregister_memory(freg)
                # Nothing may land after this point: mark the memory and
                # read the file, then check both once the transfer ended.
                big_dst[:] = 0xEE
                with open(path, "rb") as f:
                    disk = f.read()
                self.assertIn(wait_state(a, x), ("DONE", "ERR"))
                self.assertTrue((big_dst == 0xEE).all(), "memory written after deregistration returned")
                with open(path, "rb") as f:
                    self.assertEqual(f.read(), disk, "file written after deregistration returned")
                self.assertEqual(open_fds_to(path), [])
                a.release_xfer_handle(x)
        a.deregister_memory(mreg)

    # -- what is refused ---------------------------------------------------------
    def test_refused(self):
        a = self.a
        path = self.path("f")
        with open(path, "wb") as f:
            f.write(b"x" * MB)
        cases = [
            ((0, 4096, 1, "rw:" + self.path("absent")), nb.nixlBackendError, "No such file"),
            ((0, 4096, 1, "ro,direct:" + self.dir + "/nodir/x"), nb.nixlBackendError, "cannot open"),
            ((0, 4096, 1, "rw,drect:" + path), nb.nixlInvalidParamError, "unknown flag 'drect'"),
            ((0, 4096, _closed_fd(), ""), nb.nixlInvalidParamError, "bad file descriptor"),
            ((0, 4096, 1 << 40, "kv-block.bin"), nb.nixlInvalidParamError, "not a file descriptor"),
            ((0, 2 * MB, 1, "ro:" + path), nb.nixlInvalidParamError, "shorter than the range"),
        ]
        dfd = os.open(self.dir, os.O_RDONLY)
        self.addCleanup(os.close, dfd)
        cases.append(((0, 4096, dfd, ""), nb.nixlInvalidParamError, "not a regular file"))
        afd = os.open(path, os.O_RDWR | os.O_APPEND)  # pwrite would ignore the offsets
        self.addCleanup(os.close, afd)
        cases.append(((0, 4096, afd, ""), nb.nixlInvalidParamError, "O_APPEND"))
        for desc, exc, msg in cases:
            with self.subTest(desc=desc), self.assertRaisesRegex(exc, msg):
                a.register_memory([desc], "FILE")
        self.assertEqual(set(open_fds_to(self.dir, under=True)), {afd})  # nothing else left open
        n0 = self.buffers()
        # All or none: the good first descriptor is undone with the bad second.
        with self.assertRaises(nb.nixlBackendError):
            a.register_memory([(0, 4096, 2, "ro:" + path), (0, 4096, 3, "ro:" + self.path("absent"))], "FILE")
        self.assertEqual(self.buffers(), n0)
        # Path mode needs a device id per file; one fd's ranges may not overlap.
        ok = a.register_memory([(0, 4096, 2, "ro:" + path)], "FILE")
        with self.assertRaisesRegex(nb.nixlInvalidParamError, "device id of its own"):
            a.register_memory([(8192, 4096, 2, "ro:" + path)], "FILE")
        fd = os.open(path, os.O_RDWR)
        self.addCleanup(os.close, fd)
        two = a.register_memory([(0, 8192, fd, ""), (8192, 8192, fd, "")], "FILE")
        with self.assertRaisesRegex(nb.nixlInvalidParamError, "overlaps"):
            a.register_memory([(4096, 8192, fd, "")], "FILE")
        with self.assertRaisesRegex(nb.nixlInvalidParamError, "registered already with metadata"):
            a.register_memory([(0, 4096, 2, "rw:" + path)], "FILE")
        # Transfers: memory is the local side, FILE the agent's own remote
        # side; storage backends send no notifications; a descriptor past a
        # registration (even into the next one) is not inside one file.
        mem = a.get_xfer_descs([(self.src.ctypes.data, 4096, 0)], "DRAM")
        fil = a.get_xfer_descs([(0, 4096, 2)], "FILE")
        with self.assertRaisesRegex(nb.nixlInvalidParamError, "remote side"):
            a.initialize_xfer("WRITE", fil, mem, a.name)
        with self.assertRaisesRegex(nb.nixlBackendError, "notifications"):
            a.initialize_xfer("WRITE", mem, fil, a.name, b"done")
        with self.assertRaises(nb.nixlNotFoundError):
            a.prep_xfer_dlist(a.name, [(4096, 8192, fd)], "FILE")
        with self.assertRaises(nb.nixlNotFoundError):
            a.prep_xfer_dlist(a.name, [(0, 4096, 99)], "FILE")
        x = a.initialize_xfer("WRITE", mem, fil, a.name)
        with self.assertRaisesRegex(nb.nixlBackendError, "notifications"):
            a.transfer(x, b"late")
        # Written into a file opened read-only: the transfer fails with te's
        # reason, the file keeps its bytes.
        st = a.transfer(x)
        self.assertEqual(wait_state(a, x) if st == "PROC" else st, "ERR")
        self.assertIn("read-only", x.err_msg)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"x" * MB)
        a.release_xfer_handle(x)
        # No storage backend: nothing holds FILE.
        u = nixl_agent("ucx-only")
        self.addCleanup(u.close)
        with self.assertRaises(nb.nixlNotFoundError):
            u.register_memory([(0, 4096, 2, "ro:" + path)], "FILE")
        a.deregister_memory(two)
        a.deregister_memory(ok)

    def test_files_are_local(self):
        # NIXL's storage backends are local: files stay out of the metadata
        # and another agent cannot reach them.
        a = self.a
        freg = a.register_memory([(0, MB, 5, "rw,create:" + self.path("local"))], "FILE")
        b = nixl_agent("peer")
        self.addCleanup(b.close)
        self.assertEqual(b.add_remote_agent(a.get_agent_metadata()), b"files")
        fil = b.get_xfer_descs([(0, 4096, 5)], "FILE")
        self.assertFalse(b.check_remote_metadata("files", fil))
        b.create_backend("POSIX")
        with self.assertRaisesRegex(nb.nixlNotSupportedError, "local storage"):
            b.prep_xfer_dlist("files", fil)
        with self.assertRaisesRegex(nb.nixlNotSupportedError, "local storage"):
            a.get_partial_agent_metadata(freg, inc_conn_info=True)
        self.assertEqual(a.query_memory(freg, "POSIX")[0]["size"], str(MB))
        a.deregister_memory(freg)

    def test_query_memory_unchanged(self):
        path = self.path("q")
        with open(path, "wb") as f:
            f.write(b"12345")
        q = self.a.query_memory([(0, 0, 0, path), (0, 0, 0, "rw:" + path), (0, 0, 0, self.path("none"))],
                                "POSIX", "FILE")
        self.assertEqual([r and r["size"] for r in q], ["5", "5", None])


class PrivateFilesTest(unittest.TestCase):
    """Files registered through NIXL are private te file segments: another
    engine with the cluster secret cannot reach them (te issue 30, item
    10), and path mode's create does not follow a planted link."""

    N = 64 << 10

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, True)
        old = os.environ.get("TE_AUTH_SECRET")
        os.environ["TE_AUTH_SECRET"] = SECRET  # read when the agent is made
        try:
            self.a = nixl_agent("owner", nixl_agent_config(backends=["POSIX"]))
        finally:
            if old is None:
                del os.environ["TE_AUTH_SECRET"]
            else:
                os.environ["TE_AUTH_SECRET"] = old
        self.addCleanup(self.a.close)

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_another_engine_with_the_secret_is_refused(self):
        # Another process's engine holds the secret and knows the agent's
        # te segment and the te addresses of its files ("ro" and "rw"): it
        # sees no file in the segment, its READs and WRITEs are refused and
        # the files keep their bytes. (Over tcp with the right key as well:
        # engine/transport/tcp TestPrivateFileRefusedOverTCP.)
        a, n = self.a, self.N
        data = {1: pattern(61, n), 2: pattern(62, n)}
        for dev, access in ((1, "ro"), (2, "rw")):
            with open(self.path(access), "wb") as f:
                f.write(data[dev])
        freg = a.register_memory([(0, n, 1, "ro:" + self.path("ro")), (0, n, 2, "rw:" + self.path("rw"))], "FILE")
        addrs = {r.dev: r.addr for r in a.agent._files.regs.values()}
        thief = Peer(file_thief, SECRET, a.agent._segname, [(addrs[1], n), (addrs[2], n)])
        try:
            seen, out = thief.recv()
        finally:
            thief.close()
        self.assertEqual(seen, [], "the agent's files are in its te descriptor")
        self.assertEqual(len(out), 4)
        for op, addr, outcome, got in out:
            self.assertNotEqual(outcome, "COMPLETED", f"another engine's {op} of the file at {addr:#x}")
            if op == "read":
                self.assertEqual(got, b"\xee" * n, "file bytes reached another engine")
        for dev, access in ((1, "ro"), (2, "rw")):
            with open(self.path(access), "rb") as f:
                self.assertEqual(f.read(), data[dev], f"the {access} file changed")
        # The agent's own transfers reach them: READ "ro", WRITE it into "rw".
        m = aligned(n)
        mreg = a.register_memory([(m.ctypes.data, n, 0, "")], "DRAM")
        mem = a.get_xfer_descs([(m.ctypes.data, n, 0)], "DRAM")
        r = a.initialize_xfer("READ", mem, a.get_xfer_descs([(0, n, 1)], "FILE"), a.name)
        a.transfer(r)
        self.assertEqual(wait_state(a, r), "DONE", r.err_msg)
        self.assertEqual(m.tobytes(), data[1])
        w = a.initialize_xfer("WRITE", mem, a.get_xfer_descs([(0, n, 2)], "FILE"), a.name)
        a.transfer(w)
        self.assertEqual(wait_state(a, w), "DONE", w.err_msg)
        with open(self.path("rw"), "rb") as f:
            self.assertEqual(f.read(), data[1])
        for x in (r, w):
            a.release_xfer_handle(x)
        a.deregister_memory(freg)
        a.deregister_memory(mreg)

    def test_create_does_not_follow_a_planted_link(self):
        # "rw,create:<path>" where someone planted a symbolic link to another
        # file: refused (O_NOFOLLOW), the other file neither grown nor
        # written.
        victim, link = self.path("victim"), self.path("planted")
        with open(victim, "wb") as f:
            f.write(b"keep" * 1024)
        os.symlink(victim, link)
        with self.assertRaises(nb.nixlBackendError) as cm:
            self.a.register_memory([(0, MB, 7, "rw,create:" + link)], "FILE")
        self.assertIn("ELOOP", str(cm.exception))
        with open(victim, "rb") as f:
            self.assertEqual(f.read(), b"keep" * 1024)
        self.assertEqual(self.a.agent._files.regs, {})
        # A plain path still creates its file.
        freg = self.a.register_memory([(0, MB, 7, "rw,create:" + self.path("fresh"))], "FILE")
        self.assertEqual(os.path.getsize(self.path("fresh")), MB)
        self.a.deregister_memory(freg)


class FullDiskTest(unittest.TestCase):
    def test_file_size_limit(self):
        # EFBIG past RLIMIT_FSIZE, in a child (the limit is per process):
        # only the transfer that hit it fails, with te's NoSpace.
        d = direct_dir()
        self.addCleanup(shutil.rmtree, d, True)
        p = Peer(fsize_limited, os.path.join(d, "limited"), MB)
        states, code, msg, landed = p.recv()
        p.close()
        self.assertEqual(states, ["DONE", "ERR"])
        self.assertEqual(code, te.NoSpace.code, msg)
        self.assertIn("file size limit", msg)
        self.assertTrue(landed)

    def test_full_tmpfs(self):
        # A 1 MiB tmpfs (mounted here, as te's Go tests do; needs root).
        d = tempfile.mkdtemp()
        self.addCleanup(os.rmdir, d)
        try:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d], check=True, capture_output=True,
                           timeout=30)
        except (OSError, subprocess.SubprocessError):
            self.skipTest("cannot mount a tmpfs here (needs root)")
        self.addCleanup(subprocess.run, ["umount", d], check=True, timeout=30)
        a = nixl_agent("full", nixl_agent_config(backends=["POSIX"]))
        self.addCleanup(a.close)
        src = aligned(2 * MB)
        src[:] = 0x3C
        mreg = a.register_memory([(src.ctypes.data, 2 * MB, 0, "")], "DRAM")
        path = os.path.join(d, "kv")
        freg = a.register_memory([(0, 2 * MB, 1, "rw,create:" + path)], "FILE")  # sparse: fits until written
        xs = [a.initialize_xfer("WRITE", a.get_xfer_descs([(src.ctypes.data + o, MB, 0)], "DRAM"),
                                a.get_xfer_descs([(o, MB, 1)], "FILE"), "full") for o in (0, MB)]
        states = []
        for x in xs:
            a.transfer(x)
            states.append(wait_state(a, x))
        self.assertEqual(states.count("ERR"), 1, states)  # one MiB fits, the second does not
        bad = xs[states.index("ERR")]
        self.assertEqual(bad.err, te.NoSpace.code, bad.err_msg)
        for x in xs:
            a.release_xfer_handle(x)
        a.deregister_memory(freg)
        a.deregister_memory(mreg)
        a.close()


class VramFileTest(unittest.TestCase):
    def test_vram_to_file_and_back(self):
        from test_nixl import build_fake_cuda

        fake = build_fake_cuda()
        if fake is None:
            self.skipTest("the fake CUDA driver cannot be built here (no source tree or no C compiler)")
        self.addCleanup(shutil.rmtree, os.path.dirname(fake), True)
        d = direct_dir()
        self.addCleanup(shutil.rmtree, d, True)
        p = Peer(vram_files, fake, os.path.join(d, "vram"), SIZE, env={"TE_CUDA_LIBRARY": fake})
        states, files_ok, back_ok, backend, refused = p.recv()
        p.close()
        self.assertEqual(states, ["DONE"] * 4)
        self.assertEqual(files_ok, [True, True])
        self.assertEqual(back_ok, [True, True])
        self.assertEqual(backend, "GDS")
        self.assertEqual(refused, "nixlNotFoundError")


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def _closed_fd():
    """A descriptor number that cannot be open: past this process's limit."""
    return min(resource.getrlimit(resource.RLIMIT_NOFILE)[0] + 16, 0x7FFFFFFF)


if __name__ == "__main__":
    unittest.main()
