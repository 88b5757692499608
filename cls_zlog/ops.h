/* cls_zlog's requests and replies: the one definition, shared by the object
 * class (cls_zlog.cc, C++) and the client's native data plane
 * (native/dataplane.c, C). Python never encodes a request itself: it calls
 * the data plane, which encodes with these functions.
 *
 * Two protocols:
 *
 *  - protocol 2, the current one: methods named "<op>2" ("write2", "stat2",
 *    ...). Every request and reply is wrapped in an envelope, as Ceph's
 *    ENCODE_START: u8 struct_v, u8 compat_v, u32 length, then `length` bytes
 *    of fields. A decoder refuses (-EPROTONOSUPPORT) a compat_v above the
 *    version it knows, reads the fields it knows, and skips what a newer
 *    encoder appended. So a field added later goes at the end of its op,
 *    with struct_v raised and compat_v left alone, and both sides keep
 *    working with the other's older build.
 *  - protocol 1, the class build of round 2: methods named "<op>", fixed
 *    layouts without an envelope, exact length. The class keeps serving it
 *    (clients of that build), and a new client speaks it to an OSD whose
 *    class does not have protocol 2 (it answers EOPNOTSUPP for "version2").
 *
 * All integers are little-endian. Layouts are in docs/cls_zlog.md.
 */
#ifndef ZLOG_OPS_H
#define ZLOG_OPS_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ limits */
#define ZLOG_MAX_POSITION (UINT64_MAX - 1) /* so that max + 1 never overflows */
#define ZLOG_MAX_EPOCH (UINT64_MAX - 1)
#define ZLOG_MAX_BATCH_ENTRIES 1024u
#define ZLOG_MAX_RANGE_ENTRIES 4096u
#define ZLOG_MAX_RANGE_BYTES (16u << 20)
#define ZLOG_MAX_WIDTH 1024u
#define ZLOG_MAX_CONFIG_BYTES (64u << 10)
#define ZLOG_MAX_SEQR_BYTES 255u

/* ------------------------------------------------------------- protocols */
#define ZLOG_PROTO_LEGACY 1 /* round 2's fixed layouts, method "<op>" */
#define ZLOG_PROTO_CURRENT 2 /* enveloped, method "<op>2" */

/* The version of the fields this build encodes (struct_v) and the oldest
 * decoder that can read them (compat_v), for every op of protocol 2. Raise
 * ZLOG_STRUCT_V when an op gains a trailing field (zlog_req_fields_v2, _v3).
 * Version 2 added the object format and its geometry, version 3 the
 * geometry's unit. A request whose unit is above 1 is sent with compat_v 3:
 * an older class, which would take it for unit 1 and put positions in the
 * wrong objects, refuses it (-EPROTONOSUPPORT) instead. */
#define ZLOG_STRUCT_V 3
#define ZLOG_COMPAT_V 1
#define ZLOG_COMPAT_V_UNIT 3
#define ZLOG_ENVELOPE_BYTES 6

/* ----------------------------------------------------------------- errors
 * What the class answers, as negative errno values (a write method cannot
 * return a payload). pyzlog.core.errors maps each to one exception. */
#define ZLOG_ERR_STALE ESTALE          /* request epoch below the sealed one */
#define ZLOG_ERR_WRITTEN EROFS         /* the position holds data */
#define ZLOG_ERR_FILLED ENOMSG         /* the position was filled */
#define ZLOG_ERR_TRIMMED EIDRM         /* the position was trimmed */
#define ZLOG_ERR_UNWRITTEN ENODATA     /* nothing stored at the position */
#define ZLOG_ERR_TOO_BIG EFBIG         /* entry over the size limit */
#define ZLOG_ERR_CAS_LOST ECANCELED    /* the metadata changed under a proposer */
#define ZLOG_ERR_CORRUPT EIO           /* an object's header is lost or damaged */
#define ZLOG_ERR_VERSION EPROTONOSUPPORT /* a request too new for this class */


/* ----------------------------------------------------------------- states */
enum { ZLOG_WRITTEN = 1, ZLOG_FILLED = 2, ZLOG_TRIMMED = 3 };
enum { ZLOG_FILL_JUNK = 0, ZLOG_FILL_LOST = 1 };

/* ---------------------------------------------------------------- formats
 * How a data object keeps its entries (a view's choice, docs/storage.md):
 *  - ZLOG_FORMAT_OMAP: one omap entry per position, the header in the omap
 *    header; one object per stripe index for the whole view (round 2's).
 *  - ZLOG_FORMAT_DATA: the entries in the object's data with a fixed index
 *    of slots; each object holds at most `slots` positions and `byte_bound`
 *    bytes of entries, so a view is a sequence of stripes of `width`
 *    objects; created by init, never by a write. */
enum { ZLOG_FORMAT_OMAP = 1, ZLOG_FORMAT_DATA = 3 };
#define ZLOG_ANY_STRIPES 0xFFFFFFFFu /* a metadata CAS that does not check the stripe count */

/* ----------------------------------------------------------------- layout
 * Where a data-format view keeps position p: in stripe (p - start) /
 * (width * slots), starting at position `ss`. The stripe is cut into runs
 * of `unit` consecutive positions, dealt to its `width` objects in turn, so
 * that a batch of consecutive positions is one write to one object (as
 * Ceph's RBD stripes by stripe_unit). Unit 1 is round 2's striping, which
 * names objects by absolute position: object p % width. An object holds
 * `slots` positions (a multiple of unit): slot k is the (k % unit)-th
 * position of its (k / unit)-th run. The class knows only the base-relative
 * half (an object's base, width, unit); the client both. */
#define ZLOG_MAX_UNIT 65536u

