// The segment_sum family's parameters, as its emitters read them
// (codegen/families/segment_sum/segment_sum.cpp says what they mean).
#pragma once

#include "codegen/family.h"
#include "codegen/kernel.h"
#include "ir/error.h"

namespace flowjit::codegen {

struct SegmentSumParams {
  int64_t batch, rest, n, segments, inner;
  DType data, ids;
  int arg[3];  // the args of data, ids and out (codegen/family.h)
  explicit SegmentSumParams(const Kernel& k) {
    const int64_t* p = family_params(k, 5);
    batch = p[0];
    rest = p[1];
    n = p[2];
    segments = p[3];
    inner = p[4];
    for (int i = 0; i < 3; ++i) arg[i] = family_arg(k, i);
    data = k.args[arg[0]].dtype;
    ids = k.args[arg[1]].dtype;
  }
  int64_t outer() const { return batch * rest; }
};

}  // namespace flowjit::codegen
