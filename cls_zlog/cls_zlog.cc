// cls_zlog: the storage rules of a CORFU-style shared log, enforced in the OSD.
//
// A data object holds log positions, each unwritten, written, filled or
// trimmed, in one of two formats (store.h: omap entries, or the object's
// data with an index); its header holds the object's sealed epoch, the
// highest position written, filled or trimmed, a trim watermark, and once its
// view is closed, where that view ends. The rules below are written once for
// both formats. Metadata objects hold the log's epoch and view history as the
// object's data. Requests and replies are defined once, in ops.h, shared with the
// client; every method serves protocol 1 ("<op>", round 2's clients) and
// protocol 2 ("<op>2", versioned). docs/cls_zlog.md has the layouts.
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "objclass_api.h"
#include "ops.h"
#include "store.h"

using ceph::bufferlist;

#ifndef ZLOG_MAX_ENTRY_BYTES
#define ZLOG_MAX_ENTRY_BYTES (1024 * 1024)
#endif

extern "C" {
CLS_API const char* __cls_name = "zlog";
CLS_API int __cls_ver_maj = 2;
CLS_API int __cls_ver_min = 2;
CLS_API void __cls_init();
}

namespace {

constexpr uint64_t kMaxEntryBytes = ZLOG_MAX_ENTRY_BYTES;

// A reply built with ops.h's encoders, handed to the OSD.
struct Reply {
  zw_writer w{};
  ~Reply() { zw_free(&w); }
  int to(bufferlist* out) {
    if (w.oom) return -ENOMEM;
    if (w.len) out->append(w.p, static_cast<unsigned>(w.len));
    return 0;
  }
};

// Decodes a method's request; on failure the method returns the code.
int decode(bufferlist* in, zlog_op op, int proto, zlog_req* q, zw_reader* entries = nullptr) {
  return zlog_req_decode(in->c_str(), in->length(), op, proto, q, entries);
}

// ---------------------------------------------------------------- data objects

using zlog_cls::DataStore;
using zlog_cls::Entry;
using zlog_cls::Header;
using zlog_cls::Listed;
using zlog_cls::NewEntry;
using zlog_cls::OmapStore;
using zlog_cls::Store;

// The store of the format a request names (round 2's requests name none: omap).
std::unique_ptr<Store> store_for(cls_method_context_t hctx, uint8_t format) {
  if (format == ZLOG_FORMAT_DATA) return std::make_unique<DataStore>(hctx);
  return std::make_unique<OmapStore>(hctx);
}

// Loads the object for a request at `epoch`: refuses a stale epoch, and a
// data-format object that init has not made yet (writers make it with init
// first, so that no write can make an object nobody will read).
int load_at(Store* st, uint64_t epoch, bool write_path, bool must_exist) {
  int r = st->load(write_path);
  if (r < 0) return r;
  if (must_exist && !st->exists && st->format() == ZLOG_FORMAT_DATA) return -ENOENT;
  return epoch < st->h.sealed_epoch ? -ZLOG_ERR_STALE : 0;
}

void note_position(Header* h, uint64_t pos) {
  if (!h->has_max || pos > h->max_pos) {
    h->has_max = true;
    h->max_pos = pos;
  }
}

// A position at or past a closed view's end belongs to a later view: the
// request's view history is stale, whatever its epoch says.
bool past_end(const Header& h, uint64_t pos) { return h.has_end && pos >= h.view_end; }

int state_error(uint8_t state) {
  switch (state) {
    case ZLOG_WRITTEN: return -ZLOG_ERR_WRITTEN;
    case ZLOG_FILLED: return -ZLOG_ERR_FILLED;
    default: return -ZLOG_ERR_TRIMMED;
  }
}

// Looks up one position: a TRIMMED stand-in below the trim watermark, state
// 0 for unwritten.
int get_entry(Store* st, uint64_t pos, Entry* e, bufferlist* data) {
  if (pos < st->h.trim_below) {
    *e = Entry{};
    e->state = ZLOG_TRIMMED;
    return 0;
  }
  return st->get(pos, e, data);
}

// Whether `pos` is free to store at. Every stored entry is at or below the
// header's max (write, fill and trim all raise it), so an append, which is
// almost always above it, needs no lookup. A full object's unwritten
// positions are filled.
int check_free(Store* st, uint64_t pos) {
  if (pos < st->h.trim_below) return -ZLOG_ERR_TRIMMED;
  if (!st->h.has_max || pos > st->h.max_pos) return st->full() ? -ZLOG_ERR_FILLED : 0;
  Entry e;
  int r = get_entry(st, pos, &e, nullptr);
  if (r < 0) return r;
  return e.state ? state_error(e.state) : 0;
}

// Stores `entries` (positions checked free) and raises max over them.
int store_entries(Store* st, const std::vector<NewEntry>& entries) {
  uint64_t top = 0;
  for (const NewEntry& n : entries) top = std::max(top, n.pos);
  const bool raise = !st->h.has_max || top > st->h.max_pos;
  int r = st->put(entries);
  if (r < 0) return r;
  if (!raise && st->format() == ZLOG_FORMAT_OMAP && st->exists) return 0;  // an omap append's header is unchanged
  note_position(&st->h, top);
  return st->save();
}

// write: epoch, position, data (and the format)
int do_write(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_WRITE, proto, &q);
  if (r < 0) return r;
  if (q.position > ZLOG_MAX_POSITION) return -EINVAL;
  if (q.len > kMaxEntryBytes) return -ZLOG_ERR_TOO_BIG;

