// dce: dead-code elimination.
#include "jit/passes/dce.h"

namespace flowjit::jit {

using namespace ir;

Graph dce(const Graph& g) {
  Graph out = g;
  out.effects.clear();
  for (const NodeRef& e : g.effects) {
    bool noop = e->op() == OpKind::Assign && e->input(1)->op() == OpKind::Variable &&
                e->input(1)->attrs().get_str("name") == e->input(0)->attrs().get_str("name");
    if (!noop) out.effects.push_back(e);
  }
  if (out.effects.size() == g.effects.size()) return g;
  return out;
}

}  // namespace flowjit::jit
