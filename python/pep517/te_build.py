"""PEP 517 build backend for te's Python package, with nothing to install.

`pip install .` and `pip wheel .` at the repository root call it: it builds
libte.so with the Go toolchain (the only compiler needed) and writes a
platform wheel holding python/te (with libte.so inside), python/mooncake,
python/nixl and the dist-info files (METADATA, WHEEL, RECORD). It uses only
the standard library, so it works offline, with or without build isolation,
on machines whose setuptools has no `wheel` module.

Environment:
    TE_WHEEL_LIBTE  a libte.so built already (the Makefile passes the one
                    `make` built) to bundle instead of building one
    TE_GO_TAGS      Go build tags, e.g. "te_noetcd te_noredis"
    TE_VERSION      the version to stamp (the Makefile passes its own)
    GOARCH          a cross build (arm64 with CC=aarch64-linux-gnu-gcc): the
                    library is built for it and the wheel tagged linux_aarch64
    GO              the go command (default: go on PATH, then /usr/local/go/bin/go)

The package version is te's version (engine.Version, te_version()): te.h's
ABI version TE_ABI_VERSION_MAJOR.MINOR.0, plus "+g<commit>" for a build of
an untagged commit (mk/version.sh), a PEP 440 local version. The wheel's
te/_version.py holds it, so te.__version__ and te_version() agree.

Progress: building libte.so takes minutes on a fresh machine. The backend
prints each Go package as it is compiled (go build -v) and a line every
15 s to stderr: `pip install -v .` shows them; without -v pip keeps them to
itself and turns each into a turn of its spinner (on a terminal) or a
"still running..." line every 60 s (in a log).
"""

import base64
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import threading
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "te"
SUMMARY = "te: KV-cache transfer engine (libte) with drop-ins for Mooncake's TransferEngine and NIXL's Python API"
PACKAGES = ("te", "mooncake", "nixl")
SONAME = "libte.so.1"
# Zip entries get a fixed time so that the same inputs give the same wheel.
EPOCH = (1980, 1, 1, 0, 0, 0)


def abi_version():
    """major.minor.0 from include/te.h."""
    text = (ROOT / "include" / "te.h").read_text()
    parts = []
    for what in ("MAJOR", "MINOR"):
        m = re.search(r"^#define TE_ABI_VERSION_%s (\d+)" % what, text, re.M)
        if not m:
            raise RuntimeError(f"include/te.h does not define TE_ABI_VERSION_{what}")
        parts.append(m.group(1))
    return ".".join(parts) + ".0"


_version = None


def version():
    """te's version: $TE_VERSION, else what mk/version.sh says (te.h's ABI
    version and the git commit), else the ABI version + "+dev" (an sdist,
    no git)."""
    global _version
    if _version is None:
        v = os.environ.get("TE_VERSION", "").strip()
        script = ROOT / "mk" / "version.sh"
        if not v and script.exists() and shutil.which("bash"):
            try:
                v = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout.strip()
            except (OSError, subprocess.CalledProcessError):
                v = ""
        _version = v or abi_version() + "+dev"
    return _version


def version_file():
    """te/_version.py of the wheel: te.__version__."""
    return ("# Written by the build (python/pep517/te_build.py): te's version, as te_version() of the\n"
            "# libte.so beside it says.\n"
            f"version = {version()!r}\n")


# GOARCH -> the machine name of the wheel tag and the ELF e_machine of a
# libte.so built for it.
_ARCHES = {"amd64": ("x86_64", 62), "arm64": ("aarch64", 183)}


def platform_tag():
    """The wheel platform tag: the target's of a cross build (GOARCH=arm64
    on x86-64, as `make ARCH=arm64 wheel` does: linux_aarch64), else this
    machine's, e.g. linux_x86_64. The wheel holds a native library, so it is
    not "any"."""
    goarch = os.environ.get("GOARCH", "").strip()
    if goarch:
        if goarch not in _ARCHES:
            raise RuntimeError(f"GOARCH={goarch}: te builds wheels for {', '.join(sorted(_ARCHES))}")
        return "linux_" + _ARCHES[goarch][0]
    return re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())


def check_machine(lib):
    """Refuse to bundle a libte.so built for another machine than the tag
    says (a native library in a cross wheel, or the reverse)."""
    head = Path(lib).read_bytes()[:20]
    if head[:4] != b"\x7fELF" or len(head) < 20:
        raise RuntimeError(f"{lib} is not an ELF shared library")
    machine = int.from_bytes(head[18:20], "little")
    plat = platform_tag()
    for name, elf in _ARCHES.values():
        if plat.endswith("_" + name) and machine != elf:
            raise RuntimeError(f"{lib} is built for ELF machine {machine}, not {name} ({elf}) as the wheel tag {plat} says")


def tag():
    # Pure-Python ctypes code: any Python 3 interpreter, no ABI of its own.
    return f"py3-none-{platform_tag()}"


def dist_info():
    return f"{NAME}-{version()}.dist-info"


def metadata():
    readme = (ROOT / "README.md").read_text() if (ROOT / "README.md").exists() else ""
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {version()}\n"
        f"Summary: {SUMMARY}\n"
        "Requires-Python: >=3.8\n"
        "License: Apache-2.0\n"
        "Provides-Extra: nixl\n"
        "Requires-Dist: numpy; extra == \"nixl\"\n"
        "Classifier: Programming Language :: Python :: 3\n"
        "Classifier: Operating System :: POSIX :: Linux\n"
        "Description-Content-Type: text/markdown\n"
        "\n" + readme
    )


