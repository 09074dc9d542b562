// The attention families: scaled dot-product attention whose softmax is
// computed online, so no [Lq, Lk] score matrix is stored (ir/ops.def:
// attention, attention_grad; jit/passes/attention forms them).
//
// Params {groups, lq, lk, d, dv, causal, gdiv, gmod, gstride, qstride,
// kstride, part, scale bits, dropout bits, seed}: q is [groups, lq, d], k [groups, lk, d], v
// [groups, lk, dv] (every batch dim flattened into groups); the bias is read
// through its strides (attention.h), so a [T, T] mask or a [B, 1, 1, T]
// padding bias is never broadcast in memory. A causal kernel skips the keys
// after each query. Scores are s = scale * q.k + bias, p = exp(s - lse).
//
// The forward walks each query's keys in blocks, keeping the running max,
// the running sum and the output row (rescaled when the max grows), and
// writes each row's log-sum-exp beside it (ops.def). The backward reads lse
// and delta = sum(dout * out) per query (the standard
// flash-attention identities: dp = dout.v, ds = p (dp - delta)); dq's tasks
// own queries, dk's and dv's own keys, so no two tasks write one element and
// the sums do not depend on the threads.
//
// With dropout the output sums z p v, z = 0 or 1 / (1 - dropout) drawn
// from each score's counter (attention.h), while the running sum (and so
// lse) is the undropped softmax's. The backward draws the same z: dv sums
// z p dout, and ds = p (z dp - delta), delta still sum(dout * out).
#include "codegen/families/attention/attention.h"

#include <cstring>

#include <llvm/IR/IRBuilder.h>

#include "codegen/emit.h"
#include "codegen/family.h"
#include "ir/node.h"
#include "ir/printer.h"

namespace flowjit::codegen {

namespace {

std::vector<int64_t> params(const ir::Node& n) {
  // attention(q, kt, v, bias), attention_grad(q, k, v, bias, ...)
  const ir::Shape& q = n.input(0)->shape();
  const ir::Shape& v = n.input(2)->shape();
  const ir::Shape& bias = n.input(3)->shape();
  const size_t r = q.size(), nb = r - 2;
  const int64_t lk =
      n.op() == OpKind::AttentionGrad ? n.input(1)->shape()[r - 2] : n.input(1)->shape()[r - 1];
  // The run of bias batch dims equal to q's (ir/infer.cpp checks there is
  // at most one).
  size_t lo = nb, hi = nb;
  for (size_t i = 0; i < nb; ++i)
    if (bias[i] != 1 && lo == nb) lo = i;
  for (size_t i = lo; i < nb && bias[i] != 1; ++i) hi = i + 1;
  const int64_t lq = q[r - 2];
  const int64_t part =
      n.op() == OpKind::Attention ? AttentionParams::Out : 2 + n.attrs().get_int("wrt");
  auto bits = [](double x) {
    int64_t b;
    std::memcpy(&b, &x, sizeof(b));
    return b;
  };
  return {dims_product(q, 0, nb),
          lq,
          lk,
          q[r - 1],
          v[r - 1],
          n.attrs().get_bool("causal") ? 1 : 0,
          lo < hi ? dims_product(q, hi, nb) : 1,
          lo < hi ? dims_product(q, lo, hi) : 1,
          bias[r - 2] * bias[r - 1],
          bias[r - 2] == lq && lq != 1 ? bias[r - 1] : 0,
          bias[r - 1] == lk && lk != 1 ? 1 : 0,
          part,
          bits(n.attrs().get_float("scale")),
          bits(n.attrs().get_float("dropout")),
          n.attrs().get_int("seed")};
}

const char* part_name(AttentionParams::Part part) {
  switch (part) {
    case AttentionParams::Out:
      return "attention";
    case AttentionParams::DQ:
      return "attention dq";
    case AttentionParams::DK:
      return "attention dk";
    case AttentionParams::DV:
      return "attention dv";
    case AttentionParams::DScores:
      return "attention dscores";
    case AttentionParams::DKV:
      return "attention dkv";
  }
  return "attention ?";
}

std::string summary(const Kernel& k) {
  const AttentionParams p(k);
  return std::string(part_name(p.part)) + " of " + std::to_string(p.groups) + " x " +
         std::to_string(p.lq) + " queries over " + std::to_string(p.lk) + " keys, d " +
         std::to_string(p.d) + ", dv " + std::to_string(p.dv) + (p.causal ? ", causal" : "") +
         (p.dropout > 0 ? ", dropout " + ir::format_double(p.dropout) : "");
}

int64_t flops(const Kernel& k) {
  const AttentionParams p(k);
  // Score pairs seen (about half when causal), times the dot products and
  // updates per pair each part does.
  const int64_t pairs = p.groups * p.lq * p.lk / (p.causal ? 2 : 1);
  switch (p.part) {
    case AttentionParams::Out:
      return pairs * 2 * (p.d + p.dv);
    case AttentionParams::DV:
      return pairs * 2 * (p.d + p.dv);
    case AttentionParams::DKV:
      return pairs * 4 * (p.d + p.dv);
    default:
      return pairs * 2 * (2 * p.d + p.dv);
  }
}

}  // namespace

llvm::Value* dropout_factor(llvm::IRBuilderBase& b, MathProvider& math, const AttentionParams& p,
                            llvm::Value* counter, llvm::Type* type) {
  llvm::Value* u = math.random(b, OpKind::RandomUniform, counter,
                               b.getInt64(static_cast<uint64_t>(p.seed)), type);
  return b.CreateSelect(b.CreateFCmpOGE(u, llvm::ConstantFP::get(type, p.dropout)),
                        llvm::ConstantFP::get(type, 1.0 / (1.0 - p.dropout)),
                        llvm::ConstantFP::get(type, 0.0));
}

extern const KernelFamily attention_family{"attention", OpKind::Attention, params, summary, flops};
extern const KernelFamily attention_grad_family{"attention_grad", OpKind::AttentionGrad, params,
                                                summary, flops};

}  // namespace flowjit::codegen
