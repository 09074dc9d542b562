// Internal interface of the CPU backend: the host description and the two
// kernel emitters (loops and matmul). Only codegen/cpu includes this.
#pragma once

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <functional>
#include <string>

#include "abi/launch.h"
#include "codegen/emit.h"
#include "codegen/kernel.h"
#include "codegen/target.h"

namespace flowjit::codegen::cpu {

// What the code generator knows about the host, as data.
struct CpuTarget {
  std::string triple;
  std::string cpu;        // e.g. "sapphirerapids"
  std::string features;   // "+avx512f,+fma,..."
  int vector_bits = 128;  // widest vector unit: 512 with AVX-512, 256 with AVX2
  bool has_fma = false;
  // AVX512-BF16: vdpbf16ps, two bfloat16 products per float32 lane (the
  // bfloat16 matmul micro-kernel, matmul.cpp).
  bool has_avx512bf16 = false;
  int64_t l1d_bytes = 32 << 10;
  int64_t l2_bytes = 1 << 20;
  int threads = 1;

  int lanes(int elem_bytes) const { return std::max(1, vector_bits / (8 * elem_bytes)); }
  // Triple, cpu, features, cache sizes and threads: part of the disk-cache key.
  TargetId target_id() const;
  std::string id() const;  // target_id().str()
};

const CpuTarget& host_target();
// CompileOptions::cpu's target: the host's when empty (backend.h).
const CpuTarget& target_for(const std::string& cpu);

// The kernel ABI: void name(ptr args, i64 begin, i64 end, ptr scratch).
// A seeded body (`seeded`) takes a fifth argument, ptr seeds: the i64 seeds
// of its Random nodes in node order, which a per-kernel thunk of the plain
// ABI passes (see emit_seed_thunks).
llvm::Function* declare_kernel(llvm::Module& m, const std::string& name, const CpuTarget& t,
                               bool seeded = false);
// Loads the argument base pointers at the start of `f`.
std::vector<llvm::Value*> load_kernel_args(llvm::IRBuilderBase& b, llvm::Function* f, size_t n);

// for (iv = lo; iv < hi; iv += step) body(iv). Leaves the builder after the loop.
void emit_for(llvm::IRBuilderBase& b, llvm::Value* lo, llvm::Value* hi, int64_t step,
              const std::function<void(llvm::Value*)>& body, const char* name = "i");

// A vector loop of `lanes` and a scalar remainder: body(iv, width).
void emit_vector_for(llvm::IRBuilderBase& b, llvm::Value* lo, llvm::Value* hi, int lanes,
                     const std::function<void(llvm::Value*, int)>& body, const char* name = "v");

// The kernel emitters. Each decides how the runtime launches its kernel
// (the launch record's CPU range) and writes it into `shape`.
// `runtime_seeds`: the body is seeded (declare_kernel) and reads its Random
// nodes' seeds at run time, so kernels that differ only in their seeds share
// its code (kernels without Random nodes ignore it).
llvm::Function* emit_loop_kernel(llvm::Module& m, const Kernel& k, const CpuTarget& t,
                                 MathProvider& math, abi::CpuRange& shape,
                                 bool runtime_seeds = false);
// Random nodes of `k` in node order (the seeds a seeded body reads).
std::vector<int> random_nodes(const Kernel& k);
// One thunk per entry {name, body, seeds} of the plain ABI, calling the
// seeded `body` with a pointer to its constant `seeds`.
struct SeedThunk {
  std::string name, body;
  std::vector<int64_t> seeds;
};
void emit_seed_thunks(llvm::Module& m, const std::vector<SeedThunk>& thunks, const CpuTarget& t);
llvm::Function* emit_matmul_kernel(llvm::Module& m, const Kernel& k, const CpuTarget& t,
                                   MathProvider& math, abi::CpuRange& shape);

// The kernel families' emitters (codegen/families/<name>/cpu.cpp), one per
// line of families.def.
#define FAMILY(Op, name)                                                                  \
  llvm::Function* emit_##name##_cpu(llvm::Module& m, const Kernel& k, const CpuTarget& t, \
                                    MathProvider& math, abi::CpuRange& shape);
#include "codegen/families/families.def"
// The emitter of family kernel `k`.
llvm::Function* emit_family_kernel(llvm::Module& m, const Kernel& k, const CpuTarget& t,
                                   MathProvider& math, abi::CpuRange& shape);

// Smallest amount of work (element operations) worth a separate task.
constexpr double kMinTaskCost = 32768;

}  // namespace flowjit::codegen::cpu