def wheel_file():
    return (
        "Wheel-Version: 1.0\n"
        "Generator: te_build\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {tag()}\n"
    )


def go_command():
    for cand in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if cand and Path(cand).exists():
            return cand
    raise RuntimeError("building te needs the Go toolchain (1.26 or later): put go on PATH or set GO")


def build_libte(out):
    """Build libte.so into out with the release flags of the Makefile."""
    prebuilt = os.environ.get("TE_WHEEL_LIBTE")
    if prebuilt:
        if not Path(prebuilt).is_file():
            raise RuntimeError(f"TE_WHEEL_LIBTE={prebuilt} is not a file")
        shutil.copyfile(prebuilt, out)
        return
    script = ROOT / "capi" / "libte.map"
    ldflags = (f"-s -w -X github.com/tecache/te/engine.Version={version()} "
               f"-extldflags '-Wl,-soname,{SONAME} -Wl,--version-script={script}'")
    cmd = [go_command(), "build", "-v", "-buildmode=c-shared", "-trimpath", "-tags=" + os.environ.get("TE_GO_TAGS", ""),
           "-ldflags=" + ldflags, "-o", str(out), "./capi"]
    env = dict(os.environ, CGO_ENABLED="1")
    print(f"te_build: building libte.so {version()} with Go (minutes on a fresh machine; a line per package compiled)",
          file=sys.stderr, flush=True)
    print("te_build:", " ".join(cmd), file=sys.stderr, flush=True)
    stop = threading.Event()

    def heartbeat():
        start = time.monotonic()
        while not stop.wait(15):
            print(f"te_build: still compiling libte.so ({int(time.monotonic() - start)}s)", file=sys.stderr, flush=True)

    t = threading.Thread(target=heartbeat, daemon=True)
    t.start()
    try:
        subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    finally:
        stop.set()
        t.join()
    print("te_build: libte.so built", file=sys.stderr, flush=True)
    header = Path(out).with_suffix(".h")
    if header.exists():
        header.unlink()  # cgo's header; include/te.h is the public one


def package_files():
    """(path in the wheel, source path) of every Python file."""
    out = []
    for pkg in PACKAGES:
        base = ROOT / "python" / pkg
        for p in sorted(base.rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            out.append((p.relative_to(ROOT / "python").as_posix(), p))
    return out


def _hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class _Wheel:
    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.record = []

    def add(self, arcname, data, mode=0o644):
        info = zipfile.ZipInfo(arcname, EPOCH)
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        self.record.append(f"{arcname},{_hash(data)},{len(data)}")

    def close(self):
        rec = f"{dist_info()}/RECORD"
        body = "\n".join(self.record + [f"{rec},,"]) + "\n"
        info = zipfile.ZipInfo(rec, EPOCH)
        info.external_attr = (0o100000 | 0o644) << 16
        self.zip.writestr(info, body)
        self.zip.close()


def _write_dist_info(directory):
    d = Path(directory) / dist_info()
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(metadata())
    (d / "WHEEL").write_text(wheel_file())
    (d / "top_level.txt").write_text("\n".join(PACKAGES) + "\n")
    return d.name


# ---- PEP 517 hooks ----------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_dist_info(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"{NAME}-{version()}-{tag()}.whl"
    Path(wheel_directory).mkdir(parents=True, exist_ok=True)
    target = Path(wheel_directory) / name
    with tempfile.TemporaryDirectory(prefix="te-build-") as tmp:
        lib = Path(tmp) / "libte.so"
        build_libte(lib)
        check_machine(lib)
        partial = Path(tmp) / name
        w = _Wheel(partial)
        try:
            for arcname, src in package_files():
                if arcname == "te/_version.py":
                    continue  # a stale one from a source checkout: the wheel gets its own
                w.add(arcname, src.read_bytes())
            w.add("te/_version.py", version_file().encode())
            w.add("te/libte.so", lib.read_bytes(), mode=0o755)
            w.add(f"{dist_info()}/METADATA", metadata().encode())
            w.add(f"{dist_info()}/WHEEL", wheel_file().encode())
            w.add(f"{dist_info()}/top_level.txt", ("\n".join(PACKAGES) + "\n").encode())
            if (ROOT / "LICENSE").exists():
                w.add(f"{dist_info()}/LICENSE", (ROOT / "LICENSE").read_bytes())
        finally:
            w.close()
        shutil.move(str(partial), target)
    return name


def _sdist_files():
    """The files of a source distribution: what git tracks, else the tree
    without build outputs."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = Path(dirpath).relative_to(ROOT)
        dirnames[:] = [d for d in dirnames if not (rel == Path(".") and d in ("build", ".git")) and d != "__pycache__"]
        files += [(rel / f).as_posix() for f in filenames]
    return sorted(files)


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{version()}"
    name = base + ".tar.gz"
    Path(sdist_directory).mkdir(parents=True, exist_ok=True)
    with tarfile.open(Path(sdist_directory) / name, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for f in _sdist_files():
            p = ROOT / f
            if p.is_file():
                tar.add(p, arcname=f"{base}/{f}", recursive=False)
        pkg_info = metadata().encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    return name
