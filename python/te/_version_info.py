"""te.__version__ without loading libte: the wheel's _version.py, else (a
source checkout) te.h's ABI version + "+dev"."""

import re
from pathlib import Path


def version_string():
    try:
        from ._version import version
        return version
    except ImportError:
        pass
    header = Path(__file__).resolve().parent.parent.parent / "include" / "te.h"
    try:
        text = header.read_text()
    except OSError:
        return "0.0.0+unknown"
    m = re.search(r"^#define TE_ABI_VERSION_MAJOR (\d+)", text, re.M)
    n = re.search(r"^#define TE_ABI_VERSION_MINOR (\d+)", text, re.M)
    if not m or not n:
        return "0.0.0+unknown"
    return f"{m.group(1)}.{n.group(1)}.0+dev"
