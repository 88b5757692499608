#include "client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace seqr {

namespace {

constexpr size_t kInitialIn = 256 * 1024;

int poll_ms(std::chrono::steady_clock::time_point dl) {
  auto now = std::chrono::steady_clock::now();
  if (dl <= now) return 0;
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(dl - now).count();
  long long ms = (us + 999) / 1000;
  return static_cast<int>(std::min<long long>(ms, 1 << 30));
}

}  // namespace

void Client::throw_errno(const char* what, int err) {
  std::string msg = std::string(what) + " (" + peer_ + "): " + std::strerror(err);
  switch (err) {
    case ECONNREFUSED: throw ConnectionError(ConnectionError::REFUSED, msg);
    case ECONNRESET: throw ConnectionError(ConnectionError::RESET, msg);
    case ECONNABORTED: throw ConnectionError(ConnectionError::ABORTED, msg);
    case EPIPE: throw ConnectionError(ConnectionError::BROKEN_PIPE, msg);
    case ETIMEDOUT: throw TimeoutError(msg);
    default: throw ConnectionError(ConnectionError::GENERIC, msg);
  }
}

Client::Client(const std::string& host, uint16_t port, double timeout_s)
    : timeout_s_(timeout_s), peer_(host + ":" + std::to_string(port)), in_(kInitialIn) {
  if (!(timeout_s > 0) || !std::isfinite(timeout_s))
    throw std::invalid_argument("timeout_s must be a positive number");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string ps = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), ps.c_str(), &hints, &res);
  if (rc != 0)
    throw ConnectionError(ConnectionError::GENERIC,
                          "cannot resolve " + host + ": " + gai_strerror(rc));
  const auto dl = deadline();
  int last_err = ECONNREFUSED;
  bool timed_out = false;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                      ai->ai_protocol);
    if (fd < 0) {
      last_err = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      fd_ = fd;
      break;
    }
    if (errno != EINPROGRESS) {
      last_err = errno;
      ::close(fd);
      continue;
    }
    pollfd pfd{fd, POLLOUT, 0};
    int pr;
    do {
      pr = ::poll(&pfd, 1, poll_ms(dl));
    } while (pr < 0 && errno == EINTR);
    if (pr == 0) {
      timed_out = true;
      ::close(fd);
      continue;
    }
    int err = 0;
    socklen_t el = sizeof err;
    if (pr < 0) err = errno;
    else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0) err = errno;
    if (err == 0) {
      fd_ = fd;
      break;
    }
    last_err = err;
    ::close(fd);
  }
  freeaddrinfo(res);
  if (fd_ < 0) {
    if (timed_out) throw TimeoutError("timed out connecting to " + peer_);
    throw_errno("cannot connect", last_err);
  }
}

Client::~Client() { close(); }

void Client::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Client::check_open() const {
  if (fd_ < 0) throw ConnectionError(ConnectionError::GENERIC, "client is closed");
}

Client::Clock::time_point Client::deadline() const {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(std::min(timeout_s_, 1e9)));
}

void Client::encode(ByteBuf& b, uint8_t op, uint64_t rid, uint64_t epoch, uint32_t count,
                    const std::string& pool, const std::string& log) {
  if (pool.size() > 65535 || log.size() > 65535)
    throw std::invalid_argument("pool/log name longer than 65535 bytes");
  const uint32_t plen = static_cast<uint32_t>(pool.size());
  const uint32_t llen = static_cast<uint32_t>(log.size());
  const uint32_t payload = kReqMinPayload + plen + llen;
  uint8_t* p = b.extend(4 + size_t(payload));
  put_u32(p, payload);
  p += 4;
  p[0] = op;
  put_u64(p + 1, rid);
  put_u64(p + 9, epoch);
  put_u32(p + 17, count);
  put_u16(p + 21, static_cast<uint16_t>(plen));
  if (plen) std::memcpy(p + 23, pool.data(), plen);
  put_u16(p + 23 + plen, static_cast<uint16_t>(llen));
  if (llen) std::memcpy(p + 25 + plen, log.data(), llen);
}

size_t Client::read_into_buffer() {
  if (rpos_ == rlen_) {
    rpos_ = rlen_ = 0;
  } else if (rpos_ > 0 && in_.size() - rlen_ < 16384) {
    std::memmove(in_.data(), in_.data() + rpos_, rlen_ - rpos_);
    rlen_ -= rpos_;
    rpos_ = 0;
  }
  if (in_.size() - rlen_ < 4096) in_.resize(in_.size() * 2);
  for (;;) {
    ssize_t n = ::recv(fd_, in_.data() + rlen_, in_.size() - rlen_, 0);
    if (n > 0) {
      rlen_ += size_t(n);
      return size_t(n);
    }
    if (n == 0) throw ConnectionError(ConnectionError::CLOSED, "connection closed by server (" + peer_ + ")");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw_errno("recv failed", errno);
  }
}

