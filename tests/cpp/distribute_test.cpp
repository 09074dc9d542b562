// Several devices: the collective ops' types, the layouts jit/distribute
// picks, the boxing it inserts, fusion of collective launches, and the
// in-process communicator for every dtype, odd sizes and failures.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "ir/error.h"
#include "ir/printer.h"
#include "jit/distribute.h"
#include "jit/fusion.h"
#include "jit/pipeline.h"
#include "runtime/comm/collective.h"
#include "runtime/executable.h"
#include "tests/cpp/test_util.h"

using namespace flowjit;
using namespace flowjit::ir;

namespace {

using flowjit::testing::param;

NodeRef variable(const std::string& name, const Shape& s) {
  return make_node(OpKind::Variable, {},
                   Attrs{{"name", name}, {"shape", s}, {"dtype", DType::Float32}});
}

int count_op(const Graph& g, OpKind op) {
  int n = 0;
  for (auto& x : g.topo_order()) n += x->op() == op;
  return n;
}

jit::DistributedGraph dist(const Graph& g, int parts, std::map<std::string, int> split = {}) {
  jit::DistributeOptions o;
  o.parts = parts;
  o.split_vars = std::move(split);
  return jit::distribute(g, o);
}

}  // namespace

TEST(Collective, TypesOfTheCollectiveOps) {
  auto x = param("x", 0, {6, 4});
  Attrs a{{"parts", int64_t{2}}, {"axis", int64_t{0}}};
  EXPECT_EQ(make_node(OpKind::AllGather, {x}, a)->shape(), (Shape{12, 4}));
  EXPECT_EQ(make_node(OpKind::ReduceScatter, {x}, a)->shape(), (Shape{3, 4}));
  EXPECT_EQ(make_node(OpKind::LocalSlice, {x}, Attrs{{"parts", int64_t{2}}, {"axis", int64_t{-1}}})
                ->shape(),
            (Shape{6, 2}));
  EXPECT_EQ(make_node(OpKind::AllReduce, {x}, Attrs{{"parts", int64_t{2}}})->shape(),
            (Shape{6, 4}));
  EXPECT_THROW(
      make_node(OpKind::LocalSlice, {x}, Attrs{{"parts", int64_t{4}}, {"axis", int64_t{0}}}),
      UserError);
  EXPECT_TRUE(is_collective(OpKind::AllReduce));
  EXPECT_FALSE(is_collective(OpKind::Add));
}

TEST(Distribute, DataParallelMatmulSplitsRowsAndReducesTheWeightGradient) {
  // y = x @ w; the "gradient" x^T @ y is a partial sum, all-reduced before
  // it is written into the replicated variable.
  Graph g;
  auto x = param("x", 0, {8, 5});
  auto w = variable("w", {5, 3});
  auto y = matmul(x, w, false, false);
  auto gw = matmul(x, y, true, false);
  g.params = {x};
  g.outputs = {y};
  g.effects = {make_node(OpKind::Assign, {w, binary(OpKind::Sub, w, gw)})};
  auto d = dist(g, 2);
  EXPECT_EQ(d.params[0], jit::Sbp::S(0));
  EXPECT_EQ(d.outputs[0], jit::Sbp::S(0));
  EXPECT_EQ(d.local.params[0]->shape(), (Shape{4, 5}));
  EXPECT_EQ(d.local.outputs[0]->shape(), (Shape{4, 3}));
  EXPECT_EQ(count_op(d.local, OpKind::AllReduce), 1) << print_graph(d.local);
  EXPECT_EQ(d.collectives, 1);
}

