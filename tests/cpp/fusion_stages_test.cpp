// fusion's stages one at a time (jit/fusion/grouping.h, order.h): a record in,
// text or a record out.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ir/printer.h"
#include "jit/fusion/grouping.h"
#include "jit/fusion/order.h"
#include "jit/pipeline.h"

using namespace flowjit;
using namespace flowjit::ir;
using namespace flowjit::jit::fusion_detail;

namespace {

// The grouping of `ir_text` as it is written (no optimization passes), and
// the prepared graph's text, whose names the grouping uses.
struct Grouped {
  std::string graph, groups;
};

Grouped group_text(const std::string& ir_text, GroupingOptions opts = {}) {
  Graph g = prepare(parse_graph(ir_text));
  Uses uses = analyze(g);
  Grouping grouping = group(uses, opts);
  return {print_graph(g), print_grouping(g, uses, grouping)};
}

const char* kDense =
    "graph t {\n"
    "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[8,5]} : f32[8,5]\n"
    "  %w = parameter() {dtype=f32, index=1, name=\"w\", shape=[7,5]} : f32[7,5]\n"
    "  %b = parameter() {dtype=f32, index=2, name=\"b\", shape=[7]} : f32[7]\n"
    "  %0 = matmul(%x, %w) {transpose_a=false, transpose_b=true} : f32[8,7]\n"
    "  %1 = add(%0, %b) : f32[8,7]\n"
    "  %2 = relu(%1) : f32[8,7]\n"
    "  %3 = reduce_max(%2) {axes=[1], keepdims=true} : f32[8,1]\n"
    "  %4 = sub(%2, %3) : f32[8,7]\n"
    "  %5 = exp(%4) : f32[8,7]\n"
    "  %6 = reduce_sum(%5) {axes=[1], keepdims=true} : f32[8,1]\n"
    "  %7 = div(%5, %6) : f32[8,7]\n"
    "  return %7\n"
    "}\n";

}  // namespace

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

// The softmax's phases form one loop kernel over [8,7] reducing dim 1 (the
// maxima and sums map dim 1 to -1); the matmul takes its bias and ReLU.
TEST(FusionStages, GroupingPutsTheSoftmaxInOneKernelAndTheEpilogueWithTheMatmul) {
  Grouped g = group_text(kDense);
  EXPECT_EQ(lines(g.groups),
            (std::vector<std::string>{
                "g0 loop [8,7] reduce{1}: %3{0,-1} %4{0,1} %5{0,1} %6{0,-1} %7{0,1}",
                "g1 matmul [8,7]: %0{0,1} %1{0,1} %2{0,1}"}))
      << g.graph << g.groups;
}

// Without fusion every compute node is a group of its own, from the last.
TEST(FusionStages, GroupingWithoutFusionGivesEveryNodeItsOwnGroup) {
  Grouped g = group_text(kDense, {false, {}});
  std::vector<std::string> l = lines(g.groups);
  ASSERT_EQ(l.size(), 8u) << g.groups;
  EXPECT_EQ(l.front(), "g0 loop [8,7]: %7{0,1}");
  EXPECT_EQ(l[4], "g4 loop [8,7] reduce{1}: %3{0,-1}") << g.groups;
  EXPECT_EQ(l.back(), "g7 matmul [8,7]: %0{0,1}");
}

// A matmul kept out of its consumers' kernel (fuse() retries so when the
// epilogue's layout cannot be built): its epilogue, reserved for it, does not
// join the reduction's kernel either, and forms a loop kernel of its own.
TEST(FusionStages, GroupingKeepsAnUnfusedMatmulAlone) {
  Graph g = prepare(parse_graph(kDense));
  Uses uses = analyze(g);
  int mm = -1;
  for (size_t i = 0; i < uses.topo.size(); ++i)
    if (uses.topo[i]->op() == OpKind::MatMul) mm = static_cast<int>(i);
  ASSERT_GE(mm, 0);
  std::string text = print_grouping(g, uses, group(uses, {true, {mm}}));
  EXPECT_EQ(lines(text), (std::vector<std::string>{
                             "g0 loop [8,7] reduce{1}: %3{0,-1} %4{0,1} %5{0,1} %6{0,-1} %7{0,1}",
                             "g1 loop [8,7]: %1{0,1} %2{0,1}", "g2 matmul [8,7]: %0{0,1}"}))
      << text;
}

// A reduction joins the elementwise kernel that consumes its result: the
// group's domain grows from [4] to the reduction's operand [4,6].
TEST(FusionStages, GroupingGrowsTheDomainWhenAReductionJoinsItsEpilogue) {
  Grouped g = group_text(
      "graph t {\n"
      "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[4,6]} : f32[4,6]\n"
      "  %0 = exp(%x) : f32[4,6]\n"
      "  %1 = reduce_sum(%0) {axes=[1], keepdims=false} : f32[4]\n"
      "  %2 = sqrt(%1) : f32[4]\n"
      "  return %2\n}\n");
  EXPECT_EQ(lines(g.groups),
            (std::vector<std::string>{"g0 loop [4,6] reduce{1}: %0{0,1} %1{0} %2{0}"}))
      << g.graph << g.groups;
}

