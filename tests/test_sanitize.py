"""The sanitizer tier (issue 24): the native parts built with AddressSanitizer
and UndefinedBehaviorSanitizer (ZLOG_SANITIZE=1, CMakeLists.txt), and the
tests of the sequencer server, the data plane and the append pipeline run on
that build, against this session's cluster.

The sanitized copy of the package goes into build/sanitize/site (`./dev setup
--sanitize` makes it; this test rebuilds it incrementally, or uses
ZLOG_SANITIZE_SITE). Python is not sanitized, so the run preloads libasan
(and libstdc++, so that ASan finds __cxa_throw). Every report goes to a file
per process (the zlog-seqr daemons the tests start are sanitized too):

- any AddressSanitizer error or UndefinedBehaviorSanitizer runtime error fails;
- a leak fails if a frame of its stack is in our sources (seqr/, native/,
  cls_zlog/); CPython's, librados' and OpenSSL's memory kept to exit is not
  judged (tests/sanitize/*.supp says what else is suppressed, and why).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from functools import cache
from pathlib import Path

import pytest

from vstartmod import ROOT, vstart

HERE = Path(__file__).resolve().parent
SUPP = HERE / "sanitize"
#: the focused subset: every test of these files (a few minutes under ASan)
TESTS = ["tests/test_seqr_server.py", "tests/test_streams_seqr.py", "tests/test_dataplane.py", "tests/test_seqr_auth.py",
         "tests/test_batches.py", "tests/test_aio.py", "tests/test_client.py",
         # stream()'s records (pyzlog._records) and the row sets that point into windows they hold
         "tests/unit/test_records.py", "tests/unit/test_scan.py",
         # async appends' C loops (native/appender_hot.cc) on their own
         "tests/unit/test_hot_path.py",
         # an async proposal's way into the log and each append's outcome (pyzlog.objects._propose)
         "tests/unit/test_propose_native.py",
         # the objects' value decoder (pyzlog.objects._codec) on damaged, cut and random bytes
         "tests/unit/test_objects_unit.py",
         # positions grouped by object (pyzlog.core._layout), bad input included
         "tests/unit/test_logic.py"]
#: left out, and why: their scripts exit with librados connections open (one with
#: calls in flight, on purpose); under ASan's slower exit, Ceph's own static
#: destructors race its MonClient threads (`terminate ... boost::bad_get`, or a
#: memcmp on a freed option name in libceph-common). The normal suite runs them.
DESELECT = "not test_exit_with_reads_in_flight and not test_ten_logs_share_one_connection"
OURS = re.compile(r"/(?:seqr|native|cls_zlog)/[\w.]+:\d+|/native/_dataplane\.c:\d+")


def _lib(name: str) -> str:
    out = subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout.strip()
    if not os.path.isabs(out):
        pytest.skip(f"g++ does not know {name} (install g++ with its sanitizer runtimes)")
    return out


@cache  # both tests use one build: a second pip run only copies the site again
def sanitized_site() -> Path:
    given = os.environ.get("ZLOG_SANITIZE_SITE")
    if given:
        return Path(given)
    site = ROOT / "build" / "sanitize" / "site"
    # incremental: build/sanitize/cmake keeps the objects between runs
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--upgrade", "--no-deps",
                        "--no-build-isolation", "--target", str(site),
                        "--config-settings=build-dir=build/sanitize/cmake", "."],
                       cwd=ROOT, env={**os.environ, "ZLOG_SANITIZE": "1"}, capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, f"the sanitized build failed:\n{r.stderr[-4000:]}"
    return site


def sanitizer_env(site: Path, logs: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=f"{_lib('libasan.so')} {_lib('libstdc++.so.6')}",
        # SUPP holds a sitecustomize.py that shuts librados connections down at exit
        PYTHONPATH=os.pathsep.join(p for p in (str(site), str(SUPP), env.get("PYTHONPATH", "")) if p),
        # leaks are reported (and judged here), not turned into exit codes: python
        # keeps memory to exit, and the tests check their subprocesses' codes
        ASAN_OPTIONS=f"detect_leaks=1:abort_on_error=1:log_path={logs}/asan:suppressions={SUPP}/asan.supp",
        LSAN_OPTIONS=f"exitcode=0:suppressions={SUPP}/lsan.supp",
        # python objects in malloc, where LeakSanitizer looks for pointers (pymalloc's
        # arenas are mmap'd: memory held only by a python object would look leaked)
        PYTHONMALLOC="malloc",
        UBSAN_OPTIONS=f"halt_on_error=1:print_stacktrace=1:log_path={logs}/ubsan",
    )
    return env


def findings(logs: Path) -> list[str]:
    """The reports that fail the tier, from every process's log file."""
    bad: list[str] = []
    for f in sorted(logs.iterdir()):
        text = f.read_text(errors="replace")
        for m in re.finditer(r"ERROR: AddressSanitizer: [^\n]*", text):
            bad.append(f"{f.name}: {m.group(0)}\n{text[m.start():m.start() + 3000]}")
        for m in re.finditer(r"runtime error: [^\n]*", text):
            bad.append(f"{f.name}: {m.group(0)}\n{text[max(0, m.start() - 300):m.start() + 2000]}")
        for block in re.split(r"\n(?=(?:Direct|Indirect) leak of )", text):
            if re.match(r"(?:Direct|Indirect) leak of ", block) and OURS.search(block):
                bad.append(f"{f.name}: leak\n" + "\n".join(
                    ln for ln in block.splitlines()[:40] if "python3" not in ln))
    return bad


