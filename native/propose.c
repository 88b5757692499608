/* pyzlog.objects._propose: an async proposal's way into the log, in C.
 *
 * Runtime.propose (objects/runtime.py) takes a seq and the low-water mark,
 * makes the entry (header + body), registers the proposal and hands the
 * entry to Log.append_async with the proposal as the append's `future`;
 * the client's pipeline then tells the proposal where it landed. In Python
 * that was about 1.8 us a put, more than the rest of a put's client work;
 * here it is a few C-API calls. The steps, their locks and their order are
 * the Python's; what can go wrong between them is handed to the runtime's
 * own methods, so the outcome of every failure is decided in one place
 * (Runtime._settle, _not_sent, _send_failed).
 *
 * Proposal: the base of runtime._Pending, one proposal's record: its
 *   fields as C members (made without running Python code, read from
 *   Python as slots are); set_result(position) is landed(), the rest of
 *   its methods are the Python subclass's.
 * configure(magic, version, pending_type, fresh_future): the header's
 *   constants (entry.py), the class of the records to make, and a new
 *   future (LazyFuture()): each proposal's future is made as one of its
 *   class with its attributes (no __init__ run: it is Python code).
 * new_pending(rt, core, kind, stream, body, retire, streams) -> _Pending
 *   the seq and low-water mark, the entry and the record, registered in
 *   rt._pending (Runtime._new_pending: every proposal's).
 * propose(rt, core, kind, stream, body, streams) -> Future
 *   new_pending's steps, then the count in flight and the append
 *   (Runtime._propose's common case: a plain, not streams, runtime).
 * landed(rt, core, pos, data, wake, p): Runtime._landed.
 * put(rt, core, stream, key, value): ReplicatedMap.put_async's common case
 *   (a str key, a str or bytes value): the body encoded here, then propose's
 *   steps (streams on: enqueue's); None if not taken (the Python way
 *   checks and encodes the rest).
 * enqueue(rt, core, kind, stream, body, retire, streams) -> Future: streams
 *   on, new_pending's steps, the attempt counted and the proposal queued for
 *   the senders, then Runtime._queued (Runtime._propose's streams way).
 * stream_entries(first, k, answer, datas, first_level): a streams batch's
 *   entries with their backpointers (Runtime._store's; client/streams.py's
 *   entry_backpointers and entry.with_backpointers are the reference).
 * own_run(heap, own, at, limit), answer(plock, settled, done): the player's
 *   side (Runtime._play's run of own entries, Runtime._apply_rows's
 *   settling of what it applied), per entry a handful of Python operations.
 *   core is Runtime._core, the runtime's locks and containers (made once,
 *   never rebound). Called with the runtime started and open.
 *
 * The header is entry.HEADER, "<2sBBBQQQQ": magic, version, kind, flags,
 * client, seq, lwm, stream (37 bytes). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "entries are little-endian: this writes them in place"
#endif

#define HEADER_SIZE 37

typedef struct {
  PyObject_HEAD
  PyObject *seq, *data, *future, *retire, *streams, *result, *runtime;
  double deadline;
  int attempts;
  char maybe_stored, ok, flying;
} Proposal;

static PyTypeObject ProposalType;

static struct {
  int ready;
  unsigned char magic[2], version, v2, flag_backpointers;
  int streams_ready;
  PyTypeObject *pending_type, *future_type;
  PyObject *future_state;  // a fresh future's attributes: each new one starts as a copy
} F;

/* the map put's constants (configure_put) */
static struct {
  int ready;
  unsigned cmd, op, sstr, str, sbytes, bytes;
} P;

static PyObject *s_acquire, *s_release, *s_next_seq, *s_in_flight, *s_closing, *s_client_id, *s_propose_timeout,
    *s_log, *s_append_async, *s_popleft, *s_append, *s_settle, *s_not_sent, *s_send_failed, *s_applied, *s_target,
    *s_notify_all, *s_core, *s_failed, *s_update, *s_done, *s_one_stream, *s_streams, *s_queued, *kw_future, *empty, *heappush;

/* ------------------------------------------------------------------ Proposal */

static int proposal_traverse(Proposal *p, visitproc visit, void *arg) {
  Py_VISIT(p->seq);
  Py_VISIT(p->data);
  Py_VISIT(p->future);
  Py_VISIT(p->retire);
  Py_VISIT(p->streams);
  Py_VISIT(p->result);
  Py_VISIT(p->runtime);
  return 0;
}

static int proposal_clear(Proposal *p) {
  Py_CLEAR(p->seq);
  Py_CLEAR(p->data);
  Py_CLEAR(p->future);
  Py_CLEAR(p->retire);
  Py_CLEAR(p->streams);
  Py_CLEAR(p->result);
  Py_CLEAR(p->runtime);
  return 0;
}

static void proposal_dealloc(Proposal *p) {
  PyTypeObject *tp = Py_TYPE(p);
  PyObject_GC_UnTrack(p);  // (a no-op if a subclass's dealloc did it)
  proposal_clear(p);
  tp->tp_free((PyObject *)p);  // (a subclass's type reference is let go by its own dealloc)
}

/* the fields every new proposal starts with (a RETIRE's `retire` is a list; the others' is empty) */
static void proposal_fill(Proposal *p, PyObject *seq, PyObject *data, PyObject *future, double deadline,
                          PyObject *retire, PyObject *streams, PyObject *runtime) {
  Py_INCREF(seq);
  Py_XSETREF(p->seq, seq);
  Py_INCREF(data);
  Py_XSETREF(p->data, data);
  Py_INCREF(future);
  Py_XSETREF(p->future, future);
  Py_INCREF(retire);
  Py_XSETREF(p->retire, retire);
  Py_INCREF(streams);
  Py_XSETREF(p->streams, streams);
  Py_INCREF(Py_None);
  Py_XSETREF(p->result, Py_None);
  Py_INCREF(runtime);
  Py_XSETREF(p->runtime, runtime);
  p->deadline = deadline;
  p->attempts = 0;
  p->maybe_stored = 0;
  p->ok = 1;
  p->flying = 0;
}

static int proposal_init(Proposal *p, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"seq", "data", "future", "deadline", "retire", "streams", "runtime", NULL};
  PyObject *seq, *data, *future, *retire = Py_None, *streams = empty, *runtime = Py_None;
  double deadline;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOd|OOO", kwlist, &seq, &data, &future, &deadline, &retire,
                                   &streams, &runtime))
    return -1;
  int full = PyObject_IsTrue(retire);
  if (full < 0) return -1;
  proposal_fill(p, seq, data, future, deadline, full ? retire : empty, streams, runtime);
  return 0;
}

