// A single-threaded Boost.Asio server for u32-length-prefixed frames.
// Subclasses implement handle_frame(); everything runs on one io thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include "bytebuf.h"

namespace seqr {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// What a subclass keeps per connection (FrameServer::new_session makes it).
struct Session {
  virtual ~Session() = default;
  std::string peer;            // the client's address, for log lines
  bool tls = false;            // the connection runs TLS (known before its first frame)
  void* ssl = nullptr;         // its SSL* when tls
  bool established = true;     // false: closed unless it becomes true within the handshake timeout
  uint32_t min_frame = 0;      // frames shorter than this (or the server's min_frame) close the connection
};

// What FrameServer does after handle_frame.
enum class FrameResult {
  CONTINUE,
  CLOSE_AFTER_FLUSH,  // read nothing more, write what is queued, then close
  BAD_FRAME,          // close now (counted in bad_frames)
};

struct TlsFiles {  // both empty: no TLS
  std::string cert_file;  // PEM certificate chain
  std::string key_file;   // PEM private key
};

class FrameServer {
 public:
  // With TLS files, a connection whose first byte opens a TLS handshake runs
  // TLS; the others run plaintext (the subclass decides whether to serve them,
  // from Session::tls). handshake_timeout_s bounds how long a session may stay
  // not established.
  FrameServer(std::string host, uint16_t port, uint32_t max_connections,
              uint32_t min_frame, uint32_t max_frame, const TlsFiles& tls = TlsFiles(),
              double handshake_timeout_s = 5.0);
  virtual ~FrameServer();
  FrameServer(const FrameServer&) = delete;
  FrameServer& operator=(const FrameServer&) = delete;

  // Binds, listens and starts the io thread. Throws boost::system::system_error
  // if the address cannot be bound, std::logic_error if already started.
  void start();
  // Closes the acceptor and all connections and joins the io thread.
  // Idempotent. Subclasses must call it from their destructor.
  void stop();
  uint16_t port() const { return bound_port_.load(); }
  const std::string& host() const { return host_; }
  bool running() const { return running_flag_.load(); }

  uint64_t connections_open() const { return connections_open_.load(std::memory_order_relaxed); }
  uint64_t connections_total() const { return connections_total_.load(std::memory_order_relaxed); }
  uint64_t connections_rejected() const { return connections_rejected_.load(std::memory_order_relaxed); }
  uint64_t bad_frames() const { return bad_frames_.load(std::memory_order_relaxed); }
  uint64_t handshake_timeouts() const { return handshake_timeouts_.load(std::memory_order_relaxed); }
  uint64_t tls_connections() const { return tls_connections_.load(std::memory_order_relaxed); }
  uint64_t tls_failures() const { return tls_failures_.load(std::memory_order_relaxed); }
  bool tls_enabled() const { return static_cast<bool>(tls_ctx_); }

 protected:
  // Called on the io thread for every complete frame whose length is in
  // [min_frame, max_frame]; appends the response frame(s) to out.
  virtual FrameResult handle_frame(Session& s, const uint8_t* payload, uint32_t len,
                                   ByteBuf& out) = 0;
  // A new connection's state (io thread).
  virtual std::unique_ptr<Session> new_session() { return std::make_unique<Session>(); }
  // Closes, after what is queued for them is written, the sessions pred
  // picks (io thread). Returns how many.
  size_t close_sessions(const std::function<bool(Session&)>& pred);
  // Called on the io thread after each batch of frames read in one go.
  virtual void on_batch_done() {}

  // When the current batch's bytes arrived (io thread only): subclasses
  // time their answers from it (one clock read per batch, not per frame).
  std::chrono::steady_clock::time_point batch_start_{};
  // Called at the end of stop() (caller's thread).
  virtual void on_stopped() {}

  // Runs fn on the io thread and waits for it (or runs it inline when the
  // io thread is not running). Exceptions from fn propagate to the caller.
  void run_on_io(const std::function<void()>& fn);

  asio::io_context ioc_{1};

 private:
  struct Conn;
  using ConnPtr = std::shared_ptr<Conn>;

  void io_main();
  void do_accept();
  void do_read(const ConnPtr& c);
  void on_read(const ConnPtr& c, const boost::system::error_code& ec, size_t n);
  // answers the complete frames buffered, up to the output high-water mark
  // (the rest wait for the write), then reads on or pauses
  void process(const ConnPtr& c);
  void flush(const ConnPtr& c);
  void close_conn(const ConnPtr& c);
  void drain_and_close(const ConnPtr& c);
  void start_tls(const ConnPtr& c);

  const std::string host_;
  const uint16_t req_port_;
  const uint32_t max_connections_;
  const uint32_t min_frame_;
  const uint32_t max_frame_;
  const size_t in_cap_;
  const double handshake_timeout_s_;
  std::unique_ptr<asio::ssl::context> tls_ctx_;

  std::atomic<uint16_t> bound_port_{0};
  std::mutex life_mu_;
  bool started_ = false;
  bool running_ = false;
  std::atomic<bool> running_flag_{false};
  bool stopping_ = false;  // io thread only
  std::thread thread_;
  tcp::acceptor acceptor_{ioc_};
  asio::steady_timer accept_timer_{ioc_};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard_;
  std::unordered_map<Conn*, ConnPtr> conns_;

  std::atomic<uint64_t> connections_open_{0};
  std::atomic<uint64_t> connections_total_{0};
  std::atomic<uint64_t> connections_rejected_{0};
  std::atomic<uint64_t> bad_frames_{0};
  std::atomic<uint64_t> handshake_timeouts_{0};
  std::atomic<uint64_t> tls_connections_{0};
  std::atomic<uint64_t> tls_failures_{0};
};

// Echoes every frame back unchanged: the "network floor" for benchmarks.
class EchoServer : public FrameServer {
 public:
  EchoServer(std::string host, uint16_t port, uint32_t max_frame = 1u << 20)
      : FrameServer(std::move(host), port, 1024, 0, max_frame) {}
  ~EchoServer() override { stop(); }
  uint64_t frames() const { return frames_.load(std::memory_order_relaxed); }

 protected:
  FrameResult handle_frame(Session& s, const uint8_t* payload, uint32_t len,
                           ByteBuf& out) override;
  void on_batch_done() override;

 private:
  uint64_t local_frames_ = 0;
  std::atomic<uint64_t> frames_{0};
};

}  // namespace seqr
