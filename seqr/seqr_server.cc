#include "seqr_server.h"

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
               uint32_t max_name, uint32_t max_count)
    : FrameServer(std::move(host), port, max_connections, kReqMinPayload, max_frame),
      max_connections_(max_connections),
      max_frame_(max_frame),
      max_name_(max_name),
      max_count_(max_count) {
  if (max_frame < kReqMinPayload)
    throw std::invalid_argument("max_frame must be >= " + std::to_string(kReqMinPayload));
  if (max_frame > (1u << 24)) throw std::invalid_argument("max_frame must be <= 16 MiB");
  if (max_name < 1 || max_name > 65535)
    throw std::invalid_argument("max_name must be in 1..65535");
  if (max_count < 1) throw std::invalid_argument("max_count must be >= 1");
  key_.reserve(2 * 65536);
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

void Server::handle_frame(const uint8_t* p, uint32_t len, ByteBuf& out) {
  // len >= kReqMinPayload is guaranteed by FrameServer.
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
  const bool bad = (size_t(kReqMinPayload) + plen + llen != len) ||  // overrun / trailing bytes
                   (op != OP_NEXT && op != OP_TAIL) || plen == 0 || llen == 0 ||
                   plen > max_name_ || llen > max_name_ ||
                   (op == OP_NEXT && (count == 0 || count > max_count_)) ||
                   (op == OP_TAIL && count != 0);
  if (bad) {
    ++local_.bad_requests;
    return respond(out, ST_BAD_REQUEST, rid, 0, 0, 0);
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
        if (op == OP_NEXT) {
          if (s.next > std::numeric_limits<uint64_t>::max() - count) {
            ++local_.bad_requests;
            return respond(out, ST_BAD_REQUEST, rid, s.epoch, 0, 0);
          }
          const uint64_t pos = s.next;
          s.next += count;
          s.positions += count;
          local_.positions += count;
          return respond(out, ST_OK, rid, s.epoch, pos, count);
        }
        return respond(out, ST_OK, rid, s.epoch, s.next, 0);
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
    found = table_.erase(key) > 0;
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
                            s.positions, s.stale, s.retries, s.recovery_failed});
    }
  });
  return res;
}

}  // namespace seqr
