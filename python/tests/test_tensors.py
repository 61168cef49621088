"""Tensor-like objects (torch tensors on GPU) through te.Engine and the
drop-in mooncake.engine.

Without a GPU, the fake tensors below point at host memory but report a CUDA
device: te registers them at "cuda:N", which the engine refuses cleanly with
NotSupported where CUDA is not available (and, with CUDA, refuses because
the driver says the memory is not on that device). The real-torch tests run
only where torch imports; the GPU ones only where torch sees a GPU."""

import ctypes
import logging
import unittest

import te
from mooncake.engine import TransferEngine

try:
    import torch
except ImportError:
    torch = None


class Device:
    """torch.device's attributes."""

    def __init__(self, type, index=None):
        self.type = type
        self.index = index


class FakeTensor:
    """A tensor-like object over host memory claiming to live on `device`
    (a Device, a string such as "cuda:1", or None with is_cuda)."""

    def __init__(self, n, device, get_device=None, contiguous=True, is_cuda=None):
        self.buf = (ctypes.c_char * n)()
        self.nbytes = n
        if device is not None:
            self.device = device
        if is_cuda is not None:
            self.is_cuda = is_cuda
        self._get_device = get_device
        self._contiguous = contiguous

    def data_ptr(self):
        return ctypes.addressof(self.buf)

    def is_contiguous(self):
        return self._contiguous

    def get_device(self):
        return -1 if self._get_device is None else self._get_device


def cuda_available():
    """Whether this process can register GPU memory: with CUDA, a cuda:0
    registration fails for another reason than NotSupported."""
    with te.Engine(listen_addr="127.0.0.1:0") as e:
        try:
            e.register(FakeTensor(4096, Device("cuda", 0)))
        except te.NotSupported:
            return False
        except te.TeError:
            return True
    return True


class DeviceTest(unittest.TestCase):
    def test_device_of(self):
        cases = [
            (FakeTensor(16, Device("cuda", 3)), ("cuda", 3), "cuda:3"),
            (FakeTensor(16, "cuda:1"), ("cuda", 1), "cuda:1"),
            (FakeTensor(16, Device("cuda"), get_device=2), ("cuda", 2), "cuda:2"),
            (FakeTensor(16, None, is_cuda=True, get_device=5), ("cuda", 5), "cuda:5"),
            (FakeTensor(16, Device("cuda")), ("cuda", 0), "cuda:0"),  # no index anywhere: the current device
            (FakeTensor(16, Device("cpu")), ("cpu", None), "cpu"),
            (FakeTensor(16, None), ("cpu", None), "cpu"),
        ]
        for t, dev, loc in cases:
            with self.subTest(loc=loc):
                self.assertEqual(te.device_of(t), dev)
                self.assertEqual(te.location_of(t), loc)
        self.assertIsNone(te.location_of(bytearray(4)))
        self.assertIsNone(te.location_of(1234))
        with self.assertRaises(te.NotSupported):
            te.location_of(FakeTensor(16, Device("mps", 0)))

    def test_resolve_location(self):
        from te.tensors import resolve_location

        gpu = FakeTensor(16, Device("cuda", 1))
        self.assertEqual(resolve_location(gpu, None), "cuda:1")
        self.assertEqual(resolve_location(gpu, "*"), "cuda:1")
        self.assertEqual(resolve_location(gpu, "cuda:1"), "cuda:1")
        for bad in ("cpu", "cuda:0", "cpu:0"):
            with self.subTest(bad=bad), self.assertRaises(te.InvalidArgument):
                resolve_location(gpu, bad)
        self.assertEqual(resolve_location(bytearray(4), None), "cpu")
        self.assertEqual(resolve_location(1234, "*"), "*")


@unittest.skipIf(cuda_available(), "CUDA is available: the no-GPU error paths do not apply")
class NoGPUTest(unittest.TestCase):
    def setUp(self):
        self.e = te.Engine(listen_addr="127.0.0.1:0")
        self.addCleanup(self.e.close)

    def test_cuda_tensor_is_refused_cleanly(self):
        t = FakeTensor(1 << 16, Device("cuda", 0))
        with self.assertRaisesRegex(te.NotSupported, "cuda:0"):
            self.e.register(t)
        with self.assertRaises(te.NotSupported):
            self.e.register(t, location="*")
        with self.assertRaises(te.NotSupported):
            self.e.register_batch([FakeTensor(4096, Device("cpu")), t])
        with self.assertRaises(te.InvalidArgument):
            self.e.register(t, location="cpu")  # GPU memory never registers as host memory
        # Nothing was left registered by the failures: the same memory
        # registers as a CPU tensor afterwards.
        self.assertEqual(self.e.stats()["buffers"], 0)
        cpu = FakeTensor(1 << 16, Device("cpu"))
        self.e.register(cpu)
        self.e.unregister(cpu)

    def test_cpu_tensor_and_contiguity(self):
        cpu = FakeTensor(1 << 16, Device("cpu"))
        addr = self.e.register(cpu)
        self.assertEqual(addr, cpu.data_ptr())
        with self.e.open_segment(self.e.name) as seg:
            self.assertEqual([(a, n) for a, n, _ in seg.buffers()], [(addr, 1 << 16)])
            self.assertTrue(seg.buffers()[0][2].startswith("cpu"), seg.buffers())
        self.e.unregister(cpu)
        with self.assertRaisesRegex(te.InvalidArgument, "contiguous"):
            self.e.register(FakeTensor(4096, Device("cpu"), contiguous=False))
        with self.assertRaises(te.NotSupported):
            self.e.register(FakeTensor(4096, Device("xpu", 0)))