static PyMemberDef proposal_members[] = {
    {"seq", T_OBJECT_EX, offsetof(Proposal, seq), 0, "the proposal's seq (of its client id)"},
    {"data", T_OBJECT_EX, offsetof(Proposal, data), 0, "the entry as proposed (header + body)"},
    {"future", T_OBJECT_EX, offsetof(Proposal, future), 0, "what the proposer holds: apply's result"},
    {"deadline", T_DOUBLE, offsetof(Proposal, deadline), 0, "time.monotonic() past which it is given up"},
    {"maybe_stored", T_BOOL, offsetof(Proposal, maybe_stored), 0, "an attempt failed in a way that may have stored it"},
    {"attempts", T_INT, offsetof(Proposal, attempts), 0, "appends tried"},
    {"retire", T_OBJECT_EX, offsetof(Proposal, retire), 0, "a RETIRE entry: the seqs it retires"},
    {"streams", T_OBJECT_EX, offsetof(Proposal, streams), 0, "the streams the entry belongs to"},
    {"result", T_OBJECT, offsetof(Proposal, result), 0, "apply's outcome, until the future is settled"},
    {"ok", T_BOOL, offsetof(Proposal, ok), 0, "result is a result (not an error)"},
    {"flying", T_BOOL, offsetof(Proposal, flying), 0, "an attempt holds a count of the runtime's in flight"},
    {"runtime", T_OBJECT, offsetof(Proposal, runtime), 0, "the runtime (for set_result, set_exception)"},
    {NULL}};


/* ------------------------------------------------------------------ propose */

static PyObject *configure(PyObject *self, PyObject *args) {
  const char *magic;
  Py_ssize_t magic_len;
  unsigned version;
  PyObject *pending_type, *fresh;
  if (!PyArg_ParseTuple(args, "y#IOO", &magic, &magic_len, &version, &pending_type, &fresh)) return NULL;
  if (magic_len != 2 || version > 255) return PyErr_Format(PyExc_ValueError, "a 2-byte magic and a u8 version");
  if (!PyType_Check(pending_type) || !PyType_IsSubtype((PyTypeObject *)pending_type, &ProposalType))
    return PyErr_Format(PyExc_TypeError, "pending_type must be a subclass of Proposal");
  PyTypeObject *future_type = Py_TYPE(fresh);
  if (future_type->tp_new != PyBaseObject_Type.tp_new)  // (made with no __new__ of its own to call)
    return PyErr_Format(PyExc_TypeError, "the future's class must not define __new__");
  PyObject *state = PyObject_GenericGetDict(fresh, NULL);
  if (state == NULL) return NULL;
  Py_XSETREF(F.future_state, PyDict_Copy(state));
  Py_DECREF(state);
  if (F.future_state == NULL) return NULL;
  memcpy(F.magic, magic, 2);
  F.version = (unsigned char)version;
  Py_INCREF(pending_type);
  Py_XSETREF(F.pending_type, (PyTypeObject *)pending_type);
  Py_INCREF(future_type);
  Py_XSETREF(F.future_type, future_type);
  F.ready = 1;
  Py_RETURN_NONE;
}

static int call_lock(PyObject *lock, PyObject *name) {
  PyObject *r = PyObject_CallMethodNoArgs(lock, name);
  if (r == NULL) return -1;
  Py_DECREF(r);
  return 0;
}

/* let go of `lock` whatever is raised: the error raised first stays the one raised; -1 if
 * the release failed */
static int release(PyObject *lock) {
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  int released = call_lock(lock, s_release);
  if (et != NULL) {
    if (released < 0) PyErr_Clear();
    PyErr_Restore(et, ev, tb);
  }
  return released;
}

static int put_u64(unsigned char *at, PyObject *v) {
  uint64_t x = PyLong_AsUnsignedLongLong(v);
  if (x == (uint64_t)-1 && PyErr_Occurred()) return -1;
  memcpy(at, &x, 8);
  return 0;
}

/* the seq and low-water mark, under plock (Runtime._lwm_locked's loop): new references */
static int take_seq(PyObject *rt, PyObject *plock, PyObject *unsettled, PyObject *settled, PyObject **seq_out,
                    PyObject **lwm_out) {
  PyObject *seq = NULL, *next = NULL, *lwm = NULL, *one = NULL;
  if (call_lock(plock, s_acquire) < 0) return -1;  // (a Ctrl-C in a contended acquire: nothing taken yet)
  int ok = -1, registered = 0;
  seq = PyObject_GetAttr(rt, s_next_seq);
  if (seq == NULL || (one = PyLong_FromLong(1)) == NULL || (next = PyNumber_Add(seq, one)) == NULL) goto out;
  if (PyObject_SetAttr(rt, s_next_seq, next) < 0) goto out;
  PyObject *r = PyObject_CallMethodOneArg(unsettled, s_append, seq);
  if (r == NULL) goto undo;
  Py_DECREF(r);
  registered = 1;
  for (;;) {  // the lowest seq not yet settled
    Py_ssize_t n = PySequence_Size(unsettled);
    if (n < 0) goto out;
    if (n == 0) {
      Py_INCREF(next);
      lwm = next;
      break;
    }
    PyObject *first = PySequence_GetItem(unsettled, 0);
    if (first == NULL) goto out;
    int in = PySet_Contains(settled, first);
    if (in <= 0) {
      if (in == 0) lwm = first;
      else Py_DECREF(first);
      if (in < 0) goto out;
      break;
    }
    Py_DECREF(first);
    PyObject *gone = PyObject_CallMethodNoArgs(unsettled, s_popleft);
    if (gone == NULL) goto out;
    int d = PySet_Discard(settled, gone);
    Py_DECREF(gone);
    if (d < 0) goto out;
  }
  ok = 0;
  goto out;
undo:  // the seq was not registered as unsettled: hand it back
  {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (PyObject_SetAttr(rt, s_next_seq, seq) < 0) PyErr_Clear();
    PyErr_Restore(et, ev, tb);
  }
out:
  Py_XDECREF(one);
  Py_XDECREF(next);
  if (ok < 0 && registered) {  // never proposed: the low-water mark passes it (Runtime._settle)
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (PySet_Add(settled, seq) < 0) PyErr_Clear();
    PyErr_Restore(et, ev, tb);
  }
  if (release(plock) < 0) ok = -1;
  if (ok < 0) {
    Py_XDECREF(seq);
    Py_XDECREF(lwm);
    return -1;
  }
  *seq_out = seq;
  *lwm_out = lwm;
  return 0;
}

static PyObject *make_entry(PyObject *rt, long kind, PyObject *stream, PyObject *body, PyObject *seq,
                            PyObject *lwm) {
  Py_buffer b;
  if (PyObject_GetBuffer(body, &b, PyBUF_SIMPLE) < 0) return NULL;
  PyObject *data = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + b.len);
  PyObject *client = NULL;
  if (data == NULL) goto fail;
  unsigned char *at = (unsigned char *)PyBytes_AS_STRING(data);
  at[0] = F.magic[0], at[1] = F.magic[1], at[2] = F.version, at[3] = (unsigned char)kind, at[4] = 0;
  client = PyObject_GetAttr(rt, s_client_id);
  if (client == NULL || put_u64(at + 5, client) < 0 || put_u64(at + 13, seq) < 0 || put_u64(at + 21, lwm) < 0 ||
      put_u64(at + 29, stream) < 0)
    goto fail;
  memcpy(at + HEADER_SIZE, b.buf, b.len);
  Py_DECREF(client);
  PyBuffer_Release(&b);
  return data;