  auto st = store_for(hctx, q.format);
  if ((r = load_at(st.get(), q.epoch, true, true)) < 0) return r;
  if (!st->holds(q.position)) return -EINVAL;  // not this object's position: a client's bug
  if (past_end(st->h, q.position)) return -ZLOG_ERR_STALE;
  if ((r = check_free(st.get(), q.position)) < 0) return r;
  return store_entries(st.get(), {NewEntry{q.position, ZLOG_WRITTEN, q.epoch, false, q.data, q.len}});
}

// write_many: epoch, n x (position, data). All or nothing: if any position is
// taken, nothing is written and its error is returned.
int do_write_many(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  zw_reader rd;
  int r = decode(in, ZLOG_OP_WRITE_MANY, proto, &q, &rd);
  if (r < 0) return r;
  std::vector<NewEntry> entries;
  entries.reserve(q.count);
  std::set<uint64_t> seen;
  uint64_t top = 0;
  bool too_big = false;
  for (uint32_t i = 0; i < q.count; i++) {
    NewEntry n{0, ZLOG_WRITTEN, q.epoch, false, nullptr, 0};
    zlog_req_next_entry(&rd, &n.pos, &n.data, &n.len);
    if (n.pos > ZLOG_MAX_POSITION || !seen.insert(n.pos).second) return -EINVAL;  // the same position twice
    if (n.len > kMaxEntryBytes) too_big = true;
    top = std::max(top, n.pos);
    entries.push_back(n);
  }
  if (too_big) return -ZLOG_ERR_TOO_BIG;

  auto st = store_for(hctx, q.format);
  if ((r = load_at(st.get(), q.epoch, true, true)) < 0) return r;
  for (const NewEntry& n : entries)
    if (!st->holds(n.pos)) return -EINVAL;
  if (past_end(st->h, top)) return -ZLOG_ERR_STALE;
  for (uint64_t pos : seen)  // in position order: the error is the lowest refused position's
    if ((r = check_free(st.get(), pos)) < 0) return r;
  return store_entries(st.get(), entries);
}

// read: epoch, position -> the data
int do_read(cls_method_context_t hctx, bufferlist* in, bufferlist* out, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_READ, proto, &q);
  if (r < 0) return r;
  if (q.position > ZLOG_MAX_POSITION) return -EINVAL;

  auto st = store_for(hctx, q.format);
  if ((r = load_at(st.get(), q.epoch, false, false)) < 0) return r;
  if (!st->exists) return -ZLOG_ERR_UNWRITTEN;
  if (!st->holds(q.position)) return -EINVAL;
  Entry e;
  bufferlist data;
  if ((r = get_entry(st.get(), q.position, &e, &data)) < 0) return r;
  if (!e.state) return -ZLOG_ERR_UNWRITTEN;
  if (e.state != ZLOG_WRITTEN) return state_error(e.state);
  if (proto == ZLOG_PROTO_CURRENT) {
    Reply rep;
    zw_u8(&rep.w, ZLOG_STRUCT_V);
    zw_u8(&rep.w, ZLOG_COMPAT_V);
    zw_u32(&rep.w, 4 + data.length());
    zw_u32(&rep.w, data.length());
    if ((r = rep.to(out)) < 0) return r;
  }
  out->claim_append(data);
  return 0;
}

