// cls_zlog: the storage rules of a CORFU-style shared log, enforced in the OSD.
//
// Data objects hold log positions as omap entries keyed by a fixed-width hex
// position (so key order is position order); the omap header holds the
// object's sealed epoch, the highest position written, filled or trimmed, a
// trim watermark, and once its view is closed, where that view ends. Metadata objects hold the log's epoch and view history as the
// object's data. Request and reply layouts are in docs/cls_zlog.md.
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "objclass_api.h"
#include "wire.h"

using ceph::bufferlist;
using zlog_wire::Decoder;
using zlog_wire::put_bytes;
using zlog_wire::put_u32;
using zlog_wire::put_u64;
using zlog_wire::put_u8;

#ifndef ZLOG_MAX_ENTRY_BYTES
#define ZLOG_MAX_ENTRY_BYTES (1024 * 1024)
#endif

extern "C" {
CLS_API const char* __cls_name = "zlog";
CLS_API int __cls_ver_maj = 1;
CLS_API int __cls_ver_min = 0;
CLS_API void __cls_init();
}

namespace {

// Distinct outcomes, returned as negative errno values so they survive the
// trip back through librados (a write method cannot return a payload).
constexpr int ERR_STALE = ESTALE;        // request epoch below the sealed epoch
constexpr int ERR_WRITTEN = EROFS;       // position already holds data
constexpr int ERR_FILLED = ENOMSG;       // position was filled with junk
constexpr int ERR_TRIMMED = EIDRM;       // position was trimmed
constexpr int ERR_UNWRITTEN = ENODATA;   // nothing stored at the position yet
constexpr int ERR_TOO_BIG = EFBIG;       // entry over the size limit
constexpr int ERR_CAS_LOST = ECANCELED;  // metadata changed under a proposer

constexpr uint64_t kMaxEntryBytes = ZLOG_MAX_ENTRY_BYTES;
// Positions and epochs stop one short of 2^64 - 1, so that "max + 1" (the next
// position, the next epoch) and read_range's "last + 1" never overflow.
constexpr uint64_t kMaxPosition = UINT64_MAX - 1;
constexpr uint64_t kMaxEpoch = UINT64_MAX - 1;
constexpr uint32_t kMaxBatchEntries = 1024;
constexpr uint32_t kMaxRangeEntries = 4096;
constexpr uint32_t kMaxRangeBytes = 16u << 20;
constexpr uint32_t kMaxWidth = 1024;
constexpr uint32_t kMaxConfigBytes = 64u << 10;
constexpr uint32_t kMaxViews = 100000;

enum EntryState : uint8_t { WRITTEN = 1, FILLED = 2, TRIMMED = 3 };
// Why a position was filled; stored as the filled entry's one data byte.
enum FillReason : uint8_t { FILL_JUNK = 0, FILL_LOST = 1 };

std::string pos_key(uint64_t pos) {
  char buf[17];
  snprintf(buf, sizeof(buf), "%016" PRIx64, pos);
  return std::string(buf, 16);
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
  if (bl.length() == 0) return 0;
  Decoder d(bl.c_str(), bl.length());
  uint8_t ver = d.u8();
  h->sealed_epoch = d.u64();
  h->has_max = d.u8() != 0;
  h->max_pos = d.u64();
  h->trim_below = d.u64();
  if (ver >= 2) {
    h->has_end = d.u8() != 0;
    h->view_end = d.u64();
  }
  if (!d.done() || ver < 1 || ver > kHeaderVersion) {
    cls_log(0, "zlog: corrupt data object header");
    return -EIO;
  }
  return 0;
}

// Loads the header; a missing object or empty header is the initial state.
// Returns <0 only for a header that exists but is unreadable.
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
  return decode_header(bl, h);
}

// The header for the write paths, which run once per append: without the
// stat (a missing object has no header, and setting omap values creates
// it), so an append costs the OSD one read and two writes of omap.
int read_header_for_write(cls_method_context_t hctx, uint64_t epoch, DataHeader* h) {
  bufferlist bl;
  int r = cls_cxx_map_read_header(hctx, &bl);
  if (r < 0 && r != -ENOENT) return r;
  if (r == -ENOENT) bl.clear();
  r = decode_header(bl, h);
  if (r < 0) return r;
  return epoch < h->sealed_epoch ? -ERR_STALE : 0;
}

