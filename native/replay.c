/* pyzlog.objects._replay: the replay loop's common entry, and a stream walk's check, in C.
 *
 * A replica replays the log by applying each entry in order
 * (objects/runtime.py, Runtime._apply_rows). Most entries are alike: a
 * command from a client whose session admits it in the usual way, for an
 * object not hosted here or for a map, as a put of a short str key and a
 * short bytes value. In Python that costs about 0.7 us an entry, most of it
 * the interpreter's; here it is a few C-API calls. Everything else (gaps,
 * foreign bytes, transactions, retirements, duplicates, other objects and
 * ops, a key that is not UTF-8, an own entry that is not the pending
 * proposal of its seq) is left to the Python loop: this function
 * stops at the first entry it does not take, and the loop takes that one
 * and calls again. The two must agree: tests/unit/test_replay_native.py
 * replays the same entries both ways.
 *
 * configure(magic_u16, header_size, cmd, flag_backpointers, map_put, sstr,
 *           sbytes, map_type): the entry format's constants, from entry.py,
 *           codec.py and objects.py (defined there, once), and the map class.
 * apply_common(positions, datas, i, sessions, objects, seen, me, pending,
 *              done) -> (j, applied)
 *   positions: a list or a range; datas: a list of bytes or None;
 *   sessions: {client: Session}; objects: {stream: StateMachine};
 *   seen: the set of streams met that are not hosted here; me: this
 *   runtime's client id; pending: {seq: _Pending} of own proposals; done:
 *   the list their applied records are appended to. Applies datas[i:j],
 *   j the first entry it did not take (len(datas) at the end); `applied`
 *   is how many it applied. Called with the runtime's state lock held.
 *
 * apply_common_columns(columns, n, i, sessions, objects, seen, me, pending,
 *                      done) -> (j, applied, after)
 *   apply_common over rows i .. n - 1 of a batch given as columns (a RowSet's
 *   columns(): the addresses of its positions (u64), data pointers (NULL
 *   for a row that is not an entry), lengths (u32) and kinds (u8)), with no
 *   bytes object made per entry; `after` is the position after row j - 1
 *   (0 if j == i). The caller holds the RowSet for the call.
 * row_at(columns, n, i) -> (position, bytes or None, kind code): one row,
 *   for the Python loop.
 *
 * check_stream(batch, got, single, lead, hi, light, found) -> rest
 *   streams.py's walk, one stream: of the positions in `batch` (a list),
 *   those whose entry in `got` ({position: bytes or a code}) is this
 *   layer's, carries backpointers and names the one stream `single` (its
 *   section's head, at offset 38) first, and is not in `lead` (the set of
 *   chain links, which are parsed whole): each goes into `light`, and into
 *   `found` if it is below `hi`. The other positions are returned, in
 *   order. tests/unit/test_stream_walk.py checks it against the
 *   comprehension it replaces.
 *
 * The header is entry.HEADER, "<2sBBBQQQQ": magic, version, kind, flags,
 * client, seq, lwm, stream (37 bytes); a one-stream backpointer section
 * follows it as body_offset() reads it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static struct {
  int ready;
  unsigned magic, header, cmd, flag_bp, map_put, sstr, sbytes;
  PyObject *map_type;
} F;

static PyObject *s_lwm, *s_seen, *s_data, *s_version, *s_result, *s_ok, *s_pdata;

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "entries are little-endian: this reads them in place"
#endif

static uint64_t u64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static PyObject *configure(PyObject *self, PyObject *args) {
  PyObject *map_type;
  if (!PyArg_ParseTuple(args, "IIIIIIIO", &F.magic, &F.header, &F.cmd, &F.flag_bp, &F.map_put, &F.sstr,
                        &F.sbytes, &map_type))
    return NULL;
  if (!PyType_Check(map_type)) return PyErr_Format(PyExc_TypeError, "map_type must be a class");
  Py_XSETREF(F.map_type, Py_NewRef(map_type));
  F.ready = 1;
  Py_RETURN_NONE;
}

/* What one call has looked up, kept for the entries after: the session of
 * the last client, and the objects of the streams met (a replay meets a
 * few, over and over; `spare` holds one past the first STREAMS_KEPT). New
 * references, let go at the end of the call, so they outlive whatever a
 * finalizer run by a collection meanwhile does; the common case itself
 * moves no lwm and so prunes no seen set. */