/* The object (index in its stripe) holding position p of a stripe starting at ss. */
static inline uint32_t zlog_index_of(uint64_t p, uint64_t ss, uint32_t width, uint32_t unit) {
  return unit <= 1 ? (uint32_t)(p % width) : (uint32_t)(((p - ss) / unit) % width);
}
/* The first position of object `index` of a stripe starting at ss. */
static inline uint64_t zlog_base_of(uint64_t ss, uint32_t index, uint32_t width, uint32_t unit) {
  return unit <= 1 ? ss + (index + width - ss % width) % width : ss + (uint64_t)index * unit;
}
/* The slot of the position `off` past its object's base (the object holds it:
 * (off / unit) % width == 0), and back. */
static inline uint64_t zlog_slot_of(uint64_t off, uint32_t width, uint32_t unit) {
  return unit <= 1 ? off / width : off / ((uint64_t)unit * width) * unit + off % unit;
}
static inline uint64_t zlog_offset_of(uint64_t slot, uint32_t width, uint32_t unit) {
  return unit <= 1 ? slot * width : slot / unit * unit * (uint64_t)width + slot % unit;
}
/* Whether the position `off` past an object's base is one of the object's. */
static inline int zlog_object_holds(uint64_t off, uint32_t width, uint32_t unit) {
  return unit <= 1 ? off % width == 0 : (off / unit) % width == 0;
}
/* The first position at or past `off` (past the base) that the object
 * holds, as an offset past its base. */
static inline uint64_t zlog_next_held(uint64_t off, uint32_t width, uint32_t unit) {
  if (unit <= 1) return off + (width - off % width) % width;
  const uint64_t run = off / unit;
  return run % width == 0 ? off : (run / width + 1) * (uint64_t)width * unit;
}
/* The last position at or before `off` that the object holds (its base, 0, at least). */
static inline uint64_t zlog_prev_held(uint64_t off, uint32_t width, uint32_t unit) {
  if (unit <= 1) return off - off % width;
  const uint64_t run = off / unit;
  return run % width == 0 ? off : run / width * (uint64_t)width * unit + unit - 1;
}
/* Whether a data-format geometry is one the class keeps. */
static inline int zlog_geometry_ok(uint32_t width, uint32_t slots, uint32_t unit) {
  return width >= 1 && width <= ZLOG_MAX_WIDTH && slots >= 1 && unit >= 1 && unit <= ZLOG_MAX_UNIT &&
         slots % unit == 0;
}

/* ---------------------------------------------------------------- the ops */
typedef enum {
  ZLOG_OP_WRITE = 0,
  ZLOG_OP_WRITE_MANY,
  ZLOG_OP_READ,
  ZLOG_OP_READ_RANGE,
  ZLOG_OP_FILL,
  ZLOG_OP_TRIM,
  ZLOG_OP_TRIM_TO,
  ZLOG_OP_SEAL,
  ZLOG_OP_CLOSE,
  ZLOG_OP_MAX_POSITION,
  ZLOG_OP_STAT,
  ZLOG_OP_META_CREATE,
  ZLOG_OP_META_GET,
  ZLOG_OP_META_NEW_EPOCH,
  ZLOG_OP_META_PROPOSE_VIEW,
  ZLOG_OP_VERSION, /* protocol 2 only: what this class build speaks */
  ZLOG_OP_INIT,             /* protocol 2 only: create a data-format object */
  ZLOG_OP_META_OPEN_STRIPE, /* protocol 2 only: the newest view's objects go one stripe further */
  ZLOG_OP_META_TRIM,        /* protocol 2 only: raise the log's trim point */
  ZLOG_OP_REPAIR,           /* protocol 2 only: rebuild a lost header from the entries (an operator's) */
  ZLOG_OP_READ_SET,         /* protocol 2 only: any positions of one object (streams) */
  ZLOG_OP_COUNT
} zlog_op;

/* Method names by protocol, and whether the method writes (a write method
 * returns no data to the client). */
static const char *const zlog_op_name[ZLOG_OP_COUNT][2] = {
    {"write", "write2"},         {"write_many", "write_many2"},
    {"read", "read2"},           {"read_range", "read_range2"},
    {"fill", "fill2"},           {"trim", "trim2"},
    {"trim_to", "trim_to2"},     {"seal", "seal2"},
    {"close", "close2"},         {"max_position", "max_position2"},
    {"stat", "stat2"},           {"meta_create", "meta_create2"},
    {"meta_get", "meta_get2"},   {"meta_new_epoch", "meta_new_epoch2"},
    {"meta_propose_view", "meta_propose_view2"}, {NULL, "version2"},
    {NULL, "init2"},             {NULL, "meta_open_stripe2"},
    {NULL, "meta_trim2"},        {NULL, "repair2"},
    {NULL, "read_set2"},
};
static const uint8_t zlog_op_writes[ZLOG_OP_COUNT] = {1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 0};

static inline const char *zlog_method(zlog_op op, int proto) {
  return (unsigned)op < ZLOG_OP_COUNT && (proto == 1 || proto == 2) ? zlog_op_name[op][proto - 1] : NULL;
}

/* Every request's fields, one struct for all ops: each op uses the fields its
 * row of zlog_req_fields names, in that order. */