// read_header, then refuse a request epoch below the object's sealed epoch.
int read_header_at(cls_method_context_t hctx, uint64_t epoch, DataHeader* h, bool* exists) {
  int r = read_header(hctx, h, exists);
  if (r < 0) return r;
  return epoch < h->sealed_epoch ? -ERR_STALE : 0;
}

int write_header(cls_method_context_t hctx, const DataHeader& h, bool exists) {
  if (!exists) {
    int r = cls_cxx_create(hctx, false);
    if (r < 0) return r;
  }
  bufferlist bl;
  put_u8(bl, kHeaderVersion);
  put_u64(bl, h.sealed_epoch);
  put_u8(bl, h.has_max ? 1 : 0);
  put_u64(bl, h.max_pos);
  put_u64(bl, h.trim_below);
  put_u8(bl, h.has_end ? 1 : 0);
  put_u64(bl, h.view_end);
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
  const char* data = nullptr;
  uint32_t len = 0;
};

bool parse_entry(bufferlist& bl, Entry* e) {
  if (bl.length() < 9) return false;
  Decoder d(bl.c_str(), bl.length());
  e->state = d.u8();
  e->epoch = d.u64();
  e->len = bl.length() - 9;
  e->data = d.bytes(e->len);
  return d.done() && e->state >= WRITTEN && e->state <= TRIMMED;
}

bufferlist make_entry(uint8_t state, uint64_t epoch, const char* data, uint32_t len) {
  bufferlist bl;
  put_u8(bl, state);
  put_u64(bl, epoch);
  if (len) bl.append(data, len);
  return bl;
}

int state_error(uint8_t state) {
  switch (state) {
    case WRITTEN: return -ERR_WRITTEN;
    case FILLED: return -ERR_FILLED;
    default: return -ERR_TRIMMED;
  }
}

// Looks up one position. Returns 0 with *found=false for unwritten.
int get_entry(cls_method_context_t hctx, const DataHeader& h, uint64_t pos, bufferlist* bl,
              Entry* e, bool* found) {
  *found = false;
  if (pos < h.trim_below) {
    e->state = TRIMMED;
    *found = true;
    return 0;
  }
  int r = cls_cxx_map_get_val(hctx, pos_key(pos), bl);
  if (r == -ENOENT) return 0;
  if (r < 0) return r;
  if (!parse_entry(*bl, e)) {
    cls_log(0, "zlog: corrupt entry at %" PRIu64, pos);
    return -EIO;
  }
  *found = true;
  return 0;
}

// Whether `pos` is free to store at. Every stored entry is at or below the
// header's max (write, fill and trim all raise it), so an append, which is
// almost always above it, needs no lookup.
int check_free(cls_method_context_t hctx, const DataHeader& h, uint64_t pos) {
  if (pos < h.trim_below) return -ERR_TRIMMED;
  if (!h.has_max || pos > h.max_pos) return 0;
  bufferlist cur;
  Entry e;
  bool found;
  int r = get_entry(hctx, h, pos, &cur, &e, &found);
  if (r < 0) return r;
  return found ? state_error(e.state) : 0;
}

// write: u64 epoch, u64 pos, u32 len, data
int zlog_write(cls_method_context_t hctx, bufferlist* in, bufferlist*) {
  Decoder d(in->c_str(), in->length());
  uint64_t epoch = d.u64();
  uint64_t pos = d.u64();
  uint32_t len = d.u32();
  const char* data = d.bytes(len);
  if (!d.done() || pos > kMaxPosition) return -EINVAL;
  if (len > kMaxEntryBytes) return -ERR_TOO_BIG;

  DataHeader h;
  int r = read_header_for_write(hctx, epoch, &h);
  if (r < 0) return r;
  if (past_end(h, pos)) return -ERR_STALE;
  r = check_free(hctx, h, pos);
  if (r < 0) return r;
  bufferlist val = make_entry(WRITTEN, epoch, data, len);
  r = cls_cxx_map_set_val(hctx, pos_key(pos), &val);
  if (r < 0) return r;
  if (h.has_max && pos <= h.max_pos) return 0;
  note_position(&h, pos);
  return write_header(hctx, h, true);
}

