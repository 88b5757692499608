// cls_zlog: the storage rules of a CORFU-style shared log, enforced in the OSD.
//
// Data objects hold log positions as omap entries keyed by a fixed-width hex
// position (so key order is position order); the omap header holds the
// object's sealed epoch, the highest position written, filled or trimmed, a
// trim watermark, and once its view is closed, where that view ends.
// Metadata objects hold the log's epoch and view history as the object's
// data. Requests and replies are defined once, in ops.h, shared with the
// client; every method serves protocol 1 ("<op>", round 2's clients) and
// protocol 2 ("<op>2", versioned). docs/cls_zlog.md has the layouts.
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "objclass_api.h"
#include "ops.h"

using ceph::bufferlist;

#ifndef ZLOG_MAX_ENTRY_BYTES
#define ZLOG_MAX_ENTRY_BYTES (1024 * 1024)
#endif

extern "C" {
CLS_API const char* __cls_name = "zlog";
CLS_API int __cls_ver_maj = 2;
CLS_API int __cls_ver_min = 0;
CLS_API void __cls_init();
}

namespace {

constexpr uint64_t kMaxEntryBytes = ZLOG_MAX_ENTRY_BYTES;

std::string pos_key(uint64_t pos) {
  char buf[17];
  snprintf(buf, sizeof(buf), "%016" PRIx64, pos);
  return std::string(buf, 16);
}

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

struct DataHeader {
  uint64_t sealed_epoch = 0;
  bool has_max = false;
  uint64_t max_pos = 0;
  uint64_t trim_below = 0;  // every position < trim_below is trimmed
  // Set by close (a reconfiguration): positions >= view_end belong to a later
  // view, so no client, however stale its view history, can store one here.
  bool has_end = false;
  uint64_t view_end = 0;
};

constexpr uint8_t kHeaderVersion = 2;  // version 1 (no view end) is still read

int decode_header(bufferlist& bl, DataHeader* h) {
  *h = DataHeader{};
  zw_reader r = zw_reader_of(bl.c_str(), bl.length());
  uint8_t ver = zr_u8(&r);
  h->sealed_epoch = zr_u64(&r);
  h->has_max = zr_u8(&r) != 0;
  h->max_pos = zr_u64(&r);
  h->trim_below = zr_u64(&r);
  if (ver >= 2) {
    h->has_end = zr_u8(&r) != 0;
    h->view_end = zr_u64(&r);
  }
  if (!zr_done(&r) || ver < 1 || ver > kHeaderVersion) {
    cls_log(0, "zlog: corrupt data object header (%u bytes, version %u): refusing every call on it",
            bl.length(), ver);
    return -ZLOG_ERR_CORRUPT;
  }
  return 0;
}

// An object without a header is new only if it holds nothing at all: one
// with entries (or any omap or data) whose header is gone is corrupt, never
// new. Taking it for new would let a write overwrite an acknowledged entry
// and forget its seal (issue 28). Called only when the header is missing.
int check_headerless(cls_method_context_t hctx) {
  uint64_t size = 0;
  time_t mtime;
  int r = cls_cxx_stat(hctx, &size, &mtime);
  if (r == -ENOENT) return 0;
  if (r < 0) return r;
  std::map<std::string, bufferlist> vals;
  bool more = false;
  r = cls_cxx_map_get_vals(hctx, "", "", 1, &vals, &more);
  if (r < 0) return r;
  if (size == 0 && vals.empty()) return 0;
  cls_log(0, "zlog: data object holds %s but has no header: corrupt (first key %s); refusing every call "
          "on it until an operator repairs it (zlog check --deep, docs/cls_zlog.md)",
          vals.empty() ? "data" : "entries", vals.empty() ? "-" : vals.begin()->first.c_str());
  return -ZLOG_ERR_CORRUPT;
}

// Loads the header; a missing object is the initial state, and so is an
// existing one that holds nothing. Returns <0 for a corrupt object.
int read_header(cls_method_context_t hctx, DataHeader* h, bool* exists) {
  uint64_t size;
  time_t mtime;
  int r = cls_cxx_stat(hctx, &size, &mtime);
  if (r == -ENOENT) {
    *exists = false;
    *h = DataHeader{};
    return 0;
  }
  if (r < 0) return r;
  *exists = true;
  bufferlist bl;
  r = cls_cxx_map_read_header(hctx, &bl);
  if (r < 0) return r;
  if (bl.length() == 0) {
    *h = DataHeader{};
    return check_headerless(hctx);
  }
  return decode_header(bl, h);
}

// The header for the write paths, which run once per append: without the
// stat (a missing object has no header, and setting omap values creates
// it), so an append costs the OSD one read and two writes of omap.
int read_header_for_write(cls_method_context_t hctx, uint64_t epoch, DataHeader* h) {
  bufferlist bl;
  int r = cls_cxx_map_read_header(hctx, &bl);
  if (r < 0 && r != -ENOENT) return r;
  if (r == -ENOENT || bl.length() == 0) {
    *h = DataHeader{};
    if (r != -ENOENT && (r = check_headerless(hctx)) < 0) return r;
  } else if ((r = decode_header(bl, h)) < 0) {
    return r;
  }
  return epoch < h->sealed_epoch ? -ZLOG_ERR_STALE : 0;
}

// read_header, then refuse a request epoch below the object's sealed epoch.
int read_header_at(cls_method_context_t hctx, uint64_t epoch, DataHeader* h, bool* exists) {
  int r = read_header(hctx, h, exists);
  if (r < 0) return r;
  return epoch < h->sealed_epoch ? -ZLOG_ERR_STALE : 0;
}

int write_header(cls_method_context_t hctx, const DataHeader& h, bool exists) {
  if (!exists) {
    int r = cls_cxx_create(hctx, false);
    if (r < 0) return r;
  }
  zw_writer w{};
  zw_u8(&w, kHeaderVersion);
  zw_u64(&w, h.sealed_epoch);
  zw_u8(&w, h.has_max ? 1 : 0);
  zw_u64(&w, h.max_pos);
  zw_u64(&w, h.trim_below);
  zw_u8(&w, h.has_end ? 1 : 0);
  zw_u64(&w, h.view_end);
  bufferlist bl;
  bl.append(w.p, static_cast<unsigned>(w.len));
  zw_free(&w);
  return cls_cxx_map_write_header(hctx, &bl);
}

void note_position(DataHeader* h, uint64_t pos) {
  if (!h->has_max || pos > h->max_pos) {
    h->has_max = true;
    h->max_pos = pos;
  }
}

// A position at or past a closed view's end belongs to a later view: the
// request's view history is stale, whatever its epoch says.
bool past_end(const DataHeader& h, uint64_t pos) { return h.has_end && pos >= h.view_end; }

// An entry value: state, epoch of the request that stored it, then the data.
struct Entry {
  uint8_t state = 0;
  uint64_t epoch = 0;
  uint32_t len = 0;
};
constexpr unsigned kEntryHead = 9;

bool parse_entry(bufferlist& bl, Entry* e) {
  if (bl.length() < kEntryHead) return false;
  zw_reader r = zw_reader_of(bl.c_str(), kEntryHead);
  e->state = zr_u8(&r);
  e->epoch = zr_u64(&r);
  e->len = bl.length() - kEntryHead;
  return e->state >= ZLOG_WRITTEN && e->state <= ZLOG_TRIMMED;
}

bufferlist make_entry(uint8_t state, uint64_t epoch, const char* data, uint32_t len) {
  char head[kEntryHead];
  head[0] = static_cast<char>(state);
  for (int i = 0; i < 8; ++i) head[1 + i] = static_cast<char>(epoch >> (8 * i));
  bufferlist bl;
  bl.append(head, kEntryHead);
  if (len) bl.append(data, len);
  return bl;
}

int state_error(uint8_t state) {
  switch (state) {
    case ZLOG_WRITTEN: return -ZLOG_ERR_WRITTEN;
    case ZLOG_FILLED: return -ZLOG_ERR_FILLED;
    default: return -ZLOG_ERR_TRIMMED;
  }
}

// Looks up one position. Returns 0 with *found=false for unwritten.
int get_entry(cls_method_context_t hctx, const DataHeader& h, uint64_t pos, bufferlist* bl,
              Entry* e, bool* found) {
  *found = false;
  if (pos < h.trim_below) {
    e->state = ZLOG_TRIMMED;
    *found = true;
    return 0;
  }
  int r = cls_cxx_map_get_val(hctx, pos_key(pos), bl);
  if (r == -ENOENT) return 0;
  if (r < 0) return r;
  if (!parse_entry(*bl, e)) {
    cls_log(0, "zlog: corrupt entry at %" PRIu64, pos);
    return -ZLOG_ERR_CORRUPT;
  }
  *found = true;
  return 0;
}

// Whether `pos` is free to store at. Every stored entry is at or below the
// header's max (write, fill and trim all raise it), so an append, which is
// almost always above it, needs no lookup.
int check_free(cls_method_context_t hctx, const DataHeader& h, uint64_t pos) {
  if (pos < h.trim_below) return -ZLOG_ERR_TRIMMED;
  if (!h.has_max || pos > h.max_pos) return 0;
  bufferlist cur;
  Entry e;
  bool found;
  int r = get_entry(hctx, h, pos, &cur, &e, &found);
  if (r < 0) return r;
  return found ? state_error(e.state) : 0;
}

// write: epoch, position, data
int do_write(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_WRITE, proto, &q);
  if (r < 0) return r;
  if (q.position > ZLOG_MAX_POSITION) return -EINVAL;
  if (q.len > kMaxEntryBytes) return -ZLOG_ERR_TOO_BIG;

