"""docker/cluster.py loaded as a module for the tests (it is a script, not
part of the installed package), like vstartmod for vstart.py."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("zlog_docker_cluster", ROOT / "docker" / "cluster.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


dcluster = sys.modules.get("zlog_docker_cluster") or _load()
