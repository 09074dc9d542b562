// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for disk-cache keys,
// entry checksums and entry authentication.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace flowjit::runtime {

// Incremental SHA-256: update() any number of times, then digest() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::array<uint8_t, 32> digest();  // finishes the hash; the object is spent
  std::string hex_digest();          // 64 lowercase hex digits

 private:
  void compress(const uint8_t* block);

  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

std::string sha256_hex(std::string_view data);

// HMAC-SHA256 of `message` under `key` (any length; longer than a block is
// hashed first, as RFC 2104 says).
std::array<uint8_t, 32> hmac_sha256(std::string_view key, std::string_view message);
std::string hmac_sha256_hex(std::string_view key, std::string_view message);

// Whether a == b, in time that depends only on the lengths (for comparing
// MACs and tokens without telling an attacker how many bytes matched).
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace flowjit::runtime
