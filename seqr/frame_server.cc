#include "frame_server.h"

#include <cstring>
#include <future>
#include <stdexcept>
#include <vector>

#include "log.h"
#include "protocol.h"

namespace seqr {

namespace {
constexpr size_t kOutHighWater = 1u << 20;  // pause reading above this
constexpr size_t kInMinCap = 64 * 1024;
}  // namespace

struct FrameServer::Conn {
  Conn(tcp::socket s, size_t cap, asio::io_context& ioc)
      : sock(std::move(s)), in(new uint8_t[cap]), timer(ioc) {}
  tcp::socket sock;
  std::unique_ptr<asio::ssl::stream<tcp::socket&>> tls;  // set once the client opens TLS
  std::unique_ptr<uint8_t[]> in;
  size_t in_len = 0;
  ByteBuf out;
  ByteBuf wbuf;
  std::unique_ptr<Session> sess;
  asio::steady_timer timer;  // the handshake deadline
  bool first_read = true;
  bool timer_armed = false;
  bool writing = false;
  bool closed = false;
  bool closing = false;   // no more frames: close once the output is written
  bool draining = false;  // output written and FIN sent: discarding input until the client closes
  bool reading = false;   // a read is pending
  bool read_paused = false;
};

FrameServer::FrameServer(std::string host, uint16_t port, uint32_t max_connections,
                         uint32_t min_frame, uint32_t max_frame, const TlsFiles& tls,
                         double handshake_timeout_s)
    : host_(std::move(host)),
      req_port_(port),
      max_connections_(max_connections),
      min_frame_(min_frame),
      max_frame_(max_frame),
      in_cap_(std::max<size_t>(kInMinCap, 2 * (size_t(max_frame) + 4))),
      handshake_timeout_s_(handshake_timeout_s) {
  if (min_frame > max_frame) throw std::invalid_argument("min_frame > max_frame");
  if (!(handshake_timeout_s > 0)) throw std::invalid_argument("handshake_timeout_s must be > 0");
  if (tls.cert_file.empty() != tls.key_file.empty())
    throw std::invalid_argument("TLS needs both a certificate and a private key file");
  if (!tls.cert_file.empty()) {
    tls_ctx_ = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    tls_ctx_->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                          asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                          asio::ssl::context::no_tlsv1_1 | asio::ssl::context::single_dh_use);
    boost::system::error_code ec;
    tls_ctx_->use_certificate_chain_file(tls.cert_file, ec);
    if (ec)
      throw std::invalid_argument("cannot load the TLS certificate " + tls.cert_file + ": " +
                                  ec.message());
    tls_ctx_->use_private_key_file(tls.key_file, asio::ssl::context::pem, ec);
    if (ec)
      throw std::invalid_argument("cannot load the TLS private key " + tls.key_file + ": " +
                                  ec.message());
  }
}

FrameServer::~FrameServer() { stop(); }

void FrameServer::start() {
  std::lock_guard<std::mutex> lk(life_mu_);
  if (started_) throw std::logic_error("server already started");
  tcp::resolver resolver(ioc_);
  auto results = resolver.resolve(host_, std::to_string(req_port_),
                                  tcp::resolver::passive | tcp::resolver::numeric_service);
  boost::system::error_code last_ec = asio::error::host_not_found;
  for (const auto& entry : results) {
    boost::system::error_code ec;
    acceptor_.open(entry.endpoint().protocol(), ec);
    if (ec) { last_ec = ec; continue; }
    acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    acceptor_.bind(entry.endpoint(), ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      last_ec = ec;
      boost::system::error_code ig;
      acceptor_.close(ig);
      continue;
    }
    last_ec = {};
    break;
  }
  if (last_ec) {
    throw boost::system::system_error(last_ec, "cannot listen on " + host_ + ":" +
                                                   std::to_string(req_port_));
  }
  bound_port_.store(acceptor_.local_endpoint().port());
  guard_.emplace(asio::make_work_guard(ioc_));
  do_accept();
  started_ = true;
  running_ = true;
  running_flag_.store(true);
  thread_ = std::thread([this] { io_main(); });
  SEQR_LOG(LL_INFO, "listening on %s:%u", host_.c_str(), unsigned(bound_port_.load()));
}