@unittest.skipIf(cuda_available(), "CUDA is available: the no-GPU error paths do not apply")
class MooncakeNoGPUTest(unittest.TestCase):
    def setUp(self):
        self.eng = TransferEngine()
        self.assertEqual(self.eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        self.addCleanup(self.eng.close)
        log = logging.getLogger("mooncake.engine")
        old = log.level
        log.setLevel(logging.CRITICAL)  # the failures below log errors on purpose
        self.addCleanup(log.setLevel, old)

    def buffers(self):
        with te.Engine(listen_addr="127.0.0.1:0") as e, e.open_segment(f"127.0.0.1:{self.eng.get_rpc_port()}") as s:
            return s.buffers()

    def test_pointer_registration_detects(self):
        # vLLM's Mooncake connector: batch_register_memory(data_ptrs, nbytes)
        # with location "*". Without CUDA a pointer is host memory.
        ts = [FakeTensor(1 << 16, Device("cuda", 0)) for _ in range(2)]
        self.assertEqual(self.eng.batch_register_memory([t.data_ptr() for t in ts], [t.nbytes for t in ts]), 0)
        bufs = self.buffers()
        self.assertEqual(sorted(a for a, _, _ in bufs), sorted(t.data_ptr() for t in ts))
        # Host memory: published as cpu (or left as "*"), never as cuda.
        self.assertTrue(all(not loc.startswith("cuda") for _, _, loc in bufs), bufs)
        self.assertEqual(self.eng.batch_unregister_memory([t.data_ptr() for t in ts]), 0)
        # SGLang: register_memory(ptr, length).
        self.assertEqual(self.eng.register_memory(ts[0].data_ptr(), ts[0].nbytes), 0)
        self.assertEqual(self.eng.unregister_memory(ts[0].data_ptr()), 0)

    def test_tensor_objects(self):
        gpu = FakeTensor(1 << 16, Device("cuda", 0))
        self.assertEqual(self.eng.register_memory(gpu), -te.NotSupported.code)
        self.assertEqual(self.eng.register_memory(gpu, gpu.nbytes), -te.NotSupported.code)
        self.assertEqual(self.eng.batch_register_memory([gpu], [gpu.nbytes]), -te.NotSupported.code)
        self.assertEqual(self.buffers(), [])
        cpus = [FakeTensor(4096, Device("cpu")) for _ in range(3)]
        self.assertEqual(self.eng.batch_register_memory(cpus, [None, 4096, None]), 0)
        self.assertEqual(len(self.buffers()), 3)
        self.assertEqual(self.eng.batch_unregister_memory(cpus), 0)
        self.assertEqual(self.eng.register_memory(cpus[0]), 0)
        self.assertEqual(self.eng.unregister_memory(cpus[0]), 0)
        self.assertEqual(self.eng.register_memory(FakeTensor(4096, Device("cpu"), contiguous=False)),
                         -te.InvalidArgument.code)


@unittest.skipIf(torch is None, "torch is not installed")
class TorchTest(unittest.TestCase):
    def test_cpu_tensor(self):
        t = torch.arange(4096, dtype=torch.int32)
        with te.Engine(listen_addr="127.0.0.1:0") as e:
            self.assertEqual(e.register(t), t.data_ptr())
            e.unregister(t)
            with self.assertRaises(te.InvalidArgument):
                e.register(t[::2])

    @unittest.skipUnless(torch is not None and torch.cuda.is_available(), "torch sees no GPU")
    def test_gpu_tensor(self):
        dev = torch.cuda.device_count() - 1
        t = torch.zeros(1 << 20, dtype=torch.uint8, device=f"cuda:{dev}")
        self.assertEqual(te.location_of(t), f"cuda:{dev}")
        with te.Engine(listen_addr="127.0.0.1:0") as e:
            e.register(t)
            with e.open_segment(e.name) as s:
                self.assertEqual(s.buffers()[0][2], f"cuda:{dev}")
            e.unregister(t)
        eng = TransferEngine()
        self.assertEqual(eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        try:
            # As Mooncake's users do: the pointer, detected as device memory.
            self.assertEqual(eng.register_memory(t.data_ptr(), t.nbytes), 0)
            with te.Engine(listen_addr="127.0.0.1:0") as e, e.open_segment(f"127.0.0.1:{eng.get_rpc_port()}") as s:
                self.assertEqual(s.buffers()[0][2], f"cuda:{dev}")
            self.assertEqual(eng.unregister_memory(t.data_ptr()), 0)
        finally:
            eng.close()


if __name__ == "__main__":
    unittest.main()