typedef struct {
  uint64_t epoch;    /* the client's epoch (write .. max_position) */
  uint64_t position; /* write, read, fill, trim, trim_to; close: the view's end */
  uint64_t last;     /* read_range: last position (inclusive) */
  uint32_t max_entries, max_bytes; /* read_range */
  uint8_t reason;    /* fill: ZLOG_FILL_* */
  const char *data;  /* write: the entry; meta_create: the config */
  uint32_t len;
  uint64_t expected, next_epoch, start; /* meta_new_epoch, meta_propose_view */
  uint32_t width;    /* meta_create, meta_propose_view */
  const char *seqr;  /* meta_new_epoch/propose_view: optional; NULL = none */
  uint32_t seqr_len;
  /* write_many: n entries, their positions, and their data, back to back as
   * (pointer, length) pairs in entries[] */
  uint32_t count;
  const uint64_t *positions;
  const char *const *datas;
  const uint32_t *lens;
  /* struct_v 2: the object format (data ops; 0 means ZLOG_FORMAT_OMAP), the
   * geometry of a data-format view or object (meta_create, propose_view,
   * init: `position` is then the object's first position), the stripe to
   * open, and the stripe count a metadata CAS expects (ZLOG_ANY_STRIPES) */
  uint8_t format;
  uint32_t slots;
  uint64_t byte_bound;
  uint32_t stripe;
  uint32_t expected_stripes;
  /* struct_v 3: the data format's unit (meta_create, propose_view, init,
   * repair); 0 or 1 means 1 */
  uint32_t unit;
} zlog_req;

enum { ZF_END = 0, ZF_EPOCH, ZF_POSITION, ZF_LAST, ZF_MAX_ENTRIES, ZF_MAX_BYTES, ZF_REASON, ZF_DATA,
       ZF_EXPECTED, ZF_NEXT_EPOCH, ZF_START, ZF_WIDTH, ZF_SEQR_OPT, ZF_ENTRIES, ZF_FORMAT, ZF_SLOTS,
       ZF_BYTE_BOUND, ZF_STRIPE, ZF_EXPECTED_STRIPES, ZF_UNIT };

/* The request layout of every op (both protocols: protocol 2 wraps the same
 * fields in an envelope). ZF_SEQR_OPT is an optional trailing u32 length +
 * bytes; ZF_ENTRIES is write_many's u32 n, n x (u64 position, u32 len, data). */
static const uint8_t zlog_req_fields[ZLOG_OP_COUNT][6] = {
    /* write */ {ZF_EPOCH, ZF_POSITION, ZF_DATA},
    /* write_many */ {ZF_EPOCH, ZF_ENTRIES},
    /* read */ {ZF_EPOCH, ZF_POSITION},
    /* read_range */ {ZF_EPOCH, ZF_POSITION, ZF_LAST, ZF_MAX_ENTRIES, ZF_MAX_BYTES},
    /* fill */ {ZF_EPOCH, ZF_POSITION, ZF_REASON},
    /* trim */ {ZF_EPOCH, ZF_POSITION},
    /* trim_to */ {ZF_EPOCH, ZF_POSITION},
    /* seal */ {ZF_EPOCH},
    /* close */ {ZF_EPOCH, ZF_POSITION},
    /* max_position */ {ZF_EPOCH},
    /* stat */ {ZF_END},
    /* meta_create */ {ZF_WIDTH, ZF_DATA},
    /* meta_get */ {ZF_END},
    /* meta_new_epoch */ {ZF_EXPECTED, ZF_NEXT_EPOCH, ZF_SEQR_OPT},
    /* meta_propose_view */ {ZF_EXPECTED, ZF_NEXT_EPOCH, ZF_START, ZF_WIDTH, ZF_SEQR_OPT},
    /* version */ {ZF_END},
    /* init */ {ZF_EPOCH, ZF_POSITION, ZF_WIDTH, ZF_SLOTS, ZF_BYTE_BOUND},
    /* meta_open_stripe */ {ZF_EXPECTED, ZF_STRIPE},
    /* meta_trim */ {ZF_POSITION},
    /* repair: the sealed epoch, the view's end (valid with reason's bit
     * ZLOG_REPAIR_HAS_END), the trim point, the data format's first
     * position (in `last`) and width */
    /* repair */ {ZF_EPOCH, ZF_POSITION, ZF_REASON, ZF_START, ZF_LAST, ZF_WIDTH},
    /* read_set: write_many's entries, each with no data (only the positions count) */
    /* read_set */ {ZF_EPOCH, ZF_ENTRIES},
};

/* The fields struct_v 2 appended to each op (protocol 2 only); a request of
 * struct_v 1 has none of them, and its decoder takes the defaults. */
static const uint8_t zlog_req_fields_v2[ZLOG_OP_COUNT][5] = {
    /* write .. stat */ {ZF_FORMAT}, {ZF_FORMAT}, {ZF_FORMAT}, {ZF_FORMAT}, {ZF_FORMAT}, {ZF_FORMAT},
    {ZF_FORMAT}, {ZF_FORMAT}, {ZF_FORMAT}, {ZF_FORMAT}, {ZF_FORMAT},
    /* meta_create */ {ZF_FORMAT, ZF_SLOTS, ZF_BYTE_BOUND},
    /* meta_get */ {ZF_END},
    /* meta_new_epoch */ {ZF_EXPECTED_STRIPES},
    /* meta_propose_view */ {ZF_FORMAT, ZF_SLOTS, ZF_BYTE_BOUND, ZF_EXPECTED_STRIPES},
    /* version, init, meta_open_stripe, meta_trim */ {ZF_END}, {ZF_END}, {ZF_END}, {ZF_END},
    /* repair: the object's format and (data format) its geometry */ {ZF_FORMAT, ZF_SLOTS, ZF_BYTE_BOUND},
    /* read_set */ {ZF_FORMAT},
};
/* The fields struct_v 3 appended: the data format's unit. */
static const uint8_t zlog_req_fields_v3[ZLOG_OP_COUNT][2] = {
    /* write .. stat */ {ZF_END}, {ZF_END}, {ZF_END}, {ZF_END}, {ZF_END}, {ZF_END}, {ZF_END}, {ZF_END}, {ZF_END},
    {ZF_END}, {ZF_END},
    /* meta_create */ {ZF_UNIT},
    /* meta_get, meta_new_epoch */ {ZF_END}, {ZF_END},
    /* meta_propose_view */ {ZF_UNIT},
    /* version */ {ZF_END},
    /* init */ {ZF_UNIT},
    /* meta_open_stripe, meta_trim */ {ZF_END}, {ZF_END},
    /* repair */ {ZF_UNIT},
    /* read_set */ {ZF_END},
};
#define ZLOG_REPAIR_HAS_END 1 /* repair's reason: the object's view has ended at `position` */

