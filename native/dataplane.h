/* The native data plane: every cls_zlog call of a process, on librados' C API.
 *
 * One dp_cluster is one librados connection (rados_t), shared by every log of
 * a pyzlog connection. A call is submitted on a dp_queue as a librados read
 * op (read-only methods) or write op (the rest); its completion is queued in
 * C by librados' callback, which never calls into Python, and dp_wait hands
 * back many results at once. Requests are encoded and replies decoded with
 * cls_zlog/ops.h, the definition the object class uses too.
 *
 * Protocol: calls go out as protocol 2 ("<op>2"). An OSD whose class predates
 * it answers EOPNOTSUPP; the call is then sent again as protocol 1 from its
 * own encoded request, the pool speaks protocol 1 for a while, and nobody
 * above sees the difference. That covers a cluster in the middle of a rolling
 * class upgrade as well as one that never upgraded.
 *
 * The C++ append pipeline (appender.h) submits through the same functions
 * with a C callback instead of a queue, and posts its outcomes into a queue
 * with dp_post.
 *
 * Lifetimes: an op holds its queue and cluster alive until its callback has
 * run, whatever the caller released meanwhile. So dropping a queue with calls
 * in flight, or exiting with calls in flight, frees nothing librados may
 * still touch.
 *
 * This header is also the cffi cdef (native/build_dataplane.py): lines that
 * start with '#' are left out of it, and everything else must be plain C
 * that cffi's parser accepts. Structs of ops.h appear here with `...;`: cffi
 * takes their layout from ops.h itself when it compiles the module.
 */
#ifndef ZLOG_DATAPLANE_H
#define ZLOG_DATAPLANE_H
#include <stddef.h>
#include <stdint.h>
#include "../cls_zlog/ops.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef CFFI_CDEF
typedef struct {
  uint64_t epoch; uint64_t position; uint64_t last; uint32_t max_entries; uint32_t max_bytes;
  uint8_t reason; const char *data; uint32_t len; uint64_t expected; uint64_t next_epoch;
  uint64_t start; uint32_t width; const char *seqr; uint32_t seqr_len; uint32_t count;
  const uint64_t *positions; const char *const *datas; const uint32_t *lens;
  uint8_t format; uint32_t slots; uint64_t byte_bound; uint32_t stripe; uint32_t expected_stripes;
  uint32_t unit; ...;
} zlog_req;
typedef struct {
  uint64_t sealed_epoch; uint8_t has_max; uint64_t max_position; uint64_t trim_below;
  uint8_t has_end; uint64_t view_end; uint8_t format; uint64_t entries; uint64_t bytes; ...;
} zlog_stat;
typedef struct {
  uint64_t epoch; uint64_t start; uint32_t width; uint8_t format; uint32_t slots; uint64_t byte_bound;
  uint32_t stripes; uint32_t unit; ...;
} zlog_view;
typedef struct {
  uint64_t epoch; const char *config; uint32_t config_len; uint32_t nviews; zlog_view *views;
  uint64_t seqr_epoch; const char *seqr; uint32_t seqr_len; uint64_t trim_below; ...;
} zlog_meta;
typedef struct { uint32_t major; uint32_t minor; uint8_t protocol; ...; } zlog_version;
static const int ZLOG_OP_WRITE, ZLOG_OP_WRITE_MANY, ZLOG_OP_READ, ZLOG_OP_READ_RANGE, ZLOG_OP_FILL,
    ZLOG_OP_TRIM, ZLOG_OP_TRIM_TO, ZLOG_OP_SEAL, ZLOG_OP_CLOSE, ZLOG_OP_MAX_POSITION, ZLOG_OP_STAT,
    ZLOG_OP_META_CREATE, ZLOG_OP_META_GET, ZLOG_OP_META_NEW_EPOCH, ZLOG_OP_META_PROPOSE_VIEW,
    ZLOG_OP_VERSION, ZLOG_OP_INIT, ZLOG_OP_META_OPEN_STRIPE, ZLOG_OP_META_TRIM, ZLOG_OP_REPAIR,
    ZLOG_OP_READ_SET, ZLOG_OP_COUNT;
