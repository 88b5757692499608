// How a data object keeps its positions: the two formats behind one
// interface, so that the log's rules (write-once, fill kinds, trim, seal,
// view end) are written once, in cls_zlog.cc, for both. docs/storage.md has
// the formats and why the data format is the default.
//
//  - OmapStore (ZLOG_FORMAT_OMAP): round 2's. One omap entry per position,
//    keyed by its 16-digit hex position (key order = position order): u8
//    state, u64 epoch, data. The header in the omap header.
//  - DataStore (ZLOG_FORMAT_DATA): everything in the object's data, which
//    Ceph counts (pool usage, quotas). A 128-byte header, then an index of
//    `slots` 16-byte slots (runs of `unit` consecutive positions, one run in
//    every `width`: base .. base + unit - 1, then base + width * unit, ...;
//    unit 1 is base, base + width, ...), then the
//    entries' bytes, appended in the order they are written, so the entries
//    of a range are mostly one extent. The object is made by init (with its
//    geometry), never by a write; it holds at most `slots` positions, and
//    takes no entry once it holds `byte_bound` bytes of them (the write that
//    crosses the bound is stored whole); its unwritten positions then read
//    as filled.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "objclass_api.h"
#include "ops.h"

namespace zlog_cls {

using ceph::bufferlist;

// What every object's header says, whatever its format.
struct Header {
  uint64_t sealed_epoch = 0;
  bool has_max = false;
  uint64_t max_pos = 0;
  uint64_t trim_below = 0;  // every position < trim_below is trimmed
  // Set by close (a reconfiguration): positions >= view_end belong to a later
  // view, so no client, however stale its view history, can store one here.
  bool has_end = false;
  uint64_t view_end = 0;
  // the data format's geometry and counts
  uint64_t base = 0;
  uint32_t width = 1, slots = 0;
  uint32_t unit = 1;  // consecutive positions per run (slots is a multiple of it)
  uint64_t byte_bound = 0;
  uint64_t data_end = 0;  // where the next entry's bytes go
  uint64_t entries = 0, bytes = 0;
};

// One stored position.
struct Entry {
  uint8_t state = 0;  // 0: unwritten
  uint64_t epoch = 0;
  bool lost = false;  // a filled position a reader filled as lost
  uint32_t len = 0;   // data bytes (written entries)
  uint64_t offset = 0;  // DataStore: where its bytes are
};

// An entry to store.
struct NewEntry {
  uint64_t pos;
  uint8_t state;
  uint64_t epoch;
  bool lost;
  const char* data;
  uint32_t len;
};

// A range read's result: entries in position order, their data back to back.
struct Listed {
  std::vector<std::pair<uint64_t, Entry>> entries;
  bufferlist data;   // every listed entry's data, in order
  uint64_t next = 0;  // the first position not accounted for
};

class Store {
 public:
  virtual ~Store() = default;
  // Loads the header; exists=false for an object that does not exist (or
  // holds nothing). An object with contents and no usable header is
  // corrupt: ZLOG_ERR_CORRUPT. `write_path`: the caller is about to store
  // (OmapStore skips a stat there).
  virtual int load(bool write_path) = 0;
  // Writes the header back (creating the object, for the omap format).
  virtual int save() = 0;
  // The entry at `pos` (state 0: unwritten), its bytes in *data if asked.
  virtual int get(uint64_t pos, Entry* e, bufferlist* data) = 0;
  // Stores entries whose positions were checked free (or are to be trimmed).
  virtual int put(const std::vector<NewEntry>& entries) = 0;
  // Drops what trim_to made unreachable (header.trim_below is already raised).
  virtual int drop_trimmed() = 0;
  // Entries in [first, last], up to max_entries and max_bytes of data (at
  // least one entry when one exists).
  virtual int list(uint64_t first, uint64_t last, uint32_t max_entries, uint32_t max_bytes, Listed* out) = 0;
  // The entries at `positions` (ascending, held, not below the trim
  // watermark) that are written or filled, as list() lists them (a lost
  // fill's data is its mark byte); unwritten ones are left out.
  virtual int get_many(const std::vector<uint64_t>& positions, Listed* out);
  // Whether `pos` belongs to this object (the data format knows its slots).
  virtual bool holds(uint64_t pos) const { return true; }
  // Whether the object takes no more entries (the data format's byte bound
  // is reached). A full object's unwritten positions read as filled: no
  // write can ever store one, so a reader must not wait for it.
  virtual bool full() const { return false; }
  virtual uint8_t format() const = 0;
  // An operator's repair (zlog repair): rebuilds a header that is missing,
  // empty or unparsable from the entries the object holds, with what the
  // log's metadata knows (`want`: the sealed epoch, trim point, view end
  // and, for the data format, the geometry). -EEXIST if the header is
  // usable, -ENOENT if the object holds nothing, -EIO if an entry is
  // damaged too (nothing is changed then), -EINVAL if an entry lies past
  // the view's end.
  virtual int repair(const Header& want) = 0;

