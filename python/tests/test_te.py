"""Tests of the native binding (python/te) against a real libte.so."""

import ctypes
import os
import re
import select
import subprocess
import sys
import threading
import unittest

import te
from peers import MB, first_diff, pattern, te_target
from util import HERE, Peer, requires_numpy, wait_until


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
        c = [str(p) for p in te._lib.candidates()]
        own = os.path.join(os.path.dirname(os.path.abspath(te.__file__)), "libte.so")
        env = os.environ.get("TE_LIBRARY")
        self.assertEqual(c[0], env if env else own)
        self.assertIn(own, c)
        # The repository's build/ folder only from a source checkout.
        checkout = os.path.exists(os.path.join(os.path.dirname(os.path.dirname(own)), "..", "go.mod"))
        self.assertEqual(any(p.endswith(os.path.join("build", "libte.so")) for p in c), checkout)

    @unittest.skipUnless(os.environ.get("TE_TEST_INSTALLED"), "runs against the installed wheel (make test-python)")
    def test_installed_package_bundles_the_library(self):
        # make test-python installs the wheel into a fresh venv and runs
        # these tests there with no TE_LIBRARY and no PYTHONPATH.
        self.assertNotIn("TE_LIBRARY", os.environ)
        repo_python = os.path.abspath(os.path.join(HERE, ".."))
        self.assertFalse(os.path.abspath(te.__file__).startswith(repo_python + os.sep), te.__file__)
        te.load()
        self.assertEqual(str(te.library_path()), os.path.join(os.path.dirname(os.path.abspath(te.__file__)), "libte.so"))


class LayoutTest(unittest.TestCase):
    """The ctypes structs match te.h's, field by field: a C program compiled
    against te.h prints every offset and size."""

    STRUCTS = {
        "te_config_t": te._lib.Config, "te_stats_t": te._lib.Stats, "te_task_status_t": te._lib.TaskStatus,
        "te_batch_status_t": te._lib.BatchStatus, "te_probe_t": te._lib.Probe, "te_region_t": te._lib.Region,
        "te_request_t": te._lib.Request, "te_notify_t": te._lib.Notify, "te_notify_from_t": te._lib.NotifyFrom,
        "te_buffer_desc_t": te._lib.BufferDesc,
        "te_layout_info_t": te._lib.LayoutInfo, "te_span_t": te._lib.Span, "te_plan_transfer_t": te._lib.PlanTransfer,
        "te_plan_stats_t": te._lib.PlanStats, "te_handoff_result_t": te._lib.HandoffResult,
        "te_handoff_status_t": te._lib.HandoffStatus,
        "te_range_t": te._lib.Range,
    }

    def test_structs_match_header(self):
        import shutil
        import tempfile

        header = os.path.join(HERE, "..", "..", "include")
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None or not os.path.exists(os.path.join(header, "te.h")):
            self.skipTest("needs a C compiler and te.h")
        lines = ["#include <stdio.h>", "#include <stddef.h>", "#include \"te.h\"", "int main(void) {"]
        for cname, cls in self.STRUCTS.items():
            lines.append(f'printf("{cname} #sizeof %zu\\n", sizeof({cname}));')
            for field, _ in cls._fields_:
                lines.append(f'printf("{cname} {field} %zu\\n", offsetof({cname}, {field}));')
        lines += ["return 0;", "}"]
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
            with open(src, "w") as f:
                f.write("\n".join(lines))
            subprocess.run([cc, "-I", header, src, "-o", exe], check=True, timeout=60)
            out = subprocess.run([exe], check=True, capture_output=True, text=True, timeout=60).stdout
        for line in out.splitlines():
            cname, what, value = line.split()
            cls = self.STRUCTS[cname]
            got = ctypes.sizeof(cls) if what == "#sizeof" else getattr(cls, what).offset
            self.assertEqual(got, int(value), f"{cname}.{what}")