TEST(Distribute, SplitWeightIsGatheredForUseAndItsGradientReduceScattered) {
  Graph g;
  auto x = param("x", 0, {100, 512});
  auto w = variable("w", {10, 512});  // OneFlow's (units, in) layout, split by units
  auto y = matmul(x, w, false, true);
  auto gw = matmul(y, x, true, false);  // (10, 512), partial over the batch
  g.params = {x};
  g.outputs = {y};
  g.effects = {make_node(OpKind::Assign, {w, binary(OpKind::Sub, w, gw)})};
  auto d = dist(g, 2, {{"w", 0}});
  EXPECT_EQ(std::get<1>(d.variables[0]), jit::Sbp::S(0));
  // Gathering the 20 KiB weight moves less than gathering the 200 KiB rows.
  EXPECT_EQ(count_op(d.local, OpKind::AllGather), 1) << print_graph(d.local);
  EXPECT_EQ(count_op(d.local, OpKind::ReduceScatter), 1) << print_graph(d.local);
  EXPECT_EQ(count_op(d.local, OpKind::AllReduce), 0) << print_graph(d.local);
  for (auto& n : d.local.topo_order())
    if (n->op() == OpKind::Variable) {
      EXPECT_EQ(n->shape(), (Shape{5, 512}));
    }
}

TEST(Distribute, SumOverTheSplitAxisIsPartialAndMaxIsGathered) {
  Graph g;
  auto x = param("x", 0, {6, 3});
  g.params = {x};
  g.outputs = {reduce(OpKind::ReduceSum, x, {0}, false), reduce(OpKind::ReduceMax, x, {0}, false),
               reduce(OpKind::ReduceSum, x, {1}, false)};
  auto d = dist(g, 3);
  EXPECT_EQ(d.outputs[0], jit::Sbp::B());
  EXPECT_EQ(d.outputs[1], jit::Sbp::B());
  EXPECT_EQ(d.outputs[2], jit::Sbp::S(0));
  EXPECT_EQ(count_op(d.local, OpKind::AllReduce), 1);
  EXPECT_EQ(count_op(d.local, OpKind::AllGather), 1);
}

TEST(Distribute, ReshapeKeepsTheSplitWhenThePiecesAgree) {
  Graph g;
  auto x = param("x", 0, {4, 1, 2, 3});
  g.params = {x};
  g.outputs = {reshape(x, {4, 6}), reshape(x, {24})};
  auto d = dist(g, 2);
  EXPECT_EQ(d.outputs[0], jit::Sbp::S(0));
  EXPECT_EQ(d.outputs[1], jit::Sbp::S(0));  // contiguous pieces of 12 either way
  EXPECT_EQ(d.collectives, 0) << print_graph(d.local);
}

TEST(Distribute, OddBatchesAndMirroredValuesIntoVariablesAreHandled) {
  Graph g;
  auto x = param("x", 0, {5, 3});
  g.params = {x};
  g.outputs = {unary(OpKind::Exp, x)};
  auto d = dist(g, 2);
  EXPECT_EQ(d.params[0], jit::Sbp::B());

  Graph m;
  auto p = param("p", 0, {4});
  auto v = variable("v", {4});
  m.params = {p};
  m.effects = {make_node(OpKind::Assign, {v, p})};
  jit::DistributeOptions o;
  o.parts = 2;
  o.mirrored = true;
  try {
    jit::distribute(m, o);
    FAIL() << "expected a NotImplemented error";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotImplemented);
    EXPECT_NE(std::string(e.what()).find("variable 'v' is assigned a per-device"),
              std::string::npos);
  }
}

