// Blocking sequencer client (plain non-blocking sockets + poll() deadlines).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bytebuf.h"
#include "protocol.h"

namespace seqr {

// Raised when a deadline expires (-> Python TimeoutError).
struct TimeoutError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Raised on refused/reset/closed connections and protocol violations
// (-> Python ConnectionError or a subclass).
struct ConnectionError : std::runtime_error {
  enum Kind { GENERIC, REFUSED, RESET, ABORTED, BROKEN_PIPE, CLOSED };
  ConnectionError(Kind k, const std::string& msg) : std::runtime_error(msg), kind(k) {}
  Kind kind;
};

// The handshake failed: the server refused this client (status: NOT_SERVED,
// AUTH_FAILED, ...), or the client refused the server (it proved no key, or
// asked for none while the client requires it). The server answered, so it
// is alive (-> Python pyzlog._seqr.AuthError, a PermissionError).
struct AuthError : std::runtime_error {
  AuthError(uint8_t st, uint8_t why, uint32_t server_gen, const std::string& msg)
      : std::runtime_error(msg), status(st), reason(why), server_generation(server_gen) {}
  uint8_t status;              // the server's refusal, or ST_AUTH_FAILED for the client's own
  uint8_t reason;              // AuthReason for ST_AUTH_FAILED from the server
  uint32_t server_generation;  // the server's current key generation, if it said
};

// One generation of a pool's secret.
struct Key {
  uint32_t generation = 0;
  std::string secret;
};

struct Tls {
  bool enabled = false;
  // Verify the server's certificate against these CAs (PEM file), and its
  // name against server_name (default: the host connected to). Empty: no
  // verification; the handshake's channel binding still defeats a man in
  // the middle whenever the pool's key is used.
  std::string ca_file;
  std::string server_name;
};

// How a connection authenticates (docs/seqr-protocol.md, "Handshake").
struct Auth {
  // The pool the connection is for; empty: no handshake at all (raw frames:
  // the echo server, tests of the handshake itself).
  std::string pool;
  std::vector<Key> keys;  // the pool's secrets (any order)
  // Accept a server that asks for no proof (zlog-seqr --insecure). Off: a
  // client holding the key talks only to a server that proves it holds it too.
  bool insecure = false;
  // A liveness probe: a HELLO with no pool, and the constructor returns as
  // soon as the server answers it (the server counts it, and logs nothing).
  bool probe = false;
  Tls tls;
};

// What the server allows this connection (from its WELCOME).
struct Limits {
  uint32_t max_count = 0;        // positions per NEXT
  uint32_t max_outstanding = 0;  // token bucket size (0: no rate limit)
  uint32_t max_rate = 0;         // positions per second (0: no limit)
};

struct Response {
  uint64_t request_id;
  uint8_t status;
  uint64_t epoch;
  uint64_t position;
  uint32_t count;
};

// One stream's part of an answer to a stream request (docs/seqr-protocol.md, "Streams").
struct StreamBackpointers {
  uint64_t stream = 0;
  uint64_t horizon = 0;             // the server knows the stream from here on
  uint64_t ordinal = 0;             // the answer's position's ordinal in the stream
  std::vector<uint64_t> positions;  // its last positions below the answer's, newest first
  std::vector<std::pair<uint8_t, uint64_t>> levels;  // (level, position) skip pointers
  std::vector<uint64_t> history;  // STREAM_HISTORY: its last positions, newest first
};

struct StreamResponse {
  Response response;
  uint8_t max_backpointers = 0;  // K: a full list has this many
  std::vector<StreamBackpointers> streams;  // in request order (empty unless OK)
};

struct PipelineResult {
  uint64_t requests = 0;
  uint64_t ok = 0, stale = 0, retry = 0, bad_request = 0, recovery_failed = 0, other = 0;
  uint64_t not_authorised = 0, rate_limited = 0;
  uint64_t positions = 0;
  bool have_positions = false;
  uint64_t first_position = 0;  // lowest position handed out
  uint64_t last_position = 0;   // highest position handed out
  bool ascending = true;        // every OK range started where the previous ended
  uint64_t bytes_sent = 0, bytes_received = 0;
  double elapsed_s = 0;
  std::vector<std::pair<uint64_t, uint32_t>> ranges;  // (position, count) of OK replies
};

class Client {
 public:
  // Connects and, with auth.pool set, runs the handshake (TLS first if
  // auth.tls.enabled): throws AuthError if either side refuses the other,
  // ConnectionError / TimeoutError on transport failures.
  Client(const std::string& host, uint16_t port, double timeout_s = 5.0,
         const Auth& auth = Auth());
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  Response next(const std::string& pool, const std::string& log, uint64_t epoch,
                uint32_t count = 1);
  Response tail(const std::string& pool, const std::string& log, uint64_t epoch);
  // STREAM_NEXT (count >= 1) or, with count 0, STREAM_TAIL for `streams`; with
  // count 0 and history >= 1, STREAM_HISTORY (up to `history` positions each).
  StreamResponse streams(const std::string& pool, const std::string& log, uint64_t epoch,
                         uint32_t count, const std::vector<uint64_t>& streams, uint32_t history = 0);
  uint64_t send_request(uint8_t op, const std::string& pool, const std::string& log,
                        uint64_t epoch, uint32_t count);
  Response recv();
  PipelineResult pipeline_next(const std::string& pool, const std::string& log,
                               uint64_t epoch, uint32_t count_per_request,
                               uint64_t total_requests, uint32_t depth, bool collect);
  PipelineResult pipeline_echo(uint32_t frame_size, uint64_t total_requests, uint32_t depth);
  void send_raw(const std::string& data);
  // Returns up to max_bytes (at least one) bytes, "" on orderly EOF; raises
  // TimeoutError if nothing arrives within timeout_s.
  std::string recv_raw(size_t max_bytes, double timeout_s);
  void close();
  bool closed() const { return fd_ < 0; }
  double timeout() const { return timeout_s_; }
  void set_timeout(double t) { timeout_s_ = t; }
  const std::string& pool() const { return pool_; }
  uint32_t generation() const { return generation_; }  // the key generation proved (0: none)
  bool authenticated() const { return authenticated_; }  // the server proved the key too
  bool tls() const { return ssl_ != nullptr; }
  const Limits& limits() const { return limits_; }

