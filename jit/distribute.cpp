// distribute: layouts (SBP) for every value, boxing collectives, and the
// per-device graph. See distribute.h for the model.
#include "jit/distribute.h"

#include <algorithm>
#include <functional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "ir/error.h"
#include "ir/printer.h"

namespace flowjit::jit {

using namespace ir;

std::string Sbp::str() const {
  switch (kind) {
    case Broadcast:
      return "B";
    case Split:
      return "S(" + std::to_string(axis) + ")";
    case Partial:
      return "P";
    case Local:
      return "L";
  }
  return "?";
}

namespace {

int64_t prod(const Shape& s, size_t lo, size_t hi) {
  int64_t p = 1;
  for (size_t i = lo; i < hi && i < s.size(); ++i) p *= s[i];
  return p;
}

struct Value {
  NodeRef local;
  Sbp sbp;
};

// One operand requirement of a candidate signature.
struct Candidate {
  std::vector<Sbp> in;
  Sbp out;
};

class Distributor {
 public:
  Distributor(const Graph& g, const DistributeOptions& o) : g_(g), o_(o), p_(o.parts) {}

  DistributedGraph run() {
    DistributedGraph out;
    out.local.name = g_.name;
    for (const NodeRef& n : g_.topo_order()) visit(n);
    for (auto& prm : g_.params) {
      out.local.params.push_back(values_.at(prm.get()).local);
      out.params.push_back(values_.at(prm.get()).sbp);
    }
    for (auto& r : g_.outputs) {
      const Value& v = values_.at(r.get());
      Sbp want = result_layout(r, v.sbp);
      out.local.outputs.push_back(box(r, want));
      out.outputs.push_back(want);
    }
    for (auto& e : g_.effects) out.local.effects.push_back(values_.at(e.get()).local);
    for (auto& [name, entry] : vars_) out.variables.emplace_back(name, entry.first, entry.second);
    out.collectives = collectives_;
    out.warnings = warnings_;
    out.description = log_.str();
    return out;
  }

 private:
  // ---- layouts of sources and results

  Sbp param_layout(const NodeRef& n) {
    if (o_.mirrored) return Sbp::L();
    if (n->rank() >= 1 && n->shape()[0] >= p_ && n->shape()[0] % p_ == 0) return Sbp::S(0);
    return Sbp::B();
  }

  Sbp variable_layout(const NodeRef& n) {
    const std::string& name = n->attrs().get_str("name");
    auto it = o_.split_vars.find(name);
    if (it == o_.split_vars.end()) return Sbp::B();
    int axis = it->second;
    FJ_USER_CHECK(!o_.mirrored, ErrorKind::NotImplemented, "variable '", name,
                  "' is declared split(", axis,
                  "), which the mirrored view does not support "
                  "(its variables are replicated); use the consistent view or drop the split");
    FJ_USER_CHECK(axis >= 0 && axis < n->rank(), ErrorKind::Value, "variable '", name,
                  "' is declared split(axis=", axis, ") but has shape ", shape_str(n->shape()),
                  " (rank ", n->rank(), ")");
    if (n->shape()[axis] % p_ != 0) {
      // Pieces of unequal size would need a program per device.
      if (warned_.insert(name).second)
        warnings_.push_back(
            "flowjit: variable '" + name + "' is declared split(axis=" + std::to_string(axis) +
            ") over " + std::to_string(p_) + " devices, but dimension " + std::to_string(axis) +
            " of " + shape_str(n->shape()) + " does not divide into " + std::to_string(p_) +
            " equal pieces; every device holds the whole variable instead");
      return Sbp::B();
    }
    return Sbp::S(axis);
  }

  Sbp result_layout(const NodeRef& r, Sbp have) {
    if (have.kind == Sbp::Local) return have;
    if (o_.whole_outputs) return Sbp::B();
    if (have == Sbp::S(0)) return have;
    if (have.kind == Sbp::Split && r->shape()[0] % p_ == 0 && r->shape()[0] >= p_) return Sbp::S(0);
    return Sbp::B();
  }

  // ---- boxing

  static Shape split_shape(Shape s, int axis, int parts) {
    s[axis] /= parts;
    return s;
  }

  NodeRef collective(OpKind op, const NodeRef& x, int axis, const NodeRef& logical) {
    Attrs a{{"parts", int64_t{p_}}};
    if (op != OpKind::AllReduce) a.set("axis", int64_t{axis});
    ++collectives_;
    return make_node(op, {x}, a, logical->loc());
  }