typedef struct {
  int valid;
  uint64_t id, lwm;
  PyObject *seen;
} SessionSeen;

enum { STREAMS_KEPT = 16 };
typedef struct {
  uint64_t id;
  PyObject *obj;   /* NULL: not hosted here */
  PyObject *table; /* a map's _data; NULL: not a map (the loop takes its entries) */
  int noted;       /* not hosted: added to `seen` (once an entry of it was applied) */
} StreamSeen;

typedef struct {
  SessionSeen session;
  StreamSeen streams[STREAMS_KEPT], spare;
  int nstreams;
} Kept;

static void let_go(Kept *k) {
  Py_CLEAR(k->session.seen);
  for (int j = 0; j < k->nstreams; j++) {
    Py_CLEAR(k->streams[j].obj);
    Py_CLEAR(k->streams[j].table);
  }
  Py_CLEAR(k->spare.obj);
  Py_CLEAR(k->spare.table);
}

/* The stream's entry in `k` (looked up and kept on a miss), or NULL with
 * an exception set. */
static StreamSeen *stream_of(Kept *k, PyObject *objects, uint64_t stream) {
  for (int j = 0; j < k->nstreams; j++)
    if (k->streams[j].id == stream) return &k->streams[j];
  StreamSeen *e = k->nstreams < STREAMS_KEPT ? &k->streams[k->nstreams] : &k->spare;
  Py_CLEAR(e->obj);
  Py_CLEAR(e->table);
  e->id = stream;
  e->noted = 0;
  PyObject *sid = PyLong_FromUnsignedLongLong(stream);
  if (sid == NULL) return NULL;
  PyObject *obj = PyDict_GetItemWithError(objects, sid);
  int r = 0;
  if (obj == NULL)
    r = PyErr_Occurred() ? -1 : 0;
  else if (Py_TYPE(obj) == (PyTypeObject *)F.map_type) {
    /* a map whose table is not a plain dict (replaced, or gone) is the Python loop's */
    PyObject *table = PyObject_GetAttr(obj, s_data);
    if (table == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
    else if (table == NULL) r = -1;
    else if (PyDict_CheckExact(table)) e->table = table;
    else Py_DECREF(table);
  }
  Py_DECREF(sid);
  if (r < 0) return NULL;
  e->obj = Py_XNewRef(obj);
  if (e != &k->spare) k->nstreams++;
  return e;
}

/* A command for a stream not hosted here was applied: the stream is seen. */
static int note(PyObject *seen, StreamSeen *e) {
  PyObject *sid = PyLong_FromUnsignedLongLong(e->id);
  int r = sid == NULL ? -1 : PySet_Add(seen, sid);
  Py_XDECREF(sid);
  e->noted = r == 0;
  return r;
}

/* 1: the session of `client` admits `seq` in the common case (its lwm does
 * not move, seq not seen), and seq is now seen; 0: not the common case
 * (nothing changed); -1: an error. */
static int admit(Kept *k, PyObject *sessions, uint64_t client, uint64_t seq, uint64_t lwm) {
  SessionSeen *c = &k->session;
  if (!c->valid || c->id != client) {
    Py_CLEAR(c->seen);
    c->valid = 0;
    PyObject *cid = PyLong_FromUnsignedLongLong(client);
    if (cid == NULL) return -1;
    PyObject *s = PyDict_GetItemWithError(sessions, cid);
    Py_DECREF(cid);
    if (s == NULL) return PyErr_Occurred() ? -1 : 0; /* a new client: the loop makes its session */
    PyObject *slwm = PyObject_GetAttr(s, s_lwm);
    if (slwm == NULL) return -1;
    c->lwm = PyLong_AsUnsignedLongLong(slwm);
    Py_DECREF(slwm);
    if (c->lwm == (uint64_t)-1 && PyErr_Occurred()) { /* not a u64 (a damaged checkpoint's): the loop's */
      if (!PyErr_ExceptionMatches(PyExc_OverflowError) && !PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
      PyErr_Clear();
      return 0;
    }
    if ((c->seen = PyObject_GetAttr(s, s_seen)) == NULL) return -1;
    if (!PyAnySet_Check(c->seen)) { /* not what a Session holds: the loop's */
      Py_CLEAR(c->seen);
      return 0;
    }
    c->id = client;
    c->valid = 1;
  }
  if (!(lwm <= c->lwm && c->lwm <= seq)) return 0;
  PyObject *q = PyLong_FromUnsignedLongLong(seq);
  if (q == NULL) return -1;
  int in = PySet_Contains(c->seen, q);
  int r = in < 0 ? -1 : in ? 0 : (PySet_Add(c->seen, q) < 0 ? -1 : 1);
  Py_DECREF(q);
  return r;
}

/* The key of a map put of a short str key and a short bytes value at
 * `off` (*ko: where the value's head is), or NULL: not that shape, or not
 * UTF-8 (no exception set), or an error (one set). */
static PyObject *put_key(const unsigned char *d, Py_ssize_t end, Py_ssize_t off, Py_ssize_t *ko) {
  Py_ssize_t o = off + 3;
  if (!(end > o && d[off] == F.map_put && d[off + 1] == F.sstr)) return NULL;
  *ko = o + d[off + 2];
  if (!(end > *ko + 1 && d[*ko] == F.sbytes && *ko + 2 + d[*ko + 1] == end)) return NULL;
  PyObject *key = PyUnicode_DecodeUTF8((const char *)d + o, *ko - o, NULL);
  if (key == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear(); /* the loop's BadEntry */
  return key;
}

/* table[key] = (value, pos + 1); obj.version = pos + 1. */
static int map_put(StreamSeen *e, PyObject *key, const unsigned char *d, Py_ssize_t end, Py_ssize_t ko,
                   uint64_t pos) {
  PyObject *value = PyBytes_FromStringAndSize((const char *)d + ko + 2, end - ko - 2);
  PyObject *version = PyLong_FromUnsignedLongLong(pos + 1);
  PyObject *pair = value && version ? PyTuple_Pack(2, value, version) : NULL;
  int r = pair && PyDict_SetItem(e->table, key, pair) == 0 && PyObject_SetAttr(e->obj, s_version, version) == 0
              ? 0
              : -1;
  Py_XDECREF(pair);
  Py_XDECREF(version);
  Py_XDECREF(value);
  return r;
}

/* An own proposal applied with result None: its record to `done`. */
static int settle(PyObject *pending, PyObject *done, uint64_t seq) {
  PyObject *q = PyLong_FromUnsignedLongLong(seq);
  if (q == NULL) return -1;
  PyObject *p = PyDict_GetItemWithError(pending, q);
  int r = 0;
  if (p != NULL) {
    Py_INCREF(p);
    r = PyDict_DelItem(pending, q) == 0 && PyObject_SetAttr(p, s_result, Py_None) == 0 &&
                PyObject_SetAttr(p, s_ok, Py_True) == 0 && PyList_Append(done, p) == 0
            ? 0
            : -1;
    Py_DECREF(p);
  } else if (PyErr_Occurred()) {
    r = -1;
  }
  Py_DECREF(q);
  return r;
}

/* An own entry whose seq a pending proposal holds: 1 if the entry is not
 * that proposal (another kind, stream or body: a runtime of the same client
 * id took the seq first), which the Python loop then answers; 0 if it is,
 * or none is pending; -1 an error. */
static int own_differs(PyObject *pending, uint64_t seq, const unsigned char *d, Py_ssize_t end, Py_ssize_t off) {
  PyObject *q = PyLong_FromUnsignedLongLong(seq);
  if (q == NULL) return -1;
  PyObject *p = PyDict_GetItemWithError(pending, q);
  Py_DECREF(q);
  if (p == NULL) return PyErr_Occurred() ? -1 : 0;
  PyObject *pd = PyObject_GetAttr(p, s_pdata);
  if (pd == NULL) return -1;
  const Py_ssize_t h = F.header;
  int r = 1;
  if (PyBytes_Check(pd) && PyBytes_GET_SIZE(pd) - h == end - off) {
    const unsigned char *e = (const unsigned char *)PyBytes_AS_STRING(pd);
    r = e[3] == d[3] && memcmp(e + 29, d + 29, 8) == 0 && memcmp(e + h, d + off, (size_t)(end - off)) == 0 ? 0 : 1;
  }
  Py_DECREF(pd);
  return r;
}

/* A range's start and step. */
static int range_of(PyObject *range, long long *start, long long *step) {
  PyObject *a = PyObject_GetAttrString(range, "start"), *b = a ? PyObject_GetAttrString(range, "step") : NULL;
  if (b != NULL) {
    *start = PyLong_AsLongLong(a);
    *step = PyLong_AsLongLong(b);
  }
  Py_XDECREF(a);
  Py_XDECREF(b);
  return b == NULL || PyErr_Occurred() ? -1 : 0;
}

/* Apply the entry `data` at index i if it is a common one: 1 applied, 0
 * not (nothing changed: the Python loop takes it), -1 an error. */
static int entry_at(Kept *k, const unsigned char *d, Py_ssize_t end, uint64_t pos, PyObject *sessions,
                    PyObject *objects, PyObject *seen, uint64_t me, PyObject *pending, PyObject *done) {
  const Py_ssize_t h = F.header;
  Py_ssize_t off, ko = 0;
  if (end < h || (unsigned)(d[0] | d[1] << 8) != F.magic || (d[2] != 1 && d[2] != 2) || d[3] != F.cmd) return 0;
  if (!(d[4] & F.flag_bp))
    off = h;
  else if (end > h + 20 && d[h + 1] == 1) /* one stream's section: 19 bytes, then its deltas */
    off = h + 21 + d[h + 20] * (d[h + 18] + d[h + 19]);
  else
    return 0;
  uint64_t client = u64(d + 5), seq = u64(d + 13), lwm = u64(d + 21), stream = u64(d + 29);
  /* every check before the session is asked: admit() marks seq seen */
  if (client == me) {
    int o = own_differs(pending, seq, d, end, off);
    if (o != 0) return o < 0 ? -1 : 0;
  }
  StreamSeen *e = stream_of(k, objects, stream);
  if (e == NULL) return -1;
  PyObject *key = NULL;
  int r = 1;
  if (e->obj != NULL) {
    if (e->table == NULL) r = 0; /* hosted, not a map (or not one this knows) */
    else if ((key = put_key(d, end, off, &ko)) == NULL) r = PyErr_Occurred() ? -1 : 0;
  }
  if (r == 1) r = admit(k, sessions, client, seq, lwm);
  if (r == 1 && e->obj != NULL) r = map_put(e, key, d, end, ko, pos) < 0 ? -1 : 1;
  if (r == 1 && e->obj == NULL && !e->noted) r = note(seen, e) < 0 ? -1 : 1;
  if (r == 1 && client == me) r = settle(pending, done, seq) < 0 ? -1 : 1;
  Py_XDECREF(key);
  return r;
}

static PyObject *apply_common(PyObject *self, PyObject *args) {
  PyObject *positions, *datas, *sessions, *objects, *seen, *pending, *done;
  PyObject *me_obj;
  Py_ssize_t i;
  if (!PyArg_ParseTuple(args, "OO!nO!O!O!O!O!O!", &positions, &PyList_Type, &datas, &i, &PyDict_Type, &sessions,
                        &PyDict_Type, &objects, &PySet_Type, &seen, &PyLong_Type, &me_obj, &PyDict_Type, &pending,
                        &PyList_Type, &done))
    return NULL;
  uint64_t me = PyLong_AsUnsignedLongLong(me_obj); /* a client id: 1 .. 2**64 - 1 */
  if (me == (uint64_t)-1 && PyErr_Occurred()) return NULL;
  if (!F.ready) return PyErr_Format(PyExc_RuntimeError, "pyzlog.objects._replay is not configured");
  int as_list = PyList_Check(positions);
  long long start = 0, step = 1;
  if (!as_list && (!PyRange_Check(positions) || range_of(positions, &start, &step) < 0))
    return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_TypeError, "positions: a list or a range");
  Py_ssize_t n = PyList_GET_SIZE(datas), applied = 0;
  if (i < 0 || PyObject_Length(positions) < n) return PyErr_Format(PyExc_ValueError, "bad index, or fewer positions");
  Kept k = {0};
  int failed = 0;
  for (; i < n; i++) {
    /* a collection started by an allocation below may run a finalizer, which may run any
     * Python code: the lists are looked at afresh, and the entry held, on every pass */
    if (i >= PyList_GET_SIZE(datas) || (as_list && i >= PyList_GET_SIZE(positions))) break;
    PyObject *data = PyList_GET_ITEM(datas, i);
    if (!PyBytes_Check(data)) break;
    uint64_t pos;
    if (as_list) {
      pos = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(positions, i));
      if (pos == (uint64_t)-1 && PyErr_Occurred()) { failed = 1; break; }
    } else {
      pos = (uint64_t)(start + step * i);
    }
    Py_INCREF(data);
    int r = entry_at(&k, (const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), pos, sessions,
                     objects, seen, me, pending, done);
    Py_DECREF(data);
    if (r < 0) { failed = 1; break; }
    if (r == 0) break;
    applied++;
  }
  let_go(&k);
  return failed ? NULL : Py_BuildValue("nn", i, applied);
}

/* A batch's rows as columns (a pyzlog RowSet's columns()): each row's
 * position, data (NULL unless the row is an entry), its length and kind. */
typedef struct {
  const uint64_t *positions;
  const char *const *data;
  const uint32_t *lens;
  const uint8_t *kinds;
} Columns;

static int columns_of(PyObject *cols, Columns *c) {
  unsigned long long a[4];
  if (PyTuple_GET_SIZE(cols) != 4) {
    PyErr_SetString(PyExc_TypeError, "columns: a tuple of four addresses");
    return -1;
  }
  for (int j = 0; j < 4; j++) { /* checked: a negative or too large int is an error, not an address */
    PyObject *v = PyTuple_GET_ITEM(cols, j);
    if (!PyLong_Check(v)) {
      PyErr_SetString(PyExc_TypeError, "columns: addresses are ints");
      return -1;
    }
    a[j] = PyLong_AsUnsignedLongLong(v);
    if (a[j] == (unsigned long long)-1 && PyErr_Occurred()) return -1;
  }
  if (!a[0] || !a[1] || !a[2] || !a[3]) {
    PyErr_SetString(PyExc_ValueError, "columns: a null address");
    return -1;
  }
  c->positions = (const uint64_t *)(uintptr_t)a[0];
  c->data = (const char *const *)(uintptr_t)a[1];
  c->lens = (const uint32_t *)(uintptr_t)a[2];
  c->kinds = (const uint8_t *)(uintptr_t)a[3];
  return 0;
}

static PyObject *apply_common_columns(PyObject *self, PyObject *args) {
  PyObject *cols, *sessions, *objects, *seen, *pending, *done, *me_obj;
  Py_ssize_t i, n;
  if (!PyArg_ParseTuple(args, "O!nnO!O!O!O!O!O!", &PyTuple_Type, &cols, &n, &i, &PyDict_Type, &sessions,
                        &PyDict_Type, &objects, &PySet_Type, &seen, &PyLong_Type, &me_obj, &PyDict_Type, &pending,
                        &PyList_Type, &done))
    return NULL;
  Columns c;
  if (columns_of(cols, &c) < 0) return NULL;
  uint64_t me = PyLong_AsUnsignedLongLong(me_obj);
  if (me == (uint64_t)-1 && PyErr_Occurred()) return NULL;
  if (!F.ready) return PyErr_Format(PyExc_RuntimeError, "pyzlog.objects._replay is not configured");
  if (i < 0 || n < i) return PyErr_Format(PyExc_ValueError, "bad row index");
  Py_ssize_t applied = 0, first = i;
  Kept k = {0};
  int failed = 0;
  /* the columns are the caller's RowSet's, which it holds for the call: no
   * finalizer run meanwhile can free them */
  for (; i < n; i++) {
    const char *d = c.data[i];
    if (d == NULL) break; /* a gap: the loop's */
    int r = entry_at(&k, (const unsigned char *)d, (Py_ssize_t)c.lens[i], c.positions[i], sessions, objects, seen,
                     me, pending, done);
    if (r < 0) { failed = 1; break; }
    if (r == 0) break;
    applied++;
  }
  let_go(&k);
  if (failed) return NULL;
  return Py_BuildValue("nnK", i, applied, (unsigned long long)(i > first ? c.positions[i - 1] + 1 : 0));
}

static PyObject *row_at(PyObject *self, PyObject *args) {
  PyObject *cols;
  Py_ssize_t i, n;
  if (!PyArg_ParseTuple(args, "O!nn", &PyTuple_Type, &cols, &n, &i)) return NULL;
  Columns c;
  if (columns_of(cols, &c) < 0) return NULL;
  if (i < 0 || i >= n) return PyErr_Format(PyExc_IndexError, "row %zd of %zd", i, n);
  if (c.data[i] == NULL) return Py_BuildValue("KOi", (unsigned long long)c.positions[i], Py_None, (int)c.kinds[i]);
  return Py_BuildValue("Ky#i", (unsigned long long)c.positions[i], c.data[i], (Py_ssize_t)c.lens[i],
                       (int)c.kinds[i]);
}

static PyObject *check_stream(PyObject *self, PyObject *args) {
  PyObject *batch, *got, *lead, *hi_obj, *light, *found;
  const char *single;
  Py_ssize_t single_len;
  if (!PyArg_ParseTuple(args, "O!O!y#O!O!O!O!", &PyList_Type, &batch, &PyDict_Type, &got, &single, &single_len,
                        &PySet_Type, &lead, &PyLong_Type, &hi_obj, &PyDict_Type, &light, &PyDict_Type, &found))
    return NULL;
  if (!F.ready) return PyErr_Format(PyExc_RuntimeError, "pyzlog.objects._replay is not configured");
  const Py_ssize_t at = 38; /* the section's head: the header, then the section's count */
  PyObject *rest = PyList_New(0);
  if (rest == NULL) return NULL;
  Py_INCREF(batch);
  /* the list is looked at afresh on every pass: an allocation may run a finalizer (any code) */
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batch); i++) {
    PyObject *p = PyList_GET_ITEM(batch, i);
    Py_INCREF(p);
    PyObject *data = PyDict_GetItemWithError(got, p); /* borrowed */
    int ok = 0, r = 0;
    if (data == NULL && PyErr_Occurred()) r = -1;
    Py_XINCREF(data);
    if (r == 0 && data != NULL && PyBytes_CheckExact(data)) {
      const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
      Py_ssize_t len = PyBytes_GET_SIZE(data);
      if (len >= at + single_len && memcmp(d + at, single, (size_t)single_len) == 0 &&
          (unsigned)(d[0] | d[1] << 8) == F.magic && (d[4] & F.flag_bp)) {
        int led = PySet_Contains(lead, p);
        if (led < 0) r = -1;
        else ok = !led;
      }
    }
    if (r == 0 && ok) {
      r = PyDict_SetItem(light, p, data);
      if (r == 0) {
        int below = PyObject_RichCompareBool(p, hi_obj, Py_LT);
        if (below < 0) r = -1;
        else if (below) r = PyDict_SetItem(found, p, data);
      }
    } else if (r == 0) {
      r = PyList_Append(rest, p);
    }
    Py_XDECREF(data);
    Py_DECREF(p);
    if (r < 0) {
      Py_DECREF(batch);
      Py_DECREF(rest);
      return NULL;
    }
  }
  Py_DECREF(batch);
  return rest;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "the entry format's constants and the map class"},
    {"apply_common", apply_common, METH_VARARGS, "apply the common entries from i on; (j, applied)"},
    {"apply_common_columns", apply_common_columns, METH_VARARGS,
     "apply_common over a RowSet's columns, rows i .. n - 1; (j, applied, position after row j - 1)"},
    {"row_at", row_at, METH_VARARGS, "row i of a RowSet's columns: (position, bytes or None, kind code)"},
    {"check_stream", check_stream, METH_VARARGS, "a walk's light check of one stream's entries; the others"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "pyzlog.objects._replay",
                                    "the replay loop's common entry, in C", -1, methods};

PyMODINIT_FUNC PyInit__replay(void) {
  s_lwm = PyUnicode_InternFromString("lwm");
  s_seen = PyUnicode_InternFromString("seen");
  s_data = PyUnicode_InternFromString("_data");
  s_version = PyUnicode_InternFromString("version");
  s_result = PyUnicode_InternFromString("result");
  s_ok = PyUnicode_InternFromString("ok");
  s_pdata = PyUnicode_InternFromString("data");
  if (!s_lwm || !s_seen || !s_data || !s_version || !s_result || !s_ok || !s_pdata) return NULL;
  return PyModule_Create(&module);
}
