/* fastread: the read path of cls_zlog on librados' C API, for pyzlog's cffi
 * module pyzlog._fastread (API mode; see build_fastread.py).
 *
 * The class calls of the read path (read, read_range, stat, max_position, or
 * any read-only method) go out as librados read ops with rados_read_op_exec,
 * several calls in one op where they share an object. Their completions are
 * collected in C, without Python: a librados callback queues the finished op
 * on its fr_queue, and one fr_wait() hands back many results at once.
 *
 * read_range replies are parsed into fr_window (an index over the reply
 * bytes), and fr_build() walks positions across the windows of a view's
 * objects into column buffers laid out for Arrow (fr_batch).
 *
 * Lifetimes: an op holds its queue and cluster alive until its callback has
 * run, whatever the caller has released meanwhile, and no callback ever
 * calls into Python. So dropping a queue with reads in flight, or exiting
 * with reads in flight, frees nothing that librados may still touch.
 *
 * This header is also the cffi cdef: the build script drops lines starting
 * with '#', so keep declarations plain C that cffi's parser accepts.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct fr_cluster fr_cluster; /* one rados_t */
typedef struct fr_pool fr_pool;       /* one rados_ioctx_t, owned by its cluster */
typedef struct fr_queue fr_queue;     /* completions of the ops submitted on it */

/* what a result is the answer to */
enum {
  FR_READ = 1,         /* "read": data is the entry */
  FR_RANGE = 2,        /* "read_range": window is the parsed reply */
  FR_STAT = 3,         /* "stat": data is the class's reply */
  FR_MAX_POSITION = 4, /* "max_position": data is the class's reply */
  FR_EXEC = 5          /* any other read-only method: data is its reply */
};

/* the kind of a row of an fr_batch (pyzlog.reader.RecordKind) */
enum { FR_KIND_DATA = 0, FR_KIND_FILLED = 1, FR_KIND_TRIMMED = 2, FR_KIND_LOST = 3 };

/* why fr_build stopped */
enum {
  FR_STOP_END = 0,     /* reached `end` */
  FR_STOP_FULL = 1,    /* max_rows or max_bytes reached */
  FR_STOP_NEED = 2,    /* stop_object's window does not cover stop_position */
  FR_STOP_MISSING = 3  /* stop_position is unwritten (as of its window) */
};

/* the most calls fr_read_many puts in one op */
enum { FR_MAX_CALLS_PER_OP = 1024 };

typedef struct {
  uint64_t tag;            /* the caller's, from the submit call */
  int32_t kind;            /* FR_READ ... FR_EXEC */
  int32_t code;            /* 0, or -errno: the op's if it failed, else this call's */
  const char *data;        /* reply bytes; valid until the next fr_wait on the queue */
  size_t len;
  struct fr_window *window; /* FR_RANGE, code 0: the parsed reply, now owned by the
                               caller (fr_window_free) */
} fr_result;

/* One read_range reply. Positions of the object in [first, next) that are not
 * listed and not below trim_below are unwritten. */
typedef struct fr_window {
  uint64_t first;          /* the request's first position */
  uint64_t next;           /* the reply's resume point */
  uint64_t trim_below;
  uint64_t max_position;   /* meaningful when has_max */
  uint32_t count;          /* entries in the reply */
  uint32_t head;           /* entries fr_build has consumed */
  int32_t has_max;
  uint64_t data_bytes;     /* sum of the entries' data lengths */
  void *priv;
} fr_window;

/* Columns for Arrow: positions and epochs (u64), kinds (u8, FR_KIND_*), data
 * as a binary column (int32 offsets, rows + 1 of them, and a validity bitmap:
 * only DATA rows have data). Every pointer is valid (non-NULL) even at 0 rows. */
typedef struct {
  uint32_t rows;
  uint32_t null_count;
  uint64_t *positions;
  uint64_t *epochs;
  uint8_t *kinds;
  int32_t *offsets;
  uint8_t *validity;
  char *data;
  uint64_t data_len;
  int32_t stop;            /* FR_STOP_* (fr_build) */
  uint64_t stop_position;  /* the first position not in the batch (fr_build) */
  uint32_t stop_object;    /* FR_STOP_NEED: index of the object to fetch */
} fr_batch;

/* ------------------------------------------------------------- connection */
/* Connects as `client` (e.g. "client.admin") with conf_file ("" for none) and
 * then n (key, value) settings. 0, or -errno with a message in err. */