  // Bytes moved per device to box a value of `bytes` (whole) from one
  // layout to another; -1 when impossible.
  double box_cost(Sbp from, Sbp to, double bytes) const {
    if (from == to) return 0;
    if (from.kind == Sbp::Local || to.kind == Sbp::Local) return -1;
    if (to.kind == Sbp::Partial) return -1;
    if (to.kind == Sbp::Broadcast) return from.kind == Sbp::Partial ? 2 * bytes : bytes;
    // to split
    if (from.kind == Sbp::Broadcast) return 0;
    return bytes;  // P -> S reduce_scatter, S -> S' all_gather + slice
  }

  bool can_split(const NodeRef& n, int axis) const {
    return axis >= 0 && axis < n->rank() && n->shape()[axis] % p_ == 0 && n->shape()[axis] >= p_;
  }

  NodeRef box(const NodeRef& n, Sbp to) {
    const Value& v = values_.at(n.get());
    if (v.sbp == to) return v.local;
    auto key = std::make_pair(n.get(), to);
    auto it = boxed_.find(key);
    if (it != boxed_.end()) return it->second;
    Sbp from = v.sbp;
    NodeRef r;
    if (from.kind == Sbp::Local || to.kind == Sbp::Local)
      throw_user(ErrorKind::NotImplemented, "value ", describe(n),
                 " is per-device (mirrored view) "
                 "but is used where the whole value is needed (layout ",
                 to.str(), "); in the mirrored view only gradients are combined across devices");
    FJ_CHECK(to.kind != Sbp::Partial, "distribute: boxing to a partial value");
    if (to.kind == Sbp::Broadcast) {
      r = from.kind == Sbp::Partial ? collective(OpKind::AllReduce, v.local, 0, n)
                                    : collective(OpKind::AllGather, v.local, from.axis, n);
    } else if (from.kind == Sbp::Broadcast &&
               (n->op() == OpKind::Fill ||
                (n->op() == OpKind::Iota && n->attrs().get_int("axis") != to.axis))) {
      // A constant's piece is the same constant, smaller: no slice needed.
      Attrs a = n->attrs();
      a.set("shape", split_shape(n->shape(), to.axis, p_));
      r = make_node(n->op(), {}, a, n->loc());
    } else if (from.kind == Sbp::Broadcast) {
      r = collective(OpKind::LocalSlice, v.local, to.axis, n);
    } else if (from.kind == Sbp::Partial) {
      r = collective(OpKind::ReduceScatter, v.local, to.axis, n);
    } else {
      r = collective(OpKind::LocalSlice, collective(OpKind::AllGather, v.local, from.axis, n),
                     to.axis, n);
    }
    log_ << "  " << describe(n) << ": " << from.str() << " -> " << to.str() << "\n";
    boxed_[key] = r;
    return r;
  }

  std::string describe(const NodeRef& n) const {
    std::string s = std::string(op_name(n->op())) + " " + n->type().str();
    if (n->op() == OpKind::Variable || n->op() == OpKind::Parameter)
      s += " '" + n->attrs().get_str("name") + "'";
    if (n->loc().known()) s += " at " + n->loc().str();
    return s;
  }

  // Chooses the cheapest candidate and boxes the operands to it.
  Sbp apply(const NodeRef& n, const std::vector<Candidate>& cands, std::vector<NodeRef>& in) {
    double best = -1;
    const Candidate* pick = nullptr;
    for (const Candidate& c : cands) {
      double cost = 0;
      bool ok = true;
      for (size_t i = 0; i < c.in.size() && ok; ++i) {
        const NodeRef& x = n->input(i);
        double b =
            box_cost(values_.at(x.get()).sbp, c.in[i], static_cast<double>(x->type().bytes()));
        if (b < 0) ok = false;
        cost += b;
      }
      if (!ok) continue;
      // Computing the whole result on every device costs too: prefer splits.
      if (c.out.kind == Sbp::Broadcast) cost += 0.25 * static_cast<double>(n->type().bytes());
      if (!pick || cost < best) {
        best = cost;
        pick = &c;
      }
    }
    FJ_CHECK(pick != nullptr, "distribute: no layout for ", describe(n));
    for (size_t i = 0; i < pick->in.size(); ++i) in[i] = box(n->input(i), pick->in[i]);
    return pick->out;
  }

