/* fastread: see fastread.h. */
#define _GNU_SOURCE
#include "fastread.h"

#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <rados/librados.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ stats */
enum { LIVE_OPS, LIVE_COMPLETIONS, LIVE_QUEUES, LIVE_WINDOWS, LIVE_BATCHES, LIVE_CLUSTERS, LIVE_N };
static int64_t live[LIVE_N];

static void live_add(int what, int64_t d) { __atomic_add_fetch(&live[what], d, __ATOMIC_RELAXED); }

int64_t fr_live(int what) {
  if (what < 0 || what >= LIVE_N) return -1;
  return __atomic_load_n(&live[what], __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------ time */
static void init_cond(pthread_cond_t *cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);  /* immune to wall-clock jumps */
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

static struct timespec deadline_after(double timeout_s) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  if (timeout_s > 1e9) timeout_s = 1e9;
  time_t whole = (time_t)timeout_s;
  long nsec = t.tv_nsec + (long)((timeout_s - (double)whole) * 1e9);
  t.tv_sec += whole + nsec / 1000000000L;
  t.tv_nsec = nsec % 1000000000L;
  return t;
}

/* Waits on cv until *flag-like predicate holds; returns when pred() or the
 * deadline passed (timeout_s < 0: no deadline). */
#define WAIT_UNTIL(cv, mu, pred, timeout_s)                              \
  do {                                                                   \
    if ((timeout_s) < 0) {                                               \
      while (!(pred)) pthread_cond_wait((cv), (mu));                     \
    } else {                                                             \
      struct timespec dl_ = deadline_after(timeout_s);                   \
      while (!(pred))                                                    \
        if (pthread_cond_timedwait((cv), (mu), &dl_) == ETIMEDOUT) break; \
    }                                                                    \
  } while (0)

/* ------------------------------------------------------------------ wire */
static uint64_t get_u64(const char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return le64toh(v);
}
static uint32_t get_u32(const char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return le32toh(v);
}
static void put_u64(char *p, uint64_t v) {
  v = htole64(v);
  memcpy(p, &v, 8);
}
static void put_u32(char *p, uint32_t v) {
  v = htole32(v);
  memcpy(p, &v, 4);
}

/* cls_zlog's layouts (docs/cls_zlog.md) */
enum { RANGE_HEAD = 29, RANGE_ENTRY = 21 };
enum { STATE_WRITTEN = 1, STATE_FILLED = 2, STATE_TRIMMED = 3 };
static const char CLS[] = "zlog";

/* --------------------------------------------------------------- objects */
struct fr_pool {
  fr_pool *next;
  rados_ioctx_t io;
};

struct fr_cluster {
  rados_t rados;
  pthread_mutex_t mu;
  pthread_cond_t idle;  /* in_flight reached 0 */
  uint64_t in_flight;   /* ops sent whose callback has not run */
  uint64_t queues;      /* queues not yet destroyed */
  int closing;          /* refuse new ops */
  int closed;           /* librados is shut down; free when nothing refers to us */
  fr_pool *pools;
};

typedef struct {
  uint64_t tag;
  uint64_t first; /* FR_RANGE: the request's first position */
  char *out;      /* librados' malloc'd reply (rados_buffer_free) */
  size_t out_len;
  fr_window *window; /* FR_RANGE: the parsed reply (it owns `out` then) */
  int rval;
  int32_t kind;
} fr_slot;

typedef struct fr_op {
  struct fr_op *next;
  fr_queue *q;
  rados_read_op_t rop;
  int ret;
  uint32_t ncalls;
  uint32_t delivered; /* slots fr_wait has handed out */
  fr_slot slots[];
} fr_op;

struct fr_queue {
  fr_cluster *c;
  pthread_mutex_t mu;
  pthread_cond_t ready; /* done list not empty */
  pthread_cond_t idle;  /* nothing in flight */
  fr_op *done_head, *done_tail;
  fr_op *handed; /* ops whose results the last fr_wait handed out */
  uint64_t ops_in_flight;
  uint64_t calls_pending; /* sent, and not yet handed out by fr_wait */
  int waiters;            /* threads inside fr_wait */
  int released;
};

typedef struct {
  uint64_t position, epoch;
  uint32_t off, len;
  uint8_t state;
} entry_t;

typedef struct {
  char *buf;        /* the reply */
  int rados_owned;  /* buf came from librados (rados_buffer_free) */
  entry_t *entries;
} window_priv;

/* ---------------------------------------------------------------- cluster */
static int cluster_done_with(fr_cluster *c) {
  /* c->mu held: is nothing left that refers to c? */
  return c->closed && c->in_flight == 0 && c->queues == 0;
}

static void cluster_free(fr_cluster *c) {
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->idle);
  free(c);
  live_add(LIVE_CLUSTERS, -1);
}