def test_native_tests_run_clean_under_asan_and_ubsan(ceph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    site = sanitized_site()
    logs = tmp_path / "reports"
    logs.mkdir()
    env = sanitizer_env(site, logs)
    env.update(ZLOG_TEST_CONF=ceph.conf, ZLOG_TEST_POOL=ceph.pool)
    # the run loads the sanitized modules, not the venv's
    probe = subprocess.run([sys.executable, "-c", "import pyzlog._seqr as s, pyzlog._appender as a, "
                            "pyzlog._dataplane as d; print(s.__file__); print(a.__file__); print(d.__file__)"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert all(line.startswith(str(site)) for line in probe.stdout.split()), probe.stdout
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                        f"--basetemp={tmp_path / 'inner'}", "-k", DESELECT, *TESTS],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    bad = findings(logs)
    assert not bad, f"{len(bad)} sanitizer finding(s); the first:\n" + bad[0][:6000]
    summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    assert re.search(r"\d+ passed", summary) and "failed" not in summary and "error" not in summary, \
        r.stdout[-6000:] + r.stderr[-3000:]
    if r.returncode == -6 and tracer_crashed(logs):
        # every test passed; LeakSanitizer's own tracer crashed at exit (no finding: inconclusive)
        warnings.warn("LeakSanitizer's tracer crashed at the inner run's exit: its leak check is inconclusive")
    else:
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]


#: the object class's tests (the hypothesis model included), run against an OSD that loads the sanitized class
CLS_TESTS = ["tests/test_cls_zlog.py", "tests/test_cls_data.py", "tests/test_cls_malformed.py",
             "tests/test_cls_corrupt.py", "tests/test_cls_model.py"]
CLS_FRAME = re.compile(r"libcls_zlog\.so|/cls_zlog/[\w.]+:\d+")


def class_findings(logs: Path) -> list[str]:
    """The OSD's reports that fail: any UBSan runtime error (only the class is
    instrumented) and any ASan error with a frame in the class (ceph-osd is not
    instrumented; its own memory errors are not ours to judge)."""
    bad: list[str] = []
    for f in sorted(logs.iterdir()):
        text = f.read_text(errors="replace")
        for m in re.finditer(r"runtime error: [^\n]*", text):
            bad.append(f"{f.name}: {m.group(0)}\n{text[max(0, m.start() - 300):m.start() + 2000]}")
        for m in re.finditer(r"ERROR: AddressSanitizer: [^\n]*", text):
            report = text[m.start():m.start() + 6000]
            if CLS_FRAME.search(report):
                bad.append(f"{f.name}: {m.group(0)}\n{report[:3000]}")
    return bad


def test_object_class_runs_clean_under_asan_and_ubsan_in_the_osd(tmp_path: Path) -> None:
    """The sanitized libcls_zlog.so loaded by a real ceph-osd that preloads
    libasan (vstart --sanitize-osds), and the class tests run against it."""
    site = sanitized_site()
    c = vstart.Cluster(tmp_path / "cluster")
    try:
        st = c.start(osds=1, cls_lib=site / "pyzlog" / "cls" / "libcls_zlog.so", sanitize_osds=True,
                     owner_pid=os.getpid())
        pid = c.daemons()["osd.0"]
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "libasan" in maps and "libcls_zlog" in maps, "the OSD does not run the sanitized class"
        env = {**os.environ, "ZLOG_TEST_CONF": st["conf"], "ZLOG_TEST_POOL": st["pool"]}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                            f"--basetemp={tmp_path / 'inner'}", *CLS_TESTS],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
        alive = c.daemons().get("osd.0") == pid  # an error halts the OSD (halt_on_error)
    finally:
        c.stop()
    bad = class_findings(c.sanitizer_reports)
    assert not bad, f"{len(bad)} sanitizer finding(s) in the object class; the first:\n" + bad[0][:6000]
    assert alive, "the OSD died under the class tests:\n" + vstart._tail(c.log_dir / "osd.0.log", 40)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]