// fill: epoch, position, reason. Unwritten -> filled. reason 0: a client
// filled it; 1: a reader filled a hole whose writer never wrote (lost), kept
// so every later reader reports the same loss. Filling again with the same
// reason succeeds; with the other reason it is refused (ENOMSG), so a reader
// that loses the race reads the kind that won: one kind per position.
int do_fill(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_FILL, proto, &q);
  if (r < 0) return r;
  if (q.position > ZLOG_MAX_POSITION || q.reason > ZLOG_FILL_LOST) return -EINVAL;

  auto st = store_for(hctx, q.format);
  if ((r = load_at(st.get(), q.epoch, false, true)) < 0) return r;
  if (!st->holds(q.position)) return -EINVAL;
  if (past_end(st->h, q.position)) return -ZLOG_ERR_STALE;
  Entry e;
  if ((r = get_entry(st.get(), q.position, &e, nullptr)) < 0) return r;
  if (e.state) {
    if (e.state != ZLOG_FILLED) return state_error(e.state);
    return e.lost == (q.reason == ZLOG_FILL_LOST) ? 0 : -ZLOG_ERR_FILLED;
  }
  return store_entries(st.get(), {NewEntry{q.position, ZLOG_FILLED, q.epoch, q.reason == ZLOG_FILL_LOST, nullptr, 0}});
}

// trim: epoch, position. Any state -> trimmed; the data is dropped.
int do_trim(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_TRIM, proto, &q);
  if (r < 0) return r;
  if (q.position > ZLOG_MAX_POSITION) return -EINVAL;

  auto st = store_for(hctx, q.format);
  if ((r = load_at(st.get(), q.epoch, false, true)) < 0) return r;
  if (!st->holds(q.position)) return -EINVAL;
  if (past_end(st->h, q.position)) return -ZLOG_ERR_STALE;
  if (q.position < st->h.trim_below) return 0;
  // raising max keeps "every stored entry is at or below max" (check_free)
  return store_entries(st.get(), {NewEntry{q.position, ZLOG_TRIMMED, q.epoch, false, nullptr, 0}});
}

// trim_to: epoch, position. Trims every position <= position held here, and
// raises max to it (to the view's end - 1 on a closed object): tail finding
// reads max, so it never hands out a position at or below a trim watermark.
// What is trimmed is dropped (a data-format object wholly below the
// watermark keeps only its header).
int do_trim_to(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_TRIM_TO, proto, &q);
  if (r < 0) return r;
  const uint64_t pos = q.position;
  if (pos > ZLOG_MAX_POSITION) return -EINVAL;  // the watermark is pos + 1

  auto st = store_for(hctx, q.format);
  if ((r = load_at(st.get(), q.epoch, false, true)) < 0) return r;
  Header& h = st->h;
  if (pos + 1 <= h.trim_below) return 0;
  h.trim_below = pos + 1;
  const uint64_t top = h.has_end ? (h.view_end == 0 ? 0 : std::min(pos, h.view_end - 1)) : pos;
  if (!h.has_end || h.view_end > 0) note_position(&h, top);
  if (st->exists && (r = st->drop_trimmed()) < 0) return r;
  return st->save();
}

// seal: epoch. The epoch must be above the one already sealed.
int do_seal(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_SEAL, proto, &q);
  if (r < 0) return r;
  if (q.epoch > ZLOG_MAX_EPOCH) return -EINVAL;

  auto st = store_for(hctx, q.format);
  if ((r = st->load(false)) < 0) return r;
  if (!st->exists && st->format() == ZLOG_FORMAT_DATA) return -ENOENT;  // init first
  if (q.epoch <= st->h.sealed_epoch) return -ZLOG_ERR_STALE;
  st->h.sealed_epoch = q.epoch;
  return st->save();
}

// close: epoch, end. Records where this object's view ends, as part of a
// reconfiguration: the caller must have sealed the object at exactly `epoch`
// (ESTALE otherwise), and nothing may be stored at or past `end` (EINVAL).
// A max past `end` that only a trim watermark raised (everything up to it
// trimmed: a trim_to above the tail at the reconfiguration's epoch) comes
// down to end - 1 instead: what lies past the end is the next view's.
// The end is set once: closing again at the same end succeeds (a proposer
// finishing another's reconfiguration), at another end is EINVAL.
int do_close(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_CLOSE, proto, &q);
  if (r < 0) return r;
  const uint64_t end = q.position;
  if (q.epoch > ZLOG_MAX_EPOCH || end > ZLOG_MAX_POSITION) return -EINVAL;

  auto st = store_for(hctx, q.format);
  if ((r = st->load(false)) < 0) return r;
  Header& h = st->h;
  if (!st->exists || q.epoch == 0 || q.epoch != h.sealed_epoch) return -ZLOG_ERR_STALE;  // 0: never sealed
  if (h.has_end) return h.view_end == end ? 0 : -EINVAL;
  if (h.has_max && h.max_pos >= end) {
    if (h.max_pos >= h.trim_below) return -EINVAL;  // an entry is stored at or past the end
    h.has_max = end > 0;
    h.max_pos = end > 0 ? end - 1 : 0;
  }
  h.has_end = true;
  h.view_end = end;
  return st->save();
}

