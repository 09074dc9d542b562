// fold: constant folding.
#include "jit/passes/fold.h"

#include <cmath>
#include <limits>
#include <optional>

namespace flowjit::jit {

using namespace ir;

namespace {

double to_dtype(double v, DType t) {
  auto sat = [&](double lo, double hi) {
    if (std::isnan(v)) return 0.0;
    return std::trunc(std::min(hi, std::max(lo, v)));
  };
  switch (t) {
    case DType::Bool:
      return v != 0 ? 1.0 : 0.0;
    case DType::Int8:
      return sat(-128, 127);
    case DType::UInt8:
      return sat(0, 255);
    case DType::Int32:
      return sat(-2147483648.0, 2147483647.0);
    case DType::Int64:
      return sat(-9223372036854775808.0, 9223372036854774784.0);
    case DType::Float32:
    case DType::Float64:
    case DType::Float16:
    case DType::BFloat16:
      return round_to_float_dtype(v, t);
  }
  return v;
}

std::optional<double> eval_elementwise(OpKind op, DType in, const std::vector<double>& x) {
  bool f = is_float(in);
  double a = x.empty() ? 0 : x[0], b = x.size() > 1 ? x[1] : 0;
  switch (op) {
    case OpKind::Identity:
    case OpKind::Cast:
      return a;
    case OpKind::Neg:
      return -a;
    case OpKind::Abs:
      return std::fabs(a);
    case OpKind::Sign:
      return std::isnan(a) ? a : (a > 0) - (a < 0);
    case OpKind::Floor:
      return std::floor(a);
    case OpKind::Ceil:
      return std::ceil(a);
    case OpKind::Round:
      return std::nearbyint(a);
    case OpKind::Exp:
      return std::exp(a);
    case OpKind::Log:
      return std::log(a);
    case OpKind::Sqrt:
      return std::sqrt(a);
    case OpKind::Rsqrt:
      return 1.0 / std::sqrt(a);
    case OpKind::Square:
      return a * a;
    case OpKind::Reciprocal:
      return 1.0 / a;
    case OpKind::Tanh:
      return std::tanh(a);
    case OpKind::Sigmoid:
      return 1.0 / (1.0 + std::exp(-a));
    case OpKind::Relu:
      return a < 0 ? 0.0 : a;
    case OpKind::Sin:
      return std::sin(a);
    case OpKind::Cos:
      return std::cos(a);
    case OpKind::Erf:
      return std::erf(a);
    case OpKind::Erfc:
      return std::erfc(a);
    case OpKind::LogicalNot:
      return a == 0 ? 1.0 : 0.0;
    case OpKind::Add:
      return a + b;
    case OpKind::Sub:
      return a - b;
    case OpKind::Mul:
      return a * b;
    case OpKind::Div:
      if (f) return a / b;
      return b == 0 ? 0.0 : std::trunc(a / b);
    case OpKind::Pow:
      return std::pow(a, b);
    case OpKind::Maximum:
      return (std::isnan(a) || std::isnan(b)) ? NAN : std::max(a, b);
    case OpKind::Minimum:
      return (std::isnan(a) || std::isnan(b)) ? NAN : std::min(a, b);
    case OpKind::Equal:
      return a == b;
    case OpKind::NotEqual:
      return a != b;
    case OpKind::Less:
      return a < b;
    case OpKind::LessEqual:
      return a <= b;
    case OpKind::Greater:
      return a > b;
    case OpKind::GreaterEqual:
      return a >= b;
    case OpKind::LogicalAnd:
      return (a != 0) && (b != 0);
    case OpKind::LogicalOr:
      return (a != 0) || (b != 0);
    case OpKind::Where:
      return x[0] != 0 ? x[1] : x[2];
    default:
      return std::nullopt;
  }
}

bool all_fills(const std::vector<NodeRef>& in) {
  for (auto& i : in)
    if (i->op() != OpKind::Fill) return false;
  return !in.empty();
}

// Integer results beyond 2^53 are not exact in a double: leave them alone.
bool exact(double v, DType t) { return is_float(t) || std::fabs(v) < 9007199254740992.0; }

}  // namespace

Graph fold(const Graph& g) {
  return rewrite_graph(g, [](const NodeRef& n, std::vector<NodeRef> in) -> NodeRef {
    NodeRef cand = Node::with_inputs(n, std::move(in));
    if (!all_fills(cand->inputs())) return cand;
    const auto& ins = cand->inputs();
    DType out = cand->dtype();
    std::optional<double> v;
    if (is_elementwise(cand->op())) {
      std::vector<double> xs;
      for (auto& i : ins) xs.push_back(i->attrs().get_float("value"));
      DType in_t = ins[cand->op() == OpKind::Where ? 1 : 0]->dtype();
      if (int64_t bits = dtype_bytes(in_t) * 8; is_int(in_t) && bits > 32) {
        for (double x : xs)
          if (!exact(x, in_t)) return cand;
      }
      v = eval_elementwise(cand->op(), in_t, xs);
    } else if (is_view(cand->op())) {
      // Window views read padding (and unwindow zeros) where they leave
      // their operand: they stay views of the fill unless nothing is padded.
      v = ins[0]->attrs().get_float("value");
      if (cand->op() == OpKind::Unwindow) return cand;
      if (cand->op() == OpKind::Pad && cand->attrs().get_float("pad_value") != v &&
          cand->type().numel() != ins[0]->type().numel())
        return cand;
      if (cand->op() == OpKind::Window) {
        bool any_pad = false;
        for (const char* key : {"pads_lo", "pads_hi"})
          for (int64_t p : cand->attrs().get_ints(key)) any_pad |= p != 0;
        if (any_pad && cand->attrs().get_float("pad_value") != v) return cand;
      }
    } else if (is_reduce(cand->op()) && cand->op() != OpKind::ArgMax &&
               cand->op() != OpKind::ArgMin) {
      double x = ins[0]->attrs().get_float("value");
      double count = static_cast<double>(ins[0]->type().numel()) /
                     static_cast<double>(std::max<int64_t>(1, cand->type().numel()));
      switch (cand->op()) {
        case OpKind::ReduceSum:
          v = x * count;
          break;
        case OpKind::ReduceProd:
          v = std::pow(x, count);
          break;
        default:
          v = x;
          break;
      }
    }
    if (!v || !exact(*v, out)) return cand;
    return fill(to_dtype(*v, out), cand->shape(), out, cand->loc());
  });
}

}  // namespace flowjit::jit
