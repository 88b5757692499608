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
  unsigned char magic[2], version;
  PyTypeObject *pending_type, *future_type;
  PyObject *future_state;  // a fresh future's attributes: each new one starts as a copy
} F;

static PyObject *s_acquire, *s_release, *s_next_seq, *s_in_flight, *s_closing, *s_client_id, *s_propose_timeout,
    *s_log, *s_append_async, *s_popleft, *s_append, *s_settle, *s_not_sent, *s_send_failed, *s_applied, *s_target,
    *s_notify_all, *s_core, *s_failed, *kw_future, *empty, *heappush;

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

static PyObject *propose(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  long kind;
  if (nargs != 6) return PyErr_Format(PyExc_TypeError, "propose(rt, core, kind, stream, body, streams)");
  if (parse_args(args, &kind) < 0) return NULL;
  PyObject *rt = args[0], *cv_lock = PyTuple_GET_ITEM(args[1], 1);
  Proposal *p = register_new(rt, args[1], kind, args[3], args[4], Py_None, args[5]);
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
#undef INTERN
  if ((kw_future = Py_BuildValue("(s)", "future")) == NULL || (empty = PyTuple_New(0)) == NULL) return NULL;
  PyObject *heapq = PyImport_ImportModule("heapq");
  if (heapq == NULL) return NULL;
  heappush = PyObject_GetAttrString(heapq, "heappush");
  Py_DECREF(heapq);
  if (heappush == NULL) return NULL;
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