// write_many: u64 epoch, u32 n, n x (u64 pos, u32 len, data). All or nothing:
// if any position is taken, nothing is written and its error is returned.
int zlog_write_many(cls_method_context_t hctx, bufferlist* in, bufferlist*) {
  Decoder d(in->c_str(), in->length());
  uint64_t epoch = d.u64();
  uint32_t n = d.u32();
  if (!d.ok() || n == 0 || n > kMaxBatchEntries) return -EINVAL;
  std::map<std::string, bufferlist> vals;
  uint64_t top = 0;
  bool too_big = false;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t pos = d.u64();
    uint32_t len = d.u32();
    const char* data = d.bytes(len);
    if (!d.ok() || pos > kMaxPosition) return -EINVAL;
    if (len > kMaxEntryBytes) too_big = true;
    auto ins = vals.emplace(pos_key(pos), make_entry(WRITTEN, epoch, data, len));
    if (!ins.second) return -EINVAL;  // the same position twice
    if (pos > top) top = pos;
  }
  if (!d.done()) return -EINVAL;
  if (too_big) return -ERR_TOO_BIG;

  DataHeader h;
  int r = read_header_for_write(hctx, epoch, &h);
  if (r < 0) return r;
  if (past_end(h, top)) return -ERR_STALE;
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

// read: u64 epoch, u64 pos -> data
int zlog_read(cls_method_context_t hctx, bufferlist* in, bufferlist* out) {
  Decoder d(in->c_str(), in->length());
  uint64_t epoch = d.u64();
  uint64_t pos = d.u64();
  if (!d.done() || pos > kMaxPosition) return -EINVAL;

  DataHeader h;
  bool exists;
  int r = read_header_at(hctx, epoch, &h, &exists);
  if (r < 0) return r;
  if (!exists) return -ERR_UNWRITTEN;

  bufferlist cur;
  Entry e;
  bool found;
  r = get_entry(hctx, h, pos, &cur, &e, &found);
  if (r < 0) return r;
  if (!found) return -ERR_UNWRITTEN;
  if (e.state != WRITTEN) return state_error(e.state);
  out->append(e.data, e.len);
  return 0;
}

// fill: u64 epoch, u64 pos, u8 reason. Unwritten -> filled. reason 0: a
// client filled it; 1: a reader filled a hole whose writer never wrote (lost),
// kept so every later reader reports the same loss. Filling again with the
// same reason succeeds; with the other reason it is refused (ENOMSG), so a
// reader that loses the race reads the kind that won: one kind per position.
int zlog_fill(cls_method_context_t hctx, bufferlist* in, bufferlist*) {
  Decoder d(in->c_str(), in->length());
  uint64_t epoch = d.u64();
  uint64_t pos = d.u64();
  uint8_t reason = d.u8();
  if (!d.done() || pos > kMaxPosition || reason > FILL_LOST) return -EINVAL;

  DataHeader h;
  bool exists;
  int r = read_header_at(hctx, epoch, &h, &exists);
  if (r < 0) return r;
  if (past_end(h, pos)) return -ERR_STALE;

  bufferlist cur;
  Entry e;
  bool found;
  r = get_entry(hctx, h, pos, &cur, &e, &found);
  if (r < 0) return r;
  if (found) {
    if (e.state != FILLED) return state_error(e.state);
    const uint8_t first_reason = e.len == 1 ? static_cast<uint8_t>(e.data[0]) : FILL_JUNK;
    return first_reason == reason ? 0 : -ERR_FILLED;
  }

  if (!exists) {
    r = cls_cxx_create(hctx, false);
    if (r < 0) return r;
  }
  const char lost = static_cast<char>(FILL_LOST);
  bufferlist val = make_entry(FILLED, epoch, reason == FILL_LOST ? &lost : nullptr, reason);
  r = cls_cxx_map_set_val(hctx, pos_key(pos), &val);
  if (r < 0) return r;
  if (h.has_max && pos <= h.max_pos) return 0;
  note_position(&h, pos);
  return write_header(hctx, h, true);
}

