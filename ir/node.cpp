// Attributes, the node factory and the convenience constructors.
#include "ir/node.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>

#include "ir/error.h"

namespace flowjit::ir {

// ---------------------------------------------------------------- Attrs

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
  for (auto& [k, v] : items) set(k, v);
}

Attrs& Attrs::set(const std::string& key, AttrValue v) {
  auto it = std::lower_bound(items_.begin(), items_.end(), key,
                             [](const auto& p, const std::string& k) { return p.first < k; });
  if (it != items_.end() && it->first == key) {
    it->second = std::move(v);
  } else {
    items_.insert(it, {key, std::move(v)});
  }
  return *this;
}

const AttrValue* Attrs::find(const std::string& key) const {
  auto it = std::lower_bound(items_.begin(), items_.end(), key,
                             [](const auto& p, const std::string& k) { return p.first < k; });
  if (it != items_.end() && it->first == key) return &it->second;
  return nullptr;
}

bool Attrs::has(const std::string& key) const { return find(key) != nullptr; }

namespace {
template <class T>
const T& get_as(const Attrs& a, const std::string& key, const char* what) {
  const AttrValue* v = a.find(key);
  FJ_CHECK(v != nullptr, "missing attribute '", key, "'");
  const T* p = std::get_if<T>(v);
  FJ_CHECK(p != nullptr, "attribute '", key, "' is not ", what);
  return *p;
}
}  // namespace

int64_t Attrs::get_int(const std::string& key) const {
  const AttrValue* v = find(key);
  FJ_CHECK(v != nullptr, "missing attribute '", key, "'");
  if (auto* b = std::get_if<bool>(v)) return *b;
  return get_as<int64_t>(*this, key, "an int");
}
int64_t Attrs::get_int(const std::string& key, int64_t dflt) const {
  return has(key) ? get_int(key) : dflt;
}
double Attrs::get_float(const std::string& key) const {
  const AttrValue* v = find(key);
  FJ_CHECK(v != nullptr, "missing attribute '", key, "'");
  if (auto* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  return get_as<double>(*this, key, "a float");
}
bool Attrs::get_bool(const std::string& key, bool dflt) const {
  const AttrValue* v = find(key);
  if (!v) return dflt;
  if (auto* i = std::get_if<int64_t>(v)) return *i != 0;
  return get_as<bool>(*this, key, "a bool");
}
const std::string& Attrs::get_str(const std::string& key) const {
  return get_as<std::string>(*this, key, "a string");
}
const IntList& Attrs::get_ints(const std::string& key) const {
  return get_as<IntList>(*this, key, "an int list");
}
DType Attrs::get_dtype(const std::string& key) const {
  return get_as<DType>(*this, key, "a dtype");
}

size_t Attrs::hash() const {
  size_t h = items_.size();
  auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (auto& [k, v] : items_) {
    mix(std::hash<std::string>()(k));
    mix(v.index());
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, IntList>) {
            for (int64_t e : x) mix(std::hash<int64_t>()(e));
          } else if constexpr (std::is_same_v<T, DType>) {
            mix(static_cast<size_t>(x));
          } else {
            mix(std::hash<T>()(x));
          }
        },
        v);
  }
  return h;
}

std::string SourceLoc::str() const {
  if (!known()) return "";
  return file + ":" + std::to_string(line);
}

