// optimizer: minimize(loss) to gradient and update IR.
#include "jit/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/error.h"
#include "jit/autodiff.h"

namespace flowjit::jit {

using namespace ir;

std::string optimizer_name(OptimizerConfig::Kind k) {
  switch (k) {
    case OptimizerConfig::Kind::SGD:
      return "SGD";
    case OptimizerConfig::Kind::Adam:
      return "Adam";
    case OptimizerConfig::Kind::AdamW:
      return "AdamW";
    case OptimizerConfig::Kind::RMSProp:
      return "RMSProp";
    case OptimizerConfig::Kind::LAMB:
      return "LAMB";
    case OptimizerConfig::Kind::LARS:
      return "LARS";
  }
  return "?";
}

namespace {

class Lowering {
 public:
  Lowering(const OptimizerConfig& cfg, const NodeRef& lr, const NodeRef& step)
      : cfg_(cfg), lr_(lr), step_(step) {}

  NodeRef k(double v, const NodeRef& like) { return scalar_like(v, like); }
  NodeRef add(const NodeRef& a, const NodeRef& b) { return binary(OpKind::Add, a, b); }
  NodeRef sub(const NodeRef& a, const NodeRef& b) { return binary(OpKind::Sub, a, b); }
  NodeRef mul(const NodeRef& a, const NodeRef& b) { return binary(OpKind::Mul, a, b); }
  NodeRef div(const NodeRef& a, const NodeRef& b) { return binary(OpKind::Div, a, b); }
  NodeRef sqrt(const NodeRef& a) { return unary(OpKind::Sqrt, a); }
  static IntList all_axes(const NodeRef& x) {
    IntList all;
    for (int i = 0; i < x->rank(); ++i) all.push_back(i);
    return all;
  }
  NodeRef norm(const NodeRef& x) {
    return sqrt(reduce(OpKind::ReduceSum, unary(OpKind::Square, x), all_axes(x), false));
  }
  NodeRef rms(const NodeRef& x) {  // sqrt(sum(x^2) / n)
    double n = static_cast<double>(std::max<int64_t>(1, x->type().numel()));
    return sqrt(mul(reduce(OpKind::ReduceSum, unary(OpKind::Square, x), all_axes(x), false),
                    k(1.0 / n, x)));
  }

  // The learning rate of the rule being lowered, in the parameter's dtype.
  NodeRef lr(const NodeRef& like) { return cast(group_lr_ ? group_lr_ : lr_, like->dtype()); }

  NodeRef state(const NodeRef& param, const std::string& suffix) {
    std::string name = param->attrs().get_str("name") + "-" + suffix;
    out_.new_variables.emplace_back(name, param->type());
    return make_node(OpKind::Variable, {},
                     Attrs{{"name", name}, {"shape", param->shape()}, {"dtype", param->dtype()}},
                     param->loc());
  }

  // A parameter or state update; under dynamic loss scaling it keeps the
  // old value on a step whose gradients are not all finite.
  void assign(const NodeRef& var, const NodeRef& value) {
    NodeRef v = value;
    if (rows_touched_) v = where(rows_touched_, v, var);
    if (all_finite_) v = where(all_finite_, v, var);
    out_.effects.push_back(make_node(OpKind::Assign, {var, v}, {}, var->loc()));
  }

  bool decays(const NodeRef& param) const {
    const OptimizerConfig& c = *rule_;
    if (c.weight_decay == 0) return false;
    const std::string& name = param->attrs().get_str("name");
    if (c.weight_decay_by_name)
      return std::find(c.weight_decay_variables.begin(), c.weight_decay_variables.end(), name) !=
             c.weight_decay_variables.end();
    bool inc = c.weight_decay_includes.empty();
    for (auto& s : c.weight_decay_includes) inc |= name.find(s) != std::string::npos;
    for (auto& s : c.weight_decay_excludes) inc &= name.find(s) == std::string::npos;
    return inc;
  }

