// The identity of this flowjit build (see jit/build_info.h).
#include "jit/build_info.h"

#include "generated_build_info.h"

namespace flowjit::jit {

const std::string& flowjit_version() {
  static const std::string v = FLOWJIT_VERSION_STRING;
  return v;
}
const std::string& flowjit_build_id() {
  static const std::string v = FLOWJIT_BUILD_ID_STRING;
  return v;
}
const std::string& llvm_version() {
  static const std::string v = FLOWJIT_LLVM_VERSION_STRING;
  return v;
}

}  // namespace flowjit::jit
