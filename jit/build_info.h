// The identity of this flowjit build: version, a hash of the code generator's
// sources, and the LLVM version. All three are part of every disk-cache key.
#pragma once

#include <string>

namespace flowjit::jit {

const std::string& flowjit_version();
const std::string& flowjit_build_id();
const std::string& llvm_version();

}  // namespace flowjit::jit
