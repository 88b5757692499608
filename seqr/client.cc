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

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "auth.h"

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

Client::Client(const std::string& host, uint16_t port, double timeout_s, const Auth& auth)
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
  try {
    // the handshake gets a timeout of its own, as a request after connecting would
    const auto hdl = deadline();
    if (auth.tls.enabled) tls_connect(auth, host, hdl);
    if (!auth.pool.empty() || auth.probe) handshake(auth, hdl);
  } catch (...) {
    close();
    throw;
  }
}

Client::~Client() { close(); }

void Client::close() {
  if (ssl_) {
    SSL_free(static_cast<SSL*>(ssl_));
    ssl_ = nullptr;
  }
  if (ssl_ctx_) {
    SSL_CTX_free(static_cast<SSL_CTX*>(ssl_ctx_));
    ssl_ctx_ = nullptr;
  }
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Client::wait_io(short events, Clock::time_point dl, const char* what) {
  pollfd pfd{fd_, events, 0};
  int ms = poll_ms(dl);
  if (ms == 0) throw TimeoutError(std::string("timed out ") + what + " (" + peer_ + ")");
  int pr = ::poll(&pfd, 1, ms);
  if (pr < 0 && errno != EINTR) throw_errno("poll failed", errno);
}

void Client::throw_tls(const char* what, int ret) {
  const int err = SSL_get_error(static_cast<SSL*>(ssl_), ret);
  std::string detail;
  if (err == SSL_ERROR_ZERO_RETURN ||
      (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && (ret == 0 || errno == 0)))
    throw ConnectionError(ConnectionError::CLOSED,
                          std::string(what) + " (" + peer_ + "): connection closed by server");
  if (err == SSL_ERROR_SYSCALL && errno != 0) throw_errno(what, errno);
  const long verify = SSL_get_verify_result(static_cast<SSL*>(ssl_));
  if (verify != X509_V_OK)
    detail = std::string("certificate verification failed: ") +
             X509_verify_cert_error_string(verify);
  for (unsigned long e; (e = ERR_get_error()) != 0;) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!detail.empty()) detail += "; ";
    detail += buf;
  }
  throw ConnectionError(ConnectionError::GENERIC, std::string(what) + " (" + peer_ + "): " +
                                                      (detail.empty() ? "TLS error" : detail));
}

void Client::tls_connect(const Auth& auth, const std::string& host, Clock::time_point dl) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) throw ConnectionError(ConnectionError::GENERIC, "cannot make a TLS context");
  ssl_ctx_ = ctx;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // a server that closes without close_notify (every refusal) is an EOF, not an error
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  const std::string name = auth.tls.server_name.empty() ? host : auth.tls.server_name;
  if (!auth.tls.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, auth.tls.ca_file.c_str(), nullptr) != 1)
      throw ConnectionError(ConnectionError::GENERIC,
                            "cannot load the TLS CA file " + auth.tls.ca_file);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  }
  SSL* ssl = SSL_new(ctx);
  if (!ssl) throw ConnectionError(ConnectionError::GENERIC, "cannot make a TLS connection");
  ssl_ = ssl;
  SSL_set_fd(ssl, fd_);
  in6_addr a6;
  in_addr a4;
  const bool is_ip = inet_pton(AF_INET, name.c_str(), &a4) == 1 ||
                     inet_pton(AF_INET6, name.c_str(), &a6) == 1;
  if (!is_ip) SSL_set_tlsext_host_name(ssl, name.c_str());
  if (!auth.tls.ca_file.empty()) {
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str()) != 1
              : X509_VERIFY_PARAM_set1_host(param, name.c_str(), 0) != 1)
      throw ConnectionError(ConnectionError::GENERIC, "bad TLS server name " + name);
  }
  for (;;) {
    ERR_clear_error();
    const int r = SSL_connect(ssl);
    if (r == 1) break;
    const int err = SSL_get_error(ssl, r);
    if (err == SSL_ERROR_WANT_READ)
      wait_io(POLLIN, dl, "in the TLS handshake");
    else if (err == SSL_ERROR_WANT_WRITE)
      wait_io(POLLOUT, dl, "in the TLS handshake");
    else
      throw_tls("TLS handshake failed", r);
  }
}

namespace {

std::string refusal_text(uint8_t status) {
  switch (status) {
    case ST_NOT_SERVED: return "does not serve this pool";
    case ST_BAD_VERSION: return "does not speak protocol version 2";
    case ST_TLS_REQUIRED: return "requires TLS";
    case ST_BAD_HANDSHAKE: return "found the handshake malformed";
    case ST_AUTH_FAILED: return "refused the proof";
    default: return "refused the handshake (status " + std::to_string(status) + ")";
  }
}

}  // namespace

