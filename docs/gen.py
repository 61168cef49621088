"""Writes te's API reference pages from their sources:

    docs/c-api.md       from include/te.h: every function, type and constant
                        with the comment te.h gives it; the error codes'
                        meanings from internal/errs/errs.go (the codes' names
                        and doc comments), checked against te.h's numbers
    docs/python-api.md  from the docstrings of the te and mooncake.engine
                        packages (imported from python/, without loading libte)

    python3 docs/gen.py           write both
    python3 docs/gen.py --check   exit 1, saying which, if a page is not what
                                  the sources give (tests/docs runs this)

Standard library only. The HTTP API of te-sidecar is
docs/te-sidecar.openapi.json, which te-sidecar's own tests keep current.
"""

import enum
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "include" / "te.h"
ERRS = ROOT / "internal" / "errs" / "errs.go"
BANNER = "<!-- Written by docs/gen.py from {src}: edit the source, then run python3 docs/gen.py. -->\n\n"


# ---- C ----------------------------------------------------------------------

def _comment_text(block):
    """The text of a /* ... */ block: the leading " * " of each line gone,
    paragraphs kept."""
    body = block.strip()
    body = body[2:] if body.startswith("/*") else body
    body = body[:-2] if body.endswith("*/") else body
    lines = []
    for line in body.split("\n"):
        line = line.strip()
        if line.startswith("*"):
            line = line[1:]
            if line.startswith(" "):
                line = line[1:]
        lines.append(line.rstrip())
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def _markdown(text):
    """A comment as Markdown: lines indented by 4 (code in te.h's comments)
    become code blocks, the rest flows as paragraphs and lists."""
    out, code = [], []
    for line in text.split("\n"):
        if line.startswith("    ") and line.strip():
            code.append(line[4:])
            continue
        if code:
            out += ["", "```c"] + code + ["```", ""]
            code = []
        out.append(line)
    if code:
        out += ["", "```c"] + code + ["```"]
    return "\n".join(out).strip() + "\n"


def _contract(text):
    """Splits off the "Blocks: ... | Thread-safe: ... | Errors: ..." line of a
    function's comment."""
    m = re.search(r"\n?Blocks:(.*)$", text, re.S)
    if not m:
        return text, None
    parts = [p.strip() for p in ("Blocks:" + m.group(1)).replace("\n", " ").split("|")]
    return text[:m.start()].rstrip(), [re.sub(r"\s+", " ", p) for p in parts if p]


def error_meanings():
    """{code: meaning} from internal/errs/errs.go: the code's name in the
    names map, with the first sentence of its doc comment when it has one."""
    src = ERRS.read_text()
    block = re.search(r"const \(\n(.*?)\n\)", src, re.S).group(1)
    numbers, docs, comment = {}, {}, []
    for line in block.split("\n"):
        line = line.strip()
        if line.startswith("//"):
            comment.append(line[2:].strip())
            continue
        m = re.match(r"(\w+)\s+Code = (\d+)$", line)
        if m:
            numbers[m.group(1)] = int(m.group(2))
            if comment:
                text = " ".join(comment)
                text = re.sub(r"^" + m.group(1) + r" means ", "", text)
                docs[m.group(1)] = re.split(r"(?<=[.])\s", text, 1)[0].rstrip(".")
        comment = []
    names = dict(re.findall(r"^\t(\w+):\s+\"([^\"]*)\",$", src, re.M))
    out = {}
    for go, n in numbers.items():
        if go not in names:
            raise SystemExit(f"gen.py: internal/errs: code {go} has no name")
        out[n] = names[go] + (f": {docs[go]}" if go in docs else "")
    return out