static void cluster_op_done(fr_cluster *c) {
  pthread_mutex_lock(&c->mu);
  if (--c->in_flight == 0) pthread_cond_broadcast(&c->idle);
  const int done = cluster_done_with(c);
  pthread_mutex_unlock(&c->mu);
  if (done) cluster_free(c);
}

int fr_cluster_open(const char *client, const char *conf_file, const char *const *keys,
                    const char *const *values, size_t n, fr_cluster **out, char *err,
                    size_t errlen) {
  rados_t r;
  int ret = rados_create2(&r, "ceph", client, 0);
  if (ret < 0) {
    snprintf(err, errlen, "rados_create2 as %s: %s", client, strerror(-ret));
    return ret;
  }
  if (conf_file && *conf_file && (ret = rados_conf_read_file(r, conf_file)) < 0) {
    snprintf(err, errlen, "reading %s: %s", conf_file, strerror(-ret));
    rados_shutdown(r);
    return ret;
  }
  for (size_t i = 0; i < n; ++i) {
    if ((ret = rados_conf_set(r, keys[i], values[i])) < 0) {
      snprintf(err, errlen, "setting %s: %s", keys[i], strerror(-ret));
      rados_shutdown(r);
      return ret;
    }
  }
  if ((ret = rados_connect(r)) < 0) {
    snprintf(err, errlen, "connecting as %s: %s", client, strerror(-ret));
    rados_shutdown(r);
    return ret;
  }
  fr_cluster *c = calloc(1, sizeof *c);
  if (!c) {
    rados_shutdown(r);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  c->rados = r;
  pthread_mutex_init(&c->mu, NULL);
  init_cond(&c->idle);
  live_add(LIVE_CLUSTERS, 1);
  *out = c;
  return 0;
}

uint64_t fr_cluster_close(fr_cluster *c, double timeout_s) {
  pthread_mutex_lock(&c->mu);
  c->closing = 1;
  WAIT_UNTIL(&c->idle, &c->mu, c->in_flight == 0, timeout_s);
  const uint64_t left = c->in_flight;
  fr_pool *pools = c->pools;
  c->pools = NULL;
  pthread_mutex_unlock(&c->mu);
  while (pools) {
    fr_pool *p = pools;
    pools = p->next;
    /* an op still in flight may use its I/O context: leave those to exit */
    if (left == 0) rados_ioctx_destroy(p->io);
    free(p);
  }
  /* Stops librados' threads: no callback runs after this returns. */
  rados_shutdown(c->rados);
  pthread_mutex_lock(&c->mu);
  c->closed = 1;
  const int done = cluster_done_with(c);
  pthread_mutex_unlock(&c->mu);
  if (done) cluster_free(c);
  return left;
}

int fr_pool_open(fr_cluster *c, const char *pool, const char *ns, fr_pool **out) {
  fr_pool *p = calloc(1, sizeof *p);
  if (!p) return -ENOMEM;
  pthread_mutex_lock(&c->mu);
  const int closing = c->closing;
  pthread_mutex_unlock(&c->mu);
  if (closing) {
    free(p);
    return -ESHUTDOWN;
  }
  int r = rados_ioctx_create(c->rados, pool, &p->io);
  if (r < 0) {
    free(p);
    return r;
  }
  if (ns && *ns) rados_ioctx_set_namespace(p->io, ns);
  pthread_mutex_lock(&c->mu);
  p->next = c->pools;
  c->pools = p;
  pthread_mutex_unlock(&c->mu);
  *out = p;
  return 0;
}

/* ------------------------------------------------------------------ queue */
static void op_free(fr_op *op) {
  for (uint32_t i = 0; i < op->ncalls; ++i) {
    if (op->slots[i].out) rados_buffer_free(op->slots[i].out);
    if (op->slots[i].window) fr_window_free(op->slots[i].window);
  }
  if (op->rop) rados_release_read_op(op->rop);
  free(op);
  live_add(LIVE_OPS, -1);
}

static void op_list_free(fr_op *op) {
  while (op) {
    fr_op *next = op->next;
    op_free(op);
    op = next;
  }
}

fr_queue *fr_queue_new(fr_cluster *c) {
  fr_queue *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  q->c = c;
  pthread_mutex_init(&q->mu, NULL);
  init_cond(&q->ready);
  init_cond(&q->idle);
  pthread_mutex_lock(&c->mu);
  ++c->queues;
  pthread_mutex_unlock(&c->mu);
  live_add(LIVE_QUEUES, 1);
  return q;
}

static void queue_destroy(fr_queue *q) {
  /* nothing in flight and the owner is gone: nobody else can reach q */
  op_list_free(q->done_head);
  op_list_free(q->handed);
  fr_cluster *c = q->c;
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->ready);
  pthread_cond_destroy(&q->idle);
  free(q);
  live_add(LIVE_QUEUES, -1);
  pthread_mutex_lock(&c->mu);
  --c->queues;
  const int done = cluster_done_with(c);
  pthread_mutex_unlock(&c->mu);
  if (done) cluster_free(c);
}

