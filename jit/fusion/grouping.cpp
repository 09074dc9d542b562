// fusion's first stages: prepare, analyze, group (jit/fusion/grouping.h).
#include "jit/fusion/grouping.h"

#include <algorithm>
#include <queue>
#include <sstream>

#include "ir/error.h"
#include "ir/printer.h"

namespace flowjit::jit::fusion_detail {

namespace {

NodeRef identity(const NodeRef& n) { return make_node(OpKind::Identity, {n}, {}, n->loc()); }

}  // namespace

bool needs_identity_for_store(const NodeRef& n) {
  return !is_compute(n) || is_duplicable(n) || is_collective(n->op()) || is_family(n->op());
}

Graph prepare(const Graph& g) {
  // One copy of a family operand however many family kernels read it
  // (attention's gradients share their transposed operands).
  std::unordered_map<const Node*, NodeRef> family_copies;
  Graph h = rewrite_graph(g, [&](const NodeRef& n, std::vector<NodeRef> in) -> NodeRef {
    if (is_contraction(n->op()) || is_addressed_view(n)) {
      // Operands addressed as strided buffers (addressed views add their
      // own offsets and coordinates).
      for (size_t i = 0; i < in.size(); ++i) {
        // A gather reads its indices through their check_index (jit/fusion
        // puts the check in the indirect load), so the unchecked indices
        // are the buffer.
        bool checked = i == 1 && is_gather(n) && in[i]->op() == OpKind::CheckIndex;
        NodeRef x = checked ? in[i]->input(0) : in[i];
        auto v = resolve_view(x);
        if (!v || !v->plain() || is_duplicable(v->base) ||
            (n->op() == OpKind::MatMul && !batch_collapses(*v, x)))
          x = identity(x);
        in[i] = checked ? Node::with_inputs(in[i], {x}) : x;
      }
    } else if (n->op() == OpKind::Reshape && !is_unit_reshape(n)) {
      if (!is_contiguous_view(in[0])) in[0] = identity(in[0]);
    } else if (n->op() == OpKind::Assign) {
      if (needs_identity_for_store(in[1])) in[1] = identity(in[1]);
    } else if (is_collective(n->op())) {
      // The runtime reads the operand as one contiguous buffer.
      if (!is_buffer_leaf(in[0]) && !is_compute(in[0])) in[0] = identity(in[0]);
    } else if (is_family(n->op())) {
      // A family kernel reads its operands as contiguous buffers.
      for (NodeRef& x : in)
        if (!is_buffer_leaf(x) && (!is_compute(x) || is_duplicable(x))) {
          NodeRef& copy = family_copies[x.get()];
          if (!copy) copy = identity(x);
          x = copy;
        }
    }
    return Node::with_inputs(n, std::move(in));
  });
  std::unordered_set<const Node*> seen;
  for (auto& o : h.outputs) {
    if (needs_identity_for_store(o) || seen.count(o.get())) o = identity(o);
    seen.insert(o.get());
  }
  return h;
}

// ---- analysis
Uses analyze(const Graph& g) {
  Uses u;
  u.topo = g.topo_order();
  for (size_t i = 0; i < u.topo.size(); ++i) u.pos[u.topo[i].get()] = static_cast<int>(i);
  for (const NodeRef& n : u.topo) {
    if (n->op() == OpKind::Assign) {
      u.assigns[n->input(1).get()].push_back(n);
      continue;
    }
    for (auto& i : n->inputs()) u.users[i.get()].push_back(n);
  }
  for (size_t i = 0; i < g.outputs.size(); ++i)
    u.output_of[g.outputs[i].get()] = static_cast<int>(i);
  for (size_t i = 0; i < g.params.size(); ++i)
    u.param_index[g.params[i].get()] = static_cast<int>(g.params[i]->attrs().get_int("index"));
  // Bases of matmul operands and of reshapes must exist in memory.
  for (const NodeRef& n : u.topo) {
    if (is_contraction(n->op()) || is_addressed_view(n)) {
      for (size_t i = 0; i < n->inputs().size(); ++i) {
        const NodeRef& x = n->input(i);
        u.must_store.insert(
            resolve_view(i == 1 && is_gather(n) ? unchecked_index(x) : x)->base.get());
      }
    } else if (n->op() == OpKind::Reshape && !is_unit_reshape(n)) {
      if (auto v = resolve_view(n->input(0))) u.must_store.insert(v->base.get());
    } else if (is_collective(n->op())) {
      u.must_store.insert(n->input(0).get());
    } else if (is_family(n->op())) {
      for (const NodeRef& x : n->inputs()) u.must_store.insert(x.get());
    }
  }
  // Scaled values recomputed by their consumers (after must_store: one a
  // matmul, view or family reads from memory is stored).
  for (const NodeRef& n : u.topo)
    if (is_scaled_value(n) && !u.output_of.count(n.get()) && !u.assigns.count(n.get()) &&
        !u.must_store.count(n.get()))
      u.recomputed.insert(n.get());
  // Elementwise chains right after a single-use matmul are kept for that
  // matmul's epilogue: reduction kernels do not take them.
  for (const NodeRef& n : u.topo) {
    if (!is_contraction(n->op())) continue;
    NodeRef cur = n;
    while (true) {
      std::vector<const Node*> eff;
      u.effective_users(cur, eff);
      if (eff.size() != 1 || u.output_of.count(cur.get())) break;
      const Node* user = eff[0];
      if (!is_elementwise(user->op()) || user->shape() != n->shape()) break;
      u.epilogue.insert(user);
      cur = u.node_ref(user);
      if (!cur) break;
    }
  }
  return u;
}

NodeRef Uses::node_ref(const Node* n) const {
  auto it = pos.find(n);
  return it == pos.end() ? nullptr : topo[it->second];
}

// Compute nodes that consume `n`, looking through duplicable users.
void Uses::effective_users(const NodeRef& n, std::vector<const Node*>& out) const {
  auto it = users.find(n.get());
  if (it == users.end()) return;
  for (const NodeRef& u : it->second) {
    // A duplicable user that must be stored is a kernel root of its own.
    bool stored = output_of.count(u.get()) || assigns.count(u.get());
    if (duplicated(u) && !stored) {
      effective_users(u, out);
    } else {
      out.push_back(u.get());
    }
  }
}

// ---- grouping
namespace {

class Grouper {
 public:
  Grouper(const Uses& u, const GroupingOptions& opts) : u_(u), opts_(opts) {}
  Grouping run();