// trim: u64 epoch, u64 pos. Any state -> trimmed; the data is dropped.
int zlog_trim(cls_method_context_t hctx, bufferlist* in, bufferlist*) {
  Decoder d(in->c_str(), in->length());
  uint64_t epoch = d.u64();
  uint64_t pos = d.u64();
  if (!d.done() || pos > kMaxPosition) return -EINVAL;

  DataHeader h;
  bool exists;
  int r = read_header_at(hctx, epoch, &h, &exists);
  if (r < 0) return r;
  if (past_end(h, pos)) return -ERR_STALE;
  if (pos < h.trim_below) return 0;
  bufferlist val = make_entry(TRIMMED, epoch, nullptr, 0);
  if (!h.has_max || pos > h.max_pos) {
    note_position(&h, pos);  // keeps "every stored entry is at or below max" (check_free)
    r = write_header(hctx, h, exists);
    if (r < 0) return r;
  } else if (!exists) {
    r = write_header(hctx, h, false);
    if (r < 0) return r;
  }
  return cls_cxx_map_set_val(hctx, pos_key(pos), &val);
}

// trim_to: u64 epoch, u64 pos. Trims every position <= pos held here, and
// raises max to pos (to the view's end - 1 on a closed object): tail finding
// reads max, so it never hands out a position at or below a trim watermark.
int zlog_trim_to(cls_method_context_t hctx, bufferlist* in, bufferlist*) {
  Decoder d(in->c_str(), in->length());
  uint64_t epoch = d.u64();
  uint64_t pos = d.u64();
  if (!d.done() || pos > kMaxPosition) return -EINVAL;
  if (pos == UINT64_MAX) return -EINVAL;  // the watermark is pos + 1

  DataHeader h;
  bool exists;
  int r = read_header_at(hctx, epoch, &h, &exists);
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

// seal: u64 epoch. The epoch must be above the one already sealed.
int zlog_seal(cls_method_context_t hctx, bufferlist* in, bufferlist*) {
  Decoder d(in->c_str(), in->length());
  uint64_t epoch = d.u64();
  if (!d.done() || epoch > kMaxEpoch) return -EINVAL;

  DataHeader h;
  bool exists;
  int r = read_header(hctx, &h, &exists);
  if (r < 0) return r;
  if (epoch <= h.sealed_epoch) return -ERR_STALE;
  h.sealed_epoch = epoch;
  return write_header(hctx, h, exists);
}

// close: u64 epoch, u64 end. Records where this object's view ends, as part
// of a reconfiguration: the caller must have sealed the object at exactly
// `epoch` (ESTALE otherwise), and nothing may be stored at or past `end`
// (EINVAL). The end is set once: closing again at the same end succeeds (a
// proposer finishing another's reconfiguration), at another end is EINVAL.
int zlog_close(cls_method_context_t hctx, bufferlist* in, bufferlist*) {
  Decoder d(in->c_str(), in->length());
  uint64_t epoch = d.u64();
  uint64_t end = d.u64();
  if (!d.done() || epoch > kMaxEpoch || end > kMaxPosition) return -EINVAL;

  DataHeader h;
  bool exists;
  int r = read_header(hctx, &h, &exists);
  if (r < 0) return r;
  if (!exists || epoch == 0 || epoch != h.sealed_epoch) return -ERR_STALE;  // 0: never sealed
  if (h.has_end) return h.view_end == end ? 0 : -EINVAL;
  if (h.has_max && h.max_pos >= end) return -EINVAL;
  h.has_end = true;
  h.view_end = end;
  return write_header(hctx, h, true);
}

// max_position: u64 epoch -> u8 has_max, u64 max_pos
int zlog_max_position(cls_method_context_t hctx, bufferlist* in, bufferlist* out) {
  Decoder d(in->c_str(), in->length());
  uint64_t epoch = d.u64();
  if (!d.done()) return -EINVAL;

  DataHeader h;
  bool exists;
  int r = read_header_at(hctx, epoch, &h, &exists);
  if (r < 0) return r;
  put_u8(*out, h.has_max ? 1 : 0);
  put_u64(*out, h.max_pos);
  return 0;
}

// read_range: u64 epoch, u64 first, u64 last (inclusive), u32 max_entries,
// u32 max_bytes -> u64 trim_below, u8 has_max, u64 max_pos, u64 next,
// u32 n, n x (u64 pos, u8 state, u64 epoch, u32 len, data).
// Every position in [first, next) held by this object and >= trim_below that
// is not listed is unwritten; the caller resumes at `next`.
int zlog_read_range(cls_method_context_t hctx, bufferlist* in, bufferlist* out) {
  Decoder d(in->c_str(), in->length());
  uint64_t epoch = d.u64();
  uint64_t first = d.u64();
  uint64_t last = d.u64();
  uint32_t max_entries = d.u32();
  uint32_t max_bytes = d.u32();
  if (!d.done() || last < first || last > kMaxPosition || max_entries == 0 || max_entries > kMaxRangeEntries ||
      max_bytes == 0 || max_bytes > kMaxRangeBytes)
    return -EINVAL;

  DataHeader h;
  bool exists;
  int r = read_header_at(hctx, epoch, &h, &exists);
  if (r < 0) return r;

  bufferlist body;
  uint32_t n = 0;
  uint64_t bytes = 0;
  uint64_t next = last + 1;
  uint64_t start = first < h.trim_below ? h.trim_below : first;
  if (exists && start <= last) {
    std::string after = start == 0 ? std::string() : pos_key(start - 1);
    const std::string end_key = pos_key(last);
    bool more = true;
    bool stop = false;
    while (more && !stop) {
      std::map<std::string, bufferlist> vals;
      r = cls_cxx_map_get_vals(hctx, after, "", max_entries - n, &vals, &more);
      if (r < 0) return r;
      if (vals.empty()) break;
      for (auto& kv : vals) {
        if (kv.first > end_key) {
          stop = true;
          break;
        }
        uint64_t pos = std::stoull(kv.first, nullptr, 16);
        Entry e;
        if (!parse_entry(kv.second, &e)) return -EIO;
        if (n > 0 && bytes + e.len > max_bytes) {
          next = pos;
          stop = true;
          break;
        }
        put_u64(body, pos);
        put_u8(body, e.state);
        put_u64(body, e.epoch);
        put_bytes(body, e.data, e.len);
        bytes += e.len;
        n++;
        after = kv.first;
        if (n == max_entries) {
          next = pos + 1;
          stop = true;
          break;
        }
      }
    }
  }
  put_u64(*out, h.trim_below);
  put_u8(*out, h.has_max ? 1 : 0);
  put_u64(*out, h.max_pos);
  put_u64(*out, next);
  put_u32(*out, n);
  out->append(body);
  return 0;
}

// stat: (empty) -> u64 sealed_epoch, u8 has_max, u64 max_pos, u64 trim_below,
// u8 has_end, u64 view_end.
// No epoch check: it only reports, and tools need it to pick a new epoch.
int zlog_stat(cls_method_context_t hctx, bufferlist* in, bufferlist* out) {
  if (in->length() != 0) return -EINVAL;
  DataHeader h;
  bool exists;
  int r = read_header(hctx, &h, &exists);
  if (r < 0) return r;
  if (!exists) return -ENOENT;
  put_u64(*out, h.sealed_epoch);
  put_u8(*out, h.has_max ? 1 : 0);
  put_u64(*out, h.max_pos);
  put_u64(*out, h.trim_below);
  put_u8(*out, h.has_end ? 1 : 0);
  put_u64(*out, h.view_end);
  return 0;
}

// ------------------------------------------------------------ metadata objects
//
// Stored as the object's data: u8 version, u64 epoch, u32 config_len, config,
// u32 nviews, nviews x (u64 epoch, u64 start, u32 width), and in version 2
// u64 seqr_epoch, u32 seqr_len, seqr: the sequencer that took the log over at
// seqr_epoch (its address, opaque to the class). Version 1 (no sequencer) is
// still written while none is recorded. meta_get returns exactly these bytes.
// The config is opaque to the class (the client's JSON).

struct View {
  uint64_t epoch;
  uint64_t start;
  uint32_t width;
};

struct Meta {
  uint64_t epoch = 0;
  std::string config;
  std::vector<View> views;
  uint64_t seqr_epoch = 0;
  std::string seqr;  // empty: no sequencer recorded
};

constexpr uint8_t kMetaVersion = 1;
constexpr uint8_t kMetaVersionSeqr = 2;
constexpr uint32_t kMaxSeqrBytes = 255;

// Loads and validates the metadata; `raw` (optional) receives the stored bytes.
int load_meta(cls_method_context_t hctx, Meta* m, bufferlist* raw = nullptr) {
  uint64_t size;
  time_t mtime;
  int r = cls_cxx_stat(hctx, &size, &mtime);
  if (r < 0) return r;  // -ENOENT: the log does not exist
  bufferlist bl;
  r = cls_cxx_read(hctx, 0, static_cast<int>(size), &bl);
  if (r < 0) return r;
  Decoder d(bl.c_str(), bl.length());
  uint8_t ver = d.u8();
  m->epoch = d.u64();
  uint32_t clen = d.u32();
  const char* c = d.bytes(clen);
  uint32_t nviews = d.u32();
  if (!d.ok() || (ver != kMetaVersion && ver != kMetaVersionSeqr) || nviews == 0 ||
      nviews > kMaxViews)
    return -EIO;
  m->config.assign(c, clen);
  m->views.clear();
  if (raw) *raw = bl;
  for (uint32_t i = 0; i < nviews; i++) {
    View v;
    v.epoch = d.u64();
    v.start = d.u64();
    v.width = d.u32();
    m->views.push_back(v);
  }
  m->seqr_epoch = 0;
  m->seqr.clear();
  if (ver == kMetaVersionSeqr) {
    m->seqr_epoch = d.u64();
    uint32_t slen = d.u32();
    const char* sq = d.bytes(slen);
    if (d.ok()) m->seqr.assign(sq, slen);
  }
  if (!d.done()) {
    cls_log(0, "zlog: corrupt metadata object");
    return -EIO;
  }
  return 0;
}

int store_meta(cls_method_context_t hctx, const Meta& m) {
  bufferlist bl;
  put_u8(bl, m.seqr.empty() ? kMetaVersion : kMetaVersionSeqr);
  put_u64(bl, m.epoch);
  put_bytes(bl, m.config.data(), static_cast<uint32_t>(m.config.size()));
  put_u32(bl, static_cast<uint32_t>(m.views.size()));
  for (const View& v : m.views) {
    put_u64(bl, v.epoch);
    put_u64(bl, v.start);
    put_u32(bl, v.width);
  }
  if (!m.seqr.empty()) {
    put_u64(bl, m.seqr_epoch);
    put_bytes(bl, m.seqr.data(), static_cast<uint32_t>(m.seqr.size()));
  }
  return cls_cxx_write_full(hctx, &bl);
}

// meta_create: u32 width, u32 config_len, config. Exclusive.
int zlog_meta_create(cls_method_context_t hctx, bufferlist* in, bufferlist*) {
  Decoder d(in->c_str(), in->length());
  uint32_t width = d.u32();
  uint32_t clen = d.u32();
  const char* c = d.bytes(clen);
  if (!d.done() || width == 0 || width > kMaxWidth || clen > kMaxConfigBytes) return -EINVAL;
  int r = cls_cxx_create(hctx, true);
  if (r < 0) return r;  // -EEXIST
  Meta m;
  m.epoch = 1;
  m.config.assign(c, clen);
  m.views.push_back(View{1, 0, width});
  return store_meta(hctx, m);
}

// meta_get: (empty) -> the stored metadata bytes.
int zlog_meta_get(cls_method_context_t hctx, bufferlist* in, bufferlist* out) {
  if (in->length() != 0) return -EINVAL;
  Meta m;
  return load_meta(hctx, &m, out);
}

// The optional tail of meta_new_epoch and meta_propose_view: u32 seqr_len,
// seqr (1..kMaxSeqrBytes): the sequencer taking the log over at the new
// epoch. Absent, the recorded sequencer stays as it is.
bool decode_seqr(Decoder& d, bool* present, std::string* seqr) {
  *present = d.ok() && !d.done();
  if (!*present) return d.ok();
  uint32_t slen = d.u32();
  const char* sq = d.bytes(slen);
  if (!d.done() || slen == 0 || slen > kMaxSeqrBytes) return false;
  seqr->assign(sq, slen);
  return true;
}

void take_over(Meta* m, bool present, const std::string& seqr, uint64_t epoch) {
  if (!present) return;
  m->seqr = seqr;
  m->seqr_epoch = epoch;
}

// meta_new_epoch: u64 expected, u64 new_epoch [, u32 seqr_len, seqr].
// Compare-and-swap on the epoch.
int zlog_meta_new_epoch(cls_method_context_t hctx, bufferlist* in, bufferlist*) {
  Decoder d(in->c_str(), in->length());
  uint64_t expected = d.u64();
  uint64_t next = d.u64();
  bool has_seqr;
  std::string seqr;
  if (!decode_seqr(d, &has_seqr, &seqr) || next <= expected || next > kMaxEpoch) return -EINVAL;
  Meta m;
  int r = load_meta(hctx, &m);
  if (r < 0) return r;
  if (m.epoch != expected) return -ERR_CAS_LOST;
  m.epoch = next;
  take_over(&m, has_seqr, seqr, next);
  return store_meta(hctx, m);
}

// meta_propose_view: u64 expected, u64 new_epoch, u64 start, u32 width
// [, u32 seqr_len, seqr]. Installs a view valid from `start` at `new_epoch` if
// the epoch is still `expected`; a second proposer at the same epoch loses
// with ECANCELED.
int zlog_meta_propose_view(cls_method_context_t hctx, bufferlist* in, bufferlist*) {
  Decoder d(in->c_str(), in->length());
  uint64_t expected = d.u64();
  uint64_t next = d.u64();
  uint64_t start = d.u64();
  uint32_t width = d.u32();
  bool has_seqr;
  std::string seqr;
  if (!decode_seqr(d, &has_seqr, &seqr) || next <= expected || next > kMaxEpoch || start > kMaxPosition || width == 0 ||
      width > kMaxWidth)
    return -EINVAL;
  Meta m;
  int r = load_meta(hctx, &m);
  if (r < 0) return r;
  if (m.epoch != expected) return -ERR_CAS_LOST;
  if (start < m.views.back().start) return -EINVAL;
  if (m.views.size() >= kMaxViews) return -ENOSPC;
  m.epoch = next;
  m.views.push_back(View{next, start, width});
  take_over(&m, has_seqr, seqr, next);
  return store_meta(hctx, m);
}

}  // namespace

