// cse: common-subexpression elimination by hash-consing.
//
// Two nodes with the same op, attributes and operands become one (operands
// of commutative ops are compared as a set). Variables with the same name and
// random sources with the same seed are the same value, so they merge too.
// Locations do not take part: the first occurrence's location is kept.
#pragma once

#include "ir/graph.h"

namespace flowjit::jit {

ir::Graph cse(const ir::Graph& g);

}  // namespace flowjit::jit