void FrameServer::io_main() {
  for (;;) {
    try {
      ioc_.run();
      return;
    } catch (const std::exception& e) {
      SEQR_LOG(LL_ERROR, "exception on io thread: %s", e.what());
    }
  }
}

void FrameServer::stop() {
  {
    std::lock_guard<std::mutex> lk(life_mu_);
    if (!running_) return;
    running_ = false;
    asio::post(ioc_, [this] {
      stopping_ = true;
      boost::system::error_code ig;
      acceptor_.close(ig);
      accept_timer_.cancel();
      std::vector<ConnPtr> all;
      all.reserve(conns_.size());
      for (auto& kv : conns_) all.push_back(kv.second);
      for (auto& c : all) close_conn(c);
      guard_.reset();
    });
    // run() returns once the aborted handlers have drained.
    if (thread_.joinable()) thread_.join();
    running_flag_.store(false);
  }
  on_stopped();
}

void FrameServer::run_on_io(const std::function<void()>& fn) {
  std::unique_lock<std::mutex> lk(life_mu_);
  if (!running_) {
    fn();
    return;
  }
  std::promise<void> done;
  auto fut = done.get_future();
  asio::post(ioc_, [&fn, &done] {
    try {
      fn();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  });
  fut.get();  // life_mu_ held: stop() cannot run until fn has completed
}

void FrameServer::do_accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket s) {
    if (stopping_) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      SEQR_LOG(LL_WARNING, "accept failed: %s (retrying in 100 ms)", ec.message().c_str());
      accept_timer_.expires_after(std::chrono::milliseconds(100));
      accept_timer_.async_wait([this](const boost::system::error_code& tec) {
        if (!tec && !stopping_) do_accept();
      });
      return;
    }
    boost::system::error_code ig;
    if (conns_.size() >= max_connections_) {
      connections_rejected_.fetch_add(1, std::memory_order_relaxed);
      SEQR_LOG(LL_DEBUG, "connection limit (%u) reached, closing new connection",
               unsigned(max_connections_));
      s.close(ig);
    } else {
      connections_total_.fetch_add(1, std::memory_order_relaxed);
      s.set_option(tcp::no_delay(true), ig);
      auto c = std::make_shared<Conn>(std::move(s), in_cap_, ioc_);
      c->sess = new_session();
      const auto ep = c->sock.remote_endpoint(ig);
      c->sess->peer = ig ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
      conns_.emplace(c.get(), c);
      connections_open_.store(conns_.size(), std::memory_order_relaxed);
      if (!c->sess->established) {
        c->timer_armed = true;
        // a connection that never completes its handshake must not hold a slot for ever
        c->timer.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(handshake_timeout_s_)));
        c->timer.async_wait([this, c](const boost::system::error_code& tec) {
          if (tec || c->closed || c->sess->established) return;
          handshake_timeouts_.fetch_add(1, std::memory_order_relaxed);
          SEQR_LOG(LL_WARNING, "closed the connection from %s: no handshake within %.1f s",
                   c->sess->peer.c_str(), handshake_timeout_s_);
          close_conn(c);
        });
      }
      do_read(c);
    }
    do_accept();
  });
}

void FrameServer::do_read(const ConnPtr& c) {
  auto buf = asio::buffer(c->in.get() + c->in_len, in_cap_ - c->in_len);
  auto done = [this, c](const boost::system::error_code& ec, size_t n) {
    c->reading = false;
    on_read(c, ec, n);
  };
  c->reading = true;
  if (c->tls)
    c->tls->async_read_some(buf, std::move(done));
  else
    c->sock.async_read_some(buf, std::move(done));
}