void Client::handshake(const Auth& auth, Clock::time_point dl) {
  if (auth.pool.size() > 65535) throw std::invalid_argument("pool name longer than 65535 bytes");
  if (auth.probe && !auth.pool.empty()) throw std::invalid_argument("a probe names no pool");
  const std::string who = "sequencer " + peer_;
  const std::string pool_q = "pool '" + auth.pool + "'";
  // HELLO
  ByteBuf b;
  uint8_t* h = b.extend(4 + kHelloFixed + auth.pool.size());
  put_u32(h, kHelloFixed + static_cast<uint32_t>(auth.pool.size()));
  h[4] = OP_HELLO;
  h[5] = kProtocolVersion;
  put_u16(h + 6, 0);
  uint8_t nonce_c[kNonce];
  auth::random_bytes(nonce_c, kNonce);
  std::memcpy(h + 8, nonce_c, kNonce);
  put_u16(h + 8 + kNonce, static_cast<uint16_t>(auth.pool.size()));
  if (!auth.pool.empty()) std::memcpy(h + 4 + kHelloFixed, auth.pool.data(), auth.pool.size());
  std::string transcript(reinterpret_cast<const char*>(h + 4), b.size() - 4);
  send_all(b.data(), b.size(), dl);
  // CHALLENGE
  const uint8_t* p;
  uint32_t len;
  read_frame(p, len, 1024, dl);
  if (auth.probe && ((len == kChallengePayload && p[0] == OP_CHALLENGE) ||
                     (len == kRespPayload && p[0] == ST_AUTH_REQUIRED)))
    return;  // it answered: alive
  if (len == kRespPayload && p[0] == ST_AUTH_REQUIRED)
    throw AuthError(ST_AUTH_REQUIRED, 0, 0, who + " wants a request first: it speaks another protocol");
  if (len != kChallengePayload || p[0] != OP_CHALLENGE)
    throw ConnectionError(ConnectionError::GENERIC,
                          "protocol error: " + who + " answered the handshake with a frame of " +
                              std::to_string(len) + " bytes (is it a pyzlog sequencer of protocol 2?)");
  const uint8_t status = p[2], mode = p[3];
  const uint32_t server_gen = get_u32(p + 4);
  if (status != ST_OK)
    throw AuthError(status, 0, 0, who + " " + refusal_text(status) + " (" + pool_q + ")");
  uint8_t nonce_s[kNonce];
  std::memcpy(nonce_s, p + 8, kNonce);
  transcript.append(reinterpret_cast<const char*>(p), len);
  // PROOF
  uint32_t gen = 0;
  auth::Mac sk{}, mine{};
  std::string t;
  if (mode == AUTH_NONE) {
    if (!auth.insecure)
      throw AuthError(ST_AUTH_FAILED, 0, 0,
                      who + " asks for no proof of the pool's key (zlog-seqr --insecure): refusing "
                            "a sequencer that cannot prove it holds the key of " + pool_q);
  } else if (mode == AUTH_HMAC_SHA256) {
    const Key* key = nullptr;
    for (const auto& k : auth.keys)
      if (k.generation == server_gen) key = &k;
    // else the newest older one: the server may still accept it (as its previous)
    if (!key)
      for (const auto& k : auth.keys)
        if (k.generation < server_gen && (!key || k.generation > key->generation)) key = &k;
    if (!key) {
      std::string have;
      for (const auto& k : auth.keys) have += (have.empty() ? "" : ", ") + std::to_string(k.generation);
      throw AuthError(ST_AUTH_FAILED, REASON_UNKNOWN_GENERATION, server_gen,
                      "no key for " + pool_q + " that " + who + " accepts: it uses generation " +
                          std::to_string(server_gen) +
                          (have.empty() ? ", this client has none" : ", this client has " + have));
    }
    gen = key->generation;
    sk = auth::session_key(auth::pool_key(key->secret, auth.pool), nonce_c, nonce_s);
    t = auth::transcript(transcript, auth::channel_binding(ssl_), gen);
    mine = auth::client_proof(sk, t);
  } else {
    throw ConnectionError(ConnectionError::GENERIC,
                          "protocol error: " + who + " asks for an unknown proof (" +
                              std::to_string(mode) + ")");
  }
  b.clear();
  uint8_t* q = b.extend(4 + kProofPayload);
  std::memset(q, 0, 4 + kProofPayload);
  put_u32(q, kProofPayload);
  q[4] = OP_PROOF;
  put_u32(q + 8, gen);
  std::memcpy(q + 12, mine.data(), kMac);
  send_all(b.data(), b.size(), dl);
  // WELCOME
  read_frame(p, len, 1024, dl);
  if (len != kWelcomePayload || p[0] != OP_WELCOME)
    throw ConnectionError(ConnectionError::GENERIC,
                          "protocol error: " + who + " answered the proof with a frame of " +
                              std::to_string(len) + " bytes");
  if (p[1] != ST_OK) {
    std::string why = p[1] != ST_AUTH_FAILED ? refusal_text(p[1])
                      : p[2] == REASON_UNKNOWN_GENERATION
                          ? "does not accept key generation " + std::to_string(gen) +
                                " (it uses " + std::to_string(server_gen) + ")"
                          : "refused the proof: wrong key";
    throw AuthError(p[1], p[2], server_gen, who + " " + why + " for " + pool_q);
  }
  if (mode == AUTH_HMAC_SHA256) {
    const auth::Mac theirs = auth::server_proof(sk, t, mine);
    if (!auth::equal(theirs.data(), p + 16, kMac))
      throw AuthError(ST_AUTH_FAILED, REASON_WRONG_PROOF, server_gen,
                      who + " did not prove it holds the key of " + pool_q +
                          ": not a genuine sequencer of this pool");
    authenticated_ = true;
  }
  limits_.max_count = get_u32(p + 4);
  limits_.max_outstanding = get_u32(p + 8);
  limits_.max_rate = get_u32(p + 12);
  pool_ = auth.pool;
  generation_ = gen;
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
  if (ssl_) {
    SSL* ssl = static_cast<SSL*>(ssl_);
    ERR_clear_error();
    const int cap = static_cast<int>(std::min<size_t>(in_.size() - rlen_, 1u << 30));
    const int n = SSL_read(ssl, in_.data() + rlen_, cap);
    if (n > 0) {
      rlen_ += size_t(n);
      want_ = POLLIN;
      return size_t(n);
    }
    const int err = SSL_get_error(ssl, n);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      want_ = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
      return 0;
    }
    throw_tls("recv failed", n);
  }
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
    pollfd pfd{fd_, static_cast<short>(ssl_ && want_ ? want_ : POLLIN), 0};
    int ms = poll_ms(dl);
    if (ms == 0) throw TimeoutError("timed out waiting for the sequencer (" + peer_ + ")");
    int pr = ::poll(&pfd, 1, ms);
    if (pr < 0 && errno != EINTR) throw_errno("poll failed", errno);
  }
}