 private:
  void new_group(const NodeRef& root);
  void add_member(Group& g, const NodeRef& n, const DimMap& m);
  void grow(Group& g);
  bool try_absorb(Group& g, const NodeRef& p, std::vector<DimMap>& maps);
  bool absorb_reduce(Group& g, const NodeRef& p, std::vector<DimMap>& maps);

  const Uses& u_;
  const GroupingOptions& opts_;
  Grouping out_;
};

Grouping Grouper::run() {
  for (auto it = u_.topo.rbegin(); it != u_.topo.rend(); ++it) {
    const NodeRef& n = *it;
    if (!is_compute(n) || out_.group_of.count(n.get())) continue;
    if (u_.duplicated(n) && !u_.output_of.count(n.get()) && !u_.assigns.count(n.get()) &&
        !u_.must_store.count(n.get()))
      continue;
    new_group(n);
  }
  return std::move(out_);
}

void Grouper::new_group(const NodeRef& root) {
  auto g = std::make_unique<Group>();
  g->id = static_cast<int>(out_.groups.size());
  g->root = root;
  DimMap rm;
  if (is_reduce(root->op())) {
    const NodeRef& x = root->input(0);
    g->domain = x->shape();
    g->reduced.assign(x->rank(), false);
    for (int64_t a : root->attrs().get_ints("axes")) g->reduced[a] = true;
    g->has_reduce = true;
    bool keep = root->attrs().get_bool("keepdims");
    for (int d = 0; d < x->rank(); ++d) {
      if (!g->reduced[d]) {
        rm.push_back(d);
      } else if (keep) {
        rm.push_back(-1);
      }
    }
  } else {
    g->domain = root->shape();
    g->reduced.assign(root->rank(), false);
    for (int d = 0; d < root->rank(); ++d) rm.push_back(d);
    if (is_contraction(root->op())) {
      g->matmul = true;
      g->mm = root;
    }
  }
  Group* gp = g.get();
  out_.groups.push_back(std::move(g));
  add_member(*gp, root, rm);
  grow(*gp);
}

void Grouper::add_member(Group& g, const NodeRef& n, const DimMap& m) {
  auto& ms = g.maps[n.get()];
  if (ms.empty()) {
    g.members.push_back(n);
    if (!u_.duplicated(n)) ++g.computes;
  }
  if (std::find(ms.begin(), ms.end(), m) == ms.end()) ms.push_back(m);
  if (!u_.duplicated(n)) out_.group_of[n.get()] = g.id;
}

// Absorbs producers, latest first, so that all users of a candidate that
// can be in the group have been decided before the candidate.
void Grouper::grow(Group& g) {
  using Entry = std::pair<int, const Node*>;
  std::priority_queue<Entry> heap;
  std::unordered_map<const Node*, std::pair<NodeRef, std::vector<DimMap>>> pending;
  auto push_operands = [&](const NodeRef& n, const DimMap& m) {
    if (is_contraction(n->op())) return;  // operands are read by the matmul itself
    if (is_addressed_view(n)) return;     // and by the view's guarded loads
    if (is_collective(n->op())) return;   // and by the collective
    if (is_family(n->op())) return;       // and by the family's kernel
    if (n->op() == OpKind::Reshape && !is_unit_reshape(n)) return;
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      const NodeRef& o = n->input(i);
      auto& p = pending[o.get()];
      if (!p.first) {
        p.first = o;
        heap.push({u_.pos.at(o.get()), o.get()});
      }
      DimMap om = operand_map(n, m, i);
      if (std::find(p.second.begin(), p.second.end(), om) == p.second.end()) p.second.push_back(om);
    }
  };
  for (auto& m : g.maps[g.root.get()]) push_operands(g.root, m);
  while (!heap.empty()) {
    const Node* key = heap.top().second;
    heap.pop();
    auto node_maps = pending[key];
    pending.erase(key);
    const NodeRef& p = node_maps.first;
    g.remap.clear();
    if (!try_absorb(g, p, node_maps.second)) continue;
    if (!g.remap.empty()) {
      // The domain grew: renumber the maps still waiting in the heap.
      for (auto& [k2, entry] : pending)
        for (auto& mm : entry.second)
          for (int& e : mm) e = e < 0 ? -1 : g.remap[e];
    }
    for (auto& m : node_maps.second) {
      add_member(g, p, m);
    }
    for (auto& m : g.maps[p.get()]) push_operands(p, m);
  }
}

bool Grouper::try_absorb(Group& g, const NodeRef& p, std::vector<DimMap>& maps) {
  if (is_buffer_leaf(p)) return false;
  if (is_view(p->op())) return is_unit_reshape(p) || p->op() != OpKind::Reshape;
  if (u_.duplicated(p)) return true;
  if (!is_compute(p) || out_.group_of.count(p.get())) return false;
  if (!opts_.fuse) return false;
  if (u_.output_of.count(p.get()) || u_.must_store.count(p.get())) return false;
  if (g.computes >= kMaxKernelComputes) return false;
  std::vector<const Node*> eff;
  u_.effective_users(p, eff);
  for (const Node* u : eff)
    if (!g.maps.count(u)) return false;
  if (u_.assigns.count(p.get())) {
    bool any_full = false;
    for (auto& m : maps) any_full |= is_full_map(p, m);
    if (!any_full) return false;
  }
  if (is_elementwise(p->op())) return !(g.has_reduce && u_.epilogue.count(p.get()));
  if (is_contraction(p->op())) {
    if (g.matmul || g.has_reduce || maps.size() != 1) return false;
    if (opts_.unfused_matmuls.count(u_.pos.at(p.get()))) return false;
    if (p->shape() != g.domain) return false;
    for (int d = 0; d < p->rank(); ++d)
      if (maps[0][d] != d) return false;
    g.matmul = true;
    g.mm = p;
    return true;
  }
  if (is_reduce(p->op())) return absorb_reduce(g, p, maps);
  return false;
}

// A reduction joins a loop group when its operand spans the group's domain
// with the same reduced dims (a further phase), or when the group has no
// reduction yet and the reduction's kept dims cover the group's domain (the
// group becomes the reduction's epilogue; the domain grows).
bool Grouper::absorb_reduce(Group& g, const NodeRef& p, std::vector<DimMap>& maps) {
  if (g.matmul || maps.size() != 1) return false;
  const NodeRef& x = p->input(0);
  const IntList& axes = p->attrs().get_ints("axes");
  bool keep = p->attrs().get_bool("keepdims");
  const DimMap& m = maps[0];
  // Output dim j of p <-> operand dim in_dim[j].
  std::vector<int> in_dim;
  for (int d = 0; d < x->rank(); ++d) {
    bool red = std::binary_search(axes.begin(), axes.end(), d);
    if (!red || keep) in_dim.push_back(d);
  }
  // The group reduces the reduction's axes; p's map in it.
  auto take_reduction = [&] {
    g.reduced.assign(x->rank(), false);
    for (int64_t a : axes) g.reduced[a] = true;
    g.has_reduce = true;
  };
  auto reduction_map = [&] {
    DimMap pm;
    for (int d : in_dim) pm.push_back(g.reduced[d] ? -1 : d);
    return pm;
  };
  // Same domain: the reduction is a further phase (or the group's first).
  bool canonical = x->shape() == g.domain;
  for (size_t j = 0; canonical && j < m.size(); ++j) {
    int d = in_dim[j];
    bool red = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(d));
    canonical = red ? (m[j] == -1 || g.domain[d] == 1) : m[j] == d;
  }
  if (canonical) {
    if (g.has_reduce) {
      for (int d = 0; d < x->rank(); ++d)
        if (g.reduced[d] != std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(d)))
          return false;
    } else {
      take_reduction();
    }
    maps = {reduction_map()};
    return true;
  }
  if (g.has_reduce) return false;
  // Growth: old domain dim -> new domain dim (the reduction's operand dims).
  std::vector<int> remap(g.domain.size(), -1);
  for (size_t j = 0; j < m.size(); ++j) {
    if (m[j] < 0) continue;
    bool red = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(in_dim[j]));
    if (red) {
      if (g.domain[m[j]] != 1) return false;  // the epilogue cannot index a reduced dim
      continue;
    }
    remap[m[j]] = in_dim[j];
  }
  for (size_t d = 0; d < g.domain.size(); ++d)
    if (remap[d] < 0 && g.domain[d] != 1) return false;
  for (auto& [node, ms] : g.maps)
    for (auto& mm : ms)
      for (int& e : mm) e = e < 0 ? -1 : remap[e];
  g.remap = remap;
  g.domain = x->shape();
  take_reduction();
  maps = {reduction_map()};
  return true;
}

}  // namespace