/* q->mu held: may q go? */
static int queue_unused(const fr_queue *q) {
  return q->released && q->ops_in_flight == 0 && q->waiters == 0;
}

void fr_queue_release(fr_queue *q) {
  pthread_mutex_lock(&q->mu);
  q->released = 1;
  pthread_cond_broadcast(&q->ready);  /* a thread still in fr_wait returns */
  const int now = queue_unused(q);
  pthread_mutex_unlock(&q->mu);
  if (now) queue_destroy(q);  /* else the last callback or waiter does it */
}

static fr_window *parse_window(char *buf, size_t len, uint64_t first, int rados_owned);

/* librados' callback (one of its threads): never calls into Python. */
static void on_complete(rados_completion_t comp, void *arg) {
  fr_op *op = arg;
  op->ret = rados_aio_get_return_value(comp);
  rados_aio_release(comp);  /* librados holds its own reference while calling us */
  live_add(LIVE_COMPLETIONS, -1);
  rados_release_read_op(op->rop);
  op->rop = NULL;
  /* Index range replies here, off the caller's thread: it only walks the
   * entry headers, and the caller then gets a ready window. */
  for (uint32_t i = 0; i < op->ncalls; ++i) {
    fr_slot *s = &op->slots[i];
    if (s->kind != FR_RANGE || op->ret < 0 || s->rval < 0) continue;
    s->window = parse_window(s->out, s->out_len, s->first, 1);
    if (s->window)
      s->out = NULL;  /* the window owns it now */
    else
      s->rval = -EBADMSG;
  }
  fr_queue *q = op->q;
  fr_cluster *c = q->c;
  int destroy = 0;
  pthread_mutex_lock(&q->mu);
  --q->ops_in_flight;
  if (q->released) {
    op_free(op);  /* nobody will wait for it */
    destroy = queue_unused(q);
  } else {
    op->next = NULL;
    if (q->done_tail)
      q->done_tail->next = op;
    else
      q->done_head = op;
    q->done_tail = op;
    pthread_cond_signal(&q->ready);
    if (q->ops_in_flight == 0) pthread_cond_broadcast(&q->idle);
  }
  pthread_mutex_unlock(&q->mu);
  if (destroy) queue_destroy(q);
  cluster_op_done(c);
}

static fr_op *op_new(fr_queue *q, uint32_t ncalls) {
  fr_op *op = calloc(1, sizeof *op + ncalls * sizeof(fr_slot));
  if (!op) return NULL;
  op->rop = rados_create_read_op();
  if (!op->rop) {
    free(op);
    return NULL;
  }
  op->q = q;
  op->ncalls = ncalls;
  live_add(LIVE_OPS, 1);
  return op;
}

static void op_add_call(fr_op *op, uint32_t i, const char *cls, const char *method, const char *in,
                        size_t in_len, int32_t kind, uint64_t tag, int failok) {
  fr_slot *s = &op->slots[i];
  s->tag = tag;
  s->kind = kind;
  /* librados copies `in`; it mallocs the reply into s->out when the op completes */
  rados_read_op_exec(op->rop, cls, method, in, in_len, &s->out, &s->out_len, &s->rval);
  if (failok) rados_read_op_set_flags(op->rop, LIBRADOS_OP_FLAG_FAILOK);
}

