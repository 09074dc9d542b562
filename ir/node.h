// Nodes of the graph IR: immutable, single-result, built by a checking factory.
//
// A Node is one operation; its result is the Node itself (an IR "value" is a
// NodeRef). Nodes never change after make_node returns; passes build new
// nodes and share the unchanged ones, so "unchanged" is pointer equality.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "ir/op.h"
#include "ir/types.h"

namespace flowjit::ir {

using IntList = std::vector<int64_t>;
using AttrValue = std::variant<bool, int64_t, double, std::string, IntList, DType>;

// A small ordered attribute dictionary; keys are kept sorted so that equal
// attribute sets compare and print identically.
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);

  Attrs& set(const std::string& key, AttrValue v);
  bool has(const std::string& key) const;
  const AttrValue* find(const std::string& key) const;

  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t dflt) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key, bool dflt = false) const;
  const std::string& get_str(const std::string& key) const;
  const IntList& get_ints(const std::string& key) const;
  DType get_dtype(const std::string& key) const;

  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  // Identical attributes: floats compare by their bits, so a NaN fill equals
  // itself (the verifier re-infers and compares) and 0.0 is not -0.0 (CSE
  // must not merge them).
  bool operator==(const Attrs& o) const;
  size_t hash() const;

 private:
  std::vector<std::pair<std::string, AttrValue>> items_;
};

// Where in the user's program an op was traced.
//
// `placement` is where the op runs when a job places parts of itself on
// different device sets (flow.scope.placement inside a job body): an index
// into the job's placements (DistributeOptions::stages), -1 for an op traced
// outside such a scope. It travels with the location because every pass and
// autodiff rule that rebuilds an op hands its location on.
struct SourceLoc {
  std::string file;
  int line = 0;
  int placement = -1;
  bool known() const { return line > 0; }
  std::string str() const;  // "file.py:12" or ""
};

// The placement make_node gives every op it makes while one is set (>= 0) on
// this thread, over its location's: the tracer sets it while a placement
// scope is open, autodiff and the optimizer lowering while they build the
// ops of one placed op, rewrite_graph while a pass replaces one.
int current_placement();
void set_current_placement(int placement);
class PlacementScope {
 public:
  explicit PlacementScope(int placement) : saved_(current_placement()) {
    if (placement >= 0) set_current_placement(placement);
  }
  ~PlacementScope() { set_current_placement(saved_); }
  PlacementScope(const PlacementScope&) = delete;
  PlacementScope& operator=(const PlacementScope&) = delete;

 private:
  int saved_;
};

class Node;
using NodeRef = std::shared_ptr<const Node>;

class Node {
 public:
  OpKind op() const { return op_; }
  const std::vector<NodeRef>& inputs() const { return inputs_; }
  const NodeRef& input(size_t i) const { return inputs_[i]; }
  const Attrs& attrs() const { return attrs_; }
  const TensorType& type() const { return type_; }
  const Shape& shape() const { return type_.shape; }
  DType dtype() const { return type_.dtype; }
  int rank() const { return type_.rank(); }
  const SourceLoc& loc() const { return loc_; }
  // Creation order; unique within a process. Used only for stable ordering.
  uint64_t serial() const { return serial_; }

  // The factory. Checks operand count, dtypes and shapes, canonicalizes the
  // attributes (negative axes, -1 in reshape) and infers the result type.
  // Throws UserError with a message naming the op on bad input.
  friend NodeRef make_node(OpKind op, std::vector<NodeRef> inputs, Attrs attrs, SourceLoc loc);

  // Same op, attributes and location over new operands; returns `self` when
  // the operands are the same objects.
  static NodeRef with_inputs(const NodeRef& self, std::vector<NodeRef> inputs);

 private:
  Node() = default;
  OpKind op_{};
  std::vector<NodeRef> inputs_;
  Attrs attrs_;
  TensorType type_;
  SourceLoc loc_;
  uint64_t serial_ = 0;
};

NodeRef make_node(OpKind op, std::vector<NodeRef> inputs, Attrs attrs = {}, SourceLoc loc = {});

// Checks `attrs` against op's schema (ops.def ATTR lines): every key known,
// of its kind, and every required one present. Returns "" or the problem,
// naming the op, the key and what it takes.
std::string check_attrs(OpKind op, const Attrs& attrs);

// Result type inference, shared by the factory and the verifier. `attrs` is
// canonicalized in place.
TensorType infer_type(OpKind op, const std::vector<NodeRef>& inputs, Attrs& attrs);

// Convenience constructors used by passes and autodiff.
NodeRef fill(double value, const Shape& shape, DType dtype, SourceLoc loc = {});
NodeRef scalar_like(double value, const NodeRef& like);  // rank-0 of like's dtype
NodeRef unary(OpKind op, const NodeRef& x, SourceLoc loc = {});
NodeRef binary(OpKind op, const NodeRef& a, const NodeRef& b, SourceLoc loc = {});
NodeRef reshape(const NodeRef& x, const Shape& shape);
NodeRef transpose(const NodeRef& x, const IntList& perm);
NodeRef broadcast(const NodeRef& x, const Shape& shape);
NodeRef reduce(OpKind op, const NodeRef& x, const IntList& axes, bool keepdims);
NodeRef cast(const NodeRef& x, DType dtype);
NodeRef where(const NodeRef& c, const NodeRef& a, const NodeRef& b);
NodeRef matmul(const NodeRef& a, const NodeRef& b, bool ta, bool tb);

// Sums `x` down to `shape` (the inverse of numpy broadcasting), used by
// gradients of broadcasting ops. Returns x when the shapes already agree.
NodeRef sum_to_shape(const NodeRef& x, const Shape& shape);

bool is_fill(const NodeRef& n, double value);  // a Fill of exactly `value`

}  // namespace flowjit::ir