namespace {

// A matmul epilogue that computes a transcendental function of elements it
// also loads from a full-size array (an activation's gradient: the GELU
// backward's exp of the pre-activation) runs at the pace of its misses: the
// epilogue of each 12x32 tile reads 12 rows a row stride apart, a pattern
// the hardware prefetchers do not follow, and the function's long
// dependency chains leave little to overlap them with. As a loop kernel of
// its own it streams. Measured on an AMD Zen 4 host (2 threads,
// 2026-12-08): d = dy @ W^T (4096x512x128) and GELU's gradient of d with
// two [4096,512] loads took 4.3-4.8 ms fused and 3.3-3.7 ms as a matmul
// and a loop kernel (float32; bfloat16 2.9-3.1 and 2.0-2.2 ms).
// A bias (a row broadcast) is not full-size.
bool heavy_epilogue(const Group& g) {
  bool transcendental = false, full_load = false;
  for (const NodeRef& n : g.members) {
    if (n == g.mm) continue;
    transcendental |= has_trait(n->op(), kTranscendental);
    for (const NodeRef& o : n->inputs())
      full_load |= o != g.mm && !g.member(o) && o->shape() == g.domain;
  }
  return transcendental && full_load;
}

}  // namespace

Grouping group(const Uses& uses, const GroupingOptions& opts) {
  Grouping out = Grouper(uses, opts).run();
  if (!opts.fuse) return out;
  GroupingOptions again = opts;
  for (const auto& g : out.groups)
    if (g->matmul && g->root != g->mm && heavy_epilogue(*g))
      again.unfused_matmuls.insert(uses.pos.at(g->mm.get()));
  if (again.unfused_matmuls.size() == opts.unfused_matmuls.size()) return out;
  return Grouper(uses, again).run();
}