  DataHeader h;
  r = read_header_for_write(hctx, q.epoch, &h);
  if (r < 0) return r;
  if (past_end(h, q.position)) return -ZLOG_ERR_STALE;
  r = check_free(hctx, h, q.position);
  if (r < 0) return r;
  bufferlist val = make_entry(ZLOG_WRITTEN, q.epoch, q.data, q.len);
  r = cls_cxx_map_set_val(hctx, pos_key(q.position), &val);
  if (r < 0) return r;
  if (h.has_max && q.position <= h.max_pos) return 0;
  note_position(&h, q.position);
  return write_header(hctx, h, true);
}

// write_many: epoch, n x (position, data). All or nothing: if any position is
// taken, nothing is written and its error is returned.
int do_write_many(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  zw_reader entries;
  int r = decode(in, ZLOG_OP_WRITE_MANY, proto, &q, &entries);
  if (r < 0) return r;
  std::map<std::string, bufferlist> vals;
  uint64_t top = 0;
  bool too_big = false;
  for (uint32_t i = 0; i < q.count; i++) {
    uint64_t pos;
    const char* data;
    uint32_t len;
    zlog_req_next_entry(&entries, &pos, &data, &len);
    if (pos > ZLOG_MAX_POSITION) return -EINVAL;
    if (len > kMaxEntryBytes) too_big = true;
    auto ins = vals.emplace(pos_key(pos), make_entry(ZLOG_WRITTEN, q.epoch, data, len));
    if (!ins.second) return -EINVAL;  // the same position twice
    if (pos > top) top = pos;
  }
  if (too_big) return -ZLOG_ERR_TOO_BIG;

  DataHeader h;
  r = read_header_for_write(hctx, q.epoch, &h);
  if (r < 0) return r;
  if (past_end(h, top)) return -ZLOG_ERR_STALE;
  for (auto& kv : vals) {
    r = check_free(hctx, h, std::stoull(kv.first, nullptr, 16));
    if (r < 0) return r;
  }
  r = cls_cxx_map_set_vals(hctx, &vals);
  if (r < 0) return r;
  if (h.has_max && top <= h.max_pos) return 0;
  note_position(&h, top);
  return write_header(hctx, h, true);
}