bool Client::fill_nonblocking() { return read_into_buffer() > 0; }

void Client::fill(Clock::time_point dl) {
  for (;;) {
    if (read_into_buffer() > 0) return;
    pollfd pfd{fd_, POLLIN, 0};
    int ms = poll_ms(dl);
    if (ms == 0) throw TimeoutError("timed out waiting for the sequencer (" + peer_ + ")");
    int pr = ::poll(&pfd, 1, ms);
    if (pr < 0 && errno != EINTR) throw_errno("poll failed", errno);
  }
}

void Client::send_all(const uint8_t* p, size_t n, Clock::time_point dl) {
  while (n > 0) {
    ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= size_t(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) throw_errno("send failed", errno);
    // Socket buffer full: wait for room, draining replies meanwhile so that
    // a peer blocked on writing to us cannot deadlock with us.
    pollfd pfd{fd_, POLLOUT | POLLIN, 0};
    int ms = poll_ms(dl);
    if (ms == 0) throw TimeoutError("timed out sending to the sequencer (" + peer_ + ")");
    int pr = ::poll(&pfd, 1, ms);
    if (pr < 0 && errno != EINTR) throw_errno("poll failed", errno);
    if (pr > 0 && (pfd.revents & POLLIN)) read_into_buffer();
  }
}

bool Client::try_frame(const uint8_t*& payload, uint32_t& len, uint32_t max_len) {
  const size_t avail = rlen_ - rpos_;
  if (avail < 4) return false;
  const uint32_t l = get_u32(in_.data() + rpos_);
  if (l > max_len)
    throw ConnectionError(ConnectionError::GENERIC,
                          "protocol error: frame of " + std::to_string(l) +
                              " bytes from " + peer_);
  if (avail - 4 < l) {
    if (in_.size() < size_t(l) + 4 + 4096) {
      // make room for a large frame
      std::memmove(in_.data(), in_.data() + rpos_, avail);
      rlen_ = avail;
      rpos_ = 0;
      in_.resize(size_t(l) + 4 + 65536);
    }
    return false;
  }
  payload = in_.data() + rpos_ + 4;
  len = l;
  rpos_ += 4 + size_t(l);
  return true;
}

void Client::read_frame(const uint8_t*& payload, uint32_t& len, uint32_t max_len,
                        Clock::time_point dl) {
  while (!try_frame(payload, len, max_len)) fill(dl);
}

Response Client::parse_response(const uint8_t* p, uint32_t len) {
  if (len != kRespPayload)
    throw ConnectionError(ConnectionError::GENERIC,
                          "protocol error: response payload of " + std::to_string(len) +
                              " bytes from " + peer_);
  Response r;
  r.status = p[0];
  r.request_id = get_u64(p + 1);
  r.epoch = get_u64(p + 9);
  r.position = get_u64(p + 17);
  r.count = get_u32(p + 25);
  return r;
}

uint64_t Client::send_request(uint8_t op, const std::string& pool, const std::string& log,
                              uint64_t epoch, uint32_t count) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open();
  out_.clear();
  const uint64_t rid = next_rid_++;
  encode(out_, op, rid, epoch, count, pool, log);
  send_all(out_.data(), out_.size(), deadline());
  return rid;
}

Response Client::recv() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open();
  const uint8_t* p;
  uint32_t len;
  read_frame(p, len, 1u << 20, deadline());
  return parse_response(p, len);
}

Response Client::wait_for(uint64_t rid) {
  const auto dl = deadline();
  for (;;) {
    const uint8_t* p;
    uint32_t len;
    read_frame(p, len, 1u << 20, dl);
    Response r = parse_response(p, len);
    if (r.request_id == rid) return r;
    if (r.request_id > rid)
      throw ConnectionError(ConnectionError::GENERIC,
                            "protocol error: unexpected request id in response");
    // else: a late answer to an earlier request (e.g. one that timed out)
  }
}

Response Client::next(const std::string& pool, const std::string& log, uint64_t epoch,
                      uint32_t count) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open();
  out_.clear();
  const uint64_t rid = next_rid_++;
  encode(out_, OP_NEXT, rid, epoch, count, pool, log);
  send_all(out_.data(), out_.size(), deadline());
  return wait_for(rid);
}

Response Client::tail(const std::string& pool, const std::string& log, uint64_t epoch) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open();
  out_.clear();
  const uint64_t rid = next_rid_++;
  encode(out_, OP_TAIL, rid, epoch, 0, pool, log);
  send_all(out_.data(), out_.size(), deadline());
  return wait_for(rid);
}

