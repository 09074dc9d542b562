// Convolution and window geometry, and the type rules of those ops.
#include "ir/conv.h"

#include "ir/error.h"

namespace flowjit::ir {

namespace {

constexpr ErrorKind kType = ErrorKind::Type;
constexpr ErrorKind kValue = ErrorKind::Value;

int64_t prod(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t d : v) p *= d;
  return p;
}

std::vector<int64_t> ints_or(const Attrs& a, const std::string& key, size_t n, int64_t dflt) {
  if (!a.has(key)) return std::vector<int64_t>(n, dflt);
  return a.get_ints(key);
}

}  // namespace

int64_t ConvGeometry::in_size() const { return prod(in); }
int64_t ConvGeometry::kernel_size() const { return prod(kernel); }
int64_t ConvGeometry::out_size() const { return prod(out); }

ConvGeometry conv_geometry(std::string_view op, const Attrs& a, const std::vector<int64_t>& in,
                           const std::vector<int64_t>& kernel) {
  ConvGeometry g;
  g.spatial = static_cast<int>(in.size());
  size_t s = in.size();
  FJ_USER_CHECK(kernel.size() == s, kValue, op, ": kernel has ", kernel.size(),
                " spatial dims but the input has ", s);
  g.in = in;
  g.kernel = kernel;
  g.strides = ints_or(a, "strides", s, 1);
  g.dilations = ints_or(a, "dilations", s, 1);
  g.pads_lo = ints_or(a, "pads_lo", s, 0);
  g.pads_hi = ints_or(a, "pads_hi", s, 0);
  g.groups = a.get_int("groups", 1);
  auto check_len = [&](const char* what, const std::vector<int64_t>& v) {
    FJ_USER_CHECK(v.size() == s, kValue, op, ": ", what, " has ", v.size(), " entries, expected ",
                  s, " (one per spatial dim)");
  };
  check_len("strides", g.strides);
  check_len("dilations", g.dilations);
  check_len("pads_lo", g.pads_lo);
  check_len("pads_hi", g.pads_hi);
  FJ_USER_CHECK(g.groups >= 1, kValue, op, ": groups must be >= 1, got ", g.groups);
  for (size_t i = 0; i < s; ++i) {
    FJ_USER_CHECK(g.strides[i] >= 1, kValue, op, ": strides must be >= 1, got ", g.strides[i]);
    FJ_USER_CHECK(g.dilations[i] >= 1, kValue, op, ": dilations must be >= 1, got ",
                  g.dilations[i]);
    FJ_USER_CHECK(g.pads_lo[i] >= 0 && g.pads_hi[i] >= 0, kValue, op,
                  ": padding must be >= 0, got ", g.pads_lo[i], " and ", g.pads_hi[i]);
    FJ_USER_CHECK(kernel[i] >= 1, kValue, op, ": kernel extent must be >= 1, got ", kernel[i]);
    // Attributes come from the user: a padding or dilation near 2^62 must be
    // refused by name, never wrap into a negative extent.
    int64_t span = 0, padded = 0;
    FJ_USER_CHECK(!__builtin_mul_overflow(g.dilations[i], kernel[i] - 1, &span) &&
                      !__builtin_add_overflow(span, 1, &span),
                  kValue, op, ": the kernel span along spatial dim ", i, " (extent ", kernel[i],
                  ", dilation ", g.dilations[i], ") overflows int64");
    FJ_USER_CHECK(!__builtin_add_overflow(in[i], g.pads_lo[i], &padded) &&
                      !__builtin_add_overflow(padded, g.pads_hi[i], &padded),
                  kValue, op, ": the padded input along spatial dim ", i, " (", in[i],
                  " + padding ", g.pads_lo[i], " + ", g.pads_hi[i], ") overflows int64");
    FJ_USER_CHECK(span <= padded, kValue, op, ": the kernel spans ", span,
                  " positions along spatial dim ", i, " (extent ", kernel[i], ", dilation ",
                  g.dilations[i], ") but the padded input has only ", padded, " (", in[i],
                  " + padding ", g.pads_lo[i], " + ", g.pads_hi[i], ")");
    g.out.push_back((padded - span) / g.strides[i] + 1);
  }
  return g;
}

ConvGeometry geometry_of(const Node& n) {
  const Attrs& a = n.attrs();
  switch (n.op()) {
    case OpKind::Conv: {
      const Shape &x = n.input(0)->shape(), &w = n.input(1)->shape();
      return conv_geometry("conv", a, {x.begin() + 2, x.end()}, {w.begin() + 2, w.end()});
    }
    case OpKind::ConvDataGrad: {
      const Shape& w = n.input(1)->shape();
      return conv_geometry("conv_data_grad", a, a.get_ints("in_spatial"), {w.begin() + 2, w.end()});
    }
    case OpKind::ConvFilterGrad: {
      const Shape& x = n.input(0)->shape();
      return conv_geometry("conv_filter_grad", a, {x.begin() + 2, x.end()}, a.get_ints("kernel"));
    }
    case OpKind::Window: {
      const Shape& x = n.input(0)->shape();
      const IntList& k = a.get_ints("window");
      return conv_geometry("window", a, {x.end() - k.size(), x.end()}, k);
    }
    case OpKind::Unwindow:
      return conv_geometry("unwindow", a, a.get_ints("in_spatial"), a.get_ints("window"));
    default:
      FJ_CHECK(false, "geometry_of: ", op_name(n.op()), " is not a convolution or window op");
  }
  return {};
}

