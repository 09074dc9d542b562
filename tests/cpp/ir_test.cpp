// IR construction, inference errors, verifier and printer/parser round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "ir/error.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "tests/cpp/test_util.h"

using namespace flowjit;
using namespace flowjit::ir;

namespace {

using flowjit::testing::param;

NodeRef variable(const std::string& name, Shape s, DType dt = DType::Float32) {
  return make_node(OpKind::Variable, {}, Attrs{{"name", name}, {"shape", s}, {"dtype", dt}});
}

Graph mlp_graph() {
  Graph g;
  g.name = "predict_job";
  auto x = param("x", 0, {4, 3});
  auto w = variable("w", {2, 3});
  auto b = variable("b", {2});
  auto y = matmul(x, w, false, true);
  auto z = unary(OpKind::Relu, binary(OpKind::Add, y, b));
  auto s = make_node(OpKind::Softmax, {z}, Attrs{{"axis", int64_t{-1}}});
  g.params = {x};
  g.outputs = {s, reduce(OpKind::ReduceSum, z, {0, -1}, false)};
  return g;
}

}  // namespace

TEST(IR, OpTableIsConsistent) {
  for (int i = 0; i < kNumOps; ++i) {
    auto k = static_cast<OpKind>(i);
    auto back = op_from_name(op_name(k));
    ASSERT_TRUE(back.has_value()) << op_name(k);
    EXPECT_EQ(*back, k);
  }
  EXPECT_TRUE(is_elementwise(OpKind::Add));
  EXPECT_TRUE(has_trait(OpKind::Add, kCommutative));
  EXPECT_FALSE(has_trait(OpKind::Sub, kCommutative));
  EXPECT_TRUE(is_reduce(OpKind::ReduceMax));
  EXPECT_EQ(op_grad_kind(OpKind::Assign), GradKind::None);
}

TEST(IR, BroadcastInference) {
  auto a = param("a", 0, {100, 512});
  auto b = variable("b", {512});
  EXPECT_EQ(binary(OpKind::Add, a, b)->shape(), (Shape{100, 512}));
  auto c = param("c", 1, {7, 1, 5});
  auto d = param("d", 2, {3, 1});
  EXPECT_EQ(binary(OpKind::Mul, c, d)->shape(), (Shape{7, 3, 5}));
  EXPECT_EQ(binary(OpKind::Less, c, d)->dtype(), DType::Bool);
}

TEST(IR, InferenceErrorsNameTheOp) {
  auto a = param("a", 0, {100, 784});
  auto w = variable("w", {512, 10});
  try {
    matmul(a, w, false, false);
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "matmul: inner dimensions differ: a is f32[100,784] with k=784 but b is "
              "f32[512,10] with k=512");
  }
  auto i = param("i", 1, {100}, DType::Int32);
  EXPECT_THROW(binary(OpKind::Add, a, i), UserError);
  EXPECT_THROW(reshape(a, {3, -1}), UserError);
  EXPECT_EQ(make_node(OpKind::Reshape, {a}, Attrs{{"shape", IntList{-1, 28}}})->shape(),
            (Shape{2800, 28}));
}

TEST(IR, ReduceCanonicalizesAxes) {
  auto a = param("a", 0, {2, 3, 4});
  auto r = reduce(OpKind::ReduceSum, a, {-1, 0}, true);
  EXPECT_EQ(r->attrs().get_ints("axes"), (IntList{0, 2}));
  EXPECT_EQ(r->shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(sum_to_shape(param("x", 1, {5, 2, 3, 4}), {3, 1})->shape(), (Shape{3, 1}));
}

TEST(IR, PrinterRoundTrip) {
  Graph g = mlp_graph();
  EXPECT_EQ(verify_graph(g), "");
  std::string text = print_graph(g);
  Graph back = parse_graph(text);
  EXPECT_EQ(print_graph(back), text);
  EXPECT_EQ(verify_graph(back), "");
  EXPECT_NE(text.find("%x = parameter()"), std::string::npos) << text;
}

TEST(IR, PrinterRoundTripFloatsStringsAndLocations) {
  Graph g;
  g.name = "j";
  auto f = fill(0.1, {2}, DType::Float32, SourceLoc{"my \"file\".py", 12});
  auto n = make_node(OpKind::Fill, {},
                     Attrs{{"value", -HUGE_VAL}, {"shape", Shape{}}, {"dtype", DType::Float64}});
  g.outputs = {f, n, fill(1e-30, {}, DType::Float64)};
  PrintOptions po;
  po.locations = true;
  std::string text = print_graph(g, po);
  Graph back = parse_graph(text);
  EXPECT_EQ(print_graph(back, po), text);
  EXPECT_EQ(back.outputs[0]->loc().file, "my \"file\".py");
  EXPECT_EQ(back.outputs[2]->attrs().get_float("value"), 1e-30);
}

TEST(IR, ParserReportsPosition) {
  try {
    parse_graph("graph g {\n  %0 = bogus() : f32[1]\n  return %0\n}\n");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("unknown op 'bogus'"), std::string::npos);
  }
  EXPECT_THROW(
      parse_graph(
          "graph g {\n  %0 = fill() {dtype=f32, shape=[2], value=1.0} : f32[3]\n  return %0\n}\n"),
      UserError);
}