// max_position: epoch -> u8 has_max, u64 max
int do_max_position(cls_method_context_t hctx, bufferlist* in, bufferlist* out, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_MAX_POSITION, proto, &q);
  if (r < 0) return r;
  auto st = store_for(hctx, q.format);
  if ((r = load_at(st.get(), q.epoch, false, false)) < 0) return r;
  Reply rep;
  zlog_max_encode(&rep.w, proto, st->h.has_max ? 1 : 0, st->h.max_pos);
  return rep.to(out);
}

// A protocol-2 range reply (read_range, read_set): fixed records, then
// every listed entry's data in one block.
static int encode_range2(const zlog_range_head& head, Listed& got, bufferlist* out) {
  Reply rep;
  zw_u8(&rep.w, ZLOG_STRUCT_V);
  zw_u8(&rep.w, ZLOG_COMPAT_V);
  zw_u32(&rep.w, static_cast<uint32_t>(ZLOG_RANGE_HEAD_BYTES + got.entries.size() * ZLOG_RANGE_REC2_BYTES +
                                       got.data.length()));
  zlog_range_head_encode(&rep.w, &head);
  for (auto& [pos, e] : got.entries) {
    zlog_range_entry rec{pos, e.epoch, e.len, e.state, 0};
    zlog_range_rec_encode(&rep.w, &rec);
  }
  int r = rep.to(out);
  if (r < 0) return r;
  out->claim_append(got.data);
  return 0;
}

// read_range: epoch, first, last (inclusive), max_entries, max_bytes -> the
// range reply of ops.h. Every position in [first, next) held by this object
// and >= trim_below that is not listed is unwritten; the caller resumes at
// `next`.
int do_read_range(cls_method_context_t hctx, bufferlist* in, bufferlist* out, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_READ_RANGE, proto, &q);
  if (r < 0) return r;
  const uint64_t first = q.position, last = q.last;
  if (last < first || last > ZLOG_MAX_POSITION || q.max_entries == 0 || q.max_entries > ZLOG_MAX_RANGE_ENTRIES ||
      q.max_bytes == 0 || q.max_bytes > ZLOG_MAX_RANGE_BYTES)
    return -EINVAL;

  auto st = store_for(hctx, q.format);
  if ((r = load_at(st.get(), q.epoch, false, false)) < 0) return r;
  Listed got;
  if ((r = st->list(first, last, q.max_entries, q.max_bytes, &got)) < 0) return r;
  const Header& h = st->h;
  zlog_range_head head{h.trim_below, static_cast<uint8_t>(h.has_max ? 1 : 0), h.max_pos, got.next,
                       static_cast<uint32_t>(got.entries.size())};
  Reply rep;
  if (proto == ZLOG_PROTO_CURRENT) {  // fixed records, then the data in one block
    return encode_range2(head, got, out);
  }
  // protocol 1: each entry's record followed by its data; a lost fill's data
  // is its one byte, as round 2 stored it
  zlog_range_head_encode(&rep.w, &head);
  if ((r = rep.to(out)) < 0) return r;
  unsigned off = 0;
  for (auto& [pos, e] : got.entries) {
    Reply rec;
    zw_u64(&rec.w, pos);
    zw_u8(&rec.w, e.state);
    zw_u64(&rec.w, e.epoch);
    zw_u32(&rec.w, e.len);
    if ((r = rec.to(out)) < 0) return r;
    if (e.len) {
      bufferlist one;
      one.substr_of(got.data, off, e.len);
      out->claim_append(one);
      off += e.len;
    }
  }
  return 0;
}