  // 1 - beta^t with t = step + 1, in the parameter's dtype.
  NodeRef one_minus_pow(double beta, const NodeRef& like) {
    NodeRef t = cast(add(step_, k(1, step_)), like->dtype());
    return sub(k(1, like), binary(OpKind::Pow, k(beta, like), t));
  }

  void update(const NodeRef& w, const NodeRef& g) {
    using K = OptimizerConfig::Kind;
    switch (rule_->kind) {
      case K::SGD: {
        // OneFlow's SGDUpdateFunctor / MomentumUpdateFunctor; the weight
        // decay (SGDW) is decoupled from the momentum:
        //   w -= lr * (g + wd * w), or v = beta * v - lr * g; w += v - lr * wd * w.
        NodeRef wd = decays(w) ? mul(mul(lr(w), k(rule_->weight_decay, w)), w) : nullptr;
        if (rule_->momentum == 0) {
          NodeRef w2 = sub(w, mul(lr(w), g));
          assign(w, wd ? sub(w2, wd) : w2);
          return;
        }
        NodeRef v = state(w, "momentum");
        NodeRef v2 = sub(mul(k(rule_->momentum, w), v), mul(lr(w), g));
        assign(v, v2);
        NodeRef w2 = add(w, v2);
        assign(w, wd ? sub(w2, wd) : w2);
        return;
      }
      case K::Adam:
      case K::AdamW:
      case K::LAMB: {
        NodeRef m = state(w, "m"), v = state(w, "v");
        NodeRef m2 = add(mul(k(rule_->beta1, w), m), mul(k(1 - rule_->beta1, w), g));
        NodeRef v2 =
            add(mul(k(rule_->beta2, w), v), mul(k(1 - rule_->beta2, w), unary(OpKind::Square, g)));
        assign(m, m2);
        assign(v, v2);
        NodeRef mh = m2, vh = v2;
        if (rule_->do_bias_correction || rule_->kind == K::LAMB) {
          mh = div(m2, one_minus_pow(rule_->beta1, w));
          vh = div(v2, one_minus_pow(rule_->beta2, w));
        }
        if (rule_->kind == K::LAMB) {
          // OneFlow's LAMB (LambGradFunctor, 2021): d = m_hat / (sqrt(v_hat) + eps);
          // trust = ||w|| / ||d|| (1 when either norm is zero);
          // w -= lr * trust * (d + wd * w).
          NodeRef d = div(mh, add(sqrt(vh), k(rule_->epsilon, w)));
          NodeRef wn = norm(w), dn = norm(d);
          NodeRef zero = k(0, wn);
          NodeRef ok = binary(OpKind::LogicalAnd, binary(OpKind::Greater, wn, zero),
                              binary(OpKind::Greater, dn, zero));
          NodeRef trust = where(ok, div(wn, dn), k(1, wn));
          NodeRef dir = decays(w) ? add(d, mul(k(rule_->weight_decay, w), w)) : d;
          assign(w, sub(w, mul(mul(lr(w), trust), dir)));
          return;
        }
        NodeRef dir = div(mh, add(sqrt(vh), k(rule_->epsilon, w)));
        NodeRef step = mul(lr(w), dir);
        if (rule_->kind == K::AdamW && decays(w))
          step = add(step, mul(mul(lr(w), k(rule_->weight_decay, w)), w));
        assign(w, sub(w, step));
        return;
      }
      case K::RMSProp: {
        NodeRef ms = state(w, "mean_square");
        NodeRef ms2 = add(mul(k(rule_->decay_rate, w), ms),
                          mul(k(1 - rule_->decay_rate, w), unary(OpKind::Square, g)));
        assign(ms, ms2);
        NodeRef denom_sq = ms2;
        if (rule_->centered) {
          NodeRef mg = state(w, "mean_gradient");
          NodeRef mg2 = add(mul(k(rule_->decay_rate, w), mg), mul(k(1 - rule_->decay_rate, w), g));
          assign(mg, mg2);
          denom_sq = sub(ms2, unary(OpKind::Square, mg2));
        }
        NodeRef denom = sqrt(add(denom_sq, k(rule_->epsilon, w)));
        assign(w, sub(w, div(mul(lr(w), g), denom)));
        return;
      }
      case K::LARS: {
        // OneFlow's LarsUpdateKernelUtil (2021), with L2 norms:
        //   lars = coeff * ||w|| / (eps + ||g|| + wd * ||w||), 1 when a norm is 0
        //   local = lr * lars;  v = beta * v - local * g;  w = w + v - local * wd * w
        NodeRef mom = state(w, "momentum");
        NodeRef wn = norm(w), gn = norm(g);
        double wd = decays(w) ? rule_->weight_decay : 0.0;
        NodeRef denom = add(add(gn, k(rule_->epsilon, gn)), mul(k(wd, wn), wn));
        NodeRef zero = k(0, wn);
        NodeRef ok = binary(OpKind::LogicalAnd, binary(OpKind::Greater, wn, zero),
                            binary(OpKind::Greater, gn, zero));
        NodeRef lars = where(ok, div(mul(k(rule_->lars_coefficient, wn), wn), denom), k(1, wn));
        NodeRef local = mul(lr(wn), lars);
        NodeRef mom2 = sub(mul(k(rule_->momentum, w), mom), mul(local, g));
        assign(mom, mom2);
        NodeRef w2 = add(w, mom2);
        assign(w, wd != 0 ? sub(w2, mul(mul(local, k(wd, w)), w)) : w2);
        return;
      }
    }
  }