// A value read by two kernels is stored by its own: neither consumer takes
// it. The add after the matmul is the matmul's epilogue, not the reduction's.
TEST(FusionStages, GroupingStoresAValueTwoKernelsRead) {
  Grouped g = group_text(
      "graph t {\n"
      "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[4,4]} : f32[4,4]\n"
      "  %0 = exp(%x) : f32[4,4]\n"
      "  %1 = matmul(%0, %x) {transpose_a=false, transpose_b=false} : f32[4,4]\n"
      "  %2 = add(%0, %1) : f32[4,4]\n"
      "  %3 = reduce_sum(%2) {axes=[0], keepdims=false} : f32[4]\n"
      "  return %3\n}\n");
  EXPECT_EQ(lines(g.groups), (std::vector<std::string>{"g0 loop [4,4] reduce{0}: %3{1}",
                                                       "g1 matmul [4,4]: %1{0,1} %2{0,1}",
                                                       "g2 loop [4,4]: %0{0,1}"}))
      << g.graph << g.groups;
}

// GELU's forward, 0.5 * x * erfc(-x / sqrt(2)), whose scaled values a backward
// kernel reads too: -x / sqrt(2) (%4) is recomputed from x (stored by the
// matmul) in the erfc kernel and the backward one, so it is no kernel of its
// own; 0.5 * x (%2), which a matmul reads from memory, is stored by its own
// kernel and read by the others.
TEST(FusionStages, GroupingRecomputesScaledValuesInEveryConsumer) {
  const char* gelu =
      "graph t {\n"
      "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[4,8]} : f32[4,8]\n"
      "  %w = parameter() {dtype=f32, index=1, name=\"w\", shape=[8,8]} : f32[8,8]\n"
      "  %0 = matmul(%x, %w) {transpose_a=false, transpose_b=false} : f32[4,8]\n"
      "  %1 = fill() {dtype=f32, shape=[], value=0.5} : f32[]\n"
      "  %2 = mul(%0, %1) : f32[4,8]\n"
      "  %3 = fill() {dtype=f32, shape=[], value=-0.7071} : f32[]\n"
      "  %4 = mul(%0, %3) : f32[4,8]\n"
      "  %5 = erfc(%4) : f32[4,8]\n"
      "  %6 = mul(%2, %5) : f32[4,8]\n"
      "  %7 = matmul(%6, %w) {transpose_a=false, transpose_b=false} : f32[4,8]\n"
      "  %8 = mul(%4, %4) : f32[4,8]\n"
      "  %9 = exp(%8) : f32[4,8]\n"
      "  %10 = mul(%2, %9) : f32[4,8]\n"
      "  %11 = add(%10, %5) : f32[4,8]\n"
      "  %12 = matmul(%2, %w) {transpose_a=false, transpose_b=false} : f32[4,8]\n"
      "  return %7, %11, %12\n}\n";
  Grouped g = group_text(gelu);
  EXPECT_EQ(lines(g.groups), (std::vector<std::string>{
                                 "g0 matmul [4,8]: %12{0,1}",
                                 "g1 loop [4,8]: %3{} %4{0,1} %8{0,1} %9{0,1} %10{0,1} %11{0,1}",
                                 "g2 matmul [4,8]: %7{0,1}", "g3 loop [4,8]: %6{0,1}",
                                 "g4 loop [4,8]: %3{} %4{0,1} %5{0,1}",
                                 "g5 loop [4,8]: %1{} %2{0,1}", "g6 matmul [4,8]: %0{0,1}"}))
      << g.graph << g.groups;
}

// ---- the launch order

LaunchDeps launch(int pos, std::vector<int> reads = {}, bool collective = false) {
  LaunchDeps l;
  l.program_pos = pos;
  l.reads = std::move(reads);
  l.collective = collective;
  return l;
}

TEST(FusionStages, OrderFollowsDataThenProgramOrder) {
  auto o = launch_order({launch(2), launch(0), launch(1, {0})});
  ASSERT_TRUE(o);
  EXPECT_EQ(*o, (std::vector<int>{1, 0, 2}));
}

// The reader of a variable's old value runs before the kernel that
// overwrites it, even where program order says otherwise.
TEST(FusionStages, OrderRunsAVariablesReadersBeforeItsWriter) {
  LaunchDeps writer = launch(0), reader = launch(1);
  writer.var_writes = {"w"};
  reader.var_reads = {"w"};
  auto o = launch_order({writer, reader});
  ASSERT_TRUE(o);
  EXPECT_EQ(*o, (std::vector<int>{1, 0}));
}

TEST(FusionStages, OrderRefusesACycle) {
  EXPECT_FALSE(launch_order({launch(0, {1}), launch(1, {0})}));
  // a reads w's old value and b overwrites w: a first, as b also needs a.
  LaunchDeps a = launch(0), b = launch(1, {0});
  a.var_reads = {"w"};
  b.var_writes = {"w"};
  EXPECT_TRUE(launch_order({a, b}));
  // a now needs b's result too: no order (fusion then defers the assign).
  a.reads = {1};
  b.reads = {};
  EXPECT_FALSE(launch_order({a, b}));
}

// Gradients that feed collectives first, the collectives together, the
// kernels that need none of them, and the updates last, each after its own
// collective in the order the collectives ran.
TEST(FusionStages, OrderOverlapsCollectivesWithTheKernelsBetween) {
  std::vector<LaunchDeps> l = {
      launch(0),      launch(1),     launch(2), launch(3, {0}, true), launch(4, {1}, true),
      launch(6, {3}), launch(5, {4})};
  auto o = launch_order(l);
  ASSERT_TRUE(o);
  EXPECT_EQ(*o, (std::vector<int>{0, 1, 3, 4, 2, 5, 6}));
}
