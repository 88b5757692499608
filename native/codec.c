/* pyzlog.objects._codec: the decoder of the object layer's value codec.
 *
 * codec.py defines the form (its tags, MAX_DEPTH) and encodes; this reads
 * it back, for every command applied and every checkpoint loaded. The bytes
 * come from the log or from RADOS, written by anyone: every length and count
 * is checked against what is left before it is used, nesting is bounded by
 * MAX_DEPTH (no recursion past it), and damaged bytes end in ValueError (or
 * TypeError: a dict key that cannot be hashed), which codec.py tells as
 * BadEntry. Never a crash, never a read past the buffer: tests/unit checks it
 * against a reference decoder on damaged and cut bytes, and the sanitizer
 * tier runs those tests under ASan and UBSan.
 *
 * configure(missing, max_depth, tags): codec.py's MISSING, MAX_DEPTH and its
 *   tags in the order NONE, FALSE, TRUE, INT, FLOAT, STR, BYTES, LIST, TUPLE,
 *   DICT, MISSING, BIGINT, SSTR, SBYTES, SINT (defined there, once).
 * load_from(data, off) -> (value, end): the value at `off` of `data` (bytes)
 *   and the offset after it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { K_BAD, K_NONE, K_FALSE, K_TRUE, K_INT, K_FLOAT, K_STR, K_BYTES, K_LIST, K_TUPLE, K_DICT, K_MISSING,
       K_BIGINT, K_SSTR, K_SBYTES, K_SINT, K_COUNT };

static struct {
  int ready;
  int max_depth;
  PyObject *missing;
  unsigned char kind[256]; /* tag -> K_* */
} C;

static PyObject *fail(const char *msg) {
  PyErr_SetString(PyExc_ValueError, msg);
  return NULL;
}

static uint64_t le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* The value at *off (< n or not: checked); *off moves past it. */
static PyObject *dec(const unsigned char *d, Py_ssize_t n, Py_ssize_t *off, int depth) {
  Py_ssize_t o = *off;
  if (o >= n) return fail("the value runs past the end");
  int kind = C.kind[d[o++]];
  PyObject *v = NULL;
  Py_ssize_t len;
  switch (kind) {
    case K_SSTR:
    case K_SBYTES:
    case K_STR:
    case K_BYTES: {
      int wide = kind == K_STR || kind == K_BYTES;
      if (n - o < (wide ? 4 : 1)) return fail("a length runs past the end");
      len = wide ? (Py_ssize_t)le(d + o, 4) : d[o];
      o += wide ? 4 : 1;
      if (len > n - o) return fail("a length runs past the end");
      v = (kind == K_SSTR || kind == K_STR) ? PyUnicode_DecodeUTF8((const char *)d + o, len, NULL)
                                            : PyBytes_FromStringAndSize((const char *)d + o, len);
      o += len;
      break;
    }
    case K_SINT:
      if (o >= n) return fail("an int runs past the end");
      v = PyLong_FromLong((signed char)d[o]);
      o += 1;
      break;
    case K_INT:
      if (n - o < 8) return fail("an int runs past the end");
      v = PyLong_FromLongLong((long long)le(d + o, 8));
      o += 8;
      break;
    case K_FLOAT: {
      if (n - o < 8) return fail("a float runs past the end");
      uint64_t bits = le(d + o, 8);
      double x;
      memcpy(&x, &bits, sizeof x);
      v = PyFloat_FromDouble(x);
      o += 8;
      break;
    }
    case K_NONE:
      v = Py_NewRef(Py_None);
      break;
    case K_TRUE:
      v = Py_NewRef(Py_True);
      break;
    case K_FALSE:
      v = Py_NewRef(Py_False);
      break;
    case K_MISSING:
      v = Py_NewRef(C.missing);
      break;
    case K_BIGINT:
      if (n - o < 2) return fail("a length runs past the end");
      len = (Py_ssize_t)le(d + o, 2);
      o += 2;
      if (len > n - o) return fail("a length runs past the end");
      v = _PyLong_FromByteArray(d + o, (size_t)len, 1, 1);
      o += len;
      break;
    case K_LIST:
    case K_TUPLE:
    case K_DICT: {
      if (depth >= C.max_depth) return PyErr_Format(PyExc_ValueError, "nested deeper than %d", C.max_depth);
      if (n - o < 4) return fail("a count runs past the end");
      len = (Py_ssize_t)le(d + o, 4);
      o += 4;
      if (len > n - o)  /* every item takes a byte at least: a count cannot exceed what is left */
        return PyErr_Format(PyExc_ValueError, "a count of %zd runs past the end", len);
      if (kind == K_DICT) {
        v = PyDict_New();
        for (Py_ssize_t i = 0; v && i < len; i++) {
          PyObject *k = dec(d, n, &o, depth + 1);
          PyObject *x = k ? dec(d, n, &o, depth + 1) : NULL;
          if (!x || PyDict_SetItem(v, k, x) < 0) Py_CLEAR(v);  /* (an unhashable key: TypeError) */
          Py_XDECREF(k);
          Py_XDECREF(x);
        }
      } else {
        /* grown item by item, never made at the size the count claims: each of 64 nested
         * counts may claim all that is left, and slots made up front would cost 8 bytes
         * per byte of input at every level */
        v = PyList_New(0);
        for (Py_ssize_t i = 0; v && i < len; i++) {
          PyObject *x = dec(d, n, &o, depth + 1);
          if (!x || PyList_Append(v, x) < 0) Py_CLEAR(v);
          Py_XDECREF(x);
        }
        if (v && kind == K_TUPLE) Py_SETREF(v, PyList_AsTuple(v));
      }
      break;
    }
    default:
      return PyErr_Format(PyExc_ValueError, "unknown tag %d", d[o - 1]);
  }
  if (v) *off = o;
  return v;
}

