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

#include "auth.h"
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
  // streams: how many are tracked, and from which position on they are known
  uint64_t streams, streams_from;
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

// Why a connection was refused before it could make a request.
enum Refusal : int {
  REFUSED_NO_HANDSHAKE = 0,  // a request (or anything but HELLO) first
  REFUSED_BAD_HANDSHAKE,     // a malformed HELLO or PROOF
  REFUSED_BAD_VERSION,       // a protocol version not spoken here
  REFUSED_NOT_SERVED,        // a pool this server does not serve
  REFUSED_TLS_REQUIRED,      // plaintext to a server that requires TLS
  REFUSED_UNKNOWN_GENERATION,  // a key generation the server does not hold (old, revoked)
  REFUSED_WRONG_KEY,         // a proof that does not verify
  REFUSAL_KINDS
};
inline constexpr const char* kRefusalNames[REFUSAL_KINDS] = {
    "no_handshake", "bad_handshake", "bad_version", "not_served",
    "tls_required", "unknown_generation", "wrong_key"};

struct ServerStats {
  uint64_t requests, positions, connections_open, connections_total,
      connections_rejected, bad_frames, bad_requests, stale, retries,
      recovery_failed, recoveries_queued, logs;
  uint64_t auth_ok, not_authorised, rate_limited, handshake_timeouts, revoked,
      connections_tls, tls_failures, probes;
  uint64_t stream_history_positions;  // kept in every stream's history (of kStreamHistoryBudget)
  uint64_t refused[REFUSAL_KINDS];
};

// The state of one client connection (io thread only).
struct SeqrSession : Session {
  enum Stage : uint8_t { HELLO_WAIT, PROOF_WAIT, READY };
  Stage stage = HELLO_WAIT;
  std::string pool;         // the pool the connection authenticated for
  uint32_t generation = 0;  // the key generation it proved (0: no proof asked)
  std::string transcript;   // HELLO and CHALLENGE payloads, until the proof
  uint8_t client_nonce[kNonce] = {};
  uint8_t server_nonce[kNonce] = {};
  // token bucket of positions (with a rate limit)
  double tokens = 0;
  std::chrono::steady_clock::time_point refill_at{};
};

class Server : public FrameServer {
 public:
  // require_auth: every connection proves it holds a served pool's key.
  // Without it no proof is asked; connections are still bound to one pool,
  // and to a served one if any pool is set (set_pool), else to any pool.
  Server(std::string host = "127.0.0.1", uint16_t port = 0,
         uint32_t max_connections = kDefaultMaxConnections,
         uint32_t max_frame = kDefaultMaxFrame, uint32_t max_name = kDefaultMaxName,
         uint32_t max_count = kDefaultMaxCount, bool require_auth = true,
         const TlsFiles& tls = TlsFiles(), double handshake_timeout_s = 5.0);
  ~Server() override { stop(); }

  // Serve `pool` with these secrets, (generation, secret) pairs; the highest
  // generation is the current one, the others are still accepted (rotation).
  // Connections that proved a generation no longer listed are closed after
  // their queued answers are written (a revoked key keeps no session).
  // Returns how many were closed.
  size_t set_pool(const std::string& pool,
                  const std::vector<std::pair<uint32_t, std::string>>& secrets);
  // Stop serving `pool`; its connections are closed. False if it was not served.
  bool remove_pool(const std::string& pool);
  // Served pools and the key generations accepted for each.
  std::vector<std::pair<std::string, std::vector<uint32_t>>> pools();
  // Per connection: at most max_rate positions a second on average, and at
  // most max_outstanding at once (a token bucket of that size). 0: no limit.
  void set_limits(uint32_t max_rate, uint32_t max_outstanding);
  uint32_t max_rate() const { return max_rate_.load(); }
  uint32_t max_outstanding() const { return max_outstanding_.load(); }
  bool require_auth() const { return require_auth_; }

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
  FrameResult handle_frame(Session& s, const uint8_t* payload, uint32_t len,
                           ByteBuf& out) override;
  std::unique_ptr<Session> new_session() override;
  void on_batch_done() override;
  void on_stopped() override;

