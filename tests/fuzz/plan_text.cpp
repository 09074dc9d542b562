// Fuzzes the plan text a cache entry carries for the runtime
// (runtime::Plan::deserialize): its launch records, CPU ranges and GPU
// grids. Either parses or throws UserError; what parses serializes and
// parses back to the same text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ir/error.h"
#include "runtime/executable.h"

namespace rt = flowjit::runtime;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
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
  return 0;
}