def c_reference():
    src = HEADER.read_text()
    meanings = error_meanings()
    # Items: comment blocks, preprocessor lines, declarations up to ";".
    tokens = re.findall(r"/\*.*?\*/|#[^\n]*(?:\\\n[^\n]*)*|typedef\s+struct[^{;]*\{.*?\}\s*\w+\s*;|[^\s;#/][^;#/]*?;|\s+", src, re.S)
    out = [BANNER.format(src="include/te.h"), "# te's C API (include/te.h)\n\n"]
    version = re.search(r"#define TE_ABI_VERSION_MAJOR (\d+).*?#define TE_ABI_VERSION_MINOR (\d+)", src, re.S)
    out.append(f"ABI version {version.group(1)}.{version.group(2)}. "
               "The functions below are in the order te.h declares them; each says whether it blocks, whether "
               "it is thread-safe and which errors it decides.\n\n")
    pending = None          # the last comment block, waiting for what it documents
    defines = []            # (name, value, comment) of a run of #defines
    first = True
    contents = []           # (level, title) for the table of contents

    def flush_defines():
        nonlocal defines
        if defines:
            out.append("| Constant | Value | Meaning |\n|---|---|---|")
            for name, value, note in defines:
                out.append(f"| `{name}` | `{value}` | {note} |")
            out.append("")
            defines = []

    for tok in tokens:
        t = tok.strip()
        if not t:
            continue
        if t.startswith("/*"):
            text = _comment_text(t)
            section = re.match(r"^[-=]{4} (.+?) [-=]{4,}\s*(.*)$", text, re.S)
            if first:
                # The file's own comment: the conventions every function follows.
                flush_defines()
                out.append("## Conventions\n")
                intro = text.split("\n", 1)[1] if "\n" in text else text
                out.append(_markdown(intro))
                contents.append((2, "Conventions"))
                out.append("## Constants and types\n")
                contents.append((2, "Constants and types"))
                first = False
            elif section:
                flush_defines()
                title = section.group(1).strip()
                out.append(f"## {title}\n")
                contents.append((2, title))
                rest = section.group(2).strip()
                if rest:
                    out.append(_markdown(_comment_text("/*" + rest + "*/")))
                pending = None
            else:
                if defines:
                    flush_defines()
                pending = text
            continue
        if t.startswith("#define"):
            m = re.match(r"#define\s+(TE_\w+)\s+(.*?)\s*(/\*(.*?)\*/)?\s*$", t, re.S)
            if not m or m.group(1) in ("TE_H",) or "\\" in t:
                continue
            if pending is not None and not defines:
                out.append(_markdown(pending))
                pending = None
            note = re.sub(r"\s+", " ", (m.group(4) or "").strip()).replace("|", "\\|")
            if m.group(1).startswith("TE_ERR_"):
                code = -int(m.group(2).strip("() "))
                if code not in meanings:
                    raise SystemExit(f"gen.py: te.h's {m.group(1)} ({-code}) is no code of internal/errs")
                note = meanings[code].replace("|", "\\|")
            defines.append((m.group(1), m.group(2).strip(), note))
            continue
        if t.startswith("#"):
            continue
        flush_defines()
        fn = re.match(r"int\s+(te_\w+)\s*\((.*)\)\s*;$", t, re.S)
        st = re.match(r"typedef\s+struct\s+\w*\s*\{.*\}\s*(\w+)\s*;$", t, re.S)
        alias = re.match(r"typedef\s+[\w\s]+?\s(te_\w+)\s*;$", t)
        if fn:
            name = fn.group(1)
            proto = re.sub(r"\s+", " ", t)
            out.append(f"### {name}\n\n```c\n{proto}\n```\n")
            contents.append((3, name))
            if pending:
                body, contract = _contract(pending)
                out.append(_markdown(body))
                if contract:
                    out.append("\n".join(f"- **{c.split(':', 1)[0]}:** {c.split(':', 1)[1].strip()}" for c in contract)
                               + "\n")
        elif st:
            name = st.group(1)
            out.append(f"### {name}\n")
            contents.append((3, name))
            if pending:
                out.append(_markdown(pending))
            out.append(f"```c\n{t}\n```\n")
        elif alias:
            flat = re.sub(r"\s+", " ", t)
            out.append(f"- `{flat}`")
            if pending:
                out.append("  " + re.sub(r"\s+", " ", pending))
            out.append("")
        pending = None
    flush_defines()
    toc = ["## Contents\n"] + [("  " if lvl == 3 else "") + f"- [{title}](#{_anchor(title)})" for lvl, title in contents]
    return _tidy(out[0] + out[1] + out[2] + "\n".join(toc) + "\n\n" + "\n".join(out[3:]))


def _anchor(title):
    a = re.sub(r"[^\w\- ]", "", title.lower()).strip().replace(" ", "-")
    return a