 private:
  enum class State { INITIALISING, READY, FAILED };
  // A stream's last positions (a ring of up to kStreamBackpointers), and per
  // level the position of its newest ordinal that is a multiple of 2^level.
  struct StreamRing {
    uint64_t pos[kStreamBackpointers];
    uint64_t level[kStreamLevels];
    uint64_t ordinal = 0;  // positions handed out for the stream since the horizon
    uint8_t n = 0, head = 0;  // head: where the next position goes
    // its last positions (up to kMaxStreamHistory, within the server's budget): a
    // ring once full, the oldest at hist_head; growing, in order from index 0
    std::vector<uint64_t> hist;
    uint32_t hist_head = 0;
  };
  struct LogState {
    std::string pool;
    std::string log;
    State state = State::INITIALISING;
    uint64_t epoch = 0;  // last installed epoch (0 if never)
    uint64_t next = 0;
    std::string message;
    std::chrono::steady_clock::time_point failed_at{};
    uint64_t requests = 0, positions = 0, stale = 0, retries = 0, recovery_failed = 0;
    // streams known from this position on (the counter when the log last became READY)
    uint64_t streams_from = 0;
    std::unordered_map<uint64_t, StreamRing> streams;
  };

  struct PoolKeys {
    std::vector<std::pair<uint32_t, auth::Mac>> keys;  // (generation, pool key)
    uint32_t current = 0;
  };

  static void make_key(std::string& key, const char* pool, size_t plen, const char* log,
                       size_t llen);
  void begin_recovery(LogState& s, uint64_t client_epoch);
  FrameResult on_hello(SeqrSession& s, const uint8_t* p, uint32_t len, ByteBuf& out);
  FrameResult on_proof(SeqrSession& s, const uint8_t* p, uint32_t len, ByteBuf& out);
  void handle_request(SeqrSession& s, const uint8_t* p, uint32_t len, ByteBuf& out);
  // the stream section of an OK answer to a stream request at `pos` (count positions)
  void stream_answer(LogState& s, const uint8_t* ids, uint32_t nstreams, uint64_t pos,
                     uint32_t count, ByteBuf& out, uint32_t history = 0);
  void remember(StreamRing& ring, uint64_t pos, uint32_t count);
  void forget_streams(LogState& s, uint64_t from);
  FrameResult refuse_hello(SeqrSession& s, uint8_t status, Refusal why, ByteBuf& out,
                           const char* detail);
  FrameResult refuse_proof(SeqrSession& s, uint8_t reason, Refusal why, ByteBuf& out);
  void log_refusal(const SeqrSession& s, Refusal why, const char* detail);
  uint32_t effective_max_count() const;

  const uint32_t max_connections_;
  const uint32_t max_frame_;
  const uint32_t max_name_;
  const uint32_t max_count_;
  const bool require_auth_;
  std::atomic<uint32_t> max_rate_{0}, max_outstanding_{0};

  // io thread only
  std::unordered_map<std::string, PoolKeys> pools_;
  std::chrono::steady_clock::time_point log_window_{};
  uint32_t logged_in_window_ = 0, suppressed_logs_ = 0;

  // io thread only
  std::unordered_map<std::string, LogState> table_;
  std::string key_;
  size_t history_kept_ = 0;  // positions in every stream's history (kStreamHistoryBudget)
  struct Local {
    uint64_t requests = 0, positions = 0, bad_requests = 0, stale = 0, retries = 0,
             recovery_failed = 0, not_authorised = 0, rate_limited = 0;
  } local_;

  uint64_t batch_requests_ = 0;  // io thread: requests in the current batch
  std::atomic<uint64_t> latency_buckets_[kLatencyBuckets] = {};
  std::atomic<uint64_t> latency_sum_ns_{0}, latency_count_{0};

  std::atomic<uint64_t> requests_{0}, positions_{0}, bad_requests_{0}, stale_{0},
      retries_{0}, recovery_failed_{0}, recoveries_queued_{0}, logs_{0};
  std::atomic<uint64_t> auth_ok_{0}, not_authorised_{0}, rate_limited_{0}, revoked_{0}, probes_{0};
  std::atomic<uint64_t> history_kept_seen_{0};  // history_kept_, for stats() from other threads
  std::atomic<uint64_t> refused_[REFUSAL_KINDS] = {};

  std::mutex rq_mu_;
  std::condition_variable rq_cv_;
  std::vector<RecoveryRequest> rq_;
  bool rq_stopped_ = false;
};

}  // namespace seqr
