"""Authentication and fences through the Python binding, across processes:
a peer without the cluster secret gets te.AuthError and nothing else; once
wait() reports a task over, nothing lands in its memory; cancel() and reset()
end and reuse a batch; the Mooncake drop-in takes the secret from
TE_AUTH_SECRET_FILE."""

import os
import signal
import tempfile
import time
import unittest

import te

from peers import te_secret_target
from util import Peer, stop

SECRET = "python-fence-cluster-secret-0123456789"
BLOCK = 64 << 10
N = 32


class FenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.peer = Peer(te_secret_target, 4 << 20, 0x11, env={"TE_AUTH_SECRET": SECRET})
        cls.name, cls.raddr, cls.pid = cls.peer.recv()

    @classmethod
    def tearDownClass(cls):
        os.kill(cls.pid, signal.SIGCONT)
        cls.peer.ask("exit")
        cls.peer.close()

    def engine(self, progress_timeout=1, **kw):
        e = te.Engine(listen_addr="127.0.0.1:0", hostname="127.0.0.1", transports="tcp", force_transport="tcp",
                      transfer_timeout=1, unregister_grace=0.2, limits=te.Limits(progress_timeout=progress_timeout), **kw)
        self.addCleanup(e.close)
        return e

    def test_without_secret_refused(self):
        e = self.engine()
        with self.assertRaises(te.AuthError) as cm:
            e.open_segment(self.name)
        self.assertIn("requires the cluster secret", str(cm.exception))
        with self.assertRaises(te.AuthError):
            e.probe(self.name)

    def test_other_secret_refused(self):
        e = self.engine(auth_secret="another-cluster-secret-abcdefghij")
        with self.assertRaises(te.AuthError) as cm:
            e.open_segment(self.name)
        self.assertIn("holds none", str(cm.exception))

    def stalled(self, progress_timeout=1):
        """An engine with the secret, its registered local buffer, and a
        batch of N reads from the target whose connections are already up
        (so stopping the target stalls them mid-way)."""
        e = self.engine(auth_secret=SECRET, progress_timeout=progress_timeout)
        local = bytearray(N * BLOCK)
        e.register(local, remote=False)
        seg = e.open_segment(self.name)
        b = e.allocate_batch(N)
        self.addCleanup(b.free)
        reqs = [(te.READ, te.address_of(local)[0] + i * BLOCK, seg, self.raddr + i * BLOCK, BLOCK) for i in range(N)]
        b.submit(reqs[:1])  # connections up before the stall
        self.assertEqual(b.wait(10).state_name, "COMPLETED")
        b.reset()
        return e, local, b, reqs

    def test_timeout_is_a_fence(self):
        # The transfer timeout (1 s) ends the reads, not the progress
        # timeout, which bounds a silent peer too: it is longer here.
        e, local, b, reqs = self.stalled(progress_timeout=5)
        stop(self.pid)
        try:
            b.submit(reqs)
            with self.assertRaises(te.Timeout):
                b.wait(20)
            self.assertEqual(b.status().state_name, "TIMEOUT")
            local[:] = b"\xc3" * len(local)
        finally:
            os.kill(self.pid, signal.SIGCONT)
        time.sleep(0.3)
        self.assertEqual(bytes(local), b"\xc3" * len(local), "a byte landed after wait() reported TIMEOUT")

    def test_cancel_and_reset(self):
        e, local, b, reqs = self.stalled()
        stop(self.pid)
        try:
            b.submit(reqs)
            b.cancel()
            try:
                b.wait(20)
            except (te.Canceled, te.Timeout):
                pass
            st = b.status()
            self.assertNotEqual(st.state_name, "PENDING")
            self.assertEqual(st.completed + st.failed, N)
            local[:] = b"\xc3" * len(local)
        finally:
            os.kill(self.pid, signal.SIGCONT)
        time.sleep(0.3)
        self.assertEqual(bytes(local), b"\xc3" * len(local))
        b.reset()
        b.submit(reqs)
        self.assertEqual(b.wait(20).state_name, "COMPLETED")
        self.assertEqual(bytes(local[:4]), b"\x11" * 4)

    def test_unregister_under_stall(self):
        e, local, b, reqs = self.stalled()
        stop(self.pid)
        try:
            b.submit(reqs)
            t0 = time.monotonic()
            e.unregister(local)
            self.assertLess(time.monotonic() - t0, 10)
            self.assertNotEqual(b.status().state_name, "PENDING")
            local[:] = b"\xc3" * len(local)
        finally:
            os.kill(self.pid, signal.SIGCONT)
        time.sleep(0.3)
        self.assertEqual(bytes(local), b"\xc3" * len(local))

    def test_encrypted_transfer(self):
        """encrypt=True with the secret: a WRITE and a READ of a random buffer
        to the peer in another process (which only holds the secret: either
        side asking for encryption is enough)."""
        e = self.engine(auth_secret=SECRET, encrypt=True)
        data = bytearray(os.urandom(4 * BLOCK))
        back = bytearray(len(data))
        e.register(data, remote=False)
        e.register(back, remote=False)
        seg = e.open_segment(self.name)
        off = 2 << 20  # clear of the blocks the other tests read
        b = e.allocate_batch(2)
        self.addCleanup(b.free)
        b.submit([(te.WRITE, te.address_of(data)[0], seg, self.raddr + off, len(data))])
        self.assertEqual(b.wait(20).state_name, "COMPLETED")
        b.reset()
        b.submit([(te.READ, te.address_of(back)[0], seg, self.raddr + off, len(back))])
        self.assertEqual(b.wait(20).state_name, "COMPLETED")
        self.assertEqual(bytes(back), bytes(data))

    def test_encrypt_needs_secret(self):
        with self.assertRaises(te.InvalidArgument) as cm:
            self.engine(encrypt=True)
        self.assertIn("needs the cluster secret", str(cm.exception))

    def test_mooncake_drop_in_reads_secret_file(self):
        from peers import mooncake_target  # noqa: F401  (the drop-in is importable)
        from mooncake.engine import TransferEngine

        with tempfile.NamedTemporaryFile("w", suffix=".secret", delete=False) as f:
            f.write(SECRET + "\n")
        self.addCleanup(os.unlink, f.name)
        # The library reads its environment when it loads: run the drop-in
        # in a child that starts with TE_AUTH_SECRET_FILE set.
        p = Peer(drop_in_write, self.name, self.raddr, env={"TE_AUTH_SECRET_FILE": f.name})
        self.assertEqual(p.recv(), 0)
        p.close()
        q = Peer(drop_in_write, self.name, self.raddr)
        self.assertNotEqual(q.recv(), 0)
        q.close()
        del TransferEngine


def drop_in_write(conn, segment, raddr):
    """A Mooncake-style writer: initialize, register, transfer_sync_write;
    sends the return code."""
    import ctypes

    from mooncake.engine import TransferEngine

    eng = TransferEngine()
    rc = eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        conn.send(("init", rc))
        return
    buf = ctypes.create_string_buffer(b"\x42" * 4096, 4096)
    addr = ctypes.addressof(buf)
    eng.register_memory(addr, 4096)
    rc = eng.transfer_sync_write(segment, addr, raddr + (2 << 20), 4096)
    conn.send(rc)
    eng.unregister_memory(addr)


if __name__ == "__main__":
    unittest.main()
