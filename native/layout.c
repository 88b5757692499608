/* pyzlog.core._layout: sorted positions grouped by the data object that
 * holds them, for core.layout.by_object's common case (every position in
 * the newest view), and the first item of a list that is not plainly a
 * position.
 *
 * group(positions, start, span, width, unit) -> [[position, ...], ...]
 * `positions`: a list of ints, sorted (ValueError if not: the grouping
 * relies on it), each >= start. Position p of a view that starts at `start`
 * lies in stripe (p - start) // span (0 when span is 0: an unbounded view),
 * object index zlog_index_of (cls_zlog/ops.h, the layout's definition). One
 * list per object, in the order of each object's first position, each in
 * order; the items are the input's own int objects.
 *
 * first_odd(positions) -> index: of the first item that is not an int (the
 * exact type) in [0, ZLOG_MAX_POSITION], or -1 when every one is. The
 * common list of positions in one pass; layout.check_positions judges the
 * odd one (and those after it) by check_position, the one rule.
 *
 * In Python these loops cost about 100 ns a position: a stream's replay
 * groups thousands of them per read round. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "ops.h"

/* A Python int in [0, max] into *out; 0, or -1 with OverflowError. */
static int u64_arg(PyObject *o, const char *name, unsigned long long max, unsigned long long *out) {
  if (!PyLong_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name, Py_TYPE(o)->tp_name);
    return -1;
  }
  const unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
  if (v > max) {
    PyErr_Format(PyExc_OverflowError, "%s %llu is over %llu", name, v, max);
    return -1;
  }
  *out = v;
  return 0;
}

static PyObject *group(PyObject *self, PyObject *args) {
  PyObject *positions, *start_o, *span_o, *width_o, *unit_o;
  unsigned long long start, span, width, unit;
  if (!PyArg_ParseTuple(args, "O!OOOO", &PyList_Type, &positions, &start_o, &span_o, &width_o, &unit_o)) return NULL;
  if (u64_arg(start_o, "start", UINT64_MAX, &start) < 0 || u64_arg(span_o, "span", UINT64_MAX, &span) < 0 ||
      u64_arg(width_o, "width", UINT32_MAX, &width) < 0 || u64_arg(unit_o, "unit", UINT32_MAX, &unit) < 0)
    return NULL;
  if (width == 0) return PyErr_Format(PyExc_ValueError, "width 0");
  PyObject *out = PyList_New(0);
  if (!out) return NULL;
  /* The current stripe's lists by object index, each a reference of our own
   * (a finalizer that empties `out` cannot free one under us), and which
   * indexes are set (a stripe change clears those, not all `width`): sorted
   * positions never go back to an earlier stripe. */
  PyObject **lists = PyMem_Calloc((size_t)width, sizeof *lists);
  uint32_t *used = PyMem_Calloc((size_t)width, sizeof *used);
  size_t nused = 0;
  PyObject *item = NULL;
  if (!lists || !used) {
    PyErr_NoMemory();
    goto fail;
  }
  uint64_t stripe = 0, prev = 0;
  /* the list's size is read afresh each time and each item held while in use:
   * an allocation may run a finalizer (any code, which may change the list) */
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(positions); ++i) {
    item = Py_NewRef(PyList_GET_ITEM(positions, i));
    const unsigned long long p = PyLong_AsUnsignedLongLong(item);
    if (p == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
    if (i && p < prev) {
      PyErr_Format(PyExc_ValueError, "positions to group by object must be sorted (%llu after %llu)", p,
                   (unsigned long long)prev);
      goto fail;
    }
    if (p < start) {
      PyErr_Format(PyExc_ValueError, "position %llu lies before the view's start %llu", p, start);
      goto fail;
    }
    prev = p;
    const uint64_t s = span ? (p - start) / span : 0;
    if (i == 0 || s != stripe) {
      stripe = s;
      for (size_t k = 0; k < nused; ++k) Py_CLEAR(lists[used[k]]);
      nused = 0;
    }
    const uint32_t index = zlog_index_of(p, start + s * span, (uint32_t)width, (uint32_t)unit);
    if (!lists[index]) {
      PyObject *list = PyList_New(0);
      if (!list) goto fail;
      lists[index] = list;
      used[nused++] = index;
      if (PyList_Append(out, list) < 0) goto fail;
    }
    if (PyList_Append(lists[index], item) < 0) goto fail;
    Py_CLEAR(item);
  }
  for (size_t k = 0; k < nused; ++k) Py_CLEAR(lists[used[k]]);
  PyMem_Free(lists);
  PyMem_Free(used);
  return out;
fail:
  Py_XDECREF(item);
  if (lists && used)
    for (size_t k = 0; k < nused; ++k) Py_CLEAR(lists[used[k]]);
  PyMem_Free(lists);
  PyMem_Free(used);
  Py_DECREF(out);
  return NULL;
}

static PyObject *first_odd(PyObject *self, PyObject *arg) {
  if (!PyList_Check(arg)) return PyErr_Format(PyExc_TypeError, "positions must be a list");
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(arg); ++i) {
    PyObject *item = PyList_GET_ITEM(arg, i); /* nothing below allocates or runs code */
    if (!PyLong_CheckExact(item)) return PyLong_FromSsize_t(i);
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (v == -1 && PyErr_Occurred()) return NULL;
    if (overflow < 0 || (!overflow && v < 0)) return PyLong_FromSsize_t(i);
    if (overflow > 0) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(item);
      if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* past 64 bits */
        return PyLong_FromSsize_t(i);
      }
      if (u > ZLOG_MAX_POSITION) return PyLong_FromSsize_t(i);
    }
  }
  return PyLong_FromLong(-1);
}

static PyMethodDef module_methods[] = {
    {"group", group, METH_VARARGS, "sorted positions of one view, grouped by the object that holds them"},
    {"first_odd", first_odd, METH_O, "the index of the first item that is not an int position, or -1"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "pyzlog.core._layout",
                                    "positions grouped by data object", -1, module_methods};

PyMODINIT_FUNC PyInit__layout(void) { return PyModule_Create(&module); }
