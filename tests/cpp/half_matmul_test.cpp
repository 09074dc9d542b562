// [amp] bfloat16 matmuls on the CPU: which targets keep them in bfloat16
// (jit/passes/widen_half, as the backend's optimize options say) and the
// vdpbf16ps micro-kernel they get there (codegen/cpu/matmul.cpp). The code
// is generated for named CPUs, so every host checks it; its numerics run
// in tests/python/test_half.py on hosts that have the instructions.
#include <gtest/gtest.h>

#include <string>

#include "codegen/cpu/backend.h"
#include "ir/printer.h"
#include "jit/backend.h"
#include "jit/fusion.h"
#include "jit/passes/widen_half.h"
#include "jit/pipeline.h"
#include "tests/cpp/test_util.h"

using namespace flowjit;
using namespace flowjit::ir;

namespace {

// x @ w^T + b, relu; z @ y (odd k, edges in m and n).
std::string matmuls(const std::string& dt) {
  std::string t =
      "graph t {\n"
      "  %x = parameter() {dtype=DT, index=0, name=\"x\", shape=[100,73]} : DT[100,73]\n"
      "  %w = parameter() {dtype=DT, index=1, name=\"w\", shape=[136,73]} : DT[136,73]\n"
      "  %b = parameter() {dtype=DT, index=2, name=\"b\", shape=[136]} : DT[136]\n"
      "  %z = parameter() {dtype=DT, index=3, name=\"z\", shape=[37,73]} : DT[37,73]\n"
      "  %y = parameter() {dtype=DT, index=4, name=\"y\", shape=[73,45]} : DT[73,45]\n"
      "  %0 = matmul(%x, %w) {transpose_a=false, transpose_b=true} : DT[100,136]\n"
      "  %1 = add(%0, %b) : DT[100,136]\n"
      "  %2 = relu(%1) : DT[100,136]\n"
      "  %3 = matmul(%z, %y) {transpose_a=false, transpose_b=false} : DT[37,45]\n"
      "  return %2, %3\n}\n";
  for (size_t at; (at = t.find("DT")) != std::string::npos;) t.replace(at, 2, dt);
  return t;
}

int count_ops(const Graph& g, OpKind op, DType dt) {
  int n = 0;
  for (const NodeRef& x : g.topo_order())
    if (x->op() == op && x->dtype() == dt) ++n;
  return n;
}

// The kernels for named CPU `cpu` and their assembly.
struct Built {
  jit::FusedProgram fp;
  std::string assembly;
};

Built build_for(const std::string& text, const std::string& cpu) {
  jit::Target target;
  target.cpu = cpu;
  jit::PassLog log;
  Graph opt = jit::optimize(parse_graph(text), log, jit::optimize_options(target));
  Built b{jit::fuse(opt, "t"), ""};
  auto launches = flowjit::testing::launch_records(b.fp.kernels);
  codegen::cpu::CompileOptions co;
  co.cpu = cpu;
  co.want_assembly = true;
  b.assembly = codegen::cpu::compile(b.fp.kernels, launches, co).assembly;
  return b;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(HalfMatmul, WidenHalfKeepsTheTypesTheTargetComputes) {
  for (const char* dt : {"f16", "bf16"}) {
    Graph g = parse_graph(matmuls(dt));
    DType t = std::string(dt) == "f16" ? DType::Float16 : DType::BFloat16;
    EXPECT_EQ(count_ops(jit::widen_half(g), OpKind::MatMul, t), 0) << dt;
    EXPECT_EQ(count_ops(jit::widen_half(g), OpKind::MatMul, DType::Float32), 2) << dt;
    EXPECT_EQ(count_ops(jit::widen_half(g, true, true), OpKind::MatMul, t), 2) << dt;
    // bfloat16 only: a float16 matmul is still widened.
    EXPECT_EQ(count_ops(jit::widen_half(g, false, true), OpKind::MatMul, t),
              t == DType::BFloat16 ? 2 : 0)
        << dt;
  }
}

TEST(HalfMatmul, OnlyCpusWithBf16DotProductsKeepBf16Matmuls) {
  EXPECT_TRUE(codegen::cpu::bf16_matmuls("znver4"));           // AVX512-BF16
  EXPECT_TRUE(codegen::cpu::bf16_matmuls("sapphirerapids"));   // AVX512-BF16 (and AMX)
  EXPECT_FALSE(codegen::cpu::bf16_matmuls("x86-64-v3"));       // AVX2
  EXPECT_FALSE(codegen::cpu::bf16_matmuls("skylake-avx512"));  // AVX-512 without BF16
  jit::Target gpu;
  gpu.kind = jit::Target::Kind::Gpu;
  EXPECT_TRUE(jit::optimize_options(gpu).f16_matmuls);
  EXPECT_TRUE(jit::optimize_options(gpu).bf16_matmuls);
}

TEST(HalfMatmul, Bf16MatmulsRunOnVdpbf16psWhereTheCpuHasIt) {
  Built z4 = build_for(matmuls("bf16"), "znver4");
  int mm = 0;
  for (const codegen::Kernel& k : z4.fp.kernels) {
    if (k.kind != codegen::Kernel::Kind::MatMul) continue;
    ++mm;
    EXPECT_EQ(k.args.at(k.mm.a.arg).dtype, DType::BFloat16) << k.name << ": not widened";
  }
  EXPECT_EQ(mm, 2);
  EXPECT_GE(count(z4.assembly, "vdpbf16ps"), 2 * 24) << "a 12x32 tile: 24 per k pair";
  // Without the instructions: float32 kernels behind conversions, no vdpbf16ps.
  Built v3 = build_for(matmuls("bf16"), "x86-64-v3");
  for (const codegen::Kernel& k : v3.fp.kernels)
    if (k.kind == codegen::Kernel::Kind::MatMul)
      EXPECT_EQ(k.args.at(k.mm.a.arg).dtype, DType::Float32) << k.name;
  EXPECT_EQ(count(v3.assembly, "vdpbf16ps"), 0);
  // float16 has no CPU micro-kernel on either.
  EXPECT_EQ(count(build_for(matmuls("f16"), "znver4").assembly, "vdpbf16ps"), 0);
}

}  // namespace
