// Fuzzes the texts a cache entry carries for the runtime: the plan
// (runtime::Plan::deserialize) and the GPU launch list
// (runtime::cuda deserialize_launches). Either parses or throws UserError;
// what parses serializes and parses back to the same text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ir/error.h"
#include "runtime/cuda/executable.h"
#include "runtime/executable.h"

namespace rt = flowjit::runtime;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the format, the rest is the text.
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    std::string once;
    try {
      once = rt::Plan::deserialize(text).serialize();
    } catch (const flowjit::UserError&) {
      return 0;
    }
    std::string twice = rt::Plan::deserialize(once).serialize();
    if (once != twice) {
      std::fprintf(stderr, "plan round trip differs:\n%s\n---\n%s\n", once.c_str(), twice.c_str());
      std::abort();
    }
  } else {
    std::string once;
    try {
      once = rt::cuda::serialize_launches(rt::cuda::deserialize_launches(text));
    } catch (const flowjit::UserError&) {
      return 0;
    }
    std::string twice = rt::cuda::serialize_launches(rt::cuda::deserialize_launches(once));
    if (once != twice) std::abort();
  }
  return 0;
}
