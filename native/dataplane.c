/* The native data plane: see dataplane.h. */
#define _GNU_SOURCE
#include "dataplane.h"

#include <errno.h>
#include <pthread.h>
#include <rados/librados.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ stats */
enum { LIVE_OPS, LIVE_COMPLETIONS, LIVE_QUEUES, LIVE_WINDOWS, LIVE_BATCHES, LIVE_CLUSTERS, LIVE_N };
static int64_t live[LIVE_N];

static void live_add(int what, int64_t d) { __atomic_add_fetch(&live[what], d, __ATOMIC_RELAXED); }

int64_t dp_live(int what) {
  if (what < 0 || what >= LIVE_N) return -1;
  return __atomic_load_n(&live[what], __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------ time */
static void init_cond(pthread_cond_t *cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC); /* immune to wall-clock jumps */
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

static int64_t now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec;
}

/* Waits on cv until pred holds or the deadline passed (timeout_s < 0: none). */
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

static const char CLS[] = "zlog";
/* After an OSD answered EOPNOTSUPP to a protocol 2 call, a pool speaks
 * protocol 1 for this long, then tries 2 again (the class may have been
 * upgraded meanwhile). */
#define LEGACY_SECONDS 60
/* A write to a pool at its quota, or a cluster at its full ratio, comes back
 * at once with EDQUOT or ENOSPC (the caller's PoolFull) instead of waiting in
 * librados until space returns: appends fail within their timeout, and no
 * retry storm builds up behind a full pool. */
#define WRITE_FLAGS LIBRADOS_OPERATION_FULL_TRY

/* --------------------------------------------------------------- objects */
struct dp_pool {
  dp_pool *next;
  rados_ioctx_t io;
  int pinned;                 /* a protocol set by dp_pool_set_protocol, or 0 */
  int64_t legacy_until;       /* speak protocol 1 until then (monotonic s) */
};

struct dp_cluster {
  rados_t rados;
  pthread_mutex_t mu;
  pthread_cond_t idle; /* in_flight reached 0 */
  uint64_t in_flight;  /* ops sent whose callback has not run */
  uint64_t queues;     /* queues not yet destroyed */
  int closing;         /* refuse new ops */
  int closed;          /* librados is shut down; free when nothing refers to us */
  dp_pool *pools;
};

typedef struct {
  uint64_t tag;
  int32_t op;         /* ZLOG_OP_*, -1 for a raw exec, DP_OP_POSTED */
  int proto;          /* what it went out with (0: raw) */
  uint64_t first;     /* READ_RANGE: the request's first position */
  char *req;          /* our encoded request, kept for a protocol fallback */
  size_t req_len;
  char *out;          /* librados' malloc'd reply (rados_buffer_free) */
  size_t out_len;
  dp_window *window;  /* READ_RANGE: the parsed reply (it owns `out` then) */
  int rval;
  /* decoded replies */
  const char *data;
  size_t len;
  zlog_stat stat;
  uint8_t has_max;
  uint64_t max_position;
  uint64_t position; /* DP_OP_POSTED */
} dp_slot;

typedef void (*dp_callback)(void *arg, int code);

typedef struct dp_op {
  struct dp_op *next;
  dp_queue *q;          /* NULL: a callback op (cb) */
  dp_cluster *c;
  dp_pool *p;
  dp_callback cb;
  void *cb_arg;
  char *oid;            /* copy, for a resubmission */
  rados_read_op_t rop;
  rados_write_op_t wop;
  int write;
  int ret;
  uint32_t ncalls;
  uint32_t delivered;   /* slots dp_wait has handed out */
  dp_slot slots[];
} dp_op;

struct dp_queue {
  dp_cluster *c;
  pthread_mutex_t mu;
  pthread_cond_t ready; /* done list not empty */
  pthread_cond_t idle;  /* nothing in flight */
  dp_op *done_head, *done_tail;
  dp_op *handed;        /* ops whose results the last dp_wait handed out */
  uint64_t ops_in_flight;
  uint64_t expected;    /* posts announced by dp_expect and not yet made */
  uint64_t calls_pending; /* sent or expected, and not yet handed out by dp_wait */
  int waiters;          /* threads inside dp_wait */
  int woken;            /* dp_queue_wake */
  int hold;             /* dp_queue_hold */
  int released;
  int notify_fd;        /* dp_queue_notify_fd's eventfd, or -1 */
  int notified;         /* it has been written and not read since */
};

typedef struct {
  uint64_t position, epoch;
  uint64_t off;
  uint32_t len;
  uint8_t state;
} entry_t;

typedef struct {
  char *buf;       /* the reply */
  int rados_owned; /* buf came from librados (rados_buffer_free) */
  entry_t *entries;
  int refs;        /* its owner's, and one per row set pointing into it (dp_build_rows) */
} window_priv;

/* ---------------------------------------------------------------- cluster */
static int cluster_done_with(dp_cluster *c) {
  /* c->mu held: is nothing left that refers to c? */
  return c->closed && c->in_flight == 0 && c->queues == 0;
}

static void cluster_free(dp_cluster *c) {
  /* the pools' structs live as long as the cluster: a queue (which keeps the
   * cluster) may still be handed a pool of a closed connection, and must find
   * it there to be refused (found by AddressSanitizer: dp_submit read a pool
   * that dp_cluster_close had freed) */
  while (c->pools) {
    dp_pool *p = c->pools;
    c->pools = p->next;
    free(p);
  }
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->idle);
  free(c);
  live_add(LIVE_CLUSTERS, -1);
}

static void cluster_op_done(dp_cluster *c) {
  pthread_mutex_lock(&c->mu);
  if (--c->in_flight == 0) pthread_cond_broadcast(&c->idle);
  const int done = cluster_done_with(c);
  pthread_mutex_unlock(&c->mu);
  if (done) cluster_free(c);
}