  // The loss scale as a rank-0 value of `like`'s dtype (dynamic policy).
  NodeRef dynamic_scale(const NodeRef& like) {
    return cast(reshape(cfg_.loss_scale, Shape{}), like->dtype());
  }

  // g *= clip / max(global_norm, clip) over one rule's gradients, the norm in
  // the widest float dtype among them.
  void clip(std::vector<NodeRef*>& grads, double clip_norm) {
    if (clip_norm <= 0 || grads.empty()) return;
    DType acc_t = DType::Float32;
    for (NodeRef* g : grads)
      if ((*g)->dtype() == DType::Float64) acc_t = DType::Float64;
    NodeRef total;
    for (NodeRef* g : grads) {
      NodeRef s =
          cast(reduce(OpKind::ReduceSum, unary(OpKind::Square, *g), all_axes(*g), false), acc_t);
      total = total ? add(total, s) : s;
    }
    NodeRef gnorm = sqrt(total);
    NodeRef c = fill(clip_norm, {}, acc_t);
    NodeRef scale = div(c, binary(OpKind::Maximum, gnorm, c));
    for (NodeRef* g : grads) *g = mul(*g, cast(scale, (*g)->dtype()));
  }

  // 1 when every gradient element is finite, else 0 (a bool scalar): an
  // element is finite when |g| <= the dtype's largest value, false for inf
  // and for nan.
  NodeRef all_finite(const std::vector<NodeRef>& grads) {
    NodeRef count;
    for (const NodeRef& g : grads) {
      double big = g->dtype() == DType::Float64    ? std::numeric_limits<double>::max()
                   : g->dtype() == DType::Float16  ? 65504.0
                   : g->dtype() == DType::BFloat16 ? 3.3895313892515355e38
                                                   : std::numeric_limits<float>::max();
      NodeRef bad =
          unary(OpKind::LogicalNot, binary(OpKind::LessEqual, unary(OpKind::Abs, g), k(big, g)));
      NodeRef c = reduce(OpKind::ReduceSum, cast(bad, DType::Float32), all_axes(g), false);
      count = count ? add(count, c) : c;
    }
    return binary(OpKind::Equal, count, k(0, count));
  }

