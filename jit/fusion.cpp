// fusion: grouping nodes into kernels, building the loop-level kernels,
// scheduling, and the runtime plan.
#include "jit/fusion.h"

#include <algorithm>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "ir/conv.h"
#include "ir/error.h"
#include "ir/printer.h"
#include "jit/memory.h"

namespace flowjit::jit {

using namespace ir;
using codegen::Access;
using codegen::KNode;
using codegen::KOp;
using codegen::Kernel;
using DimMap = std::vector<int>;  // per node dim: domain dim, or -1 (index 0)

namespace {

// ---------------------------------------------------------------- views

// True for a reshape that only inserts or removes extent-1 dimensions.
bool is_unit_reshape(const NodeRef& r) {
  if (r->op() != OpKind::Reshape) return false;
  Shape a, b;
  for (int64_t d : r->input(0)->shape())
    if (d != 1) a.push_back(d);
  for (int64_t d : r->shape())
    if (d != 1) b.push_back(d);
  return a == b;
}

// Sources (and random_uniform_at) cheap enough to recompute in every kernel
// that reads them (trait kCheap).
bool is_cheap_source(const NodeRef& n) { return is_cheap(n->op()); }

// Recomputed in every kernel that uses it instead of being stored.
bool is_duplicable(const NodeRef& n) {
  return is_view(n->op()) || is_cheap_source(n) || (is_elementwise(n->op()) && n->rank() == 0);
}

bool is_buffer_leaf(const NodeRef& n) {
  return n->op() == OpKind::Parameter || n->op() == OpKind::Variable;
}

bool is_compute(const NodeRef& n) {
  return is_elementwise(n->op()) || is_reduce(n->op()) || is_contraction(n->op()) ||
         is_collective(n->op());
}

// Addressed views (windows, pads, slices, gathers) read their operands
// through offsets, guarded and indirect coordinates, so the operands must
// exist in memory (like the base of a non-unit reshape).
bool is_addressed_view(const NodeRef& n) { return is_addressed(n->op()); }

// An index read by a gather: a strided view of an integer buffer, clamped
// into [0, limit) and scaled by `stride` (codegen::Indirect).
struct IndirectView {
  NodeRef base;
  std::vector<int64_t> strides;  // elements of base, per dim of the viewed node
  int64_t offset = 0;
  int64_t limit = 1;
  int64_t stride = 0;  // elements of the gathered buffer per index unit
};

struct View {
  NodeRef base;                  // a buffer: parameter, variable or computed node
  std::vector<int64_t> strides;  // elements, per dim of the viewed node
  int64_t offset = 0;
  std::vector<codegen::Coord> coords;  // coef per dim of the viewed node
  double pad = 0;                      // the value of elements outside the coords' range
  std::vector<IndirectView> indirect;  // strides per dim of the viewed node
  bool plain() const { return coords.empty() && indirect.empty(); }
};

std::optional<View> resolve_view(const NodeRef& n);

// window(x): lead dims as x's, window positions and taps through one
// coordinate per spatial dim; a coordinate that can never leave the input
// folds into plain strides.
std::optional<View> resolve_window(const NodeRef& n) {
  auto v = resolve_view(n->input(0));
  if (!v || !v->plain()) return std::nullopt;
  ConvGeometry g = geometry_of(*n);
  int S = g.spatial, L = n->rank() - 2 * S;  // both views: [lead..., spatial..., taps...]
  View w{v->base, std::vector<int64_t>(n->rank(), 0), v->offset, {}, 0};
  for (int j = 0; j < L; ++j) w.strides[j] = v->strides[j];
  bool window = n->op() == OpKind::Window;
  if (window) w.pad = n->attrs().get_float("pad_value");
  for (int i = 0; i < S; ++i) {
    int64_t st = v->strides[L + i];
    codegen::Coord c;
    c.coef.assign(n->rank(), 0);
    if (window) {
      // position o * stride + t * dilation - pad_lo in [0, in)
      c.coef[L + i] = g.strides[i];
      c.coef[L + S + i] = g.dilations[i];
      c.c0 = -g.pads_lo[i];
      c.limit = g.in[i];
      bool inside = g.pads_lo[i] == 0 && (g.out[i] - 1) * g.strides[i] + (g.kernel[i] - 1) * g.dilations[i] < g.in[i];
      if (inside) {
        w.strides[L + i] = g.strides[i] * st;
        w.strides[L + S + i] = g.dilations[i] * st;
        continue;
      }
    } else {
      // window position (i + pad_lo - t * dilation) / stride in [0, out); t passes through
      c.coef[L + i] = 1;
      c.coef[L + S + i] = -g.dilations[i];
      c.c0 = g.pads_lo[i];
      c.div = g.strides[i];
      c.limit = g.out[i];
      w.strides[L + S + i] = v->strides[L + S + i];
    }
    c.stride = st;
    w.coords.push_back(c);
  }
  return w;
}

// pad(x): a guarded coordinate per padded dim (ir/array.h).
std::optional<View> resolve_pad(const NodeRef& n) {
  auto v = resolve_view(n->input(0));
  if (!v || !v->plain()) return std::nullopt;
  const Attrs& a = n->attrs();
  const IntList &lo = a.get_ints("pads_lo"), &hi = a.get_ints("pads_hi"), &in = a.get_ints("interior");
  const Shape& x = n->input(0)->shape();
  View w{v->base, v->strides, v->offset, {}, a.get_float("pad_value"), {}};
  for (int d = 0; d < n->rank(); ++d) {
    if (lo[d] == 0 && hi[d] == 0 && in[d] == 0) continue;
    codegen::Coord c;
    c.coef.assign(n->rank(), 0);
    c.coef[d] = 1;
    c.c0 = -lo[d];
    c.div = in[d] + 1;
    c.limit = x[d];
    c.stride = v->strides[d];
    w.strides[d] = 0;
    w.coords.push_back(c);
  }
  return w;
}

// slice(x): an offset and scaled strides.
std::optional<View> resolve_slice(const NodeRef& n) {
  auto v = resolve_view(n->input(0));
  if (!v || !v->plain()) return std::nullopt;
  const IntList &begin = n->attrs().get_ints("begin"), &step = n->attrs().get_ints("step");
  for (int d = 0; d < n->rank(); ++d) {
    v->offset += begin[d] * v->strides[d];
    v->strides[d] *= step[d];
  }
  return v;
}

// gather(p, idx) and gather_nd(p, idx): p's strides on the dims that are not
// indexed, and one indirect coordinate per indexed dim.
std::optional<View> resolve_gather(const NodeRef& n) {
  auto vp = resolve_view(n->input(0));
  auto vi = resolve_view(n->input(1));
  if (!vp || !vp->plain() || !vi || !vi->plain()) return std::nullopt;
  const Shape &p = n->input(0)->shape(), &idx = n->input(1)->shape();
  int rp = static_cast<int>(p.size()), ri = static_cast<int>(idx.size());
  View w{vp->base, std::vector<int64_t>(n->rank(), 0), vp->offset, {}, 0, {}};
  if (n->op() == OpKind::Gather) {
    int axis = static_cast<int>(n->attrs().get_int("axis"));
    int bd = static_cast<int>(n->attrs().get_int("batch_dims"));
    for (int d = 0; d < axis; ++d) w.strides[d] = vp->strides[d];
    for (int d = axis + 1; d < rp; ++d) w.strides[d + ri - bd - 1] = vp->strides[d];
    IndirectView iv{vi->base, std::vector<int64_t>(n->rank(), 0), vi->offset, p[axis], vp->strides[axis]};
    for (int j = 0; j < ri; ++j) iv.strides[j < bd ? j : axis + j - bd] = vi->strides[j];
    w.indirect.push_back(iv);
    return w;
  }
  int k = static_cast<int>(idx.back());
  for (int d = k; d < rp; ++d) w.strides[ri - 1 + d - k] = vp->strides[d];
  for (int c = 0; c < k; ++c) {
    IndirectView iv{vi->base, std::vector<int64_t>(n->rank(), 0), vi->offset + c * vi->strides[ri - 1],
                    p[c], vp->strides[c]};
    for (int j = 0; j + 1 < ri; ++j) iv.strides[j] = vi->strides[j];
    w.indirect.push_back(iv);
  }
  return w;
}

// How `n` addresses memory, when it is a view chain over a buffer.
std::optional<View> resolve_view(const NodeRef& n) {
  switch (n->op()) {
    case OpKind::Transpose: {
      auto v = resolve_view(n->input(0));
      if (!v) return std::nullopt;
      const IntList& perm = n->attrs().get_ints("perm");
      auto permute = [&](std::vector<int64_t>& x) {
        std::vector<int64_t> s(perm.size());
        for (size_t i = 0; i < perm.size(); ++i) s[i] = x[perm[i]];
        x = s;
      };
      permute(v->strides);
      for (auto& c : v->coords) permute(c.coef);
      for (auto& i : v->indirect) permute(i.strides);
      return v;
    }
    case OpKind::Window:
    case OpKind::Unwindow:
      return resolve_window(n);
    case OpKind::Pad:
      return resolve_pad(n);
    case OpKind::Slice:
      return resolve_slice(n);
    case OpKind::Gather:
    case OpKind::GatherNd:
      return resolve_gather(n);
    case OpKind::Broadcast: {
      auto v = resolve_view(n->input(0));
      if (!v) return std::nullopt;
      const Shape& from = n->input(0)->shape();
      const Shape& to = n->shape();
      size_t off = to.size() - from.size();
      auto widen = [&](std::vector<int64_t>& x) {
        std::vector<int64_t> s(to.size(), 0);
        for (size_t i = 0; i < from.size(); ++i)
          s[i + off] = (from[i] == 1 && to[i + off] != 1) ? 0 : x[i];
        x = s;
      };
      widen(v->strides);
      for (auto& c : v->coords) widen(c.coef);
      for (auto& i : v->indirect) widen(i.strides);
      return v;
    }
    case OpKind::Reshape: {
      auto v = resolve_view(n->input(0));
      if (!v) return std::nullopt;
      const Shape& from = n->input(0)->shape();
      if (v->plain() && (v->strides == contiguous_strides(from) || num_elements(from) <= 1)) {
        v->strides = contiguous_strides(n->shape());
        return v;
      }
      if (!is_unit_reshape(n)) return std::nullopt;
      auto reindex = [&](std::vector<int64_t>& x) {
        std::vector<int64_t> nonunit;
        for (size_t i = 0; i < from.size(); ++i)
          if (from[i] != 1) nonunit.push_back(x[i]);
        std::vector<int64_t> s;
        size_t k = 0;
        for (int64_t d : n->shape()) s.push_back(d == 1 ? 0 : nonunit[k++]);
        x = s;
      };
      reindex(v->strides);
      for (auto& c : v->coords) reindex(c.coef);
      for (auto& i : v->indirect) reindex(i.strides);
      return v;
    }
    default:
      if (is_buffer_leaf(n) || is_compute(n)) return View{n, contiguous_strides(n->shape()), 0, {}, 0, {}};
      return std::nullopt;
  }
}

// A matmul reads an operand's batch dims as one stride: they must collapse
// (a batch broadcast by numpy rules or a transposed batch does not, and is
// copied first).
bool batch_collapses(const View& v, const NodeRef& x) {
  for (int i = 0; i + 1 < x->rank() - 2; ++i)
    if (v.strides[i] != v.strides[i + 1] * x->shape()[i + 1]) return false;
  return true;
}

bool is_contiguous_view(const NodeRef& n) {
  auto v = resolve_view(n);
  return v && v->plain() && v->offset == 0 && v->strides == contiguous_strides(n->shape());
}

// ---------------------------------------------------------------- maps

DimMap broadcast_map(const Shape& from, const Shape& to, const DimMap& to_map) {
  size_t off = to.size() - from.size();
  DimMap m(from.size());
  for (size_t i = 0; i < from.size(); ++i)
    m[i] = (from[i] == 1 && to[i + off] != 1) ? -1 : to_map[i + off];
  return m;
}

// The map of operand `i` of member `n`, given n's map. Reductions map their
// operand to the identity over the group's domain (checked canonical).
DimMap operand_map(const NodeRef& n, const DimMap& m, size_t i) {
  const NodeRef& o = n->input(i);
  switch (n->op()) {
    case OpKind::Transpose: {
      const IntList& perm = n->attrs().get_ints("perm");
      DimMap mo(perm.size());
      for (size_t j = 0; j < perm.size(); ++j) mo[perm[j]] = m[j];
      return mo;
    }
    case OpKind::Reshape: {  // unit reshapes only
      DimMap nonunit;
      for (size_t j = 0; j < n->shape().size(); ++j)
        if (n->shape()[j] != 1) nonunit.push_back(m[j]);
      DimMap mo;
      size_t k = 0;
      for (int64_t d : o->shape()) mo.push_back(d == 1 ? -1 : nonunit[k++]);
      return mo;
    }
    default:
      if (is_reduce(n->op())) {
        DimMap mo(o->rank());
        for (int j = 0; j < o->rank(); ++j) mo[j] = j;
        return mo;
      }
      return broadcast_map(o->shape(), n->shape(), m);
  }
}

// A map under which a node can be stored: every non-unit dim has its own
// domain dim.
bool is_full_map(const NodeRef& n, const DimMap& m) {
  std::set<int> seen;
  for (size_t j = 0; j < m.size(); ++j) {
    if (n->shape()[j] == 1) continue;
    if (m[j] < 0 || !seen.insert(m[j]).second) return false;
  }
  return true;
}

// ---------------------------------------------------------------- groups

struct Group {
  int id = 0;
  bool matmul = false;
  NodeRef root;
  NodeRef mm;  // the MatMul node of a matmul group
  Shape domain;
  std::vector<bool> reduced;
  bool has_reduce = false;
  std::vector<int> remap;  // set when absorbing a reduction renumbered the domain
  std::unordered_map<const Node*, std::vector<DimMap>> maps;  // members and their maps
  std::vector<NodeRef> members;                                 // in absorption order
  bool member(const NodeRef& n) const { return maps.count(n.get()) > 0; }
};

struct Storage {  // where a materialized value lives
  enum Kind { Input, Output, Arena, Variable } kind = Arena;
  int index = 0;  // input/output index, variable index, or arena buffer index
};

class Fuser {
 public:
  Fuser(const Graph& g, const std::string& job, FusionOptions opts) : job_(job), opts_(opts) {
    g_ = materialize(g);
  }

