// IR text printer and parser.
#include "ir/printer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"

namespace flowjit::ir {

// ---------------------------------------------------------------- printing

namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

bool is_ident(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-'))
      return false;
  return true;
}

}  // namespace

std::string format_double(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  std::string s = buf;
  // Prefer the shortest form that reads back exactly.
  for (int prec = 1; prec < 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) {
      s = buf;
      break;
    }
  }
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string print_attr_value(const AttrValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) {
          return x ? "true" : "false";
        } else if constexpr (std::is_same_v<T, int64_t>) {
          return std::to_string(x);
        } else if constexpr (std::is_same_v<T, double>) {
          return format_double(x);
        } else if constexpr (std::is_same_v<T, std::string>) {
          return quote(x);
        } else if constexpr (std::is_same_v<T, IntList>) {
          return shape_str(x);
        } else {
          return std::string(dtype_short_name(x));
        }
      },
      v);
}

std::string print_attrs(const Attrs& a) {
  if (a.items().empty()) return "";
  std::string s = "{";
  bool first = true;
  for (auto& [k, v] : a.items()) {
    if (!first) s += ", ";
    first = false;
    s += k + "=" + print_attr_value(v);
  }
  return s + "}";
}

std::unordered_map<const Node*, std::string> value_names(const Graph& g) {
  std::unordered_map<const Node*, std::string> names;
  std::unordered_set<std::string> used;
  int counter = 0;
  for (const NodeRef& n : g.topo_order()) {
    std::string nm;
    if (n->op() == OpKind::Parameter) {
      std::string pn = n->attrs().get_str("name");
      if (is_ident(pn) && !used.count(pn)) nm = pn;
    }
    if (nm.empty()) nm = std::to_string(counter++);
    used.insert(nm);
    names[n.get()] = "%" + nm;
  }
  return names;
}

std::string print_graph(const Graph& g, PrintOptions opts) {
  std::ostringstream os;
  os << "graph " << (g.name.empty() ? "main" : g.name) << " {\n";
  std::unordered_map<const Node*, std::string> names = value_names(g);
  auto name_of = [&](const NodeRef& n) -> const std::string& { return names.at(n.get()); };
  for (const NodeRef& n : g.topo_order()) {
    os << "  " << names[n.get()] << " = " << op_name(n->op()) << "(";
    for (size_t i = 0; i < n->inputs().size(); ++i)
      os << (i ? ", " : "") << name_of(n->inputs()[i]);
    os << ")";
    std::string at = print_attrs(n->attrs());
    if (!at.empty()) os << " " << at;
    os << " : " << n->type().str();
    if (opts.locations && n->loc().known())
      os << "  @" << quote(n->loc().file) << ":" << n->loc().line;
    os << "\n";
  }
  os << "  return";
  for (size_t i = 0; i < g.outputs.size(); ++i) os << (i ? ", " : " ") << name_of(g.outputs[i]);
  os << "\n";
  if (!g.effects.empty()) {
    os << "  effects";
    for (size_t i = 0; i < g.effects.size(); ++i) os << (i ? ", " : " ") << name_of(g.effects[i]);
    os << "\n";
  }
  os << "}\n";
  return os.str();
}

// ---------------------------------------------------------------- parsing

