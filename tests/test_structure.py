"""The package's layering (docs/architecture.md), checked from its source:
packages by audience (core below client and daemon, which never import each
other; admin, spark and bench on top), no import cycle among pyzlog's
modules, and nothing below Log imports it.
Imports under TYPE_CHECKING and inside functions count too: a cycle hidden
there is still a cycle for the reader."""
from __future__ import annotations

import ast
import os
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "pyzlog"

#: what is built on the client and may use Log: the command line, the demo,
#: the tools, the Spark connector and the replicated objects (with their submodules)
ABOVE_LOG = ("pyzlog.admin.cli", "pyzlog.admin.demo", "pyzlog.bench", "pyzlog.spark", "pyzlog.objects",
             # the asyncio API wraps Log (public as pyzlog.aio, beside the package's __init__)
             "pyzlog.client.aio", "pyzlog.aio")


#: which packages each package may import (besides itself and pyzlog's
#: compiled extensions); "pyzlog" is the top package's __init__ (the public names)
ALLOWED = {
    "pyzlog.core": set(),
    "pyzlog.client": {"pyzlog.core"},
    "pyzlog.daemon": {"pyzlog.core"},
    "pyzlog.admin": {"pyzlog.core", "pyzlog.client", "pyzlog.bench", "pyzlog.objects", "pyzlog"},
    "pyzlog.spark": {"pyzlog.core", "pyzlog.client", "pyzlog"},
    "pyzlog.bench": {"pyzlog.core", "pyzlog.client", "pyzlog.daemon", "pyzlog.admin", "pyzlog.spark",
                     "pyzlog.objects", "pyzlog"},
    # the replicated objects sit on the public API only (the top package's names)
    "pyzlog.objects": {"pyzlog"},
    "pyzlog": {"pyzlog.core", "pyzlog.client"},
}


def package_of(module: str) -> str:
    """The audience package a module belongs to (pyzlog.core, ...), or "pyzlog"."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in {p.split(".")[1] for p in ALLOWED
                                                                       if "." in p} else "pyzlog"


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
    assert "pyzlog.core.state" in g["pyzlog.core.tailfind"]      # from .state import LogState
    assert "pyzlog.core.wire" in g["pyzlog.client.ops"]            # from . import ops, wire
    assert "pyzlog.core.errors" in g["pyzlog.spark.read"]   # from ..errors import ZlogError


def test_no_import_cycle_in_pyzlog() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_packages_import_only_what_their_audience_may() -> None:
    """core imports no other package; client and daemon import core and never
    each other; admin, spark and bench sit on top. Checked for every import of
    every module, so a new module cannot slip past a list of names."""
    bad = []
    for name, deps in graph().items():
        mine = package_of(name)
        assert mine in ALLOWED, f"{name} is in no known package: add it to ALLOWED"
        for dep in deps:
            theirs = package_of(dep)
            if theirs != mine and theirs not in ALLOWED[mine]:
                bad.append(f"{name} -> {dep}")
    assert bad == [], "imports across audiences: " + ", ".join(sorted(bad))


def test_the_audience_rule_catches_a_crossing() -> None:
    assert package_of("pyzlog.client.log") == "pyzlog.client"
    assert package_of("pyzlog.daemon.service") == "pyzlog.daemon"
    assert package_of("pyzlog") == "pyzlog"
    assert "pyzlog.daemon" not in ALLOWED["pyzlog.client"] and "pyzlog.client" not in ALLOWED["pyzlog.daemon"]


def test_only_the_tools_import_the_objects() -> None:
    """pyzlog.objects is built on the public Log and nothing of the library
    depends on it: only the command line, the benchmarks (and examples,
    outside the package) import it, and `import pyzlog` does not load it."""
    import subprocess
    import sys

    g = graph()
    users = sorted(n for n, deps in g.items() if any(d.startswith("pyzlog.objects") for d in deps)
                   and not n.startswith(("pyzlog.objects", "pyzlog.bench")) and n != "pyzlog.admin.cli")
    assert users == [], users
    assert ALLOWED["pyzlog.objects"] == {"pyzlog"}
    code = "import sys, pyzlog; print(sorted(m for m in sys.modules if m.startswith('pyzlog.objects')))"
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)


def test_nothing_below_log_imports_it() -> None:
    g = graph()
    face = {"pyzlog.client.log", "pyzlog"}  # Log, or the package that exports it
    users = sorted(n for n, deps in g.items() if face & deps and n != "pyzlog"
                   and not any(n == a or n.startswith(a + ".") for a in ABOVE_LOG))
    assert users == [], f"these modules are below Log but import it: {users}"


def test_the_library_does_not_load_its_tools() -> None:
    """`import pyzlog` is the log, not its test rigs: no module outside
    pyzlog.bench and the command line imports them, and importing the
    package loads none of them."""
    import subprocess
    import sys

    g = graph()
    users = sorted(n for n, deps in g.items() if any(d.startswith("pyzlog.bench") for d in deps)
                   and not n.startswith("pyzlog.bench") and n != "pyzlog.admin.cli")
    assert users == [], users
    code = "import sys, pyzlog, pyzlog.client.log; print(sorted(m for m in sys.modules if m.startswith('pyzlog.bench')))"
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)


def test_the_checkout_itself_imports_the_compiled_parts() -> None:
    """Python started in the repository root imports the source folder
    pyzlog/ first; its compiled parts come from the copy ./dev setup built."""
    import subprocess
    import sys

    root = PKG.parent
    code = ("import pyzlog._seqr, pyzlog._appender, pyzlog._dataplane, pyzlog, vstart.vstart as v; "
            "print(pyzlog.__file__); print(v._find_cls_lib())")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}  # a plain `python`
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    init, cls_lib = out.stdout.split()
    assert Path(init) == PKG / "__init__.py"  # the checkout's source, not a copy
    assert Path(cls_lib).name == "libcls_zlog.so"


def test_the_package_ships_its_types() -> None:
    """py.typed (PEP 561) is in the source and in the installed distribution,
    so a user's type checker reads pyzlog's annotations instead of Any."""
    from importlib.metadata import files

    assert (PKG / "py.typed").is_file()
    installed = {str(f) for f in files("pyzlog") or []}
    assert "pyzlog/py.typed" in installed, "py.typed is missing from the wheel: pip install . again"


def test_the_asyncio_api_sits_on_the_client() -> None:
    """pyzlog.aio (public) and pyzlog.client.aio wrap Log; the async stream
    and the named consumers sit below it; the consumers' storage is core."""
    g = graph()
    assert "pyzlog.client.log" in g["pyzlog.client.aio"] and "pyzlog.client.aio" in g["pyzlog.aio"]
    assert "pyzlog.client.log" not in g["pyzlog.client.aio_stream"]
    assert "pyzlog.client.log" not in g["pyzlog.client.consumer"]
    assert "pyzlog.core.offsets" in g["pyzlog.client.consumer"] and package_of("pyzlog.core.offsets") == "pyzlog.core"
