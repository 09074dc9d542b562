// stages: cutting a job placed on several device sets into segments. See
// stages.h for the model.
#include "jit/stages.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "ir/error.h"

namespace flowjit::jit {

using namespace ir;

namespace {

// Constants every segment can make for itself instead of receiving them.
bool remade(const NodeRef& n) { return n->op() == OpKind::Fill || n->op() == OpKind::Iota; }

class Partitioner {
 public:
  Partitioner(const Graph& g, const DistributeOptions& o)
      : g_(g), stages_(static_cast<int>(o.stages.size())), default_(o.default_stage) {}

  StagePartition run() {
    order_ = g_.topo_order();
    for (const NodeRef& n : order_)
      for (const NodeRef& in : n->inputs()) users_[in.get()].push_back(n.get());
    for (size_t i = 0; i < g_.params.size(); ++i)
      param_index_[g_.params[i].get()] = static_cast<int>(i);
    place();
    levels();
    build();
    check_variables();
    writers_wait_for_checks();
    std::ostringstream d;
    for (size_t s = 0; s < out_.segments.size(); ++s) {
      const StageSegmentGraph& seg = out_.segments[s];
      d << "  segment " << s << ": placement " << seg.stage << ", level " << seg.level << ", "
        << counts_[s] << " ops, " << seg.graph.params.size() << " inputs, "
        << seg.graph.outputs.size() << " outputs, " << seg.graph.effects.size() << " assigns\n";
    }
    out_.description = d.str();
    return std::move(out_);
  }

 private:
  // ---- placement of every node (stages.h)
  void place() {
    for (const NodeRef& n : order_) {
      int p = n->loc().placement;
      FJ_CHECK(p < stages_, "op placed on placement ", p, " of ", stages_);
      if (p < 0) p = default_;
      stage_[n.get()] = p;
    }
    for (const NodeRef& n : order_) {
      int& p = stage_[n.get()];
      if (p >= 0 || is_source(n->op())) continue;
      for (const NodeRef& in : n->inputs())
        if (stage_[in.get()] >= 0) {
          p = stage_[in.get()];
          break;
        }
    }
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      int& p = stage_[it->get()];
      if (p >= 0) continue;
      for (const Node* u : users_[it->get()])
        if (stage_[u] >= 0) {
          p = stage_[u];
          break;
        }
    }
    for (const NodeRef& n : order_) {
      int& p = stage_[n.get()];
      if (p < 0) p = 0;
    }
    for (const NodeRef& n : order_)
      if (n->op() == OpKind::Assign) stage_[n.get()] = stage_[n->input(0).get()];
  }

  // ---- levels: placement changes on the longest path, from 1; a source
  // (variable, random) sits at the level of its first same-placement user,
  // and below every user of another placement.
  void levels() {
    for (const NodeRef& n : order_) {
      if (is_source(n->op())) continue;
      int l = 1;
      for (const NodeRef& in : n->inputs()) {
        if (is_source(in->op())) continue;
        l = std::max(l, level_[in.get()] + (stage_[in.get()] != stage_[n.get()] ? 1 : 0));
      }
      level_[n.get()] = l;
    }
    // Ops that could run later (an update that reads only variables) move
    // to the latest level their users allow, when their placement already
    // has a segment there: fewer, bigger segments.
    std::set<std::pair<int, int>> occupied;
    for (const NodeRef& n : order_)
      if (!is_source(n->op())) occupied.emplace(level_[n.get()], stage_[n.get()]);
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      const Node* n = it->get();
      if (is_source(n->op()) || users_[n].empty()) continue;
      int l = 1 << 30;
      for (const Node* u : users_[n])
        l = std::min(l, stage_[u] == stage_[n] ? level_[u] : level_[u] - 1);
      if (l > level_[n] && occupied.count({l, stage_[n]})) level_[n] = l;
    }
    for (const NodeRef& n : order_) {
      if (!is_source(n->op())) continue;
      int l = 1 << 30;
      for (const Node* u : users_[n.get()])
        l = std::min(l, stage_[u] == stage_[n.get()] ? level_[u] : level_[u] - 1);
      level_[n.get()] = l == (1 << 30) ? 1 : std::max(l, 0);
    }
    assigns_after_checks();
  }

