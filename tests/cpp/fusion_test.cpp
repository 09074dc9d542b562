// Fusion decisions checked on IR text: which printed values land in which kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "codegen/family.h"
#include "ir/printer.h"
#include "jit/autodiff.h"
#include "jit/compile.h"
#include "jit/fusion.h"
#include "jit/pipeline.h"
#include "runtime/executable.h"

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

// A matmul epilogue that computes a transcendental of a full-size operand it
// loads (GELU's gradient) is a loop kernel of its own (jit/fusion/grouping,
// heavy_epilogue); one that only loads a bias, or computes a transcendental
// of the sums alone, stays in the matmul.
TEST(Fusion, AHeavyEpilogueIsALoopKernelOfItsOwn) {
  auto text = [](const std::string& epilogue) {
    return "graph t {\n"
           "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[8,5]} : f32[8,5]\n"
           "  %w = parameter() {dtype=f32, index=1, name=\"w\", shape=[5,7]} : f32[5,7]\n"
           "  %b = parameter() {dtype=f32, index=2, name=\"b\", shape=[7]} : f32[7]\n"
           "  %g = parameter() {dtype=f32, index=3, name=\"g\", shape=[8,7]} : f32[8,7]\n"
           "  %0 = matmul(%x, %w) {transpose_a=false, transpose_b=false} : f32[8,7]\n" +
           epilogue + "}\n";
  };
  Plan heavy =
      fuse_text(text("  %1 = mul(%g, %g) : f32[8,7]\n  %2 = exp(%1) : f32[8,7]\n"
                     "  %3 = mul(%0, %2) : f32[8,7]\n  return %3\n"));
  ASSERT_EQ(heavy.lines.size(), 2u) << heavy.text;
  EXPECT_EQ(heavy.lines[0], " %0 -> %0") << heavy.text;
  Plan bias =
      fuse_text(text("  %1 = add(%0, %b) : f32[8,7]\n  %2 = exp(%1) : f32[8,7]\n  return %2\n"));
  EXPECT_EQ(bias.lines.size(), 1u) << bias.text;
  Plan residual = fuse_text(text("  %1 = add(%0, %g) : f32[8,7]\n  return %1\n"));
  EXPECT_EQ(residual.lines.size(), 1u) << residual.text;
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

// A kernel-family op is a kernel of its own over stored operands: the
// producer of its data is not fused into it, its consumer reads its result.
TEST(Fusion, SegmentSumIsAFamilyKernelBetweenLoopKernels) {
  Graph g = parse_graph(
      "graph t {\n"
      "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[6,4]} : f32[6,4]\n"
      "  %i = parameter() {dtype=i32, index=1, name=\"i\", shape=[6]} : i32[6]\n"
      "  %0 = exp(%x) : f32[6,4]\n"
      "  %1 = segment_sum(%0, %i) {axis=0, num_segments=3} : f32[3,4]\n"
      "  %2 = mul(%1, %1) : f32[3,4]\n"
      "  return %2\n}\n");
  jit::PassLog log;
  jit::FusedProgram p = jit::fuse(jit::optimize(g, log), "t");
  ASSERT_EQ(p.kernels.size(), 3u) << p.description;
  const codegen::Kernel& k = p.kernels[1];
  EXPECT_EQ(k.kind, codegen::Kernel::Kind::Family) << p.description;
  // the record's params, then the args of data, ids and the result
  EXPECT_EQ(k.params, (std::vector<int64_t>{1, 1, 6, 3, 4, 0, 1, 2}));
  ASSERT_EQ(k.args.size(), 3u);
  EXPECT_EQ(k.args[1].dtype, DType::Int32);
  EXPECT_TRUE(k.args[2].written);
  EXPECT_NE(codegen::describe_kernel(k).find("family segment_sum params=[1,1,6,3,4,0,1,2]"),
            std::string::npos)
      << codegen::describe_kernel(k);
  // exp's result and the family's result are buffers the neighbours share
  EXPECT_EQ(p.plan.launches[0].args.back(), p.plan.launches[1].args[0]);
  EXPECT_EQ(p.plan.launches[1].args[2], p.plan.launches[2].args[0]);
}

// One buffer read as two operands of a family op is one arg; the params say
// which arg each operand is (codegen/family.h), and the kernel computes it.
TEST(Fusion, AFamilyOperandReadTwiceIsOneArg) {
  Graph g = parse_graph(
      "graph t {\n"
      "  %x = parameter() {dtype=i32, index=0, name=\"x\", shape=[5]} : i32[5]\n"
      "  %0 = segment_sum(%x, %x) {axis=0, num_segments=4} : i32[4]\n"
      "  return %0\n}\n");
  jit::PassLog log;
  jit::FusedProgram p = jit::fuse(jit::optimize(g, log), "t");
  auto fam = std::find_if(p.kernels.begin(), p.kernels.end(), [](const codegen::Kernel& k) {
    return k.kind == codegen::Kernel::Kind::Family;
  });
  ASSERT_NE(fam, p.kernels.end()) << p.description;
  const codegen::Kernel& k = *fam;
  ASSERT_EQ(k.args.size(), 2u) << codegen::describe_kernel(k);
  EXPECT_EQ(codegen::family_arg(k, 0), 0);
  EXPECT_EQ(codegen::family_arg(k, 1), 0);
  EXPECT_EQ(codegen::family_arg(k, 2), 1);
  runtime::VariableStore store;
  jit::JobDescription job;
  job.name = "t";
  job.graph = g;
  jit::CompiledJob cj = jit::compile_job(job, jit::CompileSettings{}, store);
  std::vector<int32_t> x = {3, 1, 3, 7, 0}, out(4, -1);
  const void* ins[] = {x.data()};
  void* outs[] = {out.data()};
  cj.program->run(ins, outs);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 0, 6}));  // 7 is out of range: dropped
}

