// Generated kernels against a reference evaluator (tests only): every
// elementwise op, reductions, matmul with all transposes and awkward sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "codegen/kernel.h"
#include "ir/error.h"
#include "jit/compile.h"

using namespace flowjit;
using namespace flowjit::ir;

namespace {

NodeRef param(const std::string& name, int64_t index, Shape s, DType dt = DType::Float64) {
  return make_node(OpKind::Parameter, {},
                   Attrs{{"name", name}, {"index", index}, {"shape", s}, {"dtype", dt}});
}

// Compiles a graph whose params and output are float64 and runs it.
std::vector<double> run_f64(const std::vector<NodeRef>& params, const NodeRef& out,
                            const std::vector<std::vector<double>>& inputs) {
  runtime::VariableStore store;
  jit::JobDescription job;
  job.name = "t";
  job.graph.params = params;
  job.graph.outputs = {out};
  jit::CompiledJob cj = jit::compile_job(job, jit::CompileSettings{}, store);
  std::vector<double> result(static_cast<size_t>(out->type().numel()));
  std::vector<const void*> ins;
  for (auto& v : inputs) ins.push_back(v.data());
  void* outs[] = {result.data()};
  cj.program->run(ins.data(), outs);
  return result;
}

std::vector<double> random_vec(size_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

struct UnaryCase {
  OpKind op;
  double lo, hi;
  std::function<double(double)> ref;
};

}  // namespace

class UnaryCodegen : public ::testing::TestWithParam<UnaryCase> {};

TEST_P(UnaryCodegen, MatchesReference) {
  const UnaryCase& c = GetParam();
  for (int64_t n : {1, 7, 17, 1000}) {
    auto x = param("x", 0, {n});
    auto in = random_vec(static_cast<size_t>(n), c.lo, c.hi, 7);
    auto got = run_f64({x}, unary(c.op, x), {in});
    for (int64_t i = 0; i < n; ++i) {
      double want = c.ref(in[i]);
      EXPECT_NEAR(got[i], want, 1e-13 * std::max(1.0, std::fabs(want)))
          << op_name(c.op) << "(" << in[i] << "), n=" << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllUnary, UnaryCodegen,
    ::testing::Values(
        UnaryCase{OpKind::Neg, -5, 5, [](double x) { return -x; }},
        UnaryCase{OpKind::Abs, -5, 5, [](double x) { return std::fabs(x); }},
        UnaryCase{OpKind::Sign, -5, 5, [](double x) { return double((x > 0) - (x < 0)); }},
        UnaryCase{OpKind::Floor, -5, 5, [](double x) { return std::floor(x); }},
        UnaryCase{OpKind::Ceil, -5, 5, [](double x) { return std::ceil(x); }},
        UnaryCase{OpKind::Round, -5, 5, [](double x) { return std::nearbyint(x); }},
        UnaryCase{OpKind::Exp, -20, 20, [](double x) { return std::exp(x); }},
        UnaryCase{OpKind::Log, 1e-3, 1e3, [](double x) { return std::log(x); }},
        UnaryCase{OpKind::Sqrt, 0, 100, [](double x) { return std::sqrt(x); }},
        UnaryCase{OpKind::Rsqrt, 0.01, 100, [](double x) { return 1 / std::sqrt(x); }},
        UnaryCase{OpKind::Square, -5, 5, [](double x) { return x * x; }},
        UnaryCase{OpKind::Reciprocal, 0.1, 5, [](double x) { return 1 / x; }},
        UnaryCase{OpKind::Tanh, -10, 10, [](double x) { return std::tanh(x); }},
        UnaryCase{OpKind::Sigmoid, -30, 30, [](double x) { return 1 / (1 + std::exp(-x)); }},
        UnaryCase{OpKind::Relu, -5, 5, [](double x) { return x < 0 ? 0.0 : x; }},
        UnaryCase{OpKind::Sin, -10, 10, [](double x) { return std::sin(x); }},
        UnaryCase{OpKind::Cos, -10, 10, [](double x) { return std::cos(x); }},
        UnaryCase{OpKind::Erf, -5, 5, [](double x) { return std::erf(x); }},
        UnaryCase{OpKind::Erfc, -5, 12, [](double x) { return std::erfc(x); }}),
    [](const auto& info) { return std::string(op_name(info.param.op)); });

struct BinaryCase {
  OpKind op;
  std::function<double(double, double)> ref;
};

class BinaryCodegen : public ::testing::TestWithParam<BinaryCase> {};

TEST_P(BinaryCodegen, MatchesReferenceWithBroadcasting) {
  const BinaryCase& c = GetParam();
  // a: [5, 17], b: [17] broadcast along rows.
  auto a = param("a", 0, {5, 17});
  auto b = param("b", 1, {17});
  auto va = random_vec(85, 0.5, 3, 1), vb = random_vec(17, 0.5, 3, 2);
  NodeRef out = binary(c.op, a, b);
  if (out->dtype() == DType::Bool) out = cast(out, DType::Float64);
  auto got = run_f64({a, b}, out, {va, vb});
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 17; ++j) {
      double want = c.ref(va[i * 17 + j], vb[j]);
      EXPECT_NEAR(got[i * 17 + j], want, 1e-13 * std::max(1.0, std::fabs(want))) << op_name(c.op);
    }
}

INSTANTIATE_TEST_SUITE_P(
    AllBinary, BinaryCodegen,
    ::testing::Values(
        BinaryCase{OpKind::Add, [](double x, double y) { return x + y; }},
        BinaryCase{OpKind::Sub, [](double x, double y) { return x - y; }},
        BinaryCase{OpKind::Mul, [](double x, double y) { return x * y; }},
        BinaryCase{OpKind::Div, [](double x, double y) { return x / y; }},
        BinaryCase{OpKind::Pow, [](double x, double y) { return std::pow(x, y); }},
        BinaryCase{OpKind::Maximum, [](double x, double y) { return std::max(x, y); }},
        BinaryCase{OpKind::Minimum, [](double x, double y) { return std::min(x, y); }},
        BinaryCase{OpKind::Less, [](double x, double y) { return double(x < y); }},
        BinaryCase{OpKind::GreaterEqual, [](double x, double y) { return double(x >= y); }},
        BinaryCase{OpKind::Equal, [](double x, double y) { return double(x == y); }}),
    [](const auto& info) { return std::string(op_name(info.param.op)); });

TEST(Codegen, ReductionsOverEveryAxisSet) {
  Shape s{3, 5, 19};
  auto x = param("x", 0, s);
  auto vx = random_vec(3 * 5 * 19, -2, 2, 3);
  for (IntList axes : {IntList{0}, IntList{1}, IntList{2}, IntList{0, 2}, IntList{0, 1, 2}}) {
    for (OpKind op :
         {OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMin, OpKind::ReduceProd}) {
      auto got = run_f64({x}, reduce(op, x, axes, true), {vx});
      Shape os = s;
      for (auto a : axes) os[a] = 1;
      std::vector<double> want(static_cast<size_t>(num_elements(os)),
                               op == OpKind::ReduceSum    ? 0.0
                               : op == OpKind::ReduceProd ? 1.0
                               : op == OpKind::ReduceMax  ? -INFINITY
                                                          : INFINITY);
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 5; ++j)
          for (int k = 0; k < 19; ++k) {
            int64_t idx[3] = {i, j, k};
            int64_t o = 0;
            for (int d = 0; d < 3; ++d) o = o * os[d] + (os[d] == 1 ? 0 : idx[d]);
            double v = vx[(i * 5 + j) * 19 + k];
            double& w = want[o];
            w = op == OpKind::ReduceSum    ? w + v
                : op == OpKind::ReduceProd ? w * v
                : op == OpKind::ReduceMax  ? std::max(w, v)
                                           : std::min(w, v);
          }
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-12 * std::max(1.0, std::fabs(want[i])))
            << op_name(op) << " axes " << shape_str(axes) << " at " << i;
    }
  }
}