fail:
  Py_XDECREF(client);
  Py_XDECREF(data);
  PyBuffer_Release(&b);
  return NULL;
}

static double monotonic(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // time.monotonic()'s clock on Linux
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* the runtime's count of own appends in flight, plus one, and p flying (under cv_lock);
 * 1 if the runtime is closing or has failed (nothing counted), 0 if counted, -1 on an
 * error. (Runtime._fail sets _failed under cv_lock, then tells what is in pending: p is
 * registered before this looks, so one of the two finds it.) */
static int count_flying(PyObject *rt, PyObject *cv_lock, Proposal *p) {
  if (call_lock(cv_lock, s_acquire) < 0) return -1;
  int out = -1;
  PyObject *closing = PyObject_GetAttr(rt, s_closing);
  if (closing == NULL) goto done;
  int c = PyObject_IsTrue(closing);
  Py_DECREF(closing);
  if (c < 0) goto done;
  if (!c) {
    PyObject *failed = PyObject_GetAttr(rt, s_failed);
    if (failed == NULL) goto done;
    c = failed != Py_None;
    Py_DECREF(failed);
  }
  if (c) {
    out = 1;
    goto done;
  }
  PyObject *n = PyObject_GetAttr(rt, s_in_flight), *one = PyLong_FromLong(1), *m = NULL;
  if (n != NULL && one != NULL) m = PyNumber_Add(n, one);
  Py_XDECREF(n);
  Py_XDECREF(one);
  if (m == NULL) goto done;
  int set = PyObject_SetAttr(rt, s_in_flight, m);
  Py_DECREF(m);
  if (set < 0) goto done;
  p->flying = 1;
  out = 0;
done:
  return release(cv_lock) < 0 ? -1 : out;
}

/* tell the runtime of the error now raised, then raise it again if it was
 * not an Exception (Ctrl-C) or `always`; if the runtime's own call fails,
 * that error is raised instead */
static PyObject *hand_over(PyObject *rt, PyObject *method, Proposal *p, PyObject *future, int always) {
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  PyErr_NormalizeException(&et, &ev, &tb);
  if (tb != NULL) PyException_SetTraceback(ev, tb);
  int base = always || !PyErr_GivenExceptionMatches(et, PyExc_Exception);
  PyObject *r = PyObject_CallMethodObjArgs(rt, method, (PyObject *)p, ev != NULL ? ev : Py_None, NULL);
  if (r == NULL) {  // the runtime's handling failed (a Ctrl-C in it): that is what the caller sees
    Py_XDECREF(et), Py_XDECREF(ev), Py_XDECREF(tb);
    return NULL;
  }
  Py_DECREF(r);
  if (base) {
    PyErr_Restore(et, ev, tb);
    return NULL;
  }
  Py_XDECREF(et), Py_XDECREF(ev), Py_XDECREF(tb);
  Py_INCREF(future);
  return future;
}

#define CORE_SIZE 9  // (plock, cv_lock, pending, unsettled, settled, own, own_heap, queue, cv)

static int as_pos(PyObject *v, long long *out) {
  *out = PyLong_AsLongLong(v);
  return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Runtime._landed: an own append is over (stored at pos, or failed: pos
 * None); under cv_lock. p (or None): the proposal whose attempt holds the
 * count; nothing is done if it was given back already. The player is woken
 * only when it can move: pos is the next position to play, or nothing of
 * ours is in flight any more (waking it for every append would cost a
 * thread switch per entry). */
static int landed_in(PyObject *rt, PyObject *core, PyObject *pos, PyObject *data, int wake, PyObject *p) {
  if (!PyTuple_Check(core) || PyTuple_GET_SIZE(core) != CORE_SIZE) {
    PyErr_SetString(PyExc_TypeError, "core is Runtime._core");
    return -1;
  }
  if (p != Py_None && !PyObject_TypeCheck(p, &ProposalType)) {
    PyErr_SetString(PyExc_TypeError, "p is a proposal or None");
    return -1;
  }
  PyObject *cv_lock = PyTuple_GET_ITEM(core, 1), *own = PyTuple_GET_ITEM(core, 5),
           *heap = PyTuple_GET_ITEM(core, 6), *queue = PyTuple_GET_ITEM(core, 7), *cv = PyTuple_GET_ITEM(core, 8);
  long long at = 0, in_flight, applied, target;
  if (pos != Py_None && (!PyLong_CheckExact(pos) || as_pos(pos, &at) < 0 || at < 0)) {  // (before anything changes)
    if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "a position is an int >= 0, not %R", pos);
    return -1;
  }
  if (call_lock(cv_lock, s_acquire) < 0) return -1;
  int ok = -1;
  PyObject *v = NULL;
  if (p != Py_None) {
    if (!((Proposal *)p)->flying) {
      ok = 0;
      goto out;
    }
    ((Proposal *)p)->flying = 0;
  }
  if ((v = PyObject_GetAttr(rt, s_in_flight)) == NULL || as_pos(v, &in_flight) < 0) goto out;
  Py_CLEAR(v);
  in_flight -= 1;
  if ((v = PyLong_FromLongLong(in_flight)) == NULL || PyObject_SetAttr(rt, s_in_flight, v) < 0) goto out;
  Py_CLEAR(v);
  int now = 0;
  if (in_flight == 0) {  // (close waits for none in flight)
    Py_ssize_t queued = PySequence_Size(queue);
    if (queued < 0) goto out;
    now = queued == 0;
    if (!now) {
      if ((v = PyObject_GetAttr(rt, s_closing)) == NULL || (now = PyObject_IsTrue(v)) < 0) goto out;
      Py_CLEAR(v);
    }
  }
  if (pos != Py_None) {
    if ((v = PyObject_GetAttr(rt, s_applied)) == NULL || as_pos(v, &applied) < 0) goto out;
    Py_CLEAR(v);
    if (at >= applied) {
      if (PyDict_SetItem(own, pos, data) < 0) goto out;
      PyObject *r = PyObject_CallFunctionObjArgs(heappush, heap, pos, NULL);
      if (r == NULL) goto out;
      Py_DECREF(r);
    }
    if ((v = PyObject_GetAttr(rt, s_target)) == NULL || as_pos(v, &target) < 0) goto out;
    Py_CLEAR(v);
    if (at + 1 > target) {
      if ((v = PyLong_FromLongLong(at + 1)) == NULL || PyObject_SetAttr(rt, s_target, v) < 0) goto out;
      Py_CLEAR(v);
    }
    now = now || at == applied;
  }
  if (wake && now) {
    PyObject *r = PyObject_CallMethodNoArgs(cv, s_notify_all);
    if (r == NULL) goto out;
    Py_DECREF(r);
  }
  ok = 0;
out:
  Py_XDECREF(v);
  return release(cv_lock) < 0 ? -1 : ok;
}

static PyObject *landed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 6) return PyErr_Format(PyExc_TypeError, "landed(rt, core, pos, data, wake, p)");
  int wake = PyObject_IsTrue(args[4]);
  if (wake < 0 || landed_in(args[0], args[1], args[2], args[3], wake, args[5]) < 0) return NULL;
  Py_RETURN_NONE;
}