void Client::send_all(const uint8_t* p, size_t n, Clock::time_point dl) {
  while (n > 0 && ssl_) {
    SSL* ssl = static_cast<SSL*>(ssl_);
    ERR_clear_error();
    const int w = SSL_write(ssl, p, static_cast<int>(std::min<size_t>(n, 1u << 30)));
    if (w > 0) {
      p += w;
      n -= size_t(w);
      continue;
    }
    const int err = SSL_get_error(ssl, w);
    if (err != SSL_ERROR_WANT_WRITE && err != SSL_ERROR_WANT_READ) throw_tls("send failed", w);
    // as below: drain replies while waiting, so the peer cannot block on us
    pollfd pfd{fd_, static_cast<short>(err == SSL_ERROR_WANT_WRITE ? POLLOUT | POLLIN : POLLIN), 0};
    int ms = poll_ms(dl);
    if (ms == 0) throw TimeoutError("timed out sending to the sequencer (" + peer_ + ")");
    int pr = ::poll(&pfd, 1, ms);
    if (pr < 0 && errno != EINTR) throw_errno("poll failed", errno);
    if (pr > 0 && (pfd.revents & POLLIN)) read_into_buffer();
  }
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

StreamResponse Client::streams(const std::string& pool, const std::string& log, uint64_t epoch,
                               uint32_t count, const std::vector<uint64_t>& ids, uint32_t history) {
  if (ids.empty() || ids.size() > kMaxStreamsPerRequest)
    throw std::invalid_argument("a stream request names 1.." + std::to_string(kMaxStreamsPerRequest) +
                                " streams");
  if (history && (count || history > kMaxStreamHistory ||
                  uint64_t(history) * ids.size() > kMaxHistoryPerRequest))
    throw std::invalid_argument("a history request takes no positions and asks for 1.." +
                                std::to_string(kMaxStreamHistory) + " per stream, " +
                                std::to_string(kMaxHistoryPerRequest) + " in all");
  std::lock_guard<std::mutex> lk(mu_);
  check_open();
  out_.clear();
  const uint64_t rid = next_rid_++;
  const size_t at = out_.size();
  encode(out_, count ? OP_STREAM_NEXT : history ? OP_STREAM_HISTORY : OP_STREAM_TAIL, rid, epoch,
         count ? count : history, pool, log);
  uint8_t* q = out_.extend(2 + 8 * ids.size());
  put_u16(q, static_cast<uint16_t>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) put_u64(q + 2 + 8 * i, ids[i]);
  put_u32(out_.data() + at, static_cast<uint32_t>(out_.size() - at - 4));
  send_all(out_.data(), out_.size(), deadline());
  const auto dl = deadline();
  for (;;) {
    const uint8_t* p;
    uint32_t len;
    read_frame(p, len, 1u << 20, dl);  // a history answer holds at most kMaxHistoryPerRequest positions
    StreamResponse r = parse_stream_response(p, len, ids.size(), history);
    if (r.response.request_id == rid) {
      for (size_t i = 0; i < r.streams.size(); ++i)
        if (r.streams[i].stream != ids[i])
          throw ConnectionError(ConnectionError::GENERIC,
                                "protocol error: a stream answer for another stream from " + peer_);
      return r;
    }
    if (r.response.request_id > rid)
      throw ConnectionError(ConnectionError::GENERIC, "protocol error: unexpected request id in response");
  }
}

StreamResponse Client::parse_stream_response(const uint8_t* p, uint32_t len, size_t nstreams,
                                             uint32_t history) {
  StreamResponse r;
  auto bad = [&](const char* what) {
    return ConnectionError(ConnectionError::GENERIC,
                           std::string("protocol error: stream answer ") + what + " from " + peer_);
  };
  if (len < kRespPayload) throw bad("too short");
  r.response = parse_response(p, kRespPayload);
  if (len == kRespPayload) {
    if (r.response.status == ST_OK) throw bad("without its stream section");
    return r;  // a refusal: no stream section
  }
  size_t off = kRespPayload;
  if (len < off + kStreamFixed) throw bad("too short");
  if (p[off] != kStreamVersion) throw bad("of an unknown version");
  r.max_backpointers = p[off + 1];
  const uint32_t n = get_u16(p + off + 2);
  if (n != nstreams) throw bad("for another number of streams");
  off += kStreamFixed;
  r.streams.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (len < off + kStreamPerStream) throw bad("truncated");
    StreamBackpointers& b = r.streams[i];
    b.stream = get_u64(p + off);
    b.horizon = get_u64(p + off + 8);
    b.ordinal = get_u64(p + off + 16);
    const uint32_t k = p[off + 24];
    const uint32_t m = p[off + 25];
    off += kStreamPerStream;
    if (k > r.max_backpointers || m > kStreamLevels ||
        len < off + 8 * size_t(k) + kStreamLevelEntry * size_t(m))
      throw bad("truncated");
    b.positions.resize(k);
    for (uint32_t j = 0; j < k; ++j) b.positions[j] = get_u64(p + off + 8 * j);
    off += 8 * size_t(k);
    b.levels.resize(m);
    for (uint32_t j = 0; j < m; ++j) {
      b.levels[j] = {p[off], get_u64(p + off + 1)};
      off += kStreamLevelEntry;
    }
  }
  for (uint32_t i = 0; history && i < n; ++i) {
    if (len < off + 4) throw bad("truncated");
    const uint32_t h = get_u32(p + off);
    off += 4;
    if (h > history || len < off + 8 * size_t(h)) throw bad("with a history longer than asked for");
    StreamBackpointers& b = r.streams[i];
    b.history.resize(h);
    for (uint32_t j = 0; j < h; ++j) b.history[j] = get_u64(p + off + 8 * j);
    off += 8 * size_t(h);
    // what a reader relies on: the stream's latest positions, newest first, below the answer's
    // position and not below the horizon, the recent ones first
    for (uint32_t j = 0; j < h; ++j)
      if (b.history[j] >= r.response.position || b.history[j] < b.horizon ||
          (j && b.history[j] >= b.history[j - 1]) || (j < b.positions.size() && b.history[j] != b.positions[j]))
        throw bad("with a history that is not the stream's latest positions");
  }
  if (off != len) throw bad("with trailing bytes");
  return r;
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
        case ST_NOT_AUTHORISED: ++res.not_authorised; break;
        case ST_RATE_LIMITED: ++res.rate_limited; break;
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
