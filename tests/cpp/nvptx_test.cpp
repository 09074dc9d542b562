// The GPU backend, tested without a GPU: every kernel of a suite of graphs
// (built through the real pipeline: parse or build IR, optimize, fuse) is
// lowered to PTX for sm_80 and sm_90 and assembled by ptxas; golden checks
// on the PTX of representative kernels; the CUDA runtime's error paths with
// the driver missing, and its logic against a fake driver that runs the CPU
// kernels; NvptxCompile drives jit::compile_job's GPU path (NVPTX codegen,
// the disk cache's PTX/cubin entries, CudaExecutable, variable copies kept
// coherent with the host) through that fake driver; NvptxEmulated runs the
// GPU kernels themselves in a SIMT emulator on the CPU and compares them
// with the CPU backend. The NvptxDevice tests
// compare GPU results with the CPU on a real GPU and skip (visibly) without
// one; FLOWJIT_REQUIRE_GPU=1 turns the skips into failures (tools/gpu_check.sh
// sets it).
#include <gtest/gtest.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/IRReader/IRReader.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/raw_ostream.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "codegen/cpu/backend.h"
#include "codegen/nvptx/backend.h"
#include "ir/error.h"
#include "ir/printer.h"
#include "jit/autodiff.h"
#include "jit/backend.h"
#include "jit/cache.h"
#include "jit/compile.h"
#include "jit/fusion.h"
#include "jit/optimizer.h"
#include "jit/pipeline.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/driver_api.h"
#include "runtime/cuda/executable.h"
#include "runtime/cuda/range_allocator.h"
#include "runtime/distributed.h"
#include "tests/cpp/fake_nccl.h"
#include "tests/cpp/test_util.h"

using namespace flowjit;
using namespace flowjit::ir;
namespace nv = flowjit::codegen::nvptx;
namespace rc = flowjit::runtime::cuda;

namespace {

// ---------------------------------------------------------------- graphs

using flowjit::testing::param;
NodeRef variable(const std::string& name, Shape s, DType dt = DType::Float32) {
  return make_node(OpKind::Variable, {}, Attrs{{"name", name}, {"shape", s}, {"dtype", dt}});
}
Graph make_graph(std::vector<NodeRef> params, std::vector<NodeRef> outputs,
                 std::vector<NodeRef> effects = {}) {
  Graph g;
  g.name = "t";
  g.params = std::move(params);
  g.outputs = std::move(outputs);
  g.effects = std::move(effects);
  return g;
}

const char* kElementwiseChain =
    "graph t {\n"
    "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[1000]} : f32[1000]\n"
    "  %0 = exp(%x) : f32[1000]\n"
    "  %1 = mul(%0, %x) : f32[1000]\n"
    "  %2 = tanh(%1) : f32[1000]\n"
    "  %3 = sub(%2, %x) : f32[1000]\n"
    "  return %3\n}\n";

const char* kBroadcast =
    "graph t {\n"
    "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[64,128]} : f32[64,128]\n"
    "  %b = parameter() {dtype=f32, index=1, name=\"b\", shape=[128]} : f32[128]\n"
    "  %c = parameter() {dtype=f32, index=2, name=\"c\", shape=[64,1]} : f32[64,1]\n"
    "  %0 = add(%x, %b) : f32[64,128]\n"
    "  %1 = mul(%0, %c) : f32[64,128]\n"
    "  %2 = sigmoid(%1) : f32[64,128]\n"
    "  return %2\n}\n";

const char* kMlpSoftmax =
    "graph t {\n"
    "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[8,5]} : f32[8,5]\n"
    "  %w = parameter() {dtype=f32, index=1, name=\"w\", shape=[7,5]} : f32[7,5]\n"
    "  %b = parameter() {dtype=f32, index=2, name=\"b\", shape=[7]} : f32[7]\n"
    "  %0 = matmul(%x, %w) {transpose_a=false, transpose_b=true} : f32[8,7]\n"
    "  %1 = add(%0, %b) : f32[8,7]\n"
    "  %2 = relu(%1) : f32[8,7]\n"
    "  %3 = softmax(%2) {axis=1} : f32[8,7]\n"
    "  return %3\n}\n";

const char* kMatmulBiasRelu =
    "graph t {\n"
    "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[256,784]} : f32[256,784]\n"
    "  %w = parameter() {dtype=f32, index=1, name=\"w\", shape=[512,784]} : f32[512,784]\n"
    "  %b = parameter() {dtype=f32, index=2, name=\"b\", shape=[512]} : f32[512]\n"
    "  %0 = matmul(%x, %w) {transpose_a=false, transpose_b=true} : f32[256,512]\n"
    "  %1 = add(%0, %b) : f32[256,512]\n"
    "  %2 = relu(%1) : f32[256,512]\n"
    "  return %2\n}\n";

// Half-precision matmuls (DT: f16 or bf16): a dense layer with a bias and
// ReLU epilogue (64x64 tiles) and a plain one big enough for 128x128 tiles,
// k = 72 (not a multiple of the mma's 16).
std::string half_matmuls(const std::string& dt) {
  std::string t =
      "graph t {\n"
      "  %x = parameter() {dtype=DT, index=0, name=\"x\", shape=[100,72]} : DT[100,72]\n"
      "  %w = parameter() {dtype=DT, index=1, name=\"w\", shape=[136,72]} : DT[136,72]\n"
      "  %b = parameter() {dtype=DT, index=2, name=\"b\", shape=[136]} : DT[136]\n"
      "  %z = parameter() {dtype=DT, index=3, name=\"z\", shape=[160,72]} : DT[160,72]\n"
      "  %y = parameter() {dtype=DT, index=4, name=\"y\", shape=[72,200]} : DT[72,200]\n"
      "  %0 = matmul(%x, %w) {transpose_a=false, transpose_b=true} : DT[100,136]\n"
      "  %1 = add(%0, %b) : DT[100,136]\n"
      "  %2 = relu(%1) : DT[100,136]\n"
      "  %3 = matmul(%z, %y) {transpose_a=false, transpose_b=false} : DT[160,200]\n"
      "  return %2, %3\n}\n";
  for (size_t at; (at = t.find("DT")) != std::string::npos;) t.replace(at, 2, dt);
  return t;
}

const char* kSoftmax =
    "graph t {\n"
    "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[100,10]} : f32[100,10]\n"
    "  %0 = softmax(%x) {axis=1} : f32[100,10]\n"
    "  return %0\n}\n";

const char* kCrossEntropy =
    "graph t {\n"
    "  %y = parameter() {dtype=i32, index=0, name=\"y\", shape=[100]} : i32[100]\n"
    "  %z = parameter() {dtype=f32, index=1, name=\"z\", shape=[100,10]} : f32[100,10]\n"
    "  %0 = sparse_softmax_cross_entropy(%y, %z) : f32[100]\n"
    "  return %0\n}\n";

// segment_sum with batch dims, int64 ids (some out of range: dropped), an
// inner dim that is not a multiple of the warp, and 3 blocks of segments.
const char* kSegmentSum =
    "graph t {\n"
    "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[2,3,40,37]} : f32[2,3,40,37]\n"
    "  %i = parameter() {dtype=i64, index=1, name=\"i\", shape=[2,40]} : i64[2,40]\n"
    "  %0 = segment_sum(%x, %i) {axis=2, batch_dims=1, num_segments=300} : f32[2,3,300,37]\n"
    "  return %0\n}\n";

const char* kReduceAxis0 =
    "graph t {\n"
    "  %x = parameter() {dtype=f32, index=0, name=\"x\", shape=[1000,64]} : f32[1000,64]\n"
    "  %0 = reduce_sum(%x) {axes=[0], keepdims=false} : f32[64]\n"
    "  return %0\n}\n";

Graph cross_entropy_backward() {
  auto y = param("y", 0, {100}, DType::Int32);
  auto z = param("z", 1, {100, 10});
  auto loss = make_node(OpKind::SparseCrossEntropy, {y, z});
  auto grads = jit::gradients(loss, fill(1.0, loss->shape(), loss->dtype()), {z});
  return make_graph({y, z}, {grads[0]});
}

// [harden] Index checks in GPU kernels: labels checked in a cross-entropy
// (a kept-space check) and in its gradient, a gather reading its indices
// through their check (an indirect load's check), and a one-hot; and a
// NaN/infinity check (check_numerics) of the gathered rows.
Graph index_checks() {
  auto y = param("y", 0, {100}, DType::Int32);
  auto z = param("z", 1, {100, 10});
  auto p = param("p", 2, {10, 33});
  auto cy = make_node(OpKind::CheckIndex, {y},
                      Attrs{{"limit", int64_t{10}}, {"what", std::string("t: labels")}});
  auto loss = make_node(OpKind::SparseCrossEntropy, {cy, z});
  auto grads = jit::gradients(loss, fill(1.0, loss->shape(), loss->dtype()), {z});
  auto rows =
      make_node(OpKind::Gather, {p, cy}, Attrs{{"axis", int64_t{0}}, {"batch_dims", int64_t{0}}});
  auto oh = make_node(OpKind::OneHot, {cy},
                      Attrs{{"depth", int64_t{10}},
                            {"dtype", DType::Float32},
                            {"on_value", 1.0},
                            {"off_value", 0.0}});
  auto finite = make_node(OpKind::CheckFinite, {unary(OpKind::Tanh, rows)},
                          Attrs{{"what", std::string("t: rows")}});
  return make_graph({y, z, p}, {loss, grads[0], finite, oh});
}

// Rows long enough for a block per row, a thread per column, every float type.
// The attention families (codegen/families/attention): the forward, the
// log-sum-exp and every gradient, causal with more queries than keys, a
// bias that varies along one batch dim and the keys, odd head dims; with
// `dropout`, the mask drawn from the offset operand's counters.
Graph attention_parts(double dropout = 0) {
  auto q = param("q", 0, {2, 3, 20, 8});
  auto k = param("k", 1, {2, 3, 17, 8});
  auto v = param("v", 2, {2, 3, 17, 5});
  auto bias = param("b", 3, {1, 3, 1, 17});
  auto dy = param("dy", 4, {2, 3, 20, 5});
  auto offset = param("offset", 5, {}, DType::Int64);
  const IntList sw = {0, 1, 3, 2};
  auto kt = transpose(k, sw);
  Attrs a{{"causal", true}, {"dropout", dropout}, {"scale", 0.4}, {"seed", int64_t{77}}};
  std::vector<NodeRef> fwd = {q, kt, v, bias};
  if (dropout > 0) fwd.push_back(offset);
  auto both = make_node(OpKind::Attention, fwd, a);  // [2, 3, 20, 5 + 1]
  auto slice = [&](int64_t from, int64_t width) {
    return make_node(OpKind::Slice, {both},
                     Attrs{{"begin", IntList{0, 0, 0, from}},
                           {"step", IntList{1, 1, 1, 1}},
                           {"shape", IntList{2, 3, 20, width}}});
  };
  auto out = slice(0, 5);
  auto lse = reshape(slice(5, 1), {2, 3, 20});
  auto delta = reduce(OpKind::ReduceSum, binary(OpKind::Mul, dy, out), {3}, false);
  std::vector<NodeRef> operands = {
      q, k, v, bias, dy, lse, delta, transpose(q, sw), kt, transpose(v, sw), transpose(dy, sw)};
  if (dropout > 0) operands.push_back(offset);
  std::vector<NodeRef> outs = {both};
  for (int64_t wrt = 0; wrt < 5; ++wrt) {
    Attrs g = a;
    g.set("wrt", wrt);
    outs.push_back(make_node(OpKind::AttentionGrad, operands, g));
  }
  std::vector<NodeRef> params = {q, k, v, bias, dy};
  if (dropout > 0) params.push_back(offset);
  return make_graph(params, outs);
}

Graph reductions_by_mapping() {
  auto a = param("a", 0, {16, 5000});
  auto b = param("b", 1, {64, 2048});
  auto c = param("c", 2, {5000, 3});
  auto d = param("d", 3, {33, 77}, DType::Float64);
  return make_graph({a, b, c, d}, {make_node(OpKind::Softmax, {a}, Attrs{{"axis", int64_t{1}}}),
                                   reduce(OpKind::ReduceSum, b, {0}, false),
                                   reduce(OpKind::ReduceMax, c, {0}, true),
                                   make_node(OpKind::LogSoftmax, {d}, Attrs{{"axis", int64_t{1}}}),
                                   reduce(OpKind::ArgMax, a, {1}, false)});
}

// Every reduction over every axis set of a rank-3 tensor.
Graph reductions_all(DType dt) {
  auto x = param("x", 0, {6, 7, 8}, dt);
  std::vector<NodeRef> outs;
  std::vector<IntList> sets = {{0}, {1}, {2}, {0, 1}, {1, 2}, {0, 2}, {0, 1, 2}};
  for (OpKind op : {OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMin, OpKind::ReduceProd,
                    OpKind::ArgMax, OpKind::ArgMin})
    for (auto& axes : sets) {
      bool arg = op == OpKind::ArgMax || op == OpKind::ArgMin;
      if (arg && axes.size() != 1) continue;
      outs.push_back(reduce(op, x, axes, axes.size() == 2));
    }
  return make_graph({x}, outs);
}

Graph matmul_variants() {
  std::vector<NodeRef> ps, outs;
  auto p = [&](Shape s, DType dt = DType::Float32) {
    ps.push_back(param("p" + std::to_string(ps.size()), static_cast<int64_t>(ps.size()), s, dt));
    return ps.back();
  };
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      auto a = p(ta ? Shape{17, 33} : Shape{33, 17});
      auto b = p(tb ? Shape{29, 17} : Shape{17, 29});
      outs.push_back(unary(OpKind::Tanh, matmul(a, b, ta, tb)));
    }
  outs.push_back(matmul(p({4, 33, 17}), p({4, 17, 29}), false, false));  // batched
  outs.push_back(matmul(p({4, 33, 17}), p({17, 29}), false, false));     // shared b
  outs.push_back(matmul(p({65, 31}, DType::Float64), p({31, 70}, DType::Float64), false, false));
  outs.push_back(matmul(p({9, 13}, DType::Int32), p({13, 11}, DType::Int32), false, false));
  outs.push_back(matmul(p({1, 300}), p({300, 1}), false, false));
  outs.push_back(matmul(p({0, 7}), p({7, 5}), false, false));  // empty output
  auto big = matmul(p({130, 300}), p({300, 170}), false, false);
  outs.push_back(binary(OpKind::Mul, big, p({170})));
  return make_graph(ps, outs);
}

// Every elementwise op of ops.def that accepts `dt`, on two shapes: one that
// vectorizes (64 floats) and one that does not (37 x 5).
Graph elementwise_ops(DType dt, std::set<OpKind>* covered) {
  std::vector<NodeRef> ps, outs;
  int64_t idx = 0;
  for (Shape s : {Shape{64}, Shape{37, 5}}) {
    auto x = param("x" + std::to_string(idx), idx, s, dt);
    ++idx;
    auto y = param("y" + std::to_string(idx), idx, s, dt);
    ++idx;
    ps.push_back(x);
    ps.push_back(y);
    auto c = binary(OpKind::Less, x, y);
    for (int k = 0; k < kNumOps; ++k) {
      OpKind op = static_cast<OpKind>(k);
      if (!is_elementwise(op)) continue;
      NodeRef n;
      try {
        if (op == OpKind::Cast) {
          n = cast(x, dt == DType::Float32 ? DType::Int32 : DType::Float32);
        } else if (op == OpKind::Where) {
          n = where(c, x, y);
        } else if (op == OpKind::CheckIndex) {  // [harden] the inputs are in range
          n = make_node(
              op, {unary(OpKind::Relu, x)},
              Attrs{{"limit", std::numeric_limits<int64_t>::max()}, {"what", std::string("x")}});
        } else if (op == OpKind::CheckFinite) {
          n = make_node(op, {x}, Attrs{{"what", std::string("x")}});
        } else if (op_arity(op) == 1) {
          n = unary(op, x);
        } else {
          n = binary(op, x, y);
        }
      } catch (const UserError&) {
        continue;  // the op does not take this dtype
      }
      if (op == OpKind::Identity) n = binary(OpKind::Equal, n, y);  // identity alone folds away
      outs.push_back(n);
      if (covered) covered->insert(op);
    }
  }
  return make_graph(ps, outs);
}

Graph casts() {
  std::vector<DType> all = {DType::Bool,  DType::Int8,    DType::UInt8,  DType::Int32,
                            DType::Int64, DType::Float32, DType::Float64};
  std::vector<NodeRef> ps, outs;
  for (DType from : all) {
    auto x = param("x" + std::to_string(ps.size()), static_cast<int64_t>(ps.size()), {33}, from);
    ps.push_back(x);
    for (DType to : all)
      if (to != from) outs.push_back(cast(x, to));
  }
  return make_graph(ps, outs);
}

Graph sources() {
  auto x = param("x", 0, {7, 9});
  std::vector<NodeRef> outs;
  for (OpKind op : {OpKind::RandomUniform, OpKind::RandomNormal, OpKind::TruncatedNormal})
    for (DType dt : {DType::Float32, DType::Float64}) {
      auto r =
          make_node(op, {}, Attrs{{"shape", Shape{1000}}, {"dtype", dt}, {"seed", int64_t{7}}});
      outs.push_back(binary(OpKind::Add, r, fill(1.0, {}, dt)));
    }
  auto iota =
      make_node(OpKind::Iota, {},
                Attrs{{"shape", Shape{7, 9}}, {"dtype", DType::Float32}, {"axis", int64_t{1}}});
  outs.push_back(binary(OpKind::Mul, x, iota));
  auto labels = param("labels", 1, {50}, DType::Int64);
  outs.push_back(make_node(OpKind::OneHot, {labels},
                           Attrs{{"depth", int64_t{10}},
                                 {"dtype", DType::Float32},
                                 {"on_value", 1.0},
                                 {"off_value", 0.0}}));
  return make_graph({x, labels}, outs);
}

// A convolution (an implicit GEMM) and both its gradients: the forward
// result [N, G, Co/G, P] with a bias + ReLU epilogue whose bias is indexed by
// the group (a batch dim of the matmul domain), and the data and filter
// gradients (conv_data_grad, conv_filter_grad) of an upstream gradient dy.
Graph conv_and_grads(Shape xs, Shape ws, const Attrs& attrs) {
  auto x = param("x", 0, xs);
  auto w = param("w", 1, ws);
  auto y = make_node(OpKind::Conv, {x, w}, attrs);
  auto bias = param("bias", 2, {y->shape()[1], y->shape()[2], 1});
  auto dy = param("dy", 3, y->shape());
  auto grads = jit::gradients(y, dy, {x, w});
  return make_graph({x, w, bias, dy},
                    {unary(OpKind::Relu, binary(OpKind::Add, y, bias)), grads[0], grads[1]});
}

// 2-D: padding (asymmetric), stride 2, dilation 2 and 2 groups at once.
Graph conv2d_strided_dilated_grouped() {
  return conv_and_grads({2, 4, 11, 10}, {6, 2, 3, 3},
                        Attrs{{"strides", IntList{2, 2}},
                              {"dilations", IntList{2, 2}},
                              {"pads_lo", IntList{2, 1}},
                              {"pads_hi", IntList{1, 2}},
                              {"groups", int64_t{2}}});
}

// 1-D, one group: the weight is a plain matrix (the fast path) and only the
// input goes through digits; K spans several tiles of the filter gradient.
Graph conv1d_padded_strided() {
  return conv_and_grads({3, 8, 40}, {16, 8, 5},
                        Attrs{{"strides", IntList{2}},
                              {"dilations", IntList{1}},
                              {"pads_lo", IntList{2}},
                              {"pads_hi", IntList{2}},
                              {"groups", int64_t{1}}});
}

// Wide enough (M = 128 output channels, N = 130 positions) for the 128 x 128
// tiles of both the FMA and the tensor-core path.
Graph conv1d_wide() {
  return conv_and_grads({1, 4, 130}, {128, 4, 3},
                        Attrs{{"strides", IntList{1}},
                              {"dilations", IntList{1}},
                              {"pads_lo", IntList{1}},
                              {"pads_hi", IntList{1}},
                              {"groups", int64_t{1}}});
}

// Pooling over window views: max with -inf padding and avg (sum) with zero
// padding, and the max pool's gradient through unwindow. Every load of these
// loop kernels is guarded by the window's coordinates.
Graph pooling_and_grad() {
  auto x = param("x", 0, {2, 3, 9, 8});
  Attrs a{{"window", IntList{3, 3}},    {"strides", IntList{2, 2}},
          {"dilations", IntList{1, 2}}, {"pads_lo", IntList{1, 1}},
          {"pads_hi", IntList{1, 0}},   {"pad_value", -std::numeric_limits<double>::infinity()}};
  auto pooled = reduce(OpKind::ReduceMax, make_node(OpKind::Window, {x}, a), {4, 5}, false);
  a.set("pad_value", 0.0);
  auto summed = reduce(OpKind::ReduceSum, make_node(OpKind::Window, {x}, a), {4, 5}, false);
  auto dy = param("dy", 1, pooled->shape());
  auto dx = jit::gradients(pooled, dy, {x})[0];
  return make_graph({x, dy}, {pooled, summed, dx});
}

// The seed's job: a 784-512-10 MLP with softmax cross-entropy, one SGD (or
// Adam) step, lowered exactly as jit/compile.cpp lowers a train job.
struct TrainGraph {
  Graph g;
  std::vector<std::pair<std::string, TensorType>> new_variables;
};

// check_labels: the labels go through a check_index, as the Python ops trace them.
TrainGraph train_step(jit::OptimizerConfig::Kind kind, int64_t batch, int64_t in, int64_t hidden,
                      int64_t classes, bool check_labels = false, int mirrored_parts = 0) {
  auto images = param("images", 0, {batch, 1, 28, in / 28});
  auto labels = param("labels", 1, {batch}, DType::Int32);
  auto w1 = variable("hidden-weight", {hidden, in});
  auto b1 = variable("hidden-bias", {hidden});
  auto w2 = variable("output-weight", {classes, hidden});
  auto b2 = variable("output-bias", {classes});
  auto x = reshape(images, {batch, in});
  auto h = unary(OpKind::Relu, binary(OpKind::Add, matmul(x, w1, false, true), b1));
  auto logits = binary(OpKind::Add, matmul(h, w2, false, true), b2);
  NodeRef y = labels;
  if (check_labels)
    y = make_node(OpKind::CheckIndex, {labels},
                  Attrs{{"limit", classes}, {"what", std::string("t: labels")}});
  auto loss = make_node(OpKind::SparseCrossEntropy, {y, logits});
  auto step = variable("train-step", {}, DType::Int64);
  auto lr = cast(fill(0.1, {}, DType::Float64), DType::Float32);
  jit::OptimizerConfig cfg;
  cfg.kind = kind;
  cfg.momentum = 0;
  cfg.do_bias_correction = true;
  cfg.mirrored_parts = mirrored_parts;
  jit::OptimizerLowering low = jit::lower_optimizer(cfg, {loss}, lr, step, {w1, b1, w2, b2});
  TrainGraph t;
  t.g = make_graph({images, labels}, {loss}, low.effects);
  t.new_variables = low.new_variables;
  return t;
}

struct Case {
  std::string name;
  Graph graph;
  std::vector<std::pair<std::string, TensorType>> new_variables;  // train jobs' optimizer state
};

