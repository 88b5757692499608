#include "seqr_server.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "log.h"

namespace seqr {

namespace {
inline void respond(ByteBuf& out, uint8_t status, uint64_t rid, uint64_t epoch,
                    uint64_t pos, uint32_t count) {
  encode_response(out.extend(kRespFrame), status, rid, epoch, pos, count);
}
}  // namespace

Server::Server(std::string host, uint16_t port, uint32_t max_connections, uint32_t max_frame,
               uint32_t max_name, uint32_t max_count, bool require_auth, const TlsFiles& tls,
               double handshake_timeout_s)
    // frames shorter than a request are handshake frames; handle_frame checks
    // each against what the connection's stage expects
    : FrameServer(std::move(host), port, max_connections, 1, max_frame, tls, handshake_timeout_s),
      max_connections_(max_connections),
      max_frame_(max_frame),
      max_name_(max_name),
      max_count_(max_count),
      require_auth_(require_auth) {
  if (max_frame < kReqMinPayload)
    throw std::invalid_argument("max_frame must be >= " + std::to_string(kReqMinPayload));
  if (max_frame > (1u << 24)) throw std::invalid_argument("max_frame must be <= 16 MiB");
  if (max_name < 1 || max_name > 65535)
    throw std::invalid_argument("max_name must be in 1..65535");
  if (max_count < 1) throw std::invalid_argument("max_count must be >= 1");
  if (max_frame < kHelloFixed + max_name)
    throw std::invalid_argument("max_frame must hold a HELLO with a pool name of max_name bytes");
  key_.reserve(2 * 65536);
}

std::unique_ptr<Session> Server::new_session() {
  auto s = std::make_unique<SeqrSession>();
  s->established = false;  // until the handshake completes
  return s;
}

uint32_t Server::effective_max_count() const {
  const uint32_t cap = max_outstanding_.load(std::memory_order_relaxed);
  return max_rate_.load(std::memory_order_relaxed) && cap ? std::min(max_count_, cap) : max_count_;
}

void Server::log_refusal(const SeqrSession& s, Refusal why, const char* detail) {
  refused_[why].fetch_add(1, std::memory_order_relaxed);
  if (!log_enabled(LL_WARNING)) return;
  // at most 20 lines a second: someone knocking at the port must not flood the log
  const auto now = std::chrono::steady_clock::now();
  if (now - log_window_ >= std::chrono::seconds(1)) {
    if (suppressed_logs_)
      SEQR_LOG(LL_WARNING, "(%u more refused connections not logged)", suppressed_logs_);
    log_window_ = now;
    logged_in_window_ = suppressed_logs_ = 0;
  }
  if (logged_in_window_ >= 20) {
    ++suppressed_logs_;
    return;
  }
  ++logged_in_window_;
  SEQR_LOG(LL_WARNING, "refused the connection from %s (%s): %s", s.peer.c_str(),
           kRefusalNames[why], detail);
}

FrameResult Server::refuse_hello(SeqrSession& s, uint8_t status, Refusal why, ByteBuf& out,
                                 const char* detail) {
  log_refusal(s, why, detail);
  uint8_t* p = out.extend(4 + kChallengePayload);
  std::memset(p, 0, 4 + kChallengePayload);
  put_u32(p, kChallengePayload);
  p[4] = OP_CHALLENGE;
  p[5] = kProtocolVersion;
  p[6] = status;
  return FrameResult::CLOSE_AFTER_FLUSH;
}

FrameResult Server::refuse_proof(SeqrSession& s, uint8_t reason, Refusal why, ByteBuf& out) {
  char detail[400];
  std::snprintf(detail, sizeof detail, "pool '%.255s': %s", s.pool.c_str(),
                why == REFUSED_UNKNOWN_GENERATION ? "a key generation it does not hold"
                : why == REFUSED_WRONG_KEY         ? "wrong key"
                                                   : "malformed proof");
  log_refusal(s, why, detail);
  uint8_t* p = out.extend(4 + kWelcomePayload);
  std::memset(p, 0, 4 + kWelcomePayload);
  put_u32(p, kWelcomePayload);
  p[4] = OP_WELCOME;
  p[5] = why == REFUSED_BAD_HANDSHAKE ? ST_BAD_HANDSHAKE : ST_AUTH_FAILED;
  p[6] = reason;
  return FrameResult::CLOSE_AFTER_FLUSH;
}

FrameResult Server::on_hello(SeqrSession& s, const uint8_t* p, uint32_t len, ByteBuf& out) {
  if (p[0] != OP_HELLO) {
    if ((p[0] == OP_NEXT || p[0] == OP_TAIL || p[0] == OP_STREAM_NEXT || p[0] == OP_STREAM_TAIL) &&
        len >= 9) {
      // a request with no handshake (a client of protocol 1, or a stranger):
      // answered in the request's own format so that it can tell why
      log_refusal(s, REFUSED_NO_HANDSHAKE, "a request before the handshake");
      respond(out, ST_AUTH_REQUIRED, get_u64(p + 1), 0, 0, 0);
      return FrameResult::CLOSE_AFTER_FLUSH;
    }
    log_refusal(s, REFUSED_NO_HANDSHAKE, "not a HELLO frame");
    return FrameResult::BAD_FRAME;
  }
  if (len < 2 || p[1] != kProtocolVersion) {
    char d[64];
    std::snprintf(d, sizeof d, "protocol version %u", len >= 2 ? unsigned(p[1]) : 0u);
    return refuse_hello(s, ST_BAD_VERSION, REFUSED_BAD_VERSION, out, d);
  }
  if (len < kHelloFixed || kHelloFixed + get_u16(p + kHelloFixed - 2) != len)
    return refuse_hello(s, ST_BAD_HANDSHAKE, REFUSED_BAD_HANDSHAKE, out, "malformed HELLO");
  const uint32_t plen = get_u16(p + kHelloFixed - 2);
  if (plen == 0) {
    // a liveness probe (another daemon asking whether this one answers):
    // answered like a pool not served, and neither logged nor counted as a refusal
    probes_.fetch_add(1, std::memory_order_relaxed);
    uint8_t* c = out.extend(4 + kChallengePayload);
    std::memset(c, 0, 4 + kChallengePayload);
    put_u32(c, kChallengePayload);
    c[4] = OP_CHALLENGE;
    c[5] = kProtocolVersion;
    c[6] = ST_NOT_SERVED;
    return FrameResult::CLOSE_AFTER_FLUSH;
  }
  std::string pool(reinterpret_cast<const char*>(p + kHelloFixed), plen);
  char detail[320];
  std::snprintf(detail, sizeof detail, "pool '%.255s'", pool.c_str());
  if (plen > max_name_)
    return refuse_hello(s, ST_BAD_HANDSHAKE, REFUSED_BAD_HANDSHAKE, out, "too long a pool name");
  if (tls_enabled() && !s.tls)
    return refuse_hello(s, ST_TLS_REQUIRED, REFUSED_TLS_REQUIRED, out, "plaintext to a TLS server");
  const auto it = pools_.find(pool);
  const bool any_pool = !require_auth_ && pools_.empty();
  if (it == pools_.end() && !any_pool)
    return refuse_hello(s, ST_NOT_SERVED, REFUSED_NOT_SERVED, out, detail);
  const bool hmac = require_auth_;
  auth::random_bytes(s.server_nonce, kNonce);
  std::memcpy(s.client_nonce, p + 4, kNonce);
  uint8_t* c = out.extend(4 + kChallengePayload);
  put_u32(c, kChallengePayload);
  c += 4;
  c[0] = OP_CHALLENGE;
  c[1] = kProtocolVersion;
  c[2] = ST_OK;
  c[3] = hmac ? AUTH_HMAC_SHA256 : AUTH_NONE;
  put_u32(c + 4, hmac ? it->second.current : 0);
  std::memcpy(c + 8, s.server_nonce, kNonce);
  put_u32(c + 8 + kNonce, 0);
  s.transcript.assign(reinterpret_cast<const char*>(p), len);
  s.transcript.append(reinterpret_cast<const char*>(c), kChallengePayload);
  s.pool = std::move(pool);
  s.stage = SeqrSession::PROOF_WAIT;
  return FrameResult::CONTINUE;
}

FrameResult Server::on_proof(SeqrSession& s, const uint8_t* p, uint32_t len, ByteBuf& out) {
  if (p[0] != OP_PROOF || len != kProofPayload)
    return refuse_proof(s, REASON_NONE, REFUSED_BAD_HANDSHAKE, out);
  const uint32_t gen = get_u32(p + 4);
  auth::Mac server_mac{};
  if (require_auth_) {
    const auto it = pools_.find(s.pool);  // removed meanwhile: no key verifies
    const auth::Mac* key = nullptr;
    if (it != pools_.end())
      for (const auto& k : it->second.keys)
        if (k.first == gen) key = &k.second;
    if (key == nullptr) return refuse_proof(s, REASON_UNKNOWN_GENERATION, REFUSED_UNKNOWN_GENERATION, out);
    const auth::Mac sk = auth::session_key(*key, s.client_nonce, s.server_nonce);
    const std::string t = auth::transcript(s.transcript, auth::channel_binding(s.ssl), gen);
    const auth::Mac expect = auth::client_proof(sk, t);
    if (!auth::equal(expect.data(), p + 8, kMac))
      return refuse_proof(s, REASON_WRONG_PROOF, REFUSED_WRONG_KEY, out);
    server_mac = auth::server_proof(sk, t, expect);
  }
  std::string().swap(s.transcript);
  s.generation = require_auth_ ? gen : 0;
  s.stage = SeqrSession::READY;
  s.established = true;
  s.min_frame = kReqMinPayload;  // from now on every frame is a request
  s.tokens = max_outstanding_.load(std::memory_order_relaxed);
  s.refill_at = std::chrono::steady_clock::now();
  auth_ok_.fetch_add(1, std::memory_order_relaxed);
  SEQR_LOG(LL_DEBUG, "%s authenticated for pool '%s' (key generation %u%s)", s.peer.c_str(),
           s.pool.c_str(), unsigned(s.generation), s.tls ? ", TLS" : "");
  uint8_t* w = out.extend(4 + kWelcomePayload);
  put_u32(w, kWelcomePayload);
  w += 4;
  w[0] = OP_WELCOME;
  w[1] = ST_OK;
  w[2] = REASON_NONE;
  w[3] = 0;
  put_u32(w + 4, effective_max_count());
  put_u32(w + 8, max_outstanding_.load(std::memory_order_relaxed));
  put_u32(w + 12, max_rate_.load(std::memory_order_relaxed));
  std::memcpy(w + 16, server_mac.data(), kMac);
  return FrameResult::CONTINUE;
}

size_t Server::set_pool(const std::string& pool,
                        const std::vector<std::pair<uint32_t, std::string>>& secrets) {
  if (pool.empty() || pool.size() > 65535)
    throw std::invalid_argument("pool names must be 1..65535 bytes");
  if (require_auth_ && secrets.empty())
    throw std::invalid_argument("a pool served with authentication needs at least one secret");
  PoolKeys pk;
  for (const auto& [gen, secret] : secrets) {
    if (secret.size() < 16) throw std::invalid_argument("a pool secret must be at least 16 bytes");
    for (const auto& k : pk.keys)
      if (k.first == gen) throw std::invalid_argument("two secrets of one generation");
    pk.keys.emplace_back(gen, auth::pool_key(secret, pool));
    pk.current = std::max(pk.current, gen);
  }
  size_t closed = 0;
  run_on_io([&] {
    pools_[pool] = std::move(pk);
    const PoolKeys& now = pools_[pool];
    closed = close_sessions([&](Session& s0) {
      auto& s = static_cast<SeqrSession&>(s0);
      if (s.stage != SeqrSession::READY || s.pool != pool || !require_auth_) return false;
      for (const auto& k : now.keys)
        if (k.first == s.generation) return false;
      return true;
    });
  });
  if (closed) {
    revoked_.fetch_add(closed, std::memory_order_relaxed);
    SEQR_LOG(LL_WARNING, "pool '%s': closed %zu connection(s) of a key generation no longer accepted",
             pool.c_str(), closed);
  }
  return closed;
}

bool Server::remove_pool(const std::string& pool) {
  bool found = false;
  size_t closed = 0;
  run_on_io([&] {
    found = pools_.erase(pool) > 0;
    closed = close_sessions([&](Session& s0) {
      auto& s = static_cast<SeqrSession&>(s0);
      return s.stage != SeqrSession::HELLO_WAIT && s.pool == pool;
    });
  });
  revoked_.fetch_add(closed, std::memory_order_relaxed);
  return found;
}

std::vector<std::pair<std::string, std::vector<uint32_t>>> Server::pools() {
  std::vector<std::pair<std::string, std::vector<uint32_t>>> res;
  run_on_io([&] {
    for (const auto& [name, pk] : pools_) {
      std::vector<uint32_t> gens;
      for (const auto& k : pk.keys) gens.push_back(k.first);
      std::sort(gens.rbegin(), gens.rend());
      res.emplace_back(name, std::move(gens));
    }
  });
  std::sort(res.begin(), res.end());
  return res;
}

void Server::set_limits(uint32_t max_rate, uint32_t max_outstanding) {
  if (max_rate && !max_outstanding)
    throw std::invalid_argument("a rate limit needs max_outstanding >= 1");
  run_on_io([&] {
    max_rate_.store(max_rate);
    max_outstanding_.store(max_outstanding);
  });
}

void Server::make_key(std::string& key, const char* pool, size_t plen, const char* log,
                      size_t llen) {
  // u16 pool length + pool + log: unambiguous even if names contain NULs.
  key.clear();
  key.push_back(static_cast<char>(plen & 0xff));
  key.push_back(static_cast<char>((plen >> 8) & 0xff));
  key.append(pool, plen);
  key.append(log, llen);
}

void Server::begin_recovery(LogState& s, uint64_t client_epoch) {
  s.state = State::INITIALISING;
  {
    std::lock_guard<std::mutex> lk(rq_mu_);
    rq_.push_back(RecoveryRequest{s.pool, s.log, client_epoch});
  }
  rq_cv_.notify_one();
  recoveries_queued_.fetch_add(1, std::memory_order_relaxed);
  SEQR_LOG(LL_DEBUG, "recovery queued for %s/%s (client epoch %llu)", s.pool.c_str(),
           s.log.c_str(), static_cast<unsigned long long>(client_epoch));
}

FrameResult Server::handle_frame(Session& s0, const uint8_t* p, uint32_t len, ByteBuf& out) {
  auto& s = static_cast<SeqrSession&>(s0);
  switch (s.stage) {
    case SeqrSession::READY:
      if (len < kReqMinPayload) return FrameResult::BAD_FRAME;
      handle_request(s, p, len, out);
      return FrameResult::CONTINUE;
    case SeqrSession::HELLO_WAIT:
      return on_hello(s, p, len, out);
    case SeqrSession::PROOF_WAIT:
      return on_proof(s, p, len, out);
  }
  return FrameResult::BAD_FRAME;
}

void Server::handle_request(SeqrSession& sess, const uint8_t* p, uint32_t len, ByteBuf& out) {
  const uint8_t op = p[0];
  const uint64_t rid = get_u64(p + 1);
  const uint64_t epoch = get_u64(p + 9);
  const uint32_t count = get_u32(p + 17);
  const uint32_t plen = get_u16(p + 21);
  ++local_.requests;
  ++batch_requests_;
  // pool bytes, then u16 log_len, then log bytes, then nothing.
  if (size_t(kReqFixed) + 2 + plen + 2 > len) {
    ++local_.bad_requests;
    return respond(out, ST_BAD_REQUEST, rid, 0, 0, 0);
  }
  const char* pool = reinterpret_cast<const char*>(p + kReqFixed + 2);
  const uint32_t llen = get_u16(p + kReqFixed + 2 + plen);
  const char* log = pool + plen + 2;
  const bool history_op = op == OP_STREAM_HISTORY;
  const bool stream_op = op == OP_STREAM_NEXT || op == OP_STREAM_TAIL || history_op;
  const bool next_op = op == OP_NEXT || op == OP_STREAM_NEXT;
  // stream requests: u16 nstreams and the stream ids follow the log name
  const size_t names_end = size_t(kReqMinPayload) + plen + llen;
  uint32_t nstreams = 0;
  const uint8_t* ids = nullptr;
  if (stream_op && names_end + 2 <= len) {
    nstreams = get_u16(p + names_end);
    ids = p + names_end + 2;
  }
  bool bad = (stream_op ? names_end + 2 + size_t(8) * nstreams != len  // overrun / trailing bytes
                        : names_end != len) ||
             (op != OP_NEXT && op != OP_TAIL && !stream_op) || plen == 0 || llen == 0 ||
             plen > max_name_ || llen > max_name_ ||
             (next_op && (count == 0 || count > effective_max_count())) ||
             (!next_op && !history_op && count != 0) ||
             (history_op && (count == 0 || count > kMaxStreamHistory ||
                             uint64_t(count) * nstreams > kMaxHistoryPerRequest)) ||
             (stream_op && (nstreams == 0 || nstreams > kMaxStreamsPerRequest));
  if (!bad && stream_op) {  // each stream once
    for (uint32_t i = 1; i < nstreams && !bad; ++i)
      for (uint32_t j = 0; j < i; ++j)
        if (std::memcmp(ids + 8 * i, ids + 8 * j, 8) == 0) {
          bad = true;
          break;
        }
  }
  if (bad) {
    ++local_.bad_requests;
    return respond(out, ST_BAD_REQUEST, rid, 0, 0, 0);
  }
  // the connection may name only the pool it authenticated for
  if (plen != sess.pool.size() || std::memcmp(pool, sess.pool.data(), plen) != 0) {
    ++local_.not_authorised;
    return respond(out, ST_NOT_AUTHORISED, rid, 0, 0, 0);
  }
  const uint32_t rate = max_rate_.load(std::memory_order_relaxed);
  if (next_op && rate) {
    if (batch_start_ > sess.refill_at) {  // once per batch of requests read together
      const double dt = std::chrono::duration<double>(batch_start_ - sess.refill_at).count();
      sess.tokens = std::min<double>(max_outstanding_.load(std::memory_order_relaxed),
                                     sess.tokens + dt * rate);
      sess.refill_at = batch_start_;
    }
    if (sess.tokens < count) {
      ++local_.rate_limited;
      const double wait_ms = std::ceil((count - sess.tokens) * 1000.0 / rate);
      return respond(out, ST_RATE_LIMITED, rid, 0, 0,
                     static_cast<uint32_t>(std::clamp(wait_ms, 1.0, 60000.0)));
    }
  }

  make_key(key_, pool, plen, log, llen);
  auto it = table_.find(key_);
  if (it == table_.end()) {
    it = table_.emplace(key_, LogState{}).first;
    it->second.pool.assign(pool, plen);
    it->second.log.assign(log, llen);
    logs_.store(table_.size(), std::memory_order_relaxed);
    begin_recovery(it->second, epoch);
    ++local_.retries;
    ++it->second.requests;
    ++it->second.retries;
    return respond(out, ST_RETRY, rid, 0, 0, 0);
  }
  LogState& s = it->second;
  ++s.requests;
  switch (s.state) {
    case State::READY:
      if (epoch == s.epoch) {
        if (next_op) {
          if (s.next > std::numeric_limits<uint64_t>::max() - count) {
            ++local_.bad_requests;
            return respond(out, ST_BAD_REQUEST, rid, s.epoch, 0, 0);
          }
          const uint64_t pos = s.next;
          s.next += count;
          s.positions += count;
          local_.positions += count;
          if (rate) sess.tokens -= count;
          respond(out, ST_OK, rid, s.epoch, pos, count);
          if (stream_op) stream_answer(s, ids, nstreams, pos, count, out);
          return;
        }
        respond(out, ST_OK, rid, s.epoch, s.next, 0);
        if (stream_op) stream_answer(s, ids, nstreams, s.next, 0, out, history_op ? count : 0);
        return;
      }
      if (epoch < s.epoch) {
        ++s.stale;
        ++local_.stale;
        return respond(out, ST_STALE_EPOCH, rid, s.epoch, 0, 0);
      }
      // The client has seen a newer epoch: the log was moved on elsewhere and
      // our counter may be wrong.
      begin_recovery(s, epoch);
      ++s.retries;
      ++local_.retries;
      return respond(out, ST_RETRY, rid, s.epoch, 0, 0);
    case State::INITIALISING:
      ++s.retries;
      ++local_.retries;
      return respond(out, ST_RETRY, rid, s.epoch, 0, 0);
    case State::FAILED:
      if (std::chrono::steady_clock::now() - s.failed_at >= std::chrono::seconds(1)) {
        begin_recovery(s, epoch);
        ++s.retries;
        ++local_.retries;
        return respond(out, ST_RETRY, rid, s.epoch, 0, 0);
      }
      ++s.recovery_failed;
      ++local_.recovery_failed;
      return respond(out, ST_RECOVERY_FAILED, rid, s.epoch, 0, 0);
  }
}

// Called right after the OK answer's 33 bytes were appended to out: appends
// the stream section and makes the frame's length cover it. Then records
// [pos, pos + count) as each stream's newest positions.
void Server::stream_answer(LogState& s, const uint8_t* ids, uint32_t nstreams, uint64_t pos,
                           uint32_t count, ByteBuf& out, uint32_t history) {
  const size_t frame = out.size() - kRespFrame;
  if (count && s.streams.size() + nstreams > kDefaultMaxStreams)
    forget_streams(s, pos);  // too many streams to remember: forget them all, never answer wrongly
  uint8_t* h = out.extend(kStreamFixed);
  h[0] = kStreamVersion;
  h[1] = static_cast<uint8_t>(kStreamBackpointers);
  put_u16(h + 2, static_cast<uint16_t>(nstreams));
  for (uint32_t i = 0; i < nstreams; ++i) {
    const uint64_t id = get_u64(ids + 8 * i);
    StreamRing* ring = nullptr;
    if (count) {
      ring = &s.streams[id];
    } else {
      auto it = s.streams.find(id);
      if (it != s.streams.end()) ring = &it->second;
    }
    const uint32_t n = ring ? ring->n : 0;
    const uint64_t ord = ring ? ring->ordinal : 0;
    // levels whose multiple exists below ord (ordinal 0 is a multiple of all)
    // (levels above the first whose newest multiple is ordinal 0 repeat it: not sent)
    uint32_t m = 0;
    if (ord) {
      while (m < kStreamLevels && (uint64_t(1) << (m + kStreamFirstLevel)) <= ord - 1) ++m;
      if (m < kStreamLevels) ++m;
    }
    uint8_t* q = out.extend(kStreamPerStream + 8 * size_t(n) + kStreamLevelEntry * size_t(m));
    put_u64(q, id);
    put_u64(q + 8, s.streams_from);
    put_u64(q + 16, ord);
    q[24] = static_cast<uint8_t>(n);
    q[25] = static_cast<uint8_t>(m);
    q += kStreamPerStream;
    for (uint32_t k = 0; k < n; ++k) {  // newest first
      const uint32_t slot = (ring->head + kStreamBackpointers - 1 - k) % kStreamBackpointers;
      put_u64(q + 8 * k, ring->pos[slot]);
    }
    q += 8 * size_t(n);
    for (uint32_t l = 0; l < m; ++l) {
      q[0] = static_cast<uint8_t>(l + kStreamFirstLevel);
      put_u64(q + 1, ring->level[l]);
      q += kStreamLevelEntry;
    }
    if (!count) continue;
    for (uint32_t l = 0; l < kStreamLevels; ++l) {  // the newest multiple of 2^level in the batch
      const uint64_t mult = ((ord + count - 1) >> (l + kStreamFirstLevel)) << (l + kStreamFirstLevel);
      if (mult >= ord) ring->level[l] = pos + (mult - ord);
    }
    ring->ordinal += count;
    // the batch's positions are the stream's newest; only the last K matter
    const uint64_t first = count > kStreamBackpointers ? pos + count - kStreamBackpointers : pos;
    for (uint64_t p = first; p < pos + count; ++p) {
      ring->pos[ring->head] = p;
      ring->head = static_cast<uint8_t>((ring->head + 1) % kStreamBackpointers);
      if (ring->n < kStreamBackpointers) ++ring->n;
    }
    remember(*ring, pos, count);
  }
  if (history) {  // STREAM_HISTORY (count 0: nothing recorded above)
    for (uint32_t i = 0; i < nstreams; ++i) {
      auto it = s.streams.find(get_u64(ids + 8 * i));
      const StreamRing* ring = it == s.streams.end() ? nullptr : &it->second;
      const size_t kept = ring ? ring->hist.size() : 0;
      const uint32_t h = static_cast<uint32_t>(std::min<size_t>(kept, history));
      uint8_t* q = out.extend(4 + 8 * size_t(h));
      put_u32(q, h);
      for (uint32_t k = 0; k < h; ++k)  // newest first
        put_u64(q + 4 + 8 * k, ring->hist[(ring->hist_head + kept - 1 - k) % kept]);
    }
  }
  put_u32(out.data() + frame, static_cast<uint32_t>(out.size() - frame - 4));
}

// Adds [pos, pos + count) to the stream's history: it grows while the budget
// allows, else its oldest give way, so it always holds the stream's latest
// positions with none missing between them.
void Server::remember(StreamRing& ring, uint64_t pos, uint32_t count) {
  const uint64_t first = count > kMaxStreamHistory ? pos + count - kMaxStreamHistory : pos;
  for (uint64_t p = first; p < pos + count; ++p) {
    if (ring.hist.size() < kMaxStreamHistory && history_kept_ < kStreamHistoryBudget) {
      if (ring.hist_head != 0) {  // a ring that stopped growing when the budget ran out: unroll it
        std::rotate(ring.hist.begin(), ring.hist.begin() + ring.hist_head, ring.hist.end());
        ring.hist_head = 0;
      }
      ring.hist.push_back(p);
      ++history_kept_;
    } else if (!ring.hist.empty()) {
      ring.hist[ring.hist_head] = p;
      ring.hist_head = static_cast<uint32_t>((ring.hist_head + 1) % ring.hist.size());
    } else {
      break;  // no history, and no room for one
    }
  }
  history_kept_seen_.store(history_kept_, std::memory_order_relaxed);
}

void Server::forget_streams(LogState& s, uint64_t from) {
  for (const auto& kv : s.streams) history_kept_ -= kv.second.hist.size();
  s.streams.clear();
  s.streams_from = from;
  history_kept_seen_.store(history_kept_, std::memory_order_relaxed);
}

void Server::on_batch_done() {
  if (batch_requests_) {
    const auto ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::steady_clock::now() - batch_start_)
                                              .count());
    size_t i = 0;
    while (i < kLatencyBuckets - 1 && ns > kLatencyBoundsUs[i] * 1000) ++i;
    latency_buckets_[i].fetch_add(batch_requests_, std::memory_order_relaxed);
    latency_sum_ns_.fetch_add(ns * batch_requests_, std::memory_order_relaxed);
    latency_count_.fetch_add(batch_requests_, std::memory_order_relaxed);
    batch_requests_ = 0;
  }
  auto flush = [](uint64_t& l, std::atomic<uint64_t>& g) {
    if (l) {
      g.fetch_add(l, std::memory_order_relaxed);
      l = 0;
    }
  };
  flush(local_.requests, requests_);
  flush(local_.positions, positions_);
  flush(local_.bad_requests, bad_requests_);
  flush(local_.stale, stale_);
  flush(local_.retries, retries_);
  flush(local_.recovery_failed, recovery_failed_);
  flush(local_.not_authorised, not_authorised_);
  flush(local_.rate_limited, rate_limited_);
}

