// Placement per op (jit/stages): make_node stamps the open placement, and a
// graph placed on two device sets is cut into segments by placement and
// level, wired through outputs and parameters.
#include <gtest/gtest.h>

#include "ir/error.h"
#include "jit/stages.h"
#include "tests/cpp/test_util.h"

using namespace flowjit;
using namespace flowjit::ir;

namespace {

using flowjit::testing::param;

NodeRef variable(const std::string& name, const Shape& s) {
  return make_node(OpKind::Variable, {},
                   Attrs{{"name", name}, {"shape", s}, {"dtype", DType::Float32}});
}

jit::DistributeOptions two_devices() {
  jit::DistributeOptions o;
  o.stages = {{0}, {1}};
  return o;
}

}  // namespace

TEST(Stages, AnOpenPlacementIsStampedAndRestored) {
  EXPECT_EQ(current_placement(), -1);
  NodeRef x = param("x", 0, {2});
  {
    PlacementScope outer(1);
    NodeRef a = unary(OpKind::Neg, x, x->loc());  // the operand's location has no placement
    EXPECT_EQ(a->loc().placement, 1);
    {
      PlacementScope none(-1);  // -1 keeps the open one
      EXPECT_EQ(unary(OpKind::Neg, a)->loc().placement, 1);
    }
  }
  EXPECT_EQ(current_placement(), -1);
  EXPECT_EQ(unary(OpKind::Neg, x)->loc().placement, -1);
}

TEST(Stages, ForwardAndBackBecomeThreeSegments) {
  NodeRef x = param("x", 0, {4, 3});
  NodeRef w0, w1, h, y;
  {
    PlacementScope p(0);
    w0 = variable("w0", {3, 5});
    h = unary(OpKind::Relu, matmul(x, w0, false, false));
  }
  {
    PlacementScope p(1);
    w1 = variable("w1", {5, 2});
    y = matmul(h, w1, false, false);
  }
  NodeRef back;
  {
    PlacementScope p(0);  // uses y, made on placement 1: a third segment
    back = binary(OpKind::Add, w0, broadcast(reduce(OpKind::ReduceSum, y, {0, 1}, false), {3, 5}));
  }
  Graph g;
  g.params = {x};
  g.outputs = {y};
  g.effects = {make_node(OpKind::Assign, {w0, back})};
  jit::StagePartition sp = jit::partition_stages(g, two_devices());
  ASSERT_EQ(sp.segments.size(), 3u) << sp.description;
  EXPECT_EQ(sp.segments[0].stage, 0);
  EXPECT_EQ(sp.segments[1].stage, 1);
  EXPECT_EQ(sp.segments[2].stage, 0);
  EXPECT_LT(sp.segments[0].level, sp.segments[1].level);
  EXPECT_LT(sp.segments[1].level, sp.segments[2].level);
  // x goes straight to the first segment; the second takes h from it
  ASSERT_EQ(sp.segments[0].inputs.size(), 1u);
  EXPECT_EQ(sp.segments[0].inputs[0].segment, -1);
  bool from_first = false;
  for (auto& w : sp.segments[1].inputs) from_first |= w.segment == 0;
  EXPECT_TRUE(from_first);
  ASSERT_EQ(sp.outputs.size(), 1u);
  EXPECT_EQ(sp.outputs[0].segment, 1);
  // the update assigns w0 itself (a variable, not a parameter) after its read
  ASSERT_EQ(sp.segments[2].graph.effects.size(), 1u);
  EXPECT_EQ(sp.segments[2].graph.effects[0]->input(0)->op(), OpKind::Variable);
  EXPECT_EQ(sp.segments[2].after, std::vector<int>{0});
}

TEST(Stages, AReadAfterAnotherPlacementAssignedIsNotImplemented) {
  NodeRef x = param("x", 0, {3});
  NodeRef assign, late;
  {
    PlacementScope p(0);
    assign = make_node(OpKind::Assign, {variable("v", {3}), unary(OpKind::Neg, x)});
  }
  {
    PlacementScope p(1);
    NodeRef on1 = unary(OpKind::Neg, x);
    NodeRef on0;
    {
      PlacementScope q(0);
      on0 = unary(OpKind::Neg, on1);
    }
    late = binary(OpKind::Add, on0, variable("v", {3}));  // placement 1, after placement 0
  }
  Graph g;
  g.params = {x};
  g.outputs = {late};
  g.effects = {assign};
  try {
    jit::partition_stages(g, two_devices());
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotImplemented);
    EXPECT_NE(std::string(e.what()).find("variable 'v' is read by ops placed after"),
              std::string::npos)
        << e.what();
  }
}