// read: epoch, position -> the data
int do_read(cls_method_context_t hctx, bufferlist* in, bufferlist* out, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_READ, proto, &q);
  if (r < 0) return r;
  if (q.position > ZLOG_MAX_POSITION) return -EINVAL;

  DataHeader h;
  bool exists;
  r = read_header_at(hctx, q.epoch, &h, &exists);
  if (r < 0) return r;
  if (!exists) return -ZLOG_ERR_UNWRITTEN;

  bufferlist cur;
  Entry e;
  bool found;
  r = get_entry(hctx, h, q.position, &cur, &e, &found);
  if (r < 0) return r;
  if (!found) return -ZLOG_ERR_UNWRITTEN;
  if (e.state != ZLOG_WRITTEN) return state_error(e.state);
  bufferlist data;
  data.substr_of(cur, kEntryHead, e.len);
  if (proto == ZLOG_PROTO_CURRENT) {
    Reply rep;
    zw_u8(&rep.w, ZLOG_STRUCT_V);
    zw_u8(&rep.w, ZLOG_COMPAT_V);
    zw_u32(&rep.w, 4 + e.len);
    zw_u32(&rep.w, e.len);
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

  DataHeader h;
  bool exists;
  r = read_header_at(hctx, q.epoch, &h, &exists);
  if (r < 0) return r;
  if (past_end(h, q.position)) return -ZLOG_ERR_STALE;

  bufferlist cur;
  Entry e;
  bool found;
  r = get_entry(hctx, h, q.position, &cur, &e, &found);
  if (r < 0) return r;
  if (found) {
    if (e.state != ZLOG_FILLED) return state_error(e.state);
    const uint8_t first_reason =
        e.len == 1 ? static_cast<uint8_t>(cur[kEntryHead]) : static_cast<uint8_t>(ZLOG_FILL_JUNK);
    return first_reason == q.reason ? 0 : -ZLOG_ERR_FILLED;
  }

  if (!exists) {
    r = cls_cxx_create(hctx, false);
    if (r < 0) return r;
  }
  const char lost = static_cast<char>(ZLOG_FILL_LOST);
  bufferlist val = make_entry(ZLOG_FILLED, q.epoch, q.reason == ZLOG_FILL_LOST ? &lost : nullptr, q.reason);
  r = cls_cxx_map_set_val(hctx, pos_key(q.position), &val);
  if (r < 0) return r;
  if (exists && h.has_max && q.position <= h.max_pos) return 0;
  note_position(&h, q.position);
  return write_header(hctx, h, true);
}

