// optimizer: minimize(loss) to gradient and update IR.
#include "jit/optimizer.h"

#include <cmath>

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

  // The learning rate in the parameter's dtype.
  NodeRef lr(const NodeRef& like) { return cast(lr_, like->dtype()); }

  NodeRef state(const NodeRef& param, const std::string& suffix) {
    std::string name = param->attrs().get_str("name") + "-" + suffix;
    out_.new_variables.emplace_back(name, param->type());
    return make_node(OpKind::Variable, {},
                     Attrs{{"name", name}, {"shape", param->shape()}, {"dtype", param->dtype()}},
                     param->loc());
  }

  void assign(const NodeRef& var, const NodeRef& value) {
    out_.effects.push_back(make_node(OpKind::Assign, {var, value}, {}, var->loc()));
  }

  bool decays(const NodeRef& param) const {
    if (cfg_.weight_decay == 0) return false;
    const std::string& name = param->attrs().get_str("name");
    bool inc = cfg_.weight_decay_includes.empty();
    for (auto& s : cfg_.weight_decay_includes) inc |= name.find(s) != std::string::npos;
    for (auto& s : cfg_.weight_decay_excludes) inc &= name.find(s) == std::string::npos;
    return inc;
  }

  // 1 - beta^t with t = step + 1, in the parameter's dtype.
  NodeRef one_minus_pow(double beta, const NodeRef& like) {
    NodeRef t = cast(add(step_, k(1, step_)), like->dtype());
    return sub(k(1, like), binary(OpKind::Pow, k(beta, like), t));
  }

  void update(const NodeRef& w, const NodeRef& g) {
    using K = OptimizerConfig::Kind;
    switch (cfg_.kind) {
      case K::SGD: {
        if (cfg_.momentum == 0) {
          assign(w, sub(w, mul(lr(w), g)));
          return;
        }
        // OneFlow's momentum: v = beta * v - lr * g; w = w + v.
        NodeRef v = state(w, "momentum");
        NodeRef v2 = sub(mul(k(cfg_.momentum, w), v), mul(lr(w), g));
        assign(v, v2);
        assign(w, add(w, v2));
        return;
      }
      case K::Adam:
      case K::AdamW:
      case K::LAMB: {
        NodeRef m = state(w, "m"), v = state(w, "v");
        NodeRef m2 = add(mul(k(cfg_.beta1, w), m), mul(k(1 - cfg_.beta1, w), g));
        NodeRef v2 =
            add(mul(k(cfg_.beta2, w), v), mul(k(1 - cfg_.beta2, w), unary(OpKind::Square, g)));
        assign(m, m2);
        assign(v, v2);
        NodeRef mh = m2, vh = v2;
        if (cfg_.do_bias_correction || cfg_.kind == K::LAMB) {
          mh = div(m2, one_minus_pow(cfg_.beta1, w));
          vh = div(v2, one_minus_pow(cfg_.beta2, w));
        }
        if (cfg_.kind == K::LAMB) {
          // OneFlow's LAMB: d = m_hat / sqrt(v_hat + eps); trust = ||w|| / ||d||
          // (1 when either norm is zero); w -= lr * trust * (d + wd * w).
          NodeRef d = div(mh, sqrt(add(vh, k(cfg_.epsilon, w))));
          NodeRef wn = norm(w), dn = norm(d);
          NodeRef zero = k(0, wn);
          NodeRef ok = binary(OpKind::LogicalAnd, binary(OpKind::Greater, wn, zero),
                              binary(OpKind::Greater, dn, zero));
          NodeRef trust = where(ok, div(wn, dn), k(1, wn));
          NodeRef dir = decays(w) ? add(d, mul(k(cfg_.weight_decay, w), w)) : d;
          assign(w, sub(w, mul(mul(lr(w), trust), dir)));
          return;
        }
        NodeRef dir = div(mh, add(sqrt(vh), k(cfg_.epsilon, w)));
        NodeRef step = mul(lr(w), dir);
        if (cfg_.kind == K::AdamW && decays(w))
          step = add(step, mul(mul(lr(w), k(cfg_.weight_decay, w)), w));
        assign(w, sub(w, step));
        return;
      }
      case K::RMSProp: {
        NodeRef ms = state(w, "mean_square");
        NodeRef ms2 = add(mul(k(cfg_.decay_rate, w), ms),
                          mul(k(1 - cfg_.decay_rate, w), unary(OpKind::Square, g)));
        assign(ms, ms2);
        NodeRef denom_sq = ms2;
        if (cfg_.centered) {
          NodeRef mg = state(w, "mean_gradient");
          NodeRef mg2 = add(mul(k(cfg_.decay_rate, w), mg), mul(k(1 - cfg_.decay_rate, w), g));
          assign(mg, mg2);
          denom_sq = sub(ms2, unary(OpKind::Square, mg2));
        }
        NodeRef denom = sqrt(add(denom_sq, k(cfg_.epsilon, w)));
        assign(w, sub(w, div(mul(lr(w), g), denom)));
        return;
      }
      case K::LARS: {
        // OneFlow's LARS, with root-mean-square norms:
        //   local = lr * coeff * ||w|| / (||g|| + wd * ||w|| + eps)
        //   (the weight-decay term from the second step on)
        //   v = beta * v - local * (g + wd * w);  w = w + v
        NodeRef mom = state(w, "momentum");
        NodeRef wn = rms(w), gn = rms(g);
        double wd = cfg_.weight_decay;
        NodeRef denom = add(gn, k(cfg_.epsilon, gn));
        if (wd != 0) {
          NodeRef first = binary(OpKind::Equal, step_, k(0, step_));
          denom = add(denom, where(first, k(0, wn), mul(k(wd, wn), wn)));
        }
        NodeRef local = mul(lr(wn), div(mul(k(cfg_.lars_coefficient, wn), wn), denom));
        NodeRef dir = wd != 0 ? add(g, mul(k(wd, w), w)) : g;
        NodeRef mom2 = sub(mul(k(cfg_.momentum, w), mom), mul(local, dir));
        assign(mom, mom2);
        assign(w, add(w, mom2));
        return;
      }
    }
  }

  OptimizerLowering run(const std::vector<NodeRef>& losses, const std::vector<NodeRef>& params,
                        const std::vector<NodeRef>& watched) {
    std::vector<NodeRef> grads, seen;
    std::vector<NodeRef> wrt = params;
    wrt.insert(wrt.end(), watched.begin(), watched.end());
    for (const NodeRef& loss : losses) {
      FJ_USER_CHECK(is_float(loss->dtype()), ErrorKind::Type,
                    "minimize: the loss must be a floating-point blob, got ", loss->type().str());
      double n = static_cast<double>(std::max<int64_t>(1, loss->type().numel()));
      NodeRef seed = fill(cfg_.loss_scale_factor / n, loss->shape(), loss->dtype(), loss->loc());
      std::vector<NodeRef> all = gradients(loss, seed, wrt);
      std::vector<NodeRef> gs(all.begin(), all.begin() + params.size());
      for (size_t i = 0; i < watched.size(); ++i) {
        // OneFlow seeds the loss with ones and scales only the variables'
        // gradients by 1 / (loss elements): undo the scaled seed here.
        NodeRef w =
            mul(all[params.size() + i], k(n / cfg_.loss_scale_factor, all[params.size() + i]));
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
    if (cfg_.clip_norm > 0 && !grads.empty()) {
      // g *= clip / max(global_norm, clip), the norm in the widest float
      // dtype among the gradients.
      DType acc_t = DType::Float32;
      for (auto& g : grads)
        if (g->dtype() == DType::Float64) acc_t = DType::Float64;
      NodeRef total;
      for (auto& g : grads) {
        NodeRef s =
            cast(reduce(OpKind::ReduceSum, unary(OpKind::Square, g), all_axes(g), false), acc_t);
        total = total ? add(total, s) : s;
      }
      NodeRef gnorm = sqrt(total);
      NodeRef clip = fill(cfg_.clip_norm, {}, acc_t);
      NodeRef scale = div(clip, binary(OpKind::Maximum, gnorm, clip));
      for (auto& g : grads) g = mul(g, cast(scale, g->dtype()));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      PlacementScope placed(params[i]->loc().placement);  // a variable is updated where it lives
      update(params[i], grads[i]);
    }
    assign(step_, add(step_, k(1, step_)));
    return std::move(out_);
  }

 private:
  const OptimizerConfig& cfg_;
  NodeRef lr_, step_;
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