const std::vector<Case>& suite() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> c;
    c.push_back({"elementwise_chain", parse_graph(kElementwiseChain), {}});
    c.push_back({"broadcast", parse_graph(kBroadcast), {}});
    c.push_back({"transposed_read",
                 [] {
                   auto x = param("x", 0, {64, 96});
                   return make_graph({x}, {unary(OpKind::Exp, transpose(x, {1, 0}))});
                 }(),
                 {}});
    c.push_back({"mlp_softmax", parse_graph(kMlpSoftmax), {}});
    c.push_back({"softmax", parse_graph(kSoftmax), {}});
    c.push_back({"cross_entropy_fwd", parse_graph(kCrossEntropy), {}});
    c.push_back({"cross_entropy_bwd", cross_entropy_backward(), {}});
    c.push_back({"index_checks", index_checks(), {}});
    c.push_back({"reduce_axis0", parse_graph(kReduceAxis0), {}});
    c.push_back({"segment_sum", parse_graph(kSegmentSum), {}});
    c.push_back({"attention", attention_parts(), {}});
    c.push_back({"attention_dropout", attention_parts(0.3), {}});
    c.push_back({"reductions_by_mapping", reductions_by_mapping(), {}});
    for (DType dt : {DType::Float32, DType::Float64, DType::Int32})
      c.push_back({"reductions_" + std::string(dtype_short_name(dt)), reductions_all(dt), {}});
    c.push_back({"matmul_bias_relu", parse_graph(kMatmulBiasRelu), {}});
    c.push_back({"matmul_variants", matmul_variants(), {}});
    c.push_back({"matmul_f16", parse_graph(half_matmuls("f16")), {}});
    c.push_back({"matmul_bf16", parse_graph(half_matmuls("bf16")), {}});
    for (DType dt : {DType::Float32, DType::Float64, DType::Int32, DType::Int64, DType::Int8,
                     DType::UInt8, DType::Bool, DType::Float16, DType::BFloat16})
      c.push_back(
          {"elementwise_" + std::string(dtype_short_name(dt)), elementwise_ops(dt, nullptr), {}});
    c.push_back({"conv2d_strided_dilated_grouped", conv2d_strided_dilated_grouped(), {}});
    c.push_back({"conv1d_padded_strided", conv1d_padded_strided(), {}});
    c.push_back({"conv1d_wide", conv1d_wide(), {}});
    c.push_back({"pooling_and_grad", pooling_and_grad(), {}});
    c.push_back({"casts", casts(), {}});
    c.push_back({"sources", sources(), {}});
    TrainGraph sgd = train_step(jit::OptimizerConfig::Kind::SGD, 100, 784, 512, 10);
    c.push_back({"train_step_sgd", sgd.g, sgd.new_variables});
    TrainGraph adam = train_step(jit::OptimizerConfig::Kind::Adam, 32, 196, 64, 10);
    c.push_back({"train_step_adam", adam.g, adam.new_variables});
    return c;
  }();
  return cases;
}

// `gpu`: optimized for a GPU target (half matmuls stay half), as compile_job does.
jit::FusedProgram fuse_graph(const Graph& g, const std::string& name, bool gpu = false) {
  jit::PassLog log;
  Graph opt = jit::optimize(g, log, jit::OptimizeOptions{gpu, gpu});
  return jit::fuse(opt, name);
}

jit::FusedProgram fuse_text(const std::string& text) { return fuse_graph(parse_graph(text), "t"); }

// A module and the launch records codegen wrote its grids into.
struct Compiled : nv::CompiledModule {
  std::vector<runtime::Launch> launches;
  const runtime::GpuGrid& grid(size_t i) const { return *launches.at(i).gpu(); }
};

Compiled compile_with(const std::vector<codegen::Kernel>& ks, const nv::CompileOptions& o) {
  Compiled c;
  c.launches = flowjit::testing::launch_records(ks);
  static_cast<nv::CompiledModule&>(c) = nv::compile(ks, c.launches, o);
  return c;
}

Compiled compile(const std::vector<codegen::Kernel>& ks, int sm, bool tf32 = false,
                 bool run_ptxas = false) {
  nv::CompileOptions o;
  o.sm = sm;
  o.allow_tf32 = tf32;
  o.run_ptxas = run_ptxas;
  return compile_with(ks, o);
}

bool has_matmul(const std::vector<codegen::Kernel>& ks) {
  for (auto& k : ks)
    if (k.kind == codegen::Kernel::Kind::MatMul) return true;
  return false;
}

// The PTX of one `.entry` (up to the next one).
std::string entry_text(const std::string& ptx, const std::string& name) {
  size_t b = ptx.find(".entry " + name + "(");
  if (b == std::string::npos) return "";
  size_t e = ptx.find(".entry ", b + 1);
  return ptx.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// Runs fn(i) for i in [0, n) on all cores.
void parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> ts;
  unsigned threads = std::max(2u, std::thread::hardware_concurrency());
  std::mutex err_mu;
  std::exception_ptr err;
  for (unsigned t = 0; t < threads; ++t)
    ts.emplace_back([&] {
      for (size_t i; (i = next++) < n;) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(err_mu);
          if (!err) err = std::current_exception();
        }
      }
    });
  for (auto& t : ts) t.join();
  if (err) std::rethrow_exception(err);
}

// Every module of the suite: each case for sm_80 and sm_90, exact, and with
// TF32 tensor cores when it has a matmul.
struct Module {
  std::string name;
  int sm;
  bool tf32;
  std::vector<std::string> kernels;
  Compiled compiled;
};

const std::vector<Module>& suite_modules() {
  static const std::vector<Module> mods = [] {
    std::vector<Module> out;
    std::vector<jit::FusedProgram> fused;
    for (const Case& c : suite()) fused.push_back(fuse_graph(c.graph, c.name, /*gpu=*/true));
    for (size_t i = 0; i < suite().size(); ++i)
      for (int sm : {80, 90})
        for (bool tf32 : {false, true}) {
          if (tf32 && !has_matmul(fused[i].kernels)) continue;
          Module m{suite()[i].name, sm, tf32, {}, {}};
          for (auto& k : fused[i].kernels) m.kernels.push_back(k.name);
          out.push_back(std::move(m));
        }
    std::vector<size_t> which;
    for (size_t i = 0, j = 0; i < suite().size(); ++i)
      for (; j < out.size() && out[j].name == suite()[i].name; ++j) which.push_back(i);
    parallel_for(out.size(), [&](size_t j) {
      out[j].compiled = compile(fused[which[j]].kernels, out[j].sm, out[j].tf32);
    });
    return out;
  }();
  return mods;
}

}  // namespace

// ---------------------------------------------------------------- codegen

TEST(NvptxCodegen, EveryElementwiseOpIsInTheSuite) {
  std::set<OpKind> covered;
  for (DType dt : {DType::Float32, DType::Float64, DType::Int32, DType::Int64, DType::Int8,
                   DType::UInt8, DType::Bool})
    elementwise_ops(dt, &covered);
  for (int k = 0; k < kNumOps; ++k) {
    OpKind op = static_cast<OpKind>(k);
    if (is_elementwise(op)) {
      EXPECT_TRUE(covered.count(op)) << op_name(op) << " is in no GPU test kernel";
    }
  }
}

TEST(NvptxCodegen, GeneratesPtxForEveryKernelOfTheSuite) {
  size_t kernels = 0;
  std::map<std::string, size_t> mappings;
  for (const Module& m : suite_modules()) {
    const std::string& ptx = m.compiled.ptx;
    SCOPED_TRACE(m.name + " sm_" + std::to_string(m.sm) + (m.tf32 ? " tf32" : ""));
    EXPECT_NE(ptx.find(".target sm_" + std::to_string(m.sm)), std::string::npos);
    EXPECT_EQ(ptx.find(".extern"), std::string::npos) << "unresolved external in the PTX";
    EXPECT_EQ(ptx.find("__nv_"), std::string::npos) << "a libdevice call was not inlined";
    ASSERT_EQ(m.compiled.launches.size(), m.kernels.size());
    ASSERT_EQ(m.compiled.notes.size(), m.kernels.size());
    for (size_t i = 0; i < m.kernels.size(); ++i) {
      EXPECT_NE(ptx.find(".visible .entry " + m.kernels[i] + "("), std::string::npos)
          << m.kernels[i];
      EXPECT_EQ(m.compiled.launches[i].symbol, m.kernels[i]);
      const runtime::GpuGrid& l = m.compiled.grid(i);
      EXPECT_GE(l.grid[0], 1u);
      EXPECT_TRUE(l.block[0] == 128 || l.block[0] == 256) << l.block[0];
      ++mappings[m.compiled.notes[i].mapping];
    }
    kernels += m.kernels.size();
  }
  std::string summary;
  for (auto& [k, n] : mappings) summary += "  " + k + ": " + std::to_string(n) + "\n";
  std::printf("[nvptx] %zu modules, %zu kernels; thread mappings:\n%s", suite_modules().size(),
              kernels, summary.c_str());
  // Every mapping of the backend is exercised by the suite.
  for (const char* want :
       {"elementwise", "elementwise x4", "elementwise x2", "reduce thread", "reduce warp",
        "reduce block", "matmul fma 64x64x16", "matmul fma 128x128x8", "matmul tf32 mma 64x64x16",
        "matmul tf32 mma 128x128x16", "implicit-gemm fma 64x64x16", "implicit-gemm fma 128x128x8",
        "implicit-gemm tf32 mma 64x64x16", "implicit-gemm tf32 mma 128x128x16"})
    EXPECT_TRUE(mappings.count(want)) << "no kernel of the suite uses the mapping '" << want << "'";
}

TEST(NvptxPtxas, AcceptsEveryKernelOfTheSuiteForSm80AndSm90) {
  std::string ptxas = nv::find_ptxas();
  if (ptxas.empty())
    GTEST_SKIP() << "ptxas not found (install the CUDA toolkit or set FLOWJIT_PTXAS)";
  const auto& mods = suite_modules();
  std::vector<nv::PtxasResult> results(mods.size());
  parallel_for(mods.size(), [&](size_t i) {
    results[i] = nv::run_ptxas(mods[i].compiled.ptx, mods[i].sm, ptxas);
  });
  std::map<int, size_t> accepted, modules;
  for (size_t i = 0; i < mods.size(); ++i) {
    EXPECT_TRUE(results[i].ok) << mods[i].name << " sm_" << mods[i].sm
                               << (mods[i].tf32 ? " tf32" : "") << ": ptxas said:\n"
                               << results[i].log;
    if (!results[i].ok) continue;
    EXPECT_FALSE(results[i].cubin.empty());
    EXPECT_EQ(std::memcmp(results[i].cubin.data(),
                          "\x7f"
                          "ELF",
                          4),
              0)
        << "a cubin is an ELF file";
    accepted[mods[i].sm] += mods[i].kernels.size();
    ++modules[mods[i].sm];
  }
  std::printf(
      "[nvptx] ptxas (%s) accepted %zu kernels in %zu modules for sm_80 and %zu kernels in %zu "
      "modules for sm_90\n",
      ptxas.c_str(), accepted[80], modules[80], accepted[90], modules[90]);
}

TEST(NvptxCodegen, PtxVersionFollowsTheTarget) {
  auto fp = fuse_text(kElementwiseChain);
  auto m80 = compile(fp.kernels, 80), m90 = compile(fp.kernels, 90);
  EXPECT_NE(m80.ptx.find(".version 7.0"), std::string::npos);
  EXPECT_NE(m80.ptx.find(".target sm_80"), std::string::npos);
  EXPECT_EQ(m80.ptx_version, 70);
  EXPECT_NE(m90.ptx.find(".version 7.8"), std::string::npos);
  EXPECT_NE(m90.ptx.find(".target sm_90"), std::string::npos);
  EXPECT_EQ(m90.ptx_version, 78);
  EXPECT_NE(m80.target_id, m90.target_id);
  EXPECT_NE(m80.target_id.find("sm_80"), std::string::npos);
}

TEST(NvptxGolden, MatmulEpilogueIsFusedIntoTheMatmulKernel) {
  auto fp = fuse_text(kMatmulBiasRelu);
  ASSERT_EQ(fp.kernels.size(), 1u) << fp.description;
  const std::string& name = fp.kernels[0].name;
  auto m = compile(fp.kernels, 80);
  std::string k = entry_text(m.ptx, name);
  ASSERT_FALSE(k.empty()) << m.ptx;
  EXPECT_EQ(m.notes[0].mapping, "matmul fma 128x128x8");
  EXPECT_EQ(m.grid(0).grid[0], 2u * 4u);  // 256/128 x 512/128 tiles
  EXPECT_GE(count(k, "fma.rn.f32"), 64u * 8u) << "the exact path: 8x8 FMAs per thread per k";
  EXPECT_GE(count(k, "bar.sync"), 2u);
  EXPECT_NE(k.find(".shared"), std::string::npos);
  // The epilogue: bias loads, adds and the ReLU select, then the stores.
  EXPECT_GE(count(k, "add.rn.f32") + count(k, "add.f32"), 64u) << k.substr(0, 4000);
  EXPECT_GE(count(k, "selp.f32") + count(k, "max.f32"), 64u);
  EXPECT_GE(count(k, "st.global.f32"), 64u);
  EXPECT_EQ(k.find("mma.sync"), std::string::npos) << "no tensor cores unless allowed";
}

// [amp] Half matmuls on a GPU stay half (widen_half keeps them for GPU
// targets) and run on mma.sync.m16n8k16 with float32 accumulation: 64x64
// tiles of 4 warps (32 x 32 each: 2 x 4 mma tiles, one k-step of 16 per
// tile) and 128x128 tiles of 8 (64 x 32: 4 x 4). The CPU widens them. Their
// numerics against the CPU: NvptxEmulated.EveryCaseMatchesTheCpu
// (matmul_f16, matmul_bf16), and NvptxDevice's on a GPU.
TEST(NvptxGolden, HalfMatmulsUseMmaM16n8k16) {
  for (const char* dt : {"f16", "bf16"}) {
    Graph g = parse_graph(half_matmuls(dt));
    auto cpu = fuse_graph(g, "t");
    for (auto& k : cpu.kernels)
      if (k.kind == codegen::Kernel::Kind::MatMul)
        EXPECT_EQ(k.args[k.mm.a.arg].dtype, DType::Float32) << "the CPU widens " << k.name;
    auto fp = fuse_graph(g, "t", /*gpu=*/true);
    std::string name = std::string(dt) == "f16" ? "float16" : "bfloat16";
    for (int sm : {80, 90}) {
      auto m = compile(fp.kernels, sm);
      std::vector<std::string> mappings;
      for (size_t i = 0; i < fp.kernels.size(); ++i) {
        if (fp.kernels[i].kind != codegen::Kernel::Kind::MatMul) continue;
        mappings.push_back(m.notes[i].mapping);
        std::string k = entry_text(m.ptx, fp.kernels[i].name);
        std::string mma =
            std::string("mma.sync.aligned.m16n8k16.row.col.f32.") + dt + "." + dt + ".f32";
        bool big = m.notes[i].mapping.find("128x128") != std::string::npos;
        // Per K tile (LLVM may unroll the loop over the 5 K tiles of k = 72).
        size_t mmas = big ? 16u : 8u, lds = big ? 4u + 2u : 2u + 2u;
        size_t tiles = count(k, mma) / mmas;
        EXPECT_TRUE(tiles == 1 || tiles == 5) << count(k, mma) << " " << m.notes[i].mapping;
        EXPECT_EQ(count(k, mma), tiles * mmas) << "sm_" << sm << " " << m.notes[i].mapping;
        EXPECT_EQ(k.find("cvt.rna.tf32"), std::string::npos);
        // The dense layer (x @ W^T, both contiguous along k, rows of 72
        // elements) is fed by cp.async; z @ y (y's rows along n) is not.
        EXPECT_EQ(count(k, "cp.async.cg.shared.global") > 0, !big) << m.notes[i].mapping;
        EXPECT_EQ(m.notes[i].mapping.find("cp.async") != std::string::npos, !big);
        // A's fragments and two tiles' B fragments per ldmatrix.x4.
        EXPECT_EQ(count(k, "ldmatrix.sync.aligned.m8n8.x4.shared.b16"), tiles * lds)
            << m.notes[i].mapping;
      }
      std::sort(mappings.begin(), mappings.end());
      EXPECT_EQ(mappings,
                (std::vector<std::string>{"matmul " + name + " mma 128x128x16",
                                          "matmul " + name + " mma 64x64x16 cp.async x3"}));
    }
  }
}

TEST(NvptxGolden, TensorCorePathUsesMmaSyncWhenAllowed) {
  auto fp = fuse_text(kMatmulBiasRelu);
  for (int sm : {80, 90}) {
    auto m = compile(fp.kernels, sm, /*tf32=*/true);
    std::string k = entry_text(m.ptx, fp.kernels[0].name);
    EXPECT_EQ(m.notes[0].mapping, "matmul tf32 mma 128x128x16");
    // 8 warps of 64 x 32: 4 x 4 mma tiles per warp and two k-steps per tile.
    EXPECT_EQ(count(k, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"), 32u) << "sm_" << sm;
    EXPECT_NE(k.find("cvt.rna.tf32.f32"), std::string::npos);
    EXPECT_GE(count(k, "selp.f32") + count(k, "max.f32"), 64u) << "the epilogue stays fused";
  }
  // Not for float64 or integer matmuls, even when allowed.
  auto mv = fuse_graph(matmul_variants(), "v");
  auto m = compile(mv.kernels, 80, true);
  for (size_t i = 0; i < mv.kernels.size(); ++i) {
    const auto& k = mv.kernels[i];
    if (k.kind != codegen::Kernel::Kind::MatMul) continue;
    bool f32 = k.args[k.mm.a.arg].dtype == DType::Float32;
    EXPECT_EQ(m.notes[i].mapping.find("tf32") != std::string::npos, f32) << k.name;
  }
}

const Case& suite_case(const std::string& name) {
  for (const Case& c : suite())
    if (c.name == name) return c;
  throw std::runtime_error("no suite case " + name);
}

// Convolutions and their gradients are implicit-GEMM kernels on the GPU too
// (exact FMA, or TF32 mma.sync when allowed), whose operand fetches are
// guarded by the coordinates; EveryCaseMatchesTheCpu checks their numbers.
TEST(NvptxGolden, ConvolutionsAreImplicitGemms) {
  for (const char* name :
       {"conv2d_strided_dilated_grouped", "conv1d_padded_strided", "conv1d_wide"}) {
    SCOPED_TRACE(name);
    auto fp = fuse_graph(suite_case(name).graph, name);
    std::vector<size_t> implicit;
    for (size_t i = 0; i < fp.kernels.size(); ++i) {
      const auto& k = fp.kernels[i];
      if (k.kind == codegen::Kernel::Kind::MatMul && !(k.mm.plain(0) && k.mm.plain(1)))
        implicit.push_back(i);
    }
    ASSERT_EQ(implicit.size(), 3u) << "conv, conv_data_grad, conv_filter_grad:\n" << fp.description;
    for (int sm : {80, 90})
      for (bool tf32 : {false, true}) {
        auto m = compile(fp.kernels, sm, tf32);
        for (size_t i : implicit) {
          const std::string& kname = fp.kernels[i].name;
          std::string k = entry_text(m.ptx, kname);
          ASSERT_FALSE(k.empty()) << kname;
          bool big = fp.kernels[i].mm.m >= 128 && fp.kernels[i].mm.n >= 128;
          std::string tiles = big ? (tf32 ? "128x128x16" : "128x128x8") : "64x64x16";
          EXPECT_EQ(m.notes[i].mapping,
                    (tf32 ? "implicit-gemm tf32 mma " : "implicit-gemm fma ") + tiles)
              << kname;
          EXPECT_EQ(k.find("mma.sync") != std::string::npos, tf32) << kname;
          EXPECT_EQ(k.find("cvt.rna.tf32.f32") != std::string::npos, tf32) << kname;
          EXPECT_GE(count(k, "bar.sync"), 2u) << kname;
          // Elements outside the input (padding, stride holes) are selected away, not branched
          // over.
          EXPECT_NE(k.find("selp.b32"), std::string::npos) << kname;
        }
      }
  }
  // A group's bias reaches the forward conv's epilogue through the batch dims.
  auto fp = fuse_graph(suite_case("conv2d_strided_dilated_grouped").graph, "c");
  bool fused = false;
  for (const auto& k : fp.kernels)
    if (k.kind == codegen::Kernel::Kind::MatMul && k.rank() == 4 && k.args.size() >= 3)
      fused = true;
  EXPECT_TRUE(fused) << fp.description;
}

// Pooling: the window views' guarded loads are in the loop kernels, which
// the GPU lowers with the shared ExprEmitter (checked in the emulator).
TEST(NvptxGolden, PoolingReadsThroughGuardedWindowLoads) {
  auto fp = fuse_graph(suite_case("pooling_and_grad").graph, "p");
  size_t guarded = 0;
  for (const auto& k : fp.kernels) {
    bool any = false;
    for (const auto& a : k.loads) any |= !a.coords.empty();
    guarded += any;
    EXPECT_EQ(k.kind, codegen::Kernel::Kind::Loop) << k.name;
  }
  EXPECT_GE(guarded, 3u) << "max pool, sum pool and the unwindow gradient:\n" << fp.description;
  for (int sm : {80, 90}) {
    auto m = compile(fp.kernels, sm);
    EXPECT_NE(m.ptx.find("0fFF800000"), std::string::npos) << "the -inf padding value";
  }
}

TEST(NvptxGolden, ReductionsUseWarpShufflesAndSharedMemory) {
  auto sm = fuse_text(kSoftmax);
  ASSERT_EQ(sm.kernels.size(), 1u) << sm.description;
  auto m = compile(sm.kernels, 80);
  EXPECT_EQ(m.notes[0].mapping, "reduce warp");
  EXPECT_EQ(m.grid(0).grid[0], 13u);  // 100 rows, 8 warps per block
  std::string k = entry_text(m.ptx, sm.kernels[0].name);
  EXPECT_GE(count(k, "shfl.sync.bfly.b32"), 10u) << "max and sum, 5 steps each";
  EXPECT_NE(k.find("max.NaN.f32"), std::string::npos);  // NaN-propagating max
  EXPECT_EQ(k.find("bar.sync"), std::string::npos) << "a warp needs no barrier";

  auto big = fuse_graph(reductions_by_mapping(), "r");
  auto mb = compile(big.kernels, 80);
  bool block_seen = false;
  for (size_t i = 0; i < big.kernels.size(); ++i) {
    if (mb.notes[i].mapping != "reduce block") continue;
    block_seen = true;
    std::string kb = entry_text(mb.ptx, big.kernels[i].name);
    EXPECT_NE(kb.find("shfl.sync.bfly.b32"), std::string::npos);
    EXPECT_NE(kb.find("st.shared"), std::string::npos);
    EXPECT_NE(kb.find("bar.sync"), std::string::npos);
    EXPECT_GT(mb.notes[i].static_shared_bytes, 0u);
  }
  EXPECT_TRUE(block_seen);
}

TEST(NvptxGolden, SoftmaxAndCrossEntropyStayOneKernel) {
  for (const char* text : {kSoftmax, kCrossEntropy}) {
    auto fp = fuse_text(text);
    ASSERT_EQ(fp.kernels.size(), 1u) << fp.description;
    auto m = compile(fp.kernels, 90);
    EXPECT_EQ(count(m.ptx, ".entry"), 1u);
    EXPECT_GE(fp.kernels[0].reduce_order.size(), 2u);
  }
  auto bwd = fuse_graph(cross_entropy_backward(), "b");
  ASSERT_EQ(bwd.kernels.size(), 1u) << bwd.description;
}

TEST(NvptxGolden, LibdeviceIsLinkedAndInlined) {
  auto fp = fuse_text(kElementwiseChain);
  auto m = compile(fp.kernels, 80);
  EXPECT_EQ(m.math_library, "libdevice");
  EXPECT_EQ(m.ptx.find(".extern"), std::string::npos);
  EXPECT_EQ(m.ptx.find("__nv_"), std::string::npos) << "__nv_expf / __nv_tanhf inlined";
  EXPECT_EQ(m.ptx.find("call"), std::string::npos);
  EXPECT_NE(m.ptx.find("ex2.approx"), std::string::npos) << "libdevice's expf";
  EXPECT_NE(m.target_id.find("math=libdevice"), std::string::npos);
  // Every transcendental function of both float types, in one module.
  auto all = fuse_graph(elementwise_ops(DType::Float64, nullptr), "f64");
  auto m64 = compile(all.kernels, 90);
  EXPECT_EQ(m64.ptx.find(".extern"), std::string::npos);
  EXPECT_EQ(m64.ptx.find("__nv_"), std::string::npos);
}

TEST(NvptxGolden, BuiltinMathNeedsNoLibdevice) {
  auto fp = fuse_text(kElementwiseChain);
  nv::CompileOptions o;
  o.math = nv::MathLibrary::Builtin;
  o.run_ptxas = false;
  auto m = compile_with(fp.kernels, o);
  EXPECT_EQ(m.math_library, "builtin");
  EXPECT_EQ(m.ptx.find("ex2.approx"), std::string::npos) << "flowjit's own polynomials";
  EXPECT_EQ(m.ptx.find(".extern"), std::string::npos);
  std::string ptxas = nv::find_ptxas();
  if (!ptxas.empty()) {
    auto r = nv::run_ptxas(m.ptx, 80, ptxas);
    EXPECT_TRUE(r.ok) << r.log;
  }
}

TEST(NvptxGolden, ContiguousElementwiseKernelsUse128BitAccesses) {
  auto fp = fuse_text(kElementwiseChain);
  auto m = compile(fp.kernels, 80);
  EXPECT_EQ(m.notes[0].mapping, "elementwise x4");
  EXPECT_EQ(m.grid(0).grid[0], 1u);  // 250 vectors of 4 in one block
  EXPECT_NE(m.ptx.find("ld.global.v4.f32"), std::string::npos);
  EXPECT_NE(m.ptx.find("st.global.v4.f32"), std::string::npos);
  // Broadcast operands are loaded once per vector and splat.
  auto bc = fuse_text(kBroadcast);
  auto mb = compile(bc.kernels, 80);
  EXPECT_EQ(mb.notes[0].mapping, "elementwise x4");
  // A transposed read cannot be vectorized.
  auto tr = fuse_graph(suite()[2].graph, "tr");
  auto mt = compile(tr.kernels, 80);
  EXPECT_EQ(mt.notes[0].mapping, "elementwise");
  EXPECT_EQ(mt.ptx.find(".v4."), std::string::npos);
}

TEST(NvptxCodegen, OptionErrorsAreUserErrors) {
  auto fp = fuse_text(kElementwiseChain);
  nv::CompileOptions o;
  o.sm = 61;
  try {
    compile_with(fp.kernels, o);
    FAIL() << "sm_61 accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("sm_61 is not supported"), std::string::npos) << e.what();
  }
  o.sm = 80;
  o.math = nv::MathLibrary::Libdevice;
  o.libdevice_path = "/nonexistent/libdevice.10.bc";
  try {
    compile_with(fp.kernels, o);
    FAIL() << "a missing libdevice accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read libdevice at /nonexistent/libdevice.10.bc"),
              std::string::npos)
        << e.what();
  }
}

