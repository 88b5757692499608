/* pyzlog._records: the records of one Arrow batch, made one at a time.
 *
 * stream() hands out a Record (a tuple: position, kind, data, epoch) per
 * entry. Made in bulk (pyarrow's to_pylist, then a tuple per row) every
 * entry's bytes are allocated before the first is used: megabytes of fresh
 * memory per batch, written once and read back cold. Made here as the
 * reader asks, each record's bytes reuse the memory of the one the reader
 * just dropped, still in cache. This is the one native part that makes
 * Python objects, so it is written against the C API: cffi cannot make them,
 * and pybind11's call per __next__ would cost more than the record.
 *
 * records(positions, offsets, data, validity, kinds, epochs, offset, n,
 *         record_type, kind_values) -> iterator of record_type
 * Each column is an object with the buffer protocol (a pyarrow.Buffer):
 * positions and epochs 64-bit integers, offsets the binary column's int32
 * offsets, data its bytes, validity its bitmap (None: no nulls), kinds one
 * int8 code per row, an index into kind_values. Rows offset .. offset + n - 1
 * (the arrays' own offset), as a null data is None. The iterator holds the
 * buffers until it is exhausted or dropped.
 *
 * rows_records(address, owner, record_type, kind_values) -> the same, from
 * a dp_rows (native/dataplane.h) at `address`, which `owner` keeps alive
 * (the iterator holds `owner`): each record's bytes copied straight from the
 * read_range reply, with no Arrow column in between. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "dataplane.h"

enum { B_POS, B_OFF, B_DATA, B_VALID, B_KIND, B_EPOCH, B_COUNT };

typedef struct {
  PyObject_HEAD
  const dp_rows *rows;   /* rows_records: the rows (then bufs are unused) */
  PyObject *owner;       /* what keeps them alive */
  Py_buffer bufs[B_COUNT];
  int held[B_COUNT];
  Py_ssize_t offset, next, end; /* rows [next, end) are left (array indexes) */
  PyTypeObject *record_type;
  PyObject *kind_values; /* a tuple */
  PyObject *epoch;       /* the last epoch made, reused while it repeats */
  uint64_t epoch_value;
} RecordIter;

static void release(RecordIter *it) {
  for (int i = 0; i < B_COUNT; ++i)
    if (it->held[i]) {
      PyBuffer_Release(&it->bufs[i]);
      it->held[i] = 0;
    }
  it->rows = NULL;
  Py_CLEAR(it->owner);
}

static void iter_dealloc(RecordIter *it) {
  Py_CLEAR(it->owner);
  release(it);
  Py_XDECREF(it->record_type);
  Py_XDECREF(it->kind_values);
  Py_XDECREF(it->epoch);
  PyObject_Free(it);
}

/* The record of row i, from its fields (data NULL: None). */
static PyObject *make(RecordIter *it, Py_ssize_t i, uint64_t position, int code, uint64_t epoch, const char *data,
                      Py_ssize_t len) {
  if (code < 0 || code >= PyTuple_GET_SIZE(it->kind_values)) {
    PyErr_Format(PyExc_ValueError, "row %zd: kind code %d out of range", i - it->offset, code);
    return NULL;
  }
  if (it->epoch == NULL || epoch != it->epoch_value) {
    PyObject *e = PyLong_FromUnsignedLongLong(epoch);
    if (!e) return NULL;
    Py_XSETREF(it->epoch, e);
    it->epoch_value = epoch;
  }
  PyObject *pos = PyLong_FromUnsignedLongLong(position);
  if (!pos) return NULL;
  PyObject *d = data ? PyBytes_FromStringAndSize(data, len) : Py_NewRef(Py_None);
  if (!d) {
    Py_DECREF(pos);
    return NULL;
  }
  PyObject *rec = it->record_type->tp_alloc(it->record_type, 4);
  if (!rec) {
    Py_DECREF(pos);
    Py_DECREF(d);
    return NULL;
  }
  PyTuple_SET_ITEM(rec, 0, pos);
  PyTuple_SET_ITEM(rec, 1, Py_NewRef(PyTuple_GET_ITEM(it->kind_values, code)));
  PyTuple_SET_ITEM(rec, 2, d);
  PyTuple_SET_ITEM(rec, 3, Py_NewRef(it->epoch));
  it->next = i + 1;
  return rec;
}

