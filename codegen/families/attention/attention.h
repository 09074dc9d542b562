// The attention families' parameters, as their emitters read them
// (codegen/families/attention/attention.cpp says what they mean).
#pragma once

#include <cstring>
#include <vector>

#include "codegen/family.h"
#include "codegen/kernel.h"
#include "ir/error.h"

namespace llvm {
class IRBuilderBase;
class Type;
class Value;
}  // namespace llvm

namespace flowjit::codegen {

class MathProvider;

struct AttentionParams {
  // What the kernel writes: the attention itself, each query's log-sum-exp,
  // or one gradient (attention_grad's wrt, shifted by 2; DKV is dk and dv
  // side by side).
  enum Part : int64_t { Out = 0, DQ = 2, DK = 3, DV = 4, DScores = 5, DKV = 6 };
  // The op's operands, by name: attention {q, kt, v, bias[, offset]},
  // attention_grad {q, k, v, bias, dout, lse, delta, qt, kt, vt, doutt[,
  // offset]}; `out` is the result.
  enum Operand { Q, K, V, Bias, DOut, LseIn, Delta, QT, KT, VT, DOutT, Offset, Result, kOperands };

  int64_t groups, lq, lk, d, dv;
  bool causal;
  // bias[g, i, j] is element ((g / gdiv) % gmod) * gstride + i * qstride +
  // j * kstride of the bias operand.
  int64_t gdiv, gmod, gstride, qstride, kstride;
  Part part;
  double scale;
  // Dropout: p is kept where uniform(seed, counter) >= dropout (counter: the
  // score's index in [groups, lq, lk] plus the offset operand), and scaled
  // by 1 / (1 - dropout).
  double dropout;
  int64_t seed;
  DType dtype;
  // The arg of each Operand the kernel has (codegen/family.h), else -1.
  int arg[kOperands];

  explicit AttentionParams(const Kernel& k) {
    const int64_t* p = family_params(k, 15);
    groups = p[0], lq = p[1], lk = p[2], d = p[3], dv = p[4];
    causal = p[5] != 0;
    gdiv = p[6], gmod = p[7], gstride = p[8], qstride = p[9], kstride = p[10];
    part = static_cast<Part>(p[11]);
    std::memcpy(&scale, &p[12], sizeof(scale));
    std::memcpy(&dropout, &p[13], sizeof(dropout));
    seed = p[14];
    std::vector<Operand> order;
    if (part == Out)
      order = {Q, KT, V, Bias};
    else
      order = {Q, K, V, Bias, DOut, LseIn, Delta, QT, KT, VT, DOutT};
    if (dropout > 0) order.push_back(Offset);
    FJ_CHECK(family_operands(k) == static_cast<int>(order.size()), "attention kernel ", k.name,
             " has ", family_operands(k), " operands, expected ", order.size());
    order.push_back(Result);
    for (int& a : arg) a = -1;
    for (size_t i = 0; i < order.size(); ++i) arg[order[i]] = family_arg(k, static_cast<int>(i));
    dtype = k.args[arg[Q]].dtype;
  }
  // Tasks own rows: a key's for dk and dv, else a query's.
  bool per_key() const { return part == DK || part == DV || part == DKV; }
};

// The dropout's factors z (0, or 1 / (1 - dropout)) of the scores whose
// counters are `counter` (i64, or a vector of them): `type`, a float or a
// vector of the same width, drawn as random_uniform_at draws. Both
// backends' emitters use it.
llvm::Value* dropout_factor(llvm::IRBuilderBase& b, MathProvider& math, const AttentionParams& p,
                            llvm::Value* counter, llvm::Type* type);

}  // namespace flowjit::codegen