int fr_cluster_open(const char *client, const char *conf_file, const char *const *keys,
                    const char *const *values, size_t n, fr_cluster **out, char *err,
                    size_t errlen);
/* Refuses new ops, waits up to timeout_s for those in flight, then closes the
 * pools and shuts librados down. Returns how many ops were still in flight
 * (their memory is kept, so a late callback stays harmless). Call once. */
uint64_t fr_cluster_close(fr_cluster *c, double timeout_s);
/* An I/O context on pool (and namespace ns, "" for none); it lives as long as
 * the cluster. 0 or -errno (-ENOENT: no such pool). */
int fr_pool_open(fr_cluster *c, const char *pool, const char *ns, fr_pool **out);

/* ------------------------------------------------------------------ queue */
fr_queue *fr_queue_new(fr_cluster *c);
/* The caller is done with q: undelivered results are dropped, and ops still
 * in flight free themselves (and q, with the last) when they complete. */
void fr_queue_release(fr_queue *q);
/* Up to max results, waiting up to timeout_s (< 0: no limit) for the first;
 * 0 at once when nothing is in flight. The previous wait's data pointers
 * become invalid. */
size_t fr_wait(fr_queue *q, fr_result *out, size_t max, double timeout_s);
/* Waits up to timeout_s until no op of q is in flight; 1 if none is. Results
 * stay queued for fr_wait. */
int fr_queue_drain(fr_queue *q, double timeout_s);
/* Calls sent whose result fr_wait has not handed out yet. */
uint64_t fr_queue_pending(fr_queue *q);

/* --------------------------------------------------------------- submits
 * Each returns 0, or -errno when nothing was sent (no result follows then);
 * -ESHUTDOWN once the cluster is closing. */
int fr_read(fr_queue *q, fr_pool *p, const char *oid, uint64_t epoch, uint64_t position,
            uint64_t tag);
/* One op, n "read" calls on one object (each may fail alone): n results. */
int fr_read_many(fr_queue *q, fr_pool *p, const char *oid, uint64_t epoch,
                 const uint64_t *positions, const uint64_t *tags, size_t n);
int fr_read_range(fr_queue *q, fr_pool *p, const char *oid, uint64_t epoch, uint64_t first,
                  uint64_t last, uint32_t max_entries, uint32_t max_bytes, uint64_t tag);
int fr_stat(fr_queue *q, fr_pool *p, const char *oid, uint64_t tag);
int fr_max_position(fr_queue *q, fr_pool *p, const char *oid, uint64_t epoch, uint64_t tag);
/* Any read-only method of class cls. */
int fr_exec(fr_queue *q, fr_pool *p, const char *oid, const char *cls, const char *method,
            const char *in, size_t in_len, uint64_t tag);

/* ---------------------------------------------------------------- windows */
/* Parses a read_range reply (copied); NULL if malformed. For tests and for
 * replies that came another way. */
fr_window *fr_window_parse(const char *reply, size_t len, uint64_t first);
void fr_window_free(fr_window *w);
/* Entry i of w (0 <= i < count): 0, or -1 when out of range. */
int fr_window_entry(const fr_window *w, uint32_t i, uint64_t *position, uint8_t *state,
                    uint64_t *epoch, const char **data, uint32_t *len);

/* ---------------------------------------------------------------- batches */
/* Every entry of w from head on, in order, as rows (w is not consumed). */
fr_batch *fr_window_batch(const fr_window *w);
/* Rows for positions start, start + step, ... (< end) of one view striped
 * over `width` objects: position p is object p % width, whose current window
 * is windows[p % width] (NULL: none yet). A listed entry becomes a row of its
 * kind, a position below the window's trim_below a TRIMMED row (epoch 0).
 * Stops at the first position that is unwritten (FR_STOP_MISSING), outside
 * its object's window (FR_STOP_NEED), at end, or when max_rows rows or
 * max_bytes bytes of data are in the batch (at least one row is). Consumes
 * the windows' entries it passes. NULL only when out of memory. */
fr_batch *fr_build(fr_window *const *windows, uint32_t width, uint64_t start, uint64_t end,
                   uint64_t step, uint32_t max_rows, uint64_t max_bytes);
void fr_batch_free(fr_batch *b);

/* ------------------------------------------------------------------ stats */
/* Live objects of this process, for tests that check nothing leaks:
 * 0 ops, 1 librados completions, 2 queues, 3 windows, 4 batches, 5 clusters. */
int64_t fr_live(int what);
