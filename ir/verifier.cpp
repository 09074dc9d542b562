// The IR verifier.
#include "ir/verifier.h"

#include <set>
#include <unordered_set>

#include "ir/error.h"
#include "ir/printer.h"

namespace flowjit::ir {

namespace {
std::string describe(const NodeRef& n) {
  std::string s = std::string(op_name(n->op())) + "(";
  for (size_t i = 0; i < n->inputs().size(); ++i) s += (i ? ", " : "") + n->input(i)->type().str();
  s += ") " + print_attrs(n->attrs()) + " : " + n->type().str();
  if (n->loc().known()) s += " at " + n->loc().str();
  return s;
}
}  // namespace

std::string verify_graph(const Graph& g, VerifyOptions opts) {
  std::set<int64_t> indices;
  for (size_t i = 0; i < g.params.size(); ++i) {
    const NodeRef& p = g.params[i];
    if (p->op() != OpKind::Parameter) return "params[" + std::to_string(i) + "] is not a parameter";
    if (!indices.insert(p->attrs().get_int("index")).second)
      return "two parameters share index " + std::to_string(p->attrs().get_int("index"));
  }
  std::unordered_set<const Node*> param_set;
  for (auto& p : g.params) param_set.insert(p.get());
  std::unordered_set<std::string> assigned;
  for (auto& e : g.effects) {
    if (!is_effect(e->op())) return "effect " + describe(e) + " is not an effect op";
    std::string var = e->input(0)->attrs().get_str("name");
    if (!assigned.insert(var).second) return "variable '" + var + "' is assigned twice";
  }
  for (const NodeRef& n : g.topo_order()) {
    int arity = op_arity(n->op());
    if (arity >= 0 && static_cast<int>(n->inputs().size()) != arity)
      return "wrong operand count in " + describe(n);
    if (!opts.allow_composites && is_composite(n->op()))
      return "composite op left after decomposition: " + describe(n);
    if (n->op() == OpKind::Parameter && !param_set.count(n.get()))
      return "parameter not listed in the graph's params: " + describe(n);
    if (std::string bad = check_attrs(n->op(), n->attrs()); !bad.empty())
      return "attributes off their schema in " + describe(n) + ": " + bad;
    Attrs attrs = n->attrs();
    TensorType t;
    try {
      t = infer_type(n->op(), n->inputs(), attrs);
    } catch (const UserError& e) {
      return std::string("type rule rejects ") + describe(n) + ": " + e.what();
    }
    if (t != n->type()) return "type mismatch in " + describe(n) + ": the op infers " + t.str();
    if (!(attrs == n->attrs())) return "attributes not canonical in " + describe(n);
  }
  return "";
}

void verify_or_throw(const Graph& g, const std::string& after_pass, VerifyOptions opts) {
  std::string err = verify_graph(g, opts);
  if (!err.empty())
    throw InternalError(
        "flowjit internal error (a bug in flowjit, please report it): IR verifier "
        "failed after pass '" +
        after_pass + "': " + err);
}

}  // namespace flowjit::ir