void __cls_init() {
  cls_handle_t h;
  cls_method_handle_t mh;
  cls_log(0, "loading cls_zlog (max entry %" PRIu64 " bytes)", kMaxEntryBytes);
  cls_register("zlog", &h);
  cls_register_cxx_method(h, "write", CLS_METHOD_RD | CLS_METHOD_WR, zlog_write, &mh);
  cls_register_cxx_method(h, "write_many", CLS_METHOD_RD | CLS_METHOD_WR, zlog_write_many, &mh);
  cls_register_cxx_method(h, "read", CLS_METHOD_RD, zlog_read, &mh);
  cls_register_cxx_method(h, "read_range", CLS_METHOD_RD, zlog_read_range, &mh);
  cls_register_cxx_method(h, "fill", CLS_METHOD_RD | CLS_METHOD_WR, zlog_fill, &mh);
  cls_register_cxx_method(h, "trim", CLS_METHOD_RD | CLS_METHOD_WR, zlog_trim, &mh);
  cls_register_cxx_method(h, "trim_to", CLS_METHOD_RD | CLS_METHOD_WR, zlog_trim_to, &mh);
  cls_register_cxx_method(h, "seal", CLS_METHOD_RD | CLS_METHOD_WR, zlog_seal, &mh);
  cls_register_cxx_method(h, "close", CLS_METHOD_RD | CLS_METHOD_WR, zlog_close, &mh);
  cls_register_cxx_method(h, "max_position", CLS_METHOD_RD, zlog_max_position, &mh);
  cls_register_cxx_method(h, "stat", CLS_METHOD_RD, zlog_stat, &mh);
  cls_register_cxx_method(h, "meta_create", CLS_METHOD_RD | CLS_METHOD_WR, zlog_meta_create, &mh);
  cls_register_cxx_method(h, "meta_get", CLS_METHOD_RD, zlog_meta_get, &mh);
  cls_register_cxx_method(h, "meta_new_epoch", CLS_METHOD_RD | CLS_METHOD_WR,
                          zlog_meta_new_epoch, &mh);
  cls_register_cxx_method(h, "meta_propose_view", CLS_METHOD_RD | CLS_METHOD_WR,
                          zlog_meta_propose_view, &mh);
}