TEST(NvptxPtxas, RejectedPtxIsReportedNotThrown) {
  std::string ptxas = nv::find_ptxas();
  if (ptxas.empty())
    GTEST_SKIP() << "ptxas not found (install the CUDA toolkit or set FLOWJIT_PTXAS)";
  auto r = nv::run_ptxas(
      ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry k() { bogus; }\n", 80, ptxas);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(r.cubin.empty());
  EXPECT_NE(r.log.find("bogus"), std::string::npos) << r.log;
  // compile() with ptxas: a cubin next to the PTX.
  auto fp = fuse_text(kSoftmax);
  auto m = compile(fp.kernels, 90, false, /*run_ptxas=*/true);
  EXPECT_FALSE(m.cubin.empty());
  EXPECT_EQ(m.ptxas_path, ptxas);
  EXPECT_GT(m.seconds_ptxas, 0.0);
}

// ---------------------------------------------------------------- runtime without a driver

TEST(NvptxRuntime, MissingDriverIsAClearUserError) {
  try {
    rc::load_driver("libflowjit-no-such-cuda.so.1");
    FAIL() << "a missing driver loaded";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind(rc::kNoDriverMessage, 0), 0u) << msg;
    EXPECT_NE(msg.find("libflowjit-no-such-cuda.so.1"), std::string::npos) << msg;
  }
  EXPECT_EQ(std::string(rc::kNoDriverMessage),
            "no CUDA driver: libcuda.so.1 not found; jobs placed on a GPU need an NVIDIA driver");
  // A library that is not a CUDA driver.
  try {
    rc::load_driver("libm.so.6");
    FAIL() << "libm loaded as a CUDA driver";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("the CUDA driver libm.so.6 lacks cuInit"),
              std::string::npos)
        << e.what();
  }
  // The process-wide driver: on a machine without one, every entry point
  // says so (and keeps saying so) without crashing.
  std::string why;
  if (rc::driver_available(&why))
    GTEST_SKIP() << "a CUDA driver is installed here: " << rc::driver().library;
  EXPECT_NE(why.find(rc::kNoDriverMessage), std::string::npos) << why;
  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_THROW(rc::driver(), UserError);
    try {
      rc::Device::open(0);
      FAIL() << "a device opened without a driver";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(rc::kNoDriverMessage), std::string::npos) << e.what();
    }
    EXPECT_THROW(rc::device_count(), UserError);
  }
}

TEST(NvptxRuntime, RangeAllocatorFirstFitAndCoalescing) {
  rc::RangeAllocator a(4096, 256);
  auto x = a.allocate(1), y = a.allocate(300), z = a.allocate(256);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 256u);  // 300 rounds up to 512
  EXPECT_EQ(*z, 768u);
  EXPECT_EQ(a.used(), 1024u);
  a.release(*y);
  EXPECT_EQ(*a.allocate(200), 256u);  // first fit reuses the hole
  a.release(256);
  a.release(*x);
  a.release(*z);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.largest_free(), 4096u) << "free neighbours merged back into one range";
  EXPECT_EQ(*a.allocate(4096), 0u);
  EXPECT_FALSE(a.allocate(1).has_value());
  EXPECT_THROW(a.release(12345), InternalError);
  a.release(0);
  EXPECT_EQ(*a.allocate(0), 0u);
  EXPECT_EQ(a.used(), 256u) << "a zero-byte request still takes one unit";
}

// ---------------------------------------------------------------- a SIMT emulator

// Runs GPU kernels on the CPU, so that their numerics are checked without a
// GPU: the optimized NVPTX module (flowjit's polynomials instead of
// libdevice) is retargeted to the host, its NVVM intrinsics become calls to
// the functions below, and each block runs as one fiber per thread
// (a small stack switch), switched at barriers and warp-synchronous operations. Shared
// memory is a global of the JIT object (blocks run one after another).
// Shuffles and mma.sync exchange values through per-thread slots between two
// warp barriers; mma.sync multiplies the fragments with the layouts of the
// PTX ISA (the same ones matmul.cpp documents).
namespace emu {

enum Wait { kRun, kBarrier, kWarpSync };
constexpr size_t kStackBytes = 256 << 10;

using Entry = void (*)(char* const* args);

// A context switch without ucontext's signal-mask system calls: saves the
// callee-saved registers, MXCSR and the x87 control word on the stack,
// stores the stack pointer in *from and resumes the stack `to`.
#if defined(__x86_64__)
#define FLOWJIT_HAVE_EMULATOR 1
extern "C" void flowjit_emu_switch(void** from, void* to);
asm(R"(
  .text
  .globl flowjit_emu_switch
  .type flowjit_emu_switch, @function
flowjit_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size flowjit_emu_switch, .-flowjit_emu_switch
)");
#else
extern "C" inline void flowjit_emu_switch(void**, void*) { std::abort(); }  // never called
#endif

struct Fiber {
  void* sp = nullptr;
  Wait wait = kRun;
  bool done = false;
};

struct Machine {
  Entry fn = nullptr;
  char* const* args = nullptr;
  unsigned grid = 1, block = 1, cta = 0;
  int cur = 0;
  void* sched = nullptr;  // the scheduler's stack pointer while a fiber runs
  std::vector<Fiber> fibers;
  std::vector<std::vector<char>> stacks;
  std::vector<uint32_t> slots;
  std::vector<std::array<uint32_t, 10>> frags;
  std::string error;
};
Machine* g_m = nullptr;
std::mutex g_mu;

void yield(Wait w) {
  Fiber& f = g_m->fibers[g_m->cur];
  f.wait = w;
  flowjit_emu_switch(&f.sp, g_m->sched);
}
int lane() { return g_m->cur % 32; }
int warp_base() { return g_m->cur - lane(); }

int32_t tid() { return g_m->cur; }
int32_t ctaid() { return static_cast<int32_t>(g_m->cta); }
int32_t ntid() { return static_cast<int32_t>(g_m->block); }
int32_t nctaid() { return static_cast<int32_t>(g_m->grid); }
void barrier() { yield(kBarrier); }
int32_t shfl_i32(int32_t v, int32_t lane_mask) {
  g_m->slots[g_m->cur] = static_cast<uint32_t>(v);
  yield(kWarpSync);
  uint32_t r = g_m->slots[warp_base() + ((lane() ^ lane_mask) & 31)];
  yield(kWarpSync);
  return static_cast<int32_t>(r);
}
float shfl_f32(float v, int32_t lane_mask) {
  int32_t b;
  std::memcpy(&b, &v, 4);
  b = shfl_i32(b, lane_mask);
  std::memcpy(&v, &b, 4);
  return v;
}
float bits_f(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
// cvt.rna.tf32.f32: 10 mantissa bits, round to nearest, ties away from zero.
int32_t tf32_rna(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if ((b & 0x7f800000u) != 0x7f800000u) b = (b + 0x1000u) & ~0x1fffu;
  return static_cast<int32_t>(b);
}
// An mma.sync's operands: this lane's registers where the warp's other
// lanes read them, from one warp barrier to the next.
void share_fragments(int32_t a0, int32_t a1, int32_t a2, int32_t a3, int32_t b0, int32_t b1,
                     float c0, float c1, float c2, float c3) {
  float cf[4] = {c0, c1, c2, c3};
  uint32_t c[4];
  std::memcpy(c, cf, 16);
  g_m->frags[g_m->cur] = {uint32_t(a0), uint32_t(a1), uint32_t(a2), uint32_t(a3), uint32_t(b0),
                          uint32_t(b1), c[0],         c[1],         c[2],         c[3]};
  yield(kWarpSync);
}

void mma_tf32(float* out, int32_t a0, int32_t a1, int32_t a2, int32_t a3, int32_t b0, int32_t b1,
              float c0, float c1, float c2, float c3) {
  share_fragments(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3);
  int base = warp_base(), g = lane() / 4, t = lane() % 4;
  auto A = [&](int r, int k) {
    return bits_f(g_m->frags[base + (r % 8) * 4 + k % 4][(r >= 8) + 2 * (k >= 4)]);
  };
  auto B = [&](int k, int n) { return bits_f(g_m->frags[base + n * 4 + k % 4][4 + (k >= 4)]); };
  int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
  float cs[4] = {c0, c1, c2, c3};
  for (int q = 0; q < 4; ++q) {
    float d = cs[q];
    for (int k = 0; k < 8; ++k) d = std::fma(A(rows[q], k), B(k, cols[q]), d);
    out[q] = d;
  }
  yield(kWarpSync);
}

// mma.sync.m16n8k16 on float16 (bf16 = false) or bfloat16 operands: each
// A and B register holds two k-consecutive elements, the first in its low
// half (matmul.cpp's layouts); products and sums in float32.
template <bool bf16>
void mma_half(float* out, int32_t a0, int32_t a1, int32_t a2, int32_t a3, int32_t b0, int32_t b1,
              float c0, float c1, float c2, float c3) {
  share_fragments(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3);
  int base = warp_base(), g = lane() / 4, t = lane() % 4;
  auto value = [](uint32_t reg, int k) {
    auto bits = static_cast<uint16_t>(k % 2 ? reg >> 16 : reg & 0xffffu);
    return ir::half_to_float(bits, bf16 ? DType::BFloat16 : DType::Float16);
  };
  auto A = [&](int r, int k) {
    return value(g_m->frags[base + (r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k);
  };
  auto B = [&](int k, int n) {
    return value(g_m->frags[base + n * 4 + (k % 8) / 2][4 + (k >= 8)], k);
  };
  int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
  float cs[4] = {c0, c1, c2, c3};
  for (int q = 0; q < 4; ++q) {
    float d = cs[q];
    for (int k = 0; k < 16; ++k) d = std::fma(A(rows[q], k), B(k, cols[q]), d);
    out[q] = d;
  }
  yield(kWarpSync);
}

// ldmatrix.sync.aligned.m8n8.x4.b16: every lane gives the address of one
// 16-byte row (lane l: row l % 8 of matrix l / 8); register j of lane l
// gets elements 2 (l % 4) and 2 (l % 4) + 1 of row l / 4 of matrix j.
void ldmatrix_x4(uint32_t* out, const char* addr) {
  auto& mine = g_m->frags[g_m->cur];
  auto a = reinterpret_cast<uint64_t>(addr);
  mine[0] = static_cast<uint32_t>(a);
  mine[1] = static_cast<uint32_t>(a >> 32);
  yield(kWarpSync);
  int base = warp_base(), g = lane() / 4, t = lane() % 4;
  for (int j = 0; j < 4; ++j) {
    const auto& src = g_m->frags[base + 8 * j + g];
    auto* row = reinterpret_cast<const char*>(uint64_t{src[0]} | (uint64_t{src[1]} << 32));
    std::memcpy(&out[j], row + 4 * t, 4);
  }
  yield(kWarpSync);
}

// cp.async.cg.shared.global 16 bytes with a source size: done at once (the
// emulator's threads switch only at barriers, so every later read sees it);
// bytes past `size` are zero. commit_group and wait_group are then no-ops.
void cp_async16(char* dst, const char* src, int32_t size) {
  std::memcpy(dst, src, static_cast<size_t>(size));
  std::memset(dst + size, 0, static_cast<size_t>(16 - size));
}

[[noreturn]] void fiber_main() {
  g_m->fn(g_m->args);
  g_m->fibers[g_m->cur].done = true;
  void* dead = nullptr;
  flowjit_emu_switch(&dead, g_m->sched);
  std::abort();  // a finished fiber is never resumed
}

// A fresh stack whose first switch "returns" into fiber_main as if called.
void* new_stack(std::vector<char>& stack) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack.data()) + stack.size()) & ~uintptr_t{15};
  auto* p = reinterpret_cast<uint64_t*>(top);
  *--p = 0;                                        // fiber_main's return address (never used)
  *--p = reinterpret_cast<uint64_t>(&fiber_main);  // popped by the switch's ret
  for (int i = 0; i < 6; ++i) *--p = 0;            // rbp rbx r12 r13 r14 r15
  uint32_t ctl[2] = {0x1f80, 0x37f};               // the default MXCSR and x87 control word
#if defined(__x86_64__)
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(ctl[0]), "=m"(ctl[1]));
#endif
  *--p = (uint64_t{ctl[1]} << 32) | ctl[0];  // MXCSR, x87 control word
  return p;
}

// Runs a whole grid. Returns "" or what went wrong (a deadlock).
double g_seconds = 0;
std::string run_grid(Entry fn, char* const* args, unsigned grid, unsigned block);
std::string run(Entry fn, char* const* args, unsigned grid, unsigned block) {
  auto t0 = std::chrono::steady_clock::now();
  std::string r = run_grid(fn, args, grid, block);
  g_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}
std::string run_grid(Entry fn, char* const* args, unsigned grid, unsigned block) {
  std::lock_guard<std::mutex> lock(g_mu);
  static Machine m;
  g_m = &m;
  m.fn = fn;
  m.args = args;
  m.grid = grid;
  m.block = block;
  m.fibers.assign(block, Fiber());
  if (m.stacks.size() < block) m.stacks.resize(block, std::vector<char>(kStackBytes));
  m.slots.assign(block, 0);
  m.frags.assign(block, {});
  for (m.cta = 0; m.cta < grid; ++m.cta) {
    for (unsigned t = 0; t < block; ++t) {
      Fiber& f = m.fibers[t];
      f = Fiber();
      f.sp = new_stack(m.stacks[t]);
    }
    while (true) {
      for (unsigned t = 0; t < block; ++t) {
        if (m.fibers[t].done || m.fibers[t].wait != kRun) continue;
        m.cur = static_cast<int>(t);
        flowjit_emu_switch(&m.sched, m.fibers[t].sp);
      }
      unsigned live = 0, at_barrier = 0;
      bool released = false;
      for (unsigned w = 0; w < block; w += 32) {
        unsigned n = 0, sync = 0;
        for (unsigned t = w; t < std::min(block, w + 32); ++t) {
          if (m.fibers[t].done) continue;
          ++n;
          sync += m.fibers[t].wait == kWarpSync;
          at_barrier += m.fibers[t].wait == kBarrier;
        }
        live += n;
        if (sync == 0) continue;
        if (sync != std::min(block, w + 32) - w)
          return "block " + std::to_string(m.cta) + ": warp " + std::to_string(w / 32) +
                 " reached a warp-synchronous operation with " + std::to_string(sync) +
                 " of its lanes";
        for (unsigned t = w; t < w + 32; ++t) m.fibers[t].wait = kRun;
        released = true;
      }
      if (live == 0) break;
      if (released) continue;
      if (at_barrier != live)
        return "block " + std::to_string(m.cta) + ": deadlock (" + std::to_string(at_barrier) +
               " of " + std::to_string(live) + " live threads at a barrier)";
      for (auto& f : m.fibers) f.wait = kRun;
    }
  }
  return "";
}

// The host IR of a GPU module: NVVM intrinsics replaced by the functions
// above, kernels made C functions, and `<kernel>.emu(ptr args)` wrappers.
std::string host_ir(const std::string& gpu_ir, std::string* unsupported) {
  llvm::LLVMContext ctx;
  llvm::SMDiagnostic diag;
  auto buf = llvm::MemoryBuffer::getMemBuffer(gpu_ir, "gpu.ll", false);
  std::unique_ptr<llvm::Module> m = llvm::parseIR(buf->getMemBufferRef(), diag, ctx);
  if (!m) {
    *unsupported = "cannot parse the GPU module: " + diag.getMessage().str();
    return "";
  }
  m->setTargetTriple("");
  m->setDataLayout("");
  if (auto* md = m->getNamedMetadata("nvvm.annotations")) m->eraseNamedMetadata(md);
  auto* i32 = llvm::Type::getInt32Ty(ctx);
  auto* f32 = llvm::Type::getFloatTy(ctx);
  auto* ptr = llvm::PointerType::get(ctx, 0);
  auto host = [&](void* fn, llvm::Type* ret, std::vector<llvm::Type*> params) {
    auto* fty = llvm::FunctionType::get(ret, params, false);
    auto* addr = llvm::ConstantExpr::getIntToPtr(
        llvm::ConstantInt::get(llvm::Type::getInt64Ty(ctx), reinterpret_cast<uint64_t>(fn)), ptr);
    return llvm::FunctionCallee(fty, addr);
  };
  std::vector<llvm::Function*> kernels;
  for (llvm::Function& f : *m) {
    f.removeFnAttr("target-cpu");
    f.removeFnAttr("target-features");
    if (f.getCallingConv() == llvm::CallingConv::PTX_Kernel) {
      f.setCallingConv(llvm::CallingConv::C);
      kernels.push_back(&f);
    }
  }
  std::vector<llvm::Function*> intrinsics;
  for (llvm::Function& f : *m)
    if (f.getName().starts_with("llvm.nvvm.")) intrinsics.push_back(&f);
  for (llvm::Function* f : intrinsics) {
    std::string name = f->getName().str();
    std::vector<llvm::CallInst*> calls;
    for (llvm::User* u : f->users())
      if (auto* c = llvm::dyn_cast<llvm::CallInst>(u)) calls.push_back(c);
    for (llvm::CallInst* c : calls) {
      llvm::IRBuilder<> b(c);
      llvm::Value* r = nullptr;
      auto arg = [&](unsigned i) { return c->getArgOperand(i); };
      if (name == "llvm.nvvm.read.ptx.sreg.tid.x") {
        r = b.CreateCall(host(reinterpret_cast<void*>(tid), i32, {}));
      } else if (name == "llvm.nvvm.read.ptx.sreg.ctaid.x") {
        r = b.CreateCall(host(reinterpret_cast<void*>(ctaid), i32, {}));
      } else if (name == "llvm.nvvm.read.ptx.sreg.ntid.x") {
        r = b.CreateCall(host(reinterpret_cast<void*>(ntid), i32, {}));
      } else if (name == "llvm.nvvm.read.ptx.sreg.nctaid.x") {
        r = b.CreateCall(host(reinterpret_cast<void*>(nctaid), i32, {}));
      } else if (name == "llvm.nvvm.barrier0") {
        b.CreateCall(host(reinterpret_cast<void*>(barrier), b.getVoidTy(), {}));
      } else if (name == "llvm.nvvm.shfl.sync.bfly.i32") {
        r = b.CreateCall(host(reinterpret_cast<void*>(shfl_i32), i32, {i32, i32}),
                         {arg(1), arg(2)});
      } else if (name == "llvm.nvvm.shfl.sync.bfly.f32") {
        r = b.CreateCall(host(reinterpret_cast<void*>(shfl_f32), f32, {f32, i32}),
                         {arg(1), arg(2)});
      } else if (name == "llvm.nvvm.f2tf32.rna") {
        r = b.CreateCall(host(reinterpret_cast<void*>(tf32_rna), i32, {f32}), {arg(0)});
      } else if (name == "llvm.nvvm.cp.async.cg.shared.global.16.s") {
        b.CreateCall(
            host(reinterpret_cast<void*>(cp_async16), b.getVoidTy(), {ptr, ptr, i32}),
            {b.CreateAddrSpaceCast(arg(0), ptr), b.CreateAddrSpaceCast(arg(1), ptr), arg(2)});
      } else if (name == "llvm.nvvm.cp.async.commit.group" ||
                 name == "llvm.nvvm.cp.async.wait.group") {
        // nothing: the copies are complete
      } else if (llvm::StringRef(name).starts_with("llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16")) {
        llvm::IRBuilder<> eb(&c->getFunction()->getEntryBlock(),
                             c->getFunction()->getEntryBlock().begin());
        auto* out = eb.CreateAlloca(llvm::ArrayType::get(i32, 4));
        b.CreateCall(host(reinterpret_cast<void*>(ldmatrix_x4), b.getVoidTy(), {ptr, ptr}),
                     {out, b.CreateAddrSpaceCast(arg(0), ptr)});
        r = llvm::PoisonValue::get(c->getType());
        for (unsigned q = 0; q < 4; ++q)
          r = b.CreateInsertValue(
              r, b.CreateLoad(i32, b.CreateConstGEP2_32(out->getAllocatedType(), out, 0, q)), {q});
      } else if (name == "llvm.nvvm.mma.m16n8k8.row.col.tf32" ||
                 name == "llvm.nvvm.mma.m16n8k16.row.col.f32.f32" ||
                 name == "llvm.nvvm.mma.m16n8k16.row.col.bf16") {
        llvm::IRBuilder<> eb(&c->getFunction()->getEntryBlock(),
                             c->getFunction()->getEntryBlock().begin());
        auto* out = eb.CreateAlloca(llvm::ArrayType::get(f32, 4));
        std::vector<llvm::Value*> args = {out};
        for (unsigned i = 0; i < 10; ++i)  // float16 pairs arrive as <2 x half>
          args.push_back(i < 6 ? b.CreateBitCast(arg(i), i32) : arg(i));
        void* fn = llvm::StringRef(name).ends_with("tf32") ? reinterpret_cast<void*>(mma_tf32)
                   : llvm::StringRef(name).ends_with("bf16")
                       ? reinterpret_cast<void*>(mma_half<true>)
                       : reinterpret_cast<void*>(mma_half<false>);
        b.CreateCall(
            host(fn, b.getVoidTy(), {ptr, i32, i32, i32, i32, i32, i32, f32, f32, f32, f32}), args);
        r = llvm::PoisonValue::get(c->getType());
        for (unsigned q = 0; q < 4; ++q)
          r = b.CreateInsertValue(
              r, b.CreateLoad(f32, b.CreateConstGEP2_32(out->getAllocatedType(), out, 0, q)), {q});
      } else {
        *unsupported += name + " ";
        continue;
      }
      if (r) c->replaceAllUsesWith(r);
      c->eraseFromParent();
    }
  }
  if (!unsupported->empty()) return "";
  for (llvm::Function* k : kernels) {
    auto* w =
        llvm::Function::Create(llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), {ptr}, false),
                               llvm::Function::ExternalLinkage, k->getName() + ".emu", *m);
    llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx, "entry", w));
    std::vector<llvm::Value*> args;
    for (unsigned i = 0; i < k->arg_size(); ++i)
      args.push_back(
          b.CreateLoad(k->getArg(i)->getType(), b.CreateConstGEP1_64(ptr, w->getArg(0), i)));
    b.CreateCall(k, args);
    b.CreateRetVoid();
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  m->print(os, nullptr);
  return text;
}

}  // namespace emu