/* Sends op, or frees it and returns -errno. After a 0 return op belongs to
 * the callback and must not be touched. */
static int op_send(fr_queue *q, fr_pool *p, const char *oid, fr_op *op) {
  fr_cluster *c = q->c;
  pthread_mutex_lock(&c->mu);
  if (c->closing) {
    pthread_mutex_unlock(&c->mu);
    op_free(op);
    return -ESHUTDOWN;
  }
  ++c->in_flight;  /* before sending: close() waits for it */
  pthread_mutex_unlock(&c->mu);
  pthread_mutex_lock(&q->mu);
  ++q->ops_in_flight;
  q->calls_pending += op->ncalls;
  pthread_mutex_unlock(&q->mu);

  rados_completion_t comp;
  int r = rados_aio_create_completion2(op, on_complete, &comp);
  if (r == 0) {
    live_add(LIVE_COMPLETIONS, 1);
    r = rados_aio_read_op_operate(op->rop, p->io, comp, oid, 0);
    if (r == 0) return 0;
    rados_aio_release(comp);
    live_add(LIVE_COMPLETIONS, -1);
  }
  pthread_mutex_lock(&q->mu);
  --q->ops_in_flight;
  q->calls_pending -= op->ncalls;
  if (q->ops_in_flight == 0) pthread_cond_broadcast(&q->idle);
  pthread_mutex_unlock(&q->mu);
  op_free(op);
  cluster_op_done(c);
  return r;
}

int fr_read(fr_queue *q, fr_pool *p, const char *oid, uint64_t epoch, uint64_t position,
            uint64_t tag) {
  char in[16];
  put_u64(in, epoch);
  put_u64(in + 8, position);
  fr_op *op = op_new(q, 1);
  if (!op) return -ENOMEM;
  op_add_call(op, 0, CLS, "read", in, sizeof in, FR_READ, tag, 0);
  return op_send(q, p, oid, op);
}

int fr_read_many(fr_queue *q, fr_pool *p, const char *oid, uint64_t epoch,
                 const uint64_t *positions, const uint64_t *tags, size_t n) {
  if (n == 0) return 0;
  if (n > FR_MAX_CALLS_PER_OP) return -E2BIG;
  fr_op *op = op_new(q, (uint32_t)n);
  if (!op) return -ENOMEM;
  for (size_t i = 0; i < n; ++i) {
    char in[16];
    put_u64(in, epoch);
    put_u64(in + 8, positions[i]);
    /* FAILOK: an unwritten position fails its own call, not its neighbours' */
    op_add_call(op, (uint32_t)i, CLS, "read", in, sizeof in, FR_READ, tags[i], n > 1);
  }
  return op_send(q, p, oid, op);
}

int fr_read_range(fr_queue *q, fr_pool *p, const char *oid, uint64_t epoch, uint64_t first,
                  uint64_t last, uint32_t max_entries, uint32_t max_bytes, uint64_t tag) {
  char in[32];
  put_u64(in, epoch);
  put_u64(in + 8, first);
  put_u64(in + 16, last);
  put_u32(in + 24, max_entries);
  put_u32(in + 28, max_bytes);
  fr_op *op = op_new(q, 1);
  if (!op) return -ENOMEM;
  op->slots[0].first = first;
  op_add_call(op, 0, CLS, "read_range", in, sizeof in, FR_RANGE, tag, 0);
  return op_send(q, p, oid, op);
}

int fr_stat(fr_queue *q, fr_pool *p, const char *oid, uint64_t tag) {
  fr_op *op = op_new(q, 1);
  if (!op) return -ENOMEM;
  op_add_call(op, 0, CLS, "stat", "", 0, FR_STAT, tag, 0);
  return op_send(q, p, oid, op);
}

int fr_max_position(fr_queue *q, fr_pool *p, const char *oid, uint64_t epoch, uint64_t tag) {
  char in[8];
  put_u64(in, epoch);
  fr_op *op = op_new(q, 1);
  if (!op) return -ENOMEM;
  op_add_call(op, 0, CLS, "max_position", in, sizeof in, FR_MAX_POSITION, tag, 0);
  return op_send(q, p, oid, op);
}