TEST(Distribute, FusionMakesCollectivesLaunchesWithoutCode) {
  Graph g;
  auto x = param("x", 0, {8, 4});
  g.params = {x};
  g.outputs = {unary(OpKind::Exp, reduce(OpKind::ReduceSum, unary(OpKind::Square, x), {0}, false))};
  auto d = dist(g, 2);
  jit::FusedProgram fp = jit::fuse(d.local, "t");
  int collectives = 0;
  for (size_t i = 0; i < fp.kernels.size(); ++i) {
    if (fp.kernels[i].kind != codegen::Kernel::Kind::Collective) continue;
    ++collectives;
    ASSERT_TRUE(fp.plan.launches[i].collective.has_value()) << fp.plan.launches[i].symbol;
    const runtime::CollectiveStep& c = *fp.plan.launches[i].collective;
    EXPECT_EQ(c.op, runtime::CollectiveStep::Op::AllReduce);
    EXPECT_EQ(c.inner, 4);
    EXPECT_EQ(fp.plan.launches[i].args.size(), 2u);
  }
  EXPECT_EQ(collectives, 1) << fp.description;
  // The typed step survives the plan's text form; malformed ones are refused.
  runtime::Plan back = runtime::Plan::deserialize(fp.plan.serialize());
  for (size_t i = 0; i < fp.plan.launches.size(); ++i)
    EXPECT_EQ(back.launches[i].collective, fp.plan.launches[i].collective) << i;
  std::string head = "flowjit-plan 2\njob t\narena 0\nlaunch @k1 1 1 0 A0+0 A0+0\n";
  EXPECT_THROW(runtime::Plan::deserialize(head + "collective all_reduce f32 2 1\nend\n"),
               UserError);
  EXPECT_THROW(runtime::Plan::deserialize(head + "collective shuffle f32 2 1 3\nend\n"), UserError);
  EXPECT_NO_THROW(runtime::Plan::deserialize(head + "collective all_gather f32 2 1 3\nend\n"));
  // The completion point of an asynchronous all_reduce: after it, at most the end.
  EXPECT_EQ(runtime::Plan::deserialize(head + "collective all_reduce f32 2 1 3 1\nend\n")
                .launches[0]
                .collective->complete_before,
            1);
  EXPECT_THROW(runtime::Plan::deserialize(head + "collective all_reduce f32 2 1 3 0\nend\n"),
               UserError);
  EXPECT_THROW(runtime::Plan::deserialize(head + "collective all_reduce f32 2 1 3 2\nend\n"),
               UserError);
  // An all_gather that only feeds a job output may be asynchronous too; the
  // other collectives run in place.
  EXPECT_EQ(runtime::Plan::deserialize(head + "collective all_gather f32 2 1 3 1\nend\n")
                .launches[0]
                .collective->complete_before,
            1);
  EXPECT_THROW(runtime::Plan::deserialize(head + "collective reduce_scatter f32 2 1 3 1\nend\n"),
               UserError);
  for (auto& l : fp.plan.launches)
    if (l.collective) EXPECT_GT(l.collective->complete_before, 0) << fp.description;
}

TEST(Distribute, CollectiveQueueRunsInOrderAndReportsTheFirstError) {
  runtime::CollectiveQueue q;
  std::vector<int> seen;
  uint64_t a = q.submit([&] { seen.push_back(1); });
  q.wait(a);
  EXPECT_EQ(seen, std::vector<int>{1});
  uint64_t b = q.submit([&] { throw UserError(ErrorKind::Runtime, "peer gone"); });
  uint64_t c = q.submit([&] { seen.push_back(3); });  // skipped after the failure
  try {
    q.wait(b);
    FAIL() << "expected the error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("peer gone"), std::string::npos);
  }
  EXPECT_THROW(q.wait(c), UserError);
  q.drain();  // the next run starts clean
  uint64_t d = q.submit([&] { seen.push_back(4); });
  q.wait(d);
  EXPECT_EQ(seen, (std::vector<int>{1, 4}));
}

// The communication thread runs with what prioritize_communication_thread()
// obtains on this host (a short slice, a lower nice value, or neither where
// the kernel or the permissions refuse), compared with a thread that asks.
TEST(Distribute, CollectiveQueueThreadIsPrioritized) {
  runtime::ThreadSchedule plain, granted, queue;
  std::thread([&] {
    plain = runtime::current_thread_schedule();
    runtime::prioritize_communication_thread();
    granted = runtime::current_thread_schedule();
  }).join();
  EXPECT_LE(granted.nice, plain.nice);
  runtime::CollectiveQueue q;
  q.wait(q.submit([&] { queue = runtime::current_thread_schedule(); }));
  EXPECT_EQ(queue.slice_ns, granted.slice_ns);
  EXPECT_EQ(queue.nice, granted.nice);
}

// ---------------------------------------------------------------- communicator

