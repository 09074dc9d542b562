// The backend interface: target ids, the SM list, plan comparison on a
// cache hit, and the CPU backend driven through the interface alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "codegen/cpu/backend.h"
#include "codegen/cpu/cpu_codegen.h"
#include "codegen/nvptx/backend.h"
#include "ir/error.h"
#include "jit/backend.h"
#include "jit/fusion.h"
#include "runtime/executable.h"
#include "runtime/memory.h"
#include "tests/cpp/test_util.h"

using namespace flowjit;
using namespace flowjit::ir;

namespace {

using flowjit::testing::param;

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
  // The run's checks travel with the plan (exports run it without fusion):
  // texts with spaces, '%' and newlines come back exactly.
  runtime::Plan k = b;
  k.arena_bytes = 64;
  k.status_offset = 32;
  runtime::RunCheck check;
  check.what = "one_hot: indices 100% \"odd\"\nline";
  check.where = "my file.py:12";
  check.limit = -1;
  check.limits = {3, 4};
  check.shape = {2, 5};
  check.device_split = 0;
  k.checks = {check, runtime::RunCheck{"numerics", "", 0, {}, {7}, true, -1, "other job"}};
  runtime::Plan back = runtime::Plan::deserialize(k.serialize());
  EXPECT_EQ(back.status_offset, 32);
  ASSERT_EQ(back.checks.size(), 2u);
  EXPECT_EQ(back.checks[0].what, check.what);
  EXPECT_EQ(back.checks[0].where, check.where);
  EXPECT_EQ(back.checks[0].limits, check.limits);
  EXPECT_EQ(back.checks[0].shape, check.shape);
  EXPECT_EQ(back.checks[0].device_split, 0);
  EXPECT_TRUE(back.checks[1].numerics);
  EXPECT_EQ(back.checks[1].job, "other job");
  EXPECT_TRUE(back.checks[1].where.empty());
  EXPECT_EQ(back.serialize(), k.serialize());
  // A status buffer outside the arena, or checks without one, are refused.
  std::string kt = k.serialize();
  for (auto [from, to] : {std::pair<std::string, std::string>{"status 32", "status 40"},
                          {"status 32\n", ""},
                          {"my%20", "my%2z"}}) {
    std::string damaged = kt;
    damaged.replace(damaged.find(from), from.size(), to);
    EXPECT_THROW(runtime::Plan::deserialize(damaged), UserError) << to;
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

// An elementwise kernel whose output is larger than the caches writes it with
// streaming stores, peeled to a vector-aligned address first: the result is
// right whatever the output's alignment and wherever the thread split falls.
// A small output keeps plain stores.
TEST(Backend, LargeElementwiseOutputStreamsAtAnyAlignment) {
  const codegen::cpu::CpuTarget& t = codegen::cpu::host_target();
  // The kernel's threshold (codegen/cpu/loops.cpp): 4 x L2 x threads bytes.
  double floats = 4.0 * static_cast<double>(t.l2_bytes) * std::max(1, t.threads) / 4;
  if (floats > double(1 << 26))
    GTEST_SKIP() << "this host's caches need a " << floats * 4 / (1 << 20) << " MiB output";
  auto compile_run = [](int64_t n, bool* streams) {
    NodeRef x = param("x", 0, {n});
    NodeRef y = make_node(OpKind::Add, {make_node(OpKind::Mul, {x, x}), x});
    Graph g;
    g.name = "t";
    g.params = {x};
    g.outputs = {y};
    jit::FusedProgram fp = jit::fuse(g, "t");
    jit::JobDescription job;
    job.name = "t";
    std::unique_ptr<jit::Backend> b = jit::make_backend(job, jit::Target{});
    jit::PassLog log;
    jit::CompileRequest req;
    req.module_name = "t";
    req.want_llvm_ir = true;
    jit::CodeObject code = b->compile(fp.kernels, fp.plan, req, log);
    *streams = code.llvm_ir.find("!nontemporal") != std::string::npos;
    // A streaming loop prefetches its input ahead (loops.cpp: the hardware
    // prefetchers alone left a compute-heavy streaming loop waiting on loads).
    if (*streams) EXPECT_NE(code.llvm_ir.find("@llvm.prefetch"), std::string::npos);
    std::shared_ptr<runtime::Program> p = b->load(code, log);
    runtime::VariableStore store;
    b->bind(*p, store);
    std::vector<float> in(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) in[i] = 0.001f * static_cast<float>(i % 4001) - 2.f;
    std::vector<float> buf(static_cast<size_t>(n) + 64);
    for (int threads : {1, 2}) {
      runtime::set_num_threads(threads);
      for (int shift : {0, 1, 3, 13}) {  // the output 0, 4, 12, 52 bytes past 64-byte alignment
        float* out = buf.data() + shift;
        std::fill(buf.begin(), buf.end(), -7.f);
        const void* ins[] = {in.data()};
        void* outs[] = {out};
        p->run(ins, outs);
        int64_t bad = 0;
        for (int64_t i = 0; i < n; ++i) {
          float want = in[i] * in[i] + in[i];
          if (std::fabs(out[i] - want) > 1e-6f * std::max(1.f, std::fabs(want))) ++bad;
        }
        EXPECT_EQ(bad, 0) << "n=" << n << " threads=" << threads << " shift=" << shift;
        EXPECT_EQ(buf[static_cast<size_t>(shift + n)], -7.f) << "wrote past the end";
        if (shift > 0) EXPECT_EQ(buf[static_cast<size_t>(shift - 1)], -7.f) << "wrote before";
      }
    }
    runtime::set_num_threads(0);
  };
  bool streams = false;
  compile_run(static_cast<int64_t>(floats) + 37, &streams);
  EXPECT_TRUE(streams) << "a large elementwise output is written with streaming stores";
  {
    // Rows of an odd length (a broadcast keeps the domain 2-D): every row
    // starts at another alignment and is peeled on its own.
    const int64_t m = 1031, rows = static_cast<int64_t>(floats) / m + 1;
    NodeRef x = param("x", 0, {rows, m});
    NodeRef b = make_node(OpKind::Parameter, {},
                          Attrs{{"name", std::string("b")},
                                {"index", int64_t{1}},
                                {"shape", Shape{m}},
                                {"dtype", DType::Float32}});
    Graph g;
    g.name = "t2";
    g.params = {x, b};
    g.outputs = {binary(OpKind::Add, x, b)};
    jit::FusedProgram fp = jit::fuse(g, "t2");
    jit::JobDescription job;
    job.name = "t2";
    std::unique_ptr<jit::Backend> be = jit::make_backend(job, jit::Target{});
    jit::PassLog log;
    jit::CompileRequest req;
    req.module_name = "t2";
    req.want_llvm_ir = true;
    jit::CodeObject code = be->compile(fp.kernels, fp.plan, req, log);
    EXPECT_NE(code.llvm_ir.find("!nontemporal"), std::string::npos);
    std::shared_ptr<runtime::Program> p = be->load(code, log);
    runtime::VariableStore store;
    be->bind(*p, store);
    std::vector<float> vx(static_cast<size_t>(rows * m)), vb(static_cast<size_t>(m));
    for (size_t i = 0; i < vx.size(); ++i) vx[i] = static_cast<float>(i % 977);
    for (int64_t j = 0; j < m; ++j) vb[j] = 0.5f * static_cast<float>(j);
    std::vector<float> out(vx.size() + 3, -7.f);
    const void* ins[] = {vx.data(), vb.data()};
    void* outs[] = {out.data() + 3};
    p->run(ins, outs);
    int64_t bad = 0;
    for (int64_t i = 0; i < rows * m; ++i)
      if (out[static_cast<size_t>(i + 3)] != vx[i] + vb[i % m]) ++bad;
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(out[2], -7.f);
  }
  compile_run(1000, &streams);
  EXPECT_FALSE(streams) << "a small output stays in the caches for its reader";
}

// Large result buffers are recycled by size; small ones and the excess over
// the cap go back to the system.
TEST(Runtime, BufferPoolRecyclesLargeBuffersBySize) {
  using runtime::BufferPool;
  BufferPool& pool = BufferPool::instance();
  pool.clear();
  const size_t big = (size_t{3} << 20) + 100;
  void* a = pool.acquire(big);
  EXPECT_TRUE(runtime::is_aligned(a));
  std::memset(a, 1, big);
  pool.release(a, big);
  EXPECT_GE(pool.cached_bytes(), big);
  void* c = pool.acquire(big + 4096);  // another size: not the cached block
  EXPECT_NE(c, a);
  void* b = pool.acquire(big);
  EXPECT_EQ(b, a) << "a freed block of the same size is handed out again";
  EXPECT_EQ(pool.cached_bytes(), 0u);
  pool.release(b, big);
  pool.release(c, big + 4096);
  void* s = pool.acquire(1000);
  pool.release(s, 1000);
  EXPECT_LT(pool.cached_bytes(), 2 * big + 8192) << "small blocks are not cached";
  std::vector<void*> many;
  for (size_t i = 0; i < BufferPool::kMaxCachedBytes / (size_t{32} << 20) + 3; ++i)
    many.push_back(pool.acquire(size_t{32} << 20));
  for (void* p : many) pool.release(p, size_t{32} << 20);
  EXPECT_LE(pool.cached_bytes(), BufferPool::kMaxCachedBytes);
  pool.clear();
  EXPECT_EQ(pool.cached_bytes(), 0u);
}

}  // namespace
