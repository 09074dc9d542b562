// Graph traversal.
#include "ir/graph.h"

#include <unordered_set>

namespace flowjit::ir {

std::vector<NodeRef> Graph::topo_order() const {
  std::vector<NodeRef> order;
  std::unordered_set<const Node*> done;
  // Iterative DFS: (node, next operand index).
  std::vector<std::pair<NodeRef, size_t>> stack;
  auto visit = [&](const NodeRef& root) {
    if (done.count(root.get())) return;
    stack.push_back({root, 0});
    while (!stack.empty()) {
      auto& [n, i] = stack.back();
      if (i < n->inputs().size()) {
        const NodeRef& next = n->inputs()[i++];
        if (!done.count(next.get())) stack.push_back({next, 0});
        continue;
      }
      if (done.insert(n.get()).second) order.push_back(n);
      stack.pop_back();
    }
  };
  for (auto& p : params) visit(p);
  for (auto& o : outputs) visit(o);
  for (auto& e : effects) visit(e);
  return order;
}

}  // namespace flowjit::ir
