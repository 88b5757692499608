// Little-endian fixed-layout request/response encoding shared by every method.
// Python builds the same layouts with struct.pack; see docs/cls_zlog.md.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include <rados/buffer.h>

namespace zlog_wire {

// Reads fixed-width fields from a contiguous buffer. Any read past the end
// sets `ok` false and yields zeros, so a method checks once at the end and a
// truncated request can never read out of bounds.
class Decoder {
 public:
  Decoder(const char* data, size_t len) : p_(data), end_(data + len) {}

  uint8_t u8() { return get<uint8_t>(); }
  uint32_t u32() { return get<uint32_t>(); }
  uint64_t u64() { return get<uint64_t>(); }

  // Returns a pointer to `len` bytes inside the buffer, or nullptr.
  const char* bytes(uint32_t len) {
    if (!ok_ || static_cast<size_t>(end_ - p_) < len) {
      ok_ = false;
      return nullptr;
    }
    const char* r = p_;
    p_ += len;
    return r;
  }

  bool ok() const { return ok_; }
  // True when every byte was consumed and no read overran: trailing garbage
  // is as malformed as a short buffer.
  bool done() const { return ok_ && p_ == end_; }

 private:
  template <typename T>
  T get() {
    T v = 0;
    if (!ok_ || static_cast<size_t>(end_ - p_) < sizeof(T)) {
      ok_ = false;
      return 0;
    }
    std::memcpy(&v, p_, sizeof(T));  // x86-64 and aarch64 are little-endian
    p_ += sizeof(T);
    return v;
  }

  const char* p_;
  const char* end_;
  bool ok_ = true;
};

inline void put_u8(ceph::bufferlist& bl, uint8_t v) { bl.append(reinterpret_cast<const char*>(&v), 1); }
inline void put_u32(ceph::bufferlist& bl, uint32_t v) { bl.append(reinterpret_cast<const char*>(&v), 4); }
inline void put_u64(ceph::bufferlist& bl, uint64_t v) { bl.append(reinterpret_cast<const char*>(&v), 8); }
inline void put_bytes(ceph::bufferlist& bl, const char* p, uint32_t len) {
  put_u32(bl, len);
  if (len) bl.append(p, len);
}

}  // namespace zlog_wire