namespace {

template <class T>
void check_thread_collectives(DType dt, int ranks, int64_t outer, int64_t inner) {
  auto comm = runtime::make_thread_communicator(ranks);
  int64_t n = outer * inner;
  std::vector<std::vector<T>> in(ranks), red(ranks), gat(ranks), scat(ranks);
  for (int r = 0; r < ranks; ++r) {
    in[r].resize(static_cast<size_t>(n * ranks));
    for (int64_t i = 0; i < n * ranks; ++i) in[r][i] = static_cast<T>((i * 7 + r * 3) % 11);
    red[r].assign(static_cast<size_t>(n * ranks), T());
    gat[r].assign(static_cast<size_t>(n * ranks), T());
    scat[r].assign(static_cast<size_t>(n), T());
  }
  std::vector<std::thread> ts;
  for (int r = 0; r < ranks; ++r)
    ts.emplace_back([&, r] {
      comm->all_reduce(r, in[r].data(), red[r].data(), n * ranks, dt);
      comm->all_gather(r, in[r].data(), gat[r].data(), outer,
                       inner * static_cast<int64_t>(sizeof(T)));
      comm->reduce_scatter(r, in[r].data(), scat[r].data(), outer, inner, dt);
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < ranks; ++r) {
    for (int64_t i = 0; i < n * ranks; ++i) {
      T want = T();
      for (int q = 0; q < ranks; ++q) want = static_cast<T>(want + in[q][i]);
      ASSERT_EQ(red[r][i], want) << "all_reduce rank " << r << " element " << i;
    }
    for (int64_t o = 0; o < outer; ++o)
      for (int q = 0; q < ranks; ++q)
        for (int64_t i = 0; i < inner; ++i)
          ASSERT_EQ(gat[r][(o * ranks + q) * inner + i], in[q][o * inner + i]) << "all_gather";
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        T want = T();
        for (int q = 0; q < ranks; ++q)
          want = static_cast<T>(want + in[q][(o * ranks + r) * inner + i]);
        ASSERT_EQ(scat[r][o * inner + i], want) << "reduce_scatter";
      }
  }
}

}  // namespace

TEST(ThreadCommunicator, EveryDtypeAndOddSizes) {
  for (int ranks : {1, 2, 3, 4})
    for (auto [outer, inner] :
         std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 7}, {3, 5}, {2, 1000}, {0, 4}}) {
      check_thread_collectives<float>(DType::Float32, ranks, outer, inner);
      check_thread_collectives<double>(DType::Float64, ranks, outer, inner);
      check_thread_collectives<int32_t>(DType::Int32, ranks, outer, inner);
      check_thread_collectives<int64_t>(DType::Int64, ranks, outer, inner);
      check_thread_collectives<int8_t>(DType::Int8, ranks, outer, inner);
      check_thread_collectives<uint8_t>(DType::UInt8, ranks, outer, inner);
    }
}

TEST(ThreadCommunicator, BoolReducesWithOr) {
  auto comm = runtime::make_thread_communicator(2);
  uint8_t a[3] = {0, 1, 0}, b[3] = {0, 0, 1}, ra[3], rb[3];
  std::thread t([&] { comm->all_reduce(1, b, rb, 3, DType::Bool); });
  comm->all_reduce(0, a, ra, 3, DType::Bool);
  t.join();
  EXPECT_EQ(ra[0], 0);
  EXPECT_EQ(ra[1], 1);
  EXPECT_EQ(ra[2], 1);
  EXPECT_EQ(std::memcmp(ra, rb, 3), 0);
}

TEST(ThreadCommunicator, AbortWakesTheWaitingRanks) {
  auto comm = runtime::make_thread_communicator(3);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      float x = 1, y = 0;
      try {
        comm->all_reduce(r, &x, &y, 1, DType::Float32);
      } catch (const UserError& e) {
        errors[r] = e.what();
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  comm->abort("device 2 failed: out of memory");
  for (auto& t : ts) t.join();
  for (auto& e : errors)
    EXPECT_NE(e.find("device 2 failed: out of memory"), std::string::npos) << e;
}
