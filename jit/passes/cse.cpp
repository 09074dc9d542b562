// cse: common-subexpression elimination by hash-consing.
#include "jit/passes/cse.h"

#include <unordered_map>

namespace flowjit::jit {

using namespace ir;

namespace {

struct Key {
  OpKind op;
  std::vector<const Node*> inputs;
  const Attrs* attrs;
  bool operator==(const Key& o) const {
    return op == o.op && inputs == o.inputs && *attrs == *o.attrs;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = static_cast<size_t>(k.op) * 0x9e3779b97f4a7c15ULL;
    for (const Node* n : k.inputs) h ^= std::hash<const Node*>()(n) + (h << 6) + (h >> 2);
    return h ^ (k.attrs->hash() << 1);
  }
};

}  // namespace

Graph cse(const Graph& g) {
  std::unordered_map<Key, NodeRef, KeyHash> table;
  return rewrite_graph(g, [&](const NodeRef& n, std::vector<NodeRef> in) -> NodeRef {
    NodeRef cand = Node::with_inputs(n, std::move(in));
    if (is_effect(cand->op())) return cand;
    Key key{cand->op(), {}, &cand->attrs()};
    for (auto& i : cand->inputs()) key.inputs.push_back(i.get());
    if (has_trait(cand->op(), kCommutative) && key.inputs.size() == 2 &&
        cand->input(0)->type() == cand->input(1)->type() && key.inputs[1] < key.inputs[0])
      std::swap(key.inputs[0], key.inputs[1]);
    auto it = table.find(key);
    if (it != table.end() && it->second->type() == cand->type()) return it->second;
    table.emplace(key, cand);
    return cand;
  });
}

}  // namespace flowjit::jit