// read_set (protocol 2 only): epoch, n x (position, empty data) -> the range
// reply of ops.h (next = 0) listing each asked position that is written,
// filled or trimmed, in position order; a position not listed is unwritten.
// One call for any positions of this object (a stream's, found by its
// backpointers): the header is loaded once, not once per position.
// Positions not strictly ascending, one this object does not hold, or data
// with a position is EINVAL; a reply over ZLOG_MAX_RANGE_BYTES is EFBIG (ask for fewer).
int do_read_set(cls_method_context_t hctx, bufferlist* in, bufferlist* out, int proto) {
  zlog_req q;
  zw_reader rd;
  int r = decode(in, ZLOG_OP_READ_SET, proto, &q, &rd);
  if (r < 0) return r;
  if (proto != ZLOG_PROTO_CURRENT) return -EINVAL;
  std::vector<uint64_t> positions;
  positions.reserve(q.count);
  for (uint32_t i = 0; i < q.count; i++) {
    uint64_t pos;
    const char* data;
    uint32_t len;
    zlog_req_next_entry(&rd, &pos, &data, &len);
    if (pos > ZLOG_MAX_POSITION || len != 0 || (i && pos <= positions.back())) return -EINVAL;
    positions.push_back(pos);
  }
  auto st = store_for(hctx, q.format);
  if ((r = load_at(st.get(), q.epoch, false, false)) < 0) return r;
  Listed got;
  const size_t n = positions.size();
  if (st->exists) {
    for (uint64_t pos : positions)
      if (!st->holds(pos)) return -EINVAL;
    size_t i = 0;
    for (; i < n && positions[i] < st->h.trim_below; ++i) {  // below the watermark: trimmed
      Entry e;
      e.state = ZLOG_TRIMMED;
      got.entries.emplace_back(positions[i], e);
    }
    // the rest: slots of positions close together in one read, the entries'
    // bytes in one read per run of them lying back to back (DataStore)
    std::vector<uint64_t> rest(positions.begin() + i, positions.end());
    Listed part;
    if ((r = st->get_many(rest, &part)) < 0) return r;
    if (got.data.length() + part.data.length() > ZLOG_MAX_RANGE_BYTES) return -EFBIG;
    for (auto& pe : part.entries) got.entries.push_back(pe);
    got.data.claim_append(part.data);
  }
  const Header& h = st->h;
  zlog_range_head head{h.trim_below, static_cast<uint8_t>(h.has_max ? 1 : 0), h.max_pos, 0,
                       static_cast<uint32_t>(got.entries.size())};
  return encode_range2(head, got, out);
}

// stat: (nothing) -> zlog_stat. No epoch check: it only reports, and tools
// need it to pick a new epoch.
int do_stat(cls_method_context_t hctx, bufferlist* in, bufferlist* out, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_STAT, proto, &q);
  if (r < 0) return r;
  auto st = store_for(hctx, q.format);
  if ((r = st->load(false)) < 0) return r;
  if (!st->exists) return -ENOENT;
  const Header& h = st->h;
  zlog_stat s{h.sealed_epoch, static_cast<uint8_t>(h.has_max ? 1 : 0), h.max_pos, h.trim_below,
              static_cast<uint8_t>(h.has_end ? 1 : 0), h.view_end, st->format(), h.entries, h.bytes};
  Reply rep;
  zlog_stat_encode(&rep.w, proto, &s);
  return rep.to(out);
}

// init: epoch, base, width, slots, byte_bound [, unit]. Makes a data-format
// object, sealed at `epoch`, holding `slots` positions from base on, in runs
// of `unit` one run in every `width` (ops.h, "layout"); one that exists with
// this geometry is left as it is. A writer calls
// it once the object's stripe is open in the log's metadata (its write came
// back ENOENT), a tail finder before it seals.
int do_init(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_INIT, proto, &q);
  if (r < 0) return r;
  if (q.epoch > ZLOG_MAX_EPOCH) return -EINVAL;
  DataStore st(hctx);
  return st.init(q.epoch, q.position, q.width, q.slots, q.byte_bound, q.unit);
}