static PyObject *iter_next(RecordIter *it) {
  if (it->next >= it->end) {
    release(it); /* exhausted: the batch's memory can go now */
    return NULL;
  }
  const Py_ssize_t i = it->next;
  if (it->rows) {
    const dp_rows *r = it->rows;
    return make(it, i, r->positions[i], r->kinds[i], r->epochs[i], r->data[i], r->lens[i]);
  }
  const uint8_t *valid = it->held[B_VALID] ? (const uint8_t *)it->bufs[B_VALID].buf : NULL;
  const int8_t code = ((const int8_t *)it->bufs[B_KIND].buf)[i];
  const int32_t *off = (const int32_t *)it->bufs[B_OFF].buf;
  const int data = valid == NULL || (valid[i >> 3] >> (i & 7)) & 1;
  return make(it, i, ((const uint64_t *)it->bufs[B_POS].buf)[i], code, ((const uint64_t *)it->bufs[B_EPOCH].buf)[i],
              data ? (const char *)it->bufs[B_DATA].buf + off[i] : NULL, data ? off[i + 1] - off[i] : 0);
}

static PyObject *iter_length_hint(RecordIter *it, PyObject *unused) {
  return PyLong_FromSsize_t(it->end - it->next);
}

static PyMethodDef iter_methods[] = {
    {"__length_hint__", (PyCFunction)iter_length_hint, METH_NOARGS, "records not handed out yet"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject RecordIterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pyzlog._records.RecordIter",
    .tp_basicsize = sizeof(RecordIter),
    .tp_dealloc = (destructor)iter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "the records of one batch, made as they are asked for",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)iter_next,
    .tp_methods = iter_methods,
};

/* A buffer of at least `need` bytes, or an exception. */
static int take(RecordIter *it, int which, PyObject *obj, Py_ssize_t need, const char *what) {
  if (PyObject_GetBuffer(obj, &it->bufs[which], PyBUF_SIMPLE) < 0) return -1;
  it->held[which] = 1;
  if (it->bufs[which].len < need) {
    PyErr_Format(PyExc_ValueError, "%s: %zd bytes, %zd needed", what, it->bufs[which].len, need);
    return -1;
  }
  return 0;
}

static RecordIter *new_iter(PyObject *record_type, PyObject *kind_values) {
  if (!PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
    PyErr_Format(PyExc_TypeError, "record_type must be a tuple type");
    return NULL;
  }
  RecordIter *it = PyObject_New(RecordIter, &RecordIterType);
  if (!it) return NULL;
  it->rows = NULL;
  it->owner = NULL;
  for (int i = 0; i < B_COUNT; ++i) it->held[i] = 0;
  it->record_type = (PyTypeObject *)Py_NewRef(record_type);
  it->kind_values = Py_NewRef(kind_values);
  it->epoch = NULL;
  it->epoch_value = 0;
  it->offset = it->next = it->end = 0;
  return it;
}

static PyObject *rows_records(PyObject *self, PyObject *args) {
  unsigned long long address;
  PyObject *owner, *record_type, *kind_values;
  if (!PyArg_ParseTuple(args, "KOO!O!", &address, &owner, &PyType_Type, &record_type, &PyTuple_Type, &kind_values))
    return NULL;
  if (!address) return PyErr_Format(PyExc_ValueError, "no rows");
  RecordIter *it = new_iter(record_type, kind_values);
  if (!it) return NULL;
  it->rows = (const dp_rows *)(uintptr_t)address;
  it->owner = Py_NewRef(owner);
  it->end = it->rows->rows;
  return (PyObject *)it;
}

