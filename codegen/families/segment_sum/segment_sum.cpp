// The segment_sum family: out[o, s, c] = sum over j with ids[b(o), j] == s
// of data[o, j, c] (ir/ops.def), the gradient of gathers and the scatters.
//
// Params {batch, rest, n, segments, inner}: data is [batch * rest, n, inner],
// ids [batch, n] (the id of data row (o, j) is ids[o / rest, j]), out
// [batch * rest, segments, inner]. An id outside [0, segments) is dropped.
// Every output element is a sum over j in ascending order, so the result does
// not depend on the threads (no atomics): the kernels parallelize over o and
// over chunks of c, and each chunk walks all ids.
#include "codegen/families/segment_sum/segment_sum.h"

#include "codegen/family.h"
#include "ir/node.h"

namespace flowjit::codegen {

namespace {

std::vector<int64_t> params(const ir::Node& n) {
  const ir::Shape& d = n.input(0)->shape();
  const int ids_rank = n.input(1)->rank();
  const auto axis = static_cast<size_t>(n.attrs().get_int("axis"));
  const auto bd = static_cast<size_t>(n.attrs().get_int("batch_dims"));
  const size_t m = ids_rank - bd;
  return {dims_product(d, 0, bd), dims_product(d, bd, axis), dims_product(d, axis, axis + m),
          n.attrs().get_int("num_segments"), dims_product(d, axis + m, d.size())};
}

std::string summary(const Kernel& k) {
  SegmentSumParams p(k);
  return "segment_sum of " + std::to_string(p.n) + " rows of " + std::to_string(p.inner) +
         " into " + std::to_string(p.segments) + " segments" +
         (p.outer() > 1 ? " (" + std::to_string(p.outer()) + " times)" : "");
}

int64_t flops(const Kernel& k) {
  SegmentSumParams p(k);
  return p.outer() * p.n * p.inner;
}

}  // namespace

extern const KernelFamily segment_sum_family{"segment_sum", OpKind::SegmentSum, params, summary,
                                             flops};

}  // namespace flowjit::codegen
