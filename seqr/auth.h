// The handshake's cryptography (docs/seqr-protocol.md, "Handshake"): one
// place for the key derivations and MACs the server and the client must agree
// on. HMAC-SHA256 from OpenSSL's libcrypto.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "protocol.h"

namespace seqr {
namespace auth {

using Mac = std::array<uint8_t, kMac>;

// Fills p with n bytes from the OS's CSPRNG; throws std::runtime_error if
// none are available (a nonce must never be predictable).
void random_bytes(uint8_t* p, size_t n);

// The pool key: the pool's secret bound to the pool's name, so a secret
// copied into another pool proves nothing there.
Mac pool_key(const std::string& secret, const std::string& pool);
// The connection's session key, from the pool key and both nonces.
Mac session_key(const Mac& pool_key, const uint8_t* client_nonce, const uint8_t* server_nonce);
// The transcript both proofs cover: HELLO and CHALLENGE payloads as sent, the
// TLS channel binding (empty without TLS) and the key generation proved with.
std::string transcript(const std::string& hello_and_challenge, const std::string& channel_binding,
                       uint32_t generation);
Mac client_proof(const Mac& session_key, const std::string& transcript);
Mac server_proof(const Mac& session_key, const std::string& transcript, const Mac& client_proof);
// Constant-time comparison.
bool equal(const uint8_t* a, const uint8_t* b, size_t n);

// TLS channel binding (RFC 5705 / 8446 exporter) of an established SSL
// connection: a man in the middle runs two TLS sessions with different
// exporters, so a proof relayed from one does not verify on the other.
constexpr const char* kExporterLabel = "EXPORTER-zlog-seqr-2";
std::string channel_binding(void* ssl);

}  // namespace auth
}  // namespace seqr