  Sbp in_sbp(const NodeRef& n, size_t i) const { return values_.at(n->input(i).get()).sbp; }

  // ---- rules

  void visit(const NodeRef& n) {
    std::vector<NodeRef> in;
    for (auto& x : n->inputs()) in.push_back(values_.at(x.get()).local);
    bool any_local = false;
    for (size_t i = 0; i < in.size(); ++i) any_local |= in_sbp(n, i).kind == Sbp::Local;
    Value v;
    OpKind op = n->op();
    if (op == OpKind::Parameter || op == OpKind::Variable) {
      v.sbp = op == OpKind::Parameter ? param_layout(n) : variable_layout(n);
      Attrs a = n->attrs();
      if (v.sbp.kind == Sbp::Split) a.set("shape", split_shape(n->shape(), v.sbp.axis, p_));
      v.local = make_node(op, {}, a, n->loc());
      if (op == OpKind::Variable) vars_[n->attrs().get_str("name")] = {v.sbp, n->type()};
    } else if (is_source(op)) {
      v = {n, Sbp::B()};  // constants and random values: every device makes the whole
    } else if (op == OpKind::Assign) {
      Sbp want = values_.at(n->input(0).get()).sbp;
      if (in_sbp(n, 1).kind == Sbp::Local)
        throw_user(ErrorKind::NotImplemented, "variable '", n->input(0)->attrs().get_str("name"),
                   "' is assigned a per-device (mirrored) value; in the mirrored view only "
                   "optimizer updates of trainable variables are combined across devices");
      in[1] = box(n->input(1), want);
      v = {make_node(op, in, n->attrs(), n->loc()), want};
    } else if (op == OpKind::AllReduce && !any_local) {
      // Mirrored view: a gradient that is the same on every device (it does
      // not depend on the inputs) sums to parts times itself, as it should.
      v = {Node::with_inputs(n, in), Sbp::B()};
    } else if (any_local) {
      v = {Node::with_inputs(n, in), Sbp::L()};  // mirrored: every op is local
      if (op == OpKind::AllReduce) v.sbp = Sbp::B();
    } else if (is_elementwise(op)) {
      v.sbp = elementwise(n, in);
      v.local = Node::with_inputs(n, in);
    } else if (is_reduce(op)) {
      v.sbp = reduction(n, in);
      v.local = Node::with_inputs(n, in);
    } else if (op == OpKind::MatMul) {
      v.sbp = matmul(n, in);
      v.local = Node::with_inputs(n, in);
    } else if (op == OpKind::Conv || op == OpKind::ConvDataGrad || op == OpKind::ConvFilterGrad) {
      v.sbp = conv(n, in);
      v.local = Node::with_inputs(n, in);
    } else if (op == OpKind::Window || op == OpKind::Unwindow) {
      // Lead dims (batch, channels) keep their split; a partial value stays
      // partial through a window padded with zeros (it is linear).
      Sbp x = in_sbp(n, 0);
      int lead = n->input(0)->rank() - static_cast<int>(n->attrs().get_ints("window").size()) *
                                           (op == OpKind::Window ? 1 : 2);
      bool keep = (x.kind == Sbp::Split && x.axis < lead) || x.kind == Sbp::Broadcast ||
                  (x.kind == Sbp::Partial && n->attrs().get_float("pad_value") == 0.0);
      if (!keep) {
        in[0] = box(n->input(0), Sbp::B());
        x = Sbp::B();
      }
      v = {Node::with_inputs(n, in), x};
    } else if (op == OpKind::Pad || op == OpKind::Slice) {
      v = pad_or_slice(n, in);
    } else if (op == OpKind::Gather || op == OpKind::GatherNd) {
      v = gather(n, in);
    } else if (op == OpKind::SegmentSum) {
      v = segment_sum(n, in);
    } else if (op == OpKind::RandomUniformAt) {
      in[0] = box(n->input(0), Sbp::B());
      v = {Node::with_inputs(n, in), Sbp::B()};  // every device draws the whole, like a source
    } else if (op == OpKind::Reshape || op == OpKind::Broadcast) {
      v.sbp = reshape_like(n, in);
      Shape s = n->shape();
      if (v.sbp.kind == Sbp::Split) s = split_shape(s, v.sbp.axis, p_);
      Attrs a = n->attrs();
      a.set("shape", s);
      v.local = make_node(op, in, a, n->loc());
    } else if (op == OpKind::Transpose) {
      Sbp x = in_sbp(n, 0);
      const IntList& perm = n->attrs().get_ints("perm");
      v.sbp = x;
      if (x.kind == Sbp::Split)
        v.sbp =
            Sbp::S(static_cast<int>(std::find(perm.begin(), perm.end(), x.axis) - perm.begin()));
      v.local = Node::with_inputs(n, in);
    } else if (op == OpKind::Softmax || op == OpKind::LogSoftmax || op == OpKind::OneHot) {
      Sbp x = in_sbp(n, 0);
      int axis = op == OpKind::OneHot ? -1 : static_cast<int>(n->attrs().get_int("axis"));
      if (x.kind == Sbp::Partial || (x.kind == Sbp::Split && x.axis == axis)) {
        in[0] = box(n->input(0), Sbp::B());
        x = Sbp::B();
      }
      v = {Node::with_inputs(n, in), x};
    } else if (op == OpKind::Attention || op == OpKind::AttentionGrad) {
      // Split along a batch dim of q: every operand with that dim is split
      // the same way (a bias of extent 1 there is whole), and so is the
      // result; otherwise every device computes the whole. With dropout,
      // whole too: the mask's counters are positions in the whole scores.
      Sbp q = in_sbp(n, 0);
      const int batch = n->input(0)->rank() - 2;
      Sbp want = q.kind == Sbp::Split && q.axis < batch && n->attrs().get_float("dropout") == 0
                     ? q
                     : Sbp::B();
      for (size_t i = 0; i < in.size(); ++i)
        in[i] =
            box(n->input(i),
                want.kind == Sbp::Split && n->input(i)->shape()[want.axis] == 1 ? Sbp::B() : want);
      v = {Node::with_inputs(n, in), want};
    } else if (op == OpKind::SparseCrossEntropy) {
      Sbp lg = in_sbp(n, 1);
      int last = n->input(1)->rank() - 1;
      Sbp want = lg.kind == Sbp::Split && lg.axis < last ? lg : Sbp::B();
      in[0] = box(n->input(0), want);
      in[1] = box(n->input(1), want);
      v = {Node::with_inputs(n, in), want};
    } else {
      FJ_USER_CHECK(false, ErrorKind::NotImplemented, "distribute: ", op_name(op),
                    " has no rule for several devices yet");
    }
    if (op == OpKind::CheckIndex && v.sbp.kind != Sbp::Broadcast) {
      // A failure names the position in the logical tensor (runtime::RunCheck).
      Attrs a = n->attrs();
      a.set("device_split", static_cast<int64_t>(v.sbp.kind == Sbp::Split   ? v.sbp.axis
                                                 : v.sbp.kind == Sbp::Local ? -2
                                                                            : -1));
      v.local = make_node(op, v.local->inputs(), a, n->loc());
    }
    values_[n.get()] = v;
  }

