// The two per-entry loops of async appends, in C (pyzlog._appender.HotPath
// and settle): Python's interpreter, not librados or the OSD, had become what
// bounded append_async (a loop of them at depth 128 spent 1.75 us an entry
// in Log.append_async and 1.3 us settling it; the C++ pipeline underneath,
// driven by a minimal Python loop, ran 1.6x faster). Everything that is not
// the common case stays in Python (pyzlog/client/pipeline.py, LogAsync):
//
// Window is a log's bound on async operations in flight (LogAsync.max_in_flight).
// HotPath.append(data, future=None) is LogAsync.append(stored_form(state, data), future) when
//   the entry is plain bytes within the size limit, the log's window has a
//   slot, the connection is not blocklisted, and Python has checked the C++
//   pipeline's view and sequencer within the last moments (arm(): the
//   metadata snapshot it told, valid until a time; any refused or handed-back
//   entry disarms it). It counts the bytes, makes the LazyFuture, records the
//   item (owner, future, data, time) under a tag and queues the entry. Any
//   other case returns None, and Python takes the entry the ordinary way.
// settle(items, tags, codes, positions, n, now) takes the C++ pipeline's
//   posted outcomes (the completion queue's arrays, by address): each stored
//   entry's latency into the histogram here, its (future, position) into
//   its owner's list; it returns the owners' lists and the entries that were
//   not stored, which Python settles and judges (LogAsync.stored, outcome).
//
// Both run with the GIL held, on the appending and the completion thread.
#include <Python.h>
#include <pybind11/pybind11.h>

#include <time.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <utility>
#include <stdexcept>
#include <vector>

#include "appender.h"
#include "appender_hot.h"

namespace py = pybind11;