  Header h;
  bool exists = false;

 protected:
  explicit Store(cls_method_context_t hctx) : hctx_(hctx) {}
  cls_method_context_t hctx_;
};

class OmapStore : public Store {
 public:
  explicit OmapStore(cls_method_context_t hctx) : Store(hctx) {}
  int load(bool write_path) override;
  int save() override;
  int get(uint64_t pos, Entry* e, bufferlist* data) override;
  int put(const std::vector<NewEntry>& entries) override;
  int drop_trimmed() override;
  int list(uint64_t first, uint64_t last, uint32_t max_entries, uint32_t max_bytes, Listed* out) override;
  uint8_t format() const override { return ZLOG_FORMAT_OMAP; }
  int repair(const Header& want) override;

 private:
  int check_headerless();
};

class DataStore : public Store {
 public:
  explicit DataStore(cls_method_context_t hctx) : Store(hctx) {}
  int load(bool write_path) override;
  int save() override;
  int get(uint64_t pos, Entry* e, bufferlist* data) override;
  int put(const std::vector<NewEntry>& entries) override;
  int drop_trimmed() override;
  int list(uint64_t first, uint64_t last, uint32_t max_entries, uint32_t max_bytes, Listed* out) override;
  int get_many(const std::vector<uint64_t>& positions, Listed* out) override;
  bool holds(uint64_t pos) const override;
  bool full() const override;
  // An unwritten position that can never be written here: the object is
  // full. Not one at or past a closed view's end: that belongs to the next
  // view, where it may hold an entry (a reader whose newest view is this
  // one, between a reconfiguration's close and its new view, reads it here).
  bool bound_filled(uint64_t pos) const { return full() && !(h.has_end && pos >= h.view_end); }
  uint8_t format() const override { return ZLOG_FORMAT_DATA; }
  int repair(const Header& want) override;

  // Creates the object with its geometry, sealed at `epoch`; an object that
  // exists with the same geometry is left as it is.
  int init(uint64_t epoch, uint64_t base, uint32_t width, uint32_t slots, uint64_t byte_bound, uint32_t unit);
  // Whether a geometry is one this class keeps (zlog_geometry_ok).
  static bool geometry_ok(uint32_t width, uint32_t slots, uint64_t byte_bound, uint32_t unit);

  static constexpr uint32_t kHeaderBytes = 128;
  static constexpr uint32_t kSlotBytes = 16;

 private:
  // position <-> slot: run (slot / unit) of the object is the object's
  // (width * run)-th run of the stripe (zlog_slot_of in ops.h)
  uint64_t slot_of(uint64_t pos) const { return zlog_slot_of(pos - h.base, h.width, h.unit); }
  uint64_t pos_of(uint64_t slot) const { return h.base + zlog_offset_of(slot, h.width, h.unit); }
  uint64_t top() const { return pos_of(h.slots - 1); }  // the last position it holds
  uint64_t index_at(uint64_t slot) const { return kHeaderBytes + slot * kSlotBytes; }
  uint64_t data_start() const { return kHeaderBytes + uint64_t(h.slots) * kSlotBytes; }
  // Reads slots [first, first + n) (unwritten ones read as zero).
  int read_slots(uint64_t first, uint64_t n, std::string* out);
  // Whether the 128 header bytes at p parse (into h).
  bool parse_header(const char* p);
  // Whether a slot's bytes can be what put() wrote: an unwritten slot is all
  // zero, a written one's bytes lie in the entries' area, a gap has none.
  bool valid_slot(const char* raw, const Entry& e, uint64_t data_end) const;
};

}  // namespace zlog_cls
