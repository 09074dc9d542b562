// Fuzzes the rendezvous store's server side (runtime/tcp_store.h:
// StoreProtocol) with three interleaved connections, one of which has
// presented the token. Checks: nothing but 'K' or a refusal ever goes to a
// connection before it has presented the right token; the caps hold; replies
// are well-formed.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tcp_store.h"

namespace rt = flowjit::runtime;

namespace {

const std::string kToken = "fuzz-token-0123456789";

// Walks replies: true when every one is well-formed.
bool well_formed(const std::vector<char>& out, bool authenticated_before) {
  size_t i = 0;
  bool authed = authenticated_before;
  while (i < out.size()) {
    char tag = out[i++];
    if (tag == 'K') {
      authed = true;  // the hello's answer, or a set's
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
  rt::StoreProtocol store(kToken, lim);
  std::vector<std::unique_ptr<rt::StoreProtocol::Session>> sessions;
  std::vector<bool> open(3, true);
  for (int s = 0; s < 3; ++s)
    sessions.push_back(std::make_unique<rt::StoreProtocol::Session>(store));
  // Session 2 starts with the right token.
  std::string hello = "A";
  for (int b = 0; b < 4; ++b) hello += static_cast<char>((kToken.size() >> (8 * b)) & 0xff);
  hello += kToken;
  std::vector<char> out;
  if (!sessions[2]->feed(hello.data(), hello.size(), &out) || out != std::vector<char>{'K'})
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
    if (!well_formed(out, was)) std::abort();
    if (!ok) open[s] = false;
    if (store.keys() > lim.max_keys || store.bytes() > lim.max_total_bytes) std::abort();
  }
  return 0;
}
