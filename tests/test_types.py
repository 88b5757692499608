"""The package type-checks: `mypy --strict pyzlog` over this checkout's
sources (issue 26), with the configuration in pyproject.toml ([tool.mypy]).
No cluster, but not in the unit tier either: a first run without a cache
takes half a minute on a loaded 2-core machine, and the unit tier stays
under 30 s. mypy's cache is the checkout's .mypy_cache (the one a run by
hand uses too), so a run after the first takes a second or two."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (it comes with the test extra: pip install '.[test]')")
def test_mypy_strict_passes_on_the_package() -> None:
    # From the checkout's root, naming its pyzlog/ directory: mypy checks these
    # files, never a pyzlog installed in site-packages.
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"),
                          "pyzlog"], cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, f"mypy --strict pyzlog:\n{out.stdout[-8000:]}{out.stderr[-2000:]}"
    assert "Success: no issues found" in out.stdout, out.stdout
