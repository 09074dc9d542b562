// The segment_sum family's parameters, as its emitters read them
// (codegen/families/segment_sum/segment_sum.cpp says what they mean).
#pragma once

#include "codegen/kernel.h"
#include "ir/error.h"

namespace flowjit::codegen {

struct SegmentSumParams {
  int64_t batch, rest, n, segments, inner;
  DType data, ids;  // args {data, ids, out}
  explicit SegmentSumParams(const Kernel& k) {
    FJ_CHECK(k.params.size() == 5 && k.args.size() == 3, "segment_sum kernel ", k.name, " has ",
             k.params.size(), " params and ", k.args.size(), " args");
    batch = k.params[0];
    rest = k.params[1];
    n = k.params[2];
    segments = k.params[3];
    inner = k.params[4];
    data = k.args[0].dtype;
    ids = k.args[1].dtype;
  }
  int64_t outer() const { return batch * rest; }
};

}  // namespace flowjit::codegen
