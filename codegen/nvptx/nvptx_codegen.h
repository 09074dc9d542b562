// Internal interface of the NVPTX backend: the GPU description, thread and
// warp primitives, and the kernel emitters. Only codegen/nvptx includes this.
#pragma once

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <functional>
#include <string>

#include "codegen/emit.h"
#include "codegen/kernel.h"
#include "codegen/nvptx/backend.h"

namespace flowjit::codegen::nvptx {

constexpr unsigned kGlobalAS = 1;
constexpr unsigned kSharedAS = 3;
constexpr int kWarp = 32;

// What the code generator knows about the GPU, as data.
struct GpuTarget {
  int sm = 80;
  bool allow_tf32 = false;
  bool has_tensor_cores_tf32() const { return sm >= 80; }
  std::string cpu() const { return "sm_" + std::to_string(sm); }
};

// Declares `void name(ptr addrspace(1) ...)` with one parameter per kernel
// argument, as a PTX kernel (calling convention and nvvm.annotations) whose
// blocks have at most `max_threads` threads.
llvm::Function* declare_kernel(llvm::Module& m, const Kernel& k, int max_threads);

// A module-level shared-memory array of `bytes`, 16-byte aligned.
llvm::GlobalVariable* shared_array(llvm::Module& m, const std::string& name, llvm::Type* elem,
                                   int64_t count);

// Special registers, as i32.
llvm::Value* thread_idx(llvm::IRBuilderBase& b);
llvm::Value* block_idx(llvm::IRBuilderBase& b);
llvm::Value* grid_dim(llvm::IRBuilderBase& b);
void barrier(llvm::IRBuilderBase& b);
// shfl.sync.bfly over the full warp for any scalar of at most 64 bits.
llvm::Value* shuffle_xor(llvm::IRBuilderBase& b, llvm::Value* v, int lane_mask);

using codegen::emit_for;  // the shared loop builder (codegen/emit.h)

// Splits a linear index over `extents` (row-major) into one i64 per extent.
// Uses 32-bit arithmetic when the product of the extents fits.
std::vector<llvm::Value*> delinearize(llvm::IRBuilderBase& b, llvm::Value* linear,
                                      const std::vector<int64_t>& extents);

// An alloca in the function's entry block.
llvm::AllocaInst* entry_alloca(llvm::Function* f, llvm::Type* t, const char* name);

// Whether (v, i) should replace (best, bi) in an arg-reduction: strictly
// better, or equal with a lower index. NaN is the extreme value (numpy).
llvm::Value* arg_better(llvm::IRBuilderBase& b, OpKind op, DType t, llvm::Value* v, llvm::Value* i,
                        llvm::Value* best, llvm::Value* bi);

// The math provider for GPU kernels: libdevice functions (declared here and
// linked later) or flowjit's polynomials; random numbers from codegen/mathlib.
std::unique_ptr<MathProvider> make_math(llvm::Module& m, bool libdevice);

// Links libdevice into `m` (only the functions used), then internalizes
// every function but the kernels. Throws when the file cannot be read.
void link_libdevice(llvm::Module& m, const std::string& path);

// The kernel emitters. They write the kernel's grid and block into its
// launch record's geometry (`launch`) and what they chose into `notes`.
llvm::Function* emit_loop_kernel(llvm::Module& m, const Kernel& k, const GpuTarget& t,
                                 MathProvider& math, abi::GpuGrid& launch, KernelNotes& notes);
llvm::Function* emit_matmul_kernel(llvm::Module& m, const Kernel& k, const GpuTarget& t,
                                   MathProvider& math, abi::GpuGrid& launch, KernelNotes& notes);

// The kernel families' emitters (codegen/families/<name>/nvptx.cpp), one
// per line of families.def.
#define FAMILY(Op, name)                                                                    \
  llvm::Function* emit_##name##_nvptx(llvm::Module& m, const Kernel& k, const GpuTarget& t, \
                                      MathProvider& math, abi::GpuGrid& launch,             \
                                      KernelNotes& notes);
#include "codegen/families/families.def"
llvm::Function* emit_family_kernel(llvm::Module& m, const Kernel& k, const GpuTarget& t,
                                   MathProvider& math, abi::GpuGrid& launch, KernelNotes& notes);

}  // namespace flowjit::codegen::nvptx
