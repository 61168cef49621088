"""te.__version__ without loading libte: the wheel's _version.py, else (a
source checkout) what mk/version.sh says, the string make stamps into
libte.so, te-sidecar and the wheel of the same checkout; te.h's ABI version
+ "+dev" only when neither is there (a copy without git or bash)."""

import re
import subprocess
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent.parent


def version_string():
    try:
        from ._version import version
        return version
    except ImportError:
        pass
    script = _ROOT / "mk" / "version.sh"
    if script.is_file():
        try:
            out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=10, check=True)
            v = out.stdout.strip()
            if v:
                return v
        except (OSError, subprocess.SubprocessError):
            pass
    header = _ROOT / "include" / "te.h"
    try:
        text = header.read_text()
    except OSError:
        return "0.0.0+unknown"
    m = re.search(r"^#define TE_ABI_VERSION_MAJOR (\d+)", text, re.M)
    n = re.search(r"^#define TE_ABI_VERSION_MINOR (\d+)", text, re.M)
    if not m or not n:
        return "0.0.0+unknown"
    return f"{m.group(1)}.{n.group(1)}.0+dev"
