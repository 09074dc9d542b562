// Pass tests written as IR text in, IR text out (each output is also verified).
#include <gtest/gtest.h>

#include "ir/printer.h"
#include "ir/verifier.h"
#include "jit/passes/cse.h"
#include "jit/passes/dce.h"
#include "jit/passes/decompose.h"
#include "jit/passes/fold.h"
#include "jit/passes/layout.h"
#include "jit/passes/reshape_sink.h"
#include "jit/passes/simplify.h"
#include "jit/passes/transpose_fold.h"

using namespace flowjit;
using namespace flowjit::ir;

namespace {

std::string run(ir::Graph (*pass)(const ir::Graph&), const std::string& in) {
  Graph g = parse_graph(in);
  Graph out = pass(g);
  EXPECT_EQ(verify_graph(out, VerifyOptions{pass != jit::decompose}), "");
  return print_graph(out);
}

// Parameters x: f32[4,3], w: f32[3,2].
const char* kHeader =
    "graph g {\n"
    "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[4,3]} : f32[4,3]\n";

std::string graph(const std::string& body) { return std::string(kHeader) + body + "}\n"; }

}  // namespace

TEST(Passes, SimplifyRemovesIdentities) {
  std::string in = graph(
      "  %0 = fill() {dtype=f32, shape=[], value=-0.0} : f32[]\n"
      "  %1 = add(%x, %0) : f32[4,3]\n"
      "  %2 = fill() {dtype=f32, shape=[], value=1.0} : f32[]\n"
      "  %3 = mul(%2, %1) : f32[4,3]\n"
      "  %4 = neg(%3) : f32[4,3]\n"
      "  %5 = neg(%4) : f32[4,3]\n"
      "  %6 = reshape(%5) {shape=[12]} : f32[12]\n"
      "  %7 = reshape(%6) {shape=[2,6]} : f32[2,6]\n"
      "  return %7\n");
  EXPECT_EQ(run(jit::simplify, in),
            graph("  %0 = reshape(%x) {shape=[2,6]} : f32[2,6]\n  return %0\n"));
}

TEST(Passes, SimplifyKeepsSignedZeros) {
  // -0.0 + 0.0 is +0.0, so x + 0.0 is not x; x - 0.0 is.
  std::string in = graph(
      "  %0 = fill() {dtype=f32, shape=[], value=0.0} : f32[]\n"
      "  %1 = add(%x, %0) : f32[4,3]\n"
      "  %2 = sub(%1, %0) : f32[4,3]\n"
      "  return %2\n");
  EXPECT_EQ(run(jit::simplify, in), graph("  %0 = fill() {dtype=f32, shape=[], value=0.0} : f32[]\n"
                                          "  %1 = add(%x, %0) : f32[4,3]\n  return %1\n"));
}

TEST(Passes, SimplifyKeepsBroadcastingAdds) {
  // x + 0 where 0 broadcasts x to a larger shape must stay.
  std::string in = graph(
      "  %0 = fill() {dtype=f32, shape=[2,4,3], value=0.0} : f32[2,4,3]\n"
      "  %1 = add(%x, %0) : f32[2,4,3]\n"
      "  return %1\n");
  EXPECT_EQ(run(jit::simplify, in), in);
}

TEST(Passes, SimplifyDropsASliceOfWhatAPadPadded) {
  // The window at the low pads with x's shape is x; shifted by one, or
  // read with a step, it is not.
  std::string in = graph(
      "  %0 = pad(%x) {interior=[0,0], pad_value=0.0, pads_hi=[1,2], pads_lo=[0,1]} : f32[5,6]\n"
      "  %1 = slice(%0) {begin=[0,1], shape=[4,3], step=[1,1]} : f32[4,3]\n"
      "  %2 = slice(%0) {begin=[1,1], shape=[4,3], step=[1,1]} : f32[4,3]\n"
      "  %3 = slice(%0) {begin=[0,1], shape=[4,3], step=[1,2]} : f32[4,3]\n"
      "  return %1, %2, %3\n");
  EXPECT_EQ(run(jit::simplify, in),
            graph("  %0 = pad(%x) {interior=[0,0], pad_value=0.0, pads_hi=[1,2], pads_lo=[0,1]} : "
                  "f32[5,6]\n"
                  "  %1 = slice(%0) {begin=[1,1], shape=[4,3], step=[1,1]} : f32[4,3]\n"
                  "  %2 = slice(%0) {begin=[0,1], shape=[4,3], step=[1,2]} : f32[4,3]\n"
                  "  return %x, %1, %2\n"));
}