  FusedProgram run() {
    analyze();
    form_groups();
    FusedProgram out;
    out.graph = g_;
    build_and_schedule(out);
    return out;
  }

 private:
  // ---- preparation: make every output, assign value and matmul operand a
  // kernel-computed buffer.

  static NodeRef identity(const NodeRef& n) { return make_node(OpKind::Identity, {n}, {}, n->loc()); }

  // Collectives write only their own buffer: a result or an assigned value
  // is copied out of it by a kernel.
  static bool needs_identity_for_store(const NodeRef& n) {
    return !is_compute(n) || is_duplicable(n) || is_collective(n->op());
  }

  Graph materialize(const Graph& g) {
    Graph h = rewrite_graph(g, [](const NodeRef& n, std::vector<NodeRef> in) -> NodeRef {
      if (is_contraction(n->op()) || is_addressed_view(n)) {
        // Operands addressed as strided buffers (addressed views add their
        // own offsets and coordinates).
        for (auto& x : in) {
          auto v = resolve_view(x);
          if (!v || !v->plain() || is_duplicable(v->base) ||
              (n->op() == OpKind::MatMul && !batch_collapses(*v, x)))
            x = identity(x);
        }
      } else if (n->op() == OpKind::Reshape && !is_unit_reshape(n)) {
        if (!is_contiguous_view(in[0])) in[0] = identity(in[0]);
      } else if (n->op() == OpKind::Assign) {
        if (needs_identity_for_store(in[1])) in[1] = identity(in[1]);
      } else if (is_collective(n->op())) {
        // The runtime reads the operand as one contiguous buffer.
        if (!is_buffer_leaf(in[0]) && !is_compute(in[0])) in[0] = identity(in[0]);
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

  void analyze() {
    topo_ = g_.topo_order();
    for (size_t i = 0; i < topo_.size(); ++i) pos_[topo_[i].get()] = static_cast<int>(i);
    for (const NodeRef& n : topo_) {
      if (n->op() == OpKind::Assign) {
        assigns_[n->input(1).get()].push_back(n);
        continue;
      }
      for (auto& i : n->inputs()) users_[i.get()].push_back(n);
    }
    for (size_t i = 0; i < g_.outputs.size(); ++i) output_of_[g_.outputs[i].get()] = static_cast<int>(i);
    for (size_t i = 0; i < g_.params.size(); ++i)
      param_index_[g_.params[i].get()] = static_cast<int>(g_.params[i]->attrs().get_int("index"));
    // Elementwise chains right after a single-use matmul are kept for that
    // matmul's epilogue: reduction kernels do not take them.
    for (const NodeRef& n : topo_) {
      if (!is_contraction(n->op())) continue;
      NodeRef cur = n;
      while (true) {
        std::vector<const Node*> eff;
        effective_users(cur, eff);
        if (eff.size() != 1 || output_of_.count(cur.get())) break;
        const Node* u = eff[0];
        if (!is_elementwise(u->op()) || u->shape() != n->shape()) break;
        epilogue_.insert(u);
        cur = node_ref(u);
        if (!cur) break;
      }
    }
    // Bases of matmul operands and of reshapes must exist in memory.
    for (const NodeRef& n : topo_) {
      if (is_contraction(n->op()) || is_addressed_view(n)) {
        for (auto& x : n->inputs()) must_store_.insert(resolve_view(x)->base.get());
      } else if (n->op() == OpKind::Reshape && !is_unit_reshape(n)) {
        if (auto v = resolve_view(n->input(0))) must_store_.insert(v->base.get());
      } else if (is_collective(n->op())) {
        must_store_.insert(n->input(0).get());
      }
    }
  }

  NodeRef node_ref(const Node* n) {
    auto it = pos_.find(n);
    return it == pos_.end() ? nullptr : topo_[it->second];
  }

  // Compute nodes that consume `n`, looking through duplicable users.
  void effective_users(const NodeRef& n, std::vector<const Node*>& out) {
    auto it = users_.find(n.get());
    if (it == users_.end()) return;
    for (const NodeRef& u : it->second) {
      // A duplicable user that must be stored is a kernel root of its own.
      bool stored = output_of_.count(u.get()) || assigns_.count(u.get());
      if (is_duplicable(u) && !stored) {
        effective_users(u, out);
      } else {
        out.push_back(u.get());
      }
    }
  }

  // ---- grouping

  void form_groups() {
    for (auto it = topo_.rbegin(); it != topo_.rend(); ++it) {
      const NodeRef& n = *it;
      if (!is_compute(n) || group_of_.count(n.get())) continue;
      if (is_duplicable(n) && !output_of_.count(n.get()) && !assigns_.count(n.get()) &&
          !must_store_.count(n.get()))
        continue;
      new_group(n);
    }
  }

  void new_group(const NodeRef& root) {
    auto g = std::make_unique<Group>();
    g->id = static_cast<int>(groups_.size());
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
    groups_.push_back(std::move(g));
    add_member(*gp, root, rm);
    grow(*gp);
  }

  void add_member(Group& g, const NodeRef& n, const DimMap& m) {
    auto& ms = g.maps[n.get()];
    if (ms.empty()) g.members.push_back(n);
    if (std::find(ms.begin(), ms.end(), m) == ms.end()) ms.push_back(m);
    if (!is_duplicable(n)) group_of_[n.get()] = g.id;
  }

  // Absorbs producers, latest first, so that all users of a candidate that
  // can be in the group have been decided before the candidate.
  void grow(Group& g) {
    using Entry = std::pair<int, const Node*>;
    std::priority_queue<Entry> heap;
    std::unordered_map<const Node*, std::pair<NodeRef, std::vector<DimMap>>> pending;
    auto push_operands = [&](const NodeRef& n, const DimMap& m) {
      if (is_contraction(n->op())) return;  // operands are read by the matmul itself
      if (is_addressed_view(n)) return;    // and by the view's guarded loads
      if (is_collective(n->op())) return;     // and by the collective
      if (n->op() == OpKind::Reshape && !is_unit_reshape(n)) return;
      for (size_t i = 0; i < n->inputs().size(); ++i) {
        const NodeRef& o = n->input(i);
        auto& p = pending[o.get()];
        if (!p.first) {
          p.first = o;
          heap.push({pos_[o.get()], o.get()});
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

  bool try_absorb(Group& g, const NodeRef& p, std::vector<DimMap>& maps) {
    if (is_buffer_leaf(p)) return false;
    if (is_view(p->op())) return is_unit_reshape(p) || p->op() != OpKind::Reshape;
    if (is_duplicable(p)) return true;
    if (!is_compute(p) || group_of_.count(p.get())) return false;
    if (!opts_.fuse) return false;
    if (output_of_.count(p.get()) || must_store_.count(p.get())) return false;
    std::vector<const Node*> eff;
    effective_users(p, eff);
    for (const Node* u : eff)
      if (!g.maps.count(u)) return false;
    if (assigns_.count(p.get())) {
      bool any_full = false;
      for (auto& m : maps) any_full |= is_full_map(p, m);
      if (!any_full) return false;
    }
    if (is_elementwise(p->op())) return !(g.has_reduce && epilogue_.count(p.get()));
    if (is_contraction(p->op())) {
      if (g.matmul || g.has_reduce || maps.size() != 1) return false;
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
  bool absorb_reduce(Group& g, const NodeRef& p, std::vector<DimMap>& maps) {
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
        g.reduced.assign(x->rank(), false);
        for (int64_t a : axes) g.reduced[a] = true;
        g.has_reduce = true;
      }
      DimMap pm;
      for (size_t j = 0; j < in_dim.size(); ++j) pm.push_back(g.reduced[in_dim[j]] ? -1 : in_dim[j]);
      maps = {pm};
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
    g.reduced.assign(x->rank(), false);
    for (int64_t a : axes) g.reduced[a] = true;
    g.has_reduce = true;
    DimMap pm;
    for (size_t j = 0; j < in_dim.size(); ++j) pm.push_back(g.reduced[in_dim[j]] ? -1 : in_dim[j]);
    maps = {pm};
    return true;
  }

  // ---- kernels

  Storage storage_of(const Node* n) {
    auto it = storage_.find(n);
    FJ_CHECK(it != storage_.end(), "value read before it is materialized: ", op_name(n->op()));
    return it->second;
  }

  int variable_index(const NodeRef& var) {
    const std::string& name = var->attrs().get_str("name");
    auto it = var_index_.find(name);
    if (it != var_index_.end()) return it->second;
    int idx = static_cast<int>(plan_vars_.size());
    plan_vars_.emplace_back(name, var->type());
    var_index_[name] = idx;
    return idx;
  }

  struct Built {
    Kernel k;
    std::vector<const void*> arg_buffers;  // which buffer each arg is: a node, or a temporary's key
    std::vector<Storage> arg_storage;
    std::vector<const Node*> reads;   // buffers read
    std::vector<std::string> var_writes;
    std::vector<std::string> var_reads;
    std::vector<const Node*> computes;  // members, for the description
    std::optional<runtime::CollectiveStep> collective;  // a collective's launch: no kernel code
  };

  class KernelBuilder {
   public:
    KernelBuilder(Fuser& f, Group& g, Built& b) : f_(f), g_(g), b_(b) {}

    int arg_for(const void* buffer, Storage s, DType dt, int64_t elems, bool write) {
      for (size_t i = 0; i < b_.arg_buffers.size(); ++i)
        if (b_.arg_buffers[i] == buffer) {
          (write ? b_.k.args[i].written : b_.k.args[i].read) = true;
          return static_cast<int>(i);
        }
      b_.arg_buffers.push_back(buffer);
      b_.arg_storage.push_back(s);
      codegen::KernelArg a;
      a.dtype = dt;
      a.elements = elems;
      (write ? a.written : a.read) = true;
      b_.k.args.push_back(a);
      return static_cast<int>(b_.k.args.size()) - 1;
    }

    std::vector<int64_t> domain_strides(const std::vector<int64_t>& own, const DimMap& m) {
      std::vector<int64_t> s(g_.domain.size(), 0);
      for (size_t j = 0; j < m.size(); ++j)
        if (m[j] >= 0) s[m[j]] += own[j];
      return s;
    }

    // The kernel argument of a buffer this kernel reads.
    int read_arg(const NodeRef& base) {
      Storage st;
      if (base->op() == OpKind::Variable) {
        st = {Storage::Variable, f_.variable_index(base)};
        b_.var_reads.push_back(base->attrs().get_str("name"));
      } else {
        st = f_.storage_of(base.get());
      }
      if (std::find(b_.reads.begin(), b_.reads.end(), base.get()) == b_.reads.end())
        b_.reads.push_back(base.get());
      return arg_for(base.get(), st, base->dtype(), base->type().numel(), false);
    }

    int push_load(const Access& a, DType dt, std::vector<int> operands = {}) {
      b_.k.loads.push_back(a);
      KNode kn;
      kn.kind = KOp::Load;
      kn.dtype = dt;
      kn.access = static_cast<int>(b_.k.loads.size()) - 1;
      kn.operands = std::move(operands);
      return push(kn);
    }

    int leaf(const NodeRef& n, const DimMap& m) {
      auto v = resolve_view(n);
      FJ_CHECK(v.has_value(), "kernel operand is not addressable: ", op_name(n->op()));
      // Gathers: each index is a load of its own, an operand of this load.
      std::vector<codegen::Indirect> indirect;
      std::vector<int> operands;
      for (const IndirectView& iv : v->indirect) {
        Access ia{read_arg(iv.base), domain_strides(iv.strides, m), iv.offset, {}, 0, {}};
        int node = push_load(ia, iv.base->dtype());
        indirect.push_back({node, iv.limit, iv.stride});
        operands.push_back(node);
      }
      Access a{read_arg(v->base), domain_strides(v->strides, m), v->offset, {}, v->pad, indirect};
      for (codegen::Coord c : v->coords) {
        c.coef = domain_strides(c.coef, m);
        a.coords.push_back(std::move(c));
      }
      return push_load(a, n->dtype(), operands);
    }

    int push(const KNode& kn) {
      b_.k.nodes.push_back(kn);
      return static_cast<int>(b_.k.nodes.size()) - 1;
    }

    int inst(const NodeRef& n, const DimMap& m) {
      auto key = std::make_pair(n.get(), m);
      auto it = memo_.find(key);
      if (it != memo_.end()) return it->second;
      int r = inst_new(n, m);
      memo_[key] = r;
      return r;
    }

    int inst_new(const NodeRef& n, const DimMap& m) {
      if (is_view(n->op())) {
        if ((n->op() == OpKind::Reshape && !is_unit_reshape(n)) || is_addressed_view(n)) return leaf(n, m);
        return inst(n->input(0), operand_map(n, m, 0));  // re-indexed, no arithmetic
      }
      if (is_buffer_leaf(n)) return leaf(n, m);
      if (is_duplicable(n) || g_.member(n)) return inst_member(n, m);
      return leaf(n, m);  // computed and stored by another kernel
    }

    int inst_member(const NodeRef& n, const DimMap& m) {
      KNode kn;
      kn.dtype = n->dtype();
      const Attrs& a = n->attrs();
      switch (n->op()) {
        case OpKind::Fill: {
          kn.kind = KOp::Const;
          kn.value = a.get_float("value");
          const AttrValue* v = a.find("value");
          if (auto* i = std::get_if<int64_t>(v)) kn.ivalue = *i;  // exact for int64
          else kn.ivalue = static_cast<int64_t>(kn.value);
          return push(kn);
        }
        case OpKind::Iota: {
          kn.kind = KOp::Index;
          kn.index_strides.assign(g_.domain.size(), 0);
          int axis = static_cast<int>(a.get_int("axis"));
          if (m[axis] >= 0) kn.index_strides[m[axis]] = 1;
          return push(kn);
        }
        case OpKind::RandomUniform:
        case OpKind::RandomNormal:
        case OpKind::TruncatedNormal:
          kn.kind = KOp::Random;
          kn.op = n->op();
          kn.seed = a.get_int("seed");
          kn.index_strides = domain_strides(contiguous_strides(n->shape()), m);
          return push(kn);
        case OpKind::RandomUniformAt:
          kn.kind = KOp::Random;
          kn.op = OpKind::RandomUniform;
          kn.seed = a.get_int("seed");
          kn.index_strides = domain_strides(contiguous_strides(n->shape()), m);
          kn.operands = {inst(n->input(0), operand_map(n, m, 0))};
          return push(kn);
        case OpKind::MatMul:
        case OpKind::Conv:
        case OpKind::ConvDataGrad:
        case OpKind::ConvFilterGrad:
          FJ_CHECK(n == g_.mm, "second matmul in a kernel");
          kn.kind = KOp::Acc;
          b_.computes.push_back(n.get());
          return push(kn);
        default:
          break;
      }
      if (is_reduce(n->op())) {
        kn.kind = KOp::Reduce;
        kn.op = n->op();
        DimMap om = operand_map(n, m, 0);
        kn.operands = {inst(n->input(0), om)};
        if (n->op() == OpKind::ArgMax || n->op() == OpKind::ArgMin) {
          kn.index_strides.assign(g_.domain.size(), 0);
          kn.index_strides[a.get_ints("axes")[0]] = 1;
        }
        b_.computes.push_back(n.get());
        return push(kn);
      }
      FJ_CHECK(is_elementwise(n->op()), "cannot lower ", op_name(n->op()), " inside a kernel");
      kn.kind = KOp::Compute;
      kn.op = n->op();
      for (size_t i = 0; i < n->inputs().size(); ++i)
        kn.operands.push_back(inst(n->input(i), operand_map(n, m, i)));
      if (!is_duplicable(n)) b_.computes.push_back(n.get());
      return push(kn);
    }

    void store(const NodeRef& n, const DimMap& m, const void* buffer, Storage s) {
      int node = inst(n, m);
      int arg = arg_for(buffer, s, n->dtype(), n->type().numel(), true);
      Access a{arg, domain_strides(contiguous_strides(n->shape()), m), 0};
      b_.k.stores.push_back({node, a});
    }

   private:
    Fuser& f_;
    Group& g_;
    Built& b_;
    std::map<std::pair<const Node*, DimMap>, int> memo_;
  };

  const DimMap& store_map(Group& g, const NodeRef& n) {
    for (auto& m : g.maps[n.get()])
      if (is_full_map(n, m)) return m;
    return g.maps[n.get()].front();
  }

  std::string kernel_name(int index, Group& g) {
    std::string s = "k" + std::to_string(index);
    std::set<std::string> seen;
    int count = 0;
    std::vector<NodeRef> ordered = g.members;
    std::sort(ordered.begin(), ordered.end(),
              [&](const NodeRef& a, const NodeRef& b) { return pos_[a.get()] < pos_[b.get()]; });
    for (auto& n : ordered) {
      if (is_view(n->op()) || is_cheap_source(n)) continue;
      std::string op(op_name(n->op()));
      if (seen.insert(op).second && count++ < 4) s += "_" + op;
    }
    return s;
  }

  // Builds every group's kernel, orders them, and writes the plan.
  void build_and_schedule(FusedProgram& out) {
    // Storage for inputs and for every value a group stores.
    for (auto& [node, idx] : param_index_) storage_[node] = {Storage::Input, idx};
    int arena_buffers = 0;
    std::vector<const Node*> arena_nodes;
    for (auto& g : groups_) {
      const Node* r = g->root.get();
      auto o = output_of_.find(r);
      if (o != output_of_.end()) {
        storage_[r] = {Storage::Output, o->second};
      } else if (users_.count(r) && !users_[r].empty()) {
        storage_[r] = {Storage::Arena, arena_buffers++};
        arena_nodes.push_back(r);
      }
    }
    // First attempt: assigns stored in place. If the schedule has a cycle or
    // an in-place hazard, those assigns go through temporaries instead.
    std::vector<Built> built;
    std::vector<int> order;
    std::set<std::string> deferred;
    for (int attempt = 0; attempt < 2; ++attempt) {
      built.clear();
      std::set<std::string> hazards;
      for (auto& g : groups_) built.push_back(build_group(*g, deferred, hazards));
      if (!hazards.empty() && attempt == 0) {
        deferred.insert(hazards.begin(), hazards.end());
        continue;
      }
      if (schedule(built, order)) break;
      FJ_CHECK(attempt == 0, "fusion: no schedule even with deferred assigns");
      for (auto& [val, as] : assigns_)
        for (auto& a : as) deferred.insert(a->input(0)->attrs().get_str("name"));
    }
    // Deferred assigns: copy kernels after everything else.
    std::vector<Built> copies = build_deferred_copies(deferred);

    // Launch order, arena lives and the plan.
    runtime::Plan& plan = out.plan;
    plan.job_name = job_;
    for (auto& p : g_.params) plan.inputs.push_back(p->type());
    for (auto& o : g_.outputs) plan.outputs.push_back(o->type());
    std::vector<Built*> launches;
    for (int gi : order) launches.push_back(&built[gi]);
    for (auto& c : copies) launches.push_back(&c);

    // Arena buffers: intermediates, then the temporaries of deferred assigns
    // (live for the whole run).
    std::vector<BufferLife> lives(arena_buffers);
    for (int i = 0; i < arena_buffers; ++i) {
      lives[i].bytes = arena_nodes[i]->type().bytes();
      lives[i].first = -1;
    }
    lives.insert(lives.end(), temp_lives_.begin(), temp_lives_.end());
    for (size_t li = 0; li < launches.size(); ++li) {
      Built& b = *launches[li];
      for (size_t a = 0; a < b.arg_storage.size(); ++a) {
        const Storage& s = b.arg_storage[a];
        if (s.kind != Storage::Arena) continue;
        FJ_CHECK(s.index >= 0 && s.index < static_cast<int>(lives.size()), "arena buffer index");
        BufferLife& l = lives[s.index];
        if (b.k.args[a].written && l.first < 0) l.first = static_cast<int>(li);
        l.last = std::max(l.last, static_cast<int>(li));
      }
    }
    for (auto& l : lives)
      if (l.first < 0) l.first = 0;
    for (size_t t = 0; t < temp_lives_.size(); ++t) {
      BufferLife& l = lives[arena_buffers + t];
      l.first = 0;
      l.last = static_cast<int>(launches.size());
    }
    ArenaPlan ap = plan_arena(lives);
    plan.arena_bytes = ap.arena_bytes;
    out.bytes_without_reuse = ap.total_bytes;
    plan.variables = plan_vars_;

    auto names = value_names(g_);
    std::ostringstream desc;
    for (size_t li = 0; li < launches.size(); ++li) {
      Built& b = *launches[li];
      runtime::Launch l;
      l.symbol = b.k.name;
      for (size_t a = 0; a < b.arg_storage.size(); ++a) {
        const Storage& s = b.arg_storage[a];
        runtime::BufferRef r;
        switch (s.kind) {
          case Storage::Input: r = {runtime::BufferKind::Input, s.index, 0}; break;
          case Storage::Output: r = {runtime::BufferKind::Output, s.index, 0}; break;
          case Storage::Variable: r = {runtime::BufferKind::Variable, s.index, 0}; break;
          case Storage::Arena: r = {runtime::BufferKind::Arena, 0, ap.offsets[s.index]}; break;
        }
        l.args.push_back(r);
      }
      l.summary = b.k.summary;
      l.collective = b.collective;
      plan.launches.push_back(l);
      // Description: name, computed values, stores.
      desc << b.k.name << ":";
      std::vector<const Node*> comp = b.computes;
      std::sort(comp.begin(), comp.end(), [&](const Node* x, const Node* y) { return pos_[x] < pos_[y]; });
      comp.erase(std::unique(comp.begin(), comp.end()), comp.end());
      for (const Node* c : comp) desc << " " << names[c];
      desc << " ->";
      for (auto& s : b.k.stores) {
        const Node* buf = static_cast<const Node*>(b.arg_buffers[s.where.arg]);
        const Storage& st = b.arg_storage[s.where.arg];
        switch (st.kind) {
          case Storage::Output: desc << " out" << st.index; break;
          case Storage::Variable: desc << " var:" << plan_vars_[st.index].first; break;
          default: desc << " " << (names.count(buf) ? names[buf] : std::string("tmp")); break;
        }
      }
      desc << "\n";
      out.kernels.push_back(std::move(b.k));
    }
    out.description = desc.str();
  }

  // A collective's launch: no kernel code, args {operand, result}, and the
  // typed step the runtime runs (the name is for dumps only).
  Built build_collective(Group& g) {
    Built b;
    Kernel& k = b.k;
    const NodeRef& c = g.root;
    const NodeRef& x = c->input(0);
    k.kind = Kernel::Kind::Collective;
    k.domain = c->shape();
    k.reduced.assign(c->rank(), false);
    KernelBuilder kb(*this, g, b);
    Storage in_st;
    if (x->op() == OpKind::Variable) {
      in_st = {Storage::Variable, variable_index(x)};
      b.var_reads.push_back(x->attrs().get_str("name"));
    } else {
      in_st = storage_of(x.get());
    }
    b.reads.push_back(x.get());
    kb.arg_for(x.get(), in_st, x->dtype(), x->type().numel(), false);
    FJ_CHECK(storage_.count(c.get()), "collective result without storage");
    kb.arg_for(c.get(), storage_[c.get()], c->dtype(), c->type().numel(), true);
    // [outer][parts][inner] around the axis: inner counts the elements of one
    // device's piece per outer index.
    int64_t parts = c->attrs().get_int("parts");
    int64_t outer = 1, inner = c->type().numel();
    if (c->op() != OpKind::AllReduce) {
      int axis = static_cast<int>(c->attrs().get_int("axis"));
      const Shape& piece = c->op() == OpKind::AllGather ? x->shape() : c->shape();
      outer = 1;
      for (int d = 0; d < axis; ++d) outer *= piece[d];
      inner = 1;
      for (size_t d = axis; d < piece.size(); ++d) inner *= piece[d];
    }
    std::string op(op_name(c->op()));
    k.name = "@k" + std::to_string(g.id) + "." + op + "." + std::string(dtype_short_name(c->dtype())) +
             ".p" + std::to_string(parts) + ".o" + std::to_string(outer) + ".i" + std::to_string(inner);
    k.summary = op + " " + x->type().str() + " -> " + c->type().str() + " over " +
                std::to_string(parts) + " devices";
    runtime::CollectiveStep step;
    switch (c->op()) {
      case OpKind::AllReduce: step.op = runtime::CollectiveStep::Op::AllReduce; break;
      case OpKind::AllGather: step.op = runtime::CollectiveStep::Op::AllGather; break;
      case OpKind::ReduceScatter: step.op = runtime::CollectiveStep::Op::ReduceScatter; break;
      case OpKind::LocalSlice: step.op = runtime::CollectiveStep::Op::LocalSlice; break;
      default: FJ_CHECK(false, "build_collective: ", op_name(c->op()));
    }
    step.dtype = c->dtype();
    step.parts = parts;
    step.outer = outer;
    step.inner = inner;
    b.collective = step;
    b.computes.push_back(c.get());
    return b;
  }

  Built build_group(Group& g, const std::set<std::string>& deferred, std::set<std::string>& hazards) {
    if (is_collective(g.root->op())) return build_collective(g);
    Built b;
    Kernel& k = b.k;
    k.name = kernel_name(static_cast<int>(g.id), g);
    k.kind = g.matmul ? Kernel::Kind::MatMul : Kernel::Kind::Loop;
    k.domain = g.domain;
    k.reduced = g.reduced;
    KernelBuilder kb(*this, g, b);
    // Stores: the root's buffer, then assigns of any member.
    const Node* r = g.root.get();
    if (storage_.count(r)) kb.store(g.root, store_map(g, g.root), r, storage_[r]);
    std::vector<std::pair<NodeRef, NodeRef>> stores;  // (value, variable)
    for (auto& n : g.members) {
      auto it = assigns_.find(n.get());
      if (it == assigns_.end()) continue;
      for (auto& a : it->second) stores.emplace_back(n, a->input(0));
    }
    for (auto& [val, var] : stores) {
      const std::string& name = var->attrs().get_str("name");
      if (deferred.count(name)) {
        int t = temp_for(name, var);
        kb.store(val, store_map(g, val), temp_key(name), {Storage::Arena, t});
      } else {
        kb.store(val, store_map(g, val), var.get(), {Storage::Variable, variable_index(var)});
        b.var_writes.push_back(name);
      }
    }
    if (g.matmul) build_matmul_spec(g, b, kb);
    // In place is safe when every read of the variable in this kernel is at
    // the element being written.
    for (const std::string& name : b.var_writes) {
      int vi = var_index_.at(name);
      const Access* w = nullptr;
      for (auto& s : k.stores)
        if (b.arg_storage[s.where.arg].kind == Storage::Variable && b.arg_storage[s.where.arg].index == vi)
          w = &s.where;
      for (auto& l : k.loads)
        if (b.arg_storage[l.arg].kind == Storage::Variable && b.arg_storage[l.arg].index == vi &&
            !(w && l == *w))
          hazards.insert(name);
      if (g.matmul && (k.mm.a.arg == w->arg || k.mm.b.arg == w->arg)) hazards.insert(name);
    }
    k.finalize();
    std::ostringstream sum;
    std::vector<NodeRef> ordered = g.members;
    std::sort(ordered.begin(), ordered.end(),
              [&](const NodeRef& x, const NodeRef& y) { return pos_[x.get()] < pos_[y.get()]; });
    bool first = true;
    for (auto& n : ordered) {
      if (is_view(n->op()) || is_cheap_source(n)) continue;
      sum << (first ? "" : ", ") << op_name(n->op());
      first = false;
    }
    k.summary = sum.str();
    return b;
  }

  // The operand `x` of a contraction as a strided buffer (materialize made
  // it one): its kernel argument, strides per dim of x, and offset.
  View contraction_operand(const NodeRef& x, Built& b, KernelBuilder& kb, int& arg) {
    auto v = resolve_view(x);
    FJ_CHECK(v.has_value() && v->plain(), "contraction operand not addressable");
    const Node* base = v->base.get();
    Storage st = base->op() == OpKind::Variable ? Storage{Storage::Variable, variable_index(v->base)}
                                                : storage_of(base);
    if (base->op() == OpKind::Variable) b.var_reads.push_back(v->base->attrs().get_str("name"));
    if (std::find(b.reads.begin(), b.reads.end(), base) == b.reads.end()) b.reads.push_back(base);
    arg = kb.arg_for(base, st, v->base->dtype(), v->base->type().numel(), false);
    return *v;
  }

  // One operand of an implicit GEMM while it is being described: its index
  // dims are {batch digits..., row digits..., col digits...}.
  struct DigitOperand {
    std::vector<int64_t> rows, cols;  // digit extents
    Access acc;                       // strides and coords per index dim
  };

  // Drops extent-1 digits and merges adjacent digits of one index that every
  // stride and coordinate walks contiguously, so a conv whose operand is an
  // ordinary matrix (1x1 kernels, the weight) reaches the plain fast paths.
  static void simplify_digits(DigitOperand& o, size_t nbatch) {
    std::vector<std::vector<int64_t>*> all{&o.acc.strides};
    for (auto& c : o.acc.coords) all.push_back(&c.coef);
    auto simplify = [&](std::vector<int64_t>& ext, size_t first) {
      for (size_t d = ext.size(); d-- > 0;) {
        if (ext[d] != 1 || ext.size() == 1) continue;
        ext.erase(ext.begin() + d);
        for (auto* v : all) v->erase(v->begin() + first + d);
      }
      for (size_t d = ext.size(); d-- > 1;) {
        bool ok = true;
        for (auto* v : all) ok &= (*v)[first + d - 1] == (*v)[first + d] * ext[d];
        if (!ok) continue;
        ext[d - 1] *= ext[d];
        for (auto* v : all) {
          (*v)[first + d - 1] = (*v)[first + d];
          v->erase(v->begin() + first + d);
        }
        ext.erase(ext.begin() + d);
      }
    };
    simplify(o.rows, nbatch);
    simplify(o.cols, nbatch + o.rows.size());
  }

  // A coordinate of x (channels-first, spatial dim i) read at window
  // position * stride + tap * dilation - pad; folded into plain strides when
  // it can never leave the input.
  static void add_spatial_coord(DigitOperand& o, const ConvGeometry& cg, int i, int pos_dim, int tap_dim,
                                int64_t x_stride) {
    bool inside = cg.pads_lo[i] == 0 &&
                  (cg.out[i] - 1) * cg.strides[i] + (cg.kernel[i] - 1) * cg.dilations[i] < cg.in[i];
    if (inside) {
      o.acc.strides[pos_dim] += cg.strides[i] * x_stride;
      o.acc.strides[tap_dim] += cg.dilations[i] * x_stride;
      return;
    }
    codegen::Coord c;
    c.coef.assign(o.acc.strides.size(), 0);
    c.coef[pos_dim] = cg.strides[i];
    c.coef[tap_dim] = cg.dilations[i];
    c.c0 = -cg.pads_lo[i];
    c.limit = cg.in[i];
    c.stride = x_stride;
    o.acc.coords.push_back(c);
  }

  // Convolutions as implicit GEMMs (ir/conv.h). With S spatial dims, G
  // groups, Cg = C/G input and Cog = Co/G output channels per group:
  //   conv:             batch (n, g), M = Cog, N = out..., K = (Cg, k...)
  //   conv_data_grad:   batch (n, g), M = Cg,  N = in...,  K = (Cog, k...)
  //   conv_filter_grad: batch (g),    M = Cog, N = (Cg, k...), K = (n, out...)
  void build_conv_spec(Group& g, Built& b, KernelBuilder& kb) {
    Kernel& k = b.k;
    const NodeRef& c = g.mm;
    ConvGeometry cg = geometry_of(*c);
    const int S = cg.spatial;
    const NodeRef &p0 = c->input(0), &p1 = c->input(1);
    int arg0 = -1, arg1 = -1;
    View v0 = contraction_operand(p0, b, kb, arg0);
    View v1 = contraction_operand(p1, b, kb, arg1);
    const int64_t G = cg.groups;
    auto after = [&](const std::vector<int64_t>& ext, int i) {  // row-major stride of digit i
      int64_t p = 1;
      for (size_t j = i + 1; j < ext.size(); ++j) p *= ext[j];
      return p;
    };
    DigitOperand A, B;
    std::vector<int64_t> batch;
    switch (c->op()) {
      case OpKind::Conv: {  // p0 = x [N, C, in...], p1 = w [Co, Cg, k...]
        const auto &xs = v0.strides, &ws = v1.strides;
        int64_t N = p0->shape()[0], Cg = p1->shape()[1], Cog = p1->shape()[0] / G;
        batch = {N, G};
        A.rows = {Cog};
        A.cols = {Cg};
        A.cols.insert(A.cols.end(), cg.kernel.begin(), cg.kernel.end());
        A.acc.strides = {0, Cog * ws[0], ws[0], ws[1]};
        for (int i = 0; i < S; ++i) A.acc.strides.push_back(ws[2 + i]);
        A.acc.arg = arg1;
        A.acc.offset = v1.offset;
        B.rows = A.cols;
        B.cols = cg.out;
        B.acc.strides = {xs[0], Cg * xs[1], xs[1]};
        B.acc.strides.resize(3 + 2 * S, 0);
        for (int i = 0; i < S; ++i) add_spatial_coord(B, cg, i, 3 + S + i, 3 + i, xs[2 + i]);
        B.acc.arg = arg0;
        B.acc.offset = v0.offset;
        k.mm.m = Cog;
        k.mm.n = cg.out_size();
        k.mm.k = Cg * cg.kernel_size();
        break;
      }
      case OpKind::ConvDataGrad: {  // p0 = dy [N, G, Cog, P], p1 = w [Co, Cg, k...]
        const auto &ds = v0.strides, &ws = v1.strides;
        int64_t N = p0->shape()[0], Cog = p0->shape()[2], Cg = p1->shape()[1];
        batch = {N, G};
        A.rows = {Cg};
        A.cols = {Cog};
        A.cols.insert(A.cols.end(), cg.kernel.begin(), cg.kernel.end());
        A.acc.strides = {0, Cog * ws[0], ws[1], ws[0]};
        for (int i = 0; i < S; ++i) A.acc.strides.push_back(ws[2 + i]);
        A.acc.arg = arg1;
        A.acc.offset = v1.offset;
        B.rows = A.cols;
        B.cols = cg.in;
        B.acc.strides = {ds[0], ds[1], ds[2]};
        B.acc.strides.resize(3 + 2 * S, 0);
        for (int i = 0; i < S; ++i) {
          // position (in + pad - tap * dilation) / stride in [0, out)
          codegen::Coord co;
          co.coef.assign(B.acc.strides.size(), 0);
          co.coef[3 + S + i] = 1;
          co.coef[3 + i] = -cg.dilations[i];
          co.c0 = cg.pads_lo[i];
          co.div = cg.strides[i];
          co.limit = cg.out[i];
          co.stride = ds[3] * after(cg.out, i);
          B.acc.coords.push_back(co);
        }
        B.acc.arg = arg0;
        B.acc.offset = v0.offset;
        k.mm.m = Cg;
        k.mm.n = cg.in_size();
        k.mm.k = Cog * cg.kernel_size();
        break;
      }
      case OpKind::ConvFilterGrad: {  // p0 = x [N, C, in...], p1 = dy [N, G, Cog, P]
        const auto &xs = v0.strides, &ds = v1.strides;
        int64_t N = p0->shape()[0], Cog = p1->shape()[2], Cg = p0->shape()[1] / G;
        batch = {G};
        A.rows = {Cog};
        A.cols = {N};
        A.cols.insert(A.cols.end(), cg.out.begin(), cg.out.end());
        A.acc.strides = {ds[1], ds[2], ds[0]};
        for (int i = 0; i < S; ++i) A.acc.strides.push_back(ds[3] * after(cg.out, i));
        A.acc.arg = arg1;
        A.acc.offset = v1.offset;
        B.rows = A.cols;
        B.cols = {Cg};
        B.cols.insert(B.cols.end(), cg.kernel.begin(), cg.kernel.end());
        B.acc.strides = {Cg * xs[1], xs[0]};
        B.acc.strides.resize(2 + S, 0);
        B.acc.strides.push_back(xs[1]);
        B.acc.strides.resize(3 + 2 * S, 0);
        for (int i = 0; i < S; ++i) add_spatial_coord(B, cg, i, 2 + i, 3 + S + i, xs[2 + i]);
        B.acc.arg = arg0;
        B.acc.offset = v0.offset;
        k.mm.m = Cog;
        k.mm.n = Cg * cg.kernel_size();
        k.mm.k = N * cg.out_size();
        break;
      }
      default:
        FJ_CHECK(false, "build_conv_spec: ", op_name(c->op()));
    }
    // Batch digits: extent-1 ones dropped; a single one left is the plain
    // batch index. The epilogue still sees every batch dim of the domain.
    FJ_CHECK(k.rank() == static_cast<int>(batch.size()) + 2, "conv kernel domain rank");
    int64_t total = 1;
    for (int64_t e : batch) total *= e;
    k.mm.batch = total;
    for (size_t d = batch.size(); d-- > 0;) {
      if (batch[d] != 1 || batch.size() == 1) continue;
      batch.erase(batch.begin() + d);
      for (DigitOperand* o : {&A, &B}) {
        o->acc.strides.erase(o->acc.strides.begin() + d);
        for (auto& co : o->acc.coords) co.coef.erase(co.coef.begin() + d);
      }
    }
    size_t nb = batch.size();
    simplify_digits(A, nb);
    simplify_digits(B, nb);
    if (nb > 1) k.mm.batch_digits = batch;
    auto digits_needed = [&](const DigitOperand& o) {
      return nb > 1 || o.rows.size() > 1 || o.cols.size() > 1 || !o.acc.coords.empty();
    };
    k.mm.a = A.acc;
    k.mm.b = B.acc;
    if (digits_needed(A)) {
      k.mm.a_rows = A.rows;
      k.mm.a_cols = A.cols;
    }
    if (digits_needed(B)) {
      k.mm.b_rows = B.rows;
      k.mm.b_cols = B.cols;
    }
  }

  void build_matmul_spec(Group& g, Built& b, KernelBuilder& kb) {
    if (g.mm->op() != OpKind::MatMul) return build_conv_spec(g, b, kb);
    Kernel& k = b.k;
    const NodeRef& mm = g.mm;
    bool ta = mm->attrs().get_bool("transpose_a"), tb = mm->attrs().get_bool("transpose_b");
    const NodeRef &a = mm->input(0), &bb = mm->input(1);
    int r = mm->rank();
    k.mm.m = mm->shape()[r - 2];
    k.mm.n = mm->shape()[r - 1];
    k.mm.k = ta ? a->shape()[a->rank() - 2] : a->shape()[a->rank() - 1];
    int64_t batch = 1;
    for (int i = 0; i < r - 2; ++i) batch *= mm->shape()[i];
    k.mm.batch = batch;
    auto operand = [&](const NodeRef& x, bool trans) {
      auto v = resolve_view(x);
      FJ_CHECK(v.has_value(), "matmul operand not addressable");
      const Node* base = v->base.get();
      Storage st = base->op() == OpKind::Variable ? Storage{Storage::Variable, variable_index(v->base)}
                                                  : storage_of(base);
      if (base->op() == OpKind::Variable) b.var_reads.push_back(v->base->attrs().get_str("name"));
      if (std::find(b.reads.begin(), b.reads.end(), base) == b.reads.end()) b.reads.push_back(base);
      int arg = kb.arg_for(base, st, v->base->dtype(), v->base->type().numel(), false);
      int xr = x->rank();
      // Batch stride: the batch dims must collapse into one.
      int64_t bstride = 0;
      if (xr > 2) {
        for (int i = xr - 3; i >= 0; --i) {
          if (i < xr - 3)
            FJ_USER_CHECK(v->strides[i] == v->strides[i + 1] * x->shape()[i + 1], ErrorKind::NotImplemented,
                          "matmul: an operand whose batch dimensions are not contiguous is not "
                          "supported yet (operand ", x->type().str(), ")");
        }
        bstride = v->strides[xr - 3];
      }
      int64_t s_row = v->strides[xr - 2], s_col = v->strides[xr - 1];
      Access acc;
      acc.arg = arg;
      acc.offset = v->offset;
      // a as (batch, m, k) and b as (batch, k, n): a transpose swaps the two.
      acc.strides = {bstride, trans ? s_col : s_row, trans ? s_row : s_col};
      return acc;
    };
    k.mm.a = operand(a, ta);
    k.mm.b = operand(bb, tb);
    // The epilogue's domain: collapse batch dims into one.
    if (r > 3) collapse_batch_dims(k);
  }

  static void collapse_batch_dims(Kernel& k) {
    int r = k.rank();
    std::vector<std::vector<int64_t>*> all;
    for (auto& l : k.loads) all.push_back(&l.strides);
    for (auto& s : k.stores) all.push_back(&s.where.strides);
    for (auto& n : k.nodes)
      if (!n.index_strides.empty()) all.push_back(&n.index_strides);
    for (int d = r - 3; d > 0; --d) {
      for (auto* v : all)
        FJ_USER_CHECK((*v)[d - 1] == (*v)[d] * k.domain[d], ErrorKind::NotImplemented,
                      "matmul: a fused epilogue over several non-contiguous batch dimensions is "
                      "not supported yet");
      k.domain[d - 1] *= k.domain[d];
      k.domain.erase(k.domain.begin() + d);
      k.reduced.erase(k.reduced.begin() + d);
      for (auto* v : all) {
        (*v)[d - 1] = (*v)[d];
        v->erase(v->begin() + d);
      }
    }
  }

  // Temporaries for deferred assigns: one arena buffer per variable.
  // The key of a deferred assign's temporary: its variable name, whose
  // address in temp_names_ is stable.
  const void* temp_key(const std::string& name) { return &*temp_names_.insert(name).first; }
  int temp_for(const std::string& name, const NodeRef& var) {
    auto it = temp_index_.find(name);
    if (it != temp_index_.end()) return it->second;
    int idx = arena_base_count() + static_cast<int>(temp_lives_.size());
    BufferLife l;
    l.bytes = var->type().bytes();
    temp_lives_.push_back(l);
    temp_index_[name] = idx;
    temp_vars_[name] = var;
    return idx;
  }
  int arena_base_count() {
    int n = 0;
    for (auto& [node, s] : storage_)
      if (s.kind == Storage::Arena) n = std::max(n, s.index + 1);
    return n;
  }

  std::vector<Built> build_deferred_copies(const std::set<std::string>& deferred) {
    std::vector<Built> out;
    int i = 0;
    for (const std::string& name : deferred) {
      auto it = temp_vars_.find(name);
      if (it == temp_vars_.end()) continue;
      const NodeRef& var = it->second;
      Built b;
      Kernel& k = b.k;
      k.name = "k" + std::to_string(groups_.size() + i++) + "_assign";
      k.kind = Kernel::Kind::Loop;
      k.domain = var->shape();
      k.reduced.assign(var->rank(), false);
      std::vector<int64_t> cs = contiguous_strides(var->shape());
      auto add_arg = [&](const void* key, Storage s, bool write) {
        b.arg_buffers.push_back(key);
        b.arg_storage.push_back(s);
        codegen::KernelArg a;
        a.dtype = var->dtype();
        a.elements = var->type().numel();
        (write ? a.written : a.read) = true;
        k.args.push_back(a);
        return static_cast<int>(k.args.size()) - 1;
      };
      int src = add_arg(temp_key(name), {Storage::Arena, temp_index_.at(name)}, false);
      int dst = add_arg(var.get(), {Storage::Variable, variable_index(var)}, true);
      k.loads.push_back({src, cs, 0});
      KNode ld;
      ld.kind = KOp::Load;
      ld.dtype = var->dtype();
      ld.access = 0;
      k.nodes.push_back(ld);
      k.stores.push_back({0, {dst, cs, 0}});
      k.summary = "assign " + name;
      k.finalize();
      out.push_back(std::move(b));
    }
    return out;
  }

  // Kahn's algorithm over data and anti dependences (readers of a
  // variable's old value run before the kernel that overwrites it). Ties go
  // to program order. Returns false on a cycle.
  bool schedule(std::vector<Built>& built, std::vector<int>& order) {
    size_t n = built.size();
    std::vector<std::set<int>> succ(n);
    std::vector<int> indeg(n, 0);
    std::unordered_map<const Node*, int> producer;
    for (size_t i = 0; i < n; ++i) producer[groups_[i]->root.get()] = static_cast<int>(i);
    auto edge = [&](int from, int to) {
      if (from == to) return;
      if (succ[from].insert(to).second) ++indeg[to];
    };
    std::unordered_map<std::string, int> writer;
    for (size_t i = 0; i < n; ++i)
      for (auto& v : built[i].var_writes) writer[v] = static_cast<int>(i);
    for (size_t i = 0; i < n; ++i) {
      for (const Node* r : built[i].reads) {
        auto p = producer.find(r);
        if (p != producer.end()) edge(p->second, static_cast<int>(i));
      }
      for (auto& v : built[i].var_reads) {
        auto w = writer.find(v);
        if (w != writer.end()) edge(static_cast<int>(i), w->second);
      }
    }
    // Collectives go after all other ready work, and then all ready
    // collectives go at once, so that those ready together (the gradients of
    // a backward pass) become adjacent launches the runtime sends as one
    // bucket: one exchange instead of one per variable. Synchronous
    // collectives gain nothing from starting earlier.
    using Queue = std::priority_queue<std::pair<int, int>, std::vector<std::pair<int, int>>, std::greater<>>;
    Queue ready, collectives;
    auto push = [&](int i) {
      const Node* r = groups_[i]->root.get();
      (is_collective(r->op()) ? collectives : ready).push({pos_[r], i});
    };
    for (size_t i = 0; i < n; ++i)
      if (indeg[i] == 0) push(static_cast<int>(i));
    order.clear();
    auto take = [&](Queue& q) {
      int i = q.top().second;
      q.pop();
      order.push_back(i);
      for (int s : succ[i])
        if (--indeg[s] == 0) push(s);
    };
    while (!ready.empty() || !collectives.empty()) {
      if (!ready.empty()) {
        take(ready);
      } else {
        while (!collectives.empty()) take(collectives);
      }
    }
    return order.size() == n;
  }

  std::string job_;
  FusionOptions opts_;
  Graph g_;
  std::vector<NodeRef> topo_;
  std::unordered_map<const Node*, int> pos_;
  std::unordered_map<const Node*, std::vector<NodeRef>> users_;
  std::unordered_map<const Node*, std::vector<NodeRef>> assigns_;
  std::unordered_map<const Node*, int> output_of_;
  std::unordered_map<const Node*, int> param_index_;
  std::unordered_set<const Node*> must_store_;
  std::unordered_set<const Node*> epilogue_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::unordered_map<const Node*, int> group_of_;
  std::unordered_map<const Node*, Storage> storage_;
  std::vector<std::pair<std::string, TensorType>> plan_vars_;
  std::unordered_map<std::string, int> var_index_;
  std::set<std::string> temp_names_;
  std::unordered_map<std::string, int> temp_index_;
  std::unordered_map<std::string, NodeRef> temp_vars_;
  std::vector<BufferLife> temp_lives_;
};

}  // namespace

FusedProgram fuse(const Graph& g, const std::string& job_name, FusionOptions opts) {
  return Fuser(g, job_name, opts).run();
}

}  // namespace flowjit::jit