// ---------------------------------------------------------------- a fake driver

// A CUDA driver whose device memory is host memory and whose kernel launches
// run the CPU backend's code for the same kernels. It checks the runtime's
// plumbing (staging, argument resolution, launch order, variables updated in
// place, completion by events) and lets the tests inject driver failures.
//
// Work runs at once, in the order the host enqueues it, whatever its stream;
// a real GPU runs two streams' work in any order their events allow. So the
// fake checks that order: every operation it runs (kernel, copy, a fake
// NCCL collective) gets its stream and a vector clock (per stream, how much
// of that stream's work is known to come before it; joined through
// cuEventRecord + cuStreamWaitEvent, and through the host's waits on events
// and streams). Two operations on different streams of one GPU that touch
// the same memory (a kernel's argument addresses, a copy's or collective's
// byte ranges) must be ordered by those clocks,
// else the fake records a hazard: a missing event edge, which a real GPU
// could turn into a race. It also counts kernels that run beside a
// collective (neither ordered before nor after it): overlap.
namespace fake {

using Clock = std::map<uintptr_t, uint64_t>;  // stream -> operations of it before
void join(Clock& into, const Clock& c) {
  for (auto& [s, n] : c) into[s] = std::max(into[s], n);
}
struct Op {
  int device = 0;
  uintptr_t stream = 0;
  uint64_t seq = 0;  // its place on its stream
  Clock clock;       // what comes before it
  std::string what;
  bool collective = false;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // [lo, hi) it reads or writes
};

struct Launch {
  std::string symbol;
  unsigned grid[3], block[3], shared;
  std::vector<rc::CUdeviceptr> args;
};

struct CpuKernel {
  runtime::KernelFn fn = nullptr;
  int64_t range = 1;
  size_t nargs = 0;
};

struct EmuKernel {
  emu::Entry fn = nullptr;
  size_t nargs = 0;
};

struct Gpu {
  int sm = 80;
  // Kernels run by the SIMT emulator, by the PTX of their module (kernel
  // names are unique within a module only).
  std::map<std::string, std::map<std::string, EmuKernel>> emu;
  std::vector<std::string> emu_errors;
  uint64_t alloc_limit = ~0ull;
  bool fail_module = false;
  bool fail_cubin = false;  // refuse cubins only (an image newer than the driver)
  int not_ready = 0;
  bool last_image_was_cubin = false;
  struct Module {
    std::vector<std::string> symbols;
    const std::map<std::string, EmuKernel>* emu = nullptr;
  };
  std::vector<Module> modules;                                      // CUmodule i + 1
  std::vector<std::pair<std::string, const EmuKernel*>> functions;  // CUfunction i + 1
  std::map<std::string, CpuKernel> cpu;
  std::vector<Launch> launches;
  std::set<void*> device_blocks, host_blocks;
  std::map<uintptr_t, size_t> block_bytes;  // device block -> its size
  int current = 0, retained = 0;
  // Several GPUs (NvptxMultiGpu): contexts and streams name their device;
  // events remember theirs. hang: collectives' events never complete on a
  // device until its NCCL communicator is aborted (tests/cpp/fake_nccl.h).
  int devices = 1;
  std::map<uintptr_t, int> events;
  uintptr_t next_event = 0x100;
  bool hang = false;
  std::set<int> aborted_devices;
  // Streams and their ordering (see above). `log`: "<device>:<stream
  // index> <what>" for every operation, event record and stream wait.
  std::map<int, int> streams;  // per device, how many were created
  std::map<uintptr_t, Clock> stream_clock, event_clock;
  std::map<uintptr_t, uint64_t> stream_ops;
  std::vector<Op> live;  // operations not yet known to be complete
  std::vector<std::string> hazards, log;
  int kernels_beside_collectives = 0;
  std::map<std::thread::id, Clock> host;  // per host thread (host_clock)
  std::vector<char> scratch = std::vector<char>(64 << 20);
};
Gpu& gpu() {
  static Gpu g;
  return g;
}
// The fake is thread-safe: tests run cases concurrently.
std::recursive_mutex g_mu;
#define FAKE_LOCK std::lock_guard<std::recursive_mutex> fake_lock_(g_mu)
thread_local std::vector<int> t_context;  // devices whose context this thread pushed
int current_device() { return t_context.empty() ? -1 : t_context.back(); }
// Stream k of device d is 0x10000 + 256 d + k.
int device_of(rc::CUstream s) {
  return static_cast<int>((reinterpret_cast<uintptr_t>(s) - 0x10000) >> 8);
}
int stream_index(rc::CUstream s) { return static_cast<int>(reinterpret_cast<uintptr_t>(s) & 0xff); }
// What the calling host thread has seen complete.
Clock& host_clock() { return gpu().host[std::this_thread::get_id()]; }
uintptr_t id(rc::CUstream s) { return reinterpret_cast<uintptr_t>(s); }
std::string where(rc::CUstream s) {
  return std::to_string(device_of(s)) + ":" + std::to_string(stream_index(s));
}
// The host waited for everything before `c`: those operations are done.
void host_saw(const Clock& c) {
  Clock& h = host_clock();
  join(h, c);
  auto& live = gpu().live;
  live.erase(
      std::remove_if(live.begin(), live.end(), [&](const Op& o) { return o.seq <= h[o.stream]; }),
      live.end());
}
// An operation on stream `s`, checked against those on the device's other streams.
void run_on(rc::CUstream s, const std::string& what, bool collective,
            std::vector<std::pair<uintptr_t, uintptr_t>> ranges) {
  Gpu& g = gpu();
  Op op;
  op.device = device_of(s);
  op.stream = id(s);
  op.seq = ++g.stream_ops[op.stream];
  op.clock = g.stream_clock[op.stream];
  join(op.clock, host_clock());
  op.clock[op.stream] = op.seq;
  g.stream_clock[op.stream] = op.clock;
  op.what = what;
  op.collective = collective;
  op.ranges = std::move(ranges);
  g.log.push_back(where(s) + " " + what);
  for (const Op& o : g.live) {
    if (o.device != op.device || o.stream == op.stream) continue;
    bool before = o.seq <= op.clock[o.stream];
    if (!before && o.collective && what.rfind("kernel ", 0) == 0) ++g.kernels_beside_collectives;
    bool touch = false;
    for (auto& a : o.ranges)
      for (auto& b : op.ranges) touch |= a.first < b.second && b.first < a.second;
    if (touch && !before)
      g.hazards.push_back(what + " on stream " + where(s) + " is not ordered after " + o.what +
                          " on stream " + where(reinterpret_cast<rc::CUstream>(o.stream)) +
                          ", which touches the same memory");
  }
  g.live.push_back(std::move(op));
}
std::pair<uintptr_t, uintptr_t> bytes_at(uintptr_t p, size_t n) {
  return {p, p + std::max<size_t>(n, 1)};
}
bool is_device_memory(uintptr_t p, size_t n) {
  FAKE_LOCK;
  auto it = gpu().block_bytes.upper_bound(p);
  if (it == gpu().block_bytes.begin()) return false;
  --it;
  return p >= it->first && p + n <= it->first + it->second;
}

using rc::CUresult;
CUresult ok() { return rc::kCudaSuccess; }
CUresult init(unsigned) { return ok(); }
CUresult error_string(CUresult e, const char** s) {
  switch (e) {
    case rc::kCudaErrorOutOfMemory:
      *s = "out of memory";
      break;
    case rc::kCudaErrorInvalidImage:
      *s = "device kernel image is invalid";
      break;
    case rc::kCudaErrorNotFound:
      *s = "named symbol not found";
      break;
    case rc::kCudaErrorNotReady:
      *s = "device not ready";
      break;
    default:
      *s = "unknown error";
  }
  return ok();
}
CUresult error_name(CUresult e, const char** s) {
  switch (e) {
    case rc::kCudaErrorOutOfMemory:
      *s = "CUDA_ERROR_OUT_OF_MEMORY";
      break;
    case rc::kCudaErrorInvalidImage:
      *s = "CUDA_ERROR_INVALID_IMAGE";
      break;
    case rc::kCudaErrorNotFound:
      *s = "CUDA_ERROR_NOT_FOUND";
      break;
    case rc::kCudaErrorNotReady:
      *s = "CUDA_ERROR_NOT_READY";
      break;
    default:
      *s = "CUDA_ERROR_UNKNOWN";
  }
  return ok();
}
CUresult driver_version(int* v) {
  *v = 13000;
  return ok();
}
CUresult device_count(int* n) {
  *n = gpu().devices;
  return ok();
}
CUresult device_get(rc::CUdevice* d, int ordinal) {
  *d = ordinal;
  return ordinal >= 0 && ordinal < gpu().devices ? ok() : rc::kCudaErrorInvalidValue;
}
CUresult device_name(char* name, int len, rc::CUdevice) {
  std::snprintf(name, static_cast<size_t>(len), "Fake GPU");
  return ok();
}
CUresult device_attribute(int* v, int attr, rc::CUdevice) {
  switch (attr) {
    case rc::kAttrComputeCapabilityMajor:
      *v = gpu().sm / 10;
      break;
    case rc::kAttrComputeCapabilityMinor:
      *v = gpu().sm % 10;
      break;
    case rc::kAttrMultiprocessorCount:
      *v = 4;
      break;
    case rc::kAttrMaxThreadsPerBlock:
      *v = 1024;
      break;
    default:
      *v = 0;
  }
  return ok();
}
CUresult total_mem(size_t* b, rc::CUdevice) {
  *b = size_t{1} << 30;
  return ok();
}
CUresult retain(rc::CUcontext* c, rc::CUdevice d) {
  FAKE_LOCK;
  *c = reinterpret_cast<rc::CUcontext>(uintptr_t{0x100} + static_cast<uintptr_t>(d));
  ++gpu().retained;
  return ok();
}
CUresult release(rc::CUdevice) {
  FAKE_LOCK;
  --gpu().retained;
  return ok();
}
CUresult push(rc::CUcontext c) {
  FAKE_LOCK;
  t_context.push_back(static_cast<int>(reinterpret_cast<uintptr_t>(c) - 0x100));
  ++gpu().current;
  return ok();
}
CUresult pop(rc::CUcontext* c) {
  FAKE_LOCK;
  --gpu().current;
  if (!t_context.empty()) t_context.pop_back();
  if (c) *c = nullptr;
  return ok();
}
CUresult ctx_sync() { return ok(); }
CUresult stream_create(rc::CUstream* s, unsigned) {
  FAKE_LOCK;
  int d = std::max(0, current_device());
  *s = reinterpret_cast<rc::CUstream>(uintptr_t{0x10000} + 256 * static_cast<uintptr_t>(d) +
                                      static_cast<uintptr_t>(gpu().streams[d]++));
  return ok();
}
CUresult stream_destroy(rc::CUstream) { return ok(); }
CUresult stream_sync(rc::CUstream s) {
  FAKE_LOCK;
  host_saw(gpu().stream_clock[id(s)]);
  return ok();
}
CUresult stream_wait(rc::CUstream s, rc::CUevent e, unsigned) {
  FAKE_LOCK;
  join(gpu().stream_clock[id(s)], gpu().event_clock[reinterpret_cast<uintptr_t>(e)]);
  gpu().log.push_back(where(s) + " wait " + std::to_string(reinterpret_cast<uintptr_t>(e)));
  return ok();
}
CUresult mem_alloc(rc::CUdeviceptr* p, size_t bytes) {
  FAKE_LOCK;
  if (bytes > gpu().alloc_limit) return rc::kCudaErrorOutOfMemory;
  void* m = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  std::memset(m, 0xab, bytes);  // uninitialized device memory is not zero
  gpu().device_blocks.insert(m);
  gpu().block_bytes[reinterpret_cast<uintptr_t>(m)] = bytes;
  *p = reinterpret_cast<rc::CUdeviceptr>(m);
  return ok();
}
CUresult mem_free(rc::CUdeviceptr p) {
  FAKE_LOCK;
  void* m = reinterpret_cast<void*>(p);
  if (!gpu().device_blocks.erase(m)) return rc::kCudaErrorInvalidValue;
  gpu().block_bytes.erase(reinterpret_cast<uintptr_t>(m));
  std::free(m);
  return ok();
}
CUresult host_alloc(void** p, size_t bytes) {
  FAKE_LOCK;
  *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  gpu().host_blocks.insert(*p);
  return ok();
}
CUresult host_free(void* p) {
  FAKE_LOCK;
  if (!gpu().host_blocks.erase(p)) return rc::kCudaErrorInvalidValue;
  std::free(p);
  return ok();
}
CUresult h2d(rc::CUdeviceptr d, const void* s, size_t n, rc::CUstream st) {
  FAKE_LOCK;
  run_on(st, "cuMemcpyHtoDAsync", false, {bytes_at(d, n)});
  std::memcpy(reinterpret_cast<void*>(d), s, n);
  return ok();
}
CUresult d2h(void* d, rc::CUdeviceptr s, size_t n, rc::CUstream st) {
  FAKE_LOCK;
  run_on(st, "cuMemcpyDtoHAsync", false, {bytes_at(s, n)});
  std::memcpy(d, reinterpret_cast<void*>(s), n);
  return ok();
}
CUresult d2d(rc::CUdeviceptr d, rc::CUdeviceptr s, size_t n, rc::CUstream st) {
  FAKE_LOCK;
  run_on(st, "cuMemcpyDtoDAsync", false, {bytes_at(d, n), bytes_at(s, n)});
  std::memcpy(reinterpret_cast<void*>(d), reinterpret_cast<void*>(s), n);
  return ok();
}
CUresult module_load(rc::CUmodule* m, const void* image, unsigned n, int* opts, void** vals) {
  FAKE_LOCK;
  const char* p = static_cast<const char*>(image);
  gpu().last_image_was_cubin = std::memcmp(p,
                                           "\x7f"
                                           "ELF",
                                           4) == 0;
  if (gpu().fail_module || (gpu().fail_cubin && gpu().last_image_was_cubin)) {
    for (unsigned i = 0; i < n; ++i)
      if (opts[i] == rc::kJitErrorLogBuffer)
        std::strcpy(static_cast<char*>(vals[i]), "fake JIT: bad PTX at line 1");
    return rc::kCudaErrorInvalidImage;
  }
  Gpu::Module mod;
  if (gpu().last_image_was_cubin) {
    for (auto& [name, k] : gpu().cpu) mod.symbols.push_back(name);
  } else {
    std::string text(p);
    std::regex entry(R"(\.entry (\w+)\()");
    for (std::sregex_iterator it(text.begin(), text.end(), entry), end; it != end; ++it)
      mod.symbols.push_back((*it)[1]);
    auto e = gpu().emu.find(text);
    if (e != gpu().emu.end()) mod.emu = &e->second;
  }
  gpu().modules.push_back(mod);
  *m = reinterpret_cast<rc::CUmodule>(static_cast<uintptr_t>(gpu().modules.size()));
  return ok();
}
CUresult module_unload(rc::CUmodule) { return ok(); }
CUresult get_function(rc::CUfunction* f, rc::CUmodule m, const char* name) {
  FAKE_LOCK;
  auto& mod = gpu().modules.at(reinterpret_cast<uintptr_t>(m) - 1);
  if (std::find(mod.symbols.begin(), mod.symbols.end(), name) == mod.symbols.end())
    return rc::kCudaErrorNotFound;
  const EmuKernel* e = nullptr;
  if (mod.emu) e = &mod.emu->at(name);
  gpu().functions.emplace_back(name, e);
  *f = reinterpret_cast<rc::CUfunction>(static_cast<uintptr_t>(gpu().functions.size()));
  return ok();
}
CUresult set_attribute(rc::CUfunction, int, int) { return ok(); }
CUresult launch(rc::CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                unsigned bz, unsigned shared, rc::CUstream stream, void** params, void**) {
  std::unique_lock<std::recursive_mutex> lock(g_mu);
  auto [name, emu_kernel] = gpu().functions.at(reinterpret_cast<uintptr_t>(f) - 1);
  Launch l{name, {gx, gy, gz}, {bx, by, bz}, shared, {}};
  auto touches = [&](size_t nargs) {
    std::vector<std::pair<uintptr_t, uintptr_t>> r;
    for (size_t i = 0; i < nargs; ++i)
      r.push_back(bytes_at(*static_cast<rc::CUdeviceptr*>(params[i]), 1));
    run_on(stream, "kernel " + name, false, r);
  };
  if (emu_kernel) {
    EmuKernel k = *emu_kernel;
    touches(k.nargs);
    std::vector<char*> args;
    for (size_t i = 0; i < k.nargs; ++i)
      args.push_back(reinterpret_cast<char*>(*static_cast<rc::CUdeviceptr*>(params[i])));
    lock.unlock();  // other threads compile meanwhile; the emulator runs one grid at a time
    std::string err = emu::run(k.fn, args.data(), gx * gy * gz, bx * by * bz);
    lock.lock();
    if (!err.empty()) gpu().emu_errors.push_back(name + ": " + err);
    gpu().launches.push_back(l);
    return ok();
  }
  auto it = gpu().cpu.find(name);
  touches(it != gpu().cpu.end() ? it->second.nargs : 0);
  if (it != gpu().cpu.end()) {
    std::vector<char*> args;
    for (size_t i = 0; i < it->second.nargs; ++i) {
      l.args.push_back(*static_cast<rc::CUdeviceptr*>(params[i]));
      args.push_back(reinterpret_cast<char*>(l.args.back()));
    }
    it->second.fn(args.data(), 0, it->second.range, gpu().scratch.data());
  }
  gpu().launches.push_back(l);
  return ok();
}
CUresult event_create(rc::CUevent* e, unsigned) {
  FAKE_LOCK;
  uintptr_t id = gpu().next_event++;
  gpu().events[id] = current_device();
  *e = reinterpret_cast<rc::CUevent>(id);
  return ok();
}
CUresult event_destroy(rc::CUevent) { return ok(); }
CUresult event_record(rc::CUevent e, rc::CUstream s) {
  FAKE_LOCK;
  Clock c = gpu().stream_clock[id(s)];
  join(c, host_clock());
  gpu().event_clock[reinterpret_cast<uintptr_t>(e)] = c;
  gpu().log.push_back(where(s) + " record " + std::to_string(reinterpret_cast<uintptr_t>(e)));
  return ok();
}
CUresult event_query(rc::CUevent e) {
  FAKE_LOCK;
  auto ev = gpu().events.find(reinterpret_cast<uintptr_t>(e));
  if (gpu().hang && ev != gpu().events.end() && !gpu().aborted_devices.count(ev->second))
    return rc::kCudaErrorNotReady;
  if (gpu().not_ready > 0) {
    --gpu().not_ready;
    return rc::kCudaErrorNotReady;
  }
  host_saw(gpu().event_clock[reinterpret_cast<uintptr_t>(e)]);
  return ok();
}
CUresult event_sync(rc::CUevent e) {
  FAKE_LOCK;
  host_saw(gpu().event_clock[reinterpret_cast<uintptr_t>(e)]);
  return ok();
}

const rc::DriverApi& api() {
  static const rc::DriverApi a = [] {
    rc::DriverApi d;
    d.cuInit = init;
    d.cuGetErrorString = error_string;
    d.cuGetErrorName = error_name;
    d.cuDriverGetVersion = driver_version;
    d.cuDeviceGetCount = device_count;
    d.cuDeviceGet = device_get;
    d.cuDeviceGetName = device_name;
    d.cuDeviceGetAttribute = device_attribute;
    d.cuDeviceTotalMem = total_mem;
    d.cuDevicePrimaryCtxRetain = retain;
    d.cuDevicePrimaryCtxRelease = release;
    d.cuCtxPushCurrent = push;
    d.cuCtxPopCurrent = pop;
    d.cuCtxSynchronize = ctx_sync;
    d.cuStreamCreate = stream_create;
    d.cuStreamDestroy = stream_destroy;
    d.cuStreamSynchronize = stream_sync;
    d.cuMemAlloc = mem_alloc;
    d.cuMemFree = mem_free;
    d.cuMemAllocHost = host_alloc;
    d.cuMemFreeHost = host_free;
    d.cuMemcpyHtoDAsync = h2d;
    d.cuMemcpyDtoHAsync = d2h;
    d.cuMemcpyDtoDAsync = d2d;
    d.cuModuleLoadDataEx = module_load;
    d.cuModuleUnload = module_unload;
    d.cuModuleGetFunction = get_function;
    d.cuFuncSetAttribute = set_attribute;
    d.cuLaunchKernel = launch;
    d.cuEventCreate = event_create;
    d.cuEventDestroy = event_destroy;
    d.cuEventRecord = event_record;
    d.cuEventQuery = event_query;
    d.cuEventSynchronize = event_sync;
    d.cuStreamWaitEvent = stream_wait;
    d.library = "fake";
    return d;
  }();
  return a;
}

}  // namespace fake