TEST(Codegen, MatmulAllTransposesAndAwkwardShapes) {
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                         {7, 17, 5},
                         {33, 65, 300},
                         {100, 10, 784},
                         {13, 1000, 3}}) {
    for (int flags = 0; flags < 4; ++flags) {
      bool ta = flags & 1, tb = flags & 2;
      auto a = param("a", 0, ta ? Shape{k, m} : Shape{m, k});
      auto b = param("b", 1, tb ? Shape{n, k} : Shape{k, n});
      auto va = random_vec(static_cast<size_t>(m * k), -1, 1, 4);
      auto vb = random_vec(static_cast<size_t>(k * n), -1, 1, 5);
      auto got = run_f64({a, b}, matmul(a, b, ta, tb), {va, vb});
      double maxerr = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t p = 0; p < k; ++p)
            acc += (ta ? va[p * m + i] : va[i * k + p]) * (tb ? vb[j * k + p] : vb[p * n + j]);
          maxerr = std::max(maxerr, std::fabs(acc - got[i * n + j]));
        }
      EXPECT_LT(maxerr, 1e-12 * k) << m << "x" << n << "x" << k << " ta=" << ta << " tb=" << tb;
    }
  }
}

TEST(Codegen, IntegerDivisionNeverTraps) {
  auto a = param("a", 0, {4}, DType::Int32);
  auto b = param("b", 1, {4}, DType::Int32);
  runtime::VariableStore store;
  jit::JobDescription job;
  job.name = "div";
  job.graph.params = {a, b};
  job.graph.outputs = {binary(OpKind::Div, a, b)};
  auto cj = jit::compile_job(job, jit::CompileSettings{}, store);
  int32_t va[4] = {7, -7, INT32_MIN, 5}, vb[4] = {2, 2, -1, 0}, out[4];
  const void* ins[] = {va, vb};
  void* outs[] = {out};
  cj.program->run(ins, outs);
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[1], -3);
  EXPECT_EQ(out[2], INT32_MIN);
  EXPECT_EQ(out[3], 0);
}