/* Proposal.set_result(position): what the client's async pipeline settles
 * for its append (Log.append_async(future=)): landed at `position` */
static PyObject *proposal_set_result(Proposal *p, PyObject *position) {
  if (p->runtime == NULL || p->runtime == Py_None || p->data == NULL)
    return PyErr_Format(PyExc_RuntimeError, "a proposal with no runtime");
  PyObject *core = PyObject_GetAttr(p->runtime, s_core);
  if (core == NULL) return NULL;
  int r = landed_in(p->runtime, core, position, p->data, 1, (PyObject *)p);
  Py_DECREF(core);
  if (r < 0) return NULL;
  Py_RETURN_NONE;
}

static PyMethodDef proposal_methods[] = {
    {"set_result", (PyCFunction)proposal_set_result, METH_O,
     "its append landed at this position (the append pipeline's future= call)"},
    {NULL}};

static PyObject *new_future(void) {
  PyObject *f = F.future_type->tp_new(F.future_type, empty, NULL);
  if (f == NULL) return NULL;
  Py_ssize_t i = 0;
  PyObject *k, *v;
  while (PyDict_Next(F.future_state, &i, &k, &v))
    if (PyObject_GenericSetAttr(f, k, v) < 0) {
      Py_DECREF(f);
      return NULL;
    }
  return f;
}

/* propose's and new_pending's arguments: the kind, and core's items */
static int parse_args(PyObject *const *args, long *kind) {
  if (!F.ready) {
    PyErr_SetString(PyExc_RuntimeError, "pyzlog.objects._propose is not configured");
    return -1;
  }
  *kind = PyLong_AsLong(args[2]);
  if (*kind == -1 && PyErr_Occurred()) return -1;
  if (*kind < 1 || *kind > 255) {
    PyErr_Format(PyExc_ValueError, "an entry's kind is 1..255, not %ld", *kind);
    return -1;
  }
  if (!PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != CORE_SIZE) {
    PyErr_SetString(PyExc_TypeError, "core is Runtime._core");
    return -1;
  }
  return 0;
}

/* a new proposal (its seq and low-water mark, entry, record and future), registered in
 * pending; NULL with nothing registered and its seq, if it took one, settled */
static Proposal *register_new(PyObject *rt, PyObject *core, long kind, PyObject *stream, PyObject *body,
                              PyObject *retire, PyObject *streams) {
  PyObject *plock = PyTuple_GET_ITEM(core, 0), *pending = PyTuple_GET_ITEM(core, 2),
           *unsettled = PyTuple_GET_ITEM(core, 3), *settled = PyTuple_GET_ITEM(core, 4);
  int full = PyObject_IsTrue(retire);  // (a RETIRE's list of seqs; the others' is empty)
  if (full < 0) return NULL;
  PyObject *timeout = PyObject_GetAttr(rt, s_propose_timeout);
  if (timeout == NULL) return NULL;
  double deadline = PyFloat_AsDouble(timeout);
  Py_DECREF(timeout);
  if (deadline == -1.0 && PyErr_Occurred()) return NULL;
  deadline += monotonic();
  PyObject *future = new_future();  // (before the seq: a failure here takes nothing)
  if (future == NULL) return NULL;

  PyObject *seq, *lwm;
  if (take_seq(rt, plock, unsettled, settled, &seq, &lwm) < 0) {
    Py_DECREF(future);
    return NULL;
  }
  Proposal *p = NULL;
  PyObject *data = make_entry(rt, kind, stream, body, seq, lwm);
  Py_DECREF(lwm);
  if (data != NULL) p = (Proposal *)F.pending_type->tp_alloc(F.pending_type, 0);
  if (p != NULL) proposal_fill(p, seq, data, future, deadline, full ? retire : empty, streams, rt);  // (plain C)
  if (p == NULL || PyDict_SetItem(pending, seq, (PyObject *)p) < 0) {
    // never proposed: the low-water mark passes its seq (Runtime._settle)
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *r = PyObject_CallMethodOneArg(rt, s_settle, seq);
    Py_XDECREF(r);
    if (r == NULL) PyErr_Clear();
    PyErr_Restore(et, ev, tb);
    Py_CLEAR(p);
  }
  Py_XDECREF(data);
  Py_DECREF(seq);
  Py_DECREF(future);
  return p;
}

static PyObject *new_pending(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  long kind;
  if (nargs != 7) return PyErr_Format(PyExc_TypeError, "new_pending(rt, core, kind, stream, body, retire, streams)");
  if (parse_args(args, &kind) < 0) return NULL;
  return (PyObject *)register_new(args[0], args[1], kind, args[3], args[4], args[5], args[6]);
}

/* register a new proposal, count it in flight and append it: its future */
static PyObject *propose_entry(PyObject *rt, PyObject *core, long kind, PyObject *stream, PyObject *body,
                               PyObject *streams) {
  PyObject *cv_lock = PyTuple_GET_ITEM(core, 1);
  Proposal *p = register_new(rt, core, kind, stream, body, Py_None, streams);
  if (p == NULL) return NULL;
  PyObject *future = p->future;
  Py_INCREF(future);

  p->attempts = 1;
  PyObject *out = NULL;
  int closing = count_flying(rt, cv_lock, p);
  if (closing > 0) {  // not counted, never sent: the runtime is closing or failed (told so by _not_sent(p, None))
    PyObject *r = PyObject_CallMethodObjArgs(rt, s_not_sent, (PyObject *)p, Py_None, NULL);
    if (r != NULL) {
      Py_DECREF(r);
      Py_INCREF(future);
      out = future;
    }
    goto done;
  }
  if (closing < 0) {  // not counted, never sent: an error (an interrupt in a contended acquire), raised again
    out = hand_over(rt, s_not_sent, p, future, 1);
    goto done;
  }
  PyObject *log = PyObject_GetAttr(rt, s_log);
  PyObject *r = NULL;
  if (log != NULL) {
    PyObject *call[3] = {log, p->data, (PyObject *)p};
    r = PyObject_VectorcallMethod(s_append_async, call, 2, kw_future);  // append_async(data, future=p)
    Py_DECREF(log);
  }
  if (r == NULL) {  // handed to the runtime as a failed append (or an interrupted one)
    out = hand_over(rt, s_send_failed, p, future, 0);
    goto done;
  }
  Py_DECREF(r);
  Py_INCREF(future);
  out = future;
done:
  Py_DECREF(p);
  Py_DECREF(future);
  return out;
}