TensorType infer_conv_family(OpKind op, const std::vector<NodeRef>& inputs, Attrs& attrs) {
  std::string_view name = op_name(op);
  auto same_float = [&](const TensorType& a, const TensorType& b) {
    FJ_USER_CHECK(is_float(a.dtype), kType, name, ": expected a floating-point input, got ",
                  a.str());
    FJ_USER_CHECK(a.dtype == b.dtype, kType, name, ": operand dtypes differ: ", a.str(), " and ",
                  b.str());
  };
  switch (op) {
    case OpKind::Conv: {
      const TensorType &x = inputs[0]->type(), &w = inputs[1]->type();
      same_float(x, w);
      FJ_USER_CHECK(x.rank() >= 3 && x.rank() <= 5, kValue, name,
                    ": input must be [N, C, spatial...] with 1 to 3 spatial dims, got ", x.str());
      FJ_USER_CHECK(w.rank() == x.rank(), kValue, name, ": weight ", w.str(), " must have rank ",
                    x.rank(), " like the input ", x.str());
      ConvGeometry g = conv_geometry(name, attrs, {x.shape.begin() + 2, x.shape.end()},
                                     {w.shape.begin() + 2, w.shape.end()});
      int64_t c = x.shape[1], co = w.shape[0];
      FJ_USER_CHECK(c % g.groups == 0, kValue, name, ": input channels (", c,
                    ") are not divisible by groups (", g.groups, ")");
      FJ_USER_CHECK(co % g.groups == 0, kValue, name, ": filters (", co,
                    ") are not divisible by groups (", g.groups, ")");
      FJ_USER_CHECK(w.shape[1] * g.groups == c, kValue, name, ": weight ", w.str(), " expects ",
                    w.shape[1] * g.groups, " input channels (", w.shape[1], " per group x ",
                    g.groups, " groups) but the input has ", c);
      return {x.dtype, {x.shape[0], g.groups, co / g.groups, g.out_size()}};
    }
    case OpKind::ConvDataGrad: {
      const TensorType &dy = inputs[0]->type(), &w = inputs[1]->type();
      same_float(dy, w);
      ConvGeometry g = conv_geometry(name, attrs, attrs.get_ints("in_spatial"),
                                     {w.shape.begin() + 2, w.shape.end()});
      int64_t co = w.shape[0];
      FJ_USER_CHECK(dy.rank() == 4 && dy.shape[1] == g.groups && dy.shape[2] * g.groups == co &&
                        dy.shape[3] == g.out_size(),
                    kValue, name, ": gradient ", dy.str(), " does not match the weight ", w.str());
      return {dy.dtype, {dy.shape[0], g.groups, w.shape[1], g.in_size()}};
    }
    case OpKind::ConvFilterGrad: {
      const TensorType &x = inputs[0]->type(), &dy = inputs[1]->type();
      same_float(x, dy);
      ConvGeometry g = conv_geometry(name, attrs, {x.shape.begin() + 2, x.shape.end()},
                                     attrs.get_ints("kernel"));
      FJ_USER_CHECK(dy.rank() == 4 && dy.shape[0] == x.shape[0] && dy.shape[1] == g.groups &&
                        dy.shape[3] == g.out_size() && x.shape[1] % g.groups == 0,
                    kValue, name, ": gradient ", dy.str(), " does not match the input ", x.str());
      return {x.dtype, {g.groups, dy.shape[2], x.shape[1] / g.groups * g.kernel_size()}};
    }
    case OpKind::Window:
    case OpKind::Unwindow: {
      const TensorType& x = inputs[0]->type();
      const IntList& k = attrs.get_ints("window");
      size_t s = k.size();
      FJ_USER_CHECK(s >= 1 && s <= 3, kValue, name, ": 1 to 3 window dims expected, got ", s);
      (void)attrs.get_float("pad_value");
      if (op == OpKind::Window) {
        FJ_USER_CHECK(static_cast<size_t>(x.rank()) >= s, kValue, name, ": input ", x.str(),
                      " has fewer dims than the window (", s, ")");
        ConvGeometry g = conv_geometry(name, attrs, {x.shape.end() - s, x.shape.end()}, k);
        Shape out(x.shape.begin(), x.shape.end() - s);
        out.insert(out.end(), g.out.begin(), g.out.end());
        out.insert(out.end(), k.begin(), k.end());
        return {x.dtype, out};
      }
      ConvGeometry g = conv_geometry(name, attrs, attrs.get_ints("in_spatial"), k);
      FJ_USER_CHECK(static_cast<size_t>(x.rank()) >= 2 * s, kValue, name, ": input ", x.str(),
                    " has fewer dims than the window needs");
      Shape lead(x.shape.begin(), x.shape.end() - 2 * s);
      Shape expect = lead;
      expect.insert(expect.end(), g.out.begin(), g.out.end());
      expect.insert(expect.end(), k.begin(), k.end());
      FJ_USER_CHECK(x.shape == expect, kValue, name, ": input ", x.str(), " should be ",
                    shape_str(expect));
      Shape out = lead;
      out.insert(out.end(), g.in.begin(), g.in.end());
      out.insert(out.end(), k.begin(), k.end());
      return {x.dtype, out};
    }
    default:
      FJ_CHECK(false, "infer_conv_family: ", name);
  }
  return {};
}

}  // namespace flowjit::ir