  // pad and slice keep a split along a dim they leave alone (a slice then
  // takes the local extent) and a partial value (linear; a pad only with 0).
  Value pad_or_slice(const NodeRef& n, std::vector<NodeRef>& in) {
    Sbp x = in_sbp(n, 0);
    Attrs a = n->attrs();
    bool keep = x.kind == Sbp::Broadcast;
    if (x.kind == Sbp::Partial) keep = n->op() == OpKind::Slice || a.get_float("pad_value") == 0.0;
    if (x.kind == Sbp::Split) {
      int d = x.axis;
      if (n->op() == OpKind::Pad) {
        keep = a.get_ints("pads_lo")[d] == 0 && a.get_ints("pads_hi")[d] == 0 &&
               a.get_ints("interior")[d] == 0;
      } else {
        keep = a.get_ints("begin")[d] == 0 && a.get_ints("step")[d] == 1 &&
               a.get_ints("shape")[d] == n->input(0)->shape()[d];
        if (keep) a.set("shape", split_shape(n->shape(), d, p_));
      }
    }
    if (!keep) {
      in[0] = box(n->input(0), Sbp::B());
      x = Sbp::B();
      a = n->attrs();
    }
    return {make_node(n->op(), in, a, n->loc()), x};
  }

  // gather(p, idx) / gather_nd: split indices (data parallel, e.g. token
  // ids against a whole embedding table) or params split along a dim that
  // is not indexed keep their split; partial params with whole indices stay
  // partial (linear); otherwise both become whole.
  Value gather(const NodeRef& n, std::vector<NodeRef>& in) {
    Sbp p = in_sbp(n, 0), i = in_sbp(n, 1);
    int ri = n->input(1)->rank();
    bool nd = n->op() == OpKind::GatherNd;
    int axis = nd ? 0 : static_cast<int>(n->attrs().get_int("axis"));
    int bd = nd ? 0 : static_cast<int>(n->attrs().get_int("batch_dims"));
    int k = nd ? static_cast<int>(n->input(1)->shape().back()) : 1;
    // Output dim of an index dim j and of a params dim d (-1: none).
    auto from_index = [&](int j) {
      return nd ? (j < ri - 1 ? j : -1) : (j < bd ? j : axis + j - bd);
    };
    auto from_params = [&](int d) {
      if (nd) return d >= k ? ri - 1 + d - k : -1;
      return d < axis ? d : d > axis ? d + ri - bd - 1 : -1;
    };
    auto local = [&](Sbp out) { return Value{Node::with_inputs(n, in), out}; };
    if (p.kind == Sbp::Broadcast && i.kind == Sbp::Split && from_index(i.axis) >= 0 &&
        (nd || i.axis >= bd))
      return local(Sbp::S(from_index(i.axis)));
    if (p.kind == Sbp::Split && from_params(p.axis) >= 0 && (nd || p.axis >= bd) &&
        i.kind == Sbp::Broadcast)
      return local(Sbp::S(from_params(p.axis)));
    if (!nd && p.kind == Sbp::Split && i.kind == Sbp::Split && p.axis == i.axis && p.axis < bd)
      return local(Sbp::S(p.axis));  // split batch dims
    if (p.kind == Sbp::Partial && i.kind == Sbp::Broadcast) return local(Sbp::P());
    if (i.kind == Sbp::Split && from_index(i.axis) >= 0 && (nd || i.axis >= bd)) {
      in[0] = box(n->input(0), Sbp::B());
      return local(Sbp::S(from_index(i.axis)));
    }
    in[0] = box(n->input(0), Sbp::B());
    in[1] = box(n->input(1), Sbp::B());
    return local(Sbp::B());
  }