bool Attrs::operator==(const Attrs& o) const {
  if (items_.size() != o.items_.size()) return false;
  for (size_t i = 0; i < items_.size(); ++i) {
    const auto& [k, v] = items_[i];
    const auto& [ok, ov] = o.items_[i];
    if (k != ok || v.index() != ov.index()) return false;
    if (const double* d = std::get_if<double>(&v)) {
      if (std::memcmp(d, &std::get<double>(ov), sizeof(double)) != 0) return false;
    } else if (!(v == ov)) {
      return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------- factory

namespace {
std::atomic<uint64_t> g_serial{1};
}

std::string check_attrs(OpKind op, const Attrs& attrs) {
  const auto& specs = op_attrs(op);
  auto takes = [&] {
    std::string s;
    for (const AttrSpec* a : specs) s += (s.empty() ? "" : ", ") + std::string(a->key);
    return s.empty() ? std::string("no attributes") : s;
  };
  for (const auto& [key, value] : attrs.items()) {
    const AttrSpec* spec = nullptr;
    for (const AttrSpec* a : specs)
      if (a->key == key) spec = a;
    if (spec == nullptr)
      return std::string(op_name(op)) + ": unknown attribute '" + key + "' (" +
             std::string(op_name(op)) + " takes " + takes() + ")";
    bool ok = false;
    switch (spec->kind) {
      case AttrKind::Bool:
        ok = std::holds_alternative<bool>(value);
        break;
      case AttrKind::Int:
        ok = std::holds_alternative<int64_t>(value);
        break;
      case AttrKind::Float:
        ok = std::holds_alternative<double>(value);
        break;
      case AttrKind::Number:
        ok = std::holds_alternative<int64_t>(value) || std::holds_alternative<double>(value);
        break;
      case AttrKind::Str:
        ok = std::holds_alternative<std::string>(value);
        break;
      case AttrKind::Ints:
        ok = std::holds_alternative<IntList>(value);
        break;
      case AttrKind::DType:
        ok = std::holds_alternative<DType>(value);
        break;
    }
    if (!ok)
      return std::string(op_name(op)) + ": attribute '" + key + "' must be " +
             std::string(attr_kind_name(spec->kind));
  }
  for (const AttrSpec* a : specs)
    if (a->required && !attrs.has(std::string(a->key)))
      return std::string(op_name(op)) + ": missing attribute '" + std::string(a->key) + "' (" +
             std::string(attr_kind_name(a->kind)) + ")";
  return "";
}

namespace {
thread_local int t_placement = -1;
}  // namespace

int current_placement() { return t_placement; }
void set_current_placement(int placement) { t_placement = placement; }

NodeRef make_node(OpKind op, std::vector<NodeRef> inputs, Attrs attrs, SourceLoc loc) {
  // An open placement (a scope while tracing, the op autodiff or a pass is
  // working on) wins over the location's: helpers copy an operand's location.
  if (t_placement >= 0) loc.placement = t_placement;
  if (std::string bad = check_attrs(op, attrs); !bad.empty()) throw_user(ErrorKind::Value, bad);
  int arity = op_arity(op);
  FJ_USER_CHECK(arity < 0 || static_cast<int>(inputs.size()) == arity, ErrorKind::Type, op_name(op),
                ": expected ", arity, " operand(s) but got ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    FJ_CHECK(inputs[i] != nullptr, op_name(op), ": operand ", i, " is null");
  TensorType t = infer_type(op, inputs, attrs);
  // Every kernel indexes with int64: a shape whose size overflows it would
  // make generated code fault, loop forever or compute zeros.
  std::string too_big = shape_size_problem(t.dtype, t.shape);
  FJ_USER_CHECK(
      too_big.empty(), ErrorKind::Value, op_name(op), ": the result ", t.str(),
      " is too large: ", too_big, inputs.empty() ? std::string() : " (operands: " + [&] {
        std::string o;
        for (size_t i = 0; i < inputs.size(); ++i) o += (i ? ", " : "") + inputs[i]->type().str();
        return o;
      }() + ")");
  auto* n = new Node();
  n->op_ = op;
  n->inputs_ = std::move(inputs);
  n->attrs_ = std::move(attrs);
  n->type_ = std::move(t);
  n->loc_ = std::move(loc);
  n->serial_ = g_serial.fetch_add(1, std::memory_order_relaxed);
  return NodeRef(n);
}

NodeRef Node::with_inputs(const NodeRef& self, std::vector<NodeRef> inputs) {
  if (inputs == self->inputs_) return self;
  return make_node(self->op_, std::move(inputs), self->attrs_, self->loc_);
}

// ---------------------------------------------------------------- helpers

NodeRef fill(double value, const Shape& shape, DType dtype, SourceLoc loc) {
  return make_node(OpKind::Fill, {}, Attrs{{"value", value}, {"shape", shape}, {"dtype", dtype}},
                   std::move(loc));
}

NodeRef scalar_like(double value, const NodeRef& like) {
  return fill(value, {}, like->dtype(), like->loc());
}

NodeRef unary(OpKind op, const NodeRef& x, SourceLoc loc) {
  return make_node(op, {x}, {}, loc.known() ? loc : x->loc());
}

NodeRef binary(OpKind op, const NodeRef& a, const NodeRef& b, SourceLoc loc) {
  return make_node(op, {a, b}, {}, loc.known() ? loc : a->loc());
}

NodeRef reshape(const NodeRef& x, const Shape& shape) {
  if (x->shape() == shape) return x;
  return make_node(OpKind::Reshape, {x}, Attrs{{"shape", shape}}, x->loc());
}

NodeRef transpose(const NodeRef& x, const IntList& perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == static_cast<int64_t>(i);
  if (identity) return x;
  return make_node(OpKind::Transpose, {x}, Attrs{{"perm", perm}}, x->loc());
}

NodeRef broadcast(const NodeRef& x, const Shape& shape) {
  if (x->shape() == shape) return x;
  return make_node(OpKind::Broadcast, {x}, Attrs{{"shape", shape}}, x->loc());
}

NodeRef reduce(OpKind op, const NodeRef& x, const IntList& axes, bool keepdims) {
  return make_node(op, {x}, Attrs{{"axes", axes}, {"keepdims", keepdims}}, x->loc());
}

NodeRef cast(const NodeRef& x, DType dtype) {
  if (x->dtype() == dtype) return x;
  return make_node(OpKind::Cast, {x}, Attrs{{"dtype", dtype}}, x->loc());
}

NodeRef where(const NodeRef& c, const NodeRef& a, const NodeRef& b) {
  return make_node(OpKind::Where, {c, a, b}, {}, a->loc());
}

NodeRef matmul(const NodeRef& a, const NodeRef& b, bool ta, bool tb) {
  return make_node(OpKind::MatMul, {a, b}, Attrs{{"transpose_a", ta}, {"transpose_b", tb}},
                   a->loc());
}

NodeRef sum_to_shape(const NodeRef& x, const Shape& shape) {
  if (x->shape() == shape) return x;
  const Shape& xs = x->shape();
  FJ_CHECK(broadcasts_to(shape, xs), "sum_to_shape: ", shape_str(shape), " does not broadcast to ",
           shape_str(xs));
  size_t off = xs.size() - shape.size();
  IntList axes;
  for (size_t i = 0; i < xs.size(); ++i)
    if (i < off || (shape[i - off] == 1 && xs[i] != 1)) axes.push_back(static_cast<int64_t>(i));
  NodeRef r = axes.empty() ? x : reduce(OpKind::ReduceSum, x, axes, /*keepdims=*/true);
  return reshape(r, shape);
}

bool is_fill(const NodeRef& n, double value) {
  return n->op() == OpKind::Fill && n->attrs().get_float("value") == value;
}

}  // namespace flowjit::ir