/* ------------------------------------------------------------- encoding */
typedef struct {
  char *p;
  size_t len, cap;
  int oom; /* an allocation failed: the buffer is unusable */
} zw_writer;

static inline int zw_reserve(zw_writer *w, size_t n) {
  if (w->oom) return 0;
  if (w->len + n <= w->cap) return 1;
  size_t cap = w->cap ? w->cap : 64;
  while (cap < w->len + n) cap *= 2;
  char *p = (char *)realloc(w->p, cap);
  if (!p) {
    w->oom = 1;
    return 0;
  }
  w->p = p;
  w->cap = cap;
  return 1;
}
static inline void zw_bytes(zw_writer *w, const void *p, size_t n) {
  if (n && zw_reserve(w, n)) {
    memcpy(w->p + w->len, p, n);
    w->len += n;
  }
}
static inline void zw_u8(zw_writer *w, uint8_t v) { zw_bytes(w, &v, 1); }
static inline void zw_u32(zw_writer *w, uint32_t v) {
  unsigned char b[4];
  for (int i = 0; i < 4; ++i) b[i] = (unsigned char)(v >> (8 * i));
  zw_bytes(w, b, 4);
}
static inline void zw_u64(zw_writer *w, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = (unsigned char)(v >> (8 * i));
  zw_bytes(w, b, 8);
}
static inline void zw_blob(zw_writer *w, const char *p, uint32_t n) {
  zw_u32(w, n);
  zw_bytes(w, p, n);
}
static inline void zw_free(zw_writer *w) {
  free(w->p);
  w->p = NULL;
  w->len = w->cap = 0;
}

/* Starts an envelope (protocol 2) that decoders of `compat` and later
 * read; returns where its length goes. */
static inline size_t zw_begin_compat(zw_writer *w, int proto, uint8_t compat) {
  if (proto != ZLOG_PROTO_CURRENT) return (size_t)-1;
  zw_u8(w, ZLOG_STRUCT_V);
  zw_u8(w, compat);
  const size_t at = w->len;
  zw_u32(w, 0);
  return at;
}
static inline size_t zw_begin(zw_writer *w, int proto) { return zw_begin_compat(w, proto, ZLOG_COMPAT_V); }
static inline void zw_finish(zw_writer *w, size_t at) {
  if (at == (size_t)-1 || w->oom) return;
  const uint32_t n = (uint32_t)(w->len - at - 4);
  for (int i = 0; i < 4; ++i) w->p[at + i] = (char)(n >> (8 * i));
}

/* ------------------------------------------------------------- decoding */
typedef struct {
  const char *p;
  size_t len, off;
  int ok;
} zw_reader;