TEST(IR, VerifierCatchesBadGraphs) {
  Graph g = mlp_graph();
  g.params.clear();  // parameter used but not listed
  EXPECT_NE(verify_graph(g).find("parameter not listed"), std::string::npos);
  Graph h = mlp_graph();
  EXPECT_NE(verify_graph(h, VerifyOptions{false}).find("composite op left"), std::string::npos);
}

TEST(IR, AttributesFollowTheirSchema) {
  auto x = param("x", 0, {2, 3});
  auto message = [&](OpKind op, Attrs a) {
    try {
      make_node(op, {x}, a);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // A misspelled key no longer falls back to a default.
  EXPECT_EQ(message(OpKind::ReduceSum, Attrs{{"axes", IntList{0}}, {"keepdim", true}}),
            "reduce_sum: unknown attribute 'keepdim' (reduce_sum takes axes, keepdims)");
  EXPECT_EQ(message(OpKind::Reshape, Attrs{{"shape", int64_t{6}}}),
            "reshape: attribute 'shape' must be a list of ints");
  EXPECT_EQ(message(OpKind::Transpose, Attrs{}),
            "transpose: missing attribute 'perm' (a list of ints)");
  EXPECT_EQ(message(OpKind::Exp, Attrs{{"axis", int64_t{0}}}),
            "exp: unknown attribute 'axis' (exp takes no attributes)");
  // IR text goes through the same factory.
  EXPECT_THROW(
      parse_graph("graph g {\n"
                  "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[2]} : f32[2]\n"
                  "  %0 = neg(%x) {sign=1} : f32[2]\n"
                  "  return %0\n}\n"),
      UserError);
  // Every schema line names keys once per op.
  for (int i = 0; i < kNumOps; ++i) {
    std::set<std::string_view> keys;
    for (const AttrSpec* a : op_attrs(static_cast<OpKind>(i)))
      EXPECT_TRUE(keys.insert(a->key).second) << op_name(static_cast<OpKind>(i)) << " " << a->key;
  }
}

TEST(Types, SizesThatOverflowInt64AreNamedNotWrapped) {
  using flowjit::ir::DType;
  EXPECT_EQ(flowjit::ir::num_elements({int64_t{1} << 32, int64_t{1} << 32}), INT64_MAX);
  EXPECT_EQ(flowjit::ir::shape_size_problem(DType::Float32, {1000, 1000}), "");
  EXPECT_NE(flowjit::ir::shape_size_problem(DType::Float32, {int64_t{1} << 62}).find("bytes"),
            std::string::npos);
  EXPECT_NE(flowjit::ir::shape_size_problem(DType::Int8, {0, int64_t{1} << 62, int64_t{1} << 62})
                .find("element count"),
            std::string::npos);
}

TEST(Attrs, FloatsCompareByBitsSoNanFillsVerify) {
  using flowjit::ir::Attrs;
  Attrs a{{"value", std::nan("")}}, b{{"value", std::nan("")}};
  EXPECT_TRUE(a == b);
  EXPECT_FALSE((Attrs{{"value", 0.0}} == Attrs{{"value", -0.0}}));
  EXPECT_TRUE((Attrs{{"value", 1.5}} == Attrs{{"value", 1.5}}));
}
