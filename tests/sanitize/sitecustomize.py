"""Loaded by every python process of the sanitizer tier (tests/test_sanitize.py
puts this folder on PYTHONPATH): at exit, shut down every librados connection
still open, before the interpreter and the C++ static destructors go.

Ceph's own static destructors race its MonClient threads when a process exits
with a connection open (`terminate ... boost::bad_get`, or a memcmp on a freed
option name in libceph-common); under ASan's slower exit that happens about
every other time, in Ceph, none of ours. The normal suite runs the same tests
without this."""
import atexit
import gc


def _shutdown_rados() -> None:
    import sys

    rados = sys.modules.get("rados")
    if rados is None:
        return
    for o in gc.get_objects():
        if isinstance(o, rados.Rados) and getattr(o, "state", "") == "connected":
            try:
                o.shutdown()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass


atexit.register(_shutdown_rados)  # registered first: runs after the program's own handlers

# Leaks are judged in the process the tier starts (the inner pytest, where the
# sequencer server, the data plane and the append pipeline run in-process), not
# in the processes it starts in turn (zlog-seqr daemons, scripts, examples):
# their ASan and UBSan reports count, but LeakSanitizer's tracer itself crashes
# now and then in a process exiting with many threads ("Tracer caught signal
# 11 ... LeakSanitizer has encountered a fatal error"), which says nothing of
# our code. The runtime read this process's options already; this is for its children.
import os  # noqa: E402

_opts = os.environ.get("ASAN_OPTIONS", "")
if "detect_leaks=1" in _opts:
    os.environ["ASAN_OPTIONS"] = _opts.replace("detect_leaks=1", "detect_leaks=0")
