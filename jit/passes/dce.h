// dce: dead-code elimination.
//
// A Graph holds only what is reachable from its outputs and effects, so
// unused nodes disappear as soon as nothing refers to them. This pass removes
// the dead effects: assigns that store a variable's own value back.
#pragma once

#include "ir/graph.h"

namespace flowjit::jit {

ir::Graph dce(const ir::Graph& g);

}  // namespace flowjit::jit
