// The two formats of a data object: see store.h.
#include "store.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace zlog_cls {

namespace {

void put_le(char* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint64_t get_le(const char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// Is there anything in the object besides what a header would be? (stat and
// one omap key: the object's contents at a glance)
int holds_anything(cls_method_context_t hctx, uint64_t* size, bool* omap) {
  time_t mtime;
  int r = cls_cxx_stat(hctx, size, &mtime);
  if (r < 0) return r;
  std::map<std::string, bufferlist> vals;
  bool more = false;
  r = cls_cxx_map_get_vals(hctx, "", "", 1, &vals, &more);
  if (r < 0) return r;
  *omap = !vals.empty();
  return 0;
}

}  // namespace

// ================================================================ omap format

namespace {

constexpr uint8_t kOmapHeaderVersion = 2;  // version 1 (no view end) is still read
constexpr unsigned kEntryHead = 9;         // u8 state, u64 epoch, then the data

std::string pos_key(uint64_t pos) {
  char buf[17];
  snprintf(buf, sizeof(buf), "%016" PRIx64, pos);
  return std::string(buf, 16);
}

int decode_omap_header(bufferlist& bl, Header* h) {
  *h = Header{};
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
  if (!zr_done(&r) || ver < 1 || ver > kOmapHeaderVersion) {
    cls_log(0, "zlog: corrupt data object header (%u bytes, version %u): refusing every call on it",
            bl.length(), ver);
    return -ZLOG_ERR_CORRUPT;
  }
  return 0;
}

bool parse_omap_entry(bufferlist& bl, Entry* e) {
  if (bl.length() < kEntryHead) return false;
  zw_reader r = zw_reader_of(bl.c_str(), kEntryHead);
  e->state = zr_u8(&r);
  e->epoch = zr_u64(&r);
  e->len = bl.length() - kEntryHead;
  // a filled position's one data byte says a reader filled it as lost
  e->lost = e->state == ZLOG_FILLED && e->len == 1 && bl[kEntryHead] == ZLOG_FILL_LOST;
  return e->state >= ZLOG_WRITTEN && e->state <= ZLOG_TRIMMED;
}

bufferlist make_omap_entry(const NewEntry& n) {
  char head[kEntryHead];
  head[0] = static_cast<char>(n.state);
  put_le(head + 1, n.epoch, 8);
  bufferlist bl;
  bl.append(head, kEntryHead);
  if (n.state == ZLOG_FILLED && n.lost) {
    const char lost = static_cast<char>(ZLOG_FILL_LOST);
    bl.append(&lost, 1);
  } else if (n.state == ZLOG_WRITTEN && n.len) {
    bl.append(n.data, n.len);
  }
  return bl;
}

}  // namespace

// An object without a header is new only if it holds nothing at all: one
// with entries (or any omap or data) whose header is gone is corrupt, never
// new. Taking it for new would let a write overwrite an acknowledged entry
// and forget its seal (issue 28). Called only when the header is missing.
int OmapStore::check_headerless() {
  uint64_t size = 0;
  bool omap = false;
  int r = holds_anything(hctx_, &size, &omap);
  if (r == -ENOENT) return 0;
  if (r < 0) return r;
  if (size == 0 && !omap) return 0;
  cls_log(0, "zlog: data object holds %s but has no header: corrupt; refusing every call on it until an "
          "operator repairs it (zlog check --deep, docs/cls_zlog.md)", omap ? "entries" : "data");
  return -ZLOG_ERR_CORRUPT;
}

int OmapStore::load(bool write_path) {
  h = Header{};
  exists = false;
  if (!write_path) {  // readers learn whether it exists (an append need not)
    uint64_t size;
    time_t mtime;
    int r = cls_cxx_stat(hctx_, &size, &mtime);
    if (r == -ENOENT) return 0;
    if (r < 0) return r;
  }
  bufferlist bl;
  int r = cls_cxx_map_read_header(hctx_, &bl);
  if (r == -ENOENT) return 0;
  if (r < 0) return r;
  exists = true;  // (on the write path: maybe; setting omap values creates it anyway)
  if (bl.length() == 0) return check_headerless();
  return decode_omap_header(bl, &h);
}

int OmapStore::save() {
  if (!exists) {
    int r = cls_cxx_create(hctx_, false);
    if (r < 0) return r;
    exists = true;
  }
  zw_writer w{};
  zw_u8(&w, kOmapHeaderVersion);
  zw_u64(&w, h.sealed_epoch);
  zw_u8(&w, h.has_max ? 1 : 0);
  zw_u64(&w, h.max_pos);
  zw_u64(&w, h.trim_below);
  zw_u8(&w, h.has_end ? 1 : 0);
  zw_u64(&w, h.view_end);
  bufferlist bl;
  bl.append(w.p, static_cast<unsigned>(w.len));
  zw_free(&w);
  return cls_cxx_map_write_header(hctx_, &bl);
}

int OmapStore::get(uint64_t pos, Entry* e, bufferlist* data) {
  *e = Entry{};
  bufferlist bl;
  int r = cls_cxx_map_get_val(hctx_, pos_key(pos), &bl);
  if (r == -ENOENT) return 0;
  if (r < 0) return r;
  if (!parse_omap_entry(bl, e)) {
    cls_log(0, "zlog: corrupt entry at %" PRIu64, pos);
    return -ZLOG_ERR_CORRUPT;
  }
  if (data && e->state == ZLOG_WRITTEN) data->substr_of(bl, kEntryHead, e->len);
  return 0;
}

int OmapStore::put(const std::vector<NewEntry>& entries) {
  if (entries.size() == 1) {
    bufferlist val = make_omap_entry(entries[0]);
    return cls_cxx_map_set_val(hctx_, pos_key(entries[0].pos), &val);
  }
  std::map<std::string, bufferlist> vals;
  for (const NewEntry& n : entries) vals.emplace(pos_key(n.pos), make_omap_entry(n));
  return cls_cxx_map_set_vals(hctx_, &vals);
}

int OmapStore::drop_trimmed() {
  if (!exists || h.trim_below == 0) return 0;
  return cls_cxx_map_remove_range(hctx_, pos_key(0), pos_key(h.trim_below));
}

int OmapStore::list(uint64_t first, uint64_t last, uint32_t max_entries, uint32_t max_bytes, Listed* out) {
  out->next = last + 1;
  const uint64_t start = first < h.trim_below ? h.trim_below : first;
  if (!exists || start > last) return 0;
  std::string after = start == 0 ? std::string() : pos_key(start - 1);
  const std::string end_key = pos_key(last);
  uint64_t bytes = 0;
  bool more = true;
  while (more) {
    std::map<std::string, bufferlist> vals;
    int r = cls_cxx_map_get_vals(hctx_, after, "", max_entries - out->entries.size(), &vals, &more);
    if (r < 0) return r;
    if (vals.empty()) break;
    for (auto& kv : vals) {
      if (kv.first > end_key) return 0;
      uint64_t pos = std::stoull(kv.first, nullptr, 16);
      Entry e;
      if (!parse_omap_entry(kv.second, &e)) {
        cls_log(0, "zlog: corrupt entry at %" PRIu64, pos);
        return -ZLOG_ERR_CORRUPT;
      }
      // a lost fill's one byte is its data, as round 2 sent it (readers tell LOST by it)
      const uint32_t len = e.state == ZLOG_WRITTEN || e.lost ? e.len : 0;
      if (!out->entries.empty() && bytes + len > max_bytes) {
        out->next = pos;
        return 0;
      }
      if (len) {
        bufferlist data;
        data.substr_of(kv.second, kEntryHead, len);  // shared, not copied
        out->data.claim_append(data);
      }
      e.len = len;
      out->entries.emplace_back(pos, e);
      bytes += len;
      after = kv.first;
      if (out->entries.size() == max_entries) {
        out->next = pos + 1;
        return 0;
      }
    }
  }
  return 0;
}

// Whether an entry that is not trimmed lies at or past a closed view's end
// (close refuses such an end; trimmed entries past it are allowed there).
static bool stored_past_end(const Header& want, bool any, uint64_t top) {
  return want.has_end && any && top >= std::max(want.view_end, want.trim_below);
}

// repair's part common to both formats: the seal, trim point and view end
// from the log's metadata (`want`), the max position from the highest entry
// (`any`, `top`) raised to the trim point as trim_to leaves it.
static void rebuild_header(const Header& want, bool any, uint64_t top, Header* h) {
  h->sealed_epoch = want.sealed_epoch;
  h->trim_below = want.trim_below;
  h->has_end = want.has_end;
  h->view_end = want.view_end;
  h->has_max = any;
  h->max_pos = top;
  if (h->has_end && h->has_max && h->max_pos >= h->view_end) {
    // only trimmed entries lie past the end (the caller checked): the max
    // comes down below it, as close left it
    h->has_max = h->view_end > 0;
    h->max_pos = h->has_max ? h->view_end - 1 : 0;
  }
  if (h->trim_below > 0 && (!h->has_end || h->view_end > 0)) {
    const uint64_t t = h->has_end ? std::min(h->trim_below - 1, h->view_end - 1) : h->trim_below - 1;
    if (!h->has_max || t > h->max_pos) {
      h->has_max = true;
      h->max_pos = t;
    }
  }
}

// Rebuilds a lost header: the highest position from the entries (every one
// must parse), the rest from what the log's metadata says (`want`).
int OmapStore::repair(const Header& want) {
  bufferlist bl;
  int r = cls_cxx_map_read_header(hctx_, &bl);
  if (r < 0) return r;  // -ENOENT: no object
  Header parsed;
  if (bl.length() && decode_omap_header(bl, &parsed) == 0) return -EEXIST;
  bool any = false;
  uint64_t top = 0;
  std::string after;
  for (bool more = true; more;) {
    std::map<std::string, bufferlist> vals;
    if ((r = cls_cxx_map_get_vals(hctx_, after, "", 1024, &vals, &more)) < 0) return r;
    for (auto& kv : vals) {
      Entry e;
      char* end = nullptr;
      const uint64_t pos = strtoull(kv.first.c_str(), &end, 16);
      if (kv.first.size() != 16 || end != kv.first.c_str() + 16 || !parse_omap_entry(kv.second, &e)) {
        cls_log(0, "zlog: repair: the entry under key '%s' is damaged too: not repairing", kv.first.c_str());
        return -ZLOG_ERR_CORRUPT;
      }
      any = true;
      top = std::max(top, pos);
      after = kv.first;
    }
    if (vals.empty()) break;
  }
  uint64_t size = 0;
  time_t mtime;
  if ((r = cls_cxx_stat(hctx_, &size, &mtime)) < 0) return r;
  if (size > 0) return -EINVAL;  // an omap-format object has no data: this is another format's
  if (!any && bl.length() == 0) return -ENOENT;  // holds nothing: the initial state, nothing to repair
  if (stored_past_end(want, any, top)) return -EINVAL;
  h = Header{};
  rebuild_header(want, any, top, &h);
  exists = true;
  cls_log(0, "zlog: repair: header rebuilt (sealed epoch %" PRIu64 ", max %s%" PRIu64 ")", h.sealed_epoch,
          h.has_max ? "" : "none ", h.max_pos);
  return save();
}

// ================================================================ data format

namespace {

constexpr char kMagic[4] = {'Z', 'L', 'G', '3'};
constexpr uint8_t kDataHeaderVersion = 3;
// An object with a unit above 1: an older class build must not take it for
// unit 1 (it would put positions in the wrong slots), so it finds no header
// it knows and refuses every call (as corrupt) instead.
constexpr uint8_t kDataHeaderVersionUnit = 4;
constexpr uint32_t kMaxSlots = 1u << 22;
constexpr uint64_t kMaxByteBound = 1ull << 31;
constexpr uint32_t kLenMask = (1u << 28) - 1;

void encode_slot(char* p, const Entry& e) {
  put_le(p, e.epoch, 8);
  put_le(p + 8, e.offset, 4);
  const uint32_t word = (e.len & kLenMask) | (uint32_t(e.state & 3) << 28) | (e.lost ? 1u << 30 : 0);
  put_le(p + 12, word, 4);
}

Entry decode_slot(const char* p) {
  Entry e;
  e.epoch = get_le(p, 8);
  e.offset = get_le(p + 8, 4);
  const uint32_t word = static_cast<uint32_t>(get_le(p + 12, 4));
  e.len = word & kLenMask;
  e.state = (word >> 28) & 3;
  e.lost = (word >> 30) & 1;
  return e;
}

}  // namespace

bool DataStore::holds(uint64_t pos) const {
  return pos >= h.base && zlog_object_holds(pos - h.base, h.width, h.unit) && slot_of(pos) < h.slots;
}

bool DataStore::geometry_ok(uint32_t width, uint32_t slots, uint64_t byte_bound, uint32_t unit) {
  return zlog_geometry_ok(width, slots, unit) && slots <= kMaxSlots && byte_bound != 0 &&
         byte_bound <= kMaxByteBound;
}

bool DataStore::full() const { return exists && h.data_end >= data_start() + h.byte_bound; }

bool DataStore::parse_header(const char* p) {
  if (!p || memcmp(p, kMagic, 4) != 0) return false;
  const uint8_t version = static_cast<uint8_t>(p[4]);
  if (version != kDataHeaderVersion && version != kDataHeaderVersionUnit) return false;
  const uint8_t flags = static_cast<uint8_t>(p[5]);
  h.has_max = flags & 1;
  h.has_end = flags & 2;
  h.sealed_epoch = get_le(p + 8, 8);
  h.max_pos = get_le(p + 16, 8);
  h.trim_below = get_le(p + 24, 8);
  h.view_end = get_le(p + 32, 8);
  h.base = get_le(p + 40, 8);
  h.width = static_cast<uint32_t>(get_le(p + 48, 4));
  h.slots = static_cast<uint32_t>(get_le(p + 52, 4));
  h.byte_bound = get_le(p + 56, 8);
  h.data_end = get_le(p + 64, 8);
  h.entries = get_le(p + 72, 8);
  h.bytes = get_le(p + 80, 8);
  h.unit = version == kDataHeaderVersionUnit ? static_cast<uint32_t>(get_le(p + 88, 4)) : 1;
  if (version == kDataHeaderVersionUnit && h.unit < 2) return false;
  return zlog_geometry_ok(h.width, h.slots, h.unit) && h.slots <= kMaxSlots && h.data_end >= data_start();
}

bool DataStore::valid_slot(const char* raw, const Entry& e, uint64_t data_end) const {
  if (static_cast<uint8_t>(raw[15]) >> 7) return false;  // the word's top bit is never set
  switch (e.state) {
    case 0:
      for (int i = 0; i < static_cast<int>(kSlotBytes); ++i)
        if (raw[i]) return false;
      return true;
    case ZLOG_WRITTEN:
      return !e.lost && e.offset >= data_start() && e.offset + e.len <= data_end;
    case ZLOG_FILLED:
      return e.offset == 0 && e.len == 0;
    default:
      return e.offset == 0 && e.len == 0 && !e.lost;
  }
}

int DataStore::load(bool) {
  h = Header{};
  exists = false;
  uint64_t size = 0;
  bool omap = false;
  int r = holds_anything(hctx_, &size, &omap);
  if (r == -ENOENT) return 0;
  if (r < 0) return r;
  if (size == 0 && !omap) return 0;  // exists, holds nothing: not made yet
  if (size == 0) return -EINVAL;     // omap and no data: an omap-format object (a client's bug)
  bufferlist bl;
  r = size >= kHeaderBytes ? cls_cxx_read(hctx_, 0, kHeaderBytes, &bl) : 0;
  if (r < 0) return r;
  if (omap || !parse_header(bl.length() == kHeaderBytes ? bl.c_str() : nullptr)) {
    h = Header{};
    cls_log(0, "zlog: data-format object without a usable header (%" PRIu64 " bytes%s): corrupt; refusing "
            "every call on it until an operator repairs it (zlog check --deep, docs/cls_zlog.md)",
            size, omap ? ", omap entries" : "");
    return -ZLOG_ERR_CORRUPT;
  }
  // the entries' bytes end at data_end: an object shorter than that was
  // truncated, and what it lost cannot be told from unwritten
  if (h.data_end > data_start() && size < h.data_end) {
    cls_log(0, "zlog: data-format object truncated (%" PRIu64 " of %" PRIu64 " bytes): corrupt", size, h.data_end);
    h = Header{};
    return -ZLOG_ERR_CORRUPT;
  }
  exists = true;
  return 0;
}

int DataStore::save() {
  char p[kHeaderBytes];
  memset(p, 0, sizeof p);
  memcpy(p, kMagic, 4);
  p[4] = static_cast<char>(h.unit > 1 ? kDataHeaderVersionUnit : kDataHeaderVersion);
  p[5] = static_cast<char>((h.has_max ? 1 : 0) | (h.has_end ? 2 : 0));
  put_le(p + 8, h.sealed_epoch, 8);
  put_le(p + 16, h.max_pos, 8);
  put_le(p + 24, h.trim_below, 8);
  put_le(p + 32, h.view_end, 8);
  put_le(p + 40, h.base, 8);
  put_le(p + 48, h.width, 4);
  put_le(p + 52, h.slots, 4);
  put_le(p + 56, h.byte_bound, 8);
  put_le(p + 64, h.data_end, 8);
  put_le(p + 72, h.entries, 8);
  put_le(p + 80, h.bytes, 8);
  if (h.unit > 1) put_le(p + 88, h.unit, 4);
  bufferlist bl;
  bl.append(p, kHeaderBytes);
  exists = true;
  return cls_cxx_write(hctx_, 0, kHeaderBytes, &bl);
}

int DataStore::init(uint64_t epoch, uint64_t base, uint32_t width, uint32_t slots, uint64_t byte_bound,
                    uint32_t unit) {
  if (!geometry_ok(width, slots, byte_bound, unit) || base > ZLOG_MAX_POSITION) return -EINVAL;
  int r = load(false);
  if (r < 0) return r;
  if (exists)  // made already (by a writer, or sealed by a tail finder): keep it
    return h.base == base && h.width == width && h.slots == slots && h.byte_bound == byte_bound && h.unit == unit
               ? 0
               : -EINVAL;
  h = Header{};
  h.sealed_epoch = epoch;
  h.base = base;
  h.width = width;
  h.slots = slots;
  h.byte_bound = byte_bound;
  h.unit = unit;
  h.data_end = data_start();
  return save();
}

int DataStore::read_slots(uint64_t first, uint64_t n, std::string* out) {
  out->assign(n * kSlotBytes, '\0');
  bufferlist bl;
  int r = cls_cxx_read(hctx_, static_cast<int>(index_at(first)), static_cast<int>(n * kSlotBytes), &bl);
  if (r < 0) return r;
  bl.begin().copy(std::min<unsigned>(bl.length(), out->size()), &(*out)[0]);  // past the end: unwritten
  return 0;
}

int Store::get_many(const std::vector<uint64_t>& positions, Listed* out) {
  for (uint64_t pos : positions) {
    Entry e;
    bufferlist data;
    int r = get(pos, &e, &data);
    if (r < 0) return r;
    if (!e.state) continue;
    if (e.state != ZLOG_WRITTEN) {  // a lost fill's data is its one mark byte
      data.clear();
      e.len = 0;
      if (e.state == ZLOG_FILLED && e.lost) {
        const char mark = static_cast<char>(ZLOG_FILL_LOST);
        data.append(&mark, 1);
        e.len = 1;
      }
    }
    out->entries.emplace_back(pos, e);
    out->data.claim_append(data);
  }
  return 0;
}

// The bytes of `extents` ((offset, len) in the object's data; offset
// UINT64_MAX: a lost fill's mark byte) taken from `span`, the object's data
// from `start` on, appended to `out` as one buffer: a piece per entry would
// cost the OSD more in the reply (a node each, sent piece by piece) than
// copying the entries does (read_set of every tenth 150-byte entry: 1.5 ->
// 0.6 us of OSD CPU per position).
static void append_packed(bufferlist& span, uint64_t start,
                          const std::pair<uint64_t, uint32_t>* first, const std::pair<uint64_t, uint32_t>* last,
                          bufferlist* out) {
  uint64_t total = 0;
  for (auto* x = first; x != last; ++x) total += x->second;
  if (!total) return;
  ceph::bufferptr packed = ceph::buffer::create(static_cast<unsigned>(total));
  const char* base = span.length() ? span.c_str() : nullptr;  // one piece (made so if it is not)
  char* to = packed.c_str();
  for (auto* x = first; x != last; ++x) {
    if (x->first == UINT64_MAX) {
      *to = static_cast<char>(ZLOG_FILL_LOST);
    } else {
      memcpy(to, base + (x->first - start), x->second);
    }
    to += x->second;
  }
  out->append(std::move(packed));
}

// The slots of positions close together are read in one read; then the
// entries' bytes, one read per run of them lying close together (a stream's
// entries interleaved with other streams'), cut apart here: reading the few
// KiB between two entries costs the OSD less than a read op of its own.
int DataStore::get_many(const std::vector<uint64_t>& positions, Listed* out) {
  constexpr uint64_t kGap = 64;  // slots: positions further apart read their slots apart
  constexpr uint64_t kGapBytes = 4096;   // entries' bytes further apart are read apart
  constexpr uint64_t kSpanBytes = 1 << 20;  // and no read spans more than this
  const char lost_mark = static_cast<char>(ZLOG_FILL_LOST);
  std::vector<std::pair<uint64_t, uint32_t>> extents;  // (offset, len); UINT64_MAX: a lost mark
  size_t i = 0;
  const size_t n = positions.size();
  while (i < n) {
    size_t j = i + 1;
    while (j < n && slot_of(positions[j]) - slot_of(positions[j - 1]) <= kGap &&
           slot_of(positions[j]) - slot_of(positions[i]) < 4096)
      ++j;
    const uint64_t first = slot_of(positions[i]);
    std::string raw;
    int r = read_slots(first, slot_of(positions[j - 1]) - first + 1, &raw);
    if (r < 0) return r;
    for (; i < j; ++i) {
      Entry e = decode_slot(&raw[(slot_of(positions[i]) - first) * kSlotBytes]);
      if (!e.state) {
        if (!bound_filled(positions[i])) continue;
        e.state = ZLOG_FILLED;
      }
      const bool lost = e.state == ZLOG_FILLED && e.lost;
      const uint32_t len = e.state == ZLOG_WRITTEN ? e.len : (lost ? 1 : 0);
      if (len) extents.emplace_back(lost ? UINT64_MAX : e.offset, len);
      e.len = len;
      out->entries.emplace_back(positions[i], e);
    }
  }
  size_t k = 0;
  while (k < extents.size()) {
    if (extents[k].first == UINT64_MAX) {
      out->data.append(&lost_mark, 1);
      ++k;
      continue;
    }
    size_t m = k + 1;  // a run of extents in ascending order, each close to the one before
    const uint64_t start = extents[k].first;
    uint64_t end = start + extents[k].second;
    bool gaps = false;
    while (m < extents.size() && extents[m].first != UINT64_MAX && extents[m].first >= end &&
           extents[m].first - end <= kGapBytes && extents[m].first + extents[m].second - start <= kSpanBytes) {
      gaps = gaps || extents[m].first != end;
      end = extents[m].first + extents[m].second;
      ++m;
    }
    if (end > h.data_end) {
      cls_log(0, "zlog: an entry runs past the object's data: corrupt");
      return -ZLOG_ERR_CORRUPT;
    }
    bufferlist bl;
    const uint64_t len = end - start;
    int r = cls_cxx_read(hctx_, static_cast<int>(start), static_cast<int>(len), &bl);
    if (r < 0) return r;
    if (bl.length() != len) {
      cls_log(0, "zlog: an entry runs past the object's data: corrupt");
      return -ZLOG_ERR_CORRUPT;
    }
    if (!gaps) {
      out->data.claim_append(bl);
    } else {
      append_packed(bl, start, extents.data() + k, extents.data() + m, &out->data);
    }
    k = m;
  }
  return 0;
}

int DataStore::get(uint64_t pos, Entry* e, bufferlist* data) {
  *e = Entry{};
  std::string raw;
  int r = read_slots(slot_of(pos), 1, &raw);
  if (r < 0) return r;
  *e = decode_slot(raw.data());
  if (!valid_slot(raw.data(), *e, h.data_end)) {
    cls_log(0, "zlog: the slot of position %" PRIu64 " is damaged: corrupt entry", pos);
    return -ZLOG_ERR_CORRUPT;
  }
  if (!e->state && bound_filled(pos)) e->state = ZLOG_FILLED;  // never to be written now
  if (data && e->state == ZLOG_WRITTEN && e->len) {
    r = cls_cxx_read(hctx_, static_cast<int>(e->offset), static_cast<int>(e->len), data);
    if (r < 0) return r;
    if (data->length() != e->len) {
      cls_log(0, "zlog: entry at %" PRIu64 " runs past the object's data: corrupt", pos);
      return -ZLOG_ERR_CORRUPT;
    }
  }
  return 0;
}

int DataStore::put(const std::vector<NewEntry>& entries) {
  // the entries' bytes, appended in one write; then each run of adjacent
  // slots in one write
  std::vector<std::pair<uint64_t, Entry>> slots;
  bufferlist data;
  uint64_t offset = h.data_end;
  for (const NewEntry& n : entries) {
    Entry e;
    e.state = n.state;
    e.epoch = n.epoch;
    e.lost = n.lost;
    if (n.state == ZLOG_WRITTEN) {
      e.len = n.len;
      e.offset = offset;
      if (n.len) data.append(n.data, n.len);
      offset += n.len;
    }
    slots.emplace_back(slot_of(n.pos), e);
  }
  int r;
  if (data.length()) {
    r = cls_cxx_write(hctx_, static_cast<int>(h.data_end), static_cast<int>(data.length()), &data);
    if (r < 0) return r;
  }
  // counts: a trim over a written entry gives its entry and bytes back
  for (const NewEntry& n : entries) {
    if (n.state == ZLOG_WRITTEN) {
      h.entries += 1;
      h.bytes += n.len;
    } else if (n.state == ZLOG_TRIMMED) {
      Entry old;
      if ((r = get(n.pos, &old, nullptr)) < 0) return r;
      if (old.state == ZLOG_WRITTEN) {
        h.entries -= std::min<uint64_t>(h.entries, 1);
        h.bytes -= std::min<uint64_t>(h.bytes, old.len);
      }
    }
  }
  h.data_end = offset;
  std::sort(slots.begin(), slots.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t i = 0;
  while (i < slots.size()) {
    size_t j = i + 1;
    while (j < slots.size() && slots[j].first == slots[j - 1].first + 1) ++j;
    std::string raw((j - i) * kSlotBytes, '\0');
    for (size_t k = i; k < j; ++k) encode_slot(&raw[(k - i) * kSlotBytes], slots[k].second);
    bufferlist bl;
    bl.append(raw.data(), static_cast<unsigned>(raw.size()));
    r = cls_cxx_write(hctx_, static_cast<int>(index_at(slots[i].first)), static_cast<int>(raw.size()), &bl);
    if (r < 0) return r;
    i = j;
  }
  return 0;
}

int DataStore::drop_trimmed() {
  // once every position of the object is trimmed, its index and entries go:
  // the space returns to the pool (the header stays, so the object keeps
  // refusing stale requests and reports its positions trimmed)
  if (!exists || h.trim_below <= top() || h.data_end == kHeaderBytes) return 0;
  int r = cls_cxx_truncate(hctx_, kHeaderBytes);
  if (r < 0) return r;
  h.data_end = data_start();
  h.entries = h.bytes = 0;
  return 0;
}

int DataStore::list(uint64_t first, uint64_t last, uint32_t max_entries, uint32_t max_bytes, Listed* out) {
  out->next = last + 1;
  if (!exists) return 0;
  const uint64_t lo = std::max({first, h.trim_below, h.base});
  const uint64_t hi = std::min(last, top());
  if (lo > hi) return 0;
  uint64_t s = zlog_slot_of(zlog_next_held(lo - h.base, h.width, h.unit), h.width, h.unit);  // first at or after lo
  const uint64_t s_last = zlog_slot_of(zlog_prev_held(hi - h.base, h.width, h.unit), h.width, h.unit);  // last at or before hi
  if (s > s_last) return 0;
  uint64_t bytes = 0;
  std::vector<std::pair<uint64_t, uint32_t>> extents;  // (offset, len) of the data to send
  constexpr uint64_t kChunk = 1024;
  bool stop = false;
  while (s <= s_last && !stop) {
    const uint64_t n = std::min(kChunk, s_last - s + 1);
    std::string raw;
    int r = read_slots(s, n, &raw);
    if (r < 0) return r;
    for (uint64_t k = 0; k < n; ++k) {
      Entry e = decode_slot(&raw[k * kSlotBytes]);
      if (!valid_slot(&raw[k * kSlotBytes], e, h.data_end)) {
        cls_log(0, "zlog: the slot of position %" PRIu64 " is damaged: corrupt entry", pos_of(s + k));
        return -ZLOG_ERR_CORRUPT;
      }
      const uint64_t pos = pos_of(s + k);
      if (e.state == 0) {
        if (!bound_filled(pos)) continue;
        e.state = ZLOG_FILLED;  // a full object's unwritten position: listed as filled
      }
      // a lost fill's data is its one mark byte, as the omap format keeps it
      const bool lost = e.state == ZLOG_FILLED && e.lost;
      const uint32_t len = e.state == ZLOG_WRITTEN ? e.len : (lost ? 1 : 0);
      if (!out->entries.empty() && bytes + len > max_bytes) {
        out->next = pos;
        stop = true;
        break;
      }
      if (len) extents.emplace_back(lost ? UINT64_MAX : e.offset, len);
      e.len = len;
      out->entries.emplace_back(pos, e);
      bytes += len;
      if (out->entries.size() == max_entries) {
        out->next = pos + 1;
        stop = true;
        break;
      }
    }
    s += n;
  }
  // the data: entries written together lie together, so one read of the
  // span covers them; a sparse span is read entry by entry
  if (extents.empty()) return 0;
  const char lost_mark = static_cast<char>(ZLOG_FILL_LOST);
  uint64_t lo_off = UINT64_MAX, hi_off = 0;
  for (auto& [off, len] : extents) {
    if (off == UINT64_MAX) continue;  // a lost mark: no bytes in the object
    lo_off = std::min(lo_off, off);
    hi_off = std::max(hi_off, off + len);
  }
  if (lo_off == UINT64_MAX) lo_off = hi_off = 0;
  if (hi_off > h.data_end) {
    cls_log(0, "zlog: an entry runs past the object's data: corrupt");
    return -ZLOG_ERR_CORRUPT;
  }
  if (hi_off - lo_off <= 2 * bytes + 65536) {
    bufferlist span;
    if (hi_off > lo_off) {
      int r = cls_cxx_read(hctx_, static_cast<int>(lo_off), static_cast<int>(hi_off - lo_off), &span);
      if (r < 0) return r;
      if (span.length() != hi_off - lo_off) return -ZLOG_ERR_CORRUPT;
    }
    // the usual case: the entries lie back to back in position order, so the
    // span is the reply's data as it is (one buffer, not one piece per entry)
    uint64_t at = lo_off;
    bool back_to_back = true;
    for (auto& [off, len] : extents) {
      if (off != at) {  // a gap, a lost mark, or out of order
        back_to_back = false;
        break;
      }
      at += len;
    }
    if (back_to_back && at == hi_off) {
      out->data.claim_append(span);
      return 0;
    }
    append_packed(span, lo_off, extents.data(), extents.data() + extents.size(), &out->data);
  } else {
    for (auto& [off, len] : extents) {
      if (off == UINT64_MAX) {
        out->data.append(&lost_mark, 1);
        continue;
      }
      bufferlist one;
      int r = cls_cxx_read(hctx_, static_cast<int>(off), static_cast<int>(len), &one);
      if (r < 0) return r;
      if (one.length() != len) return -ZLOG_ERR_CORRUPT;
      out->data.claim_append(one);
    }
  }
  return 0;
}

// Rebuilds a lost header from the slots: the geometry comes from the
// log's metadata (`want`), the counts, the entries' end and the highest
// position from the slots, every one of which must be sound.
int DataStore::repair(const Header& want) {
  uint64_t size = 0;
  bool omap = false;
  int r = holds_anything(hctx_, &size, &omap);
  if (r < 0) return r;
  if (size == 0 && !omap) return -ENOENT;
  if (size == 0) return -EINVAL;  // an omap-format object
  if (omap) return -ZLOG_ERR_CORRUPT;  // a data-format object has none: not one of ours to rebuild
  bufferlist bl;
  if (size >= kHeaderBytes && (r = cls_cxx_read(hctx_, 0, kHeaderBytes, &bl)) < 0) return r;
  if (parse_header(bl.length() == kHeaderBytes ? bl.c_str() : nullptr)) {
    // a usable header: nothing to rebuild (a truncated object stays corrupt)
    r = load(false);
    return r < 0 ? r : -EEXIST;
  }
  if (!geometry_ok(want.width, want.slots, want.byte_bound, want.unit) || want.base > ZLOG_MAX_POSITION)
    return -EINVAL;
  h = Header{};
  h.base = want.base;
  h.width = want.width;
  h.slots = want.slots;
  h.byte_bound = want.byte_bound;
  h.unit = want.unit;
  uint64_t data_end = data_start();
  bool any = false;
  uint64_t top = 0;
  constexpr uint64_t kChunk = 1024;
  for (uint64_t s = 0; s < h.slots; s += kChunk) {
    const uint64_t n = std::min<uint64_t>(kChunk, h.slots - s);
    std::string raw;
    if ((r = read_slots(s, n, &raw)) < 0) return r;
    for (uint64_t k = 0; k < n; ++k) {
      const char* p = &raw[k * kSlotBytes];
      Entry e = decode_slot(p);
      const uint64_t pos = pos_of(s + k);
      if (!valid_slot(p, e, std::max(size, data_start()))) {  // (empty entries lie at the data's start)
        cls_log(0, "zlog: repair: the slot of position %" PRIu64 " is damaged too: not repairing", pos);
        return -ZLOG_ERR_CORRUPT;
      }
      if (!e.state) continue;
      any = true;
      top = pos;
      if (e.state == ZLOG_WRITTEN) {
        data_end = std::max(data_end, e.offset + e.len);
        h.entries += 1;
        h.bytes += e.len;
      }
    }
  }
  if (stored_past_end(want, any, top)) return -EINVAL;
  h.data_end = data_end;
  rebuild_header(want, any, top, &h);
  cls_log(0, "zlog: repair: data-format header rebuilt (%" PRIu64 " entries, sealed epoch %" PRIu64 ")", h.entries,
          h.sealed_epoch);
  return save();
}

}  // namespace zlog_cls