namespace {

// The message of a failed FJ_CHECK without its "internal error at
// file:line: condition: " preamble (or the condition, when it has none).
std::string check_message(const std::string& what) {
  size_t at = what.find(" at ");
  if (at == std::string::npos) return what;
  size_t a = what.find(": ", at);
  size_t b = a == std::string::npos ? a : what.find(": ", a + 2);
  if (b == std::string::npos) return what;
  std::string msg = what.substr(b + 2);
  return msg.empty() ? what.substr(a + 2, b - a - 2) : msg;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Graph parse() {
    Graph g;
    expect_word("graph");
    g.name = ident();
    expect('{');
    while (true) {
      skip_ws();
      if (peek_word("return")) break;
      parse_node(g);
    }
    expect_word("return");
    skip_ws_inline();
    if (!at_eol()) {
      do g.outputs.push_back(ref());
      while (accept(','));
    }
    if (peek_word("effects")) {
      expect_word("effects");
      do g.effects.push_back(ref());
      while (accept(','));
    }
    expect('}');
    skip_ws();
    if (pos_ < s_.size()) fail("unexpected text after the graph");
    std::sort(g.params.begin(), g.params.end(), [](const NodeRef& a, const NodeRef& b) {
      return a->attrs().get_int("index", 0) < b->attrs().get_int("index", 0);
    });
    return g;
  }

 private:
  void parse_node(Graph& g) {
    std::string name = ref_name();
    expect('=');
    std::string opname = ident();
    auto op = op_from_name(opname);
    if (!op) fail("unknown op '" + opname + "'");
    expect('(');
    std::vector<NodeRef> ins;
    if (!accept(')')) {
      do ins.push_back(ref());
      while (accept(','));
      expect(')');
    }
    Attrs attrs;
    skip_ws();
    if (accept('{')) {
      if (!accept('}')) {
        do {
          std::string key = ident();
          expect('=');
          attrs.set(key, value());
        } while (accept(','));
        expect('}');
      }
    }
    expect(':');
    TensorType declared = tensor_type();
    SourceLoc loc;
    skip_ws_inline();
    if (accept('@')) {
      loc.file = string_lit();
      expect(':');
      loc.line = static_cast<int>(integer());
    }
    NodeRef n;
    try {
      n = make_node(*op, std::move(ins), std::move(attrs), loc);
    } catch (const UserError& e) {
      fail(std::string("invalid node: ") + e.what());
    } catch (const InternalError& e) {
      // The factories' invariant checks hold for nodes flowjit builds; text
      // can break them (an assign to a non-variable): the text's fault.
      fail(std::string("invalid node: ") + check_message(e.what()));
    }
    if (n->type() != declared)
      fail("declared type " + declared.str() + " but the op infers " + n->type().str());
    if (values_.count(name)) fail("value %" + name + " defined twice");
    values_[name] = n;
    if (n->op() == OpKind::Parameter) g.params.push_back(n);
  }

  TensorType tensor_type() {
    skip_ws();
    std::string dt;
    while (pos_ < s_.size() && std::isalnum(static_cast<unsigned char>(s_[pos_]))) dt += s_[pos_++];
    auto d = dtype_from_short_name(dt);
    if (!d) fail("unknown dtype '" + dt + "'");
    return {*d, int_list()};
  }

  AttrValue value() {
    skip_ws();
    char c = pos_ < s_.size() ? s_[pos_] : '\0';
    if (c == '"') return string_lit();
    if (c == '[') return int_list();
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+') return number();
    std::string w = ident();
    if (w == "true") return true;
    if (w == "false") return false;
    if (w == "inf") return HUGE_VAL;
    if (w == "nan") return std::nan("");
    if (auto d = dtype_from_short_name(w)) return *d;
    fail("bad attribute value '" + w + "'");
  }

  AttrValue number() {
    size_t start = pos_;
    // (Reading past the end here was a heap overflow the fuzzer found.)
    if (pos_ >= s_.size()) fail("expected a number, found the end of the text");
    if (s_[pos_] == '-' || s_[pos_] == '+') ++pos_;
    if (s_.substr(pos_, 3) == "inf") {
      pos_ += 3;
      return s_[start] == '-' ? -HUGE_VAL : HUGE_VAL;
    }
    bool is_float = false;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E' ||
                 ((c == '-' || c == '+') && (s_[pos_ - 1] == 'e' || s_[pos_ - 1] == 'E'))) {
        is_float = true;
        ++pos_;
      } else {
        break;
      }
    }
    std::string tok(s_.substr(start, pos_ - start));
    if (tok.find_first_of("0123456789") == std::string::npos) fail("expected a number");
    if (is_float) return std::strtod(tok.c_str(), nullptr);
    errno = 0;
    long long v = std::strtoll(tok.c_str(), nullptr, 10);
    if (errno == ERANGE) fail("integer " + tok + " does not fit in 64 bits");
    return static_cast<int64_t>(v);
  }

  int64_t integer() {
    skip_ws();
    AttrValue v = number();
    if (auto* i = std::get_if<int64_t>(&v)) return *i;
    fail("expected an integer");
  }

  IntList int_list() {
    expect('[');
    IntList out;
    if (accept(']')) return out;
    do out.push_back(integer());
    while (accept(','));
    expect(']');
    return out;
  }

  std::string string_lit() {
    skip_ws();
    if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string");
    ++pos_;
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      char c = s_[pos_++];
      if (c == '\\' && pos_ < s_.size()) {
        char e = s_[pos_++];
        out += e == 'n' ? '\n' : e;
      } else {
        out += c;
      }
    }
    if (pos_ >= s_.size()) fail("unterminated string");
    ++pos_;
    return out;
  }

  NodeRef ref() {
    std::string name = ref_name();
    auto it = values_.find(name);
    if (it == values_.end()) fail("use of undefined value %" + name);
    return it->second;
  }

  std::string ref_name() {
    expect('%');
    std::string out;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) ||
                                s_[pos_] == '_' || s_[pos_] == '.' || s_[pos_] == '-'))
      out += s_[pos_++];
    if (out.empty()) fail("expected a value name after %");
    return out;
  }

  std::string ident() {
    skip_ws();
    std::string out;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) ||
                                s_[pos_] == '_' || s_[pos_] == '.' || s_[pos_] == '-'))
      out += s_[pos_++];
    if (out.empty()) fail("expected a name");
    return out;
  }

  bool peek_word(std::string_view w) {
    skip_ws();
    return s_.substr(pos_, w.size()) == w;
  }
  void expect_word(std::string_view w) {
    if (!peek_word(w)) fail("expected '" + std::string(w) + "'");
    pos_ += w.size();
  }
  void skip_ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  void skip_ws_inline() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
  }
  bool at_eol() { return pos_ >= s_.size() || s_[pos_] == '\n'; }
  bool accept(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(std::string("expected '") + c + "'");
  }

  [[noreturn]] void fail(const std::string& msg) {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw_user(ErrorKind::Value, "IR parse error at line ", line, ", column ", col, ": ", msg);
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::unordered_map<std::string, NodeRef> values_;
};

}  // namespace

Graph parse_graph(std::string_view text) { return Parser(text).parse(); }

}  // namespace flowjit::ir