void FrameServer::start_tls(const ConnPtr& c) {
  c->tls = std::make_unique<asio::ssl::stream<tcp::socket&>>(c->sock, *tls_ctx_);
  // the bytes already read are the start of the client's TLS handshake
  c->tls->async_handshake(
      asio::ssl::stream_base::server, asio::buffer(c->in.get(), c->in_len),
      [this, c](const boost::system::error_code& ec, size_t used) {
        if (c->closed) return;
        if (ec) {
          tls_failures_.fetch_add(1, std::memory_order_relaxed);
          SEQR_LOG(LL_WARNING, "TLS handshake with %s failed: %s", c->sess->peer.c_str(),
                   ec.message().c_str());
          close_conn(c);
          return;
        }
        tls_connections_.fetch_add(1, std::memory_order_relaxed);
        (void)used;  // a client sends nothing after its first flight until the server answers it
        c->in_len = 0;
        c->sess->tls = true;
        c->sess->ssl = c->tls->native_handle();
        do_read(c);
      });
}

void FrameServer::on_read(const ConnPtr& c, const boost::system::error_code& ec, size_t n) {
  if (c->closed) return;
  if (c->closing) {  // what a refused client sends after the refusal is dropped
    c->in_len = 0;
    if (ec)
      close_conn(c);
    else if (c->draining)
      do_read(c);
    return;
  }
  if (ec) {
    if (ec != asio::error::eof && ec != asio::error::operation_aborted)
      SEQR_LOG(LL_DEBUG, "read error: %s", ec.message().c_str());
    if (c->in_len) SEQR_LOG(LL_DEBUG, "connection closed mid-frame (%zu bytes dropped)", c->in_len);
    close_conn(c);
    return;
  }
  c->in_len += n;
  if (c->first_read) {
    // a TLS record header opens TLS: 0x16 (handshake), version 3.1 to 3.4.
    // No first frame of ours starts so: its length would be 0x0?0316 with
    // ? in 1..4, over 66,000 bytes, more than any HELLO
    if (c->in_len < 3) {
      do_read(c);
      return;
    }
    c->first_read = false;
    const uint8_t* h = c->in.get();
    if (h[0] == 0x16 && h[1] == 0x03 && h[2] >= 1 && h[2] <= 4) {
      if (tls_ctx_) {
        start_tls(c);
        return;
      }
      bad_frames_.fetch_add(1, std::memory_order_relaxed);
      SEQR_LOG(LL_WARNING, "%s began a TLS handshake, but this server has no TLS certificate; closing",
               c->sess->peer.c_str());
      close_conn(c);
      return;
    }
  }
  process(c);
}

void FrameServer::process(const ConnPtr& c) {
  batch_start_ = std::chrono::steady_clock::now();
  uint8_t* b = c->in.get();
  size_t pos = 0;
  bool bad = false, held = false;
  uint32_t bad_len = 0;
  FrameResult result = FrameResult::CONTINUE;
  while (c->in_len - pos >= 4) {
    const uint32_t len = get_u32(b + pos);
    if (len > max_frame_ || len < min_frame_ || len < c->sess->min_frame) {
      bad = true;
      bad_len = len;
      break;
    }
    if (c->in_len - pos - 4 < len) break;
    result = handle_frame(*c->sess, b + pos + 4, len, c->out);
    pos += 4 + size_t(len);
    if (result != FrameResult::CONTINUE) break;
    // answers can be far larger than requests (a stream history): the rest
    // waits until this much is written, so a client that does not read
    // cannot make the server hold more than about this per connection
    if (c->out.size() >= kOutHighWater) {
      held = c->in_len - pos >= 4;
      break;
    }
  }
  on_batch_done();
  if (c->timer_armed && c->sess->established) {
    c->timer_armed = false;
    c->timer.cancel();
  }
  if (bad || result == FrameResult::BAD_FRAME) {
    bad_frames_.fetch_add(1, std::memory_order_relaxed);
    if (bad)
      SEQR_LOG(LL_DEBUG, "bad frame length %u (allowed %u..%u), closing connection",
               unsigned(bad_len), unsigned(std::max(min_frame_, c->sess->min_frame)),
               unsigned(max_frame_));
    close_conn(c);
    return;
  }
  if (result == FrameResult::CLOSE_AFTER_FLUSH) {
    c->closing = true;
    c->in_len = 0;
    flush(c);
    return;
  }
  if (pos) {
    const size_t rest = c->in_len - pos;
    if (rest) std::memmove(b, b + pos, rest);
    c->in_len = rest;
  }
  flush(c);
  if (c->closed) return;
  if (held || (c->writing && c->out.size() >= kOutHighWater)) {
    c->read_paused = true;  // resumed by the write completion, frames held first
    return;
  }
  do_read(c);
}