namespace zlog_native {
namespace {

PyObject *s_meta, *s_blocklisted, *s_acquire, *s_release, *s_cond, *s_state, *s_result, *s_exception,
    *s_done_callbacks, *s_append;

double monotonic() {  // time.monotonic()'s clock
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// ------------------------------------------------------------ latency
// The histogram of an async append's latency (metrics.APPEND_SECONDS["async"]
// reads it at scrape time): counts per bucket, the last past every bound, and
// the sum. One per process, as the metric is.
struct Latency {
  std::mutex mu;
  std::vector<double> bounds;
  std::vector<uint64_t> counts;
  double sum = 0;
} latency;

// ------------------------------------------------------------ Window
// One log's bound on async operations in flight (LogAsync.max_in_flight),
// counted here rather than in Python: HotPath.append takes a slot and queues
// its entry with no Python code in between, and a thread that waits for room
// waits with the GIL let go, looking for signals (Ctrl-C) only before it has
// taken anything, so an interrupt never leaves a slot counted.
struct WindowState {
  std::mutex mu;
  std::condition_variable room, idle;
  long long in_flight = 0, most = 1;
  bool closed = false;
};

struct Window {
  PyObject_HEAD
  WindowState* w;
};

// With w->mu held: a slot, if there is room (false: full or closed).
bool take_locked(WindowState* w) {
  if (w->closed || w->in_flight >= w->most) return false;
  ++w->in_flight;
  return true;
}

// A slot now, if there is one (false: full or closed).
bool window_try_take(WindowState* w) {
  std::lock_guard<std::mutex> l(w->mu);
  return take_locked(w);
}

// A wait this long or longer is a wait for ever (its deadline in
// nanoseconds would overflow the clock's count past about 292 years).
constexpr double kForeverSeconds = 365.0 * 86400;

// Waits (GIL let go) until `done` holds; every 50 ms, and before returning,
// looks for signals with the GIL held. 1: done; 0: timed out; -1: a signal
// handler raised.
template <typename Done>
int window_wait(WindowState* w, std::condition_variable& cv, double timeout, Done done) {
  const bool forever = timeout < 0;
  {  // done already: no letting the GIL go
    std::lock_guard<std::mutex> l(w->mu);
    if (done()) return 1;
  }
  using clock = std::chrono::steady_clock;
  const clock::time_point deadline =
      clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(forever ? 0 : timeout));
  for (;;) {
    bool ok, late;
    Py_BEGIN_ALLOW_THREADS
    {  // the mutex is let go before the GIL is taken back (the other order deadlocks with give())
      std::unique_lock<std::mutex> l(w->mu);
      clock::time_point until = clock::now() + std::chrono::milliseconds(50);
      if (!forever && deadline < until) until = deadline;
      ok = cv.wait_until(l, until, [&] { return done(); });
      late = !forever && clock::now() >= deadline;
    }
    Py_END_ALLOW_THREADS
    if (PyErr_CheckSignals() < 0) return -1;
    if (ok) return 1;
    if (late) return 0;
  }
}

int window_init(Window* self, PyObject* args, PyObject*) {
  long long most;
  if (!PyArg_ParseTuple(args, "L", &most)) return -1;
  if (most < 1) {
    PyErr_SetString(PyExc_ValueError, "the window holds at least 1");
    return -1;
  }
  if (!self->w) self->w = new WindowState();
  std::lock_guard<std::mutex> l(self->w->mu);
  self->w->most = most;
  return 0;
}

void window_dealloc(Window* self) {
  delete self->w;
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

WindowState* window_state(Window* self) {
  if (!self->w) PyErr_SetString(PyExc_RuntimeError, "the window was not made");
  return self->w;
}

// n slots back (never below none), waking who waits for room or idleness.
void window_give_n(WindowState* w, long long n) {
  std::lock_guard<std::mutex> l(w->mu);
  w->in_flight = n > w->in_flight ? 0 : w->in_flight - n;
  if (n == 1) w->room.notify_one();
  else w->room.notify_all();
  if (!w->in_flight) w->idle.notify_all();
}

// A slot, waiting for room. 1: taken; 0: closed (nothing taken); -1: a
// signal handler raised (nothing taken: a slot taken as the signal came
// goes back, the signal wins).
int window_take_waiting(WindowState* w) {
  bool taken = false;  // set under the mutex, in the predicate (at once if there is room)
  const int r = window_wait(w, w->room, -1, [&] {
    taken = take_locked(w);
    return taken || w->closed;
  });
  if (r < 0) {
    if (taken) window_give_n(w, 1);
    return -1;
  }
  return taken ? 1 : 0;
}

// A slot at once, past the bound if need be (false: closed).
bool window_take_over(WindowState* w) {
  std::lock_guard<std::mutex> l(w->mu);
  if (w->closed) return false;
  ++w->in_flight;
  return true;
}

// After a slot is taken: into.append(item), still in C, so no signal
// handler runs between the two (a Ctrl-C then finds either both done or
// neither). The slot goes back if the append fails.
PyObject* window_taken(WindowState* w, int taken, PyObject* into, PyObject* item) {
  if (taken < 0) return nullptr;
  if (taken && into != Py_None) {
    PyObject* r = PyObject_CallMethodOneArg(into, s_append, item);
    if (!r) {
      window_give_n(w, 1);
      return nullptr;
    }
    Py_DECREF(r);
  }
  return PyBool_FromLong(taken);
}

PyObject* window_take_over_py(Window* self, PyObject* args) {
  PyObject *into = Py_None, *item = Py_True;
  if (!PyArg_ParseTuple(args, "|OO", &into, &item)) return nullptr;
  WindowState* w = window_state(self);
  if (!w) return nullptr;
  return window_taken(w, window_take_over(w) ? 1 : 0, into, item);
}

PyObject* window_take(Window* self, PyObject* args) {
  PyObject *into = Py_None, *item = Py_True;
  if (!PyArg_ParseTuple(args, "|OO", &into, &item)) return nullptr;
  WindowState* w = window_state(self);
  if (!w) return nullptr;
  return window_taken(w, window_take_waiting(w), into, item);
}

PyObject* window_give(Window* self, PyObject* args) {
  long long n = 1;
  if (!PyArg_ParseTuple(args, "|L", &n)) return nullptr;
  if (n < 1) {  // a negative count would add slots past the bound
    PyErr_Format(PyExc_ValueError, "give(n): n is at least 1, not %lld", n);
    return nullptr;
  }
  WindowState* w = window_state(self);
  if (!w) return nullptr;
  window_give_n(w, n);
  Py_RETURN_NONE;
}

// A slot back if `token` (a list) still holds it: pops it and gives the
// slot in one C call, so whoever gets the token gives the slot, once, and a
// Ctrl-C never falls between the two.
PyObject* window_give_token(Window* self, PyObject* token) {
  if (!PyList_Check(token)) {
    PyErr_SetString(PyExc_TypeError, "give_token(token): token is the list take(into=token) filled");
    return nullptr;
  }
  WindowState* w = window_state(self);
  if (!w) return nullptr;
  const Py_ssize_t n = PyList_GET_SIZE(token);
  if (n == 0) Py_RETURN_FALSE;
  if (PyList_SetSlice(token, n - 1, n, nullptr) < 0) return nullptr;
  window_give_n(w, 1);
  Py_RETURN_TRUE;
}

PyObject* window_wait_idle(Window* self, PyObject* args) {
  PyObject* timeout_obj = Py_None;
  if (!PyArg_ParseTuple(args, "|O", &timeout_obj)) return nullptr;
  double timeout = -1;  // forever
  if (timeout_obj != Py_None) {
    timeout = PyFloat_AsDouble(timeout_obj);
    if (timeout == -1.0 && PyErr_Occurred()) return nullptr;
    if (std::isnan(timeout)) {
      PyErr_SetString(PyExc_ValueError, "the timeout is not a number");
      return nullptr;
    }
    if (timeout < 0) timeout = 0;
    if (timeout > kForeverSeconds) timeout = -1;  // a year or more: beyond what a clock's count holds in ns
  }
  WindowState* w = window_state(self);
  if (!w) return nullptr;
  const int r = window_wait(w, w->idle, timeout, [&] { return w->in_flight == 0; });
  return r < 0 ? nullptr : PyBool_FromLong(r);
}

PyObject* window_close(Window* self, PyObject*) {
  WindowState* w = window_state(self);
  if (!w) return nullptr;
  std::lock_guard<std::mutex> l(w->mu);
  w->closed = true;
  w->room.notify_all();
  Py_RETURN_NONE;
}

PyObject* window_get(Window* self, void* which) {
  WindowState* w = window_state(self);
  if (!w) return nullptr;
  std::lock_guard<std::mutex> l(w->mu);
  switch (reinterpret_cast<intptr_t>(which)) {
    case 0: return PyLong_FromLongLong(w->in_flight);
    case 1: return PyLong_FromLongLong(w->most);
    default: return PyBool_FromLong(w->closed);
  }
}

PyMethodDef window_methods[] = {
    {"take", reinterpret_cast<PyCFunction>(window_take), METH_VARARGS,
     "take(into=None, item=True) -> bool: a slot, waiting for room (Ctrl-C interrupts the wait, taking nothing); "
     "False once closed. Once taken, into.append(item) before any signal handler can run."},
    {"take_over", reinterpret_cast<PyCFunction>(window_take_over_py), METH_VARARGS,
     "take_over(into=None, item=True) -> bool: a slot at once, past the bound if need be; False once closed. "
     "Once taken, into.append(item) as take()."},
    {"give", reinterpret_cast<PyCFunction>(window_give), METH_VARARGS, "give(n=1): n slots back."},
    {"give_token", reinterpret_cast<PyCFunction>(window_give_token), METH_O,
     "give_token(token) -> bool: a slot back if the list `token` (filled by take(into=token)) still holds one; "
     "pops it with the same call. False: given back already."},
    {"wait_idle", reinterpret_cast<PyCFunction>(window_wait_idle), METH_VARARGS,
     "wait_idle(timeout=None) -> bool: until nothing is in flight; False on timeout."},
    {"close", reinterpret_cast<PyCFunction>(window_close), METH_NOARGS, "Take no more: take() answers False."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef window_getset[] = {
    {"in_flight", reinterpret_cast<getter>(window_get), nullptr, "slots taken", reinterpret_cast<void*>(0)},
    {"most", reinterpret_cast<getter>(window_get), nullptr, "the bound", reinterpret_cast<void*>(1)},
    {"closed", reinterpret_cast<getter>(window_get), nullptr, "whether closed", reinterpret_cast<void*>(2)},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject WindowType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "pyzlog._appender.Window";
  t.tp_basicsize = sizeof(Window);
  t.tp_flags = Py_TPFLAGS_DEFAULT;
  t.tp_doc = "Window(most): one log's bound on async operations in flight (native/appender_hot.cc).";
  t.tp_dealloc = reinterpret_cast<destructor>(window_dealloc);
  t.tp_init = reinterpret_cast<initproc>(window_init);
  t.tp_new = PyType_GenericNew;
  t.tp_methods = window_methods;
  t.tp_getset = window_getset;
  return t;
}();

// ------------------------------------------------------------ HotPath
struct HotPath {
  PyObject_HEAD
  Pipeline* pipeline;      // owned by `pipeline_obj`, which this keeps alive
  PyObject* pipeline_obj;  // the pybind11 Pipeline
  uint32_t log_id;
  PyObject* owner;         // the LogAsync
  PyObject* window;        // its Window
  PyObject* state;         // its LogState
  PyObject* conn;          // its data-plane Connection
  PyObject* items;         // AsyncPipeline.items: {tag: item}
  PyObject* tags;          // AsyncPipeline.tags: the iterator tags come from
  PyObject* future_type;   // LazyFuture
  Py_ssize_t max_entry;    // wire.MAX_ENTRY_BYTES
  PyObject* meta;          // the snapshot Python checked the pipeline against (None: disarmed)
  double armed_until;
  unsigned long long bytes;     // bytes taken, not yet counted into metrics.BYTES_OUT
  unsigned long long appended;  // entries taken, since it was made
};

int hot_traverse(HotPath* self, visitproc visit, void* arg) {
  Py_VISIT(self->pipeline_obj);
  Py_VISIT(self->owner);
  Py_VISIT(self->window);
  Py_VISIT(self->state);
  Py_VISIT(self->conn);
  Py_VISIT(self->items);
  Py_VISIT(self->tags);
  Py_VISIT(self->future_type);
  Py_VISIT(self->meta);
  return 0;
}

int hot_clear(HotPath* self) {
  Py_CLEAR(self->pipeline_obj);
  self->pipeline = nullptr;
  Py_CLEAR(self->owner);
  Py_CLEAR(self->window);
  Py_CLEAR(self->state);
  Py_CLEAR(self->conn);
  Py_CLEAR(self->items);
  Py_CLEAR(self->tags);
  Py_CLEAR(self->future_type);
  Py_CLEAR(self->meta);
  return 0;
}

void hot_dealloc(HotPath* self) {
  PyObject_GC_UnTrack(self);
  hot_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

int hot_init(HotPath* self, PyObject* args, PyObject* kwds) {
  static const char* kw[] = {"pipeline", "log_id", "owner", "window", "state", "conn", "items", "tags",
                             "future_type", "max_entry", nullptr};
  PyObject *pipeline, *owner, *window, *state, *conn, *items, *tags, *future_type;
  unsigned int log_id;
  Py_ssize_t max_entry;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OIOO!OOO!OOn", const_cast<char**>(kw), &pipeline, &log_id, &owner,
                                   &WindowType, &window, &state, &conn, &PyDict_Type, &items, &tags, &future_type,
                                   &max_entry))
    return -1;
  if (!reinterpret_cast<Window*>(window)->w) {
    PyErr_SetString(PyExc_ValueError, "the window was not made");
    return -1;
  }
  if (self->pipeline) {  // its fields never change while it lives (append lets the GIL go)
    PyErr_SetString(PyExc_RuntimeError, "a HotPath is made once");
    return -1;
  }
  if (!PyIter_Check(tags) || !PyType_Check(future_type)) {
    PyErr_SetString(PyExc_TypeError, "tags must be an iterator and future_type a class");
    return -1;
  }
  Pipeline* native;
  try {
    native = py::handle(pipeline).cast<Pipeline*>();
  } catch (const py::cast_error&) {
    PyErr_SetString(PyExc_TypeError, "pipeline must be a pyzlog._appender.Pipeline");
    return -1;
  }
  hot_clear(self);
  self->pipeline = native;
  self->log_id = log_id;
  self->max_entry = max_entry;
  PyObject** slots[] = {&self->pipeline_obj, &self->owner, &self->window, &self->state, &self->conn,
                        &self->items, &self->tags, &self->future_type};
  PyObject* given[] = {pipeline, owner, window, state, conn, items, tags, future_type};
  for (size_t i = 0; i < sizeof(given) / sizeof(given[0]); ++i) {
    Py_INCREF(given[i]);
    *slots[i] = given[i];
  }
  Py_INCREF(Py_None);
  self->meta = Py_None;
  self->armed_until = 0;
  return 0;
}

// a borrowed comparison: is getattr(obj, name) `want`? (-1: an error is set)
int attr_is(PyObject* obj, PyObject* name, PyObject* want) {
  PyObject* v = PyObject_GetAttr(obj, name);
  if (!v) return -1;
  const int same = v == want;
  Py_DECREF(v);
  return same;
}

// Puts `item` (owner, future, data, time) in the items under a new tag and
// queues its entry; no Python code runs. 1: queued; 0: the pipeline refused
// it (closed, or the log removed), and it is not in the items; -1: an error
// is set, and it is not in the items.
int enqueue(HotPath* self, PyObject* item) {
  PyObject* data = PyTuple_GET_ITEM(item, 2);
  if (!PyBytes_Check(data)) {
    PyErr_SetString(PyExc_TypeError, "an entry's stored form is bytes");
    return -1;
  }
  PyObject* tag = PyIter_Next(self->tags);
  if (!tag || PyDict_SetItem(self->items, tag, item) < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the append tags ran out");
    Py_XDECREF(tag);
    return -1;
  }
  const uint64_t ticket = PyLong_AsUnsignedLongLong(tag);
  const char* bytes = PyBytes_AS_STRING(data);
  const auto len = static_cast<uint32_t>(PyBytes_GET_SIZE(data));
  bool queued = false, refused = false;
  // the pipeline stays ours while the GIL is let go, whatever happens to `self`
  Pipeline* pipeline = self->pipeline;
  PyObject* keep = Py_NewRef(self->pipeline_obj);
  const uint32_t log_id = self->log_id;
  try {
    queued = pipeline->try_append(log_id, ticket, bytes, len);
    while (!queued) {  // the connection's window is full: wait for room without the GIL
      Py_BEGIN_ALLOW_THREADS
      pipeline->wait_room(0.2, len);
      Py_END_ALLOW_THREADS
      queued = pipeline->try_append(log_id, ticket, bytes, len);
    }
  } catch (const std::exception&) {
    refused = true;
  }
  Py_DECREF(keep);
  if (refused) PyDict_DelItem(self->items, tag);
  Py_DECREF(tag);
  return refused ? 0 : 1;
}

// LogAsync._finish(fut, None, the error set), for an entry that holds a
// slot and will not go; returns fut (a new reference) or NULL.
PyObject* fail_entry(HotPath* self, PyObject* fut) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyObject* r = PyObject_CallMethod(self->owner, "_finish", "(OOO)", fut, Py_None, value ? value : Py_None);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  if (!r) return nullptr;
  Py_DECREF(r);
  return Py_NewRef(fut);
}

PyObject* hot_append(HotPath* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 2) {
    PyErr_SetString(PyExc_TypeError, "append(data, future=None)");
    return nullptr;
  }
  PyObject* data = args[0];
  PyObject* given = nargs == 2 && args[1] != Py_None ? args[1] : nullptr;  // settled instead of a new one
  if (!self->pipeline) Py_RETURN_NONE;
  // stored_form's common case: bytes as they are, within the limit (a plain log: arm() says so)
  if (!PyBytes_CheckExact(data) || PyBytes_GET_SIZE(data) > self->max_entry) Py_RETURN_NONE;
  const double now = monotonic();
  if (now >= self->armed_until || self->meta == Py_None) Py_RETURN_NONE;
  int same = attr_is(self->state, s_meta, self->meta);  // no newer metadata since Python checked
  if (same <= 0) return same < 0 ? nullptr : Py_NewRef(Py_None);
  same = attr_is(self->conn, s_blocklisted, Py_None);  // never a position for a revoked client
  if (same <= 0) return same < 0 ? nullptr : Py_NewRef(Py_None);
  PyObject* fut = given ? Py_NewRef(given) : PyObject_CallNoArgs(self->future_type);
  if (!fut) return nullptr;
  if (!window_try_take(reinterpret_cast<Window*>(self->window)->w)) {  // full or closed: Python waits or says why
    Py_DECREF(fut);
    Py_RETURN_NONE;
  }
  // from here the slot is the entry's: it is queued, or its future is told
  // why not; no Python code runs before it is queued (nothing can interrupt)
  PyObject* when = PyFloat_FromDouble(now);
  PyObject* item = when ? PyTuple_Pack(4, self->owner, fut, data, when) : nullptr;
  Py_XDECREF(when);
  const int r = item ? enqueue(self, item) : -1;
  PyObject* out = fut;
  if (r > 0) {
    self->bytes += static_cast<unsigned long long>(PyBytes_GET_SIZE(data));
    ++self->appended;
    Py_INCREF(out);
  } else if (r == 0) {  // Python's _send finds the pipeline closed and tells the future so
    PyObject* sent = PyObject_CallMethod(self->owner, "_send", "(Od)", item, now);
    out = sent ? Py_NewRef(fut) : nullptr;
    Py_XDECREF(sent);
  } else {
    out = fail_entry(self, fut);
  }
  Py_XDECREF(item);
  Py_DECREF(fut);
  return out;
}

// queue(item, take): LogAsync._send's way into the pipeline, with a slot
// taken first for a new entry (take 1: waiting for room, Ctrl-C ending the
// wait before anything is taken; 2: at once, past the bound if need be; 0: it
// holds one already) and the entry queued with no Python code in between.
// 1: queued; 0: the window is closed (nothing taken); 2: the pipeline
// refused it (the slot, if taken, is the entry's: Python fails it).
PyObject* hot_queue(HotPath* self, PyObject* args) {
  PyObject* item;
  int take;
  if (!PyArg_ParseTuple(args, "O!i", &PyTuple_Type, &item, &take)) return nullptr;
  if (take < 0 || take > 2) {
    PyErr_SetString(PyExc_ValueError, "take is 0 (held), 1 (wait for room) or 2 (at once)");
    return nullptr;
  }
  if (PyTuple_GET_SIZE(item) != 4) {
    PyErr_SetString(PyExc_TypeError, "an append item is (owner, future, data, time)");
    return nullptr;
  }
  if (!self->pipeline) return PyLong_FromLong(2);
  WindowState* w = reinterpret_cast<Window*>(self->window)->w;
  if (take == 1) {
    const int t = window_take_waiting(w);
    if (t <= 0) return t < 0 ? nullptr : PyLong_FromLong(0);
  } else if (take == 2 && !window_take_over(w)) {
    return PyLong_FromLong(0);
  }
  const int r = enqueue(self, item);
  if (r < 0) {
    if (take) window_give_n(w, 1);  // not queued: its slot goes back, the error to the caller
    return nullptr;
  }
  return PyLong_FromLong(r ? 1 : 2);
}

PyObject* hot_arm(HotPath* self, PyObject* args) {
  PyObject* meta;
  double until;
  if (!PyArg_ParseTuple(args, "Od", &meta, &until)) return nullptr;
  Py_INCREF(meta);
  Py_XSETREF(self->meta, meta);  // XSET: a HotPath never initialised has none
  self->armed_until = until;
  Py_RETURN_NONE;
}

PyObject* hot_disarm(HotPath* self, PyObject*) {
  self->armed_until = 0;
  Py_INCREF(Py_None);
  Py_XSETREF(self->meta, Py_None);
  Py_RETURN_NONE;
}

PyObject* hot_take_bytes(HotPath* self, PyObject*) {
  const unsigned long long n = self->bytes;
  self->bytes = 0;
  return PyLong_FromUnsignedLongLong(n);
}

PyObject* hot_get_appended(HotPath* self, void*) { return PyLong_FromUnsignedLongLong(self->appended); }

PyObject* hot_get_armed(HotPath* self, void*) {
  return PyBool_FromLong(self->meta != Py_None && monotonic() < self->armed_until);
}

PyMethodDef hot_methods[] = {
    {"append", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(hot_append)), METH_FASTCALL,
     "append(data, future=None) -> Future (`future` if given: any object with set_result and set_exception), "
     "or None when Python must take the entry (see the module's source)."},
    {"queue", reinterpret_cast<PyCFunction>(hot_queue), METH_VARARGS,
     "queue(item, take: 0 held, 1 wait, 2 at once) -> 1 queued, 0 the window closed (nothing taken), "
     "2 refused by the pipeline."},
    {"arm", reinterpret_cast<PyCFunction>(hot_arm), METH_VARARGS,
     "arm(meta, until): the C++ pipeline holds meta's view and a usable sequencer; take entries until `until` "
     "(time.monotonic) while meta is the log's newest snapshot."},
    {"disarm", reinterpret_cast<PyCFunction>(hot_disarm), METH_NOARGS, "Take no entry until armed again."},
    {"take_bytes", reinterpret_cast<PyCFunction>(hot_take_bytes), METH_NOARGS,
     "The bytes of the entries taken since the last call (metrics.BYTES_OUT counts them)."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef hot_getset[] = {
    {"appended", reinterpret_cast<getter>(hot_get_appended), nullptr, "entries taken since it was made", nullptr},
    {"armed", reinterpret_cast<getter>(hot_get_armed), nullptr, "whether it takes entries now", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject HotPathType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "pyzlog._appender.HotPath";
  t.tp_basicsize = sizeof(HotPath);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  t.tp_doc = "The common case of one log's async append, in C (native/appender_hot.cc).";
  t.tp_traverse = reinterpret_cast<traverseproc>(hot_traverse);
  t.tp_clear = reinterpret_cast<inquiry>(hot_clear);
  t.tp_dealloc = reinterpret_cast<destructor>(hot_dealloc);
  t.tp_init = reinterpret_cast<initproc>(hot_init);
  t.tp_new = PyType_GenericNew;
  t.tp_methods = hot_methods;
  t.tp_getset = hot_getset;
  return t;
}();

// ------------------------------------------------------------ settle
struct Owned {  // the stored entries of one owner in one call
  PyObject* owner;  // a reference of its own: the items popped may have held the last
  PyObject* done;   // [(future, position)]
  unsigned long long top;
};

PyObject* settle(PyObject*, PyObject* args) {
  PyObject* items;
  unsigned long long tags_at, codes_at, positions_at;
  Py_ssize_t n;
  double now;
  if (!PyArg_ParseTuple(args, "O!KKKnd", &PyDict_Type, &items, &tags_at, &codes_at, &positions_at, &n, &now))
    return nullptr;
  const auto* tags = reinterpret_cast<const uint64_t*>(tags_at);
  const auto* codes = reinterpret_cast<const int32_t*>(codes_at);
  const auto* positions = reinterpret_cast<const uint64_t*>(positions_at);
  std::vector<Owned> owned;
  std::vector<double> waited;
  waited.reserve(static_cast<size_t>(n));
  PyObject* others = PyList_New(0);  // [(item, code, position)]: not stored
  if (!others) return nullptr;
  auto fail = [&]() -> PyObject* {
    for (auto& o : owned) {
      Py_DECREF(o.owner);
      Py_DECREF(o.done);
    }
    Py_DECREF(others);
    return nullptr;
  };
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* key = PyLong_FromUnsignedLongLong(tags[i]);
    if (!key) return fail();
    PyObject* item = PyDict_GetItemWithError(items, key);  // borrowed
    if (!item) {
      Py_DECREF(key);
      if (PyErr_Occurred()) return fail();
      continue;  // settled already (closed meanwhile)
    }
    Py_INCREF(item);
    const int gone = PyDict_DelItem(items, key);
    Py_DECREF(key);
    if (gone < 0) {
      Py_DECREF(item);
      return fail();
    }
    // what is not an item of the usual shape goes to Python as not stored,
    // where judging it fails and is logged: the rest of the batch is settled
    const bool usual = PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 4 &&
                       PyFloat_CheckExact(PyTuple_GET_ITEM(item, 3));
    PyObject* record;
    if (codes[i] == 0 && usual) {
      PyObject* owner = PyTuple_GET_ITEM(item, 0);
      waited.push_back(now - PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(item, 3)));
      Owned* o = nullptr;
      for (auto& x : owned)
        if (x.owner == owner) o = &x;
      if (!o) {
        PyObject* done = PyList_New(0);
        if (!done) {
          Py_DECREF(item);
          return fail();
        }
        Py_INCREF(owner);
        owned.push_back(Owned{owner, done, 0});
        o = &owned.back();
      }
      o->top = std::max<unsigned long long>(o->top, positions[i]);
      record = Py_BuildValue("(OK)", PyTuple_GET_ITEM(item, 1), static_cast<unsigned long long>(positions[i]));
      if (!record || PyList_Append(o->done, record) < 0) {
        Py_XDECREF(record);
        Py_DECREF(item);
        return fail();
      }
    } else {  // not stored (or not an item of the usual shape): Python judges it
      record = Py_BuildValue("(OiK)", item, static_cast<int>(codes[i]), static_cast<unsigned long long>(positions[i]));
      if (!record || PyList_Append(others, record) < 0) {
        Py_XDECREF(record);
        Py_DECREF(item);
        return fail();
      }
    }
    Py_DECREF(record);
    Py_DECREF(item);
  }
  if (!waited.empty()) {
    std::lock_guard<std::mutex> l(latency.mu);
    if (!latency.bounds.empty()) {
      for (double v : waited) {
        size_t b = 0;  // the first bucket whose bound is >= v (bisect_left)
        while (b < latency.bounds.size() && latency.bounds[b] < v) ++b;
        ++latency.counts[b];
        latency.sum += v;
      }
    }
  }
  PyObject* stored = PyList_New(static_cast<Py_ssize_t>(owned.size()));  // [(owner, done, top)]
  if (!stored) return fail();
  for (size_t k = 0; k < owned.size(); ++k) {
    PyObject* t = Py_BuildValue("(NNK)", owned[k].owner, owned[k].done, owned[k].top);
    owned[k].owner = owned[k].done = nullptr;  // the tuple has both (or they are gone)
    if (!t) {
      for (size_t j = k + 1; j < owned.size(); ++j) {
        Py_DECREF(owned[j].owner);
        Py_DECREF(owned[j].done);
      }
      Py_DECREF(stored);
      Py_DECREF(others);
      return nullptr;
    }
    PyList_SET_ITEM(stored, static_cast<Py_ssize_t>(k), t);
  }
  return Py_BuildValue("(NN)", stored, others);
}

PyObject* configure_latency(PyObject*, PyObject* arg) {
  PyObject* seq = PySequence_Fast(arg, "bounds must be a sequence of floats");
  if (!seq) return nullptr;
  std::vector<double> bounds;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    const double b = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
    if (b == -1.0 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return nullptr;
    }
    bounds.push_back(b);
  }
  Py_DECREF(seq);
  std::lock_guard<std::mutex> l(latency.mu);
  if (latency.bounds != bounds) {
    latency.bounds = bounds;
    latency.counts.assign(bounds.size() + 1, 0);
    latency.sum = 0;
  }
  Py_RETURN_NONE;
}

PyObject* read_latency(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> l(latency.mu);
  PyObject* counts = PyList_New(static_cast<Py_ssize_t>(latency.counts.size()));
  if (!counts) return nullptr;
  for (size_t i = 0; i < latency.counts.size(); ++i) {
    PyObject* c = PyLong_FromUnsignedLongLong(latency.counts[i]);
    if (!c) {
      Py_DECREF(counts);
      return nullptr;
    }
    PyList_SET_ITEM(counts, static_cast<Py_ssize_t>(i), c);
  }
  return Py_BuildValue("(Nd)", counts, latency.sum);
}

// LazyFuture._settle_locked, for the lot (pyzlog/core/futures.py, whose
// settle_all calls this with its lock): each (future, result) of `done`
// that is a LazyFuture nobody watches and still pending gets its result and
// FINISHED; the rest are left for Python's set_result. Returns (the settled
// futures that have callbacks to run, the (future, result) pairs left).
PyObject* settle_futures(PyObject*, PyObject* args) {
  PyObject *done, *lazy_type, *lock, *done_states, *finished;
  if (!PyArg_ParseTuple(args, "OOOOO", &done, &lazy_type, &lock, &done_states, &finished)) return nullptr;
  PyObject* seq = PySequence_Fast(done, "done must be a sequence of (future, result)");
  if (!seq) return nullptr;
  PyObject* called = PyList_New(0);
  PyObject* left = PyList_New(0);
  PyObject* r = called && left ? PyObject_CallMethodNoArgs(lock, s_acquire) : nullptr;
  if (!r) {
    Py_XDECREF(called);
    Py_XDECREF(left);
    Py_DECREF(seq);
    return nullptr;
  }
  Py_DECREF(r);
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(seq); ++i) {
    PyObject* pair = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
      PyErr_SetString(PyExc_TypeError, "done must hold (future, result) pairs");
      ok = false;
      break;
    }
    PyObject *fut = PyTuple_GET_ITEM(pair, 0), *result = PyTuple_GET_ITEM(pair, 1);
    int settled = 0;
    if (reinterpret_cast<PyObject*>(Py_TYPE(fut)) == lazy_type) {
      // _settle_locked: nobody made a Condition, and it is still pending
      PyObject* cond = PyObject_GetAttr(fut, s_cond);
      PyObject* state = cond ? PyObject_GetAttr(fut, s_state) : nullptr;
      const int pending = state ? (cond == Py_None ? !PySequence_Contains(done_states, state) : 0) : -1;
      Py_XDECREF(cond);
      Py_XDECREF(state);
      if (pending < 0 || (pending && (PyObject_SetAttr(fut, s_result, result) < 0 ||
                                      PyObject_SetAttr(fut, s_exception, Py_None) < 0 ||
                                      PyObject_SetAttr(fut, s_state, finished) < 0))) {
        ok = false;
        break;
      }
      settled = pending;
    }
    if (settled) {
      PyObject* dict = PyObject_GenericGetDict(fut, nullptr);
      const int has = dict ? PyDict_Contains(dict, s_done_callbacks) : -1;
      Py_XDECREF(dict);
      ok = has >= 0 && (!has || PyList_Append(called, fut) == 0);
    } else {
      ok = PyList_Append(left, pair) == 0;
    }
  }
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  r = PyObject_CallMethodNoArgs(lock, s_release);
  Py_DECREF(seq);
  if (!r || !ok) {
    Py_XDECREF(r);
    Py_DECREF(called);
    Py_DECREF(left);
    if (!ok) PyErr_Restore(type, value, tb);  // the first error wins
    else {
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(tb);
    }
    return nullptr;
  }
  Py_DECREF(r);
  return Py_BuildValue("(NN)", called, left);
}

