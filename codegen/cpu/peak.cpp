// A generated FMA loop that measures the host's float32 peak.
#include "codegen/cpu/peak.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

#include <chrono>

#include "codegen/cpu/backend.h"
#include "codegen/cpu/cpu_codegen.h"

namespace flowjit::codegen::cpu {

namespace {
using PeakFn = void (*)(char* const*, int64_t, int64_t, char*);

// void peak(args, begin, end, scratch): acc[i] = fma(acc[i], x, y) repeated
// (end - begin) times for `acc` independent vector accumulators, then the
// sum is stored to args[0] so nothing is optimized away. Enough accumulators
// to cover the FMA latency on every port (about 4 cycles x 2 ports), but no
// more than the vector registers hold besides x and y: 16 accumulators on a
// 16-register AVX2 machine spill and measured half its peak.
int accumulators(const CpuTarget& t) { return t.vector_bits >= 512 ? 24 : 12; }
}  // namespace

PeakResult measure_fma_peak(double seconds) {
  const CpuTarget& t = host_target();
  const int kAcc = accumulators(t);
  int lanes = t.lanes(4);
  CompiledObject obj;
  {
    llvm::LLVMContext ctx;
    llvm::Module m("peak", ctx);
    llvm::Function* f = declare_kernel(m, "fj_fma_peak", t);
    llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx, "entry", f));
    std::vector<llvm::Value*> ptrs = load_kernel_args(b, f, 1);
    llvm::Type* vt = with_width(b.getFloatTy(), lanes);
    std::vector<llvm::AllocaInst*> acc(kAcc);
    for (int i = 0; i < kAcc; ++i) {
      acc[i] = b.CreateAlloca(vt);
      b.CreateStore(llvm::ConstantFP::get(vt, 1.0 + i * 1e-3), acc[i]);
    }
    llvm::Value* x = llvm::ConstantFP::get(vt, 0.999999);
    llvm::Value* y = llvm::ConstantFP::get(vt, 1e-7);
    emit_for(b, f->getArg(1), f->getArg(2), 1, [&](llvm::Value*) {
      for (int i = 0; i < kAcc; ++i) {
        llvm::Value* a = b.CreateLoad(vt, acc[i]);
        // fmuladd: one FMA where the target has it, a multiply and an add
        // (still 2 flops) on the baseline without FMA, never a libm call.
        b.CreateStore(b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {vt}, {a, x, y}), acc[i]);
      }
    });
    llvm::Value* sum = b.CreateLoad(vt, acc[0]);
    for (int i = 1; i < kAcc; ++i) sum = b.CreateFAdd(sum, b.CreateLoad(vt, acc[i]));
    b.CreateStore(sum, ptrs[0]);
    b.CreateRetVoid();
    std::string text;
    llvm::raw_string_ostream os(text);
    m.print(os, nullptr);
    obj = compile_ir_text(text);
  }
  auto code = load(obj.object, {"fj_fma_peak"});
  auto fn = reinterpret_cast<PeakFn>(code->address(0));
  alignas(64) float out[64];
  char* args[1] = {reinterpret_cast<char*>(out)};
  int64_t iters = 1 << 16;
  double best = 0;
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    auto t0 = std::chrono::steady_clock::now();
    fn(args, 0, iters, nullptr);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt < 1e-3) {
      iters *= 2;
      continue;
    }
    double flops = 2.0 * lanes * kAcc * static_cast<double>(iters);
    best = std::max(best, flops / dt / 1e9);
  }
  return {best, lanes, kAcc};
}

}  // namespace flowjit::codegen::cpu