// repair: sealed epoch, view end (with reason ZLOG_REPAIR_HAS_END), trim
// point, and for the data format base (in `last`), width, slots,
// byte_bound and unit. An operator's tool (zlog repair), never a client's: rebuilds
// the header of an object whose header is lost next to its entries, from
// the entries and what the log's metadata says; acts only on such an object
// (EEXIST if its header is usable, ENOENT if it holds nothing, EIO if an
// entry is damaged too).
int do_repair(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_REPAIR, proto, &q);
  if (r < 0) return r;
  if (q.epoch > ZLOG_MAX_EPOCH || q.position > ZLOG_MAX_POSITION || q.start > ZLOG_MAX_POSITION + 1 ||
      (q.reason & ~ZLOG_REPAIR_HAS_END))
    return -EINVAL;
  Header want;
  want.sealed_epoch = q.epoch;
  want.has_end = q.reason & ZLOG_REPAIR_HAS_END;
  want.view_end = want.has_end ? q.position : 0;
  want.trim_below = q.start;
  want.base = q.last;
  want.width = q.width;
  want.slots = q.slots;
  want.byte_bound = q.byte_bound;
  want.unit = q.unit;
  return store_for(hctx, q.format)->repair(want);
}

// ------------------------------------------------------------ metadata objects
//
// Stored as the object's data in ops.h's zlog_meta layout; meta_get returns
// exactly these bytes. The config is opaque to the class (the client's JSON).

struct Meta {
  uint64_t epoch = 0;
  std::string config;
  std::vector<zlog_view> views;
  uint64_t seqr_epoch = 0;
  std::string seqr;  // empty: no sequencer recorded
  uint64_t trim_below = 0;  // the log's trim point (data-format logs)
};

// Loads and validates the metadata; `raw` (optional) receives the stored
// bytes. A metadata object that exists but does not parse (empty included)
// is corrupt: -EIO.
int load_meta(cls_method_context_t hctx, Meta* m, bufferlist* raw = nullptr) {
  uint64_t size;
  time_t mtime;
  int r = cls_cxx_stat(hctx, &size, &mtime);
  if (r < 0) return r;  // -ENOENT: the log does not exist
  bufferlist bl;
  r = cls_cxx_read(hctx, 0, static_cast<int>(size), &bl);
  if (r < 0) return r;
  zlog_meta zm;
  if (zlog_meta_decode(bl.c_str(), bl.length(), &zm) < 0) {
    cls_log(0, "zlog: corrupt metadata object (%" PRIu64 " bytes)", size);
    return -ZLOG_ERR_CORRUPT;
  }
  m->epoch = zm.epoch;
  m->config.assign(zm.config ? zm.config : "", zm.config_len);
  m->views.assign(zm.views, zm.views + zm.nviews);
  m->seqr_epoch = zm.seqr_epoch;
  m->seqr.assign(zm.seqr ? zm.seqr : "", zm.seqr_len);
  m->trim_below = zm.trim_below;
  free(zm.views);
  if (raw) *raw = bl;
  return 0;
}

int store_meta(cls_method_context_t hctx, const Meta& m) {
  zlog_meta zm{};
  zm.epoch = m.epoch;
  zm.config = m.config.data();
  zm.config_len = static_cast<uint32_t>(m.config.size());
  zm.nviews = static_cast<uint32_t>(m.views.size());
  zm.views = const_cast<zlog_view*>(m.views.data());
  zm.seqr_epoch = m.seqr_epoch;
  zm.seqr = m.seqr.data();
  zm.seqr_len = static_cast<uint32_t>(m.seqr.size());
  zm.trim_below = m.trim_below;
  Reply enc;
  zlog_meta_encode(&enc.w, &zm);
  bufferlist bl;
  int r = enc.to(&bl);
  if (r < 0) return r;
  return cls_cxx_write_full(hctx, &bl);
}

// A view of `width` objects from `start` at `epoch`, in the request's format.
// EINVAL for a data-format geometry out of range.
int view_of(const zlog_req& q, uint64_t epoch, uint64_t start, zlog_view* v) {
  *v = zlog_view{epoch, start, q.width, ZLOG_FORMAT_OMAP, 0, 0, 0, 1};
  if (q.format != ZLOG_FORMAT_DATA) return q.unit == 1 ? 0 : -EINVAL;
  if (!DataStore::geometry_ok(q.width, q.slots, q.byte_bound, q.unit)) return -EINVAL;
  v->format = ZLOG_FORMAT_DATA;
  v->slots = q.slots;
  v->byte_bound = q.byte_bound;
  v->unit = q.unit;
  return 0;
}