PipelineResult Client::pipeline_next(const std::string& pool, const std::string& log,
                                     uint64_t epoch, uint32_t count_per_request,
                                     uint64_t total_requests, uint32_t depth, bool collect) {
  if (depth == 0) throw std::invalid_argument("depth must be >= 1");
  std::lock_guard<std::mutex> lk(mu_);
  check_open();
  // Frame template; only the request id changes.
  ByteBuf tmpl;
  encode(tmpl, OP_NEXT, 0, epoch, count_per_request, pool, log);
  const size_t flen = tmpl.size();
  PipelineResult res;
  if (collect) res.ranges.reserve(std::min<uint64_t>(total_requests, 1u << 24));
  const uint64_t base = next_rid_;
  next_rid_ += total_requests;
  uint64_t sent = 0, done = 0;
  uint64_t expect_next_pos = 0;
  const auto t0 = Clock::now();
  while (done < total_requests) {
    out_.clear();
    while (sent < total_requests && sent - done < depth) {
      uint8_t* p = out_.extend(flen);
      std::memcpy(p, tmpl.data(), flen);
      put_u64(p + 5, base + sent);
      ++sent;
    }
    if (!out_.empty()) {
      send_all(out_.data(), out_.size(), deadline());
      res.bytes_sent += out_.size();
    }
    const uint8_t* p;
    uint32_t len;
    read_frame(p, len, 1u << 20, deadline());
    for (;;) {
      Response r = parse_response(p, len);
      res.bytes_received += 4 + size_t(len);
      if (r.request_id != base + done)
        throw ConnectionError(ConnectionError::GENERIC,
                              "protocol error: response out of order (got id " +
                                  std::to_string(r.request_id) + ", expected " +
                                  std::to_string(base + done) + ")");
      ++done;
      switch (r.status) {
        case ST_OK:
          ++res.ok;
          res.positions += r.count;
          if (r.count) {
            if (!res.have_positions) {
              res.have_positions = true;
              res.first_position = r.position;
              res.last_position = r.position + r.count - 1;
            } else {
              if (r.position != expect_next_pos) res.ascending = false;
              res.first_position = std::min(res.first_position, r.position);
              res.last_position = std::max(res.last_position, r.position + r.count - 1);
            }
            expect_next_pos = r.position + r.count;
          }
          if (collect) res.ranges.emplace_back(r.position, r.count);
          break;
        case ST_STALE_EPOCH: ++res.stale; break;
        case ST_RETRY: ++res.retry; break;
        case ST_BAD_REQUEST: ++res.bad_request; break;
        case ST_RECOVERY_FAILED: ++res.recovery_failed; break;
        default: ++res.other; break;
      }
      if (done >= total_requests || !try_frame(p, len, 1u << 20)) break;
    }
  }
  res.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  res.requests = done;
  return res;
}

PipelineResult Client::pipeline_echo(uint32_t frame_size, uint64_t total_requests,
                                     uint32_t depth) {
  if (depth == 0) throw std::invalid_argument("depth must be >= 1");
  if (frame_size > (1u << 20)) throw std::invalid_argument("frame_size must be <= 1 MiB");
  std::lock_guard<std::mutex> lk(mu_);
  check_open();
  std::vector<uint8_t> tmpl(4 + size_t(frame_size), 0xab);
  put_u32(tmpl.data(), frame_size);
  PipelineResult res;
  uint64_t sent = 0, done = 0;
  const auto t0 = Clock::now();
  while (done < total_requests) {
    out_.clear();
    while (sent < total_requests && sent - done < depth) {
      uint8_t* p = out_.extend(tmpl.size());
      std::memcpy(p, tmpl.data(), tmpl.size());
      if (frame_size >= 8) put_u64(p + 4, sent);
      ++sent;
    }
    if (!out_.empty()) {
      send_all(out_.data(), out_.size(), deadline());
      res.bytes_sent += out_.size();
    }
    const uint8_t* p;
    uint32_t len;
    read_frame(p, len, 1u << 20, deadline());
    for (;;) {
      if (len != frame_size || (frame_size >= 8 && get_u64(p) != done))
        throw ConnectionError(ConnectionError::GENERIC, "protocol error: bad echo frame");
      res.bytes_received += 4 + size_t(len);
      ++done;
      ++res.ok;
      if (done >= total_requests || !try_frame(p, len, 1u << 20)) break;
    }
  }
  res.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  res.requests = done;
  return res;
}

void Client::send_raw(const std::string& data) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open();
  send_all(reinterpret_cast<const uint8_t*>(data.data()), data.size(), deadline());
}

std::string Client::recv_raw(size_t max_bytes, double timeout_s) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open();
  if (max_bytes == 0) return std::string();
  if (rlen_ == rpos_) {
    const auto dl = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(
                                           std::max(0.0, std::min(timeout_s, 1e9))));
    try {
      fill(dl);
    } catch (const ConnectionError& e) {
      if (e.kind == ConnectionError::CLOSED) return std::string();  // orderly EOF
      throw;
    }
  }
  const size_t n = std::min(max_bytes, rlen_ - rpos_);
  std::string s(reinterpret_cast<const char*>(in_.data() + rpos_), n);
  rpos_ += n;
  return s;
}

}  // namespace seqr
