// The backend interface: target ids, the SM list, plan comparison on a
// cache hit, and the CPU backend driven through the interface alone.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "codegen/cpu/backend.h"
#include "codegen/nvptx/backend.h"
#include "ir/error.h"
#include "jit/backend.h"
#include "jit/fusion.h"
#include "tests/cpp/test_util.h"

using namespace flowjit;
using namespace flowjit::ir;

namespace {

NodeRef param(const std::string& name, int64_t index, Shape s) {
  return make_node(
      OpKind::Parameter, {},
      Attrs{{"name", name}, {"index", index}, {"shape", s}, {"dtype", DType::Float32}});
}

TEST(Backend, TargetIdIsWrittenInOnePlace) {
  codegen::TargetId cpu = codegen::cpu::host_target_id();
  std::string expected = cpu.triple + ";" + cpu.processor;
  for (const std::string& f : cpu.facts) expected += ";" + f;
  EXPECT_EQ(cpu.str(), expected);
  EXPECT_EQ(cpu.facts.at(0).rfind("+", 0), 0u);  // the feature list comes first
  cpu.placement = "x2 devices";
  EXPECT_EQ(cpu.str().substr(cpu.str().size() - 11), " x2 devices");

  namespace nv = codegen::nvptx;
  EXPECT_EQ(nv::module_target(90, false, "builtin", "none").str(),
            "nvptx64-nvidia-cuda;sm_90;tf32=0;math=builtin;ptxas=none");
  EXPECT_EQ(nv::module_target(80, true, "builtin", "/x/ptxas", 78, "yes").str(),
            "nvptx64-nvidia-cuda;sm_80;ptx78;tf32=1;math=builtin;ptxas=/x/ptxas;cubin=yes");
}

TEST(Backend, OneSmListDecidesSupportAndTheDevicesSm) {
  namespace nv = codegen::nvptx;
  for (int sm : nv::kSupportedSms) {
    EXPECT_TRUE(nv::is_supported_sm(sm));
    EXPECT_EQ(nv::codegen_sm(sm), sm);
    EXPECT_NE(nv::supported_sms_text().find("sm_" + std::to_string(sm)), std::string::npos);
  }
  EXPECT_FALSE(nv::is_supported_sm(61));
  EXPECT_EQ(nv::codegen_sm(61), 0);
  EXPECT_EQ(nv::codegen_sm(120), nv::kSupportedSms[std::size(nv::kSupportedSms) - 1]);
}

TEST(Backend, SameProgramIgnoresOnlyWhatCodegenDecides) {
  runtime::Plan a;
  a.job_name = "t";
  a.inputs = {TensorType{DType::Float32, {4}}};
  a.outputs = {TensorType{DType::Float32, {4}}};
  runtime::Launch l;
  l.symbol = "k0";
  l.args = {{runtime::BufferKind::Input, 0, 0}, {runtime::BufferKind::Output, 0, 0}};
  l.summary = "add";
  a.launches = {l};
  runtime::Plan b = a;
  b.launches[0].geometry = runtime::CpuRange{7, 3, 64};
  EXPECT_TRUE(a.same_program(b)) << "codegen's range, grain and scratch bytes";
  runtime::Plan g = a;
  runtime::GpuGrid grid;
  grid.grid[0] = 5;
  grid.block[0] = 128;
  g.launches[0].geometry = grid;
  EXPECT_TRUE(a.same_program(g)) << "codegen's GPU grid";
  runtime::Plan c = a;
  c.launches[0].args[1].offset_bytes = 64;
  EXPECT_FALSE(a.same_program(c));
  runtime::Plan d = a;
  d.launches[0].collective = runtime::CollectiveStep{};
  EXPECT_FALSE(a.same_program(d));
  runtime::Plan e = a;
  e.arena_bytes = 128;
  EXPECT_FALSE(a.same_program(e));
  // The text round trip a cache hit goes through keeps it the same program.
  EXPECT_TRUE(a.same_program(runtime::Plan::deserialize(b.serialize())));
  // ... and keeps the geometry, CPU range or GPU grid, exactly.
  EXPECT_EQ(runtime::Plan::deserialize(b.serialize()).launches[0].geometry, b.launches[0].geometry);
  EXPECT_EQ(runtime::Plan::deserialize(g.serialize()).launches[0].geometry, g.launches[0].geometry);
  EXPECT_EQ(runtime::Plan::deserialize(g.serialize()).serialize(), g.serialize());
  // The CPU words are the text CPU entries always had; damaged ones are refused.
  std::string text = b.serialize();
  ASSERT_NE(text.find("launch k0 7 3 64 I0+0 O0+0\n"), std::string::npos) << text;
  for (std::string bad : {"7x 3 64", "7 3", "grid=7 3 64"}) {
    std::string damaged = text;
    damaged.replace(damaged.find("7 3 64"), 6, bad);
    EXPECT_THROW(runtime::Plan::deserialize(damaged), UserError) << bad;
  }
}

TEST(Backend, CpuCompileLoadBindRunThroughTheInterface) {
  NodeRef x = param("x", 0, {1000});
  NodeRef y = make_node(OpKind::Exp, {x});
  Graph g;
  g.name = "t";
  g.params = {x};
  g.outputs = {y};
  jit::FusedProgram fp = jit::fuse(g, "t");
  jit::JobDescription job;
  job.name = "t";
  std::unique_ptr<jit::Backend> b = jit::make_backend(job, jit::Target{});
  EXPECT_STREQ(b->name(), "cpu");
  EXPECT_EQ(b->target(), codegen::cpu::host_target_id());
  jit::PassLog log;
  jit::CompileRequest req;
  req.module_name = "t";
  req.want_llvm_ir = true;
  jit::CodeObject code = b->compile(fp.kernels, fp.plan, req, log);
  EXPECT_FALSE(code.object.empty());
  EXPECT_NE(code.llvm_ir.find("define"), std::string::npos);
  ASSERT_EQ(code.plan.launches.size(), 1u);
  std::vector<runtime::Launch> direct = flowjit::testing::launch_records(fp.kernels);
  codegen::cpu::compile(fp.kernels, direct, {});
  ASSERT_NE(code.plan.launches[0].cpu(), nullptr);
  EXPECT_EQ(code.plan.launches[0].geometry, direct[0].geometry)
      << "codegen's range is in the plan the code runs with";
  EXPECT_FALSE(fp.plan.launches[0].geometry == direct[0].geometry)
      << "fusion leaves the geometry to codegen";
  EXPECT_TRUE(code.plan.same_program(fp.plan));
  std::shared_ptr<runtime::Program> p = b->load(code, log);
  runtime::VariableStore store;
  b->bind(*p, store);
  EXPECT_EQ(p->device(), "cpu");
  ASSERT_EQ(p->input_slots().size(), 1u);
  EXPECT_EQ(p->input_slots()[0].arrays, 1);
  std::vector<float> in(1000), out(1000), out2(1000);
  for (int i = 0; i < 1000; ++i) in[i] = 0.01f * static_cast<float>(i) - 5.f;
  const void* ins[] = {in.data()};
  void* outs[] = {out.data()};
  p->run(ins, outs);
  for (int i = 0; i < 1000; i += 111) EXPECT_NEAR(out[i], std::exp(in[i]), 1e-5f * std::exp(in[i]));
  // start() on the CPU computes at once; complete() only reports.
  std::shared_ptr<runtime::PendingRun> r = p->start(ins, {out2.data()});
  r->complete();
  EXPECT_EQ(out, out2);
  // A damaged object is refused by load (the hit path then recompiles).
  jit::CodeObject bad = code;
  bad.object.resize(bad.object.size() / 2);
  EXPECT_THROW(b->load(bad, log), UserError);
}

}  // namespace