namespace {

void fill_deterministic(void* p, const TensorType& t, uint32_t seed) {
  std::mt19937 g(seed);
  int64_t n = t.numel();
  switch (t.dtype) {
    case DType::Float32: {
      std::normal_distribution<float> d(0.f, 0.1f);
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(p)[i] = d(g);
      break;
    }
    case DType::Float64: {
      std::normal_distribution<double> d(0., 0.1);
      for (int64_t i = 0; i < n; ++i) static_cast<double*>(p)[i] = d(g);
      break;
    }
    default:
      std::memset(p, 0, static_cast<size_t>(t.bytes()));
  }
}

// The GPU side of a job, as the wiring would do it: fuse, PTX (+ cubin), and
// a CudaExecutable with the launches codegen chose.
struct GpuJob {
  jit::FusedProgram fp;
  nv::CompiledModule mod;
  std::unique_ptr<rc::CudaExecutable> exec;
};

int codegen_sm(int device_sm) {
  int best = 80;
  for (int s : {70, 72, 75, 80, 86, 87, 89, 90})
    if (s <= device_sm) best = s;
  return best;
}

// Set while the fake device runs GPU kernels in the SIMT emulator.
bool g_emulate = false;

// Makes the fake driver run `mod`'s kernels in the emulator.
void emu_register(const nv::CompiledModule& mod, const std::vector<codegen::Kernel>& kernels) {
  static std::vector<std::shared_ptr<codegen::cpu::LoadedCode>> keep;
  std::string unsupported;
  std::string text = emu::host_ir(mod.llvm_ir, &unsupported);
  ASSERT_TRUE(unsupported.empty()) << "the emulator lacks " << unsupported;
  codegen::cpu::CompiledObject obj = codegen::cpu::compile_ir_text(text);
  std::vector<std::string> syms;
  for (auto& k : kernels) syms.push_back(k.name + ".emu");
  // Cases register concurrently: this module's code is `code`, not
  // keep.back(), which another thread may have pushed meanwhile.
  std::shared_ptr<codegen::cpu::LoadedCode> code = codegen::cpu::load(obj.object, syms);
  std::lock_guard<std::recursive_mutex> lock(fake::g_mu);
  keep.push_back(code);
  for (size_t i = 0; i < kernels.size(); ++i)
    fake::gpu().emu[mod.ptx][kernels[i].name] = {reinterpret_cast<emu::Entry>(code->address(i)),
                                                 kernels[i].args.size()};
}

// Options for a module the emulator runs: no ptxas (the fake driver finds
// kernels in the PTX), the built-in math, and the LLVM IR it translates.
nv::CompileOptions emulator_options(int sm, const std::string& module_name = "") {
  nv::CompileOptions o;
  if (!module_name.empty()) o.module_name = module_name;
  o.sm = sm;
  o.run_ptxas = false;
  o.math = nv::MathLibrary::Builtin;
  o.want_llvm_ir = true;
  return o;
}

GpuJob gpu_job(const Graph& g, const std::shared_ptr<rc::Device>& dev, bool tf32,
               bool run_ptxas = true) {
  GpuJob j;
  j.fp = fuse_graph(g, "t", /*gpu=*/true);
  int sm = codegen_sm(dev->info().sm);
  if (g_emulate) {
    nv::CompileOptions o = emulator_options(sm);
    o.allow_tf32 = tf32;
    j.mod = nv::compile(j.fp.kernels, j.fp.plan.launches, o);
    emu_register(j.mod, j.fp.kernels);
  } else {
    nv::CompileOptions o;
    o.sm = sm;
    o.allow_tf32 = tf32;
    o.run_ptxas = run_ptxas;
    j.mod = nv::compile(j.fp.kernels, j.fp.plan.launches, o);  // writes the plan's grids
  }
  rc::GpuImage image{j.mod.ptx, j.mod.cubin, sm};
  j.exec = std::make_unique<rc::CudaExecutable>(dev, j.fp.plan, image);
  return j;
}

}  // namespace

TEST(NvptxRuntime, FakeDriverRunsATrainStepLikeTheCpu) {
  fake::gpu() = fake::Gpu();
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::SGD, 8, 56, 16, 10);
  // CPU reference.
  runtime::VariableStore cpu_store, gpu_store;
  auto fp_probe = fuse_graph(t.g, "t");
  for (auto* store : {&cpu_store, &gpu_store})
    for (auto& [name, type] : fp_probe.plan.variables) {
      auto* v = store->get_or_create(name, type, true);
      fill_deterministic(v->ptr(), type, static_cast<uint32_t>(std::hash<std::string>()(name)));
    }
  jit::JobDescription job;
  job.name = "t";
  job.graph = t.g;
  jit::CompiledJob cj = jit::compile_job(job, jit::CompileSettings{}, cpu_store);
  {
    // The fake GPU runs the CPU code of the same kernels.
    std::vector<runtime::Launch> ls = flowjit::testing::launch_records(fp_probe.kernels);
    codegen::cpu::CompiledObject obj = codegen::cpu::compile(fp_probe.kernels, ls, {});
    std::vector<std::string> syms;
    for (auto& l : ls) syms.push_back(l.symbol);
    static std::shared_ptr<codegen::cpu::LoadedCode> code;
    code = codegen::cpu::load(obj.object, syms);
    for (size_t i = 0; i < syms.size(); ++i)
      fake::gpu().cpu[syms[i]] = {reinterpret_cast<runtime::KernelFn>(code->address(i)),
                                  ls[i].cpu()->range, fp_probe.kernels[i].args.size()};
  }
  {
    auto dev = rc::Device::open(0, &fake::api());
    EXPECT_EQ(dev->info().str(), "Fake GPU (sm_80, 4 SMs, 1 GiB)");
    GpuJob gj = gpu_job(t.g, dev, false);
    EXPECT_EQ(gj.exec->loaded_from(),
              gj.mod.cubin.empty() ? "ptx (driver JIT for sm_80)" : "cubin sm_80");
    EXPECT_EQ(fake::gpu().last_image_was_cubin, !gj.mod.cubin.empty());
    rc::DeviceVariables dv(dev);
    gj.exec->bind_variables(gpu_store, dv);
    std::vector<float> images(8 * 56);
    std::vector<int32_t> labels(8);
    float loss_cpu[8], loss_gpu[8];
    for (int step = 0; step < 3; ++step) {
      fill_deterministic(images.data(), {DType::Float32, {8, 56}}, 100 + step);
      for (int i = 0; i < 8; ++i) labels[i] = (i * 7 + step) % 10;
      const void* ins[] = {images.data(), labels.data()};
      void* out_cpu[] = {loss_cpu};
      void* out_gpu[] = {loss_gpu};
      cj.program->run(ins, out_cpu);
      gj.exec->run(ins, out_gpu);
      for (int i = 0; i < 8; ++i)
        EXPECT_EQ(loss_gpu[i], loss_cpu[i]) << "step " << step << " row " << i;
    }
    // Launch records: every kernel, in plan order, with codegen's grids.
    size_t per_run = gj.fp.plan.launches.size();
    ASSERT_EQ(fake::gpu().launches.size(), 3 * per_run);
    for (size_t i = 0; i < per_run; ++i) {
      const fake::Launch& l = fake::gpu().launches[2 * per_run + i];
      EXPECT_EQ(l.symbol, gj.fp.plan.launches[i].symbol);
      EXPECT_EQ(l.grid[0], gj.fp.plan.launches[i].gpu()->grid[0]);
      EXPECT_EQ(l.block[0], gj.fp.plan.launches[i].gpu()->block[0]);
      EXPECT_EQ(l.args, gj.exec->kernel_args(i));
    }
    // The device holds the trained variables; the host copy is stale until downloaded.
    auto* w = gpu_store.find("hidden-weight");
    auto* w_cpu = cpu_store.find("hidden-weight");
    EXPECT_NE(std::memcmp(w->ptr(), w_cpu->ptr(), static_cast<size_t>(w->type.bytes())), 0);
    dv.download_all(gpu_store);
    for (auto* v : cpu_store.all()) {
      auto* g = gpu_store.find(v->name);
      EXPECT_EQ(std::memcmp(v->ptr(), g->ptr(), static_cast<size_t>(v->type.bytes())), 0)
          << v->name;
    }
    EXPECT_EQ(fake::gpu().current, 0) << "every context push is popped";
  }
  EXPECT_TRUE(fake::gpu().device_blocks.empty()) << "device memory returned to the driver";
  EXPECT_TRUE(fake::gpu().host_blocks.empty()) << "pinned memory returned to the driver";
  EXPECT_EQ(fake::gpu().retained, 0) << "the primary context is released";
}

TEST(NvptxRuntime, FakeDriverFailuresNameTheCall) {
  fake::gpu() = fake::Gpu();
  auto dev = rc::Device::open(0, &fake::api());
  Graph g = parse_graph(kSoftmax);
  auto expect_error = [&](const std::function<void()>& fn, const std::vector<std::string>& parts) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Runtime);
      for (auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  // Out of device memory.
  fake::gpu().alloc_limit = 1 << 20;
  dev->set_chunk_bytes(4 << 20);
  expect_error([&] { gpu_job(g, dev, false, false); },
               {"CUDA driver call cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
                "allocating 4194304 bytes on Fake GPU"});
  fake::gpu().alloc_limit = ~0ull;
  // The driver rejects the image: its JIT log is in the message.
  fake::gpu().fail_module = true;
  expect_error(
      [&] { gpu_job(g, dev, false, false); },
      {"cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid",
       "as PTX on Fake GPU", "driver log: fake JIT: bad PTX at line 1"});
  fake::gpu().fail_module = false;
  // A kernel the image lacks.
  {
    auto fp = fuse_graph(g, "t");
    EXPECT_THROW(rc::CudaExecutable(dev, fp.plan, rc::GpuImage{}), InternalError)
        << "launches without GPU grids";
    for (auto& l : fp.plan.launches) l.geometry = runtime::GpuGrid{};
    expect_error([&] { rc::CudaExecutable(dev, fp.plan, rc::GpuImage{".version 7.0\n", {}, 0}); },
                 {"cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND: named symbol not found",
                  "kernel '" + fp.plan.launches[0].symbol + "' of job 't'"});
  }
  // A device that does not exist.
  try {
    rc::Device::open(1, &fake::api());
    ADD_FAILURE() << "GPU 1 opened";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "GPU 1 does not exist: the CUDA driver sees 1 device");
  }
  // Completion is observed with the event; a second submit must wait.
  GpuJob j = gpu_job(g, dev, false, false);
  std::vector<float> x(1000, 1.f), y(1000);
  const void* ins[] = {x.data()};
  void* outs[] = {y.data()};
  fake::gpu().not_ready = 2;
  j.exec->submit(ins);
  EXPECT_TRUE(j.exec->in_flight());
  EXPECT_FALSE(j.exec->done());
  EXPECT_FALSE(j.exec->done());
  EXPECT_THROW(j.exec->submit(ins), InternalError);
  EXPECT_TRUE(j.exec->done());
  j.exec->finish(outs);
  EXPECT_FALSE(j.exec->in_flight());
  // Variables the session no longer has.
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::SGD, 4, 28, 8, 10);
  GpuJob tj = gpu_job(t.g, dev, false, false);
  runtime::VariableStore empty;
  rc::DeviceVariables dv(dev);
  try {
    tj.exec->bind_variables(empty, dv);
    ADD_FAILURE() << "bound to missing variables";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("which no longer exists in the session"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(tj.exec->submit(ins), InternalError) << "run before bind_variables";
}

TEST(NvptxRuntime, PlanGridsRoundTripAndDamageIsRejected) {
  runtime::Plan p;
  p.job_name = "t";
  p.outputs = {TensorType{DType::Float32, {4}}};
  p.launches.resize(2);
  p.launches[0].symbol = "k0_exp";
  p.launches[1].symbol = "k1_matmul";
  runtime::GpuGrid a, b;
  a.grid[0] = 13;
  a.block[0] = 256;
  b.grid[0] = 8;
  b.grid[2] = 2;
  b.block[0] = 128;
  b.shared_bytes = 65536;
  p.launches[0].geometry = a;
  p.launches[1].geometry = b;
  p.launches[1].args = {{runtime::BufferKind::Output, 0, 0}};
  std::string text = p.serialize();
  EXPECT_NE(text.find("launch k1_matmul grid=8,1,2 block=128,1,1 shared=65536 O0+0\n"),
            std::string::npos)
      << text;
  runtime::Plan back = runtime::Plan::deserialize(text);
  ASSERT_EQ(back.launches.size(), 2u);
  EXPECT_EQ(back.serialize(), text);
  EXPECT_EQ(back.launches[1].gpu()->shared_bytes, 65536u);
  EXPECT_EQ(back.launches[0].geometry, p.launches[0].geometry);
  for (std::string bad : {"grid=13,1 block=256,1,1 shared=0", "grid=0,1,1 block=256,1,1 shared=0",
                          "grid=13,1,1 block=256,1,1", "grid=13,1,1 block=256,1,1x shared=0",
                          "grid=13,1,1 block=256,1,1 shared=-1"}) {
    std::string damaged = text;
    std::string good = "grid=13,1,1 block=256,1,1 shared=0";
    damaged.replace(damaged.find(good), good.size(), bad);
    EXPECT_THROW(runtime::Plan::deserialize(damaged), UserError) << bad;
  }
}

// ---------------------------------------------------------------- compile_job on a GPU

// jit::compile_job with a GPU target: the whole path (passes, fusion, disk
// cache, NVPTX codegen, ptxas, CudaExecutable, variable copies) behind the
// fake driver, which runs the CPU code of the same kernels.
namespace {

// Makes the fake GPU run the CPU code of `fp`'s kernels, by symbol.
void fake_runs_cpu_code_of(const jit::FusedProgram& fp) {
  static std::vector<std::shared_ptr<codegen::cpu::LoadedCode>> keep;
  std::vector<runtime::Launch> ls = flowjit::testing::launch_records(fp.kernels);
  codegen::cpu::CompiledObject obj = codegen::cpu::compile(fp.kernels, ls, {});
  std::vector<std::string> syms;
  for (auto& l : ls) syms.push_back(l.symbol);
  keep.push_back(codegen::cpu::load(obj.object, syms));
  std::lock_guard<std::recursive_mutex> lock(fake::g_mu);
  for (size_t i = 0; i < syms.size(); ++i)
    fake::gpu().cpu[syms[i]] = {reinterpret_cast<runtime::KernelFn>(keep.back()->address(i)),
                                ls[i].cpu()->range, fp.kernels[i].args.size()};
}

void fill_store(runtime::VariableStore& store, const jit::FusedProgram& fp) {
  for (auto& [name, type] : fp.plan.variables) {
    auto* v = store.get_or_create(name, type, true);
    fill_deterministic(v->ptr(), type, static_cast<uint32_t>(std::hash<std::string>()(name)));
  }
}

jit::CompileSettings gpu_settings(const std::shared_ptr<rc::Device>& dev,
                                  const std::string& cache_dir) {
  jit::CompileSettings s;
  s.cache_dir = cache_dir;
  s.target.kind = jit::Target::Kind::Gpu;
  s.device.state = std::make_shared<rc::DeviceVariables>(dev);
  return s;
}

// The GPU's variable copies a GPU job's settings carry (RunDevice::state).
rc::DeviceVariables& gpu_copies(const jit::CompileSettings& s) {
  return *std::static_pointer_cast<rc::DeviceVariables>(s.device.state);
}

// The GPU program of a compiled GPU job.
rc::CudaExecutable& gpu_of(const jit::CompiledJob& cj) {
  auto* exe = dynamic_cast<rc::CudaExecutable*>(cj.program.get());
  EXPECT_NE(exe, nullptr) << "not a GPU program";
  return *exe;
}

jit::JobDescription train_job(const TrainGraph& t) {
  jit::JobDescription job;
  job.name = "t";
  job.graph = t.g;
  job.signature = "Numpy:float32((8, 1, 28, 2),);Numpy:int32((8,),)";
  return job;
}

// One train step's loss of `run` on fixed inputs.
using RunFn = std::function<void(const void* const*, void* const*)>;
std::vector<float> step_loss(const RunFn& run, int step) {
  std::vector<float> images(8 * 56), loss(8);
  std::vector<int32_t> labels(8);
  fill_deterministic(images.data(), {DType::Float32, {8, 56}}, 100 + step);
  for (int i = 0; i < 8; ++i) labels[i] = (i * 7 + step) % 10;
  const void* ins[] = {images.data(), labels.data()};
  void* outs[] = {loss.data()};
  run(ins, outs);
  return loss;
}

bool same_bytes(const runtime::VariableStorage& a, const runtime::VariableStorage& b) {
  return a.type == b.type &&
         std::memcmp(a.ptr(), b.ptr(), static_cast<size_t>(a.type.bytes())) == 0;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(NvptxCompile, GpuTargetRunsTheJobLikeTheCpuWithCoherentVariables) {
  fake::gpu() = fake::Gpu();
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::SGD, 8, 56, 16, 10);
  jit::FusedProgram fp = fuse_graph(t.g, "t");
  fake_runs_cpu_code_of(fp);
  runtime::VariableStore cpu_store, gpu_store;
  fill_store(cpu_store, fp);
  fill_store(gpu_store, fp);
  jit::JobDescription job = train_job(t);
  jit::CompiledJob cpu = jit::compile_job(job, jit::CompileSettings{}, cpu_store);
  auto run_cpu = [&](const void* const* i, void* const* o) { cpu.program->run(i, o); };
  {
    auto dev = rc::Device::open(0, &fake::api());
    jit::CompileSettings s = gpu_settings(dev, "");
    jit::CompiledJob gpu = jit::compile_job(job, s, gpu_store);
    ASSERT_NE(dynamic_cast<rc::CudaExecutable*>(gpu.program.get()), nullptr);
    EXPECT_EQ(dynamic_cast<runtime::Executable*>(gpu.program.get()), nullptr)
        << "no CPU code for a GPU job";
    EXPECT_EQ(gpu.plan().launches.size(), fp.plan.launches.size());
    EXPECT_EQ(gpu.fusion_plan, fp.description) << "the same kernels as on the CPU";
    bool cubin = !nv::find_ptxas().empty();
    EXPECT_EQ(gpu.gpu_loaded_from, cubin ? "cubin sm_80" : "ptx (driver JIT for sm_80)");
    EXPECT_TRUE(gpu_of(gpu).writes_variables());
    auto run_gpu = [&](const void* const* i, void* const* o) { gpu_of(gpu).run(i, o); };
    for (int step = 0; step < 3; ++step)
      EXPECT_EQ(step_loss(run_gpu, step), step_loss(run_cpu, step)) << "step " << step;

    // The GPU holds the trained weights; the host gets them when it reads.
    auto* w = gpu_store.find("hidden-weight");
    auto* w_cpu = cpu_store.find("hidden-weight");
    EXPECT_TRUE(gpu_copies(s).holds_newest(*w));
    EXPECT_FALSE(same_bytes(*w, *w_cpu)) << "downloaded before anything read it";
    runtime::sync_host(*w);  // what a read from Python (or a CPU job) does first
    EXPECT_TRUE(same_bytes(*w, *w_cpu));
    EXPECT_FALSE(gpu_copies(s).holds_newest(*w));

    // A host write (a checkpoint load) reaches the GPU before its next run.
    for (auto* v : {w, w_cpu}) {
      runtime::sync_host(*v);
      fill_deterministic(v->ptr(), v->type, 4242);
      runtime::mark_host_written(*v);
    }
    EXPECT_EQ(step_loss(run_gpu, 3), step_loss(run_cpu, 3));
    for (auto* v : cpu_store.all()) {
      auto* g = gpu_store.find(v->name);
      runtime::sync_host(*g);
      EXPECT_TRUE(same_bytes(*g, *v)) << v->name;
    }
    EXPECT_EQ(fake::gpu().current, 0) << "every context push is popped";
  }
  EXPECT_TRUE(fake::gpu().device_blocks.empty()) << "device memory returned to the driver";
  EXPECT_TRUE(fake::gpu().host_blocks.empty()) << "pinned memory returned to the driver";
  EXPECT_EQ(fake::gpu().retained, 0) << "the primary context is released";
}

TEST(NvptxCompile, PredictJobsOnTheGpuLeaveTheHostCurrent) {
  fake::gpu() = fake::Gpu();
  auto x = param("x", 0, {8, 5});
  auto w = variable("w", {7, 5});
  Graph pg = make_graph({x}, {unary(OpKind::Exp, matmul(x, w, false, true))});
  jit::FusedProgram fp = fuse_graph(pg, "p");
  fake_runs_cpu_code_of(fp);
  runtime::VariableStore store;
  fill_store(store, fp);
  auto dev = rc::Device::open(0, &fake::api());
  jit::CompileSettings s = gpu_settings(dev, "");
  jit::JobDescription job;
  job.name = "p";
  job.graph = pg;
  jit::CompiledJob cj = jit::compile_job(job, s, store);
  EXPECT_FALSE(gpu_of(cj).writes_variables());
  std::vector<float> xs(40, 0.5f), y(56), want(56);
  const void* ins[] = {xs.data()};
  void* outs[] = {y.data()};
  gpu_of(cj).run(ins, outs);
  auto* v = store.find("w");
  EXPECT_FALSE(gpu_copies(s).holds_newest(*v)) << "a predict job writes no variable";
  const float* wv = reinterpret_cast<const float*>(v->ptr());
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 7; ++j) {
      double acc = 0;
      for (int k = 0; k < 5; ++k) acc += 0.5 * wv[j * 5 + k];
      EXPECT_NEAR(y[i * 7 + j], std::exp(acc), 1e-5 * std::exp(acc));
    }
  // A host write reaches the GPU copy before the next run.
  fill_deterministic(v->ptr(), v->type, 7);
  runtime::mark_host_written(*v);
  gpu_of(cj).run(ins, outs);
  for (int j = 0; j < 7; ++j) {
    double acc = 0;
    for (int k = 0; k < 5; ++k) acc += 0.5 * wv[j * 5 + k];
    EXPECT_NEAR(y[j], std::exp(acc), 1e-5 * std::exp(acc)) << "uploaded after the host write";
  }
}

TEST(NvptxCompile, GpuCodeRoundTripsTheDiskCache) {
  fake::gpu() = fake::Gpu();
  flowjit::testing::TempDir tmp("flowjit-gpu-cache-test");
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::SGD, 8, 56, 16, 10);
  jit::FusedProgram fp = fuse_graph(t.g, "t");
  fake_runs_cpu_code_of(fp);
  jit::JobDescription job = train_job(t);
  bool cubin = !nv::find_ptxas().empty();
  auto dev = rc::Device::open(0, &fake::api());

  runtime::VariableStore store1, store2;
  fill_store(store1, fp);
  fill_store(store2, fp);
  jit::CompileSettings s1 = gpu_settings(dev, tmp.path);
  jit::CompiledJob first = jit::compile_job(job, s1, store1);
  EXPECT_FALSE(first.from_disk_cache);
  ASSERT_EQ(first.cache_key.size(), 64u);
  EXPECT_TRUE(first.warnings.empty()) << first.warnings[0];

  // The entry: the cubin as object.o, the PTX and the plan with its grids, checksummed.
  jit::DiskCache cache(tmp.path, 0);
  jit::CacheHit hit;
  std::string why;
  ASSERT_EQ(cache.lookup(first.cache_key, true, hit, why, {"kernels.ptx"}),
            jit::DiskCache::Found::Hit)
      << why;
  ASSERT_EQ(hit.extra.size(), 1u);
  EXPECT_NE(hit.extra[0].find(".entry " + fp.plan.launches[0].symbol + "("), std::string::npos);
  auto geometry = [](const runtime::Plan& p) {
    std::vector<runtime::Geometry> out;
    for (const runtime::Launch& l : p.launches) out.push_back(l.geometry);
    return out;
  };
  runtime::Plan stored = runtime::Plan::deserialize(hit.plan);
  ASSERT_EQ(stored.launches.size(), fp.plan.launches.size());
  for (const runtime::Launch& l : stored.launches) EXPECT_NE(l.gpu(), nullptr) << l.symbol;
  EXPECT_EQ(geometry(stored), geometry(gpu_of(first).plan()));
  EXPECT_EQ(hit.object.empty(), !cubin);
  if (cubin) {
    EXPECT_EQ(std::string(hit.object.data(), 4),
              "\x7f"
              "ELF");
  }
  EXPECT_NE(hit.llvm_ir.find("nvptx64-nvidia-cuda"), std::string::npos);
  std::string meta = file_text(cache.entry_dir(first.cache_key) + "/meta.json");
  EXPECT_NE(meta.find("nvptx64-nvidia-cuda;sm_80;ptx"), std::string::npos) << meta;
  EXPECT_NE(meta.find(cubin ? ";cubin=yes" : ";cubin=none"), std::string::npos) << meta;
  EXPECT_NE(meta.find("kernels.ptx"), std::string::npos);

  // The same job again: from the cache, and it runs the same.
  jit::CompileSettings s2 = gpu_settings(dev, tmp.path);
  jit::CompiledJob second = jit::compile_job(job, s2, store2);
  EXPECT_TRUE(second.from_disk_cache);
  EXPECT_EQ(second.cache_key, first.cache_key);
  EXPECT_EQ(second.gpu_loaded_from, first.gpu_loaded_from);
  EXPECT_EQ(geometry(gpu_of(second).plan()), geometry(gpu_of(first).plan()));
  auto run1 = [&](const void* const* i, void* const* o) { gpu_of(first).run(i, o); };
  auto run2 = [&](const void* const* i, void* const* o) { gpu_of(second).run(i, o); };
  for (int step = 0; step < 2; ++step) EXPECT_EQ(step_loss(run2, step), step_loss(run1, step));

  // Other targets are other keys: the CPU, and another SM.
  runtime::VariableStore cpu_store;
  fill_store(cpu_store, fp);
  jit::CompileSettings cs;
  cs.cache_dir = tmp.path;
  jit::CompiledJob on_cpu = jit::compile_job(job, cs, cpu_store);
  EXPECT_NE(on_cpu.cache_key, first.cache_key);
  {
    std::lock_guard<std::recursive_mutex> lock(fake::g_mu);
    fake::gpu().sm = 90;
  }
  auto dev90 = rc::Device::open(0, &fake::api());
  runtime::VariableStore store3;
  fill_store(store3, fp);
  jit::CompiledJob sm90 = jit::compile_job(job, gpu_settings(dev90, tmp.path), store3);
  EXPECT_FALSE(sm90.from_disk_cache);
  EXPECT_NE(sm90.cache_key, first.cache_key);
  EXPECT_EQ(sm90.gpu_loaded_from, cubin ? "cubin sm_90" : "ptx (driver JIT for sm_90)");
  std::string meta90 = file_text(cache.entry_dir(sm90.cache_key) + "/meta.json");
  EXPECT_NE(meta90.find("nvptx64-nvidia-cuda;sm_90;"), std::string::npos) << meta90;
  jit::Target t80 = s1.target;
  t80.sm = 80;
  EXPECT_EQ(jit::make_backend(job, t80, s1.device)
                ->target()
                .str()
                .rfind("nvptx64-nvidia-cuda;sm_80;tf32=0;math=", 0),
            0u);
  // An entry written before plans held GPU grids (CPU defaults in its plan)
  // is refused by the backend: a miss, recompiled, never a crash.
  {
    jit::CodeObject old;
    old.plan = fp.plan;
    old.files = {{"kernels.ptx", ".version 7.0\n"}};
    EXPECT_THROW(jit::make_backend(job, s1.target, s1.device)->check_cached(old), UserError);
  }

  // A damaged plan is found, dropped and recompiled, with a warning.
  {
    std::string path = cache.entry_dir(first.cache_key) + "/plan.txt";
    std::string text = file_text(path);
    text[text.find(' ') + 1] ^= 1;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  }
  runtime::VariableStore store4;
  fill_store(store4, fp);
  jit::CompiledJob again = jit::compile_job(job, gpu_settings(dev, tmp.path), store4);
  EXPECT_FALSE(again.from_disk_cache);
  ASSERT_EQ(again.warnings.size(), 1u);
  EXPECT_NE(again.warnings[0].find("was damaged (plan.txt fails its SHA-256 checksum)"),
            std::string::npos)
      << again.warnings[0];
  jit::CompiledJob healed = jit::compile_job(job, gpu_settings(dev, tmp.path), store4);
  EXPECT_TRUE(healed.from_disk_cache) << "the recompiled code was stored again";
}