static PyObject *propose(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  long kind;
  if (nargs != 6) return PyErr_Format(PyExc_TypeError, "propose(rt, core, kind, stream, body, streams)");
  if (parse_args(args, &kind) < 0) return NULL;
  return propose_entry(args[0], args[1], kind, args[3], args[4], args[5]);
}

/* streams on: a new proposal registered, its attempt counted and queued for the senders
 * with no Python code between (an interrupt cannot leave it registered and not queued),
 * then Runtime._queued (a sender woken; told if the runtime closed meanwhile): its future */
static PyObject *enqueue_new(PyObject *rt, PyObject *core, long kind, PyObject *stream, PyObject *body,
                             PyObject *retire, PyObject *streams) {
  Proposal *p = register_new(rt, core, kind, stream, body, retire, streams);
  if (p == NULL) return NULL;
  p->attempts += 1;
  PyObject *out = PyObject_CallMethodOneArg(PyTuple_GET_ITEM(core, 7), s_append, (PyObject *)p);  // deque.append
  if (out == NULL) {  // (no memory): never queued, its seq settled by _not_sent, the error raised again
    p->attempts -= 1;
    out = hand_over(rt, s_not_sent, p, p->future, 1);
  } else {
    Py_DECREF(out);
    out = PyObject_CallMethodOneArg(rt, s_queued, (PyObject *)p);
  }
  Py_DECREF(p);
  return out;
}

static PyObject *enqueue(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  long kind;
  if (nargs != 7) return PyErr_Format(PyExc_TypeError, "enqueue(rt, core, kind, stream, body, retire, streams)");
  if (parse_args(args, &kind) < 0) return NULL;
  return enqueue_new(args[0], args[1], kind, args[3], args[4], args[5], args[6]);
}

/* a key's or value's encoding (codec.dumps) for a str or bytes: tag, length, bytes */
static char *put_item(char *at, int small_tag, int tag, const char *buf, Py_ssize_t n) {
  if (n < 256) {
    *at++ = (char)small_tag;
    *at++ = (char)n;
  } else {
    uint32_t len = (uint32_t)n;
    *at++ = (char)tag;
    memcpy(at, &len, 4);
    at += 4;
  }
  memcpy(at, buf, n);
  return at + n;
}

static int str_or_bytes(PyObject *v, const char **buf, Py_ssize_t *n, int *is_str) {
  if (PyBytes_CheckExact(v)) {
    *buf = PyBytes_AS_STRING(v), *n = PyBytes_GET_SIZE(v), *is_str = 0;
    return 1;
  }
  if (PyUnicode_CheckExact(v)) {
    *buf = PyUnicode_AsUTF8AndSize(v, n), *is_str = 1;
    if (*buf == NULL) PyErr_Clear();  // (a lone surrogate: the Python way says so)
    return *buf != NULL;
  }
  return 0;
}

/* put(rt, core, stream, key, value) -> Future, or None if not taken: a map put
 * (ReplicatedMap.put_async) of a str key and a str or bytes value on a started,
 * open runtime, its body encoded here as codec.dumps does, then appended as
 * propose() does (or, streams on, queued for the senders as enqueue()
 * does); anything else
 * (other types, a str that is not valid Unicode, a closed or failed runtime,
 * beyond 4 GiB) is the Python way's, which checks and says what is wrong. */
static PyObject *put(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 5) return PyErr_Format(PyExc_TypeError, "put(rt, core, stream, key, value)");
  if (!P.ready) return PyErr_Format(PyExc_RuntimeError, "pyzlog.objects._propose.configure_put was not called");
  if (!F.ready) return PyErr_Format(PyExc_RuntimeError, "pyzlog.objects._propose is not configured");
  if (!PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != CORE_SIZE)
    return PyErr_Format(PyExc_TypeError, "core is Runtime._core");
  long kind = P.cmd;
  PyObject *rt = args[0], *stream = args[2];
  const char *kb, *vb;
  Py_ssize_t kn, vn;
  int key_str, value_str;
  if (!PyUnicode_CheckExact(args[3]) || !str_or_bytes(args[3], &kb, &kn, &key_str) ||
      !str_or_bytes(args[4], &vb, &vn, &value_str) || kn > UINT32_MAX || vn > UINT32_MAX)
    Py_RETURN_NONE;
  PyObject *v = PyObject_GetAttr(rt, s_failed);
  if (v == NULL) return NULL;
  int open = v == Py_None;
  Py_DECREF(v);
  if (open) {
    if ((v = PyObject_GetAttr(rt, s_closing)) == NULL) return NULL;
    open = PyObject_Not(v);
    Py_DECREF(v);
    if (open < 0) return NULL;
  }
  if (!open) Py_RETURN_NONE;  // (the Python way raises RuntimeClosed or RuntimeFailed)
  PyObject *one = PyObject_GetAttr(rt, s_one_stream), *streams = NULL;  // (stream,): one tuple per object
  if (one == NULL) return NULL;
  if (!PyDict_CheckExact(one)) {
    Py_DECREF(one);
    return PyErr_Format(PyExc_TypeError, "Runtime._one_stream is a dict");
  }
  streams = PyDict_GetItemWithError(one, stream);
  if (streams != NULL) Py_INCREF(streams);
  else if (!PyErr_Occurred() && (streams = PyTuple_Pack(1, stream)) != NULL && PyDict_SetItem(one, stream, streams) < 0)
    Py_CLEAR(streams);
  Py_DECREF(one);
  if (streams == NULL) return NULL;
  PyObject *body = PyBytes_FromStringAndSize(NULL, 1 + (kn < 256 ? 2 : 5) + kn + (vn < 256 ? 2 : 5) + vn), *out = NULL;
  if (body != NULL) {
    char *at = PyBytes_AS_STRING(body);
    *at++ = (char)P.op;
    at = put_item(at, P.sstr, P.str, kb, kn);
    put_item(at, value_str ? P.sstr : P.sbytes, value_str ? P.str : P.bytes, vb, vn);
    int queued = 0;  // streams on: queued for the senders (enqueue_new)
    if ((v = PyObject_GetAttr(rt, s_streams)) != NULL) {
      queued = PyObject_IsTrue(v);
      Py_DECREF(v);
    }
    if (v == NULL || queued < 0) {
      out = NULL;
    } else if (!queued) {
      out = propose_entry(rt, args[1], kind, stream, body, streams);
    } else {
      out = enqueue_new(rt, args[1], kind, stream, body, Py_None, streams);
    }
    Py_DECREF(body);
  }
  Py_DECREF(streams);
  return out;
}

/* configure_put(cmd, op, sstr, str, sbytes, bytes): a command's kind (entry.CMD),
 * the map put's op (objects.MAP_PUT) and codec.py's tags of a str and a bytes */