static const int ZLOG_FORMAT_OMAP, ZLOG_FORMAT_DATA;
static const uint32_t ZLOG_ANY_STRIPES, ZLOG_MAX_UNIT;
/* ops.h's layout of a data-format view (the unit tier checks core.layout against them) */
uint32_t zlog_index_of(uint64_t p, uint64_t ss, uint32_t width, uint32_t unit);
uint64_t zlog_base_of(uint64_t ss, uint32_t index, uint32_t width, uint32_t unit);
uint64_t zlog_slot_of(uint64_t off, uint32_t width, uint32_t unit);
uint64_t zlog_offset_of(uint64_t slot, uint32_t width, uint32_t unit);
int zlog_object_holds(uint64_t off, uint32_t width, uint32_t unit);
uint64_t zlog_next_held(uint64_t off, uint32_t width, uint32_t unit);
uint64_t zlog_prev_held(uint64_t off, uint32_t width, uint32_t unit);
int zlog_geometry_ok(uint32_t width, uint32_t slots, uint32_t unit);
static const int ZLOG_PROTO_LEGACY, ZLOG_PROTO_CURRENT, ZLOG_STRUCT_V, ZLOG_COMPAT_V;
static const int ZLOG_WRITTEN, ZLOG_FILLED, ZLOG_TRIMMED, ZLOG_FILL_JUNK, ZLOG_FILL_LOST;
static const int ZLOG_MAX_BATCH_ENTRIES, ZLOG_MAX_RANGE_ENTRIES, ZLOG_MAX_RANGE_BYTES, ZLOG_MAX_WIDTH,
    ZLOG_MAX_CONFIG_BYTES, ZLOG_MAX_SEQR_BYTES, ZLOG_MAX_VIEWS;
static const uint64_t ZLOG_MAX_POSITION, ZLOG_MAX_EPOCH;
#endif

typedef struct dp_cluster dp_cluster; /* one rados_t */
typedef struct dp_pool dp_pool;       /* one rados_ioctx_t, owned by its cluster */
typedef struct dp_queue dp_queue;     /* completions of the calls submitted on it */

/* the kind of a row of a dp_batch (pyzlog.client.reader.RecordKind) */
enum { DP_KIND_DATA = 0, DP_KIND_FILLED = 1, DP_KIND_TRIMMED = 2, DP_KIND_LOST = 3 };

/* why dp_build stopped */
enum {
  DP_STOP_END = 0,     /* reached `end` */
  DP_STOP_FULL = 1,    /* max_rows or max_bytes reached */
  DP_STOP_NEED = 2,    /* stop_object's window does not cover stop_position */
  DP_STOP_MISSING = 3  /* stop_position is unwritten (as of its window) */
};

/* the most calls dp_read_many puts in one op */
enum { DP_MAX_CALLS_PER_OP = 1024 };
/* an op posted by dp_post (an append's outcome), not a class call */
enum { DP_OP_POSTED = 100 };

typedef struct {
  uint64_t tag;            /* the caller's, from the submit call */
  int32_t op;              /* ZLOG_OP_*, or DP_OP_POSTED */
  int32_t code;            /* 0, or -errno: the op's if it failed, else this call's */
  const char *data;        /* READ: the entry; META_GET: the metadata bytes; raw
                              reply for other ops; valid until the next dp_wait */
  size_t len;
  struct dp_window *window; /* READ_RANGE, code 0: the parsed reply, now owned by
                               the caller (dp_window_free) */
  zlog_stat stat;          /* STAT, code 0 */
  uint8_t has_max;         /* MAX_POSITION, code 0 */
  uint64_t max_position;
  uint64_t position;       /* DP_OP_POSTED: what the poster said */
  int32_t protocol;        /* the protocol the call went out with */
  char *owned;             /* dp_call: the reply buffer data points into (dp_result_release) */
} dp_result;

/* One read_range reply. Positions of the object in [first, next) that are not
 * listed and not below trim_below are unwritten. */