static PyObject *load_from(PyObject *self, PyObject *args) {
  PyObject *data;
  Py_ssize_t off;
  if (!PyArg_ParseTuple(args, "O!n", &PyBytes_Type, &data, &off)) return NULL;
  if (!C.ready) return PyErr_Format(PyExc_RuntimeError, "pyzlog.objects._codec is not configured");
  Py_ssize_t n = PyBytes_GET_SIZE(data);
  if (off < 0 || off > n) return PyErr_Format(PyExc_ValueError, "offset %zd outside %zd bytes", off, n);
  PyObject *v = dec((const unsigned char *)PyBytes_AS_STRING(data), n, &off, 0);
  if (!v) return NULL;
  PyObject *out = Py_BuildValue("(Nn)", v, off);
  return out;
}

static PyObject *configure(PyObject *self, PyObject *args) {
  PyObject *missing, *tags;
  int max_depth;
  if (!PyArg_ParseTuple(args, "OiO!", &missing, &max_depth, &PyTuple_Type, &tags)) return NULL;
  if (PyTuple_GET_SIZE(tags) != K_COUNT - 1 || max_depth < 1 || max_depth > 1000)
    return PyErr_Format(PyExc_ValueError, "configure takes MISSING, MAX_DEPTH (1..1000) and the %d tags",
                        K_COUNT - 1);
  unsigned char kind[256] = {0};
  for (Py_ssize_t i = 0; i < K_COUNT - 1; i++) {
    long t = PyLong_AsLong(PyTuple_GET_ITEM(tags, i));
    if (t == -1 && PyErr_Occurred()) return NULL;
    if (t < 0 || t > 255 || kind[t]) return PyErr_Format(PyExc_ValueError, "tag %ld: not a distinct byte", t);
    kind[t] = (unsigned char)(i + 1);
  }
  memcpy(C.kind, kind, sizeof kind);
  Py_XSETREF(C.missing, Py_NewRef(missing));
  C.max_depth = max_depth;
  C.ready = 1;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "codec.py's MISSING, MAX_DEPTH and tags"},
    {"load_from", load_from, METH_VARARGS, "the value at an offset of bytes, and the offset after it"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_codec", "the object layer's value decoder", -1,
                                    methods};

PyMODINIT_FUNC PyInit__codec(void) { return PyModule_Create(&module); }