  bool sparse(const NodeRef& param) const {
    const std::string& name = param->attrs().get_str("name");
    for (const std::string& s : cfg_.sparse_variables)
      if (s == name) return param->rank() > 0;
    return false;
  }

  // Per row (axis 0) of g, whether any element is non-zero, shaped to
  // broadcast against g: (rows, 1, ..., 1).
  NodeRef touched_rows(const NodeRef& g) {
    IntList rest;
    for (int i = 1; i < g->rank(); ++i) rest.push_back(i);
    NodeRef m = unary(OpKind::Abs, g);
    if (!rest.empty()) m = reduce(OpKind::ReduceMax, m, rest, true);
    return binary(OpKind::Greater, m, k(0, m));
  }

  // OneFlow's dynamic_loss_scale_schedule, in float64 as its kernel.
  void schedule_loss_scale(const NodeRef& finite) {
    const NodeRef& var = cfg_.loss_scale;
    const NodeRef& good = cfg_.good_steps;
    NodeRef s = cast(var, DType::Float64);
    NodeRef good1 = add(good, k(1, good));
    NodeRef due =
        binary(OpKind::GreaterEqual, good1, k(static_cast<double>(cfg_.increment_period), good1));
    NodeRef grown = binary(OpKind::Minimum, mul(s, k(cfg_.multiplier, s)),
                           k(std::numeric_limits<float>::max(), s));
    NodeRef shrunk = binary(OpKind::Maximum, div(s, k(cfg_.multiplier, s)), k(1, s));
    NodeRef when_good = where(due, grown, s);
    NodeRef s2 = cast(where(finite, when_good, shrunk), var->dtype());
    NodeRef zero = k(0, good);
    NodeRef good2 = where(finite, where(due, zero, good1), zero);
    out_.effects.push_back(make_node(OpKind::Assign, {var, s2}, {}, var->loc()));
    out_.effects.push_back(make_node(OpKind::Assign, {good, good2}, {}, good->loc()));
  }