int fr_exec(fr_queue *q, fr_pool *p, const char *oid, const char *cls, const char *method,
            const char *in, size_t in_len, uint64_t tag) {
  fr_op *op = op_new(q, 1);
  if (!op) return -ENOMEM;
  op_add_call(op, 0, cls, method, in, in_len, FR_EXEC, tag, 0);
  return op_send(q, p, oid, op);
}

size_t fr_wait(fr_queue *q, fr_result *out, size_t max, double timeout_s) {
  pthread_mutex_lock(&q->mu);
  fr_op *old = q->handed;  /* the previous wait's results: the caller is done with them */
  q->handed = NULL;
  if (!q->done_head && q->ops_in_flight > 0 && !q->released) {
    ++q->waiters;
    WAIT_UNTIL(&q->ready, &q->mu, q->done_head != NULL || q->released, timeout_s);
    --q->waiters;
    if (q->released) {  /* released under us: hand out nothing */
      const int destroy = queue_unused(q);
      pthread_mutex_unlock(&q->mu);
      op_list_free(old);
      if (destroy) queue_destroy(q);
      return 0;
    }
  }
  size_t n = 0;
  fr_op *handed = NULL, **handed_tail = &handed;
  while (q->done_head && n < max) {
    fr_op *op = q->done_head;
    while (op->delivered < op->ncalls && n < max) {
      fr_slot *s = &op->slots[op->delivered++];
      fr_result *r = &out[n++];
      --q->calls_pending;
      r->tag = s->tag;
      r->kind = s->kind;
      r->code = op->ret < 0 ? op->ret : (s->rval < 0 ? s->rval : 0);
      r->data = r->code == 0 ? s->out : NULL;
      r->len = r->code == 0 ? s->out_len : 0;
      r->window = s->window;  /* set only when code is 0; the caller's now */
      s->window = NULL;
    }
    if (op->delivered < op->ncalls) break;  /* the rest go to the next wait */
    q->done_head = op->next;
    if (!q->done_head) q->done_tail = NULL;
    op->next = NULL;
    *handed_tail = op;
    handed_tail = &op->next;
  }
  q->handed = handed;
  pthread_mutex_unlock(&q->mu);
  op_list_free(old);
  return n;
}

int fr_queue_drain(fr_queue *q, double timeout_s) {
  pthread_mutex_lock(&q->mu);
  WAIT_UNTIL(&q->idle, &q->mu, q->ops_in_flight == 0, timeout_s);
  const int idle = q->ops_in_flight == 0;
  pthread_mutex_unlock(&q->mu);
  return idle;
}

uint64_t fr_queue_pending(fr_queue *q) {
  pthread_mutex_lock(&q->mu);
  const uint64_t n = q->calls_pending;
  pthread_mutex_unlock(&q->mu);
  return n;
}

/* ---------------------------------------------------------------- windows */
static fr_window *parse_window(char *buf, size_t len, uint64_t first, int rados_owned) {
  if (!buf || len < RANGE_HEAD) return NULL;
  const uint32_t n = get_u32(buf + 25);
  if (n > (len - RANGE_HEAD) / RANGE_ENTRY) return NULL;
  fr_window *w = malloc(sizeof *w + sizeof(window_priv) + (size_t)n * sizeof(entry_t));
  if (!w) return NULL;
  window_priv *pv = (window_priv *)(w + 1);
  entry_t *e = (entry_t *)(pv + 1);
  size_t off = RANGE_HEAD;
  uint64_t data_bytes = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (len - off < RANGE_ENTRY) goto bad;
    e[i].position = get_u64(buf + off);
    e[i].state = (uint8_t)buf[off + 8];
    e[i].epoch = get_u64(buf + off + 9);
    const uint32_t dlen = get_u32(buf + off + 17);
    off += RANGE_ENTRY;
    if (dlen > len - off || off > UINT32_MAX) goto bad;
    if (e[i].state < STATE_WRITTEN || e[i].state > STATE_TRIMMED) goto bad;
    if (i > 0 && e[i].position <= e[i - 1].position) goto bad;  /* fr_build needs order */
    e[i].off = (uint32_t)off;
    e[i].len = dlen;
    off += dlen;
    data_bytes += dlen;
  }
  if (off != len) goto bad;
  w->first = first;
  w->trim_below = get_u64(buf);
  w->has_max = buf[8] != 0;
  w->max_position = get_u64(buf + 9);
  w->next = get_u64(buf + 17);
  w->count = n;
  w->head = 0;
  w->data_bytes = data_bytes;
  pv->buf = buf;
  pv->rados_owned = rados_owned;
  pv->entries = e;
  w->priv = pv;
  live_add(LIVE_WINDOWS, 1);
  return w;