static inline zw_reader zw_reader_of(const char *p, size_t len) {
  zw_reader r = {p, len, 0, 1};
  return r;
}
static inline const char *zw_take(zw_reader *r, size_t n) {
  if (!r->ok || r->len - r->off < n) {
    r->ok = 0;
    return NULL;
  }
  const char *at = r->p + r->off;
  r->off += n;
  return at;
}
static inline uint8_t zr_u8(zw_reader *r) {
  const char *p = zw_take(r, 1);
  return p ? (uint8_t)p[0] : 0;
}
static inline uint32_t zr_u32(zw_reader *r) {
  const unsigned char *p = (const unsigned char *)zw_take(r, 4);
  uint32_t v = 0;
  if (p)
    for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
static inline uint64_t zr_u64(zw_reader *r) {
  const unsigned char *p = (const unsigned char *)zw_take(r, 8);
  uint64_t v = 0;
  if (p)
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
static inline const char *zr_blob(zw_reader *r, uint32_t *n) {
  *n = zr_u32(r);
  return zw_take(r, *n);
}
static inline int zr_done(const zw_reader *r) { return r->ok && r->off == r->len; }

/* Opens a protocol 2 envelope: `body` reads its fields. 0, -EINVAL if
 * malformed, -EPROTONOSUPPORT if it needs a newer decoder. Protocol 1: body
 * is the whole buffer. */
static inline int zw_open(zw_reader *r, int proto, zw_reader *body, uint8_t *struct_v) {
  if (proto != ZLOG_PROTO_CURRENT) {
    *body = *r;
    if (struct_v) *struct_v = 0;
    return 0;
  }
  const uint8_t v = zr_u8(r), compat = zr_u8(r);
  uint32_t n = 0;
  const char *p = zr_blob(r, &n);
  if (!r->ok || v == 0 || compat == 0 || compat > v) return -EINVAL;
  if (compat > ZLOG_STRUCT_V) return -ZLOG_ERR_VERSION;
  *body = zw_reader_of(p, n);
  if (struct_v) *struct_v = v;
  return 0;
}
/* Closes an envelope: protocol 1 must have read every byte; protocol 2 may
 * leave what a newer encoder appended, but the outer buffer must end there. */
static inline int zw_close(const zw_reader *outer, const zw_reader *body, int proto) {
  if (proto != ZLOG_PROTO_CURRENT) return zr_done(body) ? 0 : -EINVAL;
  return body->ok && zr_done(outer) ? 0 : -EINVAL;
}

/* ------------------------------------------------------------- requests */
static inline int zlog_req_encode(zw_writer *w, zlog_op op, int proto, const zlog_req *q) {
  if ((unsigned)op >= ZLOG_OP_COUNT || !zlog_method(op, proto)) return -EINVAL;
  /* (protocol 1 has no geometry at all: its meta_create makes an omap log) */
  const int units = q->unit > 1 && zlog_req_fields_v3[op][0] == ZF_UNIT;
  const size_t at = zw_begin_compat(w, proto, units ? ZLOG_COMPAT_V_UNIT : ZLOG_COMPAT_V);
  for (const uint8_t *f = zlog_req_fields[op]; *f != ZF_END && f < zlog_req_fields[op] + 6; ++f) {
    switch (*f) {
      case ZF_EPOCH: zw_u64(w, q->epoch); break;
      case ZF_POSITION: zw_u64(w, q->position); break;
      case ZF_LAST: zw_u64(w, q->last); break;
      case ZF_MAX_ENTRIES: zw_u32(w, q->max_entries); break;
      case ZF_MAX_BYTES: zw_u32(w, q->max_bytes); break;
      case ZF_REASON: zw_u8(w, q->reason); break;
      case ZF_DATA: zw_blob(w, q->data, q->len); break;
      case ZF_EXPECTED: zw_u64(w, q->expected); break;
      case ZF_NEXT_EPOCH: zw_u64(w, q->next_epoch); break;
      case ZF_START: zw_u64(w, q->start); break;
      case ZF_WIDTH: zw_u32(w, q->width); break;
      case ZF_SLOTS: zw_u32(w, q->slots); break;
      case ZF_BYTE_BOUND: zw_u64(w, q->byte_bound); break;
      case ZF_STRIPE: zw_u32(w, q->stripe); break;
      case ZF_SEQR_OPT: /* protocol 2 always has it (length 0: none), so that
                           fields appended later cannot be taken for it */
        if (q->seqr || proto == ZLOG_PROTO_CURRENT) zw_blob(w, q->seqr, q->seqr ? q->seqr_len : 0);
        break;
      case ZF_ENTRIES:
        zw_u32(w, q->count);
        for (uint32_t i = 0; i < q->count; ++i) {
          zw_u64(w, q->positions[i]);
          zw_blob(w, q->datas[i], q->lens[i]);
        }
        break;
    }
  }
  if (proto == ZLOG_PROTO_CURRENT) {
    for (const uint8_t *f = zlog_req_fields_v2[op]; *f != ZF_END && f < zlog_req_fields_v2[op] + 5; ++f) {
      switch (*f) {
        case ZF_FORMAT: zw_u8(w, q->format ? q->format : (uint8_t)ZLOG_FORMAT_OMAP); break;
        case ZF_SLOTS: zw_u32(w, q->slots); break;
        case ZF_BYTE_BOUND: zw_u64(w, q->byte_bound); break;
        case ZF_EXPECTED_STRIPES: zw_u32(w, q->expected_stripes); break;
      }
    }
    if (zlog_req_fields_v3[op][0] == ZF_UNIT) zw_u32(w, q->unit ? q->unit : 1);
  }
  zw_finish(w, at);
  return w->oom ? -ENOMEM : 0;
}

/* Decodes a request into *q (pointers point into `in`). write_many's
 * entries are not unpacked: q->count is set and `entries` reads them with
 * zlog_req_next_entry. 0, -EINVAL or -EPROTONOSUPPORT. */
static inline int zlog_req_decode(const char *in, size_t len, zlog_op op, int proto, zlog_req *q,
                                  zw_reader *entries) {
  memset(q, 0, sizeof *q);
  q->format = ZLOG_FORMAT_OMAP;
  q->expected_stripes = ZLOG_ANY_STRIPES;
  q->unit = 1;
  zw_reader outer = zw_reader_of(in, len), r;
  uint8_t struct_v = 0;
  int ret = zw_open(&outer, proto, &r, &struct_v);
  if (ret < 0) return ret;
  for (const uint8_t *f = zlog_req_fields[op]; *f != ZF_END && f < zlog_req_fields[op] + 6; ++f) {
    switch (*f) {
      case ZF_EPOCH: q->epoch = zr_u64(&r); break;
      case ZF_POSITION: q->position = zr_u64(&r); break;
      case ZF_LAST: q->last = zr_u64(&r); break;
      case ZF_MAX_ENTRIES: q->max_entries = zr_u32(&r); break;
      case ZF_MAX_BYTES: q->max_bytes = zr_u32(&r); break;
      case ZF_REASON: q->reason = zr_u8(&r); break;
      case ZF_DATA: q->data = zr_blob(&r, &q->len); break;
      case ZF_EXPECTED: q->expected = zr_u64(&r); break;
      case ZF_NEXT_EPOCH: q->next_epoch = zr_u64(&r); break;
      case ZF_START: q->start = zr_u64(&r); break;
      case ZF_WIDTH: q->width = zr_u32(&r); break;
      case ZF_SLOTS: q->slots = zr_u32(&r); break;
      case ZF_BYTE_BOUND: q->byte_bound = zr_u64(&r); break;
      case ZF_STRIPE: q->stripe = zr_u32(&r); break;
      case ZF_SEQR_OPT:
        /* protocol 1: present when bytes remain; protocol 2: always there,
         * length 0 meaning none */
        if (proto == ZLOG_PROTO_CURRENT || (r.ok && r.off < r.len)) {
          const char *s = zr_blob(&r, &q->seqr_len);
          if (!r.ok || q->seqr_len > ZLOG_MAX_SEQR_BYTES) return -EINVAL;
          if (q->seqr_len == 0 && proto != ZLOG_PROTO_CURRENT) return -EINVAL;
          q->seqr = q->seqr_len ? s : NULL;
        }
        break;
      case ZF_ENTRIES: {
        q->count = zr_u32(&r);
        if (!r.ok || q->count == 0 || q->count > ZLOG_MAX_BATCH_ENTRIES) return -EINVAL;
        /* walk them once to check the layout; the caller walks again */
        zw_reader start = r;
        for (uint32_t i = 0; i < q->count; ++i) {
          zr_u64(&r);
          uint32_t n;
          zr_blob(&r, &n);
        }
        if (!r.ok) return -EINVAL;
        if (entries) *entries = start;
        break;
      }
    }
  }
  if (proto == ZLOG_PROTO_CURRENT && struct_v >= 2) {
    for (const uint8_t *f = zlog_req_fields_v2[op]; *f != ZF_END && f < zlog_req_fields_v2[op] + 5; ++f) {
      switch (*f) {
        case ZF_FORMAT: q->format = zr_u8(&r); break;
        case ZF_SLOTS: q->slots = zr_u32(&r); break;
        case ZF_BYTE_BOUND: q->byte_bound = zr_u64(&r); break;
        case ZF_EXPECTED_STRIPES: q->expected_stripes = zr_u32(&r); break;
      }
    }
    if (q->format != ZLOG_FORMAT_OMAP && q->format != ZLOG_FORMAT_DATA) return -EINVAL;
  }
  if (proto == ZLOG_PROTO_CURRENT && struct_v >= 3 && zlog_req_fields_v3[op][0] == ZF_UNIT) {
    q->unit = zr_u32(&r);
    if (q->unit == 0) return -EINVAL;
  }
  if (!r.ok) return -EINVAL;
  return zw_close(&outer, &r, proto);
}

/* The next write_many entry from the reader zlog_req_decode handed out. */
static inline void zlog_req_next_entry(zw_reader *entries, uint64_t *position, const char **data,
                                       uint32_t *len) {
  *position = zr_u64(entries);
  *data = zr_blob(entries, len);
}

/* ---------------------------------------------------------------- replies
 * read: protocol 1 the entry's bytes alone; 2 an envelope around u32 len,
 *   data.
 * max_position: u8 has_max, u64 max.
 * stat: u64 sealed_epoch, u8 has_max, u64 max, u64 trim_below, u8 has_end,
 *   u64 view_end.
 * meta_get: the metadata object's bytes (zlog_meta layout, its own version).
 * version (2 only): u32 class major, u32 class minor, u8 highest protocol.
 * read_range: see zlog_range below. */
typedef struct {
  uint64_t sealed_epoch;
  uint8_t has_max;
  uint64_t max_position;
  uint64_t trim_below;
  uint8_t has_end;
  uint64_t view_end;
  /* struct_v 2 (protocol 2): what the object holds; entries and bytes are
   * counted by the data format only (0 for omap) */
  uint8_t format;
  uint64_t entries, bytes;
} zlog_stat;

static inline void zlog_stat_encode(zw_writer *w, int proto, const zlog_stat *s) {
  const size_t at = zw_begin(w, proto);
  zw_u64(w, s->sealed_epoch);
  zw_u8(w, s->has_max);
  zw_u64(w, s->max_position);
  zw_u64(w, s->trim_below);
  zw_u8(w, s->has_end);
  zw_u64(w, s->view_end);
  if (proto == ZLOG_PROTO_CURRENT) {
    zw_u8(w, s->format);
    zw_u64(w, s->entries);
    zw_u64(w, s->bytes);
  }
  zw_finish(w, at);
}
static inline int zlog_stat_decode(const char *in, size_t len, int proto, zlog_stat *s) {
  zw_reader outer = zw_reader_of(in, len), r;
  uint8_t struct_v = 0;
  int ret = zw_open(&outer, proto, &r, &struct_v);
  if (ret < 0) return ret;
  s->sealed_epoch = zr_u64(&r);
  s->has_max = zr_u8(&r);
  s->max_position = zr_u64(&r);
  s->trim_below = zr_u64(&r);
  s->has_end = zr_u8(&r);
  s->view_end = zr_u64(&r);
  s->format = ZLOG_FORMAT_OMAP;
  s->entries = s->bytes = 0;
  if (proto == ZLOG_PROTO_CURRENT && struct_v >= 2) {
    s->format = zr_u8(&r);
    s->entries = zr_u64(&r);
    s->bytes = zr_u64(&r);
  }
  return zw_close(&outer, &r, proto);
}

static inline void zlog_max_encode(zw_writer *w, int proto, uint8_t has_max, uint64_t max) {
  const size_t at = zw_begin(w, proto);
  zw_u8(w, has_max);
  zw_u64(w, max);
  zw_finish(w, at);
}
static inline int zlog_max_decode(const char *in, size_t len, int proto, uint8_t *has_max, uint64_t *max) {
  zw_reader outer = zw_reader_of(in, len), r;
  int ret = zw_open(&outer, proto, &r, NULL);
  if (ret < 0) return ret;
  *has_max = zr_u8(&r);
  *max = zr_u64(&r);
  return zw_close(&outer, &r, proto);
}

/* read's reply: where the entry's bytes are inside `in`. */
static inline int zlog_read_reply_decode(const char *in, size_t len, int proto, const char **data,
                                         uint32_t *n) {
  if (proto != ZLOG_PROTO_CURRENT) {
    *data = in;
    *n = (uint32_t)len;
    return len > UINT32_MAX ? -EINVAL : 0;
  }
  zw_reader outer = zw_reader_of(in, len), r;
  int ret = zw_open(&outer, proto, &r, NULL);
  if (ret < 0) return ret;
  *data = zr_blob(&r, n);
  return zw_close(&outer, &r, proto);
}

typedef struct {
  uint32_t major, minor;
  uint8_t protocol; /* the highest protocol the class speaks */
} zlog_version;

static inline void zlog_version_encode(zw_writer *w, const zlog_version *v) {
  const size_t at = zw_begin(w, ZLOG_PROTO_CURRENT);
  zw_u32(w, v->major);
  zw_u32(w, v->minor);
  zw_u8(w, v->protocol);
  zw_finish(w, at);
}
static inline int zlog_version_decode(const char *in, size_t len, zlog_version *v) {
  zw_reader outer = zw_reader_of(in, len), r;
  int ret = zw_open(&outer, ZLOG_PROTO_CURRENT, &r, NULL);
  if (ret < 0) return ret;
  v->major = zr_u32(&r);
  v->minor = zr_u32(&r);
  v->protocol = zr_u8(&r);
  return zw_close(&outer, &r, ZLOG_PROTO_CURRENT);
}

/* read_range's reply. Head: u64 trim_below, u8 has_max, u64 max, u64 next,
 * u32 n. Protocol 1 then has n x (u64 position, u8 state, u64 epoch, u32
 * len, data). Protocol 2 has n fixed records (u64 position, u64 epoch, u32
 * len, u8 state) and then every entry's data back to back in position order,
 * so the data of a range is one block (the class can hand over what it read
 * in one piece, and the client can use it as an Arrow data buffer). Every
 * position of the object in [first, next) that is not listed and not below
 * trim_below is unwritten. */
#define ZLOG_RANGE_HEAD_BYTES 29
#define ZLOG_RANGE_ENTRY1_BYTES 21 /* protocol 1, before the data */
#define ZLOG_RANGE_REC2_BYTES 21   /* protocol 2 */

typedef struct {
  uint64_t trim_below;
  uint8_t has_max;
  uint64_t max_position;
  uint64_t next;
  uint32_t count;
} zlog_range_head;

typedef struct {
  uint64_t position, epoch;
  uint32_t len;
  uint8_t state;
  uint64_t data_offset; /* decode: where its data starts in the reply */
} zlog_range_entry;

static inline void zlog_range_head_encode(zw_writer *w, const zlog_range_head *h) {
  zw_u64(w, h->trim_below);
  zw_u8(w, h->has_max);
  zw_u64(w, h->max_position);
  zw_u64(w, h->next);
  zw_u32(w, h->count);
}
/* protocol 2: one record (the data follows after all records) */
static inline void zlog_range_rec_encode(zw_writer *w, const zlog_range_entry *e) {
  zw_u64(w, e->position);
  zw_u64(w, e->epoch);
  zw_u32(w, e->len);
  zw_u8(w, e->state);
}

/* Parses a read_range reply of either protocol: the head, and the entries
 * into `out` (calloc'd, count of them; the caller frees it). Checks that
 * positions increase, states are known and every length fits. 0, -EINVAL
 * (malformed), -EPROTONOSUPPORT or -ENOMEM. */
static inline int zlog_range_decode(const char *in, size_t len, int proto, zlog_range_head *h,
                                    zlog_range_entry **out) {
  *out = NULL;
  zw_reader outer = zw_reader_of(in, len), r;
  int ret = zw_open(&outer, proto, &r, NULL);
  if (ret < 0) return ret;
  h->trim_below = zr_u64(&r);
  h->has_max = zr_u8(&r);
  h->max_position = zr_u64(&r);
  h->next = zr_u64(&r);
  h->count = zr_u32(&r);
  if (!r.ok) return -EINVAL;
  const size_t rec = proto == ZLOG_PROTO_CURRENT ? ZLOG_RANGE_REC2_BYTES : ZLOG_RANGE_ENTRY1_BYTES;
  if (h->count > (r.len - r.off) / rec) return -EINVAL;
  zlog_range_entry *e = (zlog_range_entry *)calloc(h->count ? h->count : 1, sizeof *e);
  if (!e) return -ENOMEM;
  const size_t body = (size_t)(r.p - in); /* offsets are from the start of `in` */
  if (proto == ZLOG_PROTO_CURRENT) {
    for (uint32_t i = 0; i < h->count; ++i) {
      e[i].position = zr_u64(&r);
      e[i].epoch = zr_u64(&r);
      e[i].len = zr_u32(&r);
      e[i].state = zr_u8(&r);
    }
    for (uint32_t i = 0; i < h->count && r.ok; ++i) {
      e[i].data_offset = body + r.off;
      zw_take(&r, e[i].len);
    }
  } else {
    for (uint32_t i = 0; i < h->count && r.ok; ++i) {
      e[i].position = zr_u64(&r);
      e[i].state = zr_u8(&r);
      e[i].epoch = zr_u64(&r);
      e[i].len = zr_u32(&r);
      e[i].data_offset = body + r.off;
      zw_take(&r, e[i].len);
    }
  }
  for (uint32_t i = 0; i < h->count && r.ok; ++i) {
    if (e[i].state < ZLOG_WRITTEN || e[i].state > ZLOG_TRIMMED) r.ok = 0;
    if (i > 0 && e[i].position <= e[i - 1].position) r.ok = 0; /* readers rely on order */
  }
  ret = r.ok ? zw_close(&outer, &r, proto) : -EINVAL;
  if (ret < 0) {
    free(e);
    return ret;
  }
  *out = e;
  return 0;
}

/* ---------------------------------------------------------------- metadata
 * The metadata object's bytes (its own layout, read back by meta_get):
 * u8 version, u64 epoch, u32 config_len, config, u32 nviews, nviews x (u64
 * epoch, u64 start, u32 width), and from version 2: u64 seqr_epoch, u32
 * seqr_len, seqr. Version 1 is written while no sequencer is recorded. */
#define ZLOG_META_V1 1
#define ZLOG_META_V2 2
#define ZLOG_META_V3 3
#define ZLOG_META_V4 4 /* version 3 and each view's unit (written once a view has a unit above 1) */
#define ZLOG_MAX_VIEWS 100000u

typedef struct {
  uint64_t epoch, start;
  uint32_t width;
  /* version 3: the view's object format and, for the data format, its
   * geometry (positions and entry bytes per object) and how many stripes
   * of it are open (objects may exist); versions 1 and 2 mean omap */
  uint8_t format;
  uint32_t slots;
  uint64_t byte_bound;
  uint32_t stripes;
  uint32_t unit; /* version 4; before it (and 0) 1 */
} zlog_view;

typedef struct {
  uint64_t epoch;
  const char *config;
  uint32_t config_len;
  uint32_t nviews;
  zlog_view *views; /* decode: calloc'd, the caller frees it */
  uint64_t seqr_epoch;
  const char *seqr; /* NULL or empty: none recorded */
  uint32_t seqr_len;
  uint64_t trim_below; /* version 3: every position below it is trimmed */
} zlog_meta;

/* Version 3 once a view has the data format or the log has a trim point;
 * before that the versions round 2's clients read. */
static inline void zlog_meta_encode(zw_writer *w, const zlog_meta *m) {
  int v3 = m->trim_below != 0, v4 = 0;
  for (uint32_t i = 0; i < m->nviews; ++i) {
    if (m->views[i].format && m->views[i].format != ZLOG_FORMAT_OMAP) v3 = 1;
    if (m->views[i].unit > 1) v3 = v4 = 1;
  }
  zw_u8(w, v4 ? ZLOG_META_V4 : v3 ? ZLOG_META_V3 : (m->seqr_len ? ZLOG_META_V2 : ZLOG_META_V1));
  zw_u64(w, m->epoch);
  zw_blob(w, m->config, m->config_len);
  zw_u32(w, m->nviews);
  for (uint32_t i = 0; i < m->nviews; ++i) {
    zw_u64(w, m->views[i].epoch);
    zw_u64(w, m->views[i].start);
    zw_u32(w, m->views[i].width);
    if (v3) {
      zw_u8(w, m->views[i].format ? m->views[i].format : (uint8_t)ZLOG_FORMAT_OMAP);
      zw_u32(w, m->views[i].slots);
      zw_u64(w, m->views[i].byte_bound);
      zw_u32(w, m->views[i].stripes);
      if (v4) zw_u32(w, m->views[i].unit ? m->views[i].unit : 1);
    }
  }
  if (v3 || m->seqr_len) {
    zw_u64(w, m->seqr_epoch);
    zw_blob(w, m->seqr, m->seqr_len);
  }
  if (v3) zw_u64(w, m->trim_below);
}

static inline int zlog_meta_decode(const char *in, size_t len, zlog_meta *m) {
  memset(m, 0, sizeof *m);
  zw_reader r = zw_reader_of(in, len);
  const uint8_t ver = zr_u8(&r);
  m->epoch = zr_u64(&r);
  m->config = zr_blob(&r, &m->config_len);
  m->nviews = zr_u32(&r);
  const int v3 = ver == ZLOG_META_V3 || ver == ZLOG_META_V4;
  const size_t view_bytes = ver == ZLOG_META_V4 ? 41 : v3 ? 37 : 20;
  if (!r.ok || (ver != ZLOG_META_V1 && ver != ZLOG_META_V2 && !v3) || m->nviews == 0 ||
      m->nviews > ZLOG_MAX_VIEWS || m->nviews > (r.len - r.off) / view_bytes)
    return -EIO;
  m->views = (zlog_view *)calloc(m->nviews, sizeof *m->views);
  if (!m->views) return -ENOMEM;
  for (uint32_t i = 0; i < m->nviews; ++i) {
    m->views[i].epoch = zr_u64(&r);
    m->views[i].start = zr_u64(&r);
    m->views[i].width = zr_u32(&r);
    m->views[i].format = ZLOG_FORMAT_OMAP;
    m->views[i].unit = 1;
    if (v3) {
      m->views[i].format = zr_u8(&r);
      m->views[i].slots = zr_u32(&r);
      m->views[i].byte_bound = zr_u64(&r);
      m->views[i].stripes = zr_u32(&r);
    }
    if (ver == ZLOG_META_V4) m->views[i].unit = zr_u32(&r);
    /* a geometry no request could have made is damage, not a layout to follow */
    const zlog_view *v = &m->views[i];
    if (v->format == ZLOG_FORMAT_DATA ? !zlog_geometry_ok(v->width, v->slots, v->unit) : v->unit != 1) {
      free(m->views);
      m->views = NULL;
      return -EIO;
    }
  }
  if (ver >= ZLOG_META_V2) {
    m->seqr_epoch = zr_u64(&r);
    m->seqr = zr_blob(&r, &m->seqr_len);
    if (m->seqr_len == 0) m->seqr = NULL;
  }
  if (v3) m->trim_below = zr_u64(&r);
  if (!zr_done(&r)) {
    free(m->views);
    m->views = NULL;
    return -EIO;
  }
  return 0;
}

#ifdef __cplusplus
}
#endif
#endif /* ZLOG_OPS_H */