  OptimizerLowering run(const std::vector<NodeRef>& losses, const std::vector<NodeRef>& params,
                        const std::vector<NodeRef>& watched) {
    const bool dynamic = cfg_.loss_scale != nullptr;
    FJ_CHECK(!dynamic || cfg_.good_steps != nullptr, "dynamic loss scale without its counter");
    std::vector<NodeRef> grads, seen;
    std::vector<NodeRef> wrt = params;
    wrt.insert(wrt.end(), watched.begin(), watched.end());
    for (const NodeRef& loss : losses) {
      FJ_USER_CHECK(is_float(loss->dtype()) || is_int(loss->dtype()), ErrorKind::Type,
                    "minimize: the loss must be a number blob (float or, as OneFlow allows, "
                    "integer), got ",
                    loss->type().str());
      double n = static_cast<double>(std::max<int64_t>(1, loss->type().numel()));
      // As OneFlow: the loss is seeded with ones (times a loss scale) and only
      // the variables' gradients are scaled by 1 / (loss elements), so a
      // watched gradient is exactly the gradient of the loss's sum (seeding
      // 1/n and multiplying watched ones back by n was off by rounding).
      NodeRef seed = fill(cfg_.loss_scale_factor, loss->shape(), loss->dtype(), loss->loc());
      if (dynamic) seed = mul(seed, dynamic_scale(seed));
      std::vector<NodeRef> all = gradients(loss, seed, wrt);
      std::vector<NodeRef> gs(all.begin(), all.begin() + params.size());
      if (n != 1)
        for (auto& g : gs) g = mul(g, k(1.0 / n, g));
      for (size_t i = 0; i < watched.size(); ++i) {
        const NodeRef& a = all[params.size() + i];
        NodeRef w = cfg_.loss_scale_factor != 1 ? mul(a, k(1.0 / cfg_.loss_scale_factor, a)) : a;
        if (dynamic) w = div(w, dynamic_scale(w));
        if (seen.size() <= i)
          seen.push_back(w);
        else
          seen[i] = add(seen[i], w);
      }
      if (grads.empty()) {
        grads = gs;
      } else {
        for (size_t i = 0; i < gs.size(); ++i) grads[i] = add(grads[i], gs[i]);
      }
    }
    out_.watched_grads = seen;
    if (cfg_.mirrored_parts > 1)
      for (auto& g : grads)
        g = mul(make_node(OpKind::AllReduce, {g}, Attrs{{"parts", int64_t{cfg_.mirrored_parts}}},
                          g->loc()),
                k(1.0 / cfg_.mirrored_parts, g));
    if (cfg_.loss_scale_factor != 1)
      for (auto& g : grads) g = mul(g, k(1.0 / cfg_.loss_scale_factor, g));
    if (dynamic) {
      for (auto& g : grads) g = div(g, dynamic_scale(g));
      all_finite_ = all_finite(grads);
    }
    // Each parameter's rule: the one rule, or the group naming it.
    std::vector<const OptimizerConfig*> rule_of(params.size(), &cfg_);
    std::vector<const OptimizerConfig*> rules{&cfg_};
    if (!cfg_.groups.empty()) {
      rules.clear();
      for (const OptimizerConfig& grp : cfg_.groups) rules.push_back(&grp);
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string& name = params[i]->attrs().get_str("name");
        rule_of[i] = nullptr;
        for (const OptimizerConfig& grp : cfg_.groups)
          for (const std::string& v : grp.variables)
            if (v == name) {
              FJ_USER_CHECK(rule_of[i] == nullptr || rule_of[i] == &grp, ErrorKind::Value,
                            "CombinedOptimizer: variable '", name,
                            "' is given to two optimizers; each variable may have one");
              rule_of[i] = &grp;
            }
      }
    }
    for (const OptimizerConfig* r : rules) {
      std::vector<NodeRef*> mine;
      for (size_t i = 0; i < params.size(); ++i)
        if (rule_of[i] == r) mine.push_back(&grads[i]);
      clip(mine, r->clip_norm);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (rule_of[i] == nullptr) continue;  // no optimizer of the combined set names it
      rule_ = rule_of[i];
      group_lr_ = rule_->lr;
      rows_touched_ = sparse(params[i]) ? touched_rows(grads[i]) : nullptr;
      PlacementScope placed(params[i]->loc().placement);  // a variable is updated where it lives
      update(params[i], grads[i]);
    }
    out_.effects.push_back(
        make_node(OpKind::Assign, {step_, add(step_, k(1, step_))}, {}, step_->loc()));
    if (dynamic) schedule_loss_scale(all_finite_);
    return std::move(out_);
  }

 private:
  const OptimizerConfig& cfg_;
  const OptimizerConfig* rule_ = &cfg_;  // the rule of the parameter being updated
  NodeRef lr_, step_;
  NodeRef group_lr_;      // that rule's own rate, or null
  NodeRef all_finite_;    // dynamic loss scaling: the step's gradients are finite
  NodeRef rows_touched_;  // a sparse variable: the rows its gradient touches
  OptimizerLowering out_;
};

}  // namespace

OptimizerLowering lower_optimizer(const OptimizerConfig& cfg, const std::vector<NodeRef>& losses,
                                  const NodeRef& lr, const NodeRef& step,
                                  const std::vector<NodeRef>& params,
                                  const std::vector<NodeRef>& watched) {
  FJ_CHECK(lr->rank() == 0 && is_float(lr->dtype()), "learning rate must be a float scalar");
  FJ_CHECK(step->op() == OpKind::Variable && step->dtype() == DType::Int64, "bad step variable");
  FJ_USER_CHECK(!losses.empty(), ErrorKind::Value, "minimize: no loss given");
  return Lowering(cfg, lr, step).run(losses, params, watched);
}

}  // namespace flowjit::jit