TEST(NvptxCompile, VariablesMoveBetweenGpusThroughTheHost) {
  fake::gpu() = fake::Gpu();
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::SGD, 8, 56, 16, 10);
  jit::FusedProgram fp = fuse_graph(t.g, "t");
  fake_runs_cpu_code_of(fp);
  runtime::VariableStore cpu_store, gpu_store;
  fill_store(cpu_store, fp);
  fill_store(gpu_store, fp);
  jit::JobDescription job = train_job(t);
  jit::CompiledJob cpu = jit::compile_job(job, jit::CompileSettings{}, cpu_store);
  auto run_cpu = [&](const void* const* i, void* const* o) { cpu.program->run(i, o); };
  auto dev = rc::Device::open(0, &fake::api());
  // Two sets of copies stand for two GPUs: the same job on each, one store.
  jit::CompileSettings sa = gpu_settings(dev, ""), sb = gpu_settings(dev, "");
  jit::CompiledJob a = jit::compile_job(job, sa, gpu_store);
  auto b = std::make_unique<jit::CompiledJob>(jit::compile_job(job, sb, gpu_store));
  auto run_a = [&](const void* const* i, void* const* o) { gpu_of(a).run(i, o); };
  auto run_b = [&](const void* const* i, void* const* o) { gpu_of(*b).run(i, o); };
  EXPECT_EQ(step_loss(run_a, 0), step_loss(run_cpu, 0));
  EXPECT_EQ(step_loss(run_b, 1), step_loss(run_cpu, 1)) << "B starts from what A trained";
  EXPECT_EQ(step_loss(run_a, 2), step_loss(run_cpu, 2)) << "A continues from what B trained";
  EXPECT_EQ(step_loss(run_b, 3), step_loss(run_cpu, 3));
  auto* w = gpu_store.find("output-weight");
  EXPECT_TRUE(gpu_copies(sb).holds_newest(*w));
  EXPECT_FALSE(gpu_copies(sa).holds_newest(*w));
  // Releasing the copies that hold the newest values brings them home first.
  b.reset();
  sb.device.state.reset();
  for (auto* v : cpu_store.all()) EXPECT_TRUE(same_bytes(*gpu_store.find(v->name), *v)) << v->name;
  EXPECT_EQ(step_loss(run_a, 4), step_loss(run_cpu, 4)) << "A uploads the host's newer value";
}

TEST(NvptxCompile, ARejectedCubinFallsBackToThePtx) {
  if (nv::find_ptxas().empty()) GTEST_SKIP() << "ptxas not found: no cubin to reject";
  fake::gpu() = fake::Gpu();
  fake::gpu().fail_cubin = true;
  Graph g = parse_graph(kElementwiseChain);
  jit::FusedProgram fp = fuse_graph(g, "t");
  fake_runs_cpu_code_of(fp);
  auto dev = rc::Device::open(0, &fake::api());
  runtime::VariableStore store;
  jit::JobDescription job;
  job.name = "t";
  job.graph = g;
  jit::CompiledJob cj = jit::compile_job(job, gpu_settings(dev, ""), store);
  EXPECT_EQ(cj.gpu_loaded_from,
            "ptx (driver JIT for sm_80) after the cubin was rejected: CUDA_ERROR_INVALID_IMAGE: "
            "device kernel image is invalid");
  EXPECT_FALSE(fake::gpu().last_image_was_cubin);
  std::vector<float> x(1000), y(1000);
  for (int i = 0; i < 1000; ++i) x[i] = 0.002f * static_cast<float>(i) - 1.f;
  const void* ins[] = {x.data()};
  void* outs[] = {y.data()};
  gpu_of(cj).run(ins, outs);
  for (int i = 0; i < 1000; i += 97)
    EXPECT_NEAR(y[i], std::tanh(std::exp(x[i]) * x[i]) - x[i], 1e-5) << i;
}

TEST(NvptxCompile, AJobOverSeveralGpusCompilesItsPerDeviceProgram) {
  fake::gpu() = fake::Gpu();
  auto dev = rc::Device::open(0, &fake::api());
  runtime::VariableStore store;
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::SGD, 8, 56, 16, 10);
  jit::JobDescription train = train_job(t);
  train.distribution.parts = 2;
  fill_store(store, fuse_graph(t.g, "t"));
  jit::CompileSettings s = gpu_settings(dev, "");
  s.target.run_ptxas = false;  // the fake driver finds the kernels in the PTX
  jit::CompiledJob cj = jit::compile_job(train, s, store);
  rc::CudaExecutable& exe = gpu_of(cj);
  ASSERT_TRUE(cj.distributed.has_value());
  size_t collectives = 0;
  for (size_t i = 0; i < exe.plan().launches.size(); ++i) {
    if (!exe.plan().launches[i].collective) continue;
    ++collectives;
    EXPECT_EQ(exe.plan().launches[i].args.size(), 2u) << "a collective: operand and result";
  }
  EXPECT_EQ(collectives, 4u) << "one all_reduce per gradient";
  // Its collectives need NCCL between GPUs: another communicator is refused.
  try {
    exe.set_device(runtime::make_thread_communicator(2), 0);
    ADD_FAILURE() << "a GPU job took a thread communicator";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotImplemented);
    EXPECT_NE(std::string(e.what()).find("need an NCCL communicator between GPUs, not 2 threads"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(codegen::nvptx::codegen_sm(90), 90);
  EXPECT_EQ(codegen::nvptx::codegen_sm(100), 90) << "newer GPUs run sm_90 PTX";
  EXPECT_EQ(codegen::nvptx::codegen_sm(61), 0) << "older than every supported SM";
}

// ---------------------------------------------------------------- on a GPU

namespace {

bool gpu_required() {
  const char* v = std::getenv("FLOWJIT_REQUIRE_GPU");
  return v && *v && std::string(v) != "0";
}

// Device 0, opened once; null with the reason when there is none.
std::shared_ptr<rc::Device> real_gpu(std::string* why) {
  static std::string reason;
  static std::shared_ptr<rc::Device> dev = [] {
    std::shared_ptr<rc::Device> d;
    if (!rc::driver_available(&reason)) return d;
    try {
      if (rc::device_count() == 0) {
        reason = "the CUDA driver sees no GPU";
        return d;
      }
      d = rc::Device::open(0);
    } catch (const UserError& e) {
      reason = e.what();
    }
    return d;
  }();
  *why = reason;
  return dev;
}

#define FLOWJIT_NEED_GPU(dev)                                                                     \
  std::string why_gpu_;                                                                           \
  auto dev = real_gpu(&why_gpu_);                                                                 \
  if (!dev) {                                                                                     \
    if (gpu_required()) FAIL() << "FLOWJIT_REQUIRE_GPU is set but there is no GPU: " << why_gpu_; \
    GTEST_SKIP() << "no GPU: " << why_gpu_;                                                       \
  }

void random_input(void* p, const TensorType& t, bool labels, uint32_t seed) {
  std::mt19937 g(seed);
  int64_t n = t.numel();
  std::uniform_real_distribution<double> u(-2, 2);
  std::uniform_int_distribution<int> ints(labels || t.dtype == DType::UInt8 ? 0 : -5,
                                          labels ? 9 : 5);
  for (int64_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case DType::Float32:
        static_cast<float*>(p)[i] = static_cast<float>(u(g));
        break;
      case DType::Float64:
        static_cast<double*>(p)[i] = u(g);
        break;
      case DType::Int32:
        static_cast<int32_t*>(p)[i] = ints(g);
        break;
      case DType::Int64:
        static_cast<int64_t*>(p)[i] = ints(g);
        break;
      case DType::Int8:
        static_cast<int8_t*>(p)[i] = static_cast<int8_t>(ints(g));
        break;
      case DType::UInt8:
        static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(ints(g));
        break;
      case DType::Bool:
        static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(g() & 1);
        break;
      case DType::Float16:
      case DType::BFloat16:
        static_cast<uint16_t*>(p)[i] = ir::float_to_half(static_cast<float>(u(g)), t.dtype);
        break;
    }
  }
}

struct Result {
  std::vector<std::vector<char>> outputs;
  std::map<std::string, std::vector<char>> variables;
};

// Runs `c` `steps` times on the CPU (reference) or the GPU from the same
// inputs and variables; returns the last outputs and the final variables.
Result run_case(const Case& c, const std::shared_ptr<rc::Device>& dev, bool tf32, int steps) {
  auto fp = fuse_graph(c.graph, c.name);
  runtime::VariableStore store;
  auto vars = fp.plan.variables;
  for (auto& nv : c.new_variables) vars.push_back(nv);
  for (auto& [name, type] : vars) {
    auto* v = store.get_or_create(name, type, true);
    fill_deterministic(v->ptr(), type, static_cast<uint32_t>(std::hash<std::string>()(name)));
  }
  std::vector<std::vector<char>> ins(fp.plan.inputs.size());
  Result r;
  for (auto& t : fp.plan.outputs) r.outputs.emplace_back(static_cast<size_t>(t.bytes()));
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (auto& o : r.outputs) out_ptrs.push_back(o.data());
  std::function<void()> run;
  jit::CompiledJob cj;
  GpuJob gj;
  std::unique_ptr<rc::DeviceVariables> dv;
  if (!dev) {
    jit::JobDescription job;
    job.name = c.name;
    job.graph = c.graph;
    cj = jit::compile_job(job, jit::CompileSettings{}, store);
    run = [&] { cj.program->run(in_ptrs.data(), out_ptrs.data()); };
  } else {
    gj = gpu_job(c.graph, dev, tf32);
    dv = std::make_unique<rc::DeviceVariables>(dev);
    gj.exec->bind_variables(store, *dv);
    run = [&] { gj.exec->run(in_ptrs.data(), out_ptrs.data()); };
  }
  for (int s = 0; s < steps; ++s) {
    in_ptrs.clear();
    for (size_t i = 0; i < ins.size(); ++i) {
      const TensorType& t = fp.plan.inputs[i];
      ins[i].assign(static_cast<size_t>(std::max<int64_t>(t.bytes(), 1)), 0);
      std::string pname = fp.graph.params[i]->attrs().get_str("name");
      random_input(ins[i].data(), t, pname == "labels" || pname == "y",
                   static_cast<uint32_t>(1000 * s + i));
      in_ptrs.push_back(ins[i].data());
    }
    run();
  }
  if (dv) dv->download_all(store);
  for (auto* v : store.all()) r.variables[v->name].assign(v->ptr(), v->ptr() + v->type.bytes());
  return r;
}

// Mismatches of `got` against `want` (NaN matches NaN, infinities match exactly).
std::string compare(const std::vector<char>& got, const std::vector<char>& want,
                    const TensorType& t, double rtol, double atol, double atol_rms = 0) {
  int64_t n = t.numel(), bad = 0;
  std::string first;
  if (atol_rms > 0) {
    // Reduced-precision products: the error scales with the typical magnitude.
    double ss = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; ++i) {
      double w = t.dtype == DType::Float32 ? reinterpret_cast<const float*>(want.data())[i]
                                           : reinterpret_cast<const double*>(want.data())[i];
      if (std::isfinite(w)) ss += w * w, ++cnt;
    }
    atol += atol_rms * std::sqrt(ss / std::max<int64_t>(cnt, 1));
  }
  for (int64_t i = 0; i < n; ++i) {
    double g, w;
    switch (t.dtype) {
      case DType::Float32:
        g = reinterpret_cast<const float*>(got.data())[i];
        w = reinterpret_cast<const float*>(want.data())[i];
        break;
      case DType::Float64:
        g = reinterpret_cast<const double*>(got.data())[i];
        w = reinterpret_cast<const double*>(want.data())[i];
        break;
      case DType::Float16:
      case DType::BFloat16:
        g = ir::half_to_float(reinterpret_cast<const uint16_t*>(got.data())[i], t.dtype);
        w = ir::half_to_float(reinterpret_cast<const uint16_t*>(want.data())[i], t.dtype);
        break;
      case DType::Int32:
        g = reinterpret_cast<const int32_t*>(got.data())[i];
        w = reinterpret_cast<const int32_t*>(want.data())[i];
        break;
      case DType::Int64:
        g = static_cast<double>(reinterpret_cast<const int64_t*>(got.data())[i]);
        w = static_cast<double>(reinterpret_cast<const int64_t*>(want.data())[i]);
        break;
      case DType::Int8:
        g = reinterpret_cast<const int8_t*>(got.data())[i];
        w = reinterpret_cast<const int8_t*>(want.data())[i];
        break;
      default:
        g = reinterpret_cast<const uint8_t*>(got.data())[i];
        w = reinterpret_cast<const uint8_t*>(want.data())[i];
        break;
    }
    bool same = (std::isnan(g) && std::isnan(w)) || g == w ||
                (ir::is_float(t.dtype) && std::isfinite(w) &&
                 std::fabs(g - w) <= atol + rtol * std::fabs(w));
    if (!same && bad++ == 0)
      first = "element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " +
              std::to_string(w);
  }
  return bad ? std::to_string(bad) + " of " + std::to_string(n) + " differ; first " + first : "";
}

void expect_gpu_matches(const Case& c, const std::shared_ptr<rc::Device>& dev, bool tf32, int steps,
                        const Result& want) {
  Result got = run_case(c, dev, tf32, steps);
  bool train = !c.graph.effects.empty();
  double rtol = tf32 ? 2e-2 : train ? 1e-4 : 2e-5, atol = tf32 ? 5e-3 : train ? 1e-5 : 1e-5;
  // The GPU fuses every multiply-add; a host reference without FMA (an
  // x86-64 before Haswell, FLOWJIT_CPU=x86-64-v2) rounds each product once
  // more. In a long dot product that error follows the size of the terms,
  // not of the (cancelled) sum: 1.6e-5 on a value of 0.025 in
  // matmul_bias_relu. So float32 results get an allowance of 1e-4 of their
  // rms there (as TF32's, smaller), read from the target the CPU compiled for.
  const double no_fma_rms = codegen::cpu::host_has_fma() ? 0 : 1e-4;
  auto rms_allowance = [&](const TensorType& t) {
    return tf32 && ir::is_float(t.dtype) ? 5e-3 : t.dtype == DType::Float32 ? no_fma_rms : 0;
  };
  auto fp = fuse_graph(c.graph, c.name);
  for (size_t i = 0; i < want.outputs.size(); ++i) {
    const TensorType& t = fp.plan.outputs[i];
    double rt = t.dtype == DType::Float64 && !tf32 ? 1e-12 : rtol,
           at = t.dtype == DType::Float64 && !tf32 ? 1e-12 : atol;
    // Both compute in float32 and round once: the GPU's math may land on
    // the other side of a rounding boundary, one unit in the last place.
    if (t.dtype == DType::Float16) rt = 2e-3, at = 1e-3;
    if (t.dtype == DType::BFloat16) rt = 1.6e-2, at = 1e-2;
    std::string d = compare(got.outputs[i], want.outputs[i], t, rt, at, rms_allowance(t));
    EXPECT_TRUE(d.empty()) << c.name << (tf32 ? " (tf32)" : "") << " output " << i << " " << t.str()
                           << ": " << d;
  }
  for (auto& [name, bytes] : want.variables) {
    TensorType t;
    for (auto& [n, ty] : fp.plan.variables)
      if (n == name) t = ty;
    for (auto& [n, ty] : c.new_variables)
      if (n == name) t = ty;
    std::string d = compare(got.variables[name], bytes, t, rtol, atol, rms_allowance(t));
    EXPECT_TRUE(d.empty()) << c.name << (tf32 ? " (tf32)" : "") << " variable " << name << ": "
                           << d;
  }
}

// Checks the GPU (exact, then with TF32 when the case has a matmul) against
// the CPU reference.
void expect_gpu_matches_cpu(const Case& c, const std::shared_ptr<rc::Device>& dev, int steps) {
  Result want = run_case(c, nullptr, false, steps);
  expect_gpu_matches(c, dev, false, steps, want);
  // Not Adam: its first updates are +-lr whatever the gradient's size, so a
  // TF32 rounding that flips a tiny gradient's sign moves a weight by 2 lr.
  if (has_matmul(fuse_graph(c.graph, c.name).kernels) && c.name != "train_step_adam")
    expect_gpu_matches(c, dev, true, steps, want);
}

}  // namespace

TEST(NvptxDevice, DriverAndDeviceArePresent) {
  FLOWJIT_NEED_GPU(dev);
  std::printf("[nvptx] %s, driver %s, codegen for sm_%d\n", dev->info().str().c_str(),
              rc::driver().library.c_str(), codegen_sm(dev->info().sm));
  EXPECT_GE(dev->info().sm, 70);
}

TEST(NvptxDevice, EveryCaseMatchesTheCpu) {
  FLOWJIT_NEED_GPU(dev);
  parallel_for(suite().size(), [&](size_t i) {
    const Case& c = suite()[i];
    SCOPED_TRACE(c.name);
    expect_gpu_matches_cpu(c, dev, c.graph.effects.empty() ? 1 : 3);
  });
}

TEST(NvptxDevice, AsyncRunsCompleteThroughEvents) {
  FLOWJIT_NEED_GPU(dev);
  GpuJob j = gpu_job(parse_graph(kElementwiseChain), dev, false);
  std::vector<float> x(1000), y(1000), want(1000);
  for (int i = 0; i < 1000; ++i) {
    x[i] = 0.002f * static_cast<float>(i) - 1.f;
    want[i] = std::tanh(std::exp(x[i]) * x[i]) - x[i];
  }
  const void* ins[] = {x.data()};
  void* outs[] = {y.data()};
  j.exec->submit(ins);
  while (!j.exec->done()) std::this_thread::yield();
  j.exec->finish(outs);
  for (int i = 0; i < 1000; ++i) EXPECT_NEAR(y[i], want[i], 1e-5) << i;
}

