// The CPU backend's compile units: identical kernels compiled once per call
// and once per process, the object container and its damage checks, and
// run-once kernels (O0) computing the same bits as O3 ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>

#include "codegen/cpu/backend.h"
#include "ir/error.h"
#include "jit/compile.h"
#include "jit/fusion.h"
#include "tests/cpp/test_util.h"

using namespace flowjit;
using namespace flowjit::ir;
namespace cpu = flowjit::codegen::cpu;

namespace {

using flowjit::testing::param;

// Two independent copies of one computation (a layer), plus a different one.
Graph twins() {
  Graph g;
  g.name = "twins";
  for (int i = 0; i < 3; ++i) g.params.push_back(param("x" + std::to_string(i), i, {64, 33}));
  auto layer = [](const NodeRef& x, double c) {
    return binary(OpKind::Add,
                  binary(OpKind::Mul, unary(OpKind::Tanh, x), fill(2.0, {}, x->dtype())),
                  fill(c, {}, x->dtype()));
  };
  g.outputs = {layer(g.params[0], 1.0), layer(g.params[1], 1.0), layer(g.params[2], 3.0)};
  return g;
}

std::vector<codegen::Kernel> kernels_of(const Graph& g) {
  jit::FusedProgram fp = jit::fuse(g, g.name);
  return fp.kernels;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-3, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

}  // namespace

TEST(CompileUnits, IdenticalKernelsAreCompiledOncePerCallAndPerProcess) {
  cpu::clear_kernel_cache();
  std::vector<codegen::Kernel> ks = kernels_of(twins());
  ASSERT_EQ(ks.size(), 3u);
  EXPECT_NE(ks[0].name, ks[1].name);
  std::vector<runtime::Launch> ls = flowjit::testing::launch_records(ks);
  cpu::CompiledObject a = cpu::compile(ks, ls, {});
  EXPECT_EQ(a.kernels_compiled, 2);  // the twins share one compile
  EXPECT_EQ(a.kernels_shared, 1);
  EXPECT_EQ(a.kernels_reused, 0);
  ASSERT_EQ(ls.size(), 3u);
  ASSERT_NE(ls[0].cpu(), nullptr);
  EXPECT_EQ(ls[0].geometry, ls[1].geometry);  // the twins' code launches alike

  // Another call (another job of the process): nothing is compiled again.
  cpu::CompiledObject b = cpu::compile(ks, ls, {});
  EXPECT_EQ(b.kernels_compiled, 0);
  EXPECT_EQ(b.kernels_reused, 3);
  EXPECT_EQ(b.object, a.object);

  // Asking for the IR text of units compiled without it compiles them again.
  cpu::CompileOptions with_ir;
  with_ir.want_llvm_ir = true;
  cpu::CompiledObject c = cpu::compile(ks, ls, with_ir);
  EXPECT_EQ(c.kernels_compiled, 2);
  EXPECT_NE(c.llvm_ir.find("; flowjit kernels " + ks[0].name + ", " + ks[1].name + ": fjk_"),
            std::string::npos)
      << c.llvm_ir.substr(0, 400);
  EXPECT_FALSE(cpu::assembly_from_ir(c.llvm_ir).empty());  // every module of the text parses

  // A run-once compile takes the O3 code there is (it computes the same
  // bits); an O3 compile never takes O0 code.
  cpu::CompileOptions once;
  once.run_once = true;
  EXPECT_EQ(cpu::compile(ks, ls, once).kernels_compiled, 0);
  cpu::clear_kernel_cache();
  EXPECT_EQ(cpu::compile(ks, ls, once).kernels_compiled, 2);
  EXPECT_EQ(cpu::compile(ks, ls, once).kernels_compiled, 0);
  EXPECT_EQ(cpu::compile(ks, ls, {}).kernels_compiled, 2);

  // Both names resolve to the one copy of the code.
  auto code = cpu::load(a.object, {ks[0].name, ks[1].name, ks[2].name});
  EXPECT_EQ(code->address(0), code->address(1));
  EXPECT_NE(code->address(0), code->address(2));
}

TEST(CompileUnits, SharedKernelsComputeEachTwinsOwnResult) {
  cpu::clear_kernel_cache();
  runtime::VariableStore store;
  jit::JobDescription job;
  job.name = "twins";
  job.graph = twins();
  jit::CompiledJob cj = jit::compile_job(job, jit::CompileSettings{}, store);
  const size_t n = 64 * 33;
  std::vector<std::vector<float>> in = {random_floats(n, 1), random_floats(n, 2),
                                        random_floats(n, 3)};
  std::vector<std::vector<float>> out(3, std::vector<float>(n));
  const void* ins[] = {in[0].data(), in[1].data(), in[2].data()};
  void* outs[] = {out[0].data(), out[1].data(), out[2].data()};
  cj.program->run(ins, outs);
  for (int j = 0; j < 3; ++j)
    for (size_t i = 0; i < n; i += 97)
      EXPECT_NEAR(out[j][i], std::tanh(in[j][i]) * 2 + (j == 2 ? 3 : 1), 1e-5)
          << "output " << j << " at " << i;
}

TEST(CompileUnits, DamagedContainersAreUserErrors) {
  std::vector<codegen::Kernel> ks = kernels_of(twins());
  std::vector<runtime::Launch> ls = flowjit::testing::launch_records(ks);
  cpu::CompiledObject a = cpu::compile(ks, ls, {});
  std::vector<std::string> names = {ls[0].symbol};
  std::vector<char> cut(a.object.begin(), a.object.begin() + a.object.size() / 2);
  try {
    cpu::load(cut, names);
    FAIL() << "a truncated container loaded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::vector<char> other = a.object;
  other[8] = 99;  // the version field
  try {
    cpu::load(other, names);
    FAIL() << "a container of another version loaded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("container version 99"), std::string::npos) << e.what();
  }
  // The intact container still loads after the failures.
  EXPECT_NE(cpu::load(a.object, names)->address(0), nullptr);
}

// Initializer jobs compile at a cheap level; they must compute the same bits.
TEST(CompileUnits, RunOnceKernelsComputeTheSameBits) {
  Graph g;
  g.name = "inits";
  auto x = param("x", 0, {1000});
  g.params = {x};
  for (OpKind op : {OpKind::RandomUniform, OpKind::RandomNormal, OpKind::TruncatedNormal})
    for (DType dt : {DType::Float32, DType::Float64}) {
      auto r =
          make_node(op, {}, Attrs{{"shape", Shape{1000}}, {"dtype", dt}, {"seed", int64_t{11}}});
      g.outputs.push_back(binary(OpKind::Mul, r, fill(0.1, {}, dt)));
    }
  // Math and a reduction on top of an input, in the same job.
  auto e = unary(OpKind::Exp, unary(OpKind::Tanh, x));
  g.outputs.push_back(
      binary(OpKind::Add, e,
             make_node(OpKind::ReduceSum, {e},
                       Attrs{{"axes", std::vector<int64_t>{0}}, {"keepdims", true}})));
  auto run = [&](bool run_once) {
    cpu::clear_kernel_cache();
    runtime::VariableStore store;
    jit::JobDescription job;
    job.name = run_once ? "inits.init" : "inits";
    job.signature = run_once ? "init:x" : "x";
    job.graph = g;
    jit::CompileSettings settings;
    settings.debug = 0;
    jit::CompiledJob cj = jit::compile_job(job, settings, store);
    std::vector<float> in = random_floats(1000, 5);
    std::vector<std::vector<char>> out;
    std::vector<void*> outs;
    for (const NodeRef& o : g.outputs) {
      out.emplace_back(static_cast<size_t>(o->type().bytes()));
      outs.push_back(out.back().data());
    }
    const void* ins[] = {in.data()};
    cj.program->run(ins, outs.data());
    return out;
  };
  auto o3 = run(false), o1 = run(true);
  ASSERT_EQ(o3.size(), o1.size());
  for (size_t i = 0; i < o3.size(); ++i) EXPECT_TRUE(o3[i] == o1[i]) << "output " << i;
}

namespace {

// Reference Philox-4x32-10 with the counter block (counter, 0, 0) and key seed.
uint32_t philox_w0(int64_t counter, uint64_t seed) {
  uint64_t u = static_cast<uint64_t>(counter);
  std::array<uint32_t, 4> c = {static_cast<uint32_t>(u), static_cast<uint32_t>(u >> 32), 0, 0};
  std::array<uint32_t, 2> k = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t{0xD2511F53u} * c[0], p1 = uint64_t{0xCD9E8D57u} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += 0x9E3779B9u;
    k[1] += 0xBB67AE85u;
  }
  return c[0];
}

}  // namespace

// Initializers that differ only in their seed and size share one compiled
// body that reads the seed at run time; each still draws its own numbers.
TEST(CompileUnits, RandomKernelsOfOtherSeedsAndSizesShareOneBody) {
  const std::vector<std::pair<int64_t, int64_t>> cases = {
      {1000, 11}, {640, 12}, {37, int64_t{0x123456789abcdef}}, {1000, 11}};
  Graph g;
  g.name = "seeds";
  auto x = param("x", 0, {4});
  g.params = {x};
  for (auto [n, seed] : cases)
    g.outputs.push_back(
        make_node(OpKind::RandomUniform, {},
                  Attrs{{"shape", Shape{n}}, {"dtype", DType::Float32}, {"seed", seed}}));
  std::vector<codegen::Kernel> ks = kernels_of(g);
  ASSERT_GE(ks.size(), 3u);
  for (bool run_once : {true, false}) {
    cpu::clear_kernel_cache();
    cpu::CompileOptions opts;
    opts.run_once = run_once;
    std::vector<runtime::Launch> launches = flowjit::testing::launch_records(ks);
    cpu::CompiledObject c = cpu::compile(ks, launches, opts);
    EXPECT_EQ(c.kernels_compiled, 1) << c.kernel_times;
    EXPECT_EQ(c.kernels_shared, static_cast<int>(ks.size()) - 1);
    // Each launch keeps its own extent.
    std::vector<int64_t> ranges;
    for (const auto& l : launches) ranges.push_back(l.cpu()->range);
    EXPECT_NE(std::find(ranges.begin(), ranges.end(), 37), ranges.end());
    // Another job of the process with another seed compiles nothing new.
    codegen::Kernel other = ks[0];
    for (auto& n : other.nodes)
      if (n.kind == codegen::KOp::Random) n.seed = 99;
    other.name = "other";
    std::vector<runtime::Launch> other_launch = flowjit::testing::launch_records({other});
    EXPECT_EQ(cpu::compile({other}, other_launch, opts).kernels_compiled, 0);
  }

  cpu::clear_kernel_cache();
  runtime::VariableStore store;
  jit::JobDescription job;
  job.name = "seeds.init";
  job.signature = "init:x";
  job.graph = g;
  jit::CompiledJob cj = jit::compile_job(job, jit::CompileSettings{}, store);
  std::vector<std::vector<float>> out;
  std::vector<void*> outs;
  for (auto [n, seed] : cases) out.emplace_back(static_cast<size_t>(n));
  for (auto& o : out) outs.push_back(o.data());
  std::vector<float> in(4, 0.f);
  const void* ins[] = {in.data()};
  cj.program->run(ins, outs.data());
  for (size_t i = 0; i < cases.size(); ++i) {
    auto [n, seed] = cases[i];
    for (int64_t j = 0; j < n; ++j) {
      float want = static_cast<float>(philox_w0(j, static_cast<uint64_t>(seed)) >> 8) * 0x1p-24f;
      ASSERT_EQ(out[i][j], want) << "output " << i << " element " << j;
    }
  }
}