static PyObject *records(PyObject *self, PyObject *args) {
  PyObject *pos, *off, *data, *valid, *kinds, *epochs, *record_type, *kind_values;
  Py_ssize_t offset, n;
  if (!PyArg_ParseTuple(args, "OOOOOOnnO!O!", &pos, &off, &data, &valid, &kinds, &epochs, &offset, &n,
                        &PyType_Type, &record_type, &PyTuple_Type, &kind_values))
    return NULL;
  if (offset < 0 || n < 0) return PyErr_Format(PyExc_ValueError, "offset and n must not be negative");
  RecordIter *it = new_iter(record_type, kind_values);
  if (!it) return NULL;
  it->offset = it->next = offset;
  it->end = offset + n;
  const Py_ssize_t rows = offset + n;
  if (take(it, B_POS, pos, rows * 8, "positions") < 0 || take(it, B_OFF, off, (rows + 1) * 4, "offsets") < 0 ||
      take(it, B_KIND, kinds, rows, "kinds") < 0 || take(it, B_EPOCH, epochs, rows * 8, "epochs") < 0 ||
      (valid != Py_None && take(it, B_VALID, valid, (rows + 7) / 8, "validity") < 0))
    goto fail;
  const int32_t *o = (const int32_t *)it->bufs[B_OFF].buf;
  if (take(it, B_DATA, data, n ? o[rows] : 0, "data") < 0) goto fail;
  for (Py_ssize_t i = offset; i < rows; ++i) /* every row's data inside the data buffer */
    if (o[i] < 0 || o[i + 1] < o[i] || o[i + 1] > it->bufs[B_DATA].len) {
      PyErr_Format(PyExc_ValueError, "row %zd: its data lies outside the data buffer", i - offset);
      goto fail;
    }
  return (PyObject *)it;
fail:
  Py_DECREF(it);
  return NULL;
}

/* batch_into(address, out, codes, default) -> rows: every row of the
 * dp_batch at `address` into the dict `out`, position -> the row's data as
 * bytes (DP_KIND_DATA), else codes[kind] (`default` for a kind past them).
 * read_positions takes a read_set reply with it: one call, not a Python
 * loop over the reply's rows. */
static PyObject *batch_into(PyObject *self, PyObject *args) {
  unsigned long long address;
  PyObject *out, *codes, *fallback;
  if (!PyArg_ParseTuple(args, "KO!O!O", &address, &PyDict_Type, &out, &PyTuple_Type, &codes, &fallback)) return NULL;
  if (!address) return PyErr_Format(PyExc_ValueError, "no batch");
  const dp_batch *b = (const dp_batch *)(uintptr_t)address;
  const Py_ssize_t ncodes = PyTuple_GET_SIZE(codes);
  for (uint32_t i = 0; i < b->rows; ++i) {
    PyObject *value;
    const uint8_t kind = b->kinds[i];
    if (kind == DP_KIND_DATA) {
      const int32_t a = b->offsets[i], z = b->offsets[i + 1];
      if (a < 0 || z < a || (uint64_t)z > b->data_len)
        return PyErr_Format(PyExc_ValueError, "row %u: its data lies outside the batch", i);
      value = PyBytes_FromStringAndSize(b->data + a, z - a);
    } else {
      value = Py_NewRef(kind < ncodes ? PyTuple_GET_ITEM(codes, kind) : fallback);
    }
    if (!value) return NULL;
    PyObject *key = PyLong_FromUnsignedLongLong(b->positions[i]);
    const int r = key ? PyDict_SetItem(out, key, value) : -1;
    Py_XDECREF(key);
    Py_DECREF(value);
    if (r < 0) return NULL;
  }
  return PyLong_FromUnsignedLong(b->rows);
}

static PyMethodDef module_methods[] = {
    {"records", records, METH_VARARGS, "an iterator of the records of one batch's columns"},
    {"batch_into", batch_into, METH_VARARGS, "a dp_batch's rows into a dict, position -> bytes or code"},
    {"rows_records", rows_records, METH_VARARGS, "an iterator of the records of a dp_rows"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "pyzlog._records",
                                    "stream()'s records, made one at a time", -1, module_methods};

PyMODINIT_FUNC PyInit__records(void) {
  if (PyType_Ready(&RecordIterType) < 0) return NULL;
  return PyModule_Create(&module);
}