void Server::on_stopped() {
  {
    std::lock_guard<std::mutex> lk(rq_mu_);
    rq_stopped_ = true;
  }
  rq_cv_.notify_all();
}

bool Server::install(const std::string& pool, const std::string& log, uint64_t epoch,
                     uint64_t next_position) {
  if (pool.empty() || log.empty() || pool.size() > 65535 || log.size() > 65535)
    throw std::invalid_argument("pool and log names must be 1..65535 bytes");
  bool applied = false;
  run_on_io([&] {
    std::string key;
    make_key(key, pool.data(), pool.size(), log.data(), log.size());
    auto it = table_.find(key);
    if (it == table_.end()) {
      it = table_.emplace(std::move(key), LogState{}).first;
      it->second.pool = pool;
      it->second.log = log;
      logs_.store(table_.size(), std::memory_order_relaxed);
    }
    LogState& s = it->second;
    if (s.state == State::READY) {
      if (s.epoch > epoch) return;
      if (s.epoch == epoch && s.next > next_position) next_position = s.next;
    }
    if (s.state != State::READY || s.epoch != epoch) {
      // positions below next_position were handed out by another sequencer
      // (or before a recovery): which streams they belong to is unknown here
      forget_streams(s, next_position);
    }
    s.state = State::READY;
    s.epoch = epoch;
    s.next = next_position;
    s.message.clear();
    applied = true;
    SEQR_LOG(LL_INFO, "installed %s/%s epoch %llu next %llu", pool.c_str(), log.c_str(),
             static_cast<unsigned long long>(epoch),
             static_cast<unsigned long long>(next_position));
  });
  return applied;
}

