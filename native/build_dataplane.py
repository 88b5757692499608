"""Writes the C source of pyzlog._dataplane with cffi (API mode).

CMake runs this at build time (native/CMakeLists.txt) and compiles the output
against libzlog_dataplane (native/dataplane.c), so `pip install .` builds the
module like the other native parts. dataplane.h is both the C header and the
cdef: preprocessor lines are left out, as are `#ifdef __cplusplus` blocks,
and `#ifdef CFFI_CDEF` blocks (the structs of ops.h, as cffi should see them)
are kept.
"""
from __future__ import annotations

import sys
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent


def cdef_of(header: str) -> str:
    out: list[str] = []
    stack: list[bool] = []  # per open #if: are its lines kept?
    for line in header.splitlines():
        s = line.strip()
        if s.startswith("#"):
            words = s[1:].split()
            d = words[0] if words else ""
            if d in ("if", "ifdef", "ifndef"):
                keep = not (d == "ifdef" and words[1:2] == ["__cplusplus"])
                stack.append(keep)
            elif d == "endif":
                stack.pop()
            continue
        if all(stack):
            out.append(line)
    return "\n".join(out)


#: A dp_batch owned by a PyCapsule (pyzlog.core.scan): Arrow drops the
#: capsule in a noexcept C++ destructor, on any thread, and its destructor
#: frees the batch right there without giving up the GIL or running Python
#: code (either could let a daemon thread exit through those frames at
#: interpreter exit: std::terminate).
CAPSULE_SOURCE = """
static void dp_batch_capsule_free(PyObject *capsule) {
  dp_batch *b = (dp_batch *)PyCapsule_GetPointer(capsule, NULL);
  if (b != NULL) dp_batch_free(b); else PyErr_Clear();
}
static void *dp_batch_capsule_destructor(void) { return (void *)dp_batch_capsule_free; }
"""


def make_ffi() -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef(cdef_of((HERE / "dataplane.h").read_text()))
    ffi.cdef("void *dp_batch_capsule_destructor(void);")
    ffi.set_source("pyzlog._dataplane", '#include "dataplane.h"\n' + CAPSULE_SOURCE)
    return ffi


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build_dataplane.py OUTPUT.c")
    make_ffi().emit_c_code(sys.argv[1])
