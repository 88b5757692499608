"""The unit tier's premise: what it tests imports without python-rados and
without a cluster (tests/unit runs in seconds, before anything starts Ceph)."""
from __future__ import annotations

import subprocess
import sys

#: the modules the unit tier exercises
UNIT_MODULES = ("pyzlog.core.wire", "pyzlog.core.native", "pyzlog.core.scan", "pyzlog.core.errors",
                "pyzlog.core.layout", "pyzlog.core.batching", "pyzlog.bench.batching_bench", "pyzlog.client.reader", "pyzlog.client.appending", "pyzlog.client.pipeline",
                "pyzlog.spark.plan", "pyzlog.spark.options", "pyzlog.admin.cli", "pyzlog.objects")


def test_unit_modules_import_without_python_rados() -> None:
    code = ("import sys\n"
            f"for m in {UNIT_MODULES!r}:\n"
            "    __import__(m)\n"
            "print('rados' in sys.modules)")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