class ConfigTest(unittest.TestCase):
    def test_abi_1_2_fields(self):
        with te.Engine(listen_addr="127.0.0.1:0", auth_secret="s3cret-cluster-secret-0123", unregister_grace=1.5,
                       limits={"max_conns": 64, "max_conns_per_host": 8, "idle_timeout": 60,
                               "progress_timeout": 5, "notify_bytes": 1 << 20,
                               "notify_bytes_per_sender": 1 << 18}) as e:
            self.assertTrue(e.name)
        with te.Engine(listen_addr="127.0.0.1:0", limits=te.Limits(max_conns=16), accept_mooncake_peers=True) as e:
            self.assertTrue(e.name)
        with tempfile_secret() as path:
            with te.Engine(listen_addr="127.0.0.1:0", auth_secret_file=path) as e:
                self.assertTrue(e.name)
        for bad in ({"bogus": 1}, {"max_conns": -1}, {"idle_timeout": -2}, {"notify_bytes": 1 << 64}):
            with self.assertRaises(te.InvalidArgument, msg=bad):
                te.Engine(listen_addr="127.0.0.1:0", limits=bad)
        with self.assertRaises(te.InvalidArgument):
            te.Engine(listen_addr="127.0.0.1:0", unregister_grace=-1)
        with self.assertRaises(TypeError):
            te.Engine(listen_addr="127.0.0.1:0", limits=[1])
        self.assertEqual(repr(te.Limits(max_conns=3)), "Limits(max_conns=3)")

    def test_notification_senders(self):
        """notifies(senders=True) gives the sender's proven segment and
        instance with a secret, "" without one, whatever the name claims."""
        for secret in ("s3cret-cluster-secret-0123", None):
            kw = {"auth_secret": secret} if secret else {}
            with te.Engine(listen_addr="127.0.0.1:0", **kw) as a, te.Engine(listen_addr="127.0.0.1:0", **kw) as b:
                a.send_notify(b.name, "nixl/n/not-a", b"x")
                got = []
                for _ in range(500):
                    got = b.notifies(senders=True)
                    if got:
                        break
                    threading.Event().wait(0.01)
                want = (a.name, a.probe(a.name)["instance"]) if secret else ("", "")
                self.assertEqual(got, [("nixl/n/not-a", b"x") + want])

    def test_windows(self):
        """grant_window to a peer and as a bearer key, revoke_window, and the refusals."""
        buf = (ctypes.c_char * (1 << 16))()
        priv = (ctypes.c_char * 4096)()
        with te.Engine(listen_addr="127.0.0.1:0") as e:
            a = e.register(buf)
            p = e.register(priv, remote=False)
            bound = e.grant_window([(a, 4096), (a + 8192, 4096)], peer="peer:1")
            bearer = e.grant_window([(a, 4096)])
            self.assertNotEqual(bound, 0)
            self.assertNotEqual(bound, bearer)
            with self.assertRaises(te.InvalidArgument):
                e.grant_window([])
            with self.assertRaises(te.AccessDenied):
                e.grant_window([(p, 4096)], peer="peer:1")
            with self.assertRaises(te.AddressNotRegistered):
                e.grant_window([(a + (1 << 16), 4096)])
            e.revoke_window(bound)
            with self.assertRaises(te.NotFound):
                e.revoke_window(bound)
            e.revoke_window(bearer)

    def test_send_under_window(self):
        """Requests under a window the target granted (Batch.submit's window= and a request's 6th
        item, te_submit_windows) over tcp: inside the window they land; outside its ranges, under a
        key never granted or after the revoke they are refused and land nothing; no window is the
        plain submit, the whole buffer reachable."""
        kw = {"listen_addr": "127.0.0.1:0", "transports": "tcp", "force_transport": "tcp", "rpc_timeout": 3}
        n, win = 64 << 10, 16 << 10
        with te.Engine(**kw) as owner, te.Engine(**kw) as peer:
            dst = (ctypes.c_char * n)()
            src = bytearray(pattern(5, n))
            d = owner.register(dst)
            s = peer.register(src, remote=False)
            key = owner.grant_window([(d, win)])
            with peer.open_segment(owner.name) as seg:
                def landed(off, length=4096):
                    return dst.raw[off:off + length] == bytes(src[off:off + length])

                st = peer.write(seg, s, d, 4096, window=key)
                self.assertEqual((st.state, st.completed), (te.COMPLETED, 1))
                self.assertTrue(landed(0))
                with peer.allocate_batch(3) as b:
                    # Per request: the 6th item; window= covers the requests that name none, and a 0
                    # item is no window (the buffer's key, past the window).
                    b.submit([(te.WRITE, s + 4096, seg, d + 4096, 4096, key),
                              (te.WRITE, s + 8192, seg, d + 8192, 4096),
                              (te.WRITE, s + 2 * win, seg, d + 2 * win, 4096, 0)],
                             window=key, notify=(owner.name, "win", b"landed"))
                    self.assertEqual(b.wait(10).completed, 3)
                    self.assertEqual(b.task_status(0)[3], "tcp")
                self.assertTrue(landed(4096) and landed(8192) and landed(2 * win))
                self.assertEqual(owner.notifies(), [("win", b"landed")])  # delivered before wait returned
                with self.assertRaises(te.InvalidArgument):
                    peer.transfer([(te.WRITE, s, seg, d)])
                ctypes.memset(dst, 0, n)

                # Refused: past the window, straddling its end; nothing lands.
                for off in (win, win - 2048):
                    with self.assertRaises(te.AccessDenied, msg=off):
                        peer.write(seg, s + off, d + off, 4096, window=key)
                with self.assertRaises(te.AccessDenied):
                    peer.transfer([(te.WRITE, s + win, seg, d + win, 4096, key)])
                # A window key the owner never granted, or revoked: refused.
                with self.assertRaises(te.AccessDenied):
                    peer.write(seg, s, d, 4096, window=key ^ (0x5A5A << 40))
                self.assertEqual(dst.raw, bytes(n))
                owner.revoke_window(key)
                with self.assertRaises(te.AccessDenied):
                    peer.write(seg, s, d, 4096, window=key)
                self.assertEqual(dst.raw, bytes(n))
                peer.write(seg, s, d, 4096)  # the buffer's own key still goes
                self.assertTrue(landed(0))

    def test_window_bound_to_peer(self):
        """With a cluster secret, a window granted with grant_window(peer=...) carries the grantee's
        requests, and a third engine holding the secret and the key is refused (AccessDenied) and
        lands nothing."""
        kw = {"listen_addr": "127.0.0.1:0", "transports": "tcp", "force_transport": "tcp", "rpc_timeout": 3,
              "auth_secret": "window-cluster-secret-0123456789"}
        with te.Engine(**kw) as owner, te.Engine(**kw) as grantee, te.Engine(**kw) as other:
            dst = (ctypes.c_char * 8192)()
            src = bytearray(pattern(6, 4096))
            d = owner.register(dst)
            key = owner.grant_window([(d, 8192)], peer=grantee.name)
            for e in (other, grantee):
                e.register(src, remote=False)
            with other.open_segment(owner.name) as seg:
                with self.assertRaises(te.AccessDenied):
                    other.write(seg, src, d, window=key)
            self.assertEqual(dst.raw, bytes(8192))
            with grantee.open_segment(owner.name) as seg:
                st = grantee.write(seg, src, d + 4096, window=key)
            self.assertEqual((st.state, st.transferred), (te.COMPLETED, 4096))
            self.assertEqual(dst.raw, bytes(4096) + bytes(src))
            owner.revoke_window(key)

    def test_window_first_user(self):
        """With a cluster secret, a window granted with grant_window(first=True) is bound to the
        first engine that writes under it; a third engine holding the secret and the key is then
        refused (AccessDenied) and lands nothing, and bind_window to it says another engine used
        the window first."""
        kw = {"listen_addr": "127.0.0.1:0", "transports": "tcp", "force_transport": "tcp", "rpc_timeout": 3,
              "auth_secret": "window-cluster-secret-0123456789"}
        with te.Engine(**kw) as owner, te.Engine(**kw) as first, te.Engine(**kw) as other:
            dst = (ctypes.c_char * 8192)()
            src = bytearray(pattern(7, 4096))
            d = owner.register(dst)
            key = owner.grant_window([(d, 8192)], first=True)
            for e in (other, first):
                e.register(src, remote=False)
            with first.open_segment(owner.name) as seg:
                st = first.write(seg, src, d + 4096, window=key)
            self.assertEqual((st.state, st.transferred), (te.COMPLETED, 4096))
            with other.open_segment(owner.name) as seg:
                with self.assertRaises(te.AccessDenied):
                    other.write(seg, src, d, window=key)
            self.assertEqual(dst.raw, bytes(4096) + bytes(src))
            with self.assertRaises(te.AccessDenied):
                owner.bind_window(key, other.name)
            owner.bind_window(key, first.name)
            with self.assertRaises(te.InvalidArgument):
                owner.bind_window(owner.grant_window([(d, 4096)]), first.name)
            owner.revoke_window(key)
            with self.assertRaises(te.NotFound):
                owner.bind_window(key, first.name)

    def test_new_error_classes(self):
        self.assertIs(te.error_for(22, "m").__class__, te.AuthError)
        self.assertIsInstance(te.error_for(22, "m"), PermissionError)
        self.assertIs(te.error_for(23, "m").__class__, te.ForkError)
        self.assertIsInstance(te.error_for(23, "m"), RuntimeError)
        self.assertIs(te.error_for(24, "m").__class__, te.ResourceExhausted)
        # Every TE_ERR_ of te.h has its class.
        with open(os.path.join(HERE, "..", "..", "include", "te.h")) as f:
            codes = {-int(v) for v in re.findall(r"(?m)^#define TE_ERR_\w+ \((-\d+)\)", f.read())}
        self.assertEqual(codes, set(te.BY_CODE))

    def test_local_topology(self):
        topo = te.local_topology()
        self.assertIsInstance(topo, dict)
        for loc, (pref, other) in topo.items():
            self.assertRegex(loc, r"^(cpu|cuda):\d+$")
            self.assertFalse(set(pref) & set(other))
        self.assertEqual(te.local_topology(["no-such-nic"]).keys(), topo.keys())