def test_class_findings_are_recognised(tmp_path: Path) -> None:
    """An ASan error in the class or any UBSan runtime error fails; an ASan
    error wholly inside ceph-osd does not."""
    (tmp_path / "asan.1").write_text("==1==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x1\n"
                                     "    #0 0x1 in memcpy\n    #1 0x2 in OSD::foo (/usr/bin/ceph-osd+0x1)\n")
    assert class_findings(tmp_path) == []
    (tmp_path / "asan.2").write_text("==2==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x1\n"
                                     "    #1 0x2 in zlog::put /x/cls_zlog/data.cc:120\n")
    (tmp_path / "ubsan.3").write_text("/x/cls_zlog/data.cc:10:5: runtime error: shift exponent 64\n")
    got = class_findings(tmp_path)
    assert len(got) == 2 and "heap-buffer-overflow" in got[0] and "runtime error" in got[1]


def tracer_crashed(logs: Path) -> bool:
    return any("LeakSanitizer has encountered a fatal error" in f.read_text(errors="replace")
               for f in logs.iterdir())


def test_findings_are_recognised(tmp_path: Path) -> None:
    """The filter catches an error, a runtime error and a leak of ours, and lets
    python's own leaks and pybind11's module records pass."""
    (tmp_path / "asan.1").write_text(
        "Direct leak of 64 byte(s) in 1 object(s) allocated from:\n"
        "    #0 0x1 in malloc asan_malloc_linux.cpp:69\n    #1 0x2 in PyMem_Malloc (/usr/bin/python3.11+0x1)\n\n"
        "SUMMARY: AddressSanitizer: 64 byte(s) leaked in 1 allocation(s).\n")
    assert findings(tmp_path) == []
    (tmp_path / "asan.2").write_text(
        "Direct leak of 8 byte(s) in 1 object(s) allocated from:\n"
        "    #0 0x1 in malloc asan_malloc_linux.cpp:69\n    #1 0x2 in dp_pool_open /x/native/dataplane.c:259\n")
    (tmp_path / "ubsan.3").write_text("/x/seqr/client.cc:10:5: runtime error: signed integer overflow\n")
    (tmp_path / "asan.4").write_text("==1==ERROR: AddressSanitizer: heap-use-after-free on address 0x1\n")
    got = findings(tmp_path)
    assert len(got) == 3 and "leak" in got[0] and "use-after-free" in got[1] and "runtime error" in got[2]
