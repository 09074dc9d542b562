// fusion: how values address memory (views, windows, pads, slices, gathers) and dim maps.
#include "jit/fusion/internal.h"

#include <cmath>

namespace flowjit::jit::fusion_detail {

bool is_unit_reshape(const NodeRef& r) {
  if (r->op() != OpKind::Reshape) return false;
  Shape a, b;
  for (int64_t d : r->input(0)->shape())
    if (d != 1) a.push_back(d);
  for (int64_t d : r->shape())
    if (d != 1) b.push_back(d);
  return a == b;
}

bool is_cheap_source(const NodeRef& n) { return is_cheap(n->op()); }

bool is_duplicable(const NodeRef& n) {
  return is_view(n->op()) || is_cheap_source(n) || (is_elementwise(n->op()) && n->rank() == 0);
}

namespace {

bool is_scalar_operand(NodeRef x) {
  while (is_view(x->op()) && !is_addressed(x->op()) &&
         (x->op() != OpKind::Reshape || is_unit_reshape(x)))
    x = x->input(0);
  return x->rank() == 0 || x->op() == OpKind::Fill;
}

}  // namespace

bool is_scaled_value(const NodeRef& n) {
  switch (n->op()) {
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Neg:
      break;
    default:
      return false;
  }
  int values = 0;
  for (const NodeRef& x : n->inputs()) values += is_scalar_operand(x) ? 0 : 1;
  return values <= 1 && !is_duplicable(n);
}

bool is_buffer_leaf(const NodeRef& n) {
  return n->op() == OpKind::Parameter || n->op() == OpKind::Variable;
}

bool is_compute(const NodeRef& n) {
  return is_elementwise(n->op()) || is_reduce(n->op()) || is_contraction(n->op()) ||
         is_collective(n->op()) || is_family(n->op());
}

bool is_addressed_view(const NodeRef& n) { return is_addressed(n->op()); }

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
  if (std::isfinite(w.pad) && std::fabs(w.pad) < 0x1p63) w.ipad = static_cast<int64_t>(w.pad);
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
      bool inside = g.pads_lo[i] == 0 &&
                    (g.out[i] - 1) * g.strides[i] + (g.kernel[i] - 1) * g.dilations[i] < g.in[i];
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

std::optional<View> resolve_pad(const NodeRef& n) {
  auto v = resolve_view(n->input(0));
  if (!v || !v->plain()) return std::nullopt;
  const Attrs& a = n->attrs();
  const IntList &lo = a.get_ints("pads_lo"), &hi = a.get_ints("pads_hi"),
                &in = a.get_ints("interior");
  const Shape& x = n->input(0)->shape();
  View w{v->base, v->strides, v->offset, {}, a.get_float("pad_value"), {}};
  if (const auto* i = std::get_if<int64_t>(a.find("pad_value"))) w.ipad = *i;
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

std::optional<View> resolve_gather(const NodeRef& n) {
  auto vp = resolve_view(n->input(0));
  const NodeRef& checked = n->input(1);
  auto vi = resolve_view(unchecked_index(checked));
  if (!vp || !vp->plain() || !vi || !vi->plain()) return std::nullopt;
  NodeRef check = checked->op() == OpKind::CheckIndex ? checked : nullptr;
  std::vector<int64_t> ipos = contiguous_strides(checked->shape());
  const Shape &p = n->input(0)->shape(), &idx = n->input(1)->shape();
  int rp = static_cast<int>(p.size()), ri = static_cast<int>(idx.size());
  View w{vp->base, std::vector<int64_t>(n->rank(), 0), vp->offset, {}, 0, {}};
  if (n->op() == OpKind::Gather) {
    int axis = static_cast<int>(n->attrs().get_int("axis"));
    int bd = static_cast<int>(n->attrs().get_int("batch_dims"));
    for (int d = 0; d < axis; ++d) w.strides[d] = vp->strides[d];
    for (int d = axis + 1; d < rp; ++d) w.strides[d + ri - bd - 1] = vp->strides[d];
    IndirectView iv{vi->base, std::vector<int64_t>(n->rank(), 0), vi->offset, p[axis],
                    vp->strides[axis]};
    iv.check = check;
    iv.pos_strides.assign(n->rank(), 0);
    for (int j = 0; j < ri; ++j) {
      iv.strides[j < bd ? j : axis + j - bd] = vi->strides[j];
      iv.pos_strides[j < bd ? j : axis + j - bd] = ipos[j];
    }
    w.indirect.push_back(iv);
    return w;
  }
  int k = static_cast<int>(idx.back());
  for (int d = k; d < rp; ++d) w.strides[ri - 1 + d - k] = vp->strides[d];
  for (int c = 0; c < k; ++c) {
    IndirectView iv{vi->base, std::vector<int64_t>(n->rank(), 0),
                    vi->offset + c * vi->strides[ri - 1], p[c], vp->strides[c]};
    iv.check = check;
    iv.pos_strides.assign(n->rank(), 0);
    iv.pos_offset = c;
    for (int j = 0; j + 1 < ri; ++j) {
      iv.strides[j] = vi->strides[j];
      iv.pos_strides[j] = ipos[j];
    }
    w.indirect.push_back(iv);
  }
  return w;
}

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
      for (auto& i : v->indirect) {
        permute(i.strides);
        if (!i.pos_strides.empty()) permute(i.pos_strides);
      }
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
      for (auto& i : v->indirect) {
        widen(i.strides);
        if (!i.pos_strides.empty()) widen(i.pos_strides);
      }
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
      for (auto& i : v->indirect) {
        reindex(i.strides);
        if (!i.pos_strides.empty()) reindex(i.pos_strides);
      }
      return v;
    }
    default:
      if (is_buffer_leaf(n) || is_compute(n))
        return View{n, contiguous_strides(n->shape()), 0, {}, 0, {}};
      return std::nullopt;
  }
}

bool batch_collapses(const View& v, const NodeRef& x) {
  for (int i = 0; i + 1 < x->rank() - 2; ++i)
    if (v.strides[i] != v.strides[i + 1] * x->shape()[i + 1]) return false;
  return true;
}

bool is_contiguous_view(const NodeRef& n) {
  auto v = resolve_view(n);
  return v && v->plain() && v->offset == 0 && v->strides == contiguous_strides(n->shape());
}

DimMap broadcast_map(const Shape& from, const Shape& to, const DimMap& to_map) {
  size_t off = to.size() - from.size();
  DimMap m(from.size());
  for (size_t i = 0; i < from.size(); ++i)
    m[i] = (from[i] == 1 && to[i + off] != 1) ? -1 : to_map[i + off];
  return m;
}

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

bool is_full_map(const NodeRef& n, const DimMap& m) {
  std::set<int> seen;
  for (size_t j = 0; j < m.size(); ++j) {
    if (n->shape()[j] == 1) continue;
    if (m[j] < 0 || !seen.insert(m[j]).second) return false;
  }
  return true;
}

}  // namespace flowjit::jit::fusion_detail
