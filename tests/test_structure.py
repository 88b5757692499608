"""The client's layering (docs/architecture.md), checked from its source:
no import cycle among pyzlog's modules, and nothing below Log imports it.
Imports under TYPE_CHECKING and inside functions count too: a cycle hidden
there is still a cycle for the reader."""
from __future__ import annotations

import ast
import os
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "pyzlog"

#: what is built on the client and may use Log: the command line, the demo,
#: the tools and the Spark connector (with their submodules)
ABOVE_LOG = ("pyzlog.cli", "pyzlog.demo", "pyzlog.tools", "pyzlog.spark")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """pyzlog modules that `name` imports, wherever in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    found.add(sub)  # `from . import wire`: the module, not the package's own code
                elif not alias.name.startswith("_"):  # `from . import _seqr`: a compiled extension
                    found.add(base)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        path.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_the_checker_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_relative_and_typing_imports() -> None:
    g = graph()
    assert "pyzlog.state" in g["pyzlog.tailfind"]      # from .state import LogState
    assert "pyzlog.wire" in g["pyzlog.ops"]            # from . import ops, wire
    assert "pyzlog.errors" in g["pyzlog.spark.read"]   # from ..errors import ZlogError


def test_no_import_cycle_in_pyzlog() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_nothing_below_log_imports_it() -> None:
    g = graph()
    face = {"pyzlog.log", "pyzlog"}  # Log, or the package that exports it
    users = sorted(n for n, deps in g.items() if face & deps and n != "pyzlog"
                   and not any(n == a or n.startswith(a + ".") for a in ABOVE_LOG))
    assert users == [], f"these modules are below Log but import it: {users}"


def test_the_library_does_not_load_its_tools() -> None:
    """`import pyzlog` is the log, not its test rigs: no module outside
    pyzlog.tools and the command line imports them, and importing the
    package loads none of them."""
    import subprocess
    import sys

    g = graph()
    users = sorted(n for n, deps in g.items() if any(d.startswith("pyzlog.tools") for d in deps)
                   and not n.startswith("pyzlog.tools") and n != "pyzlog.cli")
    assert users == [], users
    code = "import sys, pyzlog, pyzlog.log; print(sorted(m for m in sys.modules if m.startswith('pyzlog.tools')))"
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)


def test_the_checkout_itself_imports_the_compiled_parts() -> None:
    """Python started in the repository root imports the source folder
    pyzlog/ first; its compiled parts come from the copy ./dev setup built."""
    import subprocess
    import sys

    root = PKG.parent
    code = ("import pyzlog._seqr, pyzlog._appender, pyzlog._fastread, pyzlog, vstart.vstart as v; "
            "print(pyzlog.__file__); print(v._find_cls_lib())")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}  # a plain `python`
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    init, cls_lib = out.stdout.split()
    assert Path(init) == PKG / "__init__.py"  # the checkout's source, not a copy
    assert Path(cls_lib).name == "libcls_zlog.so"
