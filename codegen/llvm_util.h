// LLVM helpers shared by the backends: the optimization pipeline and module text.
#pragma once

#include <llvm/Passes/OptimizationLevel.h>

#include <functional>

#include <string>

namespace llvm {
class Module;
class TargetMachine;
}  // namespace llvm

namespace flowjit::codegen {

// LLVM's module pipeline at `level` (O3 unless told) with the target's own callbacks registered
// (for NVPTX, NVVMReflect resolves libdevice's queries). `slp` enables the SLP vectorizer on top of
// the loop vectorizer. `interrupted` (optional, polled between passes): once it returns true the
// remaining optional passes are skipped, so the pipeline ends soon.
void optimize_module(llvm::Module& m, llvm::TargetMachine& tm, bool slp,
                     const std::function<bool()>& interrupted = {},
                     llvm::OptimizationLevel level = llvm::OptimizationLevel::O3);

// The module as LLVM IR text.
std::string module_text(const llvm::Module& m);

}  // namespace flowjit::codegen
