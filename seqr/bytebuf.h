// A growable byte buffer that never zero-fills and keeps its capacity on
// clear(), so steady-state request handling does no allocation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

namespace seqr {

class ByteBuf {
 public:
  ByteBuf() = default;
  explicit ByteBuf(size_t cap) { reserve(cap); }
  ByteBuf(ByteBuf&&) noexcept = default;
  ByteBuf& operator=(ByteBuf&&) noexcept = default;
  ByteBuf(const ByteBuf&) = delete;
  ByteBuf& operator=(const ByteBuf&) = delete;

  // Grows the buffer by n bytes and returns a pointer to the new bytes.
  uint8_t* extend(size_t n) {
    if (size_ + n > cap_) grow(size_ + n);
    uint8_t* p = data_.get() + size_;
    size_ += n;
    return p;
  }
  void append(const void* p, size_t n) {
    if (n) std::memcpy(extend(n), p, n);
  }
  void reserve(size_t n) {
    if (n > cap_) grow(n);
  }
  void clear() { size_ = 0; }
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return cap_; }
  bool empty() const { return size_ == 0; }

 private:
  void grow(size_t need) {
    size_t nc = std::max<size_t>(std::max<size_t>(cap_ * 2, need), 4096);
    std::unique_ptr<uint8_t[]> nd(new uint8_t[nc]);
    if (size_) std::memcpy(nd.get(), data_.get(), size_);
    data_ = std::move(nd);
    cap_ = nc;
  }
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
  size_t cap_ = 0;
};

}  // namespace seqr
