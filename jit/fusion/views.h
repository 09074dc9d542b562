// fusion's view of memory: how a value addresses a buffer (views, windows,
// pads, slices, gathers) and how a node's dims map onto a kernel's domain.
// Used by every fusion stage (jit/fusion/grouping.h, internal.h).
#pragma once

#include <optional>
#include <vector>

#include "codegen/kernel.h"
#include "ir/graph.h"

namespace flowjit::jit::fusion_detail {

using namespace ir;
using DimMap = std::vector<int>;  // per node dim: domain dim, or -1 (index 0)

// An index read by a gather: a strided view of an integer buffer, clamped
// into [0, limit) and scaled by `stride` (codegen::Indirect).
struct IndirectView {
  NodeRef base;
  std::vector<int64_t> strides;  // elements of base, per dim of the viewed node
  int64_t offset = 0;
  int64_t limit = 1;
  int64_t stride = 0;  // elements of the gathered buffer per index unit
  // The check_index the gather reads its indices through (or null), and the
  // position of the index element in that tensor: pos_offset + sum over the
  // viewed node's dims of idx * pos_strides.
  NodeRef check;
  std::vector<int64_t> pos_strides;
  int64_t pos_offset = 0;
};

inline bool is_gather(const NodeRef& n) {
  return n->op() == OpKind::Gather || n->op() == OpKind::GatherNd;
}

// A gather's index operand read through its check_index, if it has one.
inline NodeRef unchecked_index(const NodeRef& x) {
  return x->op() == OpKind::CheckIndex ? x->input(0) : x;
}

struct View {
  NodeRef base;                  // a buffer: parameter, variable or computed node
  std::vector<int64_t> strides;  // elements, per dim of the viewed node
  int64_t offset = 0;
  std::vector<codegen::Coord> coords;  // coef per dim of the viewed node
  double pad = 0;                      // the value of elements outside the coords' range
  std::vector<IndirectView> indirect;  // strides per dim of the viewed node
  int64_t ipad = 0;                    // pad of an integer view, exact (pad rounds beyond 2^53)
  bool plain() const { return coords.empty() && indirect.empty(); }
};

// ---------------------------------------------------------------- views

// True for a reshape that only inserts or removes extent-1 dimensions.
bool is_unit_reshape(const NodeRef& r);

// Sources (and random_uniform_at) cheap enough to recompute in every kernel
// that reads them (trait kCheap).
bool is_cheap_source(const NodeRef& n);

// Recomputed in every kernel that uses it instead of being stored.
bool is_duplicable(const NodeRef& n);

// One add, subtract, multiply or negation of a value by scalars (constants
// or rank-0 values, through broadcasts): GELU's 0.5 * x and -x / sqrt(2).
// A kernel that recomputes it reads as many bytes as one that loads it, so
// analysis (Uses::recomputed) has every consumer recompute it unless it must
// be in memory itself.
bool is_scaled_value(const NodeRef& n);

bool is_buffer_leaf(const NodeRef& n);

bool is_compute(const NodeRef& n);

// Addressed views (windows, pads, slices, gathers) read their operands
// through offsets, guarded and indirect coordinates, so the operands must
// exist in memory (like the base of a non-unit reshape).
bool is_addressed_view(const NodeRef& n);

// window(x): lead dims as x's, window positions and taps through one
// coordinate per spatial dim; a coordinate that can never leave the input
// folds into plain strides.
std::optional<View> resolve_window(const NodeRef& n);

// pad(x): a guarded coordinate per padded dim (ir/array.h).
std::optional<View> resolve_pad(const NodeRef& n);

// slice(x): an offset and scaled strides.
std::optional<View> resolve_slice(const NodeRef& n);

// gather(p, idx) and gather_nd(p, idx): p's strides on the dims that are not
// indexed, and one indirect coordinate per indexed dim.
std::optional<View> resolve_gather(const NodeRef& n);

// How `n` addresses memory, when it is a view chain over a buffer.
std::optional<View> resolve_view(const NodeRef& n);

// A matmul reads an operand's batch dims as one stride: they must collapse
// (a batch broadcast by numpy rules or a transposed batch does not, and is
// copied first).
bool batch_collapses(const View& v, const NodeRef& x);

bool is_contiguous_view(const NodeRef& n);

// ---------------------------------------------------------------- maps

DimMap broadcast_map(const Shape& from, const Shape& to, const DimMap& to_map);

// The map of operand `i` of member `n`, given n's map. Reductions map their
// operand to the identity over the group's domain (checked canonical).
DimMap operand_map(const NodeRef& n, const DimMap& m, size_t i);

// A map under which a node can be stored: every non-unit dim has its own
// domain dim.
bool is_full_map(const NodeRef& n, const DimMap& m);

}  // namespace flowjit::jit::fusion_detail