// kernel_cost: what the profiler divides by time, from the typed description.
TEST(Codegen, KernelCostOfMatmulAndLoopKernels) {
  using codegen::Kernel;
  using codegen::KNode;
  using codegen::KOp;
  auto node = [](KOp kind, OpKind op = OpKind::Identity, std::vector<int> operands = {}) {
    KNode n;
    n.kind = kind;
    n.op = op;
    n.operands = std::move(operands);
    return n;
  };
  Kernel mm;
  mm.name = "k1_matmul_add";
  mm.kind = Kernel::Kind::MatMul;
  mm.domain = {8, 4};
  mm.args = {{DType::Float32, 4, false, true},
             {DType::Float32, 32, true, false},
             {DType::Float32, 256, false, true},
             {DType::Float32, 128, false, true}};
  mm.mm.m = 8;
  mm.mm.n = 4;
  mm.mm.k = 32;
  mm.nodes = {node(KOp::Acc), node(KOp::Load), node(KOp::Compute, OpKind::Add, {0, 1})};
  auto c = codegen::kernel_cost(mm);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->flops, 2 * 8 * 4 * 32 + 8 * 4);  // the epilogue's add at every output point
  EXPECT_EQ(c->bytes, 4 * (4 + 32 + 256 + 128));
  mm.mm.batch = 3;  // batched: every batch's GEMM counts
  EXPECT_EQ(codegen::kernel_cost(mm)->flops, 3 * 2 * 8 * 4 * 32 + 8 * 4);

  Kernel loop;
  loop.name = "k0_add";
  loop.domain = {2, 5};
  loop.args = {{DType::Float32, 10, true, true}, {DType::Int64, 10, false, true}};
  // Loads, constants, indices, identities and casts move values; add, exp
  // and the reduction compute.
  loop.nodes = {node(KOp::Load),
                node(KOp::Const),
                node(KOp::Compute, OpKind::Add, {0, 1}),
                node(KOp::Compute, OpKind::Cast, {2}),
                node(KOp::Compute, OpKind::Identity, {3}),
                node(KOp::Index),
                node(KOp::Compute, OpKind::Exp, {4}),
                node(KOp::Reduce, OpKind::ReduceSum, {6})};
  c = codegen::kernel_cost(loop);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->flops, 3 * 10);
  EXPECT_EQ(c->bytes, 2 * 4 * 10 + 8 * 10);  // read and written: twice

  Kernel all_reduce;
  all_reduce.kind = Kernel::Kind::Collective;
  all_reduce.args = loop.args;
  EXPECT_FALSE(codegen::kernel_cost(all_reduce).has_value());
}