bool Server::fail(const std::string& pool, const std::string& log, const std::string& message) {
  if (pool.empty() || log.empty() || pool.size() > 65535 || log.size() > 65535)
    throw std::invalid_argument("pool and log names must be 1..65535 bytes");
  bool applied = false;
  run_on_io([&] {
    std::string key;
    make_key(key, pool.data(), pool.size(), log.data(), log.size());
    auto it = table_.find(key);
    if (it == table_.end()) {
      it = table_.emplace(std::move(key), LogState{}).first;
      it->second.pool = pool;
      it->second.log = log;
      logs_.store(table_.size(), std::memory_order_relaxed);
    }
    LogState& s = it->second;
    if (s.state == State::READY) return;
    s.state = State::FAILED;
    s.message = message;
    s.failed_at = std::chrono::steady_clock::now();
    applied = true;
    SEQR_LOG(LL_INFO, "recovery of %s/%s failed: %s", pool.c_str(), log.c_str(),
             message.c_str());
  });
  return applied;
}

bool Server::forget(const std::string& pool, const std::string& log) {
  bool found = false;
  run_on_io([&] {
    std::string key;
    make_key(key, pool.data(), pool.size(), log.data(), log.size());
    auto it = table_.find(key);
    found = it != table_.end();
    if (found) {
      forget_streams(it->second, 0);  // gives its histories' positions back to the budget
      table_.erase(it);
    }
    logs_.store(table_.size(), std::memory_order_relaxed);
  });
  return found;
}