// trim: epoch, position. Any state -> trimmed; the data is dropped.
int do_trim(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_TRIM, proto, &q);
  if (r < 0) return r;
  if (q.position > ZLOG_MAX_POSITION) return -EINVAL;

  DataHeader h;
  bool exists;
  r = read_header_at(hctx, q.epoch, &h, &exists);
  if (r < 0) return r;
  if (past_end(h, q.position)) return -ZLOG_ERR_STALE;
  if (q.position < h.trim_below) return 0;
  bufferlist val = make_entry(ZLOG_TRIMMED, q.epoch, nullptr, 0);
  if (!h.has_max || q.position > h.max_pos) {
    note_position(&h, q.position);  // keeps "every stored entry is at or below max" (check_free)
    r = write_header(hctx, h, exists);
    if (r < 0) return r;
  } else if (!exists) {
    r = write_header(hctx, h, false);
    if (r < 0) return r;
  }
  return cls_cxx_map_set_val(hctx, pos_key(q.position), &val);
}

// trim_to: epoch, position. Trims every position <= position held here, and
// raises max to it (to the view's end - 1 on a closed object): tail finding
// reads max, so it never hands out a position at or below a trim watermark.
int do_trim_to(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_TRIM_TO, proto, &q);
  if (r < 0) return r;
  const uint64_t pos = q.position;
  if (pos > ZLOG_MAX_POSITION) return -EINVAL;  // the watermark is pos + 1

  DataHeader h;
  bool exists;
  r = read_header_at(hctx, q.epoch, &h, &exists);
  if (r < 0) return r;
  if (pos + 1 <= h.trim_below) return 0;
  h.trim_below = pos + 1;
  const uint64_t top = h.has_end ? (h.view_end == 0 ? 0 : std::min(pos, h.view_end - 1)) : pos;
  if (!h.has_end || h.view_end > 0) note_position(&h, top);
  if (exists) {
    r = cls_cxx_map_remove_range(hctx, pos_key(0), pos_key(pos + 1));
    if (r < 0) return r;
  }
  return write_header(hctx, h, exists);
}