 private:
  using Clock = std::chrono::steady_clock;
  void tls_connect(const Auth& auth, const std::string& host, Clock::time_point dl);
  void handshake(const Auth& auth, Clock::time_point dl);
  void wait_io(short events, Clock::time_point dl, const char* what);
  [[noreturn]] void throw_tls(const char* what, int ret);
  Clock::time_point deadline() const;
  void check_open() const;
  void encode(ByteBuf& b, uint8_t op, uint64_t rid, uint64_t epoch, uint32_t count,
              const std::string& pool, const std::string& log);
  void send_all(const uint8_t* p, size_t n, Clock::time_point dl);
  // Reads whatever is available (waiting until dl for at least one byte).
  void fill(Clock::time_point dl);
  // Reads without blocking; returns false if nothing was available.
  bool fill_nonblocking();
  size_t read_into_buffer();  // 0 -> EAGAIN; throws on EOF/error
  // Returns a complete buffered frame, or {nullptr, 0} if none.
  bool try_frame(const uint8_t*& payload, uint32_t& len, uint32_t max_len);
  void read_frame(const uint8_t*& payload, uint32_t& len, uint32_t max_len,
                  Clock::time_point dl);
  Response parse_response(const uint8_t* p, uint32_t len);
  StreamResponse parse_stream_response(const uint8_t* p, uint32_t len, size_t nstreams, uint32_t history);
  Response wait_for(uint64_t rid);
  [[noreturn]] void throw_errno(const char* what, int err);

  std::mutex mu_;
  int fd_ = -1;
  void* ssl_ = nullptr;      // SSL* with TLS
  void* ssl_ctx_ = nullptr;  // SSL_CTX*
  short want_ = 0;           // what the last TLS read waits for (POLLIN / POLLOUT)
  std::string pool_;
  uint32_t generation_ = 0;
  bool authenticated_ = false;
  Limits limits_;
  double timeout_s_;
  std::string peer_;
  uint64_t next_rid_ = 1;
  std::vector<uint8_t> in_;
  size_t rpos_ = 0, rlen_ = 0;
  ByteBuf out_;
};

}  // namespace seqr