// The GPU kernels themselves, run by the SIMT emulator behind the GPU
// runtime (fake driver), against the CPU backend: every case of the suite,
// exact and with TF32 tensor cores.
TEST(NvptxEmulated, EveryCaseMatchesTheCpu) {
#ifndef FLOWJIT_HAVE_EMULATOR
  GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
#endif
  fake::gpu() = fake::Gpu();
  auto dev = rc::Device::open(0, &fake::api());
  g_emulate = true;
  std::vector<const Case*> cases;
  // Dtypes that repeat what another case covers, to keep the test short.
  std::set<std::string> skip = {"reductions_f32", "elementwise_i32", "elementwise_i64",
                                "elementwise_u8"};
  for (const Case& c : suite())
    if (!skip.count(c.name)) cases.push_back(&c);
  auto t0 = std::chrono::steady_clock::now();
  parallel_for(cases.size(), [&](size_t i) {
    const Case& c = *cases[i];
    SCOPED_TRACE(c.name);
    bool train = !c.graph.effects.empty();
    expect_gpu_matches_cpu(c, dev, train ? 2 : 1);
  });
  std::printf("[emu] %zu cases in %.2fs (emulating %.2fs)\n", cases.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              emu::g_seconds);
  g_emulate = false;
  for (auto& e : fake::gpu().emu_errors) ADD_FAILURE() << e;
  size_t emulated = 0;
  for (auto& [ptx, ks] : fake::gpu().emu) emulated += ks.size();
  EXPECT_GT(emulated, 300u) << "kernels run by the emulator";
  std::printf("[emu] %zu kernels in %zu modules ran in the emulator\n", emulated,
              fake::gpu().emu.size());
}

// [harden] An index outside its range, found by a GPU kernel (run by the
// emulator): the run raises naming the check, the value and its position,
// and the next run with good indices succeeds (the status buffer is reset).
TEST(NvptxEmulated, AnIndexOutOfRangeIsReportedByTheKernel) {
#ifndef FLOWJIT_HAVE_EMULATOR
  GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
#endif
  fake::gpu() = fake::Gpu();
  auto dev = rc::Device::open(0, &fake::api());
  g_emulate = true;
  GpuJob j = gpu_job(index_checks(), dev, false);
  g_emulate = false;
  EXPECT_GE(j.fp.plan.status_offset, 0);
  ASSERT_EQ(j.fp.plan.checks.size(), 2u);  // the labels, the rows' numerics
  std::vector<int32_t> y(100, 3);
  std::vector<float> z(100 * 10, 0.5f), p(10 * 33, 0.25f);
  std::vector<std::vector<char>> outs;
  for (auto& t : j.fp.plan.outputs) outs.emplace_back(static_cast<size_t>(t.bytes()));
  std::vector<void*> out_ptrs;
  for (auto& o : outs) out_ptrs.push_back(o.data());
  const void* ins[] = {y.data(), z.data(), p.data()};
  g_emulate = true;
  j.exec->run(ins, out_ptrs.data());
  for (int bad : {10, -2}) {
    y[57] = bad;
    try {
      j.exec->run(ins, out_ptrs.data());
      ADD_FAILURE() << "an index of " << bad << " was not reported";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()), "job 't': t: labels holds " + std::to_string(bad) +
                                           " at [57], outside the valid range [0, 10)");
    }
  }
  y[57] = 9;
  j.exec->run(ins, out_ptrs.data());
  g_emulate = false;
  for (auto& e : fake::gpu().emu_errors) ADD_FAILURE() << e;
}

// [harden] A train step whose labels fail their check, on the GPU (kernels
// run by the emulator): its launches are queued before anything is known, so
// the kernels that write variables after the check return at once when the
// status is set; the weights, the optimizer state and the step counter stay
// as they were, and the next good step matches the CPU's.
TEST(NvptxEmulated, AFailedCheckLeavesTheVariablesOfATrainStepUnchanged) {
#ifndef FLOWJIT_HAVE_EMULATOR
  GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
#endif
  fake::gpu() = fake::Gpu();
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::Adam, 8, 56, 16, 10, true);
  jit::FusedProgram fp = fuse_graph(t.g, "t");
  ASSERT_GE(fp.plan.status_offset, 0) << "the labels are checked";
  size_t guarded = 0;
  for (const auto& k : fp.kernels) guarded += k.guard_arg >= 0;
  EXPECT_GT(guarded, 0u) << fp.description;
  // Nothing of it in a job without checks.
  for (const auto& k :
       fuse_graph(train_step(jit::OptimizerConfig::Kind::Adam, 8, 56, 16, 10).g, "u").kernels)
    EXPECT_EQ(k.guard_arg, -1) << k.name;
  nv::CompileOptions o = emulator_options(80, "t");
  nv::CompiledModule mod = nv::compile(fp.kernels, fp.plan.launches, o);
  emu_register(mod, fp.kernels);
  runtime::VariableStore cpu_store, gpu_store;
  fill_store(cpu_store, fp);
  fill_store(gpu_store, fp);
  jit::JobDescription job = train_job(t);
  jit::CompiledJob cpu = jit::compile_job(job, jit::CompileSettings{}, cpu_store);
  auto dev = rc::Device::open(0, &fake::api());
  jit::CompileSettings s = gpu_settings(dev, "");
  s.target.run_ptxas = false;
  s.target.math = nv::MathLibrary::Builtin;
  jit::CompiledJob gpu = jit::compile_job(job, s, gpu_store);
  auto run_cpu = [&](const void* const* i, void* const* o) { cpu.program->run(i, o); };
  auto run_gpu = [&](const void* const* i, void* const* o) { gpu_of(gpu).run(i, o); };
  auto bad_step = [](const RunFn& run) {
    std::vector<float> images(8 * 56, 0.5f), loss(8);
    std::vector<int32_t> labels(8, 1);
    labels[5] = 10;
    const void* ins[] = {images.data(), labels.data()};
    void* outs[] = {loss.data()};
    try {
      run(ins, outs);
      ADD_FAILURE() << "the label 10 of 10 classes was not reported";
    } catch (const UserError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Index) << e.what();
      EXPECT_NE(std::string(e.what()).find("holds 10 at [5]"), std::string::npos) << e.what();
    }
  };
  auto snapshot = [](runtime::VariableStore& store) {
    std::map<std::string, std::vector<char>> out;
    for (auto* v : store.all()) {
      runtime::sync_host(*v);
      const char* p = static_cast<const char*>(v->ptr());
      out[v->name] = std::vector<char>(p, p + v->type.bytes());
    }
    return out;
  };
  TensorType loss_t{DType::Float32, {8}};
  auto expect_same_loss = [&](int step) {
    std::vector<float> want = step_loss(run_cpu, step), got = step_loss(run_gpu, step);
    std::vector<char> w(reinterpret_cast<char*>(want.data()),
                        reinterpret_cast<char*>(want.data() + 8)),
        g(reinterpret_cast<char*>(got.data()), reinterpret_cast<char*>(got.data() + 8));
    std::string d = compare(g, w, loss_t, 1e-4, 1e-5);
    EXPECT_TRUE(d.empty()) << "step " << step << ": " << d;
  };
  expect_same_loss(0);
  auto before = snapshot(gpu_store);
  ASSERT_EQ(before.size(), fp.plan.variables.size());
  bad_step(run_gpu);
  bad_step(run_cpu);
  auto after = snapshot(gpu_store);
  for (auto& [name, bytes] : before)
    EXPECT_TRUE(after[name] == bytes) << "variable '" << name << "' changed in the failed step";
  auto cpu_after = snapshot(cpu_store);
  for (auto& [name, bytes] : cpu_after)
    EXPECT_TRUE(compare(after[name], bytes, cpu_store.find(name)->type, 1e-4, 1e-5).empty())
        << "variable '" << name << "' differs from the CPU's";
  expect_same_loss(1);  // a good step after the failed one
  expect_same_loss(2);
  auto gpu_end = snapshot(gpu_store), cpu_end = snapshot(cpu_store);
  for (auto& [name, bytes] : cpu_end) {
    std::string d = compare(gpu_end[name], bytes, cpu_store.find(name)->type, 1e-4, 1e-5);
    EXPECT_TRUE(d.empty()) << "variable '" << name << "': " << d;
  }
  for (auto& e : fake::gpu().emu_errors) ADD_FAILURE() << e;
}

// compile_job's GPU path with the GPU kernels themselves run by the SIMT
// emulator (the fake driver finds them by their PTX), against the CPU.
TEST(NvptxEmulated, CompileJobOnTheGpuMatchesTheCpu) {
#ifndef FLOWJIT_HAVE_EMULATOR
  GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
#endif
  fake::gpu() = fake::Gpu();
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::SGD, 8, 56, 16, 10);
  jit::FusedProgram fp = fuse_graph(t.g, "t");
  // The module compile_job will make (same kernels, same options), for the emulator.
  nv::CompileOptions o = emulator_options(80, "t");
  nv::CompiledModule mod = compile_with(fp.kernels, o);
  emu_register(mod, fp.kernels);
  runtime::VariableStore cpu_store, gpu_store;
  fill_store(cpu_store, fp);
  fill_store(gpu_store, fp);
  jit::JobDescription job = train_job(t);
  jit::CompiledJob cpu = jit::compile_job(job, jit::CompileSettings{}, cpu_store);
  auto dev = rc::Device::open(0, &fake::api());
  jit::CompileSettings s = gpu_settings(dev, "");
  s.target.run_ptxas = false;
  s.target.math = nv::MathLibrary::Builtin;
  jit::CompiledJob gpu = jit::compile_job(job, s, gpu_store);
  EXPECT_EQ(gpu.gpu_loaded_from, "ptx (driver JIT for sm_80)");
  size_t launches_before = fake::gpu().launches.size();
  auto run_cpu = [&](const void* const* i, void* const* o) { cpu.program->run(i, o); };
  auto run_gpu = [&](const void* const* i, void* const* o) { gpu_of(gpu).run(i, o); };
  TensorType loss_t{DType::Float32, {8}};
  for (int step = 0; step < 2; ++step) {
    std::vector<float> want = step_loss(run_cpu, step), got = step_loss(run_gpu, step);
    auto bytes = [](std::vector<float>& f) {
      char* p = reinterpret_cast<char*>(f.data());
      return std::vector<char>(p, p + 8 * sizeof(float));
    };
    std::vector<char> w = bytes(want), g = bytes(got);
    std::string d = compare(g, w, loss_t, 1e-4, 1e-5);
    EXPECT_TRUE(d.empty()) << "step " << step << ": " << d;
  }
  EXPECT_EQ(fake::gpu().launches.size() - launches_before, 2 * fp.plan.launches.size());
  for (auto& e : fake::gpu().emu_errors) ADD_FAILURE() << e;
  for (auto* v : cpu_store.all()) {
    auto* g = gpu_store.find(v->name);
    runtime::sync_host(*g);
    std::vector<char> gb(g->ptr(), g->ptr() + g->type.bytes());
    std::vector<char> wb(v->ptr(), v->ptr() + v->type.bytes());
    std::string d = compare(gb, wb, v->type, 1e-4, 1e-5);
    EXPECT_TRUE(d.empty()) << v->name << ": " << d;
  }
}

// ---------------------------------------------------------------- several GPUs

// Jobs spread over several GPUs (jit::make_distributed on a GPU target): one
// CudaExecutable per fake GPU with its kernels run by the SIMT emulator, the
// collectives by an NcclCommunicator over the fake NCCL of
// tests/cpp/fake_nccl.h, with the layouts, boxing and bucketing of the CPU
// devices; results against the same job on one CPU device.
namespace {

namespace fnccl = flowjit::testing::fake_nccl;

// Points the fake NCCL at this file's fake driver for one test, fresh.
class FakeNcclOnThisDriver {
 public:
  FakeNcclOnThisDriver() : saved_(fnccl::hooks()) {
    fnccl::Hooks& h = fnccl::hooks();
    h.device_of_stream = fake::device_of;
    h.current_device = fake::current_device;
    h.is_device_memory = fake::is_device_memory;
    h.hang = [] {
      std::lock_guard<std::recursive_mutex> lock(fake::g_mu);
      return fake::gpu().hang;
    };
    h.aborted = [](int device) {
      std::lock_guard<std::recursive_mutex> lock(fake::g_mu);
      fake::gpu().aborted_devices.insert(device);
    };
    h.enqueued = [](rc::CUstream s, const std::string& what, uintptr_t send, size_t send_bytes,
                    uintptr_t recv, size_t recv_bytes) {
      std::lock_guard<std::recursive_mutex> lock(fake::g_mu);
      fake::run_on(s, what, true,
                   {fake::bytes_at(send, send_bytes), fake::bytes_at(recv, recv_bytes)});
    };
    std::lock_guard<std::mutex> lock(fnccl::nccl().mu);
    fnccl::nccl().calls.clear();
    fnccl::nccl().fail_rank = -1;
  }
  ~FakeNcclOnThisDriver() { fnccl::hooks() = saved_; }
  FakeNcclOnThisDriver(const FakeNcclOnThisDriver&) = delete;
  FakeNcclOnThisDriver& operator=(const FakeNcclOnThisDriver&) = delete;

  static rc::NcclOptions options() {
    rc::NcclOptions o;
    o.nccl = &fnccl::api();
    return o;
  }
  // How many NCCL calls began with `name`.
  static int calls(const std::string& name) {
    std::lock_guard<std::mutex> lock(fnccl::nccl().mu);
    int n = 0;
    for (const std::string& c : fnccl::nccl().calls) n += c.rfind(name, 0) == 0;
    return n;
  }

 private:
  fnccl::Hooks saved_;
};

// The module compile_job makes for the per-device program of `job`, given
// to the emulator (which finds kernels by their module's PTX).
void emulate_per_device_program(const jit::JobDescription& job) {
  Graph g = job.graph;
  g.name = job.name;
  jit::PassLog log;
  Graph opt = jit::optimize(g, log, jit::OptimizeOptions{true, true});
  if (job.distribution.parts > 1) opt = jit::distribute(opt, job.distribution).local;
  jit::FusionOptions fo;
  fo.devices = std::max(1, job.distribution.parts);  // status all_gathers, guards of every device
  jit::FusedProgram fp = jit::fuse(opt, job.name, fo);
  std::vector<codegen::Kernel> coded;  // the emulator's entry points: kernels with code
  for (auto& k : fp.kernels)
    if (k.kind != codegen::Kernel::Kind::Collective) coded.push_back(k);
  nv::CompileOptions o = emulator_options(80, job.name);
  emu_register(nv::compile(fp.kernels, fp.plan.launches, o), coded);
}

// One process's GPUs of a distributed job: devices, the variables' GPU
// copies, and the per-device stores that hold the copies' host side.
struct Gpus {
  std::vector<std::shared_ptr<rc::Device>> devs;
  std::vector<std::shared_ptr<rc::DeviceVariables>> copies;
  std::vector<std::unique_ptr<runtime::VariableStore>> stores;
  explicit Gpus(const std::vector<int>& ordinals) {
    for (int o : ordinals) {
      devs.push_back(rc::Device::open(o, &fake::api()));
      copies.push_back(std::make_shared<rc::DeviceVariables>(devs.back()));
      stores.push_back(std::make_unique<runtime::VariableStore>());
    }
  }
  std::vector<runtime::VariableStore*> store_ptrs() const {
    std::vector<runtime::VariableStore*> out;
    for (auto& s : stores) out.push_back(s.get());
    return out;
  }
};

// compile_job for the GPU (emulated) and the job's executable over `gpus`.
std::shared_ptr<runtime::DistributedExecutable> on_gpus(const jit::JobDescription& job, Gpus& gpus,
                                                        runtime::VariableStore& host,
                                                        std::shared_ptr<runtime::Communicator> comm,
                                                        int first_rank, bool several_processes) {
  jit::CompileSettings s = gpu_settings(gpus.devs[0], "");
  s.target.run_ptxas = false;
  s.target.math = nv::MathLibrary::Builtin;
  jit::CompiledJob cj = jit::compile_job(job, s, host);
  EXPECT_NE(dynamic_cast<rc::CudaExecutable*>(cj.program.get()), nullptr);
  return jit::make_distributed(
      cj, host, gpus.store_ptrs(), std::move(comm), first_rank, several_processes,
      std::vector<std::shared_ptr<runtime::DeviceState>>(gpus.copies.begin(), gpus.copies.end()));
}

struct Batch {
  std::vector<float> images;
  std::vector<int32_t> labels;
};
Batch batch_of(int64_t batch, int step) {
  Batch b{std::vector<float>(static_cast<size_t>(batch * 56)),
          std::vector<int32_t>(static_cast<size_t>(batch))};
  fill_deterministic(b.images.data(), {DType::Float32, {batch, 56}}, 100 + step);
  for (int64_t i = 0; i < batch; ++i) b.labels[i] = static_cast<int32_t>((i * 7 + step) % 10);
  return b;
}
std::vector<float> train_loss(runtime::Program& p, const Batch& b) {
  std::vector<float> loss(b.labels.size());
  const void* ins[] = {b.images.data(), b.labels.data()};
  void* outs[] = {loss.data()};
  p.run(ins, outs);
  return loss;
}

std::vector<char> bytes_of(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  return std::vector<char>(c, c + n);
}

// Every variable of `want` in `got` (read as the host does), within float tolerance.
void expect_same_variables(runtime::VariableStore& got, runtime::VariableStore& want,
                           const std::string& what) {
  for (auto* v : want.all()) {
    auto* g = got.find(v->name);
    ASSERT_NE(g, nullptr) << what << ": " << v->name;
    runtime::sync_host(*g);
    runtime::sync_host(*v);  // `want` may be distributed too (CPU devices)
    size_t n = static_cast<size_t>(v->type.bytes());
    std::string d = compare(bytes_of(g->ptr(), n), bytes_of(v->ptr(), n), v->type, 1e-4, 1e-5);
    EXPECT_TRUE(d.empty()) << what << ": " << v->name << ": " << d;
  }
}

// A train step (hidden layer of `hidden` units, batch `batch`) on `n` GPUs
// of one process, `steps` times, against one CPU device.
void check_train_on_gpus(int n, int64_t batch, int64_t hidden,
                         const std::map<std::string, int>& split_vars) {
  SCOPED_TRACE(std::to_string(n) + " GPUs");
  fake::gpu() = fake::Gpu();
  fake::gpu().devices = n;
  FakeNcclOnThisDriver fake_nccl;
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::SGD, batch, 56, hidden, 10);
  jit::FusedProgram fp = fuse_graph(t.g, "t");
  runtime::VariableStore cpu_store, host;
  fill_store(cpu_store, fp);
  fill_store(host, fp);
  jit::JobDescription one = train_job(t);
  jit::CompiledJob cpu = jit::compile_job(one, jit::CompileSettings{}, cpu_store);
  jit::JobDescription job = one;
  job.distribution.parts = n;
  job.distribution.split_vars = split_vars;
  emulate_per_device_program(job);
  std::vector<int> ordinals;
  for (int d = 0; d < n; ++d) ordinals.push_back(d);
  {
    Gpus gpus(ordinals);
    auto comm = rc::NcclCommunicator::create(gpus.devs, FakeNcclOnThisDriver::options());
    auto dist = on_gpus(job, gpus, host, comm, 0, false);
    EXPECT_EQ(dist->device(), n == 2 ? "gpu:0,1" : "gpu:0,1,2");
    TensorType loss_t{DType::Float32, {batch}};
    for (int step = 0; step < 3; ++step) {
      Batch b = batch_of(batch, step);
      std::vector<float> want = train_loss(*cpu.program, b), got = train_loss(*dist, b);
      size_t bytes = want.size() * sizeof(float);
      std::string d =
          compare(bytes_of(got.data(), bytes), bytes_of(want.data(), bytes), loss_t, 1e-4, 1e-5);
      EXPECT_TRUE(d.empty()) << "step " << step << ": " << d;
    }
    EXPECT_TRUE(gpus.copies[0]->holds_newest(*gpus.stores[0]->find("hidden-weight")))
        << "the trained weights stay on the GPUs until the host reads them";
    expect_same_variables(host, cpu_store, "after 3 steps");
    // A host write (a checkpoint load) reaches every GPU before its next run.
    for (auto* store : {&host, &cpu_store}) {
      auto* w = store->find("output-weight");
      runtime::sync_host(*w);
      fill_deterministic(w->ptr(), w->type, 4242);
      runtime::mark_host_written(*w);
    }
    Batch b = batch_of(batch, 3);
    std::vector<float> want = train_loss(*cpu.program, b), got = train_loss(*dist, b);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << i;
    expect_same_variables(host, cpu_store, "after a host write");
    // A job on GPU 0 alone continues from what the GPUs trained (through the
    // host), and the GPUs from what it trained.
    {
      emulate_per_device_program(one);
      jit::CompileSettings s1 = gpu_settings(gpus.devs[0], "");
      s1.target.run_ptxas = false;
      s1.target.math = nv::MathLibrary::Builtin;
      jit::CompiledJob single = jit::compile_job(one, s1, host);
      for (int step = 4; step < 7; ++step) {
        runtime::Program& p = step == 5 ? *single.program : *dist;
        Batch b = batch_of(batch, step);
        std::vector<float> want = train_loss(*cpu.program, b), got = train_loss(p, b);
        for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << step;
      }
      expect_same_variables(host, cpu_store, "after a job on one GPU between");
    }
    // The variables live on these GPUs: a job over other devices cannot share them.
    runtime::VariableStore elsewhere;
    auto* b1 = host.find("hidden-bias");
    try {
      runtime::attach_replicas(*b1, -1, n, 0, {elsewhere.get_or_create(b1->name, b1->type, true)});
      ADD_FAILURE() << "a variable was distributed over two sets of devices";
    } catch (const UserError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::NotImplemented);
      EXPECT_NE(std::string(e.what()).find("used by jobs spread over different devices"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(fake::gpu().current, 0) << "every context push is popped";
  }
  for (auto& e : fake::gpu().emu_errors) ADD_FAILURE() << e;
  for (auto& h : fake::gpu().hazards) ADD_FAILURE() << "missing event edge: " << h;
  EXPECT_TRUE(fake::gpu().device_blocks.empty()) << "device memory returned to the driver";
  EXPECT_EQ(fake::gpu().retained, 0) << "the primary contexts are released";
}

bool emulator_missing() {
#ifdef FLOWJIT_HAVE_EMULATOR
  return false;
#else
  return true;
#endif
}

}  // namespace

TEST(NvptxMultiGpu, DataParallelTrainStepMatchesOneDevice) {
  if (emulator_missing()) GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
  for (int n : {2, 3}) {
    // 7 hidden units: gradients of odd sizes (7, 7x56, 10x7), bucketed.
    check_train_on_gpus(n, 12, 7, {});
    EXPECT_GT(FakeNcclOnThisDriver::calls("ncclAllReduce"), 0);
    EXPECT_GT(FakeNcclOnThisDriver::calls("ncclGroupStart"), 0)
        << "adjacent gradients go as one bucket (one NCCL group)";
  }
}

TEST(NvptxMultiGpu, SplitWeightIsGatheredAndItsGradientReduceScattered) {
  if (emulator_missing()) GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
  for (int n : {2, 3}) {
    check_train_on_gpus(n, 6, 6, {{"hidden-weight", 0}});
    EXPECT_GT(FakeNcclOnThisDriver::calls("ncclAllGather"), 0);
    EXPECT_GT(FakeNcclOnThisDriver::calls("ncclReduceScatter"), 0);
  }
}

// Reductions over the split rows of every dtype the GPU reduces: partial
// sums all_reduced, maxima gathered (all_gather), rows returned in place.
TEST(NvptxMultiGpu, ReductionsOfEveryDtypeMatchOneDevice) {
  if (emulator_missing()) GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
  for (DType dt : {DType::Float32, DType::Float64, DType::Int32, DType::Int64}) {
    for (int n : {2, 3}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " on " + std::to_string(n) + " GPUs");
      fake::gpu() = fake::Gpu();
      fake::gpu().devices = n;
      FakeNcclOnThisDriver fake_nccl;
      auto x = param("x", 0, {6, 5}, dt);
      Graph g =
          make_graph({x}, {reduce(OpKind::ReduceSum, x, {0}, false),
                           reduce(OpKind::ReduceMax, x, {0}, false), binary(OpKind::Add, x, x)});
      jit::JobDescription job;
      job.name = "r";
      job.graph = g;
      runtime::VariableStore cpu_store, host;
      jit::CompiledJob cpu = jit::compile_job(job, jit::CompileSettings{}, cpu_store);
      job.distribution.parts = n;
      emulate_per_device_program(job);
      std::vector<int> ordinals;
      for (int d = 0; d < n; ++d) ordinals.push_back(d);
      Gpus gpus(ordinals);
      auto comm = rc::NcclCommunicator::create(gpus.devs, FakeNcclOnThisDriver::options());
      auto dist = on_gpus(job, gpus, host, comm, 0, false);
      // Small integers (negative too): sums are exact in any order.
      TensorType xt{dt, {6, 5}};
      std::vector<char> in(static_cast<size_t>(xt.bytes()));
      for (int64_t i = 0; i < 30; ++i) {
        int v = static_cast<int>((i * 37) % 23) - 11;
        switch (dt) {
          case DType::Float32:
            reinterpret_cast<float*>(in.data())[i] = static_cast<float>(v);
            break;
          case DType::Float64:
            reinterpret_cast<double*>(in.data())[i] = v;
            break;
          case DType::Int32:
            reinterpret_cast<int32_t*>(in.data())[i] = v;
            break;
          default:
            reinterpret_cast<int64_t*>(in.data())[i] = int64_t{v} << 33;  // beyond 32 bits
        }
      }
      std::vector<TensorType> out_t = {{dt, {5}}, {dt, {5}}, {dt, {6, 5}}};
      std::vector<std::vector<char>> want, got;
      for (auto& t : out_t) {
        want.emplace_back(static_cast<size_t>(t.bytes()));
        got.emplace_back(static_cast<size_t>(t.bytes()), 0x5a);
      }
      const void* ins[] = {in.data()};
      void* want_p[] = {want[0].data(), want[1].data(), want[2].data()};
      void* got_p[] = {got[0].data(), got[1].data(), got[2].data()};
      cpu.program->run(ins, want_p);
      dist->run(ins, got_p);
      for (size_t o = 0; o < 3; ++o) EXPECT_EQ(got[o], want[o]) << "output " << o;
      EXPECT_GT(FakeNcclOnThisDriver::calls("ncclAllReduce"), 0);
      EXPECT_GT(FakeNcclOnThisDriver::calls("ncclAllGather"), 0);
      for (auto& e : fake::gpu().emu_errors) ADD_FAILURE() << e;
      for (auto& h : fake::gpu().hazards) ADD_FAILURE() << "missing event edge: " << h;
    }
  }
}

