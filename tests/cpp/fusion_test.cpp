// Fusion decisions checked on IR text: which printed values land in which kernel.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "ir/printer.h"
#include "jit/fusion.h"
#include "jit/pipeline.h"

using namespace flowjit;
using namespace flowjit::ir;

namespace {

struct Plan {
  std::vector<std::string> lines;  // "k2_matmul_add_relu: %0 %1 %2 -> %2"
  std::string text;
};

Plan fuse_text(const std::string& ir_text) {
  Graph g = parse_graph(ir_text);
  jit::PassLog log;
  Graph opt = jit::optimize(g, log);
  jit::FusedProgram p = jit::fuse(opt, "t");
  Plan out;
  out.text = p.description;
  std::istringstream is(p.description);
  std::string line;
  while (std::getline(is, line)) out.lines.push_back(line.substr(line.find(':') + 1));
  return out;
}

const char* kMlp =
    "graph t {\n"
    "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[8,5]} : f32[8,5]\n"
    "  %w = parameter() {dtype=f32, index=1, name=\"w\", shape=[7,5]} : f32[7,5]\n"
    "  %b = parameter() {dtype=f32, index=2, name=\"b\", shape=[7]} : f32[7]\n"
    "  %0 = matmul(%x, %w) {transpose_a=false, transpose_b=true} : f32[8,7]\n"
    "  %1 = add(%0, %b) : f32[8,7]\n"
    "  %2 = relu(%1) : f32[8,7]\n"
    "  %3 = softmax(%2) {axis=1} : f32[8,7]\n"
    "  return %3\n"
    "}\n";

}  // namespace

TEST(Fusion, MatmulAbsorbsBiasAndActivation_SoftmaxIsOneKernel) {
  Plan p = fuse_text(kMlp);
  ASSERT_EQ(p.lines.size(), 2u) << p.text;
  // After decompose: %0 matmul, %1 add, %2 relu, %3 max, %4 sub, %5 exp, %6 sum, %7 div.
  EXPECT_EQ(p.lines[0], " %0 %1 %2 -> %2") << p.text;
  EXPECT_EQ(p.lines[1], " %3 %4 %5 %6 %7 -> out0") << p.text;
}

TEST(Fusion, ElementwiseChainIsOneKernel) {
  Plan p = fuse_text(
      "graph t {\n"
      "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[1000]} : f32[1000]\n"
      "  %0 = exp(%x) : f32[1000]\n"
      "  %1 = mul(%0, %x) : f32[1000]\n"
      "  %2 = tanh(%1) : f32[1000]\n"
      "  %3 = sub(%2, %x) : f32[1000]\n"
      "  return %3\n}\n");
  ASSERT_EQ(p.lines.size(), 1u) << p.text;
  EXPECT_EQ(p.lines[0], " %0 %1 %2 %3 -> out0");
}

TEST(Fusion, CrossEntropyForwardIsOneKernel) {
  Plan p = fuse_text(
      "graph t {\n"
      "  %y = parameter() {dtype=i32, index=0, name=\"y\", shape=[6]} : i32[6]\n"
      "  %z = parameter() {dtype=f32, index=1, name=\"z\", shape=[6,10]} : f32[6,10]\n"
      "  %0 = sparse_softmax_cross_entropy(%y, %z) : f32[6]\n"
      "  return %0\n}\n");
  ASSERT_EQ(p.lines.size(), 1u) << p.text;
}

TEST(Fusion, SharedIntermediateIsStoredOnce) {
  // e is used by two reductions over different axes: it is materialized.
  Plan p = fuse_text(
      "graph t {\n"
      "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[4,6]} : f32[4,6]\n"
      "  %0 = exp(%x) : f32[4,6]\n"
      "  %1 = reduce_sum(%0) {axes=[0], keepdims=false} : f32[6]\n"
      "  %2 = reduce_sum(%0) {axes=[1], keepdims=false} : f32[4]\n"
      "  return %1, %2\n}\n");
  ASSERT_EQ(p.lines.size(), 3u) << p.text;
  EXPECT_EQ(p.lines[0], " %0 -> %0") << p.text;
}

TEST(Fusion, AssignIsStoredInPlaceByTheUpdateKernel) {
  Plan p = fuse_text(
      "graph t {\n"
      "  %g = parameter() {dtype=f32, index=0, name=\"g\", shape=[3,4]} : f32[3,4]\n"
      "  %0 = variable() {dtype=f32, name=\"w\", shape=[3,4]} : f32[3,4]\n"
      "  %1 = fill() {dtype=f32, shape=[], value=0.5} : f32[]\n"
      "  %2 = mul(%1, %g) : f32[3,4]\n"
      "  %3 = sub(%0, %2) : f32[3,4]\n"
      "  %4 = assign(%0, %3) : f32[3,4]\n"
      "  return\n  effects %4\n}\n");
  ASSERT_EQ(p.lines.size(), 1u) << p.text;
  EXPECT_EQ(p.lines[0], " %2 %3 -> var:w") << p.text;
}
