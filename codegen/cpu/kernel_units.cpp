// Compile units of the CPU backend: structural keys, the process cache of
// compiled kernels, and the multi-object container.
#include "codegen/cpu/kernel_units.h"

#include <llvm/Support/SHA256.h>

#include <cstring>

#include "codegen/family.h"
#include "ir/error.h"

namespace flowjit::codegen::cpu {

namespace {

// Appends fixed-width little-endian fields; every variable-length field is
// preceded by its length, so different kernels never serialize alike.
class KeyWriter {
 public:
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) s_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    u64(bits);
  }
  void ints(const std::vector<int64_t>& v) {
    u64(v.size());
    for (int64_t x : v) i64(x);
  }
  void ints(const std::vector<int>& v) {
    u64(v.size());
    for (int x : v) i64(x);
  }
  void access(const Access& a) {
    i64(a.arg);
    ints(a.strides);
    i64(a.offset);
    u64(a.coords.size());
    for (const Coord& c : a.coords) {
      ints(c.coef);
      i64(c.c0);
      i64(c.div);
      i64(c.limit);
      i64(c.stride);
    }
    f64(a.pad);
    u64(a.indirect.size());
    for (const Indirect& x : a.indirect) {
      i64(x.node);
      i64(x.limit);
      i64(x.stride);
    }
    i64(a.ipad);
  }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

}  // namespace

std::string structural_key(const Kernel& k, bool with_seeds) {
  KeyWriter w;
  w.u64(with_seeds ? 0x666a6b31 : 0x666a6b53);  // "fjk1" / "fjkS" (seeded): the layout of this key
  w.i64(static_cast<int>(k.kind));
  w.ints(k.domain);
  w.u64(k.reduced.size());
  for (bool r : k.reduced) w.u64(r ? 1 : 0);
  w.u64(k.args.size());
  for (const KernelArg& a : k.args) {
    w.i64(static_cast<int>(a.dtype));
    w.i64(a.elements);
    w.u64((a.written ? 1 : 0) | (a.read ? 2 : 0));
  }
  w.u64(k.loads.size());
  for (const Access& a : k.loads) w.access(a);
  w.u64(k.nodes.size());
  for (const KNode& n : k.nodes) {
    w.i64(static_cast<int>(n.kind));
    w.i64(static_cast<int>(n.op));
    w.i64(static_cast<int>(n.dtype));
    w.ints(n.operands);
    w.i64(n.access);
    w.f64(n.value);
    w.i64(n.ivalue);
    w.ints(n.index_strides);
    w.i64(with_seeds || n.kind != KOp::Random ? n.seed : 0);
    w.u64(n.kept_space ? 1 : 0);
    w.i64(n.phase);
  }
  w.u64(k.stores.size());
  for (const Store& s : k.stores) {
    w.i64(s.node);
    w.access(s.where);
  }
  const MatMulSpec& mm = k.mm;
  w.access(mm.a);
  w.access(mm.b);
  w.i64(mm.m);
  w.i64(mm.n);
  w.i64(mm.k);
  w.i64(mm.batch);
  w.ints(mm.a_rows);
  w.ints(mm.a_cols);
  w.ints(mm.b_rows);
  w.ints(mm.b_cols);
  w.ints(mm.batch_digits);
  w.ints(k.reduce_order);
  if (k.kind == Kernel::Kind::Family) {  // appended: other kernels' keys are unchanged
    const std::string_view name = family_of(k).name;
    w.u64(name.size());
    for (char ch : name) w.u64(static_cast<unsigned char>(ch));
    w.ints(k.params);
  }
  return w.take();
}

std::string unit_symbol(const std::string& unit_key) {
  std::array<uint8_t, 32> h = llvm::SHA256::hash(
      llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t*>(unit_key.data()), unit_key.size()));
  static const char* hex = "0123456789abcdef";
  std::string s = "fjk_";
  for (int i = 0; i < 16; ++i) {
    s.push_back(hex[h[i] >> 4]);
    s.push_back(hex[h[i] & 15]);
  }
  return s;
}