// seal: epoch. The epoch must be above the one already sealed.
int do_seal(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_SEAL, proto, &q);
  if (r < 0) return r;
  if (q.epoch > ZLOG_MAX_EPOCH) return -EINVAL;

  DataHeader h;
  bool exists;
  r = read_header(hctx, &h, &exists);
  if (r < 0) return r;
  if (q.epoch <= h.sealed_epoch) return -ZLOG_ERR_STALE;
  h.sealed_epoch = q.epoch;
  return write_header(hctx, h, exists);
}

// close: epoch, end. Records where this object's view ends, as part of a
// reconfiguration: the caller must have sealed the object at exactly `epoch`
// (ESTALE otherwise), and nothing may be stored at or past `end` (EINVAL).
// The end is set once: closing again at the same end succeeds (a proposer
// finishing another's reconfiguration), at another end is EINVAL.
int do_close(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_CLOSE, proto, &q);
  if (r < 0) return r;
  const uint64_t end = q.position;
  if (q.epoch > ZLOG_MAX_EPOCH || end > ZLOG_MAX_POSITION) return -EINVAL;

  DataHeader h;
  bool exists;
  r = read_header(hctx, &h, &exists);
  if (r < 0) return r;
  if (!exists || q.epoch == 0 || q.epoch != h.sealed_epoch) return -ZLOG_ERR_STALE;  // 0: never sealed
  if (h.has_end) return h.view_end == end ? 0 : -EINVAL;
  if (h.has_max && h.max_pos >= end) return -EINVAL;
  h.has_end = true;
  h.view_end = end;
  return write_header(hctx, h, true);
}

// max_position: epoch -> u8 has_max, u64 max
int do_max_position(cls_method_context_t hctx, bufferlist* in, bufferlist* out, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_MAX_POSITION, proto, &q);
  if (r < 0) return r;

  DataHeader h;
  bool exists;
  r = read_header_at(hctx, q.epoch, &h, &exists);
  if (r < 0) return r;
  Reply rep;
  zlog_max_encode(&rep.w, proto, h.has_max ? 1 : 0, h.max_pos);
  return rep.to(out);
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
  const uint32_t max_entries = q.max_entries, max_bytes = q.max_bytes;
  if (last < first || last > ZLOG_MAX_POSITION || max_entries == 0 || max_entries > ZLOG_MAX_RANGE_ENTRIES ||
      max_bytes == 0 || max_bytes > ZLOG_MAX_RANGE_BYTES)
    return -EINVAL;

  DataHeader h;
  bool exists;
  r = read_header_at(hctx, q.epoch, &h, &exists);
  if (r < 0) return r;

  Reply recs;          // protocol 1: whole entries; 2: fixed records
  bufferlist datas;    // protocol 2: the entries' data, back to back, shared not copied
  zlog_range_head head{h.trim_below, static_cast<uint8_t>(h.has_max ? 1 : 0), h.max_pos, last + 1, 0};
  uint64_t bytes = 0;
  const uint64_t start = first < h.trim_below ? h.trim_below : first;
  if (exists && start <= last) {
    std::string after = start == 0 ? std::string() : pos_key(start - 1);
    const std::string end_key = pos_key(last);
    bool more = true;
    bool stop = false;
    while (more && !stop) {
      std::map<std::string, bufferlist> vals;
      r = cls_cxx_map_get_vals(hctx, after, "", max_entries - head.count, &vals, &more);
      if (r < 0) return r;
      if (vals.empty()) break;
      for (auto& kv : vals) {
        if (kv.first > end_key) {
          stop = true;
          break;
        }
        uint64_t pos = std::stoull(kv.first, nullptr, 16);
        Entry e;
        if (!parse_entry(kv.second, &e)) {
          cls_log(0, "zlog: corrupt entry at %" PRIu64, pos);
          return -ZLOG_ERR_CORRUPT;
        }
        if (head.count > 0 && bytes + e.len > max_bytes) {
          head.next = pos;
          stop = true;
          break;
        }
        bufferlist data;
        data.substr_of(kv.second, kEntryHead, e.len);
        if (proto == ZLOG_PROTO_CURRENT) {
          zlog_range_entry rec{pos, e.epoch, e.len, e.state, 0};
          zlog_range_rec_encode(&recs.w, &rec);
          datas.claim_append(data);
        } else {
          zw_u64(&recs.w, pos);
          zw_u8(&recs.w, e.state);
          zw_u64(&recs.w, e.epoch);
          zw_u32(&recs.w, e.len);
          if ((r = recs.to(out)) < 0) return r;  // flushed as we go: the data follows its record
          recs.w.len = 0;
          out->claim_append(data);
        }
        bytes += e.len;
        head.count++;
        after = kv.first;
        if (head.count == max_entries) {
          head.next = pos + 1;
          stop = true;
          break;
        }
      }
    }
  }
  if (proto != ZLOG_PROTO_CURRENT) {  // the head goes first: prepend it
    Reply hd;
    zlog_range_head_encode(&hd.w, &head);
    bufferlist body;
    body.claim_append(*out);
    if ((r = hd.to(out)) < 0) return r;
    out->claim_append(body);
    return 0;
  }
  Reply env;
  zw_u8(&env.w, ZLOG_STRUCT_V);
  zw_u8(&env.w, ZLOG_COMPAT_V);
  zw_u32(&env.w, static_cast<uint32_t>(ZLOG_RANGE_HEAD_BYTES + recs.w.len + datas.length()));
  zlog_range_head_encode(&env.w, &head);
  if ((r = env.to(out)) < 0 || (r = recs.to(out)) < 0) return r;
  out->claim_append(datas);
  return 0;
}