  static bool is_check(const Node* n) {
    return n->op() == OpKind::CheckIndex || n->op() == OpKind::CheckFinite;
  }

  // [harden] A failed check stops a staged run at its segment, and the
  // segments not run yet never run (runtime/staged.cpp); fusion keeps the
  // writers of one segment after its checks. So an assign that would run in
  // a segment before (or beside) a segment that checks (the step counter's
  // increment, traced first, reads nothing but its variable) moves to the
  // first segment of its placement after every such check, or to a
  // segment of its own there: a failed check leaves every variable as it
  // was. (writers_wait_for_checks makes the wait explicit.)
  void assigns_after_checks() {
    std::vector<std::pair<int, int>> checks;  // (level, placement)
    std::set<std::pair<int, int>> occupied;
    for (const NodeRef& n : order_) {
      if (is_check(n.get())) checks.emplace_back(level_[n.get()], stage_[n.get()]);
      if (!is_source(n->op())) occupied.emplace(level_[n.get()], stage_[n.get()]);
    }
    for (const NodeRef& n : order_) {
      if (n->op() != OpKind::Assign) continue;
      int& l = level_[n.get()];
      int need = l;
      for (auto [cl, cs] : checks)
        if (cl > l || (cl == l && cs != stage_[n.get()])) need = std::max(need, cl + 1);
      if (need == l) continue;
      auto at = occupied.lower_bound({need, stage_[n.get()]});
      int to = need;
      for (; at != occupied.end(); ++at)
        if (at->second == stage_[n.get()]) {
          to = at->first;
          break;
        }
      l = to;
    }
  }

  // A segment that assigns waits for every segment that checks at a lower
  // level, also where no value passes between them.
  void writers_wait_for_checks() {
    std::set<int> checking;
    for (const NodeRef& n : order_)
      if (is_check(n.get()) && segment_.count(n.get())) checking.insert(segment_.at(n.get()));
    for (const NodeRef& e : g_.effects) {
      StageSegmentGraph& w = out_.segments[segment_.at(e.get())];
      for (int c : checking)
        if (out_.segments[c].level < w.level &&
            std::find(w.after.begin(), w.after.end(), c) == w.after.end())
          w.after.push_back(c);
    }
  }

  // ---- segment graphs
  void build() {
    std::map<std::pair<int, int>, int> key;  // (level, stage) -> segment
    for (const NodeRef& n : order_) {
      if (remade(n) || n->op() == OpKind::Parameter) continue;
      key.emplace(std::make_pair(level_[n.get()], stage_[n.get()]), 0);
    }
    if (key.empty()) key.emplace(std::make_pair(1, 0), 0);
    for (auto& [k, idx] : key) {
      idx = static_cast<int>(out_.segments.size());
      StageSegmentGraph s;
      s.level = k.first;
      s.stage = k.second;
      s.graph.name = g_.name + ".segment" + std::to_string(idx);
      out_.segments.push_back(std::move(s));
    }
    counts_.assign(out_.segments.size(), 0);
    for (const NodeRef& n : order_) {
      if (remade(n) || n->op() == OpKind::Parameter) continue;
      int s = key.at({level_[n.get()], stage_[n.get()]});
      segment_[n.get()] = s;
    }
    for (const NodeRef& n : order_) {
      auto it = segment_.find(n.get());
      if (it == segment_.end()) continue;
      int s = it->second;
      std::vector<NodeRef> ins;
      for (size_t i = 0; i < n->inputs().size(); ++i) {
        const NodeRef& in = n->input(i);
        // An assign names its variable, it does not read it: the segment
        // that assigns refers to the variable itself.
        if (n->op() == OpKind::Assign && i == 0 && segment_.at(in.get()) != s)
          ins.push_back(make_node(OpKind::Variable, {}, in->attrs(), in->loc()));
        else
          ins.push_back(value_in(s, in));
      }
      local_[{s, n.get()}] = make_node(n->op(), std::move(ins), n->attrs(), n->loc());
      ++counts_[s];
    }
    for (const NodeRef& e : g_.effects) {
      int s = segment_.at(e.get());
      out_.segments[s].graph.effects.push_back(local_.at({s, e.get()}));
    }
    for (const NodeRef& r : g_.outputs) {
      if (r->op() == OpKind::Parameter) {
        out_.outputs.push_back({-1, param_index_.at(r.get())});
      } else if (remade(r)) {
        int s = static_cast<int>(out_.segments.size()) - 1;
        StageSegmentGraph& seg = out_.segments[s];
        seg.graph.outputs.push_back(value_in(s, r));
        out_.outputs.push_back({s, static_cast<int>(seg.graph.outputs.size()) - 1});
      } else {
        out_.outputs.push_back(exported(r));
      }
    }
  }

