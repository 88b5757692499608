#include "auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>

#include <cstring>
#include <stdexcept>

namespace seqr {
namespace auth {

namespace {

Mac hmac(const uint8_t* key, size_t klen, const std::string& msg) {
  Mac out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key, static_cast<int>(klen),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &len) ||
      len != out.size())
    throw std::runtime_error("HMAC-SHA256 failed");
  return out;
}

// Labels end in a NUL so that no label is a prefix of another's input.
std::string label(const char* l) { return std::string(l) + '\0'; }

}  // namespace

void random_bytes(uint8_t* p, size_t n) {
  if (RAND_bytes(p, static_cast<int>(n)) != 1)
    throw std::runtime_error("no random bytes for a handshake nonce (OpenSSL RAND_bytes failed)");
}

Mac pool_key(const std::string& secret, const std::string& pool) {
  std::string msg = label("zlog-seqr/2 pool");
  msg.push_back(static_cast<char>(pool.size() & 0xff));
  msg.push_back(static_cast<char>((pool.size() >> 8) & 0xff));
  msg += pool;
  return hmac(reinterpret_cast<const uint8_t*>(secret.data()), secret.size(), msg);
}

Mac session_key(const Mac& pool_key, const uint8_t* client_nonce, const uint8_t* server_nonce) {
  std::string msg = label("zlog-seqr/2 session");
  msg.append(reinterpret_cast<const char*>(client_nonce), kNonce);
  msg.append(reinterpret_cast<const char*>(server_nonce), kNonce);
  return hmac(pool_key.data(), pool_key.size(), msg);
}

std::string transcript(const std::string& hello_and_challenge, const std::string& channel_binding,
                       uint32_t generation) {
  std::string t = hello_and_challenge;
  t.push_back(static_cast<char>(channel_binding.size()));
  t += channel_binding;
  uint8_t g[4];
  put_u32(g, generation);
  t.append(reinterpret_cast<const char*>(g), 4);
  return t;
}

Mac client_proof(const Mac& session_key, const std::string& transcript) {
  return hmac(session_key.data(), session_key.size(), label("zlog-seqr/2 client") + transcript);
}

Mac server_proof(const Mac& session_key, const std::string& transcript, const Mac& client_proof) {
  std::string msg = label("zlog-seqr/2 server") + transcript;
  msg.append(reinterpret_cast<const char*>(client_proof.data()), client_proof.size());
  return hmac(session_key.data(), session_key.size(), msg);
}

bool equal(const uint8_t* a, const uint8_t* b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

std::string channel_binding(void* ssl) {
  if (ssl == nullptr) return std::string();
  unsigned char out[32];
  if (SSL_export_keying_material(static_cast<SSL*>(ssl), out, sizeof out, kExporterLabel,
                                 std::strlen(kExporterLabel), nullptr, 0, 0) != 1)
    throw std::runtime_error("TLS exporter failed (no channel binding)");
  return std::string(reinterpret_cast<const char*>(out), sizeof out);
}

}  // namespace auth
}  // namespace seqr