// stat: (nothing) -> zlog_stat. No epoch check: it only reports, and tools
// need it to pick a new epoch.
int do_stat(cls_method_context_t hctx, bufferlist* in, bufferlist* out, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_STAT, proto, &q);
  if (r < 0) return r;
  DataHeader h;
  bool exists;
  r = read_header(hctx, &h, &exists);
  if (r < 0) return r;
  if (!exists) return -ENOENT;
  zlog_stat st{h.sealed_epoch, static_cast<uint8_t>(h.has_max ? 1 : 0), h.max_pos, h.trim_below,
               static_cast<uint8_t>(h.has_end ? 1 : 0), h.view_end};
  Reply rep;
  zlog_stat_encode(&rep.w, proto, &st);
  return rep.to(out);
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
  Reply enc;
  zlog_meta_encode(&enc.w, &zm);
  bufferlist bl;
  int r = enc.to(&bl);
  if (r < 0) return r;
  return cls_cxx_write_full(hctx, &bl);
}

// meta_create: width, config. Exclusive.
int do_meta_create(cls_method_context_t hctx, bufferlist* in, bufferlist*, int proto) {
  zlog_req q;
  int r = decode(in, ZLOG_OP_META_CREATE, proto, &q);
  if (r < 0) return r;
  if (q.width == 0 || q.width > ZLOG_MAX_WIDTH || q.len > ZLOG_MAX_CONFIG_BYTES) return -EINVAL;
  r = cls_cxx_create(hctx, true);
  if (r < 0) return r;  // -EEXIST
  Meta m;
  m.epoch = 1;
  m.config.assign(q.data ? q.data : "", q.len);
  m.views.push_back(zlog_view{1, 0, q.width});
  return store_meta(hctx, m);
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
  if (m.epoch != q.expected) return -ZLOG_ERR_CAS_LOST;
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
  Meta m;
  r = load_meta(hctx, &m);
  if (r < 0) return r;
  if (m.epoch != q.expected) return -ZLOG_ERR_CAS_LOST;
  if (q.start < m.views.back().start) return -EINVAL;
  if (m.views.size() >= ZLOG_MAX_VIEWS) return -ENOSPC;
  m.epoch = q.next_epoch;
  m.views.push_back(zlog_view{q.next_epoch, q.start, q.width});
  take_over(&m, q, q.next_epoch);
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
}