def _tidy(text):
    text = re.sub(r"[ \t]+\n", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


# ---- Python -----------------------------------------------------------------

def _sig(obj):
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _doc(obj):
    # The object's own docstring: an inherited one (IntEnum's, object's)
    # differs across Python versions.
    d = inspect.cleandoc(obj.__doc__) if isinstance(getattr(obj, "__doc__", None), str) else None
    if inspect.isclass(obj) and "__doc__" not in obj.__dict__:
        d = None
    return d.strip() + "\n" if d else "*(no docstring)*\n"


def _members(cls):
    """Public methods and properties defined by cls itself, in source order."""
    out = []
    for name, value in cls.__dict__.items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(value, property):
            out.append((name, "property", value))
        elif isinstance(value, (staticmethod, classmethod)):
            out.append((name, type(value).__name__, value.__func__))
        elif inspect.isfunction(value):
            out.append((name, "method", value))
    return out


def _class(out, qual, cls, contents):
    if issubclass(cls, enum.Enum):
        # An enum's call signature is the enum module's and changes across
        # Python versions: list the members instead.
        out.append(f"### class {qual}\n")
        contents.append((3, f"class {qual}"))
        out.append(_doc(cls) + "\nMembers: " + ", ".join(f"`{n}` = {int(m.value)}" for n, m in cls.__members__.items()) + ".\n")
        return
    out.append(f"### class {qual}{_sig(cls)}\n")
    contents.append((3, f"class {qual}"))
    out.append(_doc(cls))
    for name, kind, fn in _members(cls):
        if name == "__init__":
            continue
        if kind == "property":
            out.append(f"#### {qual}.{name} *(property)*\n")
            out.append(_doc(fn))
        else:
            out.append(f"#### {qual}.{name}{_sig(fn)}\n")
            out.append(_doc(fn))


def python_reference():
    sys.path.insert(0, str(ROOT / "python"))
    import te
    import te.errors
    import te.kvcache
    import mooncake.engine as mc

    out = [BANNER.format(src="the docstrings of python/te and python/mooncake"), "# te's Python API\n\n"]
    contents = []
    body = []

    def module(title, mod, classes, functions, consts=()):
        body.append(f"## {title}\n")
        contents.append((2, title))
        body.append(_doc(mod))
        if consts:
            body.append("Constants: " + ", ".join(f"`{c}`" for c in consts) + ".\n")
        for name in functions:
            fn = getattr(mod, name)
            body.append(f"### {mod.__name__}.{name}{_sig(fn)}\n")
            contents.append((3, f"{mod.__name__}.{name}"))
            body.append(_doc(fn))
        for name in classes:
            _class(body, f"{mod.__name__}.{name}", getattr(mod, name), contents)

    module("te", te, ["Engine", "Segment", "Batch", "BatchStatus", "Limits", "Store"],
           ["load", "library_path", "abi_version", "version", "local_topology", "address_of", "check", "forked",
            "device_of", "location_of"],
           ["__version__", "READ", "WRITE", "WAITING", "PENDING", "INVALID", "CANCELED", "COMPLETED", "TIMEOUT",
            "FAILED", "STATE_NAMES"])
    kv_classes = [n for n, v in vars(te.kvcache).items() if inspect.isclass(v) and not n.startswith("_")
                  and v.__module__ == "te.kvcache"]
    module("te.kvcache", te.kvcache, kv_classes, [])

    body.append("## Exceptions\n")
    contents.append((2, "Exceptions"))
    body.append(_doc(te.errors))
    body.append(f"`te.TeError` is the base class: {_doc(te.TeError).strip()}\n")
    body.append("`te.LibraryError`: " + _doc(te.LibraryError))
    body.append("| Exception | Code (C: negated) | Also a | Meaning |\n|---|---|---|---|")
    for code in sorted(te.BY_CODE):
        cls = te.BY_CODE[code]
        extra = ", ".join(b.__name__ for b in cls.__bases__ if b is not te.TeError) or "—"
        body.append(f"| `te.{cls.__name__}` | {code} | {extra} | {(cls.__doc__ or '').strip()} |")
    body.append("")

    mc_classes = ["TransferEngine", "TransferNotify", "TransferOpcode"]
    body.append("## mooncake.engine\n")
    contents.append((2, "mooncake.engine"))
    body.append(_doc(mc))
    for name in mc_classes:
        _class(body, f"mooncake.engine.{name}", getattr(mc, name), contents)

    body.append("## nixl\n")
    contents.append((2, "nixl"))
    body.append("`python/nixl` is NVIDIA NIXL's Python API on te (`nixl._api.nixl_agent`, `nixl._bindings`, "
                "`nixl._utils`, `nixl.logging`): NIXL's own documentation is its reference, and the docstring of "
                "`python/nixl/__init__.py` lists what differs on te. It needs numpy, so it is not imported here.\n")
    toc = ["## Contents\n"] + [("  " if lvl == 3 else "") + f"- [{t}](#{_anchor(t)})" for lvl, t in contents]
    return _tidy(out[0] + out[1] + "\n".join(toc) + "\n\n" + "\n".join(body))


PAGES = {"docs/c-api.md": c_reference, "docs/python-api.md": python_reference}


def main(argv):
    check = "--check" in argv
    stale = []
    for rel, make in PAGES.items():
        text = make()
        path = ROOT / rel
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(rel)
        else:
            path.write_text(text)
            print(f"wrote {rel}")
    if stale:
        print("not current (run python3 docs/gen.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
