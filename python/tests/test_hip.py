"""hip:N memory from Python, on the fake HIP runtime of te's Go tests
(internal/sys/hip/hiptest/testdata/fakehip.c): its device memory faults on
any CPU access, so a pass means te moved the bytes with the runtime's copies.

te reads TE_HIP_LIBRARY when it first needs HIP, in the process that loaded
libte, so each case runs in a child Python with the variable set."""

import os
import subprocess
import sys
import tempfile
import unittest

from util import HERE

CHILD = r"""
import ctypes, os, sys
import te

N = 1 << 20
hip = ctypes.CDLL(os.environ["TE_HIP_LIBRARY"], mode=ctypes.RTLD_GLOBAL)  # the library te loads
dev = ctypes.c_void_p()
assert hip.hipMalloc(ctypes.byref(dev), ctypes.c_size_t(N)) == 0
src = ctypes.create_string_buffer(bytes((i * 7 + 3) & 0xFF for i in range(N)), N)
back = ctypes.create_string_buffer(N)
with te.Engine(listen_addr="127.0.0.1:0") as e:
    try:
        e.register(ctypes.addressof(back), N, "hip:0")
        sys.exit("host memory registered as hip:0")
    except te.InvalidArgument:
        pass
    e.register(dev.value, N, "hip:0")
    e.register(ctypes.addressof(src), N, "cpu")
    e.register(ctypes.addressof(back), N, "cpu")
    with e.open_segment(e.name) as seg:
        locs = sorted(loc for _, _, loc in seg.buffers())
        assert locs == ["cpu", "cpu", "hip:0"], locs
        st = e.write(seg, ctypes.addressof(src), dev.value, N, timeout=20)
        assert st.state_name == "COMPLETED", st
        st = e.read(seg, ctypes.addressof(back), dev.value, N, timeout=20)
        assert st.state_name == "COMPLETED", st
    assert back.raw == src.raw, "read back differs"
    direct = ctypes.create_string_buffer(N)
    assert hip.hipMemcpy(direct, ctypes.c_void_p(dev.value), ctypes.c_size_t(N), 2) == 0  # DeviceToHost
    assert direct.raw == src.raw, "device memory differs"
    e.unregister(dev.value)
hip.hipFree(ctypes.c_void_p(dev.value))
print("OK")
"""


def build_fake_hip():
    """The fake HIP runtime, built with the C compiler; None when the source
    or a compiler is missing."""
    src = os.path.join(HERE, "..", "..", "internal", "sys", "hip", "hiptest", "testdata", "fakehip.c")
    if not os.path.exists(src):
        return None
    out = os.path.join(tempfile.mkdtemp(prefix="te-fakehip-"), "libfakehip.so")
    try:
        subprocess.run([os.environ.get("CC", "gcc"), "-O1", "-shared", "-fPIC", "-o", out, src, "-lrt"],
                       check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return out


class HipTest(unittest.TestCase):
    def test_register_and_move_hip_memory(self):
        """hip:0 registers, is published as hip:0, host memory registered as
        hip:0 is refused, and 1 MiB moves host -> hip -> host in one engine."""
        fake = build_fake_hip()
        if fake is None:
            self.skipTest("the fake HIP runtime cannot be built here (no source tree or no C compiler)")
        env = dict(os.environ, TE_HIP_LIBRARY=fake)
        r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("OK", r.stdout)


if __name__ == "__main__":
    unittest.main()
