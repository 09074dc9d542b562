// Fuzzes the rendezvous store's server side (runtime/comm/tcp_store.h:
// StoreProtocol) with three interleaved connections, one of which has
// proved it knows the token. Session s's server nonce is 32 bytes of
// 'a' + s (the corpus holds right answers for sessions 0 and 1: see
// tests/fuzz/corpus/store_protocol/README). Checks: nothing but the
// welcome ('K' and the server's MAC, which must be the right one) or a
// refusal ever goes to a connection before it has proved it knows the
// token; no reply contains the token; the caps hold; replies are
// well-formed.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/tcp_store.h"

namespace rt = flowjit::runtime;

namespace {

const std::string kToken = "fuzz-token-0123456789";
constexpr size_t kMac = rt::kStoreMacBytes;
const std::string kClientNonce(rt::kStoreNonceBytes, 'c');

// Walks replies: true when every one is well-formed.
bool well_formed(const std::vector<char>& out, bool authenticated_before,
                 const std::string& welcome) {
  size_t i = 0;
  bool authed = authenticated_before;
  while (i < out.size()) {
    char tag = out[i++];
    if (tag == 'K' && !authed) {  // the hello's answer: the server's MAC
      if (out.size() - i < kMac || std::string(out.data() + i, kMac) != welcome) return false;
      i += kMac;
      authed = true;
    } else if (tag == 'K') {  // a set's
    } else if (tag == 'N' || tag == 'V') {
      if (!authed) return false;  // a get answered to a stranger
      if (tag == 'V') {
        if (out.size() - i < 8) return false;
        uint64_t n = 0;
        for (int b = 0; b < 8; ++b)
          n |= uint64_t{static_cast<unsigned char>(out[i + b])} << (8 * b);
        i += 8;
        if (out.size() - i < n) return false;
        i += n;
      }
    } else if (tag == 'E') {
      if (out.size() - i < 4) return false;
      uint32_t n = 0;
      for (int b = 0; b < 4; ++b) n |= uint32_t{static_cast<unsigned char>(out[i + b])} << (8 * b);
      i += 4;
      if (out.size() - i != n) return false;  // a refusal is the last reply
      return true;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rt::TcpStoreLimits lim;
  lim.max_key_bytes = 64;
  lim.max_value_bytes = 256;
  lim.max_keys = 8;
  lim.max_total_bytes = 1024;
  char next = 'a';
  rt::StoreProtocol store(kToken, lim, [&] { return std::string(rt::kStoreNonceBytes, next++); });
  std::vector<std::unique_ptr<rt::StoreProtocol::Session>> sessions;
  std::vector<std::string> welcome;
  std::vector<bool> open(3, true);
  std::vector<char> out;
  for (int s = 0; s < 3; ++s) {
    sessions.push_back(std::make_unique<rt::StoreProtocol::Session>(store));
    out.clear();
    sessions[s]->greet(&out);
    std::string nonce = sessions[s]->nonce();
    if (out.size() != 1 + nonce.size() || out[0] != 'C' || nonce != std::string(32, 'a' + s))
      std::abort();
    // (a client nonce of 'c's: the corpus's hellos use it too)
    welcome.push_back(rt::store_proof(kToken, "server", nonce, kClientNonce));
  }
  // Session 2 starts with the right answer.
  std::string hello =
      "A" + kClientNonce + rt::store_proof(kToken, "client", sessions[2]->nonce(), kClientNonce);
  out.clear();
  if (!sessions[2]->feed(hello.data(), hello.size(), &out) ||
      std::string(out.begin(), out.end()) != "K" + welcome[2])
    std::abort();
  // The input: chunks of (selector byte, length byte, bytes).
  size_t i = 0;
  while (i + 2 <= size) {
    int s = data[i] % 3;
    size_t n = std::min<size_t>(data[i + 1], size - i - 2);
    const char* p = reinterpret_cast<const char*>(data + i + 2);
    i += 2 + n;
    if (!open[s]) continue;
    bool was = sessions[s]->authenticated();
    out.clear();
    bool ok = sessions[s]->feed(p, n, &out);
    while (ok && sessions[s]->backlog()) ok = sessions[s]->resume(&out);
    // (only the client nonce of 'c's can be welcomed: any other would need
    // a MAC the fuzzer cannot make, and its welcome differs from welcome[s])
    if (!well_formed(out, was, welcome[s])) std::abort();
    if (std::search(out.begin(), out.end(), kToken.begin(), kToken.end()) != out.end())
      std::abort();
    if (!ok) open[s] = false;
    if (store.keys() > lim.max_keys || store.bytes() > lim.max_total_bytes) std::abort();
  }
  return 0;
}
