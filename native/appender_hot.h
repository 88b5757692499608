// pyzlog._appender.HotPath and settle: the per-entry loops of async appends
// in C (appender_hot.cc says what they take on and what they leave to Python).
#pragma once

#include <Python.h>

namespace zlog_native {

// Adds HotPath, settle, configure_latency and latency to the module; throws
// pybind11::error_already_set on failure.
void add_hot_path(PyObject* module);

}  // namespace zlog_native