size_t FrameServer::close_sessions(const std::function<bool(Session&)>& pred) {
  std::vector<ConnPtr> picked;
  for (auto& kv : conns_)
    if (!kv.second->closing && pred(*kv.second->sess)) picked.push_back(kv.second);
  for (auto& c : picked) {
    c->closing = true;
    flush(c);
  }
  return picked.size();
}

void FrameServer::flush(const ConnPtr& c) {
  if (c->writing || c->closed) return;
  if (c->out.empty()) {
    if (c->closing) drain_and_close(c);
    return;
  }
  std::swap(c->out, c->wbuf);
  c->out.clear();
  c->writing = true;
  auto buf = asio::buffer(c->wbuf.data(), c->wbuf.size());
  auto done = [this, c](const boost::system::error_code& ec, size_t) {
    c->writing = false;
    c->wbuf.clear();
    if (c->closed) return;
    if (ec) {
      SEQR_LOG(LL_DEBUG, "write error: %s", ec.message().c_str());
      close_conn(c);
      return;
    }
    flush(c);
    if (c->closed || c->closing) return;
    if (c->read_paused && !(c->writing && c->out.size() >= kOutHighWater)) {
      c->read_paused = false;
      process(c);  // the frames held back, if any; then it reads on
    }
  };
  if (c->tls)
    asio::async_write(*c->tls, buf, std::move(done));
  else
    asio::async_write(c->sock, buf, std::move(done));
}

void FrameServer::drain_and_close(const ConnPtr& c) {
  if (c->draining) return;
  c->draining = true;
  // FIN after the last answer, then read until the client closes: closing
  // with its unread bytes in our buffer would send a reset, which can
  // destroy the refusal before the client reads it
  boost::system::error_code ig;
  c->sock.shutdown(tcp::socket::shutdown_send, ig);
  c->timer.expires_after(std::chrono::seconds(1));
  c->timer.async_wait([this, c](const boost::system::error_code& tec) {
    if (!tec) close_conn(c);
  });
  c->in_len = 0;
  if (!c->reading) do_read(c);
}

void FrameServer::close_conn(const ConnPtr& c) {
  if (c->closed) return;
  c->closed = true;
  boost::system::error_code ig;
  c->timer.cancel();
  c->sock.shutdown(tcp::socket::shutdown_both, ig);
  c->sock.close(ig);
  conns_.erase(c.get());
  connections_open_.store(conns_.size(), std::memory_order_relaxed);
}

FrameResult EchoServer::handle_frame(Session&, const uint8_t* payload, uint32_t len, ByteBuf& out) {
  uint8_t* p = out.extend(4 + size_t(len));
  put_u32(p, len);
  if (len) std::memcpy(p + 4, payload, len);
  ++local_frames_;
  return FrameResult::CONTINUE;
}

void EchoServer::on_batch_done() {
  if (local_frames_) {
    frames_.fetch_add(local_frames_, std::memory_order_relaxed);
    local_frames_ = 0;
  }
}

}  // namespace seqr
