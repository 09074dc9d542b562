// decompose: expands composite ops (softmax, log_softmax, the sparse softmax
// cross-entropy, one_hot) into primitive ops that fusion understands.
//
// Runs after autodiff, which differentiates composites as a whole. The
// expansions are numerically stable (the row maximum is subtracted before
// exp), and the cross-entropy reads its label through an equality against an
// iota, so an out-of-range label selects nothing instead of reading memory.
#pragma once

#include "ir/graph.h"

namespace flowjit::jit {

ir::Graph decompose(const ir::Graph& g);

}  // namespace flowjit::jit