  // segment_sum(data, ids): data and ids split along the same indexed dim
  // (data parallel: the gradient of an embedding) give partial sums; data
  // split along an outer or inner dim it keeps (ids split with it along a
  // batch dim, whole otherwise); partial data with whole ids stays partial
  // (linear); otherwise both become whole.
  Value segment_sum(const NodeRef& n, std::vector<NodeRef>& in) {
    Sbp d = in_sbp(n, 0), i = in_sbp(n, 1);
    int axis = static_cast<int>(n->attrs().get_int("axis")),
        bd = static_cast<int>(n->attrs().get_int("batch_dims"));
    int m = n->input(1)->rank() - bd;
    auto local = [&](Sbp out) { return Value{Node::with_inputs(n, in), out}; };
    if (d.kind == Sbp::Split) {
      int a = d.axis;
      if (a >= axis && a < axis + m && i.kind == Sbp::Split && i.axis == a - axis + bd)
        return local(Sbp::P());
      if (a < bd && i.kind == Sbp::Split && i.axis == a) return local(Sbp::S(a));
      if (a >= bd && a < axis && i.kind == Sbp::Broadcast) return local(Sbp::S(a));
      if (a >= axis + m && i.kind == Sbp::Broadcast) return local(Sbp::S(a - m + 1));
    }
    if (d.kind == Sbp::Partial && i.kind == Sbp::Broadcast) return local(Sbp::P());
    in[0] = box(n->input(0), Sbp::B());
    in[1] = box(n->input(1), Sbp::B());
    return local(Sbp::B());
  }