// A GPU whose collective fails stops the job on every GPU with that error
// (the others were waiting for it: they are aborted, not left hanging), and
// later runs fail at once.
TEST(NvptxMultiGpu, ARankFailingStopsEveryRankWithItsError) {
  if (emulator_missing()) GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
  fake::gpu() = fake::Gpu();
  fake::gpu().devices = 2;
  FakeNcclOnThisDriver fake_nccl;
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::SGD, 8, 56, 6, 10);
  runtime::VariableStore host;
  fill_store(host, fuse_graph(t.g, "t"));
  jit::JobDescription job = train_job(t);
  job.distribution.parts = 2;
  emulate_per_device_program(job);
  Gpus gpus({0, 1});
  auto comm = rc::NcclCommunicator::create(gpus.devs, FakeNcclOnThisDriver::options());
  auto dist = on_gpus(job, gpus, host, comm, 0, false);
  fake::gpu().hang = true;  // GPU 0's collective waits for GPU 1's, which never comes
  fnccl::nccl().fail_rank = 1;
  Batch b = batch_of(8, 0);
  try {
    train_loss(*dist, b);
    ADD_FAILURE() << "the failed collective was not reported";
  } catch (const UserError& e) {
    std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    // GPU 0's error (raised first, by device order) names GPU 1's.
    EXPECT_EQ(what.rfind("a collective was aborted: NCCL call ncclAllReduce failed: ", 0), 0u)
        << what;
    EXPECT_NE(what.find("fake: rank 1 refuses"), std::string::npos) << what;
    EXPECT_NE(what.find("on rank 1 (GPU 1)"), std::string::npos) << what;
  }
  {
    std::lock_guard<std::recursive_mutex> lock(fake::g_mu);
    EXPECT_EQ(fake::gpu().aborted_devices, (std::set<int>{0, 1})) << "both GPUs' NCCL aborted";
  }
  fake::gpu().hang = false;
  fnccl::nccl().fail_rank = -1;
  try {
    train_loss(*dist, b);
    ADD_FAILURE() << "ran on an aborted communicator";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("a collective was aborted"), std::string::npos)
        << e.what();
  }
}

// [harden] A bad label in one GPU's half of the batch: the GPUs all-gather
// their status words after the last check (jit/fusion/schedule.cpp), the
// guarded updates skip on every GPU, and every GPU raises the same
// IndexError from the gathered words, naming the position in the whole
// batch; the communicator is not aborted and the next step trains on.
TEST(NvptxMultiGpu, AFailedCheckOnOneGpuIsReportedByEveryGpuWithTheLogicalPosition) {
  if (emulator_missing()) GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
  fake::gpu() = fake::Gpu();
  fake::gpu().devices = 2;
  FakeNcclOnThisDriver fake_nccl;
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::SGD, 8, 56, 6, 10, true);
  runtime::VariableStore cpu_store, host;
  fill_store(cpu_store, fuse_graph(t.g, "t"));
  fill_store(host, fuse_graph(t.g, "t"));
  jit::JobDescription one = train_job(t);
  jit::CompiledJob cpu = jit::compile_job(one, jit::CompileSettings{}, cpu_store);
  jit::JobDescription job = one;
  job.distribution.parts = 2;
  emulate_per_device_program(job);
  {
    Gpus gpus({0, 1});
    auto comm = rc::NcclCommunicator::create(gpus.devs, FakeNcclOnThisDriver::options());
    auto dist = on_gpus(job, gpus, host, comm, 0, false);
    auto same_loss = [&](int step) {
      Batch b = batch_of(8, step);
      std::vector<float> want = train_loss(*cpu.program, b), got = train_loss(*dist, b);
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << step;
    };
    same_loss(0);
    std::map<std::string, std::vector<char>> before;
    for (auto* v : host.all()) {
      runtime::sync_host(*v);
      before[v->name] = bytes_of(v->ptr(), static_cast<size_t>(v->type.bytes()));
    }
    for (int bad_row : {5, 2}) {  // GPU 1's local row 1, then GPU 0's row 2
      Batch b = batch_of(8, 1);
      b.labels[bad_row] = 10;
      for (int again = 0; again < 2; ++again) {
        try {
          train_loss(*dist, b);
          ADD_FAILURE() << "the label 10 of 10 classes was not reported";
        } catch (const runtime::FailedCheckOnEveryDevice& e) {
          EXPECT_EQ(e.kind(), ErrorKind::Index);
          EXPECT_EQ(std::string(e.what()), "job 't': t: labels holds 10 at [" +
                                               std::to_string(bad_row) +
                                               "], outside the valid range [0, 10)");
        } catch (const UserError& e) {
          ADD_FAILURE() << "not raised alike on every GPU: " << e.what();
        }
      }
    }
    {
      std::lock_guard<std::recursive_mutex> lock(fake::g_mu);
      EXPECT_TRUE(fake::gpu().aborted_devices.empty()) << "the communicator was aborted";
    }
    EXPECT_GT(FakeNcclOnThisDriver::calls("ncclAllGather"), 0);
    for (auto* v : host.all()) {
      runtime::sync_host(*v);
      EXPECT_TRUE(bytes_of(v->ptr(), static_cast<size_t>(v->type.bytes())) == before[v->name])
          << "variable '" << v->name << "' changed in a failed step";
    }
    same_loss(1);  // as on one device that never saw the bad steps
    same_loss(2);
    expect_same_variables(host, cpu_store, "after the failed steps");
  }
  for (auto& e : fake::gpu().emu_errors) ADD_FAILURE() << e;
  for (auto& h : fake::gpu().hazards) ADD_FAILURE() << "missing event edge: " << h;
}

// GPU jobs in a session over several processes: each process (a thread
// here, with its own session store) drives one GPU as its rank of one NCCL
// communicator made from a shared unique id; split variables are gathered
// into every process's host after each run, through the GPU.
namespace {
void check_processes(const std::vector<std::vector<int>>& gpus_of) {
  const int procs = static_cast<int>(gpus_of.size());
  std::vector<int> first;  // each process's first NCCL rank
  int world = 0;
  for (auto& g : gpus_of) {
    first.push_back(world);
    world += static_cast<int>(g.size());
  }
  const int64_t batch = 6;
  fake::gpu() = fake::Gpu();
  fake::gpu().devices = world;
  FakeNcclOnThisDriver fake_nccl;
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::SGD, batch, 56, 6, 10);
  jit::FusedProgram fp = fuse_graph(t.g, "t");
  runtime::VariableStore cpu_store;
  fill_store(cpu_store, fp);
  jit::JobDescription one = train_job(t);
  jit::CompiledJob cpu = jit::compile_job(one, jit::CompileSettings{}, cpu_store);
  jit::JobDescription job = one;
  job.distribution.parts = world;
  job.distribution.split_vars = {{"hidden-weight", 0}};
  job.distribution.whole_outputs = true;
  emulate_per_device_program(job);
  rc::ncclUniqueId id = rc::nccl_unique_id(&fnccl::api());
  std::vector<std::unique_ptr<runtime::VariableStore>> hosts;
  std::vector<std::unique_ptr<Gpus>> gpus;
  std::vector<std::shared_ptr<runtime::DistributedExecutable>> dist(procs);
  for (int p = 0; p < procs; ++p) {
    hosts.push_back(std::make_unique<runtime::VariableStore>());
    fill_store(*hosts.back(), fp);
    gpus.push_back(std::make_unique<Gpus>(gpus_of[p]));
  }
  std::vector<std::string> errors(procs);
  auto each_process = [&](const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int p = 0; p < procs; ++p)
      threads.emplace_back([&, p] {
        try {
          fn(p);
        } catch (const std::exception& e) {
          errors[p] = e.what();
        }
      });
    for (auto& th : threads) th.join();
    for (int p = 0; p < procs; ++p) EXPECT_EQ(errors[p], "") << "process " << p;
  };
  each_process([&](int p) {
    auto comm = rc::NcclCommunicator::create(id, world, first[p], gpus[p]->devs,
                                             FakeNcclOnThisDriver::options());
    dist[p] = on_gpus(job, *gpus[p], *hosts[p], comm, first[p], true);
  });
  for (auto& d : dist) ASSERT_TRUE(d);
  for (int step = 0; step < 2; ++step) {
    Batch b = batch_of(batch, step);
    std::vector<float> want = train_loss(*cpu.program, b);
    std::vector<std::vector<float>> got(procs);
    each_process([&](int p) { got[p] = train_loss(*dist[p], b); });
    for (int p = 0; p < procs; ++p)
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[p][i], want[i], 1e-4)
            << "process " << p << " step " << step << " row " << i;
  }
  auto* w = hosts[1]->find("hidden-weight");
  ASSERT_NE(w->replicas, nullptr);
  EXPECT_FALSE(w->replicas->host_stale) << "split pieces are gathered into every host after a run";
  for (int p = 0; p < procs; ++p)
    expect_same_variables(*hosts[p], cpu_store, "process " + std::to_string(p));
  EXPECT_GT(FakeNcclOnThisDriver::calls("ncclCommInitRank"), 1);
  dist.clear();
  for (auto& e : fake::gpu().emu_errors) ADD_FAILURE() << e;
  for (auto& h : fake::gpu().hazards) ADD_FAILURE() << "missing event edge: " << h;
}
}  // namespace

TEST(NvptxMultiGpu, ProcessesWithAGpuEachMatchOneDevice) {
  if (emulator_missing()) GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
  check_processes({{0}, {1}});
}

// Processes holding different numbers of the job's GPUs: process 0's are
// NCCL ranks 0 and 1, process 1's rank 2.
TEST(NvptxMultiGpu, ProcessesWithDifferentNumbersOfGpusMatchOneDevice) {
  if (emulator_missing()) GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
  check_processes({{0, 1}, {2}});
}

namespace {

// Sets an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// What the fake driver's log says about device `d`'s collectives: how many
// ran on each of its streams, and for those on the communication stream
// (stream 1), how many waited for an event recorded on the compute stream
// (0) before them and recorded one after them that the compute stream
// waited for later, and how many kernels the compute stream ran between.
struct CollectiveEdges {
  int on_compute = 0, on_comm = 0, with_both_edges = 0, kernels_between = 0;
  int compute_waits = 0;  // "d:0 wait" entries
};
CollectiveEdges collective_edges(int d) {
  const std::vector<std::string>& log = fake::gpu().log;
  const std::string compute = std::to_string(d) + ":0 ", comm = std::to_string(d) + ":1 ";
  auto is = [](const std::string& line, const std::string& prefix) {
    return line.rfind(prefix, 0) == 0;
  };
  CollectiveEdges e;
  for (const std::string& line : log) e.compute_waits += is(line, compute + "wait ");
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].find(" nccl") == std::string::npos) continue;
    if (is(log[i], compute)) ++e.on_compute;
    if (!is(log[i], comm)) continue;
    ++e.on_comm;
    // Before it on the comm stream: a wait for an event the compute stream recorded.
    std::string waited;
    for (size_t j = i; j-- > 0;) {
      if (is(log[j], comm + "wait ")) {
        waited = log[j].substr(comm.size() + 5);
        break;
      }
    }
    bool produced = false;
    for (size_t j = 0; j < i && !waited.empty(); ++j)
      produced |= log[j] == compute + "record " + waited;
    // After it: the comm stream records an event, the compute stream waits for it.
    size_t rec = i;
    while (rec < log.size() && !is(log[rec], comm + "record ")) ++rec;
    if (rec == log.size()) continue;
    std::string done = log[rec].substr(comm.size() + 7);
    size_t w = rec;
    int kernels = 0;
    while (w < log.size() && log[w] != compute + "wait " + done)
      kernels += is(log[w++], compute + "kernel ");
    if (produced && w < log.size()) {
      ++e.with_both_edges;
      e.kernels_between += kernels;
    }
  }
  return e;
}

}  // namespace

// Overlap on GPUs: each collective runs on the device's communication
// stream between two event edges (after its producers on the compute stream;
// before its first consumer there), while later kernels run beside it; with
// FLOWJIT_OVERLAP=0 everything stays on the compute stream. Results equal
// one CPU device both ways (check_train_on_gpus), and the fake driver finds
// no operation touching memory that one on the other stream touches without
// an edge between them.
TEST(NvptxMultiGpu, OverlapRunsCollectivesOnTheCommunicationStream) {
  if (emulator_missing()) GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
  for (const char* setting : {static_cast<const char*>(nullptr), "0"}) {
    const bool overlap = setting == nullptr;
    for (bool split : {false, true}) {
      SCOPED_TRACE(std::string(overlap ? "overlap" : "FLOWJIT_OVERLAP=0") +
                   (split ? ", split weight" : ""));
      ScopedEnv env("FLOWJIT_OVERLAP", setting);
      std::map<std::string, int> split_vars;
      if (split) split_vars["hidden-weight"] = 0;
      check_train_on_gpus(2, split ? 6 : 12, split ? 6 : 7, split_vars);
      for (int d = 0; d < 2; ++d) {
        CollectiveEdges e = collective_edges(d);
        if (!overlap) {
          EXPECT_EQ(e.on_comm, 0) << "GPU " << d;
          EXPECT_GT(e.on_compute, 0) << "GPU " << d;
          EXPECT_EQ(e.compute_waits, 0) << "GPU " << d;
        } else {
          EXPECT_EQ(e.on_compute, 0) << "GPU " << d << ": every collective on the comm stream";
          EXPECT_GT(e.on_comm, 0) << "GPU " << d;
          EXPECT_GT(e.with_both_edges, 0) << "GPU " << d;
          EXPECT_GT(e.kernels_between, 0)
              << "GPU " << d << ": kernels run while a collective is in flight";
        }
      }
      if (overlap)
        EXPECT_GT(fake::gpu().kernels_beside_collectives, 0);
      else
        EXPECT_EQ(fake::gpu().kernels_beside_collectives, 0);
    }
  }
}

// The fake driver's ordering check fails when an edge is missing: a
// collective on the communication stream that does not wait for its
// producer on the compute stream, or a consumer there that does not wait
// for the collective's completion.
TEST(NvptxMultiGpu, TheFakeDriverReportsAMissingEventEdge) {
  fake::gpu() = fake::Gpu();
  FakeNcclOnThisDriver fake_nccl;
  auto dev = rc::Device::open(0, &fake::api());
  const rc::DriverApi& api = fake::api();
  {
    rc::Device::Scope scope(*dev);
    rc::DeviceBuffer grad(dev, 64), sum(dev, 64);
    std::vector<char> host(64, 1);
    rc::CUevent produced = nullptr, completed = nullptr;
    ASSERT_EQ(api.cuEventCreate(&produced, 0), 0);
    ASSERT_EQ(api.cuEventCreate(&completed, 0), 0);
    for (int edges : {0, 1, 2}) {
      SCOPED_TRACE(std::to_string(edges) + " edges");
      fake::gpu().hazards.clear();
      api.cuMemcpyHtoDAsync(grad.ptr(), host.data(), 64, dev->stream());  // the producer
      if (edges >= 1) {
        api.cuEventRecord(produced, dev->stream());
        api.cuStreamWaitEvent(dev->comm_stream(), produced, 0);
      }
      fnccl::hooks().enqueued(dev->comm_stream(), "ncclAllReduce", grad.ptr(), 64, sum.ptr(), 64);
      api.cuEventRecord(completed, dev->comm_stream());
      if (edges >= 2) api.cuStreamWaitEvent(dev->stream(), completed, 0);
      api.cuMemcpyDtoHAsync(host.data(), sum.ptr(), 64, dev->stream());  // the consumer
      const auto& h = fake::gpu().hazards;
      if (edges == 2) {
        EXPECT_TRUE(h.empty()) << h.front();
      } else {
        ASSERT_FALSE(h.empty());
        EXPECT_NE(h.front().find(edges == 0 ? "ncclAllReduce on stream 0:1 is not ordered after "
                                              "cuMemcpyHtoDAsync on stream 0:0"
                                            : "cuMemcpyDtoHAsync on stream 0:0 is not ordered "
                                              "after ncclAllReduce on stream 0:1"),
                  std::string::npos)
            << h.front();
      }
      api.cuStreamSynchronize(dev->stream());
      api.cuStreamSynchronize(dev->comm_stream());
    }
    api.cuEventDestroy(produced);
    api.cuEventDestroy(completed);
  }
}

// The mirrored view on several GPUs: each GPU takes its own batch and gives
// its own loss (per-device inputs and outputs), and the gradients are
// averaged by an all_reduce before every GPU applies the same update;
// against the same job on as many CPU devices.
TEST(NvptxMultiGpu, MirroredViewMatchesAsManyCpuDevices) {
  if (emulator_missing()) GTEST_SKIP() << "the SIMT emulator switches stacks with x86-64 code";
  const int n = 2;
  const int64_t batch = 6;
  fake::gpu() = fake::Gpu();
  fake::gpu().devices = n;
  FakeNcclOnThisDriver fake_nccl;
  TrainGraph one = train_step(jit::OptimizerConfig::Kind::SGD, batch, 56, 7, 10);
  TrainGraph t = train_step(jit::OptimizerConfig::Kind::SGD, batch, 56, 7, 10, false, n);
  jit::FusedProgram fp = fuse_graph(one.g, "t");
  runtime::VariableStore cpu_host, host;
  fill_store(cpu_host, fp);
  fill_store(host, fp);
  jit::JobDescription job = train_job(t);
  job.distribution.parts = n;
  job.distribution.mirrored = true;
  jit::CompiledJob cpu = jit::compile_job(job, jit::CompileSettings{}, cpu_host);
  std::vector<std::unique_ptr<runtime::VariableStore>> cpu_stores;
  std::vector<runtime::VariableStore*> cpu_store_ptrs;
  for (int d = 0; d < n; ++d) {
    cpu_stores.push_back(std::make_unique<runtime::VariableStore>());
    cpu_store_ptrs.push_back(cpu_stores.back().get());
  }
  auto on_cpus = jit::make_distributed(cpu, cpu_host, cpu_store_ptrs,
                                       runtime::make_thread_communicator(n), 0, false);
  emulate_per_device_program(job);
  {
    Gpus gpus({0, 1});
    auto comm = rc::NcclCommunicator::create(gpus.devs, FakeNcclOnThisDriver::options());
    auto dist = on_gpus(job, gpus, host, comm, 0, false);
    ASSERT_EQ(dist->num_input_pointers(), 4u) << "an images and a labels array per GPU";
    ASSERT_EQ(dist->num_output_pointers(), 2u) << "a loss per GPU";
    for (int step = 0; step < 3; ++step) {
      Batch b0 = batch_of(batch, 2 * step), b1 = batch_of(batch, 2 * step + 1);
      const void* ins[] = {b0.images.data(), b1.images.data(), b0.labels.data(), b1.labels.data()};
      std::vector<std::vector<float>> want(n, std::vector<float>(batch)),
          got(n, std::vector<float>(batch, -1));
      void* want_p[] = {want[0].data(), want[1].data()};
      void* got_p[] = {got[0].data(), got[1].data()};
      on_cpus->run(ins, want_p);
      dist->run(ins, got_p);
      for (int d = 0; d < n; ++d)
        for (int64_t i = 0; i < batch; ++i)
          EXPECT_NEAR(got[d][i], want[d][i], 1e-4)
              << "step " << step << " GPU " << d << " row " << i;
    }
    expect_same_variables(host, cpu_host, "after 3 mirrored steps");
    EXPECT_GT(FakeNcclOnThisDriver::calls("ncclAllReduce"), 0) << "the gradients are averaged";
  }
  for (auto& e : fake::gpu().emu_errors) ADD_FAILURE() << e;
  for (auto& h : fake::gpu().hazards) ADD_FAILURE() << "missing event edge: " << h;
}
