// The IR verifier: checks every node's invariants after a pass.
#pragma once

#include <string>

#include "ir/graph.h"

namespace flowjit::ir {

struct VerifyOptions {
  bool allow_composites = true;  // false after the decompose pass
};

// Returns "" when the graph is well formed, otherwise a description of the
// first problem naming the node, its op and its operand types.
std::string verify_graph(const Graph& g, VerifyOptions opts = {});

// Throws InternalError naming `after_pass` when verify_graph finds a problem.
void verify_or_throw(const Graph& g, const std::string& after_pass, VerifyOptions opts = {});

}  // namespace flowjit::ir
