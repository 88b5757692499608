// Wire protocol of the pyzlog sequencer (see docs/seqr-protocol.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace seqr {

// Version 2 added the handshake (HELLO, CHALLENGE, PROOF, WELCOME); version 1
// had none and is no longer spoken.
constexpr uint8_t kProtocolVersion = 2;

enum Op : uint8_t {
  OP_NEXT = 1,
  OP_TAIL = 2,
  // streams (docs/seqr-protocol.md, "Streams"): NEXT and TAIL that also name
  // streams and are answered with each stream's backpointers
  OP_STREAM_NEXT = 3,
  OP_STREAM_TAIL = 4,
  // STREAM_TAIL answered also with each stream's longer history (count: how
  // many of its last positions, at most kMaxStreamHistory): a reader of one
  // stream finds its entries in one round of reads instead of a walk
  OP_STREAM_HISTORY = 5,
  // handshake frames, in the order they are sent
  OP_HELLO = 16,      // client: version, nonce, pool
  OP_CHALLENGE = 17,  // server: status, auth mode, key generation, nonce
  OP_PROOF = 18,      // client: key generation, HMAC over the transcript
  OP_WELCOME = 19,    // server: status, limits, HMAC over the transcript
};

enum Status : uint8_t {
  ST_OK = 0,
  ST_STALE_EPOCH = 1,
  ST_RETRY = 2,
  ST_BAD_REQUEST = 3,
  ST_RECOVERY_FAILED = 4,
  ST_NOT_AUTHORISED = 5,  // the request names a pool other than the connection's
  ST_RATE_LIMITED = 6,    // over the connection's position budget; count = ms to wait
  ST_AUTH_REQUIRED = 7,   // a request before the handshake (the connection is closed)
  ST_AUTH_FAILED = 8,     // the proof is wrong or names a key generation the server lacks
  ST_NOT_SERVED = 9,      // HELLO names a pool this server does not serve
  ST_BAD_VERSION = 10,    // HELLO's protocol version is not spoken here
  ST_TLS_REQUIRED = 11,   // a plaintext HELLO to a server that requires TLS
  ST_BAD_HANDSHAKE = 12,  // a malformed handshake frame
};

// CHALLENGE auth modes
enum AuthMode : uint8_t { AUTH_NONE = 0, AUTH_HMAC_SHA256 = 1 };
// WELCOME reasons for ST_AUTH_FAILED
enum AuthReason : uint8_t { REASON_NONE = 0, REASON_UNKNOWN_GENERATION = 1, REASON_WRONG_PROOF = 2 };

constexpr size_t kNonce = 16;
constexpr size_t kMac = 32;
// HELLO: u8 op, u8 version, u16 flags, nonce, u16 pool_len, pool
constexpr uint32_t kHelloFixed = 1 + 1 + 2 + kNonce + 2;  // 22
// CHALLENGE: u8 op, u8 version, u8 status, u8 auth mode, u32 generation, nonce,
//            u32 reserved (0)
constexpr uint32_t kChallengePayload = 1 + 1 + 1 + 1 + 4 + kNonce + 4;  // 28
// PROOF: u8 op, 3 reserved bytes (0), u32 generation, mac
constexpr uint32_t kProofPayload = 1 + 3 + 4 + kMac;  // 40
// WELCOME: u8 op, u8 status, u8 reason, u8 reserved, u32 max_count,
//          u32 max_outstanding, u32 max_rate, mac
constexpr uint32_t kWelcomePayload = 1 + 1 + 1 + 1 + 4 + 4 + 4 + kMac;  // 48

// Request payload: u8 op, u64 request_id, u64 epoch, u32 count,
//                  u16 pool_len, pool bytes, u16 log_len, log bytes.
constexpr uint32_t kReqFixed = 1 + 8 + 8 + 4;        // op..count
constexpr uint32_t kReqMinPayload = kReqFixed + 2 + 2;  // both names empty
// Response payload: u8 status, u64 request_id, u64 epoch, u64 position, u32 count
constexpr uint32_t kRespPayload = 1 + 8 + 8 + 8 + 4;  // 29
constexpr uint32_t kRespFrame = 4 + kRespPayload;      // 33

// Stream requests: the request as above, then u16 nstreams (1..kMaxStreamsPerRequest),
// nstreams x u64 stream id (distinct). An OK answer is the response above
// followed by the stream section: u8 version (kStreamVersion), u8 K (the most
// recent backpointers kept per stream), u16 nstreams, then per stream in
// request order: u64 stream, u64 horizon, u64 ordinal, u8 n (<= K), u8 m,
// n x u64 positions (newest first): the stream's last n positions below
// `position` that this server handed out; then m x (u8 level, u64 position):
// skip pointers, the position of the stream's newest entry below `position`
// whose ordinal is a multiple of 2^level (level >= kStreamFirstLevel).
// `ordinal` is the ordinal of `position` in the stream (how many positions
// the server handed out for it before, since the horizon). The server knows
// a stream only from `horizon` on: with n < K the stream has no other
// position in [horizon, position); positions below horizon are unknown (a
// reader scans for them). Other answers carry no stream section.
constexpr uint8_t kStreamVersion = 1;
constexpr uint32_t kMaxStreamsPerRequest = 64;
constexpr uint32_t kStreamBackpointers = 16;  // K
constexpr uint32_t kStreamFirstLevel = 4;     // 2^4 = 16 = K: lower levels are in the recent list
constexpr uint32_t kStreamLevels = 28;        // levels 4..31
constexpr uint32_t kStreamFixed = 1 + 1 + 2;  // version, K, nstreams
constexpr uint32_t kStreamPerStream = 8 + 8 + 8 + 1 + 1;  // stream, horizon, ordinal, n, m
constexpr uint32_t kStreamLevelEntry = 1 + 8;             // level, position
// A log's server forgets every stream (horizon := next) rather than keep more than this.
constexpr size_t kDefaultMaxStreams = 1u << 18;
// STREAM_HISTORY (count x nstreams <= kMaxHistoryPerRequest): the OK answer as STREAM_TAIL's, then per stream in request
// order: u32 h, h x u64 positions (newest first): the stream's last h
// positions the server handed out (h <= count), always its latest ones with
// none left out between them (so the n recent ones are among them when h >= n).
// The server keeps at most kMaxStreamHistory per stream and kStreamHistoryBudget
// in all (32 MB); a stream that finds the budget spent keeps the history it has
// (its oldest positions give way to its newest) or, if it has none, gets none.
constexpr uint32_t kMaxStreamHistory = 8192;
constexpr size_t kStreamHistoryBudget = size_t(1) << 22;
// count x nstreams of one STREAM_HISTORY request: an answer of at most 512 KB
constexpr uint32_t kMaxHistoryPerRequest = 1u << 16;

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