typedef struct dp_window {
  uint64_t first;          /* the request's first position */
  uint64_t next;           /* the reply's resume point */
  uint64_t trim_below;
  uint64_t max_position;   /* meaningful when has_max */
  uint32_t count;          /* entries in the reply */
  uint32_t head;           /* entries dp_build has consumed */
  int32_t has_max;
  uint64_t data_bytes;     /* sum of the entries' data lengths */
  void *priv;
} dp_window;

/* Columns for Arrow: positions and epochs (u64), kinds (u8, DP_KIND_*), data
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
  int32_t stop;            /* DP_STOP_* (dp_build) */
  uint64_t stop_position;  /* the first position not in the batch (dp_build) */
  uint32_t stop_object;    /* DP_STOP_NEED: index of the object to fetch */
} dp_batch;

/* A batch's rows as pointers into its windows' replies (dp_build_rows), for
 * stream(): records are made from them with no copy in between
 * (pyzlog._records). It holds the windows it points into until
 * dp_rows_free. data[i] is NULL for a row that is not DATA. */
typedef struct {
  uint32_t rows;
  uint64_t *positions;
  uint64_t *epochs;
  uint8_t *kinds;
  const char **data;
  uint32_t *lens;
  uint64_t *bytes_before;  /* rows + 1: the data bytes of the rows before each */
  uint32_t *data_before;   /* rows + 1: how many rows before each are DATA */
  int32_t stop;            /* as dp_batch's */
  uint64_t stop_position;
  uint32_t stop_object;
  uint32_t nwindows;
  struct dp_window **windows;
} dp_rows;

/* ------------------------------------------------------------- connection */
/* Connects as `client` (e.g. "client.admin") with conf_file ("" for none) and
 * then n (key, value) settings. 0, or -errno with a message in err. */
int dp_cluster_open(const char *client, const char *conf_file, const char *const *keys,
                    const char *const *values, size_t n, dp_cluster **out, char *err, size_t errlen);
/* Refuses new calls, waits up to timeout_s for those in flight, then closes
 * the pools and shuts librados down. Returns how many calls were still in
 * flight (their memory is kept, so a late callback stays harmless). Once. */
uint64_t dp_cluster_close(dp_cluster *c, double timeout_s);
/* An I/O context on pool (and namespace ns, "" for none); it lives as long as
 * the cluster. 0 or -errno (-ENOENT: no such pool). */
int dp_pool_open(dp_cluster *c, const char *pool, const char *ns, dp_pool **out);
/* The protocol new calls on p go out with (ZLOG_PROTO_*). */
int dp_pool_protocol(dp_pool *p);
/* Pin p's protocol (0: back to choosing it as described above). */
void dp_pool_set_protocol(dp_pool *p, int protocol);
/* The rados_ioctx_t of p, for the C++ append pipeline. */
void *dp_pool_ioctx(dp_pool *p);
/* Calls in flight on the whole connection. */
uint64_t dp_cluster_in_flight(dp_cluster *c);

/* ------------------------------------------------------------------ queue */
dp_queue *dp_queue_new(dp_cluster *c);
/* The caller is done with q: undelivered results are dropped, and calls still
 * in flight free themselves (and q, with the last) when they complete. */
void dp_queue_release(dp_queue *q);
/* Up to max results, waiting up to timeout_s (< 0: no limit) for the first;
 * 0 at once when nothing is in flight or posted. The previous wait's data
 * pointers become invalid. */
size_t dp_wait(dp_queue *q, dp_result *out, size_t max, double timeout_s);
/* dp_wait for a completion thread: results of calls go to out (*ncalls of
 * them), posted ones to the three arrays (*nposted), so that Python takes
 * many appends' outcomes as three lists. Returns *ncalls + *nposted. */
size_t dp_wait_split(dp_queue *q, dp_result *out, size_t max, double timeout_s, uint64_t *tags, int32_t *codes,
                     uint64_t *positions, size_t *ncalls, size_t *nposted);
/* Waits up to timeout_s until no call of q is in flight; 1 if none is.
 * Results stay queued for dp_wait. */