static PyObject *configure_put(PyObject *self, PyObject *args) {
  unsigned cmd, op, sstr, str, sbytes, bytes;
  if (!PyArg_ParseTuple(args, "IIIIII", &cmd, &op, &sstr, &str, &sbytes, &bytes)) return NULL;
  if (cmd < 1 || cmd > 255 || op > 255 || sstr > 255 || str > 255 || sbytes > 255 || bytes > 255)
    return PyErr_Format(PyExc_ValueError, "a kind of 1..255, and an op and tags of a byte");
  P.cmd = cmd, P.op = op, P.sstr = sstr, P.str = str, P.sbytes = sbytes, P.bytes = bytes;
  P.ready = 1;
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ entries with backpointers */

#define MAX_STREAMS 64  // streams per entry (Log.append_streams' limit)

typedef struct {
  uint64_t stream, horizon, ordinal;
  uint64_t *back;  // the sequencer's recent positions, newest first
  Py_ssize_t nback;
  int64_t known[64];  // skip pointer by level (-1: not known); known[top] is the highest level named
  int top;
} StreamAnswer;

static int u64_of(PyObject *v, uint64_t *out) {
  *out = PyLong_AsUnsignedLongLong(v);
  return *out == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/* one stream's item of the sequencer's answer: (stream, horizon, recent, ordinal, [(level, position)]),
 * any sequences (as the Python reads them) */
static int parse_answer(PyObject *item, StreamAnswer *a, Py_ssize_t n) {
  PyObject *fields = PySequence_Fast(item, "an answer's item is a sequence"), *back = NULL, *levels = NULL;
  int ok = -1;
  if (fields == NULL) return -1;
  if (PySequence_Fast_GET_SIZE(fields) != 5) {
    PyErr_Format(PyExc_ValueError, "an answer's item is (stream, horizon, recent, ordinal, levels), not %R", item);
    goto out;
  }
  PyObject **f = PySequence_Fast_ITEMS(fields);
  if (u64_of(f[0], &a->stream) < 0 || u64_of(f[1], &a->horizon) < 0 || u64_of(f[3], &a->ordinal) < 0) goto out;
  if (a->ordinal > UINT64_MAX - (uint64_t)n) {  // (this batch's ordinals past 2^64: no sequencer answers that)
    PyErr_Format(PyExc_ValueError, "a stream's ordinal %llu is too large", (unsigned long long)a->ordinal);
    goto out;
  }
  if ((back = PySequence_Fast(f[2], "an answer's recent positions are a sequence")) == NULL ||
      (levels = PySequence_Fast(f[4], "an answer's levels are a sequence")) == NULL)
    goto out;
  a->nback = PySequence_Fast_GET_SIZE(back);
  a->back = PyMem_Malloc(sizeof(uint64_t) * (a->nback ? a->nback : 1));
  if (a->back == NULL) {
    PyErr_NoMemory();
    goto out;
  }
  for (Py_ssize_t i = 0; i < a->nback; i++)
    if (u64_of(PySequence_Fast_GET_ITEM(back, i), &a->back[i]) < 0) goto out;
  for (int l = 0; l < 64; l++) a->known[l] = -1;
  a->top = -1;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(levels); i++) {  // as dict(levels): the last of a level counts
    PyObject *lp = PySequence_Fast_GET_ITEM(levels, i);
    uint64_t level, pos;
    if (!PyTuple_Check(lp) || PyTuple_GET_SIZE(lp) != 2 || u64_of(PyTuple_GET_ITEM(lp, 0), &level) < 0 ||
        u64_of(PyTuple_GET_ITEM(lp, 1), &pos) < 0 || level > 63 || pos > INT64_MAX) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "a skip level is (level < 64, position < 2^63), not %R", lp);
      goto out;
    }
    a->known[level] = (int64_t)pos;
    if ((int)level > a->top) a->top = (int)level;
  }
  ok = 0;
out:
  Py_DECREF(fields);
  Py_XDECREF(back);
  Py_XDECREF(levels);
  return ok;
}

/* client/streams.py's _skips: the skip pointers of the entry of ordinal `me`, newest first */
static int skips(const StreamAnswer *a, uint64_t first, uint64_t me, uint64_t nrecent, int first_level,
                 uint64_t *far) {
  int nf = 0;
  for (int level = first_level; level < 64; level++) {
    uint64_t m = ((me - 1) >> level) << level;  // the newest multiple of 2^level below me
    if (m + nrecent >= me) continue;             // in the recent list
    int64_t p = -1;
    if (m >= a->ordinal) p = (int64_t)(first + (m - a->ordinal));
    else if (m == 0 && a->top >= 0) p = a->known[a->top];  // the stream's first entry
    else p = a->known[level];
    if (p >= 0 && (nf == 0 || (uint64_t)p < far[nf - 1])) far[nf++] = (uint64_t)p;
    if (m == 0) break;
  }
  return nf;
}

/* configure_streams(version, flag_backpointers): entry.py's version and flag of an entry with backpointers */
static PyObject *configure_streams(PyObject *self, PyObject *args) {
  unsigned version, flag;
  if (!PyArg_ParseTuple(args, "II", &version, &flag)) return NULL;
  if (version > 255 || flag > 255) return PyErr_Format(PyExc_ValueError, "a u8 version and flag");
  F.v2 = (unsigned char)version, F.flag_backpointers = (unsigned char)flag;
  F.streams_ready = 1;
  Py_RETURN_NONE;
}

/* stream_entries(first, k, answer, datas, first_level) -> [bytes]: the version-2
 * form of each version-1 entry of `datas`, stored at first, first + 1, ...,
 * with its streams' backpointers: client/streams.py's entry_backpointers and
 * entry.py's with_backpointers for a whole batch (Runtime._store's, through
 * Log.append_streams(build_all=)); the Python is the reference, and the two
 * must agree (tests/unit/test_propose_native.py). */
