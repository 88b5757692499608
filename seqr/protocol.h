// Wire protocol of the pyzlog sequencer (see docs/seqr-protocol.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace seqr {

enum Op : uint8_t { OP_NEXT = 1, OP_TAIL = 2 };

enum Status : uint8_t {
  ST_OK = 0,
  ST_STALE_EPOCH = 1,
  ST_RETRY = 2,
  ST_BAD_REQUEST = 3,
  ST_RECOVERY_FAILED = 4,
};

// Request payload: u8 op, u64 request_id, u64 epoch, u32 count,
//                  u16 pool_len, pool bytes, u16 log_len, log bytes.
constexpr uint32_t kReqFixed = 1 + 8 + 8 + 4;        // op..count
constexpr uint32_t kReqMinPayload = kReqFixed + 2 + 2;  // both names empty
// Response payload: u8 status, u64 request_id, u64 epoch, u64 position, u32 count
constexpr uint32_t kRespPayload = 1 + 8 + 8 + 8 + 4;  // 29
constexpr uint32_t kRespFrame = 4 + kRespPayload;      // 33

constexpr uint32_t kDefaultMaxFrame = 1024;
constexpr uint32_t kDefaultMaxName = 255;
constexpr uint32_t kDefaultMaxConnections = 1024;
constexpr uint32_t kDefaultMaxCount = 65536;

// Little-endian helpers (x86/ARM little-endian hosts: memcpy is a plain load;
// keep them portable anyway).
inline uint16_t get_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
inline uint32_t get_u32(const uint8_t* p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#else
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) |
         (uint32_t(p[3]) << 24);
#endif
}
inline uint64_t get_u64(const uint8_t* p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
#else
  return uint64_t(get_u32(p)) | (uint64_t(get_u32(p + 4)) << 32);
#endif
}
inline void put_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void put_u32(uint8_t* p, uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  std::memcpy(p, &v, 4);
#else
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
#endif
}
inline void put_u64(uint8_t* p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  std::memcpy(p, &v, 8);
#else
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
#endif
}

// Writes a complete response frame (33 bytes) at p.
inline void encode_response(uint8_t* p, uint8_t status, uint64_t request_id,
                            uint64_t epoch, uint64_t position, uint32_t count) {
  put_u32(p, kRespPayload);
  p[4] = status;
  put_u64(p + 5, request_id);
  put_u64(p + 13, epoch);
  put_u64(p + 21, position);
  put_u32(p + 29, count);
}

}  // namespace seqr
