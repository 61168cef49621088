"""Every ```python block of README.md and docs/*.md runs as written, each in
a fresh interpreter with the te this suite tests. A block that needs what a
test machine lacks (a te-sidecar, a peer process, a GPU) is marked on the
line before it with <!-- docs-test: skip (why) --> and reported as skipped
with that reason; README's quick start may not be marked."""

import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BLOCK = re.compile(r"(?:^<!-- docs-test: skip \((?P<why>[^)]*)\) -->\n)?^```python\n(?P<code>.*?)^```$", re.M | re.S)


def blocks():
    """[(file, line, skip reason or None, code)] of every python block."""
    pages = [os.path.join(ROOT, "README.md")]
    docs = os.path.join(ROOT, "docs")
    pages += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    out = []
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start("code"))
            out.append((os.path.relpath(page, ROOT), line, m.group("why"), m.group("code")))
    return out


class DocBlocksTest(unittest.TestCase):
    def test_every_python_block_runs(self):
        found = blocks()
        readme = [b for b in found if b[0] == "README.md"]
        self.assertTrue(readme, "README.md has no python block: where is the quick start?")
        self.assertIsNone(readme[0][2], "README.md's quick start is marked to skip")
        self.assertGreaterEqual(len(found), 3, found)
        for page, line, why, code in found:
            with self.subTest(block=f"{page}:{line}"):
                if why is not None:
                    self.assertTrue(why.strip(), f"{page}:{line}: a skip needs its reason")
                    self.skipTest(f"{page}:{line}: {why}")
                with tempfile.TemporaryDirectory() as tmp:
                    out = subprocess.run([sys.executable, "-c", code], cwd=tmp, capture_output=True, text=True,
                                         timeout=120)
                self.assertEqual(out.returncode, 0, f"{page}:{line} failed:\n{code}\n--- stderr\n{out.stderr}")


if __name__ == "__main__":
    unittest.main()