bad:
  free(w);
  return NULL;
}

fr_window *fr_window_parse(const char *reply, size_t len, uint64_t first) {
  char *copy = malloc(len ? len : 1);
  if (!copy) return NULL;
  memcpy(copy, reply, len);
  fr_window *w = parse_window(copy, len, first, 0);
  if (!w) free(copy);
  return w;
}

void fr_window_free(fr_window *w) {
  if (!w) return;
  window_priv *pv = w->priv;
  if (pv->rados_owned)
    rados_buffer_free(pv->buf);
  else
    free(pv->buf);
  free(w);
  live_add(LIVE_WINDOWS, -1);
}

int fr_window_entry(const fr_window *w, uint32_t i, uint64_t *position, uint8_t *state,
                    uint64_t *epoch, const char **data, uint32_t *len) {
  if (i >= w->count) return -1;
  const window_priv *pv = w->priv;
  const entry_t *e = &pv->entries[i];
  *position = e->position;
  *state = e->state;
  *epoch = e->epoch;
  *data = pv->buf + e->off;
  *len = e->len;
  return 0;
}

/* ---------------------------------------------------------------- batches */
/* A row to emit: an entry of a window, or a trimmed position (e == NULL). */
typedef struct {
  const window_priv *pv;
  const entry_t *e;
  uint64_t position;
} row_ref;

static uint8_t kind_of(const window_priv *pv, const entry_t *e) {
  if (e->state == STATE_WRITTEN) return FR_KIND_DATA;
  if (e->state == STATE_TRIMMED) return FR_KIND_TRIMMED;
  /* a reader that filled a hole marked it lost (pyzlog.wire.LOST_MARK) */
  if (e->len == 1 && pv->buf[e->off] == 1) return FR_KIND_LOST;
  return FR_KIND_FILLED;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Allocates a batch for `rows` rows and `data_len` data bytes in one block,
 * every column 64-byte aligned as Arrow prefers. */
static fr_batch *batch_alloc(uint32_t rows, uint64_t data_len) {
  const size_t s_pos = align64((size_t)rows * 8), s_ep = s_pos, s_off = align64(((size_t)rows + 1) * 4),
               s_kind = align64(rows ? rows : 1), s_val = align64((rows + 7) / 8 ? (rows + 7) / 8 : 1),
               s_data = align64(data_len ? data_len : 1);
  const size_t head = align64(sizeof(fr_batch));
  char *block = NULL;
  if (posix_memalign((void **)&block, 64, head + s_pos + s_ep + s_off + s_kind + s_val + s_data)) return NULL;
  fr_batch *b = (fr_batch *)block;
  memset(b, 0, sizeof *b);
  char *p = block + head;
  b->positions = (uint64_t *)p;
  p += s_pos;
  b->epochs = (uint64_t *)p;
  p += s_ep;
  b->offsets = (int32_t *)p;
  p += s_off;
  b->kinds = (uint8_t *)p;
  p += s_kind;
  b->validity = (uint8_t *)p;
  memset(b->validity, 0, s_val);
  p += s_val;
  b->data = p;
  b->rows = rows;
  b->data_len = data_len;
  b->offsets[0] = 0;
  live_add(LIVE_BATCHES, 1);
  return b;
}

void fr_batch_free(fr_batch *b) {
  if (!b) return;
  free(b);
  live_add(LIVE_BATCHES, -1);
}

static void fill_rows(fr_batch *b, const row_ref *refs, uint32_t n) {
  int32_t off = 0;
  uint32_t nulls = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const row_ref *r = &refs[i];
    b->positions[i] = r->position;
    if (!r->e) {
      b->epochs[i] = 0;
      b->kinds[i] = FR_KIND_TRIMMED;
    } else {
      b->epochs[i] = r->e->epoch;
      b->kinds[i] = kind_of(r->pv, r->e);
    }
    if (b->kinds[i] == FR_KIND_DATA) {
      memcpy(b->data + off, r->pv->buf + r->e->off, r->e->len);
      off += (int32_t)r->e->len;
      b->validity[i / 8] |= (uint8_t)(1u << (i % 8));
    } else {
      ++nulls;
    }
    b->offsets[i + 1] = off;
  }
  b->null_count = nulls;
}

