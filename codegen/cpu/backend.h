// The CPU backend: compiles kernels to a relocatable object for the host and
// loads objects into the process with ORC. No LLVM types in this header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "codegen/kernel.h"

namespace flowjit::codegen::cpu {

struct KernelLaunch {
  std::string symbol;
  int64_t range = 1;
  int64_t grain = 1;
  int64_t scratch_bytes = 0;
};

struct CompileOptions {
  std::string module_name = "flowjit";
  bool want_llvm_ir = false;   // keep the optimized module's text
  bool want_assembly = false;  // also emit assembly text
  bool want_unoptimized_ir = false;
  // Polled between kernels and LLVM passes; true: stop with Interrupted
  // (ir/error.h) before the object is emitted. [harden: Ctrl-C]
  std::function<bool()> interrupted;
};

struct CompiledObject {
  std::vector<char> object;            // ELF relocatable object
  std::vector<KernelLaunch> launches;  // one per kernel, in order
  std::string llvm_ir;                 // optimized (if asked)
  std::string unoptimized_ir;          // (if asked)
  std::string assembly;                // (if asked)
  double seconds_emit = 0, seconds_optimize = 0, seconds_codegen = 0;
};

// Lowers `kernels` into one LLVM module, optimizes it at O3 for the host and
// emits an object file. Throws InternalError when LLVM rejects the module.
CompiledObject compile(const std::vector<Kernel>& kernels, const CompileOptions& opts);

// Optimizes and compiles LLVM IR text (a module whose functions follow the
// kernel ABI) for the host; launches are left empty.
CompiledObject compile_ir_text(const std::string& llvm_ir);

// Machine code loaded into this process. Destroying it frees the code.
class LoadedCode {
 public:
  virtual ~LoadedCode() = default;
  virtual void* address(size_t i) const = 0;  // of symbols[i] given to load()
};

// Links `object` into the process (one JITDylib per object) and resolves
// `symbols`. Throws UserError(Runtime) for a damaged object.
std::shared_ptr<LoadedCode> load(const std::vector<char>& object,
                                 const std::vector<std::string>& symbols);

// The host as the disk-cache key sees it: triple, CPU name and features.
std::string host_target_id();
int host_vector_bits();

// Assembly for the host from LLVM IR text kept in the cache (for the cache
// tool's `show --asm`). Throws UserError(Value) for unparsable text.
std::string assembly_from_ir(const std::string& llvm_ir);

}  // namespace flowjit::codegen::cpu
