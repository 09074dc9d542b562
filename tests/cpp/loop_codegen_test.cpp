// The CPU loop kernels' structure (codegen/cpu/loops.cpp): values computed
// once per call (invariant), rows kept on the stack between the passes of a
// reduction (stashes), column reductions several vectors wide. Each is
// checked for its results against a reference and for the structure it
// promises in the kernel's unoptimized IR.
#include <gtest/gtest.h>

#include <llvm/IR/Instructions.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "codegen/cpu/cpu_codegen.h"
#include "codegen/emit.h"
#include "codegen/mathlib.h"
#include "ir/error.h"
#include "jit/compile.h"
#include "jit/fusion.h"
#include "tests/cpp/test_util.h"

using namespace flowjit;
using namespace flowjit::ir;

namespace {

using flowjit::testing::param;

// The math of the CPU backend, without its constant pinning (which changes
// no value).
class TestMath : public codegen::MathProvider {
 public:
  llvm::Value* unary(llvm::IRBuilderBase& b, OpKind op, llvm::Value* x) override {
    switch (op) {
      case OpKind::Exp:
        return codegen::emit_exp(b, x);
      case OpKind::Cos:
        return codegen::emit_cos(b, x);
      default:
        FJ_CHECK(false, "TestMath: ", op_name(op));
    }
  }
  llvm::Value* pow(llvm::IRBuilderBase& b, llvm::Value* x, llvm::Value* y) override {
    return codegen::emit_pow(b, x, y);
  }
  llvm::Value* random(llvm::IRBuilderBase&, OpKind, llvm::Value*, llvm::Value*,
                      llvm::Type*) override {
    FJ_CHECK(false, "TestMath: random");
  }
};

// The one loop kernel fusion makes of `g`, emitted without optimization.
struct Emitted {
  llvm::LLVMContext ctx;
  std::unique_ptr<llvm::Module> m;
  llvm::Function* f = nullptr;
};

void emit_only_kernel(const Graph& g, Emitted& e) {
  jit::FusedProgram fp = jit::fuse(g, g.name);
  const codegen::Kernel* loop = nullptr;
  for (const codegen::Kernel& k : fp.kernels)
    if (k.kind == codegen::Kernel::Kind::Loop) {
      ASSERT_EQ(loop, nullptr) << "one loop kernel";
      loop = &k;
    }
  ASSERT_NE(loop, nullptr);
  e.m = std::make_unique<llvm::Module>("t", e.ctx);
  TestMath math;
  flowjit::abi::CpuRange shape;
  e.f =
      codegen::cpu::emit_loop_kernel(*e.m, *loop, codegen::cpu::host_target(), math, shape, false);
}

const llvm::BasicBlock* block_named(const llvm::Function* f, const std::string& name) {
  for (const llvm::BasicBlock& bb : *f)
    if (bb.getName() == name) return &bb;
  return nullptr;
}

int stash_allocas(const llvm::Function* f) {
  int n = 0;
  for (const llvm::BasicBlock& bb : *f)
    for (const llvm::Instruction& i : bb)
      if (llvm::isa<llvm::AllocaInst>(i) && i.getName().starts_with("stash")) ++n;
  return n;
}

std::vector<float> run_f32(const Graph& g, const std::vector<std::vector<float>>& inputs,
                           int64_t out_elements) {
  runtime::VariableStore store;
  jit::JobDescription job;
  job.name = g.name;
  job.graph = g;
  jit::CompiledJob cj = jit::compile_job(job, jit::CompileSettings{}, store);
  std::vector<float> out(static_cast<size_t>(out_elements));
  std::vector<const void*> ins;
  for (const auto& v : inputs) ins.push_back(v.data());
  void* outs[] = {out.data()};
  cj.program->run(ins.data(), outs);
  return out;
}

std::vector<float> random_f32(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

Graph softmax_graph(int64_t rows, int64_t n) {
  NodeRef x = param("x", 0, {rows, n});
  NodeRef m = reduce(OpKind::ReduceMax, x, {1}, true);
  NodeRef e = unary(OpKind::Exp, binary(OpKind::Sub, x, m));
  NodeRef y = binary(OpKind::Div, e, reduce(OpKind::ReduceSum, e, {1}, true));
  Graph g;
  g.name = "softmax";
  g.params = {x};
  g.outputs = {y};
  return g;
}

}  // namespace

// A value of scalars alone (here cos and pow of a broadcast parameter) is
// computed once, in the block before the loops; the loops read it.
TEST(LoopCodegen, InvariantValuesAreComputedBeforeTheLoops) {
  for (int64_t n : {1, 7, 1000}) {
    NodeRef x = param("x", 0, {n});
    NodeRef s = param("s", 1, {1});
    NodeRef c = binary(OpKind::Add, unary(OpKind::Cos, s),
                       binary(OpKind::Pow, s, fill(2.5, {1}, DType::Float32)));
    Graph g;
    g.name = "inv";
    g.params = {x, s};
    g.outputs = {binary(OpKind::Mul, x, c)};
    Emitted e;
    emit_only_kernel(g, e);
    const llvm::BasicBlock* inv = block_named(e.f, "invariant");
    ASSERT_NE(inv, nullptr);
    int loads = 0;
    for (const llvm::Instruction& i : *inv) loads += llvm::isa<llvm::LoadInst>(i) ? 1 : 0;
    // s is read once, before the loops; so is x when it has one element.
    EXPECT_EQ(loads, n == 1 ? 2 : 1) << "n = " << n;
    EXPECT_GT(inv->size(), 20u) << "cos and pow of s are computed there";

    std::vector<float> vx = random_f32(static_cast<size_t>(n), -3, 3, 1);
    std::vector<float> vs = {1.3f};
    std::vector<float> got = run_f32(g, {vx, vs}, n);
    const double cs = std::cos(1.3) + std::pow(1.3, 2.5);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_NEAR(got[i], vx[i] * cs, 2e-6 * std::max(1.0, std::fabs(vx[i] * cs))) << i;
  }
}

// Without invariant nodes the block is empty but for its branch.
TEST(LoopCodegen, NothingElseMovesBeforeTheLoops) {
  NodeRef x = param("x", 0, {100});
  NodeRef y = param("y", 1, {100});
  Graph g;
  g.name = "plain";
  g.params = {x, y};
  g.outputs = {unary(OpKind::Exp, binary(OpKind::Mul, x, y))};
  Emitted e;
  emit_only_kernel(g, e);
  const llvm::BasicBlock* inv = block_named(e.f, "invariant");
  ASSERT_NE(inv, nullptr);
  EXPECT_EQ(inv->size(), 1u);
}

// Softmax's exp(x - max) is computed in the pass that sums it and read back
// from a row on the stack by the pass that divides, while the row fits the
// stash; a longer row computes it again. Both give softmax.
TEST(LoopCodegen, SoftmaxKeepsItsExponentialsInARowStash) {
  for (int64_t n : {1, 7, 8, 128, 1001, 4096, 4097}) {
    const int64_t rows = 5;
    Graph g = softmax_graph(rows, n);
    Emitted e;
    emit_only_kernel(g, e);
    // kStashBytes in loops.cpp; a row of one is no reduction.
    const bool fits = n > 1 && n * 4 <= 16 << 10;
    EXPECT_EQ(stash_allocas(e.f), fits ? 1 : 0) << "n = " << n;

    std::vector<float> vx = random_f32(static_cast<size_t>(rows * n), -20, 20, 2);
    std::vector<float> got = run_f32(g, {vx}, rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = vx.data() + r * n;
      double mx = *std::max_element(xr, xr + n), sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += std::exp(double(xr[j]) - mx);
      for (int64_t j = 0; j < n; ++j) {
        double want = std::exp(double(xr[j]) - mx) / sum;
        EXPECT_NEAR(got[r * n + j], want, 1e-6 * want + 1e-12)
            << "n " << n << " at " << r << "," << j;
      }
    }
  }
}

// A value used in one pass only is not stashed: the sum of exp(x) needs no
// row.
TEST(LoopCodegen, AValueOfOnePassIsNotStashed) {
  NodeRef x = param("x", 0, {4, 64});
  Graph g;
  g.name = "lse";
  g.params = {x};
  g.outputs = {reduce(OpKind::ReduceSum, unary(OpKind::Exp, x), {1}, false)};
  Emitted e;
  emit_only_kernel(g, e);
  EXPECT_EQ(stash_allocas(e.f), 0);
}

// Column sums run several vectors per kept point, then single vectors, then
// scalars: every column count lands right, whatever the thread split.
TEST(LoopCodegen, ColumnSumsOfEveryWidth) {
  for (int64_t cols : {1, 5, 8, 31, 32, 33, 40, 100, 257}) {
    const int64_t rows = 37;
    NodeRef x = param("x", 0, {rows, cols});
    Graph g;
    g.name = "colsum";
    g.params = {x};
    g.outputs = {reduce(OpKind::ReduceSum, x, {0}, false)};
    std::vector<float> vx = random_f32(static_cast<size_t>(rows * cols), -1, 1, 3);
    for (int threads : {1, 2}) {
      runtime::set_num_threads(threads);
      std::vector<float> got = run_f32(g, {vx}, cols);
      for (int64_t c = 0; c < cols; ++c) {
        double want = 0;
        for (int64_t r = 0; r < rows; ++r) want += vx[r * cols + c];
        EXPECT_NEAR(got[c], want, 1e-5) << "cols " << cols << " threads " << threads << " at " << c;
      }
    }
    runtime::set_num_threads(0);
  }
}