fr_batch *fr_window_batch(const fr_window *w) {
  const window_priv *pv = w->priv;
  const uint32_t n = w->count - w->head;
  row_ref *refs = malloc((n ? n : 1) * sizeof *refs);
  if (!refs) return NULL;
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const entry_t *e = &pv->entries[w->head + i];
    refs[i] = (row_ref){pv, e, e->position};
    if (e->state == STATE_WRITTEN) bytes += e->len;
  }
  fr_batch *b = bytes > INT32_MAX ? NULL : batch_alloc(n, bytes);
  if (b) {
    fill_rows(b, refs, n);
    b->stop = FR_STOP_END;
    b->stop_position = w->next;
  }
  free(refs);
  return b;
}

fr_batch *fr_build(fr_window *const *windows, uint32_t width, uint64_t start, uint64_t end,
                   uint64_t step, uint32_t max_rows, uint64_t max_bytes) {
  if (width == 0 || step == 0) return NULL;
  if (max_bytes > INT32_MAX) max_bytes = INT32_MAX;  /* int32 offsets */
  if (max_rows == 0) max_rows = 1;
  size_t cap = max_rows < 4096 ? max_rows : 4096;
  row_ref *refs = malloc(cap * sizeof *refs);
  if (!refs) return NULL;
  uint32_t n = 0;
  uint64_t bytes = 0;
  uint64_t p = start;
  int32_t stop = FR_STOP_END;
  uint32_t stop_object = 0;
  /* Pass 1: which rows, without consuming (a window's head moves in pass 2). */
  uint32_t *heads = malloc((size_t)width * sizeof *heads);
  if (!heads) {
    free(refs);
    return NULL;
  }
  for (uint32_t i = 0; i < width; ++i) heads[i] = windows[i] ? windows[i]->head : 0;
  for (;;) {
    if (p >= end) {
      stop = FR_STOP_END;
      break;
    }
    if (n >= max_rows) {
      stop = FR_STOP_FULL;
      break;
    }
    const uint32_t obj = (uint32_t)(p % width);
    const fr_window *w = windows[obj];
    if (!w || p < w->first || p >= w->next) {
      stop = FR_STOP_NEED;
      stop_object = obj;
      break;
    }
    const window_priv *pv = w->priv;
    uint32_t h = heads[obj];
    while (h < w->count && pv->entries[h].position < p) ++h;
    heads[obj] = h;
    row_ref ref;
    if (h < w->count && pv->entries[h].position == p) {
      const entry_t *e = &pv->entries[h];
      if (e->state == STATE_WRITTEN) {
        if (n > 0 && bytes + e->len > max_bytes) {
          stop = FR_STOP_FULL;
          break;
        }
        bytes += e->len;
      }
      ref = (row_ref){pv, e, p};
      heads[obj] = h + 1;
    } else if (p < w->trim_below) {
      ref = (row_ref){pv, NULL, p};
    } else {
      stop = FR_STOP_MISSING;
      break;
    }
    if (n == cap) {
      cap *= 2;
      row_ref *more = realloc(refs, cap * sizeof *refs);
      if (!more) {
        free(refs);
        free(heads);
        return NULL;
      }
      refs = more;
    }
    refs[n++] = ref;
    if (p > UINT64_MAX - step) {  /* the last position there is */
      p = UINT64_MAX;
      stop = FR_STOP_END;
      break;
    }
    p += step;
  }
  fr_batch *b = batch_alloc(n, bytes);
  if (b) {
    fill_rows(b, refs, n);
    b->stop = stop;
    b->stop_position = p;
    b->stop_object = stop_object;
    /* Pass 2 done: consume what the batch took. */
    for (uint32_t i = 0; i < width; ++i)
      if (windows[i]) windows[i]->head = heads[i];
  }
  free(refs);
  free(heads);
  return b;
}
