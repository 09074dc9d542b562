// Template implementation of rewrite_graph (included by ir/graph.h).
#pragma once

#include <unordered_map>

namespace flowjit::ir {

template <class Fn>
Graph rewrite_graph(const Graph& g, Fn&& fn) {
  std::unordered_map<const Node*, NodeRef> map;
  for (const NodeRef& n : g.topo_order()) {
    std::vector<NodeRef> ins;
    ins.reserve(n->inputs().size());
    for (const NodeRef& i : n->inputs()) ins.push_back(map.at(i.get()));
    // What a pass makes in place of a placed op runs where the op ran.
    PlacementScope placed(n->loc().placement);
    map[n.get()] = fn(n, std::move(ins));
  }
  Graph out;
  out.name = g.name;
  for (auto& p : g.params) out.params.push_back(map.at(p.get()));
  for (auto& o : g.outputs) out.outputs.push_back(map.at(o.get()));
  for (auto& e : g.effects) out.effects.push_back(map.at(e.get()));
  return out;
}

}  // namespace flowjit::ir