// meta_create: width, config [, format and geometry]. Exclusive.
int do_meta_create(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_META_CREATE, proto, &q);
  if (r < 0) return r;
  if (q.width == 0 || q.width > ZLOG_MAX_WIDTH || q.len > ZLOG_MAX_CONFIG_BYTES) return -EINVAL;
  zlog_view first;
  if ((r = view_of(q, 1, 0, &first)) < 0) return r;
  r = cls_cxx_create(hctx, true);
  if (r == -EEXIST) {  // a log of that name, or the remains of one: say which
    Meta m;
    return load_meta(hctx, &m) == -ZLOG_ERR_CORRUPT ? -ZLOG_ERR_CORRUPT : r;
  }
  if (r < 0) return r;
  Meta m;
  m.epoch = 1;
  m.config.assign(q.data ? q.data : "", q.len);
  m.views.push_back(first);
  return store_meta(hctx, m);
}

// A compare-and-swap's expectations: the epoch, and (data format) how many
// stripes of the newest view are open, so that an epoch change never misses
// a stripe opened while it sealed.
int check_cas(const Meta& m, uint64_t expected, uint32_t expected_stripes) {
  if (m.epoch != expected) return -ZLOG_ERR_CAS_LOST;
  if (expected_stripes != ZLOG_ANY_STRIPES && m.views.back().stripes != expected_stripes) return -ZLOG_ERR_CAS_LOST;
  return 0;
}

// meta_get: (nothing) -> the stored metadata bytes (protocol 2: enveloped).
int do_meta_get(cls_method_context_t hctx, bufferlist* in, bufferlist* out, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_META_GET, proto, &q);
  if (r < 0) return r;
  Meta m;
  bufferlist raw;
  r = load_meta(hctx, &m, &raw);
  if (r < 0) return r;
  if (proto == ZLOG_PROTO_CURRENT) {
    Reply rep;
    zw_u8(&rep.w, ZLOG_STRUCT_V);
    zw_u8(&rep.w, ZLOG_COMPAT_V);
    zw_u32(&rep.w, 4 + raw.length());
    zw_u32(&rep.w, raw.length());
    if ((r = rep.to(out)) < 0) return r;
  }
  out->claim_append(raw);
  return 0;
}

void take_over(Meta* m, const zlog_req& q, uint64_t epoch) {
  if (!q.seqr) return;  // absent: the recorded sequencer stays
  m->seqr.assign(q.seqr, q.seqr_len);
  m->seqr_epoch = epoch;
}

// meta_new_epoch: expected, new epoch [, sequencer]. Compare-and-swap on the
// epoch; with a sequencer, it is recorded as the one taking the log over.
int do_meta_new_epoch(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_META_NEW_EPOCH, proto, &q);
  if (r < 0) return r;
  if (q.next_epoch <= q.expected || q.next_epoch > ZLOG_MAX_EPOCH) return -EINVAL;
  Meta m;
  r = load_meta(hctx, &m);
  if (r < 0) return r;
  if ((r = check_cas(m, q.expected, q.expected_stripes)) < 0) return r;
  m.epoch = q.next_epoch;
  take_over(&m, q, q.next_epoch);
  return store_meta(hctx, m);
}

// meta_propose_view: expected, new epoch, start, width [, sequencer].
// Installs a view valid from `start` at the new epoch if the epoch is still
// `expected`; a second proposer at the same epoch loses with ECANCELED.
int do_meta_propose_view(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_META_PROPOSE_VIEW, proto, &q);
  if (r < 0) return r;
  if (q.next_epoch <= q.expected || q.next_epoch > ZLOG_MAX_EPOCH || q.start > ZLOG_MAX_POSITION ||
      q.width == 0 || q.width > ZLOG_MAX_WIDTH)
    return -EINVAL;
  zlog_view v;
  if ((r = view_of(q, q.next_epoch, q.start, &v)) < 0) return r;
  Meta m;
  r = load_meta(hctx, &m);
  if (r < 0) return r;
  if ((r = check_cas(m, q.expected, q.expected_stripes)) < 0) return r;
  if (q.start < m.views.back().start) return -EINVAL;
  if (m.views.size() >= ZLOG_MAX_VIEWS) return -ENOSPC;
  m.epoch = q.next_epoch;
  m.views.push_back(v);
  take_over(&m, q, q.next_epoch);
  return store_meta(hctx, m);
}