PyMethodDef module_functions[] = {
    {"settle_futures", settle_futures, METH_VARARGS,
     "settle_futures(done, lazy_type, lock, done_states, finished) -> (called, left): LazyFuture.settle_all's "
     "loop (pyzlog/core/futures.py)."},
    {"settle", settle, METH_VARARGS,
     "settle(items, tags, codes, positions, n, now) -> (stored, others): the posted outcomes (arrays by address) "
     "grouped as [(owner, [(future, position)], top)] and [(item, code, position)]; latencies into the histogram."},
    {"configure_latency", configure_latency, METH_O, "configure_latency(bounds): the histogram's bucket bounds."},
    {"latency", read_latency, METH_NOARGS, "latency() -> (counts per bucket, the last past every bound; sum)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

void add_hot_path(PyObject* module) {
  const char* names[] = {"_meta", "blocklisted", "acquire", "release", "_cond", "_state", "_result", "_exception",
                         "_done_callbacks", "append"};
  PyObject** interned[] = {&s_meta, &s_blocklisted, &s_acquire, &s_release, &s_cond, &s_state, &s_result,
                           &s_exception, &s_done_callbacks, &s_append};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i)
    if (!(*interned[i] = PyUnicode_InternFromString(names[i]))) throw py::error_already_set();
  for (auto [type, name] : {std::pair<PyTypeObject*, const char*>{&WindowType, "Window"}, {&HotPathType, "HotPath"}}) {
    if (PyType_Ready(type) < 0) throw py::error_already_set();
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, reinterpret_cast<PyObject*>(type)) < 0) {
      Py_DECREF(type);
      throw py::error_already_set();
    }
  }
  if (PyModule_AddFunctions(module, module_functions) < 0) throw py::error_already_set();
}

}  // namespace zlog_native