int dp_cluster_open(const char *client, const char *conf_file, const char *const *keys,
                    const char *const *values, size_t n, dp_cluster **out, char *err, size_t errlen) {
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
  dp_cluster *c = calloc(1, sizeof *c);
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

uint64_t dp_cluster_close(dp_cluster *c, double timeout_s) {
  pthread_mutex_lock(&c->mu);
  c->closing = 1;
  WAIT_UNTIL(&c->idle, &c->mu, c->in_flight == 0, timeout_s);
  const uint64_t left = c->in_flight;
  dp_pool *pools = c->pools; /* no pool is added once closing: walked unlocked */
  pthread_mutex_unlock(&c->mu);
  for (dp_pool *p = pools; p; p = p->next) {
    /* an op still in flight may use its I/O context: leave those to exit.
     * The struct itself goes with the cluster (cluster_free). */
    if (left == 0) {
      rados_ioctx_destroy(p->io);
      p->io = NULL;
    }
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

uint64_t dp_cluster_in_flight(dp_cluster *c) {
  pthread_mutex_lock(&c->mu);
  const uint64_t n = c->in_flight;
  pthread_mutex_unlock(&c->mu);
  return n;
}

int dp_pool_open(dp_cluster *c, const char *pool, const char *ns, dp_pool **out) {
  dp_pool *p = calloc(1, sizeof *p);
  if (!p) return -ENOMEM;
  pthread_mutex_lock(&c->mu);
  const int closing = c->closing;
  pthread_mutex_unlock(&c->mu);
  if (closing) {
    free(p);
    return -ENOTCONN; /* not ESHUTDOWN: that is the OSDs' EBLOCKLISTED */
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

int dp_pool_protocol(dp_pool *p) {
  const int pinned = __atomic_load_n(&p->pinned, __ATOMIC_RELAXED);
  if (pinned) return pinned;
  return __atomic_load_n(&p->legacy_until, __ATOMIC_RELAXED) > now_s() ? ZLOG_PROTO_LEGACY
                                                                       : ZLOG_PROTO_CURRENT;
}

void dp_pool_set_protocol(dp_pool *p, int protocol) {
  __atomic_store_n(&p->pinned, protocol, __ATOMIC_RELAXED);
  __atomic_store_n(&p->legacy_until, 0, __ATOMIC_RELAXED);
}

void *dp_pool_ioctx(dp_pool *p) { return p->io; }

/* ------------------------------------------------------------------ queue */
static void op_free(dp_op *op) {
  for (uint32_t i = 0; i < op->ncalls; ++i) {
    if (op->slots[i].out) rados_buffer_free(op->slots[i].out);
    if (op->slots[i].window) dp_window_free(op->slots[i].window);
    free(op->slots[i].req);
  }
  if (op->rop) rados_release_read_op(op->rop);
  if (op->wop) rados_release_write_op(op->wop);
  free(op->oid);
  free(op);
  live_add(LIVE_OPS, -1);
}

static void op_list_free(dp_op *op) {
  while (op) {
    dp_op *next = op->next;
    op_free(op);
    op = next;
  }
}

dp_queue *dp_queue_new(dp_cluster *c) {
  dp_queue *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  q->c = c;
  q->notify_fd = -1;
  pthread_mutex_init(&q->mu, NULL);
  init_cond(&q->ready);
  init_cond(&q->idle);
  pthread_mutex_lock(&c->mu);
  ++c->queues;
  pthread_mutex_unlock(&c->mu);
  live_add(LIVE_QUEUES, 1);
  return q;
}

static void queue_destroy(dp_queue *q) {
  /* nothing in flight and the owner is gone: nobody else can reach q */
  op_list_free(q->done_head);
  op_list_free(q->handed);
  dp_cluster *c = q->c;
  if (q->notify_fd >= 0) close(q->notify_fd);
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
static int queue_unused(const dp_queue *q) { return q->released && q->ops_in_flight == 0 && q->waiters == 0; }

void dp_queue_release(dp_queue *q) {
  pthread_mutex_lock(&q->mu);
  q->released = 1;
  pthread_cond_broadcast(&q->ready); /* a thread still in dp_wait returns */
  const int now = queue_unused(q);
  pthread_mutex_unlock(&q->mu);
  if (now) queue_destroy(q); /* else the last callback or waiter does it */
}

void dp_queue_hold(dp_queue *q, int hold) {
  pthread_mutex_lock(&q->mu);
  q->hold = hold;
  pthread_mutex_unlock(&q->mu);
}

/* q->mu held: make the notify fd readable (once until dp_wait reads it). */
static void notify_locked(dp_queue *q) {
  if (q->notify_fd >= 0 && !q->notified) {
    const uint64_t one = 1;
    if (write(q->notify_fd, &one, sizeof one) == sizeof one) q->notified = 1;
  }
}

/* q->mu held, by dp_wait: nothing ready any more, so the fd stops being readable. */
static void unnotify_locked(dp_queue *q) {
  if (q->notified && !q->done_head) {
    uint64_t n;
    if (read(q->notify_fd, &n, sizeof n) == sizeof n || errno == EAGAIN) q->notified = 0;
  }
}

int dp_queue_notify_fd(dp_queue *q) {
  pthread_mutex_lock(&q->mu);
  if (q->notify_fd < 0) {
    q->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->notify_fd < 0) {
      const int err = errno;
      pthread_mutex_unlock(&q->mu);
      return -err;
    }
    if (q->done_head) notify_locked(q);
  }
  const int fd = q->notify_fd;
  pthread_mutex_unlock(&q->mu);
  return fd;
}

void dp_queue_wake(dp_queue *q) {
  pthread_mutex_lock(&q->mu);
  q->woken = 1;
  pthread_cond_broadcast(&q->ready);
  notify_locked(q);
  pthread_mutex_unlock(&q->mu);
}

/* q->mu held: queue a finished op for dp_wait (or free it if nobody will). */
static void queue_done_locked(dp_queue *q, dp_op *op) {
  if (q->released) {
    op_free(op);
    return;
  }
  op->next = NULL;
  if (q->done_tail)
    q->done_tail->next = op;
  else
    q->done_head = op;
  q->done_tail = op;
  pthread_cond_signal(&q->ready);
  notify_locked(q);
}

/* ------------------------------------------------------------ decoding */
static dp_window *parse_window(char *buf, size_t len, uint64_t first, int proto, int rados_owned);

/* Decodes slot s's reply by its op (on the callback's thread). */
static void decode_slot(dp_slot *s) {
  if (s->rval < 0) return;
  int r = 0;
  switch (s->op) {
    case ZLOG_OP_READ_RANGE:
    case ZLOG_OP_READ_SET:
      s->window = parse_window(s->out, s->out_len, s->first, s->proto, 1);
      if (s->window)
        s->out = NULL; /* the window owns it now */
      else
        r = -EBADMSG;
      break;
    case ZLOG_OP_READ: {
      const char *data = NULL;
      uint32_t n = 0;
      r = zlog_read_reply_decode(s->out ? s->out : "", s->out_len, s->proto, &data, &n);
      s->data = data;
      s->len = n;
      break;
    }
    case ZLOG_OP_META_GET:
      if (s->proto == ZLOG_PROTO_CURRENT) {
        const char *data = NULL;
        uint32_t n = 0;
        r = zlog_read_reply_decode(s->out ? s->out : "", s->out_len, s->proto, &data, &n);
        s->data = data;
        s->len = n;
      } else {
        s->data = s->out;
        s->len = s->out_len;
      }
      break;
    case ZLOG_OP_STAT:
      r = zlog_stat_decode(s->out ? s->out : "", s->out_len, s->proto, &s->stat);
      break;
    case ZLOG_OP_MAX_POSITION:
      r = zlog_max_decode(s->out ? s->out : "", s->out_len, s->proto, &s->has_max, &s->max_position);
      break;
    default: /* raw: the reply as it came */
      s->data = s->out;
      s->len = s->out_len;
  }
  if (r < 0) s->rval = r == -ZLOG_ERR_VERSION ? r : -EBADMSG;
}

/* ----------------------------------------------------------------- sending */
static dp_op *op_new(uint32_t ncalls, int write) {
  dp_op *op = calloc(1, sizeof *op + ncalls * sizeof(dp_slot));
  if (!op) return NULL;
  if (write)
    op->wop = rados_create_write_op();
  else
    op->rop = rados_create_read_op();
  if (!op->rop && !op->wop) {
    free(op);
    return NULL;
  }
  op->write = write;
  op->ncalls = ncalls;
  live_add(LIVE_OPS, 1);
  return op;
}

/* Adds slot i's call (its request already in s->req) to op. */
static void op_add_call(dp_op *op, uint32_t i, const char *cls, const char *method, int failok) {
  dp_slot *s = &op->slots[i];
  /* librados copies the input; it mallocs a read's reply into s->out */
  if (op->write) {
    rados_write_op_exec(op->wop, cls, method, s->req, s->req_len, &s->rval);
  } else {
    rados_read_op_exec(op->rop, cls, method, s->req, s->req_len, &s->out, &s->out_len, &s->rval);
    if (failok) rados_read_op_set_flags(op->rop, LIBRADOS_OP_FLAG_FAILOK);
  }
}

static void on_complete(rados_completion_t comp, void *arg);

/* Sends op on q (or with its callback), or frees it and returns -errno.
 * After a 0 return op belongs to the callback and must not be touched. */
static int op_send(dp_op *op) {
  dp_cluster *c = op->c;
  dp_queue *q = op->q;
  pthread_mutex_lock(&c->mu);
  if (c->closing) {
    pthread_mutex_unlock(&c->mu);
    op_free(op);
    return -ENOTCONN; /* not ESHUTDOWN: that is the OSDs' EBLOCKLISTED */
  }
  ++c->in_flight; /* before sending: close() waits for it */
  pthread_mutex_unlock(&c->mu);
  if (q) {
    pthread_mutex_lock(&q->mu);
    ++q->ops_in_flight;
    q->calls_pending += op->ncalls;
    pthread_mutex_unlock(&q->mu);
  }
  rados_completion_t comp;
  int r = rados_aio_create_completion2(op, on_complete, &comp);
  if (r == 0) {
    live_add(LIVE_COMPLETIONS, 1);
    r = op->write ? rados_aio_write_op_operate(op->wop, op->p->io, comp, op->oid, NULL, WRITE_FLAGS)
                  : rados_aio_read_op_operate(op->rop, op->p->io, comp, op->oid, 0);
    if (r == 0) return 0;
    rados_aio_release(comp);
    live_add(LIVE_COMPLETIONS, -1);
  }
  if (q) {
    pthread_mutex_lock(&q->mu);
    --q->ops_in_flight;
    q->calls_pending -= op->ncalls;
    if (q->ops_in_flight == 0) pthread_cond_broadcast(&q->idle);
    pthread_mutex_unlock(&q->mu);
  }
  op_free(op);
  cluster_op_done(c);
  return r;
}

/* An op of ncalls calls on oid, for q or cb. */
static dp_op *op_for(dp_queue *q, dp_cluster *c, dp_pool *p, const char *oid, uint32_t ncalls, int write) {
  dp_op *op = op_new(ncalls, write);
  if (!op) return NULL;
  op->q = q;
  op->c = c;
  op->p = p;
  op->oid = strdup(oid);
  if (!op->oid) {
    op_free(op);
    return NULL;
  }
  return op;
}

/* Encodes req as op `zop` in protocol proto into slot i. */
static int slot_encode(dp_op *op, uint32_t i, int zop, int proto, const zlog_req *req, uint64_t tag) {
  dp_slot *s = &op->slots[i];
  zw_writer w = {0};
  int r = zlog_req_encode(&w, (zlog_op)zop, proto, req);
  if (r < 0) {
    zw_free(&w);
    return r;
  }
  s->req = w.p;
  s->req_len = w.len;
  s->tag = tag;
  s->op = zop;
  s->proto = proto;
  s->first = req->position;
  return 0;
}

/* Re-encodes slot s (a protocol 2 request we encoded) as protocol 1 into
 * slot i of op. */
static int slot_legacy(dp_op *op, uint32_t i, const dp_slot *s) {
  zlog_req req;
  zw_reader entries;
  int r = zlog_req_decode(s->req, s->req_len, (zlog_op)s->op, ZLOG_PROTO_CURRENT, &req, &entries);
  if (r < 0) return r;
  /* an op on a data-format object means nothing to a class without protocol
   * 2: sending it as an omap op would store the entry where no reader looks */
  if (!zlog_method((zlog_op)s->op, ZLOG_PROTO_LEGACY) ||
      (req.format != ZLOG_FORMAT_OMAP && s->op != ZLOG_OP_META_CREATE && s->op != ZLOG_OP_META_PROPOSE_VIEW))
    return -EOPNOTSUPP;
  uint64_t *positions = NULL;
  const char **datas = NULL;
  uint32_t *lens = NULL;
  if (s->op == ZLOG_OP_WRITE_MANY) { /* unpack the entries for the encoder */
    positions = malloc(req.count * sizeof *positions);
    datas = malloc(req.count * sizeof *datas);
    lens = malloc(req.count * sizeof *lens);
    if (!positions || !datas || !lens) {
      r = -ENOMEM;
    } else {
      for (uint32_t k = 0; k < req.count; ++k) zlog_req_next_entry(&entries, &positions[k], &datas[k], &lens[k]);
      req.positions = positions;
      req.datas = datas;
      req.lens = lens;
    }
  }
  if (r == 0) r = slot_encode(op, i, s->op, ZLOG_PROTO_LEGACY, &req, s->tag);
  free(positions);
  free((void *)datas);
  free(lens);
  return r;
}

/* The same op again in protocol 1, from the protocol 2 requests it kept:
 * an OSD answered that it does not know protocol 2. 0 if sent. */
static int resend_legacy(dp_op *old) {
  dp_op *op = op_for(old->q, old->c, old->p, old->oid, old->ncalls, old->write);
  if (!op) return -ENOMEM;
  op->cb = old->cb;
  op->cb_arg = old->cb_arg;
  for (uint32_t i = 0; i < old->ncalls; ++i) {
    int r = slot_legacy(op, i, &old->slots[i]);
    if (r < 0) {
      op_free(op);
      return r;
    }
    op_add_call(op, i, CLS, zlog_method((zlog_op)old->slots[i].op, ZLOG_PROTO_LEGACY), old->ncalls > 1);
  }
  return op_send(op);
}

/* librados' callback (one of its threads): never calls into Python. */
static void on_complete(rados_completion_t comp, void *arg) {
  dp_op *op = arg;
  op->ret = rados_aio_get_return_value(comp);
  rados_aio_release(comp); /* librados holds its own reference while calling us */
  live_add(LIVE_COMPLETIONS, -1);
  if (op->rop) {
    rados_release_read_op(op->rop);
    op->rop = NULL;
  }
  if (op->wop) {
    rados_release_write_op(op->wop);
    op->wop = NULL;
  }
  dp_cluster *c = op->c;
  /* An OSD whose class predates protocol 2: the pool speaks 1 for a while,
   * and this op goes again in protocol 1. */
  int legacy = 0;
  for (uint32_t i = 0; i < op->ncalls; ++i)
    if (op->slots[i].proto == ZLOG_PROTO_CURRENT &&
        (op->ret == -EOPNOTSUPP || op->slots[i].rval == -EOPNOTSUPP))
      legacy = 1;
  if (legacy) {
    __atomic_store_n(&op->p->legacy_until, now_s() + LEGACY_SECONDS, __ATOMIC_RELAXED);
    dp_queue *q = op->q;
    if (resend_legacy(op) == 0) {
      if (q) {
        pthread_mutex_lock(&q->mu);
        --q->ops_in_flight; /* the new op counted itself */
        q->calls_pending -= op->ncalls;
        pthread_mutex_unlock(&q->mu);
      }
      op->q = NULL;
      op_free(op);
      cluster_op_done(c);
      return;
    }
  }
  /* Decode here, off the caller's thread: for a range it only walks the
   * entry headers, and the caller then gets a ready window. A failed op
   * (the object missing, say) fails every call that did not say more. */
  for (uint32_t i = 0; i < op->ncalls; ++i) {
    dp_slot *s = &op->slots[i];
    if (op->ret < 0 && s->rval >= 0) s->rval = op->ret;
    decode_slot(s);
  }
  if (op->cb) {
    const int code = op->slots[0].rval;
    dp_callback cb = op->cb;
    void *cb_arg = op->cb_arg;
    op_free(op);
    cb(cb_arg, code < 0 ? code : 0);
    cluster_op_done(c);
    return;
  }
  dp_queue *q = op->q;
  int destroy = 0;
  pthread_mutex_lock(&q->mu);
  --q->ops_in_flight;
  queue_done_locked(q, op);
  destroy = q->released && queue_unused(q);
  if (q->ops_in_flight == 0) pthread_cond_broadcast(&q->idle);
  pthread_mutex_unlock(&q->mu);
  if (destroy) queue_destroy(q);
  cluster_op_done(c);
}

int dp_submit(dp_queue *q, dp_pool *p, const char *oid, int op, const zlog_req *req, uint64_t tag) {
  if (op < 0 || op >= ZLOG_OP_COUNT) return -EINVAL;
  int proto = dp_pool_protocol(p);
  if (!zlog_method((zlog_op)op, proto)) proto = ZLOG_PROTO_CURRENT; /* version: protocol 2 only */
  dp_op *o = op_for(q, q->c, p, oid, 1, zlog_op_writes[op]);
  if (!o) return -ENOMEM;
  int r = slot_encode(o, 0, op, proto, req, tag);
  if (r < 0) {
    op_free(o);
    return r;
  }
  op_add_call(o, 0, CLS, zlog_method((zlog_op)op, proto), 0);
  return op_send(o);
}

/* For the C++ append pipeline: like dp_submit, completing with cb(arg, code)
 * on a librados thread instead of a queue. */
/* One blocking class call in protocol proto: 0 with the reply in *out
 * (malloc'd by librados) for a read method, or -errno. */
static int call_once(dp_pool *p, const char *oid, int op, int proto, const char *in, size_t in_len, char **out,
                     size_t *out_len) {
  int rval = 0, r;
  const char *method = zlog_method((zlog_op)op, proto);
  if (zlog_op_writes[op]) {
    rados_write_op_t w = rados_create_write_op();
    if (!w) return -ENOMEM;
    rados_write_op_exec(w, CLS, method, in, in_len, &rval);
    r = rados_write_op_operate(w, p->io, oid, NULL, WRITE_FLAGS);
    rados_release_write_op(w);
  } else {
    rados_read_op_t rd = rados_create_read_op();
    if (!rd) return -ENOMEM;
    rados_read_op_exec(rd, CLS, method, in, in_len, out, out_len, &rval);
    r = rados_read_op_operate(rd, p->io, oid, 0);
    rados_release_read_op(rd);
  }
  return r < 0 ? r : (rval < 0 ? rval : 0);
}

int dp_call(dp_cluster *c, dp_pool *p, const char *oid, int op, const zlog_req *req, dp_result *out) {
  memset(out, 0, sizeof *out);
  out->op = op;
  if (op < 0 || op >= ZLOG_OP_COUNT) return out->code = -EINVAL;
  pthread_mutex_lock(&c->mu);
  if (c->closing) {
    pthread_mutex_unlock(&c->mu);
    return out->code = -ENOTCONN;
  }
  ++c->in_flight; /* close() waits for it */
  pthread_mutex_unlock(&c->mu);
  int proto = dp_pool_protocol(p);
  if (!zlog_method((zlog_op)op, proto)) proto = ZLOG_PROTO_CURRENT;
  dp_slot s;
  memset(&s, 0, sizeof s);
  zw_writer w = {0};
  int r = zlog_req_encode(&w, (zlog_op)op, proto, req);
  if (r == 0) r = call_once(p, oid, op, proto, w.p, w.len, &s.out, &s.out_len);
  if (r == -EOPNOTSUPP && proto == ZLOG_PROTO_CURRENT) {
    /* an OSD whose class predates protocol 2: this call again in protocol 1 */
    __atomic_store_n(&p->legacy_until, now_s() + LEGACY_SECONDS, __ATOMIC_RELAXED);
    s.req = w.p;
    s.req_len = w.len;
    s.op = op;
    s.proto = proto;
    dp_op *legacy = op_new(1, zlog_op_writes[op]);
    if (legacy && slot_legacy(legacy, 0, &s) == 0) {
      if (s.out) rados_buffer_free(s.out);
      s.out = NULL;
      s.out_len = 0;
      proto = ZLOG_PROTO_LEGACY;
      r = call_once(p, oid, op, proto, legacy->slots[0].req, legacy->slots[0].req_len, &s.out, &s.out_len);
    }
    if (legacy) op_free(legacy);
    s.req = NULL;
  }
  zw_free(&w);
  s.op = op;
  s.proto = proto;
  s.first = req->position;
  s.rval = r;
  decode_slot(&s);
  out->code = s.rval < 0 ? s.rval : 0;
  out->protocol = proto;
  out->data = out->code == 0 ? s.data : NULL;
  out->len = out->code == 0 ? s.len : 0;
  out->stat = s.stat;
  out->has_max = s.has_max;
  out->max_position = s.max_position;
  out->window = s.window;
  out->owned = s.out;
  cluster_op_done(c);
  return out->code;
}

int dp_call_pos(dp_cluster *c, dp_pool *p, const char *oid, int op, uint64_t epoch, uint64_t position,
                const char *data, uint32_t len, uint8_t reason, uint8_t format, dp_result *out) {
  zlog_req req;
  memset(&req, 0, sizeof req);
  req.format = format;
  req.epoch = epoch;
  req.position = position;
  req.data = data;
  req.len = len;
  req.reason = reason;
  return dp_call(c, p, oid, op, &req, out);
}

void dp_result_release(dp_result *r) {
  if (r->owned) rados_buffer_free(r->owned);
  r->owned = NULL;
  if (r->window) dp_window_free(r->window);
  r->window = NULL;
  r->data = NULL;
}

int dp_submit_cb(dp_cluster *c, dp_pool *p, const char *oid, int op, const zlog_req *req,
                 void (*cb)(void *arg, int code), void *arg) {
  if (op < 0 || op >= ZLOG_OP_COUNT) return -EINVAL;
  const int proto = dp_pool_protocol(p);
  dp_op *o = op_for(NULL, c, p, oid, 1, zlog_op_writes[op]);
  if (!o) return -ENOMEM;
  o->cb = cb;
  o->cb_arg = arg;
  int r = slot_encode(o, 0, op, proto, req, 0);
  if (r < 0) {
    op_free(o);
    return r;
  }
  op_add_call(o, 0, CLS, zlog_method((zlog_op)op, proto), 0);
  return op_send(o);
}

int dp_read_many(dp_queue *q, dp_pool *p, const char *oid, uint64_t epoch, uint8_t format,
                 const uint64_t *positions, const uint64_t *tags, size_t n) {
  if (n == 0) return 0;
  if (n > DP_MAX_CALLS_PER_OP) return -E2BIG;
  const int proto = dp_pool_protocol(p);
  dp_op *op = op_for(q, q->c, p, oid, (uint32_t)n, 0);
  if (!op) return -ENOMEM;
  for (size_t i = 0; i < n; ++i) {
    zlog_req req;
    memset(&req, 0, sizeof req);
    req.format = format;
    req.epoch = epoch;
    req.position = positions[i];
    int r = slot_encode(op, (uint32_t)i, ZLOG_OP_READ, proto, &req, tags[i]);
    if (r < 0) {
      op_free(op);
      return r;
    }
    /* FAILOK: an unwritten position fails its own call, not its neighbours' */
    op_add_call(op, (uint32_t)i, CLS, zlog_method(ZLOG_OP_READ, proto), n > 1);
  }
  return op_send(op);
}

int dp_read_set(dp_queue *q, dp_pool *p, const char *oid, uint64_t epoch, uint8_t format,
                const uint64_t *positions, size_t n, uint64_t tag) {
  if (n == 0 || n > ZLOG_MAX_BATCH_ENTRIES) return -EINVAL;
  /* read_set is write_many's entries with no data: every one NULL, length 0 */
  static const char *const no_data[ZLOG_MAX_BATCH_ENTRIES];
  static const uint32_t no_len[ZLOG_MAX_BATCH_ENTRIES];
  zlog_req req;
  memset(&req, 0, sizeof req);
  req.expected_stripes = ZLOG_ANY_STRIPES;
  req.epoch = epoch;
  req.format = format;
  req.count = (uint32_t)n;
  req.positions = positions;
  req.datas = no_data;
  req.lens = no_len;
  return dp_submit(q, p, oid, ZLOG_OP_READ_SET, &req, tag);
}

int dp_exec(dp_queue *q, dp_pool *p, const char *oid, const char *cls, const char *method, const char *in,
            size_t in_len, int write, uint64_t tag) {
  dp_op *op = op_for(q, q->c, p, oid, 1, write != 0);
  if (!op) return -ENOMEM;
  dp_slot *s = &op->slots[0];
  s->req = malloc(in_len ? in_len : 1);
  if (!s->req) {
    op_free(op);
    return -ENOMEM;
  }
  if (in_len) memcpy(s->req, in, in_len);
  s->req_len = in_len;
  s->tag = tag;
  s->op = -1; /* raw: no decoding, no protocol fallback */
  op_add_call(op, 0, cls, method, 0);
  return op_send(op);
}

void dp_expect(dp_queue *q, uint64_t n) {
  pthread_mutex_lock(&q->mu);
  q->expected += n;
  q->calls_pending += n;
  pthread_mutex_unlock(&q->mu);
}

void dp_post_many(dp_queue *q, const uint64_t *tags, const int32_t *codes, const uint64_t *positions,
                  size_t n) {
  if (n == 0) return;
  dp_op *op = calloc(1, sizeof *op + n * sizeof(dp_slot));
  if (op) live_add(LIVE_OPS, 1);
  pthread_mutex_lock(&q->mu);
  q->expected -= n < q->expected ? n : q->expected;
  if (!op) { /* out of memory: the posts are lost; keep the counts honest */
    q->calls_pending -= n < q->calls_pending ? n : q->calls_pending;
    pthread_mutex_unlock(&q->mu);
    return;
  }
  op->ncalls = (uint32_t)n;
  for (size_t i = 0; i < n; ++i) {
    op->slots[i].tag = tags[i];
    op->slots[i].op = DP_OP_POSTED;
    op->slots[i].rval = codes[i];
    op->slots[i].position = positions[i];
  }
  queue_done_locked(q, op);
  const int destroy = q->released && queue_unused(q);
  pthread_mutex_unlock(&q->mu);
  if (destroy) queue_destroy(q);
}

void dp_post(dp_queue *q, uint64_t tag, int32_t code, uint64_t position) {
  dp_post_many(q, &tag, &code, &position, 1);
}

size_t dp_wait(dp_queue *q, dp_result *out, size_t max, double timeout_s) {
  pthread_mutex_lock(&q->mu);
  dp_op *old = q->handed; /* the previous wait's results: the caller is done with them */
  q->handed = NULL;
  if (!q->done_head && (q->ops_in_flight > 0 || q->expected > 0 || q->hold) && !q->released && !q->woken) {
    ++q->waiters;
    WAIT_UNTIL(&q->ready, &q->mu, q->done_head != NULL || q->released || q->woken, timeout_s);
    --q->waiters;
    if (q->released) { /* released under us: hand out nothing */
      const int destroy = queue_unused(q);
      pthread_mutex_unlock(&q->mu);
      op_list_free(old);
      if (destroy) queue_destroy(q);
      return 0;
    }
  }
  q->woken = 0;
  size_t n = 0;
  dp_op *handed = NULL, **handed_tail = &handed;
  while (q->done_head && n < max) {
    dp_op *op = q->done_head;
    while (op->delivered < op->ncalls && n < max) {
      dp_slot *s = &op->slots[op->delivered++];
      dp_result *r = &out[n++];
      --q->calls_pending;
      r->tag = s->tag;
      r->op = s->op;
      r->code = s->rval < 0 || s->op == DP_OP_POSTED ? s->rval : 0;
      r->protocol = s->proto;
      r->position = s->position;
      r->data = r->code == 0 ? s->data : NULL;
      r->len = r->code == 0 ? s->len : 0;
      r->stat = s->stat;
      r->has_max = s->has_max;
      r->max_position = s->max_position;
      r->window = s->window; /* set only when code is 0; the caller's now */
      s->window = NULL;
    }
    if (op->delivered < op->ncalls) break; /* the rest go to the next wait */
    q->done_head = op->next;
    if (!q->done_head) q->done_tail = NULL;
    op->next = NULL;
    *handed_tail = op;
    handed_tail = &op->next;
  }
  q->handed = handed;
  unnotify_locked(q);
  pthread_mutex_unlock(&q->mu);
  op_list_free(old);
  return n;
}

size_t dp_wait_split(dp_queue *q, dp_result *out, size_t max, double timeout_s, uint64_t *tags, int32_t *codes,
                     uint64_t *positions, size_t *ncalls, size_t *nposted) {
  const size_t n = dp_wait(q, out, max, timeout_s);
  size_t calls = 0, posted = 0;
  for (size_t i = 0; i < n; ++i) {
    if (out[i].op == DP_OP_POSTED) {
      tags[posted] = out[i].tag;
      codes[posted] = out[i].code;
      positions[posted] = out[i].position;
      ++posted;
    } else {
      if (calls != i) out[calls] = out[i];
      ++calls;
    }
  }
  *ncalls = calls;
  *nposted = posted;
  return n;
}

int dp_queue_drain(dp_queue *q, double timeout_s) {
  pthread_mutex_lock(&q->mu);
  WAIT_UNTIL(&q->idle, &q->mu, q->ops_in_flight == 0, timeout_s);
  const int idle = q->ops_in_flight == 0;
  pthread_mutex_unlock(&q->mu);
  return idle;
}

uint64_t dp_queue_pending(dp_queue *q) {
  pthread_mutex_lock(&q->mu);
  const uint64_t n = q->calls_pending;
  pthread_mutex_unlock(&q->mu);
  return n;
}

/* ------------------------------------------------------------------- wire */
int dp_encode(int op, int proto, const zlog_req *req, char **out, size_t *len) {
  if (op < 0 || op >= ZLOG_OP_COUNT) return -EINVAL;
  zw_writer w = {0};
  int r = zlog_req_encode(&w, (zlog_op)op, proto, req);
  if (r < 0) {
    zw_free(&w);
    return r;
  }
  *out = w.p ? w.p : malloc(1);
  *len = w.len;
  return *out ? 0 : -ENOMEM;
}

int dp_decode(int op, int proto, const char *in, size_t len, zlog_req *out) {
  if (op < 0 || op >= ZLOG_OP_COUNT) return -EINVAL;
  zw_reader entries;
  return zlog_req_decode(in, len, (zlog_op)op, proto, out, &entries);
}

int dp_decode_stat(const char *in, size_t len, int proto, zlog_stat *out) {
  return zlog_stat_decode(in, len, proto, out);
}

int dp_decode_max(const char *in, size_t len, int proto, uint8_t *has_max, uint64_t *max) {
  return zlog_max_decode(in, len, proto, has_max, max);
}

int dp_decode_version(const char *in, size_t len, zlog_version *out) {
  return zlog_version_decode(in, len, out);
}

int dp_decode_meta(const char *in, size_t len, zlog_meta *out) { return zlog_meta_decode(in, len, out); }

int dp_encode_meta(const zlog_meta *m, char **out, size_t *len) {
  zw_writer w = {0};
  zlog_meta_encode(&w, m);
  if (w.oom) {
    zw_free(&w);
    return -ENOMEM;
  }
  *out = w.p;
  *len = w.len;
  return 0;
}

int dp_encode_stat(int proto, const zlog_stat *s, char **out, size_t *len) {
  zw_writer w = {0};
  zlog_stat_encode(&w, proto, s);
  if (w.oom) {
    zw_free(&w);
    return -ENOMEM;
  }
  *out = w.p;
  *len = w.len;
  return 0;
}

const char *dp_method(int op, int proto) {
  return op >= 0 && op < ZLOG_OP_COUNT ? zlog_method((zlog_op)op, proto) : NULL;
}

int dp_op_writes(int op) { return op >= 0 && op < ZLOG_OP_COUNT ? zlog_op_writes[op] : 0; }

int dp_decode_read(const char *in, size_t len, int proto, const char **data, uint32_t *n) {
  return zlog_read_reply_decode(in, len, proto, data, n);
}

void dp_free(void *p) { free(p); }

/* ---------------------------------------------------------------- windows */
static dp_window *parse_window(char *buf, size_t len, uint64_t first, int proto, int rados_owned) {
  if (!buf) return NULL;
  zlog_range_head h;
  zlog_range_entry *parsed = NULL;
  if (zlog_range_decode(buf, len, proto, &h, &parsed) < 0) return NULL;
  dp_window *w = malloc(sizeof *w + sizeof(window_priv) + (size_t)(h.count ? h.count : 1) * sizeof(entry_t));
  if (!w) {
    free(parsed);
    return NULL;
  }
  window_priv *pv = (window_priv *)(w + 1);
  entry_t *e = (entry_t *)(pv + 1);
  uint64_t data_bytes = 0;
  for (uint32_t i = 0; i < h.count; ++i) {
    e[i].position = parsed[i].position;
    e[i].epoch = parsed[i].epoch;
    e[i].state = parsed[i].state;
    e[i].off = parsed[i].data_offset;
    e[i].len = parsed[i].len;
    data_bytes += parsed[i].len;
  }
  free(parsed);
  w->first = first;
  w->trim_below = h.trim_below;
  w->has_max = h.has_max != 0;
  w->max_position = h.max_position;
  w->next = h.next;
  w->count = h.count;
  w->head = 0;
  w->data_bytes = data_bytes;
  pv->buf = buf;
  pv->rados_owned = rados_owned;
  pv->entries = e;
  pv->refs = 1;
  w->priv = pv;
  live_add(LIVE_WINDOWS, 1);
  return w;
}

dp_window *dp_window_parse(const char *reply, size_t len, uint64_t first, int proto) {
  char *copy = malloc(len ? len : 1);
  if (!copy) return NULL;
  memcpy(copy, reply, len);
  dp_window *w = parse_window(copy, len, first, proto, 0);
  if (!w) free(copy);
  return w;
}

dp_window *dp_window_empty(uint64_t first, uint64_t next, uint64_t trim_below) {
  zw_writer wr = {0};
  zlog_range_head h = {trim_below, 0, 0, next, 0};
  zlog_range_head_encode(&wr, &h);
  if (wr.oom) {
    zw_free(&wr);
    return NULL;
  }
  dp_window *w = parse_window(wr.p, wr.len, first, ZLOG_PROTO_LEGACY, 0);
  if (!w) zw_free(&wr);
  return w;
}

void dp_window_free(dp_window *w) {
  if (!w) return;
  window_priv *pv = w->priv;
  if (__atomic_sub_fetch(&pv->refs, 1, __ATOMIC_ACQ_REL) > 0) return; /* a row set still reads it */
  if (pv->rados_owned)
    rados_buffer_free(pv->buf);
  else
    free(pv->buf);
  free(w);
  live_add(LIVE_WINDOWS, -1);
}

int dp_window_entry(const dp_window *w, uint32_t i, uint64_t *position, uint8_t *state, uint64_t *epoch,
                    const char **data, uint32_t *len) {
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
  if (e->state == ZLOG_WRITTEN) return DP_KIND_DATA;
  if (e->state == ZLOG_TRIMMED) return DP_KIND_TRIMMED;
  /* a reader that filled a hole marked it lost (one data byte, ZLOG_FILL_LOST) */
  if (e->len == 1 && pv->buf[e->off] == ZLOG_FILL_LOST) return DP_KIND_LOST;
  return DP_KIND_FILLED;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Allocates a batch for `rows` rows and `data_len` data bytes in one block,
 * every column 64-byte aligned as Arrow prefers. */
static dp_batch *batch_alloc(uint32_t rows, uint64_t data_len) {
  const size_t s_pos = align64((size_t)rows * 8), s_ep = s_pos, s_off = align64(((size_t)rows + 1) * 4),
               s_kind = align64(rows ? rows : 1), s_val = align64((rows + 7) / 8 ? (rows + 7) / 8 : 1),
               s_data = align64(data_len ? data_len : 1);
  const size_t head = align64(sizeof(dp_batch));
  char *block = NULL;
  if (posix_memalign((void **)&block, 64, head + s_pos + s_ep + s_off + s_kind + s_val + s_data)) return NULL;
  dp_batch *b = (dp_batch *)block;
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

void dp_batch_free(dp_batch *b) {
  if (!b) return;
  free(b);
  live_add(LIVE_BATCHES, -1);
}

static void fill_rows(dp_batch *b, const row_ref *refs, uint32_t n) {
  int32_t off = 0;
  uint32_t nulls = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const row_ref *r = &refs[i];
    b->positions[i] = r->position;
    if (!r->e) {
      b->epochs[i] = 0;
      b->kinds[i] = DP_KIND_TRIMMED;
    } else {
      b->epochs[i] = r->e->epoch;
      b->kinds[i] = kind_of(r->pv, r->e);
    }
    if (b->kinds[i] == DP_KIND_DATA) {
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

dp_batch *dp_window_batch(const dp_window *w) {
  const window_priv *pv = w->priv;
  const uint32_t n = w->count - w->head;
  row_ref *refs = malloc((n ? n : 1) * sizeof *refs);
  if (!refs) return NULL;
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const entry_t *e = &pv->entries[w->head + i];
    refs[i] = (row_ref){pv, e, e->position};
    if (e->state == ZLOG_WRITTEN) bytes += e->len;
  }
  dp_batch *b = bytes > INT32_MAX ? NULL : batch_alloc(n, bytes);
  if (b) {
    fill_rows(b, refs, n);
    b->stop = DP_STOP_END;
    b->stop_position = w->next;
  }
  free(refs);
  return b;
}

/* Which rows dp_build and dp_build_rows take from `windows`, without
 * consuming them (`heads` is where each window's next entry is once they are
 * taken): the walk both share. 0, or -ENOMEM. */
typedef struct {
  row_ref *refs;
  uint32_t n;
  uint64_t bytes;
  uint64_t stop_position;
  int32_t stop;
  uint32_t stop_object;
  uint32_t *heads;
} walk_t;

static void walk_free(walk_t *wk) {
  free(wk->refs);
  free(wk->heads);
}

static int walk(dp_window *const *windows, uint32_t width, uint32_t unit, uint64_t stripe_start, uint64_t start,
                uint64_t end, uint64_t step, uint32_t max_rows, uint64_t max_bytes, walk_t *wk) {
  memset(wk, 0, sizeof *wk);
  if (max_rows == 0) max_rows = 1;
  size_t cap = max_rows < 4096 ? max_rows : 4096;
  wk->refs = malloc(cap * sizeof *wk->refs);
  wk->heads = malloc((size_t)width * sizeof *wk->heads);
  if (!wk->refs || !wk->heads) {
    walk_free(wk);
    return -ENOMEM;
  }
  uint32_t *heads = wk->heads;
  uint32_t n = 0;
  uint64_t bytes = 0;
  uint64_t p = start;
  int32_t stop = DP_STOP_END;
  for (uint32_t i = 0; i < width; ++i) heads[i] = windows[i] ? windows[i]->head : 0;
  for (;;) {
    if (p >= end) {
      stop = DP_STOP_END;
      break;
    }
    if (n >= max_rows) {
      stop = DP_STOP_FULL;
      break;
    }
    const uint32_t obj = zlog_index_of(p, stripe_start, width, unit);
    const dp_window *w = windows[obj];
    if (!w || p < w->first || p >= w->next) {
      stop = DP_STOP_NEED;
      wk->stop_object = obj;
      break;
    }
    const window_priv *pv = w->priv;
    uint32_t h = heads[obj];
    while (h < w->count && pv->entries[h].position < p) ++h;
    heads[obj] = h;
    row_ref ref;
    if (h < w->count && pv->entries[h].position == p) {
      const entry_t *e = &pv->entries[h];
      if (e->state == ZLOG_WRITTEN) {
        if (n > 0 && bytes + e->len > max_bytes) {
          stop = DP_STOP_FULL;
          break;
        }
        bytes += e->len;
      }
      ref = (row_ref){pv, e, p};
      heads[obj] = h + 1;
    } else if (p < w->trim_below) {
      ref = (row_ref){pv, NULL, p};
    } else {
      stop = DP_STOP_MISSING;
      break;
    }
    if (n == cap) {
      cap *= 2;
      row_ref *more = realloc(wk->refs, cap * sizeof *wk->refs);
      if (!more) {
        walk_free(wk);
        return -ENOMEM;
      }
      wk->refs = more;
    }
    wk->refs[n++] = ref;
    if (p > UINT64_MAX - step) { /* the last position there is */
      p = UINT64_MAX;
      stop = DP_STOP_END;
      break;
    }
    p += step;
  }
  wk->n = n;
  wk->bytes = bytes;
  wk->stop = stop;
  wk->stop_position = p;
  return 0;
}

/* The rows a walk took are consumed: each window goes on from them. */
static void walk_consume(const walk_t *wk, dp_window *const *windows, uint32_t width) {
  for (uint32_t i = 0; i < width; ++i)
    if (windows[i]) windows[i]->head = wk->heads[i];
}

static int build_args_ok(uint32_t width, uint32_t unit, uint64_t stripe_start, uint64_t start, uint64_t step) {
  return width != 0 && step != 0 && unit != 0 && !(unit > 1 && start < stripe_start);
}

dp_batch *dp_build(dp_window *const *windows, uint32_t width, uint32_t unit, uint64_t stripe_start, uint64_t start,
                   uint64_t end, uint64_t step, uint32_t max_rows, uint64_t max_bytes) {
  if (!build_args_ok(width, unit, stripe_start, start, step)) return NULL;
  if (max_bytes > INT32_MAX) max_bytes = INT32_MAX; /* int32 offsets */
  walk_t wk;
  if (walk(windows, width, unit, stripe_start, start, end, step, max_rows, max_bytes, &wk) < 0) return NULL;
  dp_batch *b = batch_alloc(wk.n, wk.bytes);
  if (b) {
    fill_rows(b, wk.refs, wk.n);
    b->stop = wk.stop;
    b->stop_position = wk.stop_position;
    b->stop_object = wk.stop_object;
    walk_consume(&wk, windows, width);
  }
  walk_free(&wk);
  return b;
}

/* A window is freed once its owner has let go of it (dp_window_free) and no
 * row set points into it any more. */
static void window_hold(dp_window *w) { __atomic_add_fetch(&((window_priv *)w->priv)->refs, 1, __ATOMIC_RELAXED); }

dp_rows *dp_build_rows(dp_window *const *windows, uint32_t width, uint32_t unit, uint64_t stripe_start,
                       uint64_t start, uint64_t end, uint64_t step, uint32_t max_rows, uint64_t max_bytes) {
  if (!build_args_ok(width, unit, stripe_start, start, step)) return NULL;
  walk_t wk;
  if (walk(windows, width, unit, stripe_start, start, end, step, max_rows, max_bytes, &wk) < 0) return NULL;
  const size_t n = wk.n;
  dp_rows *r = calloc(1, sizeof *r + n * (8 + 8 + 1 + sizeof(char *) + 4) + (n + 1) * (8 + 4) +
                             (size_t)width * sizeof(dp_window *));
  if (!r) {
    walk_free(&wk);
    return NULL;
  }
  char *p = (char *)(r + 1); /* the arrays, widest first: every one aligned */
  r->positions = (uint64_t *)p, p += n * 8;
  r->epochs = (uint64_t *)p, p += n * 8;
  r->bytes_before = (uint64_t *)p, p += (n + 1) * 8;
  r->data = (const char **)p, p += n * sizeof(char *);
  r->windows = (dp_window **)p, p += (size_t)width * sizeof(dp_window *);
  r->lens = (uint32_t *)p, p += n * 4;
  r->data_before = (uint32_t *)p, p += (n + 1) * 4;
  r->kinds = (uint8_t *)p;
  r->rows = wk.n;
  for (uint32_t i = 0; i < wk.n; ++i) {
    const row_ref *ref = &wk.refs[i];
    r->positions[i] = ref->position;
    r->epochs[i] = ref->e ? ref->e->epoch : 0;
    r->kinds[i] = ref->e ? kind_of(ref->pv, ref->e) : DP_KIND_TRIMMED;
    const int data = r->kinds[i] == DP_KIND_DATA;
    r->data[i] = data ? ref->pv->buf + ref->e->off : NULL;
    r->lens[i] = data ? ref->e->len : 0;
    r->bytes_before[i + 1] = r->bytes_before[i] + r->lens[i];
    r->data_before[i + 1] = r->data_before[i] + (uint32_t)data;
  }
  for (uint32_t i = 0; i < width; ++i)
    if (windows[i] && windows[i]->head != wk.heads[i]) { /* rows come from it */
      window_hold(windows[i]);
      r->windows[r->nwindows++] = windows[i];
    }
  r->stop = wk.stop;
  r->stop_position = wk.stop_position;
  r->stop_object = wk.stop_object;
  walk_consume(&wk, windows, width);
  walk_free(&wk);
  live_add(LIVE_BATCHES, 1);
  return r;
}

void dp_rows_free(dp_rows *r) {
  if (!r) return;
  for (uint32_t i = 0; i < r->nwindows; ++i) dp_window_free(r->windows[i]);
  free(r);
  live_add(LIVE_BATCHES, -1);
}