  // An output of the producer's segment carrying `n`.
  StageWire exported(const NodeRef& n) {
    int s = segment_.at(n.get());
    auto it = exports_.find(n.get());
    if (it != exports_.end()) return {s, it->second};
    Graph& g = out_.segments[s].graph;
    g.outputs.push_back(local_.at({s, n.get()}));
    int k = static_cast<int>(g.outputs.size()) - 1;
    exports_[n.get()] = k;
    return {s, k};
  }

  // Operand `in` as seen inside segment `s`.
  NodeRef value_in(int s, const NodeRef& in) {
    auto own = local_.find({s, in.get()});
    if (own != local_.end()) return own->second;
    NodeRef v;
    if (remade(in)) {
      v = make_node(in->op(), {}, in->attrs(), in->loc());
    } else {
      StageWire w =
          in->op() == OpKind::Parameter ? StageWire{-1, param_index_.at(in.get())} : exported(in);
      StageSegmentGraph& seg = out_.segments[s];
      int index = static_cast<int>(seg.graph.params.size());
      std::string name = w.segment < 0 ? in->attrs().get_str("name")
                                       : "from_segment" + std::to_string(w.segment) + "_" +
                                             std::to_string(w.index);
      v = make_node(OpKind::Parameter, {},
                    Attrs{{"name", name},
                          {"index", int64_t{index}},
                          {"shape", in->shape()},
                          {"dtype", in->dtype()}},
                    in->loc());
      seg.graph.params.push_back(v);
      seg.inputs.push_back(w);
    }
    local_[{s, in.get()}] = v;
    return v;
  }

  // A variable read in one segment and assigned in another: the read must
  // come first (the one-device job reads the value before the update).
  void check_variables() {
    std::map<std::string, int> assigned;  // variable -> segment of its assign
    for (const NodeRef& e : g_.effects) {
      if (e->op() != OpKind::Assign) continue;
      const std::string& name = e->input(0)->attrs().get_str("name");
      int s = segment_.at(e.get());
      auto [it, fresh] = assigned.emplace(name, s);
      FJ_USER_CHECK(fresh || it->second == s, ErrorKind::NotImplemented, "variable '", name,
                    "' is assigned by ops placed on different device sets; a variable is "
                    "updated on one placement");
    }
    for (const NodeRef& n : order_) {
      if (n->op() != OpKind::Variable) continue;
      auto a = assigned.find(n->attrs().get_str("name"));
      if (a == assigned.end()) continue;
      int r = segment_.at(n.get());
      if (r == a->second) continue;
      FJ_USER_CHECK(out_.segments[r].level < out_.segments[a->second].level,
                    ErrorKind::NotImplemented, "variable '", a->first,
                    "' is read by ops placed after the ops that assign it (placement ",
                    out_.segments[r].stage, " reads, placement ", out_.segments[a->second].stage,
                    " assigns); read it where it is placed");
      out_.segments[a->second].after.push_back(r);
    }
  }

  const Graph& g_;
  int stages_, default_;
  std::vector<NodeRef> order_;
  std::unordered_map<const Node*, std::vector<const Node*>> users_;
  std::unordered_map<const Node*, int> stage_, level_, segment_, exports_, param_index_;
  std::map<std::pair<int, const Node*>, NodeRef> local_;
  std::vector<int> counts_;
  StagePartition out_;
};

}  // namespace

StagePartition partition_stages(const Graph& g, const DistributeOptions& opts) {
  FJ_CHECK(!opts.stages.empty(), "partition_stages without placements");
  return Partitioner(g, opts).run();
}

}  // namespace flowjit::jit
