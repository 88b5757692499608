"""Writes the C source of pyzlog._fastread with cffi (API mode).

CMake runs this at build time (fastread/CMakeLists.txt) and compiles the
output together with fastread.c against librados, so `pip install .` builds
the module like the other native parts. fastread.h is both the C header and
the cdef: lines starting with '#' (the include guard and includes) are left
out of the cdef.
"""
from __future__ import annotations

import sys
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent


def make_ffi() -> cffi.FFI:
    header = (HERE / "fastread.h").read_text()
    ffi = cffi.FFI()
    ffi.cdef("\n".join(line for line in header.splitlines() if not line.lstrip().startswith("#")))
    ffi.set_source("pyzlog._fastread", '#include "fastread.h"\n')
    return ffi


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build_fastread.py OUTPUT.c")
    make_ffi().emit_c_code(sys.argv[1])