TEST(Passes, FoldComputesConstants) {
  std::string in = graph(
      "  %0 = fill() {dtype=f32, shape=[], value=2.0} : f32[]\n"
      "  %1 = fill() {dtype=f32, shape=[3], value=3.0} : f32[3]\n"
      "  %2 = mul(%0, %1) : f32[3]\n"
      "  %3 = reduce_sum(%2) {axes=[0], keepdims=false} : f32[]\n"
      "  %4 = add(%x, %3) : f32[4,3]\n"
      "  return %4\n");
  EXPECT_EQ(run(jit::fold, in), graph("  %0 = fill() {dtype=f32, shape=[], value=18.0} : f32[]\n"
                                      "  %1 = add(%x, %0) : f32[4,3]\n  return %1\n"));
}

TEST(Passes, FoldIntegerDivisionMatchesKernels) {
  std::string in =
      "graph g {\n"
      "  %0 = fill() {dtype=i32, shape=[], value=-7.0} : i32[]\n"
      "  %1 = fill() {dtype=i32, shape=[], value=2.0} : i32[]\n"
      "  %2 = div(%0, %1) : i32[]\n"
      "  %3 = fill() {dtype=i32, shape=[], value=0.0} : i32[]\n"
      "  %4 = div(%0, %3) : i32[]\n"
      "  return %2, %4\n}\n";
  EXPECT_EQ(run(jit::fold, in),
            "graph g {\n  %0 = fill() {dtype=i32, shape=[], value=-3.0} : i32[]\n"
            "  %1 = fill() {dtype=i32, shape=[], value=0.0} : i32[]\n  return %0, %1\n}\n");
}

TEST(Passes, CseMergesEqualNodesAndCommutedOperands) {
  std::string in = graph(
      "  %0 = exp(%x) : f32[4,3]\n"
      "  %1 = exp(%x) : f32[4,3]\n"
      "  %2 = add(%0, %x) : f32[4,3]\n"
      "  %3 = add(%x, %1) : f32[4,3]\n"
      "  %4 = sub(%2, %3) : f32[4,3]\n"
      "  return %4\n");
  EXPECT_EQ(run(jit::cse, in), graph("  %0 = exp(%x) : f32[4,3]\n"
                                     "  %1 = add(%0, %x) : f32[4,3]\n"
                                     "  %2 = sub(%1, %1) : f32[4,3]\n"
                                     "  return %2\n"));
}

TEST(Passes, TransposeFoldsIntoMatmulFlags) {
  std::string in = graph(
      "  %0 = transpose(%x) {perm=[1,0]} : f32[3,4]\n"
      "  %1 = matmul(%0, %x) {transpose_a=false, transpose_b=false} : f32[3,3]\n"
      "  return %1\n");
  EXPECT_EQ(run(jit::transpose_fold, in),
            graph("  %0 = matmul(%x, %x) {transpose_a=true, transpose_b=false} : f32[3,3]\n"
                  "  return %0\n"));
}

TEST(Passes, LayoutProducesTransposedMatmulDirectly) {
  // (x w)^T = w^T x^T: produced directly, no transpose left.
  std::string in = graph(
      "  %w = parameter() {dtype=f32, index=1, name=\"w\", shape=[3,2]} : f32[3,2]\n"
      "  %0 = matmul(%x, %w) {transpose_a=false, transpose_b=false} : f32[4,2]\n"
      "  %1 = transpose(%0) {perm=[1,0]} : f32[2,4]\n"
      "  return %1\n");
  EXPECT_EQ(run(jit::layout, in),
            graph("  %w = parameter() {dtype=f32, index=1, name=\"w\", shape=[3,2]} : f32[3,2]\n"
                  "  %0 = matmul(%w, %x) {transpose_a=true, transpose_b=true} : f32[2,4]\n"
                  "  return %0\n"));
}

TEST(Passes, DecomposeSoftmaxIsStable) {
  std::string in = graph(
      "  %0 = softmax(%x) {axis=1} : f32[4,3]\n"
      "  return %0\n");
  EXPECT_EQ(run(jit::decompose, in),
            graph("  %0 = reduce_max(%x) {axes=[1], keepdims=true} : f32[4,1]\n"
                  "  %1 = sub(%x, %0) : f32[4,3]\n"
                  "  %2 = exp(%1) : f32[4,3]\n"
                  "  %3 = reduce_sum(%2) {axes=[1], keepdims=true} : f32[4,1]\n"
                  "  %4 = div(%2, %3) : f32[4,3]\n"
                  "  return %4\n"));
}

