// The CPU backend: compiles kernels to a relocatable object for the host and
// loads objects into the process with ORC. No LLVM types in this header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "abi/launch.h"
#include "codegen/kernel.h"
#include "codegen/target.h"

namespace flowjit::codegen::cpu {

struct CompileOptions {
  std::string module_name = "flowjit";
  bool want_llvm_ir = false;   // keep the optimized module's text
  bool want_assembly = false;  // also emit assembly text
  bool want_unoptimized_ir = false;
  // Kernels that run once (initializer jobs): a cheap LLVM pipeline (no IR
  // passes, O0, and fast instruction selection). The numbers they compute are the same.
  bool run_once = false;
  // The x86-64 CPU the code is for, as LLVM names it ("x86-64-v3", "znver4"):
  // empty for the host (or FLOWJIT_CPU's). A named CPU need not be one this
  // host runs (exports for another machine); its cache sizes are the host's.
  std::string cpu;
  // Polled between kernels and LLVM passes; true: stop with Interrupted
  // (ir/error.h) before the object is emitted. [harden: Ctrl-C]
  std::function<bool()> interrupted;
};

struct CompiledObject {
  std::vector<char> object;    // ELF relocatable object
  std::string llvm_ir;         // optimized (if asked)
  std::string unoptimized_ir;  // (if asked)
  std::string assembly;        // (if asked)
  // Summed over the kernels compiled (on several threads, so more than the wall time).
  double seconds_emit = 0, seconds_optimize = 0, seconds_codegen = 0;
  double seconds_wall = 0;   // of the whole compile() call
  int kernels_compiled = 0;  // LLVM compiles this call ran
  int kernels_shared = 0;    // kernels identical to another kernel of this call
  int kernels_reused = 0;    // kernels found compiled by an earlier call of this process
  int threads = 1;           // compiling at once
  std::string kernel_times;  // a line per kernel compiled: CPU ms of each stage, object bytes
};

// Lowers each distinct kernel (by structural key, the name aside) into an
// LLVM module of its own, optimizes it (O3 for the host, O0 for run-once
// kernels) and emits an object, in parallel on the TBB pool; kernels this
// process compiled before are reused. Loop kernels with Random nodes share a
// seeded body per code text (their seeds read at run time, passed by a thunk
// per kernel), so initializers of other seeds and sizes compile once. The result is one container
// of the objects whose table maps every kernel's name to its code's symbol (load() resolves through
// it). Throws InternalError when LLVM rejects a module.
//
// `launches` are the plan's launch records, one per kernel (fusion made
// them, with the kernels' names as symbols): compile writes each coded
// kernel's CPU range into its record. Collective kernels have no code;
// their records keep what fusion gave them.
CompiledObject compile(const std::vector<Kernel>& kernels, std::vector<abi::Launch>& launches,
                       const CompileOptions& opts);

// Optimizes and compiles LLVM IR text (a module whose functions follow the
// kernel ABI) for the host.
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

// The ELF objects of compile()'s code (CompiledObject::object) and, per
// kernel symbol, the symbol that defines its code (exports link them
// elsewhere). UserError(Runtime) for a damaged container.
struct CodeParts {
  std::vector<std::vector<char>> objects;
  std::vector<std::pair<std::string, std::string>> aliases;  // kernel -> code symbol
};
CodeParts unpack_code(const std::vector<char>& object);

// Forgets the kernels this process compiled (tests of the compile counters).
void clear_kernel_cache();

// The host as the disk-cache key sees it: triple, CPU name and features
// (FLOWJIT_CPU's when set).
TargetId host_target_id();
// The target of CompileOptions::cpu `cpu` ("": the host's); UserError(Value)
// for a name LLVM does not know as an x86-64 CPU.
TargetId target_id_for(const std::string& cpu);
// Whether this host can run code made for `cpu` (it has every feature).
bool host_runs(const std::string& cpu);
int host_vector_bits();
// Whether the host's kernels fuse multiply-adds (an FMA unit, not masked by FLOWJIT_CPU).
bool host_has_fma();
// Whether bfloat16 matmuls run as bfloat16 on target `cpu` (CompileOptions::cpu;
// empty: the host): its CPU has AVX512-BF16 dot products. Else jit/passes/widen_half
// runs them in float32.
bool bf16_matmuls(const std::string& cpu);

// Assembly for the host from LLVM IR text kept in the cache (for the cache
// tool's `show --asm`). Throws UserError(Value) for unparsable text.
std::string assembly_from_ir(const std::string& llvm_ir);

}  // namespace flowjit::codegen::cpu