// A view two family kernels read is copied once, not once per kernel (the
// attention gradients share their transposed operands).
TEST(Fusion, AViewTwoFamilyKernelsReadIsCopiedOnce) {
  Graph g = parse_graph(
      "graph t {\n"
      "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[5,3]} : f32[5,3]\n"
      "  %i = parameter() {dtype=i32, index=1, name=\"i\", shape=[3]} : i32[3]\n"
      "  %0 = transpose(%x) {perm=[1,0]} : f32[3,5]\n"
      "  %1 = segment_sum(%0, %i) {axis=0, num_segments=2} : f32[2,5]\n"
      "  %2 = segment_sum(%0, %i) {axis=0, num_segments=4} : f32[4,5]\n"
      "  return %1, %2\n}\n");
  jit::PassLog log;
  jit::FusedProgram p = jit::fuse(jit::optimize(g, log), "t");
  int families = 0, copies = 0;
  for (const codegen::Kernel& k : p.kernels)
    (k.kind == codegen::Kernel::Kind::Family ? families : copies) += 1;
  EXPECT_EQ(families, 2) << p.description;
  // the transpose once, and each result out of its family's buffer
  EXPECT_EQ(copies, 3) << p.description;
}

// The data gradient of a segment sum has the data's shape, with no segments too.
TEST(Fusion, SegmentSumGradientHasTheDataShapeEvenWithoutSegments) {
  for (int64_t segments : {0, 3}) {
    NodeRef x = make_node(OpKind::Parameter, {},
                          Attrs{{"dtype", DType::Float32},
                                {"index", int64_t{0}},
                                {"name", "x"},
                                {"shape", Shape{6, 4}}});
    NodeRef i = make_node(
        OpKind::Parameter, {},
        Attrs{{"dtype", DType::Int32}, {"index", int64_t{1}}, {"name", "i"}, {"shape", Shape{6}}});
    NodeRef y = make_node(OpKind::SegmentSum, {x, i},
                          Attrs{{"axis", int64_t{0}}, {"num_segments", segments}});
    auto grads = jit::gradients(y, fill(1.0, y->shape(), y->dtype()), {x});
    ASSERT_EQ(grads.size(), 1u);
    EXPECT_EQ(grads[0]->shape(), (Shape{6, 4})) << "segments " << segments;
  }
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

// [harden] A job on several devices: each device checks its own part of the
// labels, so before the first kernel that writes a variable after a check,
// the devices all-gather their status buffers, and that kernel's guard reads
// every device's status. One device needs neither.
namespace {

jit::FusedProgram fuse_devices(const std::string& ir_text, int devices, bool numerics = false) {
  Graph g = parse_graph(ir_text);
  jit::PassLog log;
  jit::FusionOptions o;
  o.devices = devices;
  o.check_numerics = numerics;
  return jit::fuse(jit::optimize(g, log), "t", o);
}

const char* kCheckThenUpdate =
    "graph t {\n"
    "  %y = parameter() {dtype=i32, index=0, name=\"y\", shape=[4]} : i32[4]\n"
    "  %g = parameter() {dtype=f32, index=1, name=\"g\", shape=[3]} : f32[3]\n"
    "  %0 = check_index(%y) {limit=5, what=\"t: labels\"} : i32[4]\n"
    "  %1 = cast(%0) {dtype=f32} : f32[4]\n"
    "  %2 = reduce_sum(%1) {axes=[0], keepdims=false} : f32[]\n"
    "  %w = variable() {dtype=f32, name=\"w\", shape=[3]} : f32[3]\n"
    "  %3 = sub(%w, %g) : f32[3]\n"
    "  %4 = assign(%w, %3) : f32[3]\n"
    "  return %2\n  effects %4\n}\n";

bool writes_variable(const jit::FusedProgram& p, size_t li) {
  const codegen::Kernel& k = p.kernels[li];
  for (size_t a = 0; a < k.args.size(); ++a)
    if (k.args[a].written && p.plan.launches[li].args[a].kind == flowjit::abi::BufferKind::Variable)
      return true;
  return false;
}

}  // namespace

TEST(Fusion, SeveralDevicesGatherTheirStatusBeforeTheFirstUpdateAfterACheck) {
  jit::FusedProgram one = fuse_devices(kCheckThenUpdate, 1);
  for (const auto& l : one.plan.launches) EXPECT_FALSE(l.collective) << one.description;
  jit::FusedProgram two = fuse_devices(kCheckThenUpdate, 2);
  const auto& ls = two.plan.launches;
  ASSERT_GE(two.plan.status_offset, 0);
  int gather = -1, checker = -1, writer = -1;
  for (size_t li = 0; li < ls.size(); ++li) {
    if (runtime::is_status_gather(two.plan, ls[li]) && gather < 0) gather = static_cast<int>(li);
    if (two.kernels[li].status_arg >= 0) checker = static_cast<int>(li);
    if (writes_variable(two, li)) writer = static_cast<int>(li);
  }
  ASSERT_GE(gather, 0) << two.description;
  ASSERT_GE(writer, 0) << two.description;
  EXPECT_EQ(checker + 1, gather) << "right after the check: " << two.description;
  EXPECT_LT(gather, writer) << two.description;
  const flowjit::abi::CollectiveStep& c = *ls[gather].collective;
  EXPECT_EQ(c.dtype, DType::Int64);
  EXPECT_EQ(c.parts, 2);
  EXPECT_EQ(c.inner, 4);
  // On the communication thread until the writer (synchronous if next).
  EXPECT_EQ(c.complete_before, gather + 1 == writer ? -1 : writer) << two.description;
  const codegen::Kernel& w = two.kernels[writer];
  ASSERT_GE(w.guard_arg, 0);
  EXPECT_EQ(w.guard_words, 2);
  EXPECT_EQ(ls[writer].args[w.guard_arg], ls[gather].args[1]) << "the guard reads every device's";
  EXPECT_EQ(w.args[w.guard_arg].elements, 8);
}

TEST(Fusion, SeveralDevicesEndWithAStatusGatherWhenTheLastCheckIsAfterEveryUpdate) {
  jit::FusedProgram p = fuse_devices(
      "graph t {\n"
      "  %y = parameter() {dtype=i32, index=0, name=\"y\", shape=[4]} : i32[4]\n"
      "  %0 = check_index(%y) {limit=5, what=\"t: labels\"} : i32[4]\n"
      "  %1 = cast(%0) {dtype=f32} : f32[4]\n"
      "  return %1\n}\n",
      2);
  ASSERT_FALSE(p.plan.launches.empty());
  EXPECT_TRUE(runtime::is_status_gather(p.plan, p.plan.launches.back())) << p.description;
}

// [harden] A kernel that checks what it stores into a variable (here an
// index it reads) must not write the variable itself: it would have written
// before its own check fails. It stores a temporary, and a guarded copy
// kernel updates the variable.
TEST(Fusion, AKernelThatChecksNeverWritesAVariableItself) {
  const char* ir =
      "graph t {\n"
      "  %y = parameter() {dtype=i32, index=0, name=\"y\", shape=[4]} : i32[4]\n"
      "  %0 = check_index(%y) {limit=5, what=\"t: labels\"} : i32[4]\n"
      "  %1 = cast(%0) {dtype=f32} : f32[4]\n"
      "  %w = variable() {dtype=f32, name=\"w\", shape=[4]} : f32[4]\n"
      "  %2 = sub(%w, %1) : f32[4]\n"
      "  %3 = assign(%w, %2) : f32[4]\n"
      "  return\n  effects %3\n}\n";
  const char* numerics =
      "graph t {\n"
      "  %g = parameter() {dtype=f32, index=0, name=\"g\", shape=[4]} : f32[4]\n"
      "  %w = variable() {dtype=f32, name=\"w\", shape=[4]} : f32[4]\n"
      "  %0 = sub(%w, %g) : f32[4]\n"
      "  %1 = assign(%w, %0) : f32[4]\n"
      "  return\n  effects %1\n}\n";
  for (int devices : {1, 2})
    for (bool num : {false, true}) {
      jit::FusedProgram p = fuse_devices(num ? numerics : ir, devices, num);
      int writers = 0;
      for (size_t li = 0; li < p.kernels.size(); ++li) {
        if (!writes_variable(p, li)) continue;
        ++writers;
        EXPECT_LT(p.kernels[li].status_arg, 0) << p.description;
        EXPECT_GE(p.kernels[li].guard_arg, 0) << p.description;
        EXPECT_EQ(p.kernels[li].guard_words, devices);
      }
      EXPECT_EQ(writers, 1) << p.description;
    }
}