  // Elementwise with numpy broadcasting. Partial values stay partial through
  // the linear cases (sums of partials, a partial scaled by a whole value).
  Sbp elementwise(const NodeRef& n, std::vector<NodeRef>& in) {
    OpKind op = n->op();
    size_t k = in.size();
    std::vector<Sbp> s(k);
    for (size_t i = 0; i < k; ++i) s[i] = in_sbp(n, i);
    int partials = 0;
    for (auto& x : s) partials += x.kind == Sbp::Partial;
    if (partials > 0) {
      bool linear = false;
      if (op == OpKind::Add || op == OpKind::Sub) {
        linear = partials == 2 && n->input(0)->shape() == n->input(1)->shape();
      } else if (op == OpKind::Neg || op == OpKind::Identity) {
        linear = true;
      } else if (op == OpKind::Cast) {
        linear = is_float(n->dtype()) && is_float(n->input(0)->dtype());
      } else if (op == OpKind::Mul) {
        linear = partials == 1 && (s[0].kind == Sbp::Broadcast || s[1].kind == Sbp::Broadcast);
      } else if (op == OpKind::Div) {
        linear = s[0].kind == Sbp::Partial && s[1].kind == Sbp::Broadcast;
      }
      if (linear) {
        // A partial that broadcasts up would be counted several times.
        for (size_t i = 0; i < k; ++i)
          if (s[i].kind == Sbp::Partial && n->input(i)->shape() != n->shape()) linear = false;
      }
      if (linear) return Sbp::P();
    }
    const int R = n->rank();
    auto out_axis = [&](size_t i, int a) { return a + (R - n->input(i)->rank()); };
    // Partials that cannot stay partial are reduced: straight to the split
    // of the other operands when there is one (reduce_scatter moves less
    // than all_reduce), else to a whole value.
    if (partials > 0) {
      int split_axis = -1;
      for (size_t i = 0; i < k && split_axis < 0; ++i)
        if (s[i].kind == Sbp::Split &&
            n->input(i)->shape()[s[i].axis] == n->shape()[out_axis(i, s[i].axis)])
          split_axis = out_axis(i, s[i].axis);
      for (size_t i = 0; i < k; ++i) {
        if (s[i].kind != Sbp::Partial) continue;
        int ia = split_axis < 0 ? -1 : split_axis - (R - n->input(i)->rank());
        bool spans = ia >= 0 && n->input(i)->shape()[ia] == n->shape()[split_axis];
        s[i] = spans ? Sbp::S(ia) : Sbp::B();
        in[i] = box(n->input(i), s[i]);
      }
    }
    // The split axis of the result: that of the largest split operand whose
    // split dim is not broadcast.
    int axis = -1;
    int64_t best = -1;
    for (size_t i = 0; i < k; ++i) {
      if (s[i].kind != Sbp::Split) continue;
      int oa = out_axis(i, s[i].axis);
      if (n->input(i)->shape()[s[i].axis] != n->shape()[oa]) continue;
      if (n->input(i)->type().numel() > best) {
        best = n->input(i)->type().numel();
        axis = oa;
      }
    }
    for (size_t i = 0; i < k; ++i) {
      const NodeRef& x = n->input(i);
      int ia = axis < 0 ? -1 : axis - (R - x->rank());
      bool spans = ia >= 0 && x->shape()[ia] == n->shape()[axis];
      if (s[i].kind == Sbp::Split && !(spans && s[i].axis == ia)) {
        in[i] = box(x, Sbp::B());
        s[i] = Sbp::B();
      }
      if (axis >= 0 && s[i].kind == Sbp::Broadcast && spans) in[i] = box(x, Sbp::S(ia));
    }
    return axis < 0 ? Sbp::B() : Sbp::S(axis);
  }

  Sbp reduction(const NodeRef& n, std::vector<NodeRef>& in) {
    Sbp x = in_sbp(n, 0);
    const IntList& axes = n->attrs().get_ints("axes");
    bool keep = n->attrs().get_bool("keepdims");
    bool sum = n->op() == OpKind::ReduceSum;
    if (x.kind == Sbp::Partial) {
      if (sum) return Sbp::P();
      in[0] = box(n->input(0), Sbp::B());
      return Sbp::B();
    }
    if (x.kind != Sbp::Split) return x;
    bool reduced = std::find(axes.begin(), axes.end(), x.axis) != axes.end();
    if (!reduced) {
      int a = x.axis;
      if (!keep)
        for (int64_t r : axes) a -= r < x.axis;
      return Sbp::S(a);
    }
    if (sum) return Sbp::P();
    in[0] = box(n->input(0), Sbp::B());  // max/min/prod/argmax over the split axis
    return Sbp::B();
  }

