"""Run one of NIXL's example scripts against te's nixl package:

    python run_example.py EXAMPLE.py [args...]

Debian 12's torch 1.13 has no torch.set_default_device, which NIXL's
basic_two_peers.py calls with "cpu"; this runner provides it for the CPU
(and refuses any other device) before it runs the script as __main__. The
nixl package itself does not touch torch's defaults.
"""

import runpy
import sys

import torch

if not hasattr(torch, "set_default_device"):
    def set_default_device(device):
        dev = torch.device(device)
        if dev.type != "cpu":
            raise RuntimeError(f"this torch ({torch.__version__}) has no set_default_device; the test runner "
                               f"provides it for the CPU only, not {dev}")

    torch.set_default_device = set_default_device

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: run_example.py EXAMPLE.py [args...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
