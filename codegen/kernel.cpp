// Kernel description helpers: phase analysis, cost, printing, coalescing.
#include "codegen/kernel.h"

#include <algorithm>
#include <sstream>

#include "codegen/family.h"
#include "ir/error.h"

namespace flowjit::codegen {

void Kernel::finalize() {
  // kept_space: a node is kept-space when nothing it reads varies along a
  // reduced dimension. Reductions themselves are kept-space.
  auto varies_on_reduced = [&](const std::vector<int64_t>& strides) {
    for (size_t d = 0; d < strides.size() && d < reduced.size(); ++d)
      if (reduced[d] && strides[d] != 0) return true;
    return false;
  };
  reduce_order.clear();
  for (size_t i = 0; i < nodes.size(); ++i) {
    KNode& n = nodes[i];
    bool kept = true;
    bool invariant = true;
    int phase = 0;
    for (int o : n.operands) {
      FJ_CHECK(o >= 0 && o < static_cast<int>(i), "kernel ", name, ": operand order");
      kept &= nodes[o].kept_space;
      invariant &= nodes[o].invariant;
      phase = std::max(phase, nodes[o].phase);
    }
    switch (n.kind) {
      case KOp::Load: {
        const Access& a = loads.at(n.access);
        kept = kept && !varies_on_reduced(a.strides);  // operands: indirect indices
        for (const Coord& c : a.coords) kept &= !varies_on_reduced(c.coef);
        for (const Indirect& ind : a.indirect)
          if (ind.check >= 0) kept &= !varies_on_reduced(ind.pos_strides);
        invariant =
            invariant && a.coords.empty() && a.indirect.empty() && !args.at(a.arg).written &&
            std::all_of(a.strides.begin(), a.strides.end(), [](int64_t s) { return s == 0; });
        break;
      }
      case KOp::Compute:
        if (n.op == ir::OpKind::CheckIndex || n.op == ir::OpKind::CheckFinite) {
          kept &= !varies_on_reduced(n.index_strides);
          invariant = false;  // reports a position
        }
        break;
      case KOp::Index:
      case KOp::Random:
        kept = !varies_on_reduced(n.index_strides);
        invariant = false;
        break;
      case KOp::Reduce:
        kept = true;
        invariant = false;
        phase += 1;
        reduce_order.push_back(static_cast<int>(i));
        break;
      default:
        break;
    }
    n.kept_space = kept;
    n.invariant = invariant && n.kind != KOp::Acc;
    n.phase = phase;
  }
  std::stable_sort(reduce_order.begin(), reduce_order.end(),
                   [&](int a, int b) { return nodes[a].phase < nodes[b].phase; });
}

bool Kernel::store_per_kept_point(const Store& s) const {
  if (!nodes.at(s.node).kept_space) return false;
  for (size_t d = 0; d < s.where.strides.size() && d < reduced.size(); ++d)
    if (reduced[d] && s.where.strides[d] != 0) return false;
  return true;
}

int Kernel::parallel_dim() const {
  for (int d = 0; d < rank(); ++d)
    if (d >= static_cast<int>(reduced.size()) || !reduced[d]) return d;
  return -1;
}

int64_t Kernel::parallel_extent() const {
  int d = parallel_dim();
  return d < 0 ? 1 : domain[d];
}

double Kernel::cost_per_iteration() const {
  double per_point = 0;
  for (const KNode& n : nodes) {
    if (n.kind == KOp::Compute) {
      per_point += ir::has_trait(n.op, ir::kTranscendental) ? 12 : 1;
    } else if (n.kind == KOp::Load || n.kind == KOp::Reduce) {
      per_point += 1;
    } else if (n.kind == KOp::Random) {
      per_point += 30;
    }
  }
  per_point += static_cast<double>(stores.size());
  int64_t points = 1;
  int p = parallel_dim();
  for (int d = 0; d < rank(); ++d)
    if (d != p) points *= domain[d];
  int phases = 1;
  for (int r : reduce_order) phases = std::max(phases, nodes[r].phase + 1);
  return std::max(1.0, per_point * static_cast<double>(points) * phases);
}

void coalesce_domain(Kernel& k) {
  FJ_CHECK(k.kind == Kernel::Kind::Loop, "coalesce_domain on a matmul kernel");
  k.reduced.resize(k.domain.size(), false);
  // Every stride vector that is indexed by domain dims.
  std::vector<std::vector<int64_t>*> all;
  for (auto& a : k.loads) {
    all.push_back(&a.strides);
    for (auto& c : a.coords) all.push_back(&c.coef);
    for (auto& i : a.indirect)
      if (!i.pos_strides.empty()) all.push_back(&i.pos_strides);
  }
  for (auto& s : k.stores) all.push_back(&s.where.strides);
  for (auto& n : k.nodes)
    if (!n.index_strides.empty()) all.push_back(&n.index_strides);
  for (auto* v : all) FJ_CHECK(v->size() == k.domain.size(), "kernel ", k.name, ": stride rank");
  auto erase_dim = [&](size_t d) {
    k.domain.erase(k.domain.begin() + d);
    k.reduced.erase(k.reduced.begin() + d);
    for (auto* v : all) v->erase(v->begin() + d);
  };
  for (size_t d = k.domain.size(); d-- > 0;)
    if (k.domain[d] == 1) erase_dim(d);
  for (size_t d = k.domain.size(); d-- > 1;) {
    size_t o = d - 1;  // try to merge o (outer) with d (inner)
    if (k.reduced[o] != k.reduced[d]) continue;
    bool ok = true;
    for (auto* v : all) ok &= (*v)[o] == (*v)[d] * k.domain[d];
    if (!ok) continue;
    k.domain[o] *= k.domain[d];
    for (auto* v : all) (*v)[o] = (*v)[d];
    erase_dim(d);
  }
  k.finalize();
}

namespace {
std::string strides_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

std::string access_str(const Access& a) {
  std::string s =
      "arg" + std::to_string(a.arg) + strides_str(a.strides) + "+" + std::to_string(a.offset);
  for (const Coord& c : a.coords) {
    s += " coord(" + strides_str(c.coef) + "+" + std::to_string(c.c0);
    if (c.div != 1) s += " /" + std::to_string(c.div);
    s += " <" + std::to_string(c.limit) + " *" + std::to_string(c.stride) + ")";
  }
  for (const Indirect& i : a.indirect) {
    s += " indirect($" + std::to_string(i.node) + " <" + std::to_string(i.limit) + " *" +
         std::to_string(i.stride);
    if (i.check >= 0)
      s += " check#" + std::to_string(i.check) + " at " + strides_str(i.pos_strides) + "+" +
           std::to_string(i.pos_offset);
    s += ")";
  }
  if (!a.coords.empty() && a.pad != 0) {
    std::ostringstream p;
    p << a.pad;
    s += " pad=" + p.str();
  }
  if (!a.coords.empty() && a.ipad != 0) s += " ipad=" + std::to_string(a.ipad);
  return s;
}
}  // namespace

std::string describe_kernel(const Kernel& k) {
  if (k.kind == Kernel::Kind::Collective) return "kernel " + k.name + " (" + k.summary + ")\n";
  std::ostringstream os;
  if (k.kind == Kernel::Kind::Family) {
    os << "kernel " << k.name << " family " << family_of(k).name
       << " params=" << strides_str(k.params) << "\n";
    for (size_t i = 0; i < k.args.size(); ++i)
      os << "  arg" << i << ": " << ir::dtype_short_name(k.args[i].dtype) << "["
         << k.args[i].elements << "]" << (k.args[i].read ? " r" : "")
         << (k.args[i].written ? " w" : "") << "\n";
    return os.str();
  }
  os << "kernel " << k.name << " " << (k.kind == Kernel::Kind::MatMul ? "matmul" : "loop")
     << " domain=" << ir::shape_str(k.domain);
  if (k.has_reduction()) {
    os << " reduce=[";
    bool first = true;
    for (int d = 0; d < k.rank(); ++d)
      if (k.reduced[d]) {
        os << (first ? "" : ",") << d;
        first = false;
      }
    os << "]";
  }
  os << "\n";
  for (size_t i = 0; i < k.args.size(); ++i)
    os << "  arg" << i << ": " << ir::dtype_short_name(k.args[i].dtype) << "[" << k.args[i].elements
       << "]" << (k.args[i].read ? " r" : "") << (k.args[i].written ? " w" : "")
       << (static_cast<int>(i) == k.status_arg ? " status" : "")
       << (static_cast<int>(i) == k.guard_arg ? " guard" : "")
       << (static_cast<int>(i) == k.guard_arg && k.guard_words > 1
               ? "x" + std::to_string(k.guard_words)
               : "")
       << "\n";
  if (k.kind == Kernel::Kind::MatMul)
    os << "  mm: batch=" << k.mm.batch << " m=" << k.mm.m << " n=" << k.mm.n << " k=" << k.mm.k
       << " a=" << access_str(k.mm.a) << " b=" << access_str(k.mm.b);
  if (k.kind == Kernel::Kind::MatMul && !(k.mm.plain(0) && k.mm.plain(1)))
    os << " digits batch=" << strides_str(k.mm.batch_digits) << " a=" << strides_str(k.mm.a_rows)
       << "x" << strides_str(k.mm.a_cols) << " b=" << strides_str(k.mm.b_rows) << "x"
       << strides_str(k.mm.b_cols);
  if (k.kind == Kernel::Kind::MatMul) os << "\n";
  for (size_t i = 0; i < k.nodes.size(); ++i) {
    const KNode& n = k.nodes[i];
    os << "  $" << i << " = ";
    switch (n.kind) {
      case KOp::Load: {
        const Access& a = k.loads[n.access];
        os << "load " << access_str(a);
        break;
      }
      case KOp::Const:
        os << "const " << n.value;
        break;
      case KOp::Index:
        os << "index " << strides_str(n.index_strides);
        break;
      case KOp::Random:
        os << ir::op_name(n.op) << " seed=" << n.seed
           << " counter=" << strides_str(n.index_strides);
        break;
      case KOp::Acc:
        os << "acc";
        break;
      case KOp::Compute:
      case KOp::Reduce:
        os << ir::op_name(n.op);
        for (size_t j = 0; j < n.operands.size(); ++j) os << (j ? ", $" : " $") << n.operands[j];
        if (n.op == ir::OpKind::CheckIndex)
          os << " <" << n.ivalue << " check#" << n.check << " at " << strides_str(n.index_strides);
        if (n.op == ir::OpKind::CheckFinite)
          os << " check#" << n.check << " at " << strides_str(n.index_strides) << "+" << n.ivalue;
        if (n.kind == KOp::Reduce) {
          os << " phase=" << n.phase;
          if (!n.index_strides.empty()) os << " index=" << strides_str(n.index_strides);
        }
        break;
    }
    os << " : " << ir::dtype_short_name(n.dtype)
       << (n.kept_space && k.has_reduction() ? " kept" : "") << "\n";
  }
  for (const Store& s : k.stores)
    os << "  store $" << s.node << " -> arg" << s.where.arg << strides_str(s.where.strides) << "+"
       << s.where.offset << "\n";
  return os.str();
}

}  // namespace flowjit::codegen