static PyObject *stream_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 5) return PyErr_Format(PyExc_TypeError, "stream_entries(first, k, answer, datas, first_level)");
  if (!F.streams_ready) return PyErr_Format(PyExc_RuntimeError, "pyzlog.objects._propose.configure_streams was not called");
  uint64_t first;
  long k = PyLong_AsLong(args[1]), first_level = PyLong_AsLong(args[4]);
  if (u64_of(args[0], &first) < 0 || (k == -1 && PyErr_Occurred()) || (first_level == -1 && PyErr_Occurred()))
    return NULL;
  PyObject *answer = args[2], *datas = args[3];
  if (!PyList_Check(answer) || !PyList_Check(datas))
    return PyErr_Format(PyExc_TypeError, "stream_entries takes the answer and the entries as lists");
  Py_ssize_t ns = PyList_GET_SIZE(answer), n = PyList_GET_SIZE(datas);
  if (k < 0 || k > 255 || ns > MAX_STREAMS || first_level < 0 || first_level > 63)
    return PyErr_Format(PyExc_ValueError, "K of 0..255, at most %d streams, a first level below 64", MAX_STREAMS);
  if (first > (uint64_t)INT64_MAX - (uint64_t)n)  // (positions are below 2^63)
    return PyErr_Format(PyExc_ValueError, "positions from %llu are past 2^63", (unsigned long long)first);
  StreamAnswer a[MAX_STREAMS];
  memset(a, 0, sizeof(a));
  PyObject *out = NULL;
  uint64_t ptrs[255 + 64];  // one stream's recent and skip pointers
  for (Py_ssize_t s = 0; s < ns; s++)
    if (parse_answer(PyList_GET_ITEM(answer, s), &a[s], n) < 0) goto done;
  if ((out = PyList_New(n)) == NULL) goto done;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *plain = PyList_GET_ITEM(datas, i);
    if (!PyBytes_Check(plain) || PyBytes_GET_SIZE(plain) < HEADER_SIZE ||
        memcmp(PyBytes_AS_STRING(plain), F.magic, 2) != 0) {
      PyErr_SetString(PyExc_ValueError, "not an entry of this layer");
      goto fail;
    }
    uint64_t pos = first + (uint64_t)i;
    /* the section's size first: 2 + per stream 19 + its deltas */
    Py_ssize_t size = PyBytes_GET_SIZE(plain) + 2;
    for (int pass = 0; pass < 2; pass++) {
      unsigned char *at = NULL;
      PyObject *made = NULL;
      if (pass == 1) {
        if ((made = PyBytes_FromStringAndSize(NULL, size)) == NULL) goto fail;
        at = (unsigned char *)PyBytes_AS_STRING(made);
        const unsigned char *src = (const unsigned char *)PyBytes_AS_STRING(plain);
        at[0] = F.magic[0], at[1] = F.magic[1], at[2] = F.v2, at[3] = src[3], at[4] = F.flag_backpointers;
        memcpy(at + 5, src + 5, HEADER_SIZE - 5);
        at += HEADER_SIZE;
        *at++ = (unsigned char)k;
        *at++ = (unsigned char)ns;
      }
      for (Py_ssize_t s = 0; s < ns; s++) {
        const StreamAnswer *sa = &a[s];
        uint64_t horizon = sa->horizon;
        int nr = 0, nf = 0;
        if (!k) {
          horizon = pos;
        } else {
          uint64_t inside = (uint64_t)i < (uint64_t)k ? (uint64_t)i : (uint64_t)k;
          for (uint64_t j = 0; j < inside; j++) ptrs[nr++] = pos - 1 - j;
          for (Py_ssize_t j = 0; nr < k && j < sa->nback; j++) ptrs[nr++] = sa->back[j];
          uint64_t me = sa->ordinal + (uint64_t)i;  // this entry's ordinal in the stream
          if (me > (uint64_t)nr) nf = skips(sa, first, me, (uint64_t)nr, (int)first_level, ptrs + nr);
        }
        int width = 4;
        for (int j = 0; j < nr + nf; j++) {
          if (ptrs[j] >= pos) {
            PyErr_Format(PyExc_ValueError, "a backpointer (%llu) not below position %llu",
                         (unsigned long long)ptrs[j], (unsigned long long)pos);
            Py_XDECREF(made);
            goto fail;
          }
          if (pos - ptrs[j] > UINT32_MAX) width = 8;
        }
        if (pass == 0) {
          size += 19 + (Py_ssize_t)width * (nr + nf);
          continue;
        }
        memcpy(at, &sa->stream, 8);
        memcpy(at + 8, &horizon, 8);
        at[16] = (unsigned char)nr, at[17] = (unsigned char)nf, at[18] = (unsigned char)width;
        at += 19;
        for (int j = 0; j < nr + nf; j++) {
          uint64_t d = pos - ptrs[j];
          memcpy(at, &d, (size_t)width);  // (little-endian: the low bytes first)
          at += width;
        }
      }
      if (pass == 1) {
        memcpy(at, PyBytes_AS_STRING(plain) + HEADER_SIZE, PyBytes_GET_SIZE(plain) - HEADER_SIZE);
        PyList_SET_ITEM(out, i, made);
      }
    }
  }
  goto done;
fail:
  Py_CLEAR(out);
done:
  for (Py_ssize_t s = 0; s < ns; s++) PyMem_Free(a[s].back);
  return out;
}

/* ------------------------------------------------------------------ the player's side */

static PyObject *heappop;

/* own_run(heap, own, at, limit) -> (run, nxt): Runtime._play's look at its own
 * acknowledged entries, under cv_lock (held by the caller): what lies below `at`
 * is dropped; then the bytes of the run of own entries at, at + 1, ... (below
 * `limit`) come out of `own` and the heap; nxt is the lowest own position left
 * (None if none). Per entry this was a handful of Python operations. */
static PyObject *own_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4) return PyErr_Format(PyExc_TypeError, "own_run(heap, own, at, limit)");
  PyObject *heap = args[0], *own = args[1];
  if (!PyList_CheckExact(heap) || !PyDict_CheckExact(own))
    return PyErr_Format(PyExc_TypeError, "own_run takes the own heap (a list) and the own entries (a dict)");
  long long at, limit;
  if (as_pos(args[2], &at) < 0 || as_pos(args[3], &limit) < 0) return NULL;
  PyObject *run = PyList_New(0), *out = NULL;
  if (run == NULL) return NULL;
  long long p = at;
  while (PyList_GET_SIZE(heap) > 0) {
    long long first;
    if (as_pos(PyList_GET_ITEM(heap, 0), &first) < 0) goto fail;
    if (first >= at && (first != p || p >= limit)) break;
    PyObject *pos = PyObject_CallOneArg(heappop, heap);
    if (pos == NULL) goto fail;
    PyObject *data = PyDict_GetItemWithError(own, pos);  // borrowed
    if (data == NULL && PyErr_Occurred()) {
      Py_DECREF(pos);
      goto fail;
    }
    if (first < at) {  // below what is played: forgotten
      int gone = data == NULL ? 0 : PyDict_DelItem(own, pos);
      Py_DECREF(pos);
      if (gone < 0) goto fail;
      continue;
    }
    if (data == NULL) {
      PyErr_SetObject(PyExc_KeyError, pos);
      Py_DECREF(pos);
      goto fail;
    }
    Py_INCREF(data);
    int bad = PyDict_DelItem(own, pos) < 0 || PyList_Append(run, data) < 0;
    Py_DECREF(data);
    Py_DECREF(pos);
    if (bad) goto fail;
    p += 1;
  }
  out = PyTuple_Pack(2, run, PyList_GET_SIZE(heap) > 0 ? PyList_GET_ITEM(heap, 0) : Py_None);
fail:
  Py_DECREF(run);
  return out;
}

/* answer(plock, settled, done) -> (answered, failed): the applied proposals of
 * `done` settle their seqs (and a RETIRE the seqs it retired) under plock; each
 * one's result is taken out of its record, and (future, result) goes to
 * `answered` (ok) or `failed` (an error to tell), unless its future is done
 * already (its owner cancelled it). Runtime._apply_rows tells them. */