TEST(Passes, DecomposeCrossEntropyReadsLabelsThroughIota) {
  std::string in =
      "graph g {\n"
      "  %y = parameter() {dtype=i32, index=0, name=\"y\", shape=[4]} : i32[4]\n"
      "  %z = parameter() {dtype=f32, index=1, name=\"z\", shape=[4,5]} : f32[4,5]\n"
      "  %0 = sparse_softmax_cross_entropy(%y, %z) : f32[4]\n"
      "  return %0\n}\n";
  std::string out = run(jit::decompose, in);
  EXPECT_NE(out.find("iota() {axis=1, dtype=i32, shape=[4,5]}"), std::string::npos) << out;
  EXPECT_NE(out.find("equal("), std::string::npos) << out;
  EXPECT_EQ(out.find("sparse_softmax"), std::string::npos) << out;
}

TEST(Passes, DceDropsSelfAssign) {
  std::string in =
      "graph g {\n"
      "  %0 = variable() {dtype=f32, name=\"v\", shape=[2]} : f32[2]\n"
      "  %1 = assign(%0, %0) : f32[2]\n"
      "  return\n  effects %1\n}\n";
  EXPECT_EQ(run(jit::dce, in), "graph g {\n  return\n}\n");
}

TEST(Passes, UnchangedPassReturnsSameGraph) {
  Graph g = parse_graph(graph("  %0 = exp(%x) : f32[4,3]\n  return %0\n"));
  EXPECT_TRUE(jit::simplify(g).same_as(g));
  EXPECT_TRUE(jit::fold(g).same_as(g));
  EXPECT_TRUE(jit::transpose_fold(g).same_as(g));
  EXPECT_TRUE(jit::decompose(g).same_as(g));
}

TEST(Passes, ReshapeSinkMovesConvEpiloguesIntoTheFlatShape) {
  // conv's flat result [1,1,2,6] seen as [1,2,2,3]: the bias add (broadcast
  // over the spatial dims) and the relu move above the reshape; an operand
  // that varies inside a group it only partly covers keeps the reshape.
  std::string in =
      "graph g {\n"
      "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[1,1,3,5]} : f32[1,1,3,5]\n"
      "  %w = parameter() {dtype=f32, index=1, name=\"w\", shape=[2,1,2,3]} : f32[2,1,2,3]\n"
      "  %b = parameter() {dtype=f32, index=2, name=\"b\", shape=[1,2,1,1]} : f32[1,2,1,1]\n"
      "  %r = parameter() {dtype=f32, index=3, name=\"r\", shape=[3]} : f32[3]\n"
      "  %0 = conv(%x, %w) {dilations=[1,1], groups=1, pads_hi=[0,0], pads_lo=[0,0], "
      "strides=[1,1]} : f32[1,1,2,6]\n"
      "  %1 = reshape(%0) {shape=[1,2,2,3]} : f32[1,2,2,3]\n"
      "  %2 = add(%1, %b) : f32[1,2,2,3]\n"
      "  %3 = relu(%2) : f32[1,2,2,3]\n"
      "  %4 = mul(%3, %r) : f32[1,2,2,3]\n"
      "  return %4\n"
      "}\n";
  EXPECT_EQ(run(jit::reshape_sink, in),
            "graph g {\n"
            "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[1,1,3,5]} : f32[1,1,3,5]\n"
            "  %w = parameter() {dtype=f32, index=1, name=\"w\", shape=[2,1,2,3]} : f32[2,1,2,3]\n"
            "  %b = parameter() {dtype=f32, index=2, name=\"b\", shape=[1,2,1,1]} : f32[1,2,1,1]\n"
            "  %r = parameter() {dtype=f32, index=3, name=\"r\", shape=[3]} : f32[3]\n"
            "  %0 = conv(%x, %w) {dilations=[1,1], groups=1, pads_hi=[0,0], pads_lo=[0,0], "
            "strides=[1,1]} : f32[1,1,2,6]\n"
            "  %1 = reshape(%b) {shape=[1,1,2,1]} : f32[1,1,2,1]\n"
            "  %2 = add(%0, %1) : f32[1,1,2,6]\n"
            "  %3 = relu(%2) : f32[1,1,2,6]\n"
            "  %4 = reshape(%3) {shape=[1,2,2,3]} : f32[1,2,2,3]\n"
            "  %5 = mul(%4, %r) : f32[1,2,2,3]\n"
            "  return %5\n"
            "}\n");
}