int dp_queue_drain(dp_queue *q, double timeout_s);
/* Calls sent (and posts expected) whose result dp_wait has not handed out. */
uint64_t dp_queue_pending(dp_queue *q);
/* Wakes a thread waiting in dp_wait on q (it returns 0 results). */
void dp_queue_wake(dp_queue *q);
/* With hold set, dp_wait waits (up to its timeout, or a wake) even when
 * nothing is in flight: a completion thread sleeps there between calls. */
void dp_queue_hold(dp_queue *q, int hold);
/* A file descriptor (an eventfd, made on the first call and closed with q)
 * that is readable while results wait on q, for an event loop to watch
 * (asyncio's add_reader) instead of a thread blocked in dp_wait. dp_wait
 * clears it when it hands out the last result ready. -errno on failure. */
int dp_queue_notify_fd(dp_queue *q);

/* --------------------------------------------------------------- submits
 * Each returns 0, or -errno when nothing was sent (no result follows then);
 * -ENOTCONN once the cluster is closing (-ESHUTDOWN is only ever the OSDs'
 * EBLOCKLISTED: this client was blocklisted). */
/* Any cls_zlog op, its fields in req (ops.h). */
int dp_submit(dp_queue *q, dp_pool *p, const char *oid, int op, const zlog_req *req, uint64_t tag);
/* For the C++ append pipeline: like dp_submit, but completing with cb(arg,
 * code) on a librados thread (which must not block or call into Python)
 * instead of a queue. */
int dp_submit_cb(dp_cluster *c, dp_pool *p, const char *oid, int op, const zlog_req *req,
                 void (*cb)(void *arg, int code), void *arg);
/* One call, waited for in the calling thread with librados' blocking op
 * (no completion thread, no queue: the cheapest round trip for a single
 * call). The result as dp_wait gives it; dp_result_release frees what it
 * holds. The same protocol fallback as dp_submit. Returns out->code. */
int dp_call(dp_cluster *c, dp_pool *p, const char *oid, int op, const zlog_req *req, dp_result *out);
void dp_result_release(dp_result *r);
/* dp_call for the ops that take no more than an epoch, a position, data, a
 * fill reason and the object's format (read, write, fill, trim, trim_to,
 * seal, close, max_position, stat): the fields as arguments, for the sync
 * calls a log makes most. */
int dp_call_pos(dp_cluster *c, dp_pool *p, const char *oid, int op, uint64_t epoch, uint64_t position,
                const char *data, uint32_t len, uint8_t reason, uint8_t format, dp_result *out);
/* One op, n "read" calls on one object of `format` (each may fail alone): n results. */
int dp_read_many(dp_queue *q, dp_pool *p, const char *oid, uint64_t epoch, uint8_t format,
                 const uint64_t *positions, const uint64_t *tags, size_t n);
/* One read_set call of n (1..ZLOG_MAX_BATCH_ENTRIES) positions of one object
 * of `format`: dp_submit's, from a plain array (what read_positions sends
 * thousands of, per round of a stream's walk). */
int dp_read_set(dp_queue *q, dp_pool *p, const char *oid, uint64_t epoch, uint8_t format,
                const uint64_t *positions, size_t n, uint64_t tag);
/* Any method of any class, with raw bytes in and out (tests, probes):
 * `write` picks a write op (no output) over a read op. */
int dp_exec(dp_queue *q, dp_pool *p, const char *oid, const char *cls, const char *method, const char *in,
            size_t in_len, int write, uint64_t tag);
/* Expect one more posted result on q (dp_wait waits for it). */
void dp_expect(dp_queue *q, uint64_t n);
/* Queue a result that no call produced: an append's outcome. Pairs with a
 * dp_expect made before. */
void dp_post(dp_queue *q, uint64_t tag, int32_t code, uint64_t position);
/* Queue many at once (one lock, one wakeup). */
void dp_post_many(dp_queue *q, const uint64_t *tags, const int32_t *codes, const uint64_t *positions,
                  size_t n);

/* ------------------------------------------------------- wire (ops.h) */
/* Encodes op's request in protocol proto into a malloc'd buffer (dp_free).
 * 0 or -errno. */