static PyObject *answer(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3) return PyErr_Format(PyExc_TypeError, "answer(plock, settled, done)");
  PyObject *plock = args[0], *settled = args[1], *done = args[2];
  if (!PySet_Check(settled) || !PyList_CheckExact(done))
    return PyErr_Format(PyExc_TypeError, "answer takes the settled set and a list of proposals");
  Py_ssize_t n = PyList_GET_SIZE(done);
  for (Py_ssize_t i = 0; i < n; i++) {
    Proposal *p = (Proposal *)PyList_GET_ITEM(done, i);
    if (!PyObject_TypeCheck((PyObject *)p, &ProposalType))
      return PyErr_Format(PyExc_TypeError, "done holds proposals, not %R", (PyObject *)p);
    if (p->seq == NULL || p->future == NULL)  // (deleted, or never set: no __init__ ran)
      return PyErr_Format(PyExc_TypeError, "a proposal with no seq or future");
  }
  if (call_lock(plock, s_acquire) < 0) return NULL;
  int ok = 0;
  for (Py_ssize_t i = 0; i < n && ok == 0; i++) {
    Proposal *p = (Proposal *)PyList_GET_ITEM(done, i);
    if (PySet_Add(settled, p->seq) < 0) ok = -1;
    else if (p->retire != NULL && p->retire != empty) {
      int full = PyObject_IsTrue(p->retire);
      if (full < 0) ok = -1;
      else if (full) {
        PyObject *r = PyObject_CallMethodOneArg(settled, s_update, p->retire);
        if (r == NULL) ok = -1;
        Py_XDECREF(r);
      }
    }
  }
  if (release(plock) < 0 || ok < 0) return NULL;
  PyObject *answered = PyList_New(0), *failed = PyList_New(0), *out = NULL;
  if (answered == NULL || failed == NULL) goto fail;
  for (Py_ssize_t i = 0; i < n; i++) {
    Proposal *p = (Proposal *)PyList_GET_ITEM(done, i);
    PyObject *result = p->result != NULL ? p->result : Py_None;
    Py_INCREF(result);
    Py_INCREF(Py_None);
    Py_XSETREF(p->result, Py_None);
    PyObject *d = PyObject_CallMethodNoArgs(p->future, s_done);
    int is_done = d == NULL ? -1 : PyObject_IsTrue(d);
    Py_XDECREF(d);
    PyObject *pair = is_done == 0 ? PyTuple_Pack(2, p->future, result) : NULL;
    Py_DECREF(result);
    if (is_done < 0) goto fail;
    if (is_done) continue;
    if (pair == NULL || PyList_Append(p->ok ? answered : failed, pair) < 0) {
      Py_XDECREF(pair);
      goto fail;
    }
    Py_DECREF(pair);
  }
  out = PyTuple_Pack(2, answered, failed);
fail:
  Py_XDECREF(answered);
  Py_XDECREF(failed);
  return out;
}

static PyTypeObject ProposalType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pyzlog.objects._propose.Proposal",
    .tp_basicsize = sizeof(Proposal),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "one proposal's record (runtime._Pending's fields)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)proposal_init,
    .tp_dealloc = (destructor)proposal_dealloc,
    .tp_traverse = (traverseproc)proposal_traverse,
    .tp_clear = (inquiry)proposal_clear,
    .tp_members = proposal_members,
    .tp_methods = proposal_methods,
};

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "the header's constants and the classes to make"},
    {"new_pending", (PyCFunction)(void (*)(void))new_pending, METH_FASTCALL,
     "new_pending(rt, core, kind, stream, body, retire, streams): a proposal's seq, entry and record, registered"},
    {"landed", (PyCFunction)(void (*)(void))landed, METH_FASTCALL,
     "landed(rt, core, pos, data, wake, p): Runtime._landed (an own append is over)"},
    {"propose", (PyCFunction)(void (*)(void))propose, METH_FASTCALL,
     "propose(rt, core, kind, stream, body, streams): an async proposal's seq, entry, record and append"},
    {"enqueue", (PyCFunction)(void (*)(void))enqueue, METH_FASTCALL,
     "enqueue(rt, core, kind, stream, body, retire, streams): streams on, a proposal registered and queued"},
    {"configure_put", configure_put, METH_VARARGS, "configure_put(cmd, op, sstr, str, sbytes, bytes)"},
    {"put", (PyCFunction)(void (*)(void))put, METH_FASTCALL,
     "put(rt, core, stream, key, value): a map put of a str key and a str or bytes value, or None if not taken"},
    {"configure_streams", configure_streams, METH_VARARGS, "configure_streams(version, flag_backpointers)"},
    {"stream_entries", (PyCFunction)(void (*)(void))stream_entries, METH_FASTCALL,
     "stream_entries(first, k, answer, datas, first_level) -> [bytes]: a batch's entries with backpointers"},
    {"own_run", (PyCFunction)(void (*)(void))own_run, METH_FASTCALL,
     "own_run(heap, own, at, limit) -> (run, nxt): the run of own acknowledged entries from at (cv_lock held)"},
    {"answer", (PyCFunction)(void (*)(void))answer, METH_FASTCALL,
     "answer(plock, settled, done) -> (answered, failed): applied proposals' seqs settled, their results taken"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "pyzlog.objects._propose",
                                    "an async proposal's way into the log, in C", -1, methods};

PyMODINIT_FUNC PyInit__propose(void) {
#define INTERN(var, text) \
  if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
  INTERN(s_acquire, "acquire");
  INTERN(s_release, "release");
  INTERN(s_next_seq, "_next_seq");
  INTERN(s_in_flight, "_in_flight");
  INTERN(s_closing, "_closing");
  INTERN(s_client_id, "client_id");
  INTERN(s_propose_timeout, "propose_timeout");
  INTERN(s_log, "log");
  INTERN(s_append_async, "append_async");
  INTERN(s_popleft, "popleft");
  INTERN(s_append, "append");
  INTERN(s_settle, "_settle");
  INTERN(s_not_sent, "_not_sent");
  INTERN(s_send_failed, "_send_failed");
  INTERN(s_applied, "applied");
  INTERN(s_target, "_target");
  INTERN(s_notify_all, "notify_all");
  INTERN(s_core, "_core");
  INTERN(s_failed, "_failed");
  INTERN(s_update, "update");
  INTERN(s_done, "done");
  INTERN(s_one_stream, "_one_stream");
  INTERN(s_streams, "streams");
  INTERN(s_queued, "_queued");
#undef INTERN
  if ((kw_future = Py_BuildValue("(s)", "future")) == NULL || (empty = PyTuple_New(0)) == NULL) return NULL;
  PyObject *heapq = PyImport_ImportModule("heapq");
  if (heapq == NULL) return NULL;
  heappush = PyObject_GetAttrString(heapq, "heappush");
  heappop = PyObject_GetAttrString(heapq, "heappop");
  Py_DECREF(heapq);
  if (heappush == NULL || heappop == NULL) return NULL;
  if (PyType_Ready(&ProposalType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  Py_INCREF(&ProposalType);
  if (PyModule_AddObject(m, "Proposal", (PyObject *)&ProposalType) < 0) {
    Py_DECREF(&ProposalType);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