std::vector<RecoveryRequest> Server::wait_recovery(double timeout_s) {
  std::vector<RecoveryRequest> res;
  std::unique_lock<std::mutex> lk(rq_mu_);
  if (timeout_s > 0 && rq_.empty() && !rq_stopped_) {
    const auto dur = std::chrono::duration<double>(std::min(timeout_s, 1e9));
    rq_cv_.wait_for(lk, std::chrono::duration_cast<std::chrono::nanoseconds>(dur),
                    [this] { return !rq_.empty() || rq_stopped_; });
  }
  res.swap(rq_);
  return res;
}

ServerStats Server::stats() const {
  ServerStats s{};
  s.requests = requests_.load(std::memory_order_relaxed);
  s.positions = positions_.load(std::memory_order_relaxed);
  s.connections_open = connections_open();
  s.connections_total = connections_total();
  s.connections_rejected = connections_rejected();
  s.bad_frames = bad_frames();
  s.bad_requests = bad_requests_.load(std::memory_order_relaxed);
  s.stale = stale_.load(std::memory_order_relaxed);
  s.retries = retries_.load(std::memory_order_relaxed);
  s.recovery_failed = recovery_failed_.load(std::memory_order_relaxed);
  s.recoveries_queued = recoveries_queued_.load(std::memory_order_relaxed);
  s.logs = logs_.load(std::memory_order_relaxed);
  s.auth_ok = auth_ok_.load(std::memory_order_relaxed);
  s.not_authorised = not_authorised_.load(std::memory_order_relaxed);
  s.rate_limited = rate_limited_.load(std::memory_order_relaxed);
  s.handshake_timeouts = handshake_timeouts();
  s.revoked = revoked_.load(std::memory_order_relaxed);
  s.probes = probes_.load(std::memory_order_relaxed);
  s.stream_history_positions = history_kept_seen_.load(std::memory_order_relaxed);
  s.connections_tls = tls_connections();
  s.tls_failures = tls_failures();
  for (int i = 0; i < REFUSAL_KINDS; ++i) s.refused[i] = refused_[i].load(std::memory_order_relaxed);
  return s;
}

LatencyStats Server::latency() const {
  LatencyStats l{};
  for (size_t i = 0; i < kLatencyBuckets; ++i)
    l.buckets[i] = latency_buckets_[i].load(std::memory_order_relaxed);
  l.sum_ns = latency_sum_ns_.load(std::memory_order_relaxed);
  l.count = latency_count_.load(std::memory_order_relaxed);
  return l;
}

std::vector<LogInfo> Server::logs() {
  std::vector<LogInfo> res;
  run_on_io([&] {
    res.reserve(table_.size());
    for (const auto& kv : table_) {
      const LogState& s = kv.second;
      const char* st = s.state == State::READY ? "ready"
                       : s.state == State::FAILED ? "failed"
                                                  : "initialising";
      res.push_back(LogInfo{s.pool, s.log, st, s.epoch, s.next, s.message, s.requests,
                            s.positions, s.stale, s.retries, s.recovery_failed,
                            s.streams.size(), s.streams_from});
    }
  });
  return res;
}

}  // namespace seqr