int dp_encode(int op, int proto, const zlog_req *req, char **out, size_t *len);
/* Decodes a request (pointers into `in`; write_many's entries are left). */
int dp_decode(int op, int proto, const char *in, size_t len, zlog_req *out);
int dp_decode_stat(const char *in, size_t len, int proto, zlog_stat *out);
int dp_decode_max(const char *in, size_t len, int proto, uint8_t *has_max, uint64_t *max);
int dp_decode_version(const char *in, size_t len, zlog_version *out);
/* The metadata bytes as meta_get returns them (protocol 1 or 2) or as
 * stored: views are calloc'd (dp_free(out->views)). */
int dp_decode_meta(const char *in, size_t len, zlog_meta *out);
/* Encodes stored metadata bytes (tests). */
int dp_encode_meta(const zlog_meta *m, char **out, size_t *len);
/* A stat / max reply in protocol proto (tests). */
int dp_encode_stat(int proto, const zlog_stat *s, char **out, size_t *len);
/* The class method name of op in protocol proto, or NULL; and whether it writes. */
const char *dp_method(int op, int proto);
int dp_op_writes(int op);
/* read's (and meta_get's) reply: where the bytes are inside `in`. */
int dp_decode_read(const char *in, size_t len, int proto, const char **data, uint32_t *n);
void dp_free(void *p);

/* ---------------------------------------------------------------- windows */
/* Parses a read_range reply of protocol proto (copied); NULL if malformed. */
dp_window *dp_window_parse(const char *reply, size_t len, uint64_t first, int proto);
/* A window with no entries over [first, next), positions below trim_below
 * trimmed: what a read_range of an object that does not exist stands for
 * (trim_below: the log's trim point). */
dp_window *dp_window_empty(uint64_t first, uint64_t next, uint64_t trim_below);
void dp_window_free(dp_window *w);
/* Entry i of w (0 <= i < count): 0, or -1 when out of range. */
int dp_window_entry(const dp_window *w, uint32_t i, uint64_t *position, uint8_t *state, uint64_t *epoch,
                    const char **data, uint32_t *len);

/* ---------------------------------------------------------------- batches */
/* Every entry of w from head on, in order, as rows (w is not consumed). */
dp_batch *dp_window_batch(const dp_window *w);
/* Rows for positions start, start + step, ... (< end) of one stripe of a
 * view striped over `width` objects in runs of `unit` (ops.h, "layout"; the
 * stripe starts at `stripe_start`): position p is object zlog_index_of(p),
 * whose current window is windows[that index] (NULL: none yet). A listed entry becomes a row of its
 * kind, a position below the window's trim_below a TRIMMED row (epoch 0).
 * Stops at the first position that is unwritten (DP_STOP_MISSING), outside
 * its object's window (DP_STOP_NEED), at end, or when max_rows rows or
 * max_bytes bytes of data are in the batch (at least one row is). Consumes
 * the windows' entries it passes. NULL only when out of memory. */
dp_batch *dp_build(dp_window *const *windows, uint32_t width, uint32_t unit, uint64_t stripe_start, uint64_t start,
                   uint64_t end, uint64_t step, uint32_t max_rows, uint64_t max_bytes);
void dp_batch_free(dp_batch *b);
/* dp_build's rows as a dp_rows: the same walk, the same stop, the windows
 * consumed alike, but no data copied. NULL only when out of memory. */
dp_rows *dp_build_rows(dp_window *const *windows, uint32_t width, uint32_t unit, uint64_t stripe_start,
                       uint64_t start, uint64_t end, uint64_t step, uint32_t max_rows, uint64_t max_bytes);
void dp_rows_free(dp_rows *r);

/* ------------------------------------------------------------------ stats */
/* Live objects of this process, for tests that check nothing leaks:
 * 0 ops, 1 librados completions, 2 queues, 3 windows, 4 batches, 5 clusters. */
int64_t dp_live(int what);

#ifdef __cplusplus
}
#endif
#endif /* ZLOG_DATAPLANE_H */
