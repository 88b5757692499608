// The sequencer server: in-memory position counters per (pool, log).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "frame_server.h"
#include "protocol.h"

namespace seqr {

struct RecoveryRequest {
  std::string pool;
  std::string log;
  uint64_t epoch;  // the epoch the client asked with
};

struct LogInfo {
  std::string pool;
  std::string log;
  std::string state;  // "initialising", "ready", "failed"
  uint64_t epoch;
  uint64_t next;
  std::string message;
  // answers to this log's clients since the server met it
  uint64_t requests, positions, stale, retries, recovery_failed;
};

// Time from a batch's bytes arriving to its answers being queued, per
// request (every request of a batch counts the batch's time). Bucket i
// holds requests with time <= kLatencyBoundsUs[i] (not cumulative); the
// last one everything above.
inline constexpr uint64_t kLatencyBoundsUs[] = {1, 2, 5, 10, 20, 50, 100, 200,
                                                500, 1000, 2000, 5000, 10000};
inline constexpr size_t kLatencyBuckets = sizeof(kLatencyBoundsUs) / sizeof(uint64_t) + 1;

struct LatencyStats {
  uint64_t buckets[kLatencyBuckets];
  uint64_t sum_ns;
  uint64_t count;
};

struct ServerStats {
  uint64_t requests, positions, connections_open, connections_total,
      connections_rejected, bad_frames, bad_requests, stale, retries,
      recovery_failed, recoveries_queued, logs;
};

class Server : public FrameServer {
 public:
  Server(std::string host = "127.0.0.1", uint16_t port = 0,
         uint32_t max_connections = kDefaultMaxConnections,
         uint32_t max_frame = kDefaultMaxFrame, uint32_t max_name = kDefaultMaxName,
         uint32_t max_count = kDefaultMaxCount);
  ~Server() override { stop(); }

  // The log becomes READY(epoch, next_position). Ignored (returns false) if
  // the log is already READY at a higher epoch; at the same epoch the
  // counter never moves backwards (next = max(next, next_position)).
  bool install(const std::string& pool, const std::string& log, uint64_t epoch,
               uint64_t next_position);
  // Recovery failed: the log becomes FAILED(message) unless it is READY
  // (then ignored, returns false).
  bool fail(const std::string& pool, const std::string& log, const std::string& message);
  // Forget a log (next request starts a new recovery). Returns true if known.
  bool forget(const std::string& pool, const std::string& log);
  // Blocks until at least one recovery request is queued, the timeout
  // expires or the server is stopped; returns and clears the queue.
  std::vector<RecoveryRequest> wait_recovery(double timeout_s);
  ServerStats stats() const;
  LatencyStats latency() const;
  std::vector<LogInfo> logs();

  uint32_t max_name() const { return max_name_; }
  uint32_t max_count() const { return max_count_; }
  uint32_t max_frame() const { return max_frame_; }
  uint32_t max_connections() const { return max_connections_; }

 protected:
  void handle_frame(const uint8_t* payload, uint32_t len, ByteBuf& out) override;
  void on_batch_done() override;
  void on_stopped() override;

 private:
  enum class State { INITIALISING, READY, FAILED };
  struct LogState {
    std::string pool;
    std::string log;
    State state = State::INITIALISING;
    uint64_t epoch = 0;  // last installed epoch (0 if never)
    uint64_t next = 0;
    std::string message;
    std::chrono::steady_clock::time_point failed_at{};
    uint64_t requests = 0, positions = 0, stale = 0, retries = 0, recovery_failed = 0;
  };

  static void make_key(std::string& key, const char* pool, size_t plen, const char* log,
                       size_t llen);
  void begin_recovery(LogState& s, uint64_t client_epoch);

  const uint32_t max_connections_;
  const uint32_t max_frame_;
  const uint32_t max_name_;
  const uint32_t max_count_;

  // io thread only
  std::unordered_map<std::string, LogState> table_;
  std::string key_;
  struct Local {
    uint64_t requests = 0, positions = 0, bad_requests = 0, stale = 0, retries = 0,
             recovery_failed = 0;
  } local_;

  uint64_t batch_requests_ = 0;  // io thread: requests in the current batch
  std::atomic<uint64_t> latency_buckets_[kLatencyBuckets] = {};
  std::atomic<uint64_t> latency_sum_ns_{0}, latency_count_{0};

  std::atomic<uint64_t> requests_{0}, positions_{0}, bad_requests_{0}, stale_{0},
      retries_{0}, recovery_failed_{0}, recoveries_queued_{0}, logs_{0};

  std::mutex rq_mu_;
  std::condition_variable rq_cv_;
  std::vector<RecoveryRequest> rq_;
  bool rq_stopped_ = false;
};

}  // namespace seqr