class tempfile_secret:
    """A secret file, removed afterwards."""

    def __enter__(self):
        import tempfile

        fd, self.path = tempfile.mkstemp()
        os.write(fd, b"file-cluster-secret-0123456789\n")
        os.close(fd)
        return self.path

    def __exit__(self, *exc):
        os.unlink(self.path)


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
                last = {}

                def two_notes():  # the batch's notify may arrive after completion
                    last.update(peer.ask("check"))
                    notes.extend(last["notifies"])
                    return len(notes) >= 2

                wait_until(two_notes, what="both notifications")
                res = last
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


class StoreTest(unittest.TestCase):
    """te.Store over mem:// (one process; etcd is in test_nixl_etcd.py)."""

    def test_put_get_delete(self):
        with te.Store("mem://store-test") as s, te.Store("mem://store-test") as other:
            with self.assertRaises(te.NotFound):
                s.get("/k")
            s.put("/k", b"v1")
            self.assertEqual(other.get("/k"), b"v1")  # one mem:// name, one store
            big = pattern(3, 200 << 10)  # over get's first buffer: read again with its size
            s.put("/big", big)
            self.assertEqual(s.get("/big"), big)
            s.put("/empty", b"")
            self.assertEqual(s.get("/empty"), b"")
            s.delete("/k")
            s.delete("/k")
            with self.assertRaises(te.NotFound):
                other.get("/k")
            with self.assertRaises(te.InvalidArgument):
                s.put("", b"x")
            with self.assertRaises(te.TooLarge):
                s.get("k" * 5000)
        self.assertTrue(s.closed)
        with self.assertRaises(te.Closed):
            s.get("/big")

    def test_bad_connection_strings(self):
        with self.assertRaises(te.InvalidArgument):
            te.Store("P2PHANDSHAKE")
        with self.assertRaises(te.NotSupported):
            te.Store("nosuch://x")
        with te.Store("mem://store-test") as s:
            with self.assertRaises(te.NotSupported):
                s.watch("/")  # only etcd pushes changes
            self.assertEqual(s.changes(), [])


if __name__ == "__main__":
    unittest.main()