// ---------------------------------------------------------------- cache

namespace {
constexpr size_t kUnitCacheBytes = size_t{256} << 20;
}

UnitCache& UnitCache::process() {
  static UnitCache* c = new UnitCache();  // leaked: used until the process ends
  return *c;
}

std::shared_ptr<const CompiledUnit> UnitCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = units_.find(key);
  return it == units_.end() ? nullptr : it->second;
}

void UnitCache::put(const std::string& key, std::shared_ptr<const CompiledUnit> unit) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t add = unit->bytes() + key.size();
  if (bytes_ + add > kUnitCacheBytes) {
    units_.clear();
    bytes_ = 0;
  }
  auto [it, inserted] = units_.emplace(key, nullptr);
  if (!inserted) bytes_ -= it->second->bytes() + key.size();
  it->second = std::move(unit);
  bytes_ += add;
}

void UnitCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  units_.clear();
  bytes_ = 0;
}

size_t UnitCache::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return units_.size();
}

// ---------------------------------------------------------------- container

namespace {

constexpr char kMagic[8] = {'F', 'J', 'K', 'O', 'B', 'J', 'S', '\0'};

void put_u32(std::vector<char>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::vector<char>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_str(std::vector<char>& out, const std::string& s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

class Reader {
 public:
  explicit Reader(const std::vector<char>& b) : b_(b) {}
  uint64_t uint(int bytes) {
    need(bytes);
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(b_[pos_ + i])) << (8 * i);
    pos_ += bytes;
    return v;
  }
  const char* take(uint64_t n) {
    need(n);
    const char* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }
  std::string str() {
    uint64_t n = uint(4);
    return std::string(take(n), n);
  }
  bool at_end() const { return pos_ == b_.size(); }

 private:
  void need(uint64_t n) {
    if (n > b_.size() - pos_)
      throw_user(ErrorKind::Runtime, "the compiled kernels' object container is truncated (",
                 b_.size(), " bytes)");
  }
  const std::vector<char>& b_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<char> pack_objects(const std::vector<const std::vector<char>*>& objects,
                               const std::vector<std::pair<std::string, std::string>>& aliases) {
  std::vector<char> out(kMagic, kMagic + sizeof kMagic);
  put_u32(out, kContainerVersion);
  put_u32(out, static_cast<uint32_t>(objects.size()));
  put_u32(out, static_cast<uint32_t>(aliases.size()));
  for (const std::vector<char>* o : objects) {
    put_u64(out, o->size());
    out.insert(out.end(), o->begin(), o->end());
  }
  for (const auto& [name, target] : aliases) {
    put_str(out, name);
    put_str(out, target);
  }
  return out;
}

bool is_container(const std::vector<char>& blob) {
  return blob.size() >= sizeof kMagic && std::memcmp(blob.data(), kMagic, sizeof kMagic) == 0;
}

UnpackedObjects unpack_objects(const std::vector<char>& blob) {
  FJ_CHECK(is_container(blob), "unpack_objects on a plain object");
  Reader r(blob);
  r.take(sizeof kMagic);
  uint64_t version = r.uint(4);
  if (version != kContainerVersion)
    throw_user(ErrorKind::Runtime, "the compiled kernels are in container version ", version,
               ", this flowjit reads version ", kContainerVersion);
  uint64_t n_objects = r.uint(4), n_aliases = r.uint(4);
  UnpackedObjects out;
  for (uint64_t i = 0; i < n_objects; ++i) {
    uint64_t n = r.uint(8);
    out.objects.emplace_back(r.take(n), n);
  }
  for (uint64_t i = 0; i < n_aliases; ++i) {
    std::string name = r.str();
    out.aliases[name] = r.str();
  }
  if (!r.at_end())
    throw_user(ErrorKind::Runtime, "the compiled kernels' object container has trailing bytes");
  return out;
}

}  // namespace flowjit::codegen::cpu