  // Reshape and broadcast: a split survives when the rows before it and the
  // piece each device holds keep their meaning.
  Sbp reshape_like(const NodeRef& n, std::vector<NodeRef>& in) {
    Sbp x = in_sbp(n, 0);
    if (x.kind != Sbp::Split) return x;
    const Shape &is = n->input(0)->shape(), &os = n->shape();
    if (n->op() == OpKind::Broadcast) {
      int oa = x.axis + (static_cast<int>(os.size()) - static_cast<int>(is.size()));
      if (is[x.axis] == os[oa]) return Sbp::S(oa);
    } else {
      // Row-major: the pieces of S(a) are, per outer index, contiguous runs
      // of is[a]/parts * inner elements; S(b) has the same runs when the
      // outer products agree and os[b] divides.
      int64_t outer = prod(is, 0, x.axis);
      for (size_t b = 0; b < os.size(); ++b) {
        if (prod(os, 0, b) == outer && os[b] % p_ == 0 && os[b] >= p_)
          return Sbp::S(static_cast<int>(b));
        if (prod(os, 0, b) > outer) break;
      }
    }
    in[0] = box(n->input(0), Sbp::B());
    return Sbp::B();
  }

  // Convolutions: data parallel over the batch (axis 0 of x and dy); the
  // filter gradient of split batches is a partial sum.
  Sbp conv(const NodeRef& n, std::vector<NodeRef>& in) {
    const NodeRef &a = n->input(0), &b = n->input(1);
    std::vector<Candidate> c;
    c.push_back({{Sbp::B(), Sbp::B()}, Sbp::B()});
    switch (n->op()) {
      case OpKind::Conv:
      case OpKind::ConvDataGrad:
        if (can_split(a, 0)) c.push_back({{Sbp::S(0), Sbp::B()}, Sbp::S(0)});
        c.push_back({{Sbp::P(), Sbp::B()}, Sbp::P()});
        break;
      case OpKind::ConvFilterGrad:
        if (can_split(a, 0) && can_split(b, 0)) c.push_back({{Sbp::S(0), Sbp::S(0)}, Sbp::P()});
        break;
      default:
        break;
    }
    return apply(n, c, in);
  }

  Sbp matmul(const NodeRef& n, std::vector<NodeRef>& in) {
    const NodeRef &a = n->input(0), &b = n->input(1);
    bool ta = n->attrs().get_bool("transpose_a"), tb = n->attrs().get_bool("transpose_b");
    int ra = a->rank(), rb = b->rank(), R = n->rank();
    int aM = ra - 2 + (ta ? 1 : 0), aK = ra - 2 + (ta ? 0 : 1);
    int bK = rb - 2 + (tb ? 1 : 0), bN = rb - 2 + (tb ? 0 : 1);
    std::vector<Candidate> c;
    c.push_back({{Sbp::B(), Sbp::B()}, Sbp::B()});
    if (can_split(a, aM)) c.push_back({{Sbp::S(aM), Sbp::B()}, Sbp::S(R - 2)});
    if (can_split(b, bN)) c.push_back({{Sbp::B(), Sbp::S(bN)}, Sbp::S(R - 1)});
    if (can_split(a, aK)) c.push_back({{Sbp::S(aK), Sbp::S(bK)}, Sbp::P()});
    c.push_back({{Sbp::P(), Sbp::B()}, Sbp::P()});
    c.push_back({{Sbp::B(), Sbp::P()}, Sbp::P()});
    for (int i = 0; i < R - 2; ++i) {  // batch dims
      if (ra != R || !can_split(a, i)) continue;
      c.push_back({{Sbp::S(i), rb == R ? Sbp::S(i) : Sbp::B()}, Sbp::S(i)});
    }
    return apply(n, c, in);
  }

  const Graph& g_;
  DistributeOptions o_;
  int p_;
  std::unordered_map<const Node*, Value> values_;
  std::map<std::pair<const Node*, Sbp>, NodeRef> boxed_;
  std::map<std::string, std::pair<Sbp, TensorType>> vars_;
  int collectives_ = 0;
  std::ostringstream log_;
  std::set<std::string> warned_;
  std::vector<std::string> warnings_;
};

}  // namespace

DistributedGraph distribute(const Graph& g, const DistributeOptions& opts) {
  FJ_CHECK(opts.parts >= 1, "distribute: parts must be >= 1");
  return Distributor(g, opts).run();
}

}  // namespace flowjit::jit
