"""GPU memory over rdma between two Python processes on the fake fabric: the
fake libibverbs and CUDA driver that `make fakes` builds (build/fake, or
TE_TEST_FAKES), on the recorded 8-GPU/8-NIC node. Each process allocates its
device memory through the fake driver with ctypes and registers it with
te.Engine; the bytes move over rdma through the NICs behind each GPU's PCIe
switch (mlx5_2 for GPU 3, mlx5_4 for GPU 5 on that node).

RealGPUTest is the same on a GPU machine (TE_CUDA_REAL=1, bench/gpu/check.sh):
the real driver, device 0 in both processes, over TE_GPU_TRANSPORT (cudaipc
by default; tcp stages through host memory; rdma needs a NIC)."""

import os
import shutil
import tempfile
import unittest

import fabric_peers
from util import HERE, Peer

ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FAKES = os.environ.get("TE_TEST_FAKES") or os.path.join(ROOT, "build", "fake")
MANIFEST = os.path.join(ROOT, "internal", "sys", "topo", "testdata", "hgx8.tree")


def materialize(manifest, root):
    """Build a recorded sysfs tree (topo.Materialize's format)."""
    with open(manifest) as f:
        for line in f:
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind not in ("d", "f", "l"):
                continue
            path, _, arg = rest.partition(" ")
            full = os.path.join(root, path)
            if kind == "d":
                os.makedirs(full, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(full), exist_ok=True)
            if kind == "l":
                os.symlink(arg, full)
            else:
                with open(full, "w") as w:
                    w.write(arg + "\n")


@unittest.skipUnless(os.path.exists(os.path.join(FAKES, "libibverbs.so.1")) and
                     os.path.exists(os.path.join(FAKES, "libcuda.so.1")) and os.path.exists(MANIFEST),
                     f"needs the fakes in {FAKES}: run make fakes")
class RDMAFabricTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="te-fabric-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        sysfs = os.path.join(self.dir, "sysfs")
        materialize(MANIFEST, sysfs)
        self.env = {
            "TE_IBV_LIBRARY": os.path.join(FAKES, "libibverbs.so.1"),
            "TE_CUDA_LIBRARY": os.path.join(FAKES, "libcuda.so.1"),
            "TE_SYSFS_ROOT": sysfs,
            "FAKEVERBS_FABRIC": os.path.join(self.dir, "fabric"),
        }

    def test_gpu_to_gpu(self):
        tgt = Peer(fabric_peers.target, 5, 3, env=self.env)
        name, raddr = tgt.recv()
        ini = Peer(fabric_peers.initiator, name, raddr, 3, 5, env=self.env)
        self.assertEqual(ini.recv(), ("written", None))
        ini.conn.send(tgt.ask("check"))
        what, out = ini.recv()
        self.assertEqual(what, "done")
        self.assertEqual(tgt.ask("exit"), "bye")
        tgt.close()
        ini.close()
        self.assertEqual(out["states"], ["COMPLETED"] * 3, out)
        self.assertEqual(out["transports"], ["rdma"])
        self.assertTrue(out["read_ok"], "GPU 3 did not receive GPU 5's bytes")
        self.assertTrue(out["target_ok"], "GPU 5 did not receive GPU 3's bytes")
        half = fabric_peers.HALF
        # GPU 3 -> GPU 5: only the rail between the NICs behind their switches.
        self.assertEqual(out["gpu_write"], {"rail.mlx5_2:mlx5_4.bytes": half})
        # Socket 1's memory -> GPU 5: socket 1's NICs to the one behind GPU 5.
        self.assertEqual(sum(out["host_write"].values()), half)
        for rail in out["host_write"]:
            local, peer = rail[len("rail."):-len(".bytes")].split(":")
            self.assertIn(local, ["mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"], out["host_write"])
            self.assertEqual(peer, "mlx5_4", out["host_write"])
        self.assertEqual(out["topology"]["cuda:3"][0], ["mlx5_2"])
        self.assertEqual(out["topology"]["cuda:5"][0], ["mlx5_4"])
        self.assertEqual(out["topology"]["cpu:1"][0], ["mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"])
        self.assertEqual(out["gpu_dmabuf"], 1)
        # rdma cannot enforce a window: te_submit_windows refuses, starts nothing.
        self.assertEqual(out["window"], ("NotSupported", True, 0))



@unittest.skipUnless(os.environ.get("TE_CUDA_REAL") == "1", "a GPU check: TE_CUDA_REAL=1 on a GPU machine")
class RealGPUTest(unittest.TestCase):
    def test_gpu_to_gpu(self):
        tr = os.environ.get("TE_GPU_TRANSPORT") or "cudaipc"
        tgt = Peer(fabric_peers.target, 5, 3, 0, None)
        name, raddr = tgt.recv()
        ini = Peer(fabric_peers.initiator, name, raddr, 3, 5, 0, None, tr)
        self.assertEqual(ini.recv(), ("written", None))
        ini.conn.send(tgt.ask("check"))
        what, out = ini.recv()
        self.assertEqual(what, "done")
        self.assertEqual(tgt.ask("exit"), "bye")
        tgt.close()
        ini.close()
        self.assertEqual(out["states"], ["COMPLETED"] * 3, out)
        self.assertEqual(out["transports"], [tr])
        self.assertTrue(out["read_ok"] and out["target_ok"], out)


if __name__ == "__main__":
    unittest.main()