std::string print_grouping(const Graph& g, const Uses& uses, const Grouping& grouping) {
  auto names = value_names(g);
  std::ostringstream os;
  for (const auto& gp : grouping.groups) {
    const Group& grp = *gp;
    const NodeRef& r = grp.root;
    os << "g" << grp.id << " "
       << (grp.matmul               ? "matmul"
           : is_collective(r->op()) ? "collective"
           : is_family(r->op())     ? "family"
                                    : "loop")
       << " [";
    for (size_t d = 0; d < grp.domain.size(); ++d) os << (d ? "," : "") << grp.domain[d];
    os << "]";
    if (grp.has_reduce) {
      os << " reduce{";
      bool first = true;
      for (size_t d = 0; d < grp.reduced.size(); ++d)
        if (grp.reduced[d]) {
          os << (first ? "" : ",") << d;
          first = false;
        }
      os << "}";
    }
    os << ":";
    // Members in program order, each with its maps (views and constants
    // duplicated into the kernel included).
    std::vector<const Node*> members;
    for (const NodeRef& m : grp.members) members.push_back(m.get());
    std::sort(members.begin(), members.end(),
              [&](const Node* a, const Node* b) { return uses.pos.at(a) < uses.pos.at(b); });
    for (const Node* m : members) {
      os << " " << names[m];
      for (const DimMap& map : grp.maps.at(m)) {
        os << "{";
        for (size_t j = 0; j < map.size(); ++j) os << (j ? "," : "") << map[j];
        os << "}";
      }
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace flowjit::jit::fusion_detail