// meta_open_stripe: expected epoch, stripe. The newest (data-format) view's
// objects may go up to `stripe`: a writer does this before it makes a
// stripe's objects, at the epoch it writes at, so that a client whose epoch
// is stale cannot make (and write to) objects of a view that has ended.
int do_meta_open_stripe(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_META_OPEN_STRIPE, proto, &q);
  if (r < 0) return r;
  Meta m;
  if ((r = load_meta(hctx, &m)) < 0) return r;
  if (m.epoch != q.expected) return -ZLOG_ERR_CAS_LOST;
  zlog_view& v = m.views.back();
  if (v.format != ZLOG_FORMAT_DATA || q.stripe == UINT32_MAX) return -EINVAL;
  if (q.stripe < v.stripes) return 0;  // open already
  v.stripes = q.stripe + 1;
  return store_meta(hctx, m);
}

// meta_trim: position. Every position <= position is trimmed: the log's trim
// point only rises (no epoch: trimming is idempotent and every object
// enforces its own watermark).
int do_meta_trim(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_META_TRIM, proto, &q);
  if (r < 0) return r;
  if (q.position > ZLOG_MAX_POSITION) return -EINVAL;
  Meta m;
  if ((r = load_meta(hctx, &m)) < 0) return r;
  if (q.position + 1 <= m.trim_below) return 0;
  m.trim_below = q.position + 1;
  return store_meta(hctx, m);
}

// version (protocol 2 only): which class build this is, for a client
// choosing the protocol to speak.
int do_version(cls_method_context_t hctx, bufferlist* in, bufferlist* out, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_VERSION, proto, &q);
  if (r < 0) return r;
  zlog_version v{static_cast<uint32_t>(__cls_ver_maj), static_cast<uint32_t>(__cls_ver_min),
                 ZLOG_PROTO_CURRENT};
  Reply rep;
  zlog_version_encode(&rep.w, &v);
  return rep.to(out);
}

using Handler = int (*)(cls_method_context_t, bufferlist*, bufferlist*, int);

// One registered method per (op, protocol): the OSD calls a plain function.
template <Handler H, int P>
int method(cls_method_context_t hctx, bufferlist* in, bufferlist* out) {
  return H(hctx, in, out, P);
}

template <Handler H>
void register_op(cls_handle_t h, zlog_op op) {
  const int flags = zlog_op_writes[op] ? (CLS_METHOD_RD | CLS_METHOD_WR) : CLS_METHOD_RD;
  cls_method_handle_t mh;
  if (const char* legacy = zlog_method(op, ZLOG_PROTO_LEGACY))
    cls_register_cxx_method(h, legacy, flags, method<H, ZLOG_PROTO_LEGACY>, &mh);
  cls_register_cxx_method(h, zlog_method(op, ZLOG_PROTO_CURRENT), flags, method<H, ZLOG_PROTO_CURRENT>, &mh);
}

}  // namespace

void __cls_init() {
  cls_handle_t h;
  cls_log(0, "loading cls_zlog %d.%d (protocols 1 and 2, max entry %" PRIu64 " bytes)", __cls_ver_maj,
          __cls_ver_min, kMaxEntryBytes);
  cls_register("zlog", &h);
  register_op<do_write>(h, ZLOG_OP_WRITE);
  register_op<do_write_many>(h, ZLOG_OP_WRITE_MANY);
  register_op<do_read>(h, ZLOG_OP_READ);
  register_op<do_read_range>(h, ZLOG_OP_READ_RANGE);
  register_op<do_fill>(h, ZLOG_OP_FILL);
  register_op<do_trim>(h, ZLOG_OP_TRIM);
  register_op<do_trim_to>(h, ZLOG_OP_TRIM_TO);
  register_op<do_seal>(h, ZLOG_OP_SEAL);
  register_op<do_close>(h, ZLOG_OP_CLOSE);
  register_op<do_max_position>(h, ZLOG_OP_MAX_POSITION);
  register_op<do_stat>(h, ZLOG_OP_STAT);
  register_op<do_meta_create>(h, ZLOG_OP_META_CREATE);
  register_op<do_meta_get>(h, ZLOG_OP_META_GET);
  register_op<do_meta_new_epoch>(h, ZLOG_OP_META_NEW_EPOCH);
  register_op<do_meta_propose_view>(h, ZLOG_OP_META_PROPOSE_VIEW);
  register_op<do_version>(h, ZLOG_OP_VERSION);
  register_op<do_init>(h, ZLOG_OP_INIT);
  register_op<do_meta_open_stripe>(h, ZLOG_OP_META_OPEN_STRIPE);
  register_op<do_meta_trim>(h, ZLOG_OP_META_TRIM);
  register_op<do_repair>(h, ZLOG_OP_REPAIR);
  register_op<do_read_set>(h, ZLOG_OP_READ_SET);
}
