// Numeric tests of codegen/mathlib: accuracy against libm references with
// the measured maxima printed, special values, scalar/vector bit identity, the
// absence of libm calls after vectorization, and the Philox random generators.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InstIterator.h>
#include <llvm/IR/IntrinsicInst.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Target/TargetMachine.h>

#include "codegen/mathlib.h"
#include "ir/error.h"

namespace {

namespace fc = flowjit::codegen;
using llvm::IRBuilderBase;
using llvm::Value;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ------------------------------------------------------------------ kernels

enum class Elem { F32, F64, I64 };

llvm::Type* scalar_type(llvm::LLVMContext& ctx, Elem e) {
  switch (e) {
    case Elem::F32:
      return llvm::Type::getFloatTy(ctx);
    case Elem::F64:
      return llvm::Type::getDoubleTy(ctx);
    case Elem::I64:
      return llvm::Type::getInt64Ty(ctx);
  }
  return nullptr;
}

llvm::Type* lane_type(llvm::LLVMContext& ctx, Elem e, unsigned width) {
  llvm::Type* s = scalar_type(ctx, e);
  return width == 1 ? s : llvm::FixedVectorType::get(s, width);
}

llvm::Align elem_align(Elem e) { return llvm::Align(e == Elem::F32 ? 4 : 8); }

// One loop step: the result for the loaded inputs; `out` is the result type.
using Body = std::function<Value*(IRBuilderBase&, llvm::ArrayRef<Value*> in, llvm::Type* out)>;

// Builds `void name(const In0* in0, ..., Out* out, int64_t n)` computing
// out[i..i+width) = body(in0[i..i+width), ...) for i = 0, width, ... < n; n must
// be a multiple of width. width 1 uses scalar types.
std::unique_ptr<llvm::Module> build_kernel(llvm::LLVMContext& ctx, const std::string& name,
                                           const std::vector<Elem>& ins, Elem out, unsigned width,
                                           const Body& body) {
  auto m = std::make_unique<llvm::Module>(name, ctx);
  llvm::IRBuilder<> b(ctx);
  std::vector<llvm::Type*> params(ins.size() + 1, b.getPtrTy());
  params.push_back(b.getInt64Ty());
  auto* fn = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), params, false),
                                    llvm::Function::ExternalLinkage, name, m.get());
  for (size_t k = 0; k <= ins.size(); ++k) fn->addParamAttr(k, llvm::Attribute::NoAlias);
  auto* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
  auto* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
  auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
  Value* n = fn->getArg(ins.size() + 1);
  b.SetInsertPoint(entry);
  b.CreateCondBr(b.CreateICmpSGT(n, b.getInt64(0)), loop, exit);

  b.SetInsertPoint(loop);
  llvm::PHINode* i = b.CreatePHI(b.getInt64Ty(), 2);
  i->addIncoming(b.getInt64(0), entry);
  std::vector<Value*> vals;
  for (size_t k = 0; k < ins.size(); ++k) {
    llvm::Type* s = scalar_type(ctx, ins[k]);
    Value* p = b.CreateGEP(s, fn->getArg(k), i);
    vals.push_back(b.CreateAlignedLoad(lane_type(ctx, ins[k], width), p, elem_align(ins[k])));
  }
  Value* r = body(b, vals, lane_type(ctx, out, width));
  b.CreateAlignedStore(r, b.CreateGEP(scalar_type(ctx, out), fn->getArg(ins.size()), i),
                       elem_align(out));
  Value* next = b.CreateAdd(i, b.getInt64(width));
  i->addIncoming(next, loop);
  b.CreateCondBr(b.CreateICmpSLT(next, n), loop, exit);
  b.SetInsertPoint(exit);
  b.CreateRetVoid();
  return m;
}

class Jit {
 public:
  static Jit& get() {
    static Jit jit;
    return jit;
  }

  void* compile(const std::vector<Elem>& ins, Elem out, unsigned width, const Body& body) {
    auto ctx = std::make_unique<llvm::LLVMContext>();
    std::string name = "kernel" + std::to_string(count_++);
    auto m = build_kernel(*ctx, name, ins, out, width, body);
    m->setDataLayout(jit_->getDataLayout());
    EXPECT_FALSE(llvm::verifyModule(*m, &llvm::errs()));
    check(jit_->addIRModule(llvm::orc::ThreadSafeModule(std::move(m), std::move(ctx))));
    auto addr = jit_->lookup(name);
    check(addr.takeError());
    return addr->toPtr<void*>();
  }

  std::unique_ptr<llvm::TargetMachine> target_machine() {
    auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
    check(jtmb.takeError());
    auto tm = jtmb->createTargetMachine();
    check(tm.takeError());
    return std::move(*tm);
  }

 private:
  Jit() {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
    check(jtmb.takeError());
    auto jit = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(*jtmb)).create();
    check(jit.takeError());
    jit_ = std::move(*jit);
  }

  static void check(llvm::Error e) {
    if (e) {
      ADD_FAILURE() << llvm::toString(std::move(e));
      std::abort();
    }
  }

  std::unique_ptr<llvm::orc::LLJIT> jit_;
  int count_ = 0;
};

using Unary = Value* (*)(IRBuilderBase&, Value*);
using Random = Value* (*)(IRBuilderBase&, Value*, uint64_t, llvm::Type*);

template <class T>
constexpr Elem elem_of() {
  return std::is_same_v<T, float> ? Elem::F32 : Elem::F64;
}

template <class T>
constexpr unsigned vector_width() {
  return std::is_same_v<T, float> ? 16 : 8;
}

// Runs a kernel over `in`, padded to a multiple of 48 elements (any width up to
// 16 that divides 48 works).
template <class T>
std::vector<T> run_unary(Unary f, const std::vector<T>& in, unsigned width) {
  static std::map<std::tuple<Unary, Elem, unsigned>, void*> cache;
  void*& fn = cache[{f, elem_of<T>(), width}];
  if (!fn) {
    fn = Jit::get().compile(
        {elem_of<T>()}, elem_of<T>(), width,
        [f](IRBuilderBase& b, llvm::ArrayRef<Value*> v, llvm::Type*) { return f(b, v[0]); });
  }
  std::vector<T> x(in), y((in.size() + 47) / 48 * 48);
  x.resize(y.size(), T(0.5));
  reinterpret_cast<void (*)(const T*, T*, int64_t)>(fn)(x.data(), y.data(), y.size());
  y.resize(in.size());
  return y;
}

template <class T>
std::vector<T> run_pow(const std::vector<T>& xs, const std::vector<T>& ys, unsigned width) {
  static std::map<std::pair<Elem, unsigned>, void*> cache;
  void*& fn = cache[{elem_of<T>(), width}];
  if (!fn) {
    fn = Jit::get().compile({elem_of<T>(), elem_of<T>()}, elem_of<T>(), width,
                            [](IRBuilderBase& b, llvm::ArrayRef<Value*> v, llvm::Type*) {
                              return fc::emit_pow(b, v[0], v[1]);
                            });
  }
  size_t n = (xs.size() + 15) / 16 * 16;
  std::vector<T> x(xs), y(ys), out(n);
  x.resize(n, T(1));
  y.resize(n, T(1));
  reinterpret_cast<void (*)(const T*, const T*, T*, int64_t)>(fn)(x.data(), y.data(), out.data(),
                                                                  n);
  out.resize(xs.size());
  return out;
}

template <class T>
std::vector<T> run_random(Random f, uint64_t seed, const std::vector<int64_t>& counters,
                          unsigned width) {
  static std::map<std::tuple<Random, uint64_t, Elem, unsigned>, void*> cache;
  void*& fn = cache[{f, seed, elem_of<T>(), width}];
  if (!fn) {
    fn = Jit::get().compile({Elem::I64}, elem_of<T>(), width,
                            [f, seed](IRBuilderBase& b, llvm::ArrayRef<Value*> v, llvm::Type* out) {
                              return f(b, v[0], seed, out);
                            });
  }
  std::vector<T> out(counters.size());
  EXPECT_EQ(counters.size() % 16, 0u);
  reinterpret_cast<void (*)(const int64_t*, T*, int64_t)>(fn)(counters.data(), out.data(),
                                                              counters.size());
  return out;
}

// ------------------------------------------------------------------ error measures

template <class T>
bool same_bits_or_both_nan(T a, T b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
void expect_identical(const std::vector<T>& a, const std::vector<T>& b, const std::vector<T>& in,
                      const char* what) {
  size_t bad = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    if (!same_bits_or_both_nan(a[k], b[k]) && bad++ < 3)
      ADD_FAILURE() << what << ": vector and scalar differ at x = " << in[k] << ": " << a[k]
                    << " vs " << b[k];
  }
  EXPECT_EQ(bad, 0u) << what;
}

// Position of a float on the number line in ulps (+0 and -0 coincide).
int64_t ulp_key(float v) {
  int32_t i;
  std::memcpy(&i, &v, 4);
  return i >= 0 ? int64_t{i} : -int64_t{i & 0x7fffffff};
}

// |got - ref| in ulps of float at ref (subnormal spacing below FLT_MIN).
double frac_ulps_f32(float got, double ref) {
  int e = ref == 0 ? -126 : std::max(std::ilogb(ref), -126);
  return std::fabs(got - ref) / std::ldexp(1.0, e - 23);
}

double frac_ulps_f64(double got, long double ref) {
  int e = ref == 0 ? -1022 : std::max(std::ilogb(ref), -1022);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - ref) /
                             std::ldexp(1.0L, e - 52));
}

struct ErrorStats {
  double max_ulps = 0;   // vs the exact reference, fractional
  int64_t max_dist = 0;  // float only: integer distance from the rounded reference
  double worst_x = 0;
  size_t mismatched_specials = 0;
};

// Float results against a double reference rounded to float.
ErrorStats measure_f32(const std::vector<float>& xs, const std::vector<float>& got,
                       const std::function<double(double)>& ref) {
  ErrorStats s;
  for (size_t k = 0; k < xs.size(); ++k) {
    double r = ref(xs[k]);
    float rf = static_cast<float>(r);
    if (!std::isfinite(rf) || !std::isfinite(got[k])) {
      if (!same_bits_or_both_nan(rf, got[k]) && s.mismatched_specials++ < 3)
        ADD_FAILURE() << "x = " << xs[k] << ": got " << got[k] << ", want " << rf;
      continue;
    }
    int64_t d = std::llabs(ulp_key(got[k]) - ulp_key(rf));
    double u = frac_ulps_f32(got[k], r);
    if (d > s.max_dist) s.max_dist = d, s.worst_x = xs[k];
    s.max_ulps = std::max(s.max_ulps, u);
  }
  return s;
}

ErrorStats measure_f64(const std::vector<double>& xs, const std::vector<double>& got,
                       const std::function<long double(long double)>& ref) {
  ErrorStats s;
  for (size_t k = 0; k < xs.size(); ++k) {
    long double r = ref(xs[k]);
    double rd = static_cast<double>(r);
    if (!std::isfinite(rd) || !std::isfinite(got[k])) {
      if (!same_bits_or_both_nan(rd, got[k]) && s.mismatched_specials++ < 3)
        ADD_FAILURE() << "x = " << xs[k] << ": got " << got[k] << ", want " << rd;
      continue;
    }
    double u = frac_ulps_f64(got[k], r);
    if (u > s.max_ulps) s.max_ulps = u, s.worst_x = xs[k];
  }
  return s;
}

// ------------------------------------------------------------------ inputs

// Uniform samples in [lo, hi] plus every stride-th float bit pattern inside it
// (which covers all binades, tiny and subnormal values included).
std::vector<float> sample_f32(float lo, float hi, size_t n, uint32_t seed, uint64_t stride = 4099) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> xs;
  for (size_t k = 0; k < n; ++k) xs.push_back(u(rng));
  for (uint64_t bits = seed % stride; bits < (1ULL << 32); bits += stride) {
    uint32_t b32 = static_cast<uint32_t>(bits);
    float v;
    std::memcpy(&v, &b32, 4);
    if (v >= lo && v <= hi) xs.push_back(v);
  }
  return xs;
}

std::vector<double> sample_f64(double lo, double hi, size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> xs;
  for (size_t k = 0; k < n; ++k) xs.push_back(u(rng));
  for (size_t k = 0; k < n; ++k) {
    uint64_t bits = rng();
    double v;
    std::memcpy(&v, &bits, 8);
    if (v >= lo && v <= hi) xs.push_back(v);
  }
  return xs;
}

// ------------------------------------------------------------------ unary accuracy

struct UnaryCase {
  const char* name;
  Unary emit;
  double lo, hi;                                  // sampled range, float
  double lo64, hi64;                              // sampled range, double
  std::function<double(double)> ref32;            // evaluated in double
  std::function<long double(long double)> ref64;  // evaluated in long double
  double max_ulps32, max_ulps64;
};

long double sigmoid_ref(long double x) { return 1.0L / (1.0L + std::exp(-x)); }

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"exp", fc::emit_exp, -87, 88, -708, 709, [](double x) { return std::exp(x); },
       [](long double x) { return std::exp(x); }, 1, 4},
      {"log", fc::emit_log, 0, 3.4e38, 0, 1.7e308, [](double x) { return std::log(x); },
       [](long double x) { return std::log(x); }, 2, 4},
      {"sin", fc::emit_sin, -8192, 8192, -1e5, 1e5, [](double x) { return std::sin(x); },
       [](long double x) { return std::sin(x); }, 2, 4},
      {"cos", fc::emit_cos, -8192, 8192, -1e5, 1e5, [](double x) { return std::cos(x); },
       [](long double x) { return std::cos(x); }, 2, 4},
      {"tanh", fc::emit_tanh, -20, 20, -40, 40, [](double x) { return std::tanh(x); },
       [](long double x) { return std::tanh(x); }, 2, 4},
      {"sigmoid", fc::emit_sigmoid, -100, 100, -700, 700,
       [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, sigmoid_ref, 2, 4},
      // erfc over its tail down to the float subnormals (10.05) and to near the
      // double underflow (26.5, erfc ~ 1e-307), where it has to keep relative
      // accuracy; erf to where it is +-1 in double.
      {"erf", fc::emit_erf, -10, 10, -7, 7, [](double x) { return std::erf(x); },
       [](long double x) { return std::erf(x); }, 1, 4},
      {"erfc", fc::emit_erfc, -10, 10.05, -6, 26.5, [](double x) { return std::erfc(x); },
       [](long double x) { return std::erfc(x); }, 1, 8},
  };
  return cases;
}

class UnaryAccuracy : public ::testing::TestWithParam<UnaryCase> {};

TEST_P(UnaryAccuracy, Float32) {
  const UnaryCase& c = GetParam();
  std::vector<float> xs = sample_f32(c.lo, c.hi, 1 << 19, 1);
  if (c.lo == 0) xs.push_back(1.0f);
  auto vec = run_unary<float>(c.emit, xs, 16);
  expect_identical(vec, run_unary<float>(c.emit, xs, 1), xs, c.name);
  ErrorStats s = measure_f32(xs, vec, c.ref32);
  std::printf(
      "[ measured ] %-7s f32: max %.3f ulp vs exact, %lld ulp vs rounded (at x = %.9g), "
      "%zu inputs in [%g, %g]\n",
      c.name, s.max_ulps, static_cast<long long>(s.max_dist), s.worst_x, xs.size(), c.lo, c.hi);
  EXPECT_LE(s.max_dist, c.max_ulps32) << c.name << " worst at x = " << s.worst_x;
  EXPECT_EQ(s.mismatched_specials, 0u);
}

TEST_P(UnaryAccuracy, Float64) {
  const UnaryCase& c = GetParam();
  std::vector<double> xs = sample_f64(c.lo64, c.hi64, 1 << 17, 2);
  if (c.lo64 == 0) {  // log: add subnormals and values next to 1
    for (int k = 0; k < 4096; ++k) xs.push_back(std::ldexp(1.0 + k / 4096.0, -1074 + k % 52));
    for (int k = 1; k < 4096; ++k) xs.push_back(1.0 + (k - 2048) * 1e-9);
  } else if (c.lo64 < 0) {  // odd and saturating functions: tiny values
    for (int k = 0; k < 4096; ++k) xs.push_back(std::ldexp((k & 1) ? -1.0 : 1.0, -k % 1000));
  }
  auto vec = run_unary<double>(c.emit, xs, 8);
  expect_identical(vec, run_unary<double>(c.emit, xs, 1), xs, c.name);
  ErrorStats s = measure_f64(xs, vec, c.ref64);
  std::printf(
      "[ measured ] %-7s f64: max %.3f ulp vs long double (at x = %.17g), %zu inputs in "
      "[%g, %g]\n",
      c.name, s.max_ulps, s.worst_x, xs.size(), c.lo64, c.hi64);
  EXPECT_LE(s.max_ulps, c.max_ulps64) << c.name << " worst at x = " << s.worst_x;
  EXPECT_EQ(s.mismatched_specials, 0u);
}

INSTANTIATE_TEST_SUITE_P(MathLib, UnaryAccuracy, ::testing::ValuesIn(unary_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// Odd vector widths take the same code path lane by lane.
TEST(MathLib, OddVectorWidthMatchesScalar) {
  std::vector<float> xs = sample_f32(-30, 30, 1 << 12, 3);
  for (const UnaryCase& c : unary_cases()) {
    expect_identical(run_unary<float>(c.emit, xs, 1), run_unary<float>(c.emit, xs, 3), xs, c.name);
  }
}

// ------------------------------------------------------------------ special values

template <class T>
void expect_specials(const char* name, Unary f, const std::vector<std::pair<double, double>>& io) {
  std::vector<T> xs;
  for (auto& [x, y] : io) xs.push_back(static_cast<T>(x));
  for (unsigned width : {1u, vector_width<T>()}) {
    std::vector<T> got = run_unary<T>(f, xs, width);
    for (size_t k = 0; k < io.size(); ++k) {
      T want = static_cast<T>(io[k].second);
      EXPECT_TRUE(same_bits_or_both_nan(got[k], want))
          << name << (sizeof(T) == 4 ? " f32" : " f64") << " width " << width << ": f(" << xs[k]
          << ") = " << got[k] << ", want " << want;
    }
  }
}

template <class T>
void expect_all_specials() {
  const bool f32 = std::is_same_v<T, float>;
  expect_specials<T>("exp", fc::emit_exp,
                     {{kNaN, kNaN},
                      {kInf, kInf},
                      {-kInf, 0},
                      {0, 1},
                      {-0.0, 1},
                      {f32 ? 89 : 710, kInf},
                      {f32 ? 88.7229 : 709.79, kInf},  // just above ln(max finite)
                      {f32 ? -104 : -746, 0},
                      {1e30, kInf},
                      {-1e30, 0}});
  expect_specials<T>(
      "log", fc::emit_log,
      {{kNaN, kNaN}, {0, -kInf}, {-0.0, -kInf}, {-1, kNaN}, {-kInf, kNaN}, {kInf, kInf}, {1, 0}});
  expect_specials<T>("tanh", fc::emit_tanh,
                     {{kNaN, kNaN},
                      {kInf, 1},
                      {-kInf, -1},
                      {0, 0},
                      {-0.0, -0.0},
                      {1e6, 1},
                      {-1e6, -1},
                      {20, 1},
                      {-20, -1},
                      {1e-30, 1e-30},
                      {-1e-30, -1e-30},
                      {1e-40, 1e-40},
                      {-1e-40, -1e-40}});
  expect_specials<T>("sigmoid", fc::emit_sigmoid,
                     {{kNaN, kNaN}, {kInf, 1}, {-kInf, 0}, {0, 0.5}, {1e6, 1}, {-1e6, 0}});
  expect_specials<T>("sin", fc::emit_sin,
                     {{kNaN, kNaN}, {kInf, kNaN}, {-kInf, kNaN}, {0, 0}, {-0.0, -0.0}});
  expect_specials<T>("cos", fc::emit_cos, {{kNaN, kNaN}, {kInf, kNaN}, {-kInf, kNaN}, {0, 1}});
  expect_specials<T>(
      "erf", fc::emit_erf,
      {{kNaN, kNaN}, {kInf, 1}, {-kInf, -1}, {0, 0}, {-0.0, -0.0}, {1e30, 1}, {-1e30, -1}});
  expect_specials<T>("erfc", fc::emit_erfc,
                     {{kNaN, kNaN},
                      {kInf, 0},
                      {-kInf, 2},
                      {0, 1},
                      {-0.0, 1},
                      {1e30, 0},
                      {-1e30, 2},
                      {f32 ? 10.1 : 27.3, 0}});
  expect_specials<T>("erfinv", fc::emit_erfinv,
                     {{kNaN, kNaN},
                      {1, kInf},
                      {-1, -kInf},
                      {1.5, kNaN},
                      {-2, kNaN},
                      {kInf, kNaN},
                      {0, 0},
                      {-0.0, -0.0}});
}

TEST(MathLib, SpecialValuesFloat32) { expect_all_specials<float>(); }
TEST(MathLib, SpecialValuesFloat64) { expect_all_specials<double>(); }

// float exp where the result is subnormal (gradual underflow, rounded once) or
// within a factor 1.5 of overflow: as accurate as in the normal range.
TEST(MathLib, ExpFloat32Tails) {
  std::vector<float> xs = sample_f32(-104, -87, 1 << 16, 5, 37);
  for (float x : sample_f32(88.3f, 88.7228f, 1 << 14, 6, 37)) xs.push_back(x);
  auto vec = run_unary<float>(fc::emit_exp, xs, 16);
  expect_identical(vec, run_unary<float>(fc::emit_exp, xs, 1), xs, "exp");
  ErrorStats s = measure_f32(xs, vec, [](double x) { return std::exp(x); });
  std::printf(
      "[ measured ] exp     f32 tails: max %.3f ulp vs exact, %lld ulp vs rounded (at x = "
      "%.9g), %zu inputs in [-104, -87] and [88.3, 88.7228]\n",
      s.max_ulps, static_cast<long long>(s.max_dist), s.worst_x, xs.size());
  EXPECT_LE(s.max_dist, 1) << "worst at x = " << s.worst_x;
  EXPECT_EQ(s.mismatched_specials, 0u);
}

// ------------------------------------------------------------------ erfinv

// erfinv by Newton's method in long double, from Winitzki's approximation; for
// |y| > 0.5 the residual is formed with erfc so that 1 - |y| stays exact.
long double erfinv_ref(long double y) {
  if (y == 0) return y;
  long double a = std::fabs(y), l = std::log((1 - a) * (1 + a));
  long double t = 2 / (3.14159265358979323846L * 0.147L) + l / 2;
  long double x = std::sqrt(std::sqrt(t * t - l / 0.147L) - t);
  for (int it = 0; it < 10; ++it) {
    long double f = a <= 0.5L ? std::erf(x) - a : (1 - a) - std::erfc(x);
    long double step = f / (1.1283791670955125738961589L * std::exp(-x * x));
    x -= step;
    if (std::fabs(step) < 1e-21L * x) break;
  }
  return std::copysign(x, y);
}

template <class T>
double erfinv_max_rel(const std::vector<T>& xs, T* worst) {
  std::vector<T> got = run_unary<T>(fc::emit_erfinv, xs, vector_width<T>());
  expect_identical(got, run_unary<T>(fc::emit_erfinv, xs, 1), xs, "erfinv");
  double max_rel = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    long double r = erfinv_ref(xs[k]);
    double rel = r == 0 ? std::fabs(got[k]) : static_cast<double>(std::fabs((got[k] - r) / r));
    if (rel > max_rel) max_rel = rel, *worst = xs[k];
  }
  return max_rel;
}

TEST(MathLib, ErfinvFloat32) {
  // Results below FLT_MIN cannot keep relative accuracy; stay above them.
  std::vector<float> xs = sample_f32(-0.999f, 0.999f, 1 << 16, 4, 4099 * 16);
  xs.erase(std::remove_if(xs.begin(), xs.end(), [](float v) { return std::fabs(v) < 1e-37f; }),
           xs.end());
  float worst = 0;
  double rel = erfinv_max_rel(xs, &worst);
  std::printf(
      "[ measured ] erfinv  f32: max relative error %.3g (at x = %.9g), %zu inputs in "
      "(-0.999, 0.999)\n",
      rel, worst, xs.size());
  EXPECT_LE(rel, 1e-6) << "worst at x = " << worst;
}

TEST(MathLib, ErfinvFloat64) {
  std::vector<double> xs = sample_f64(-1, 1, 1 << 15, 5);
  for (int k = 1; k <= 52; ++k) xs.push_back(1 - std::ldexp(1.0, -k));
  for (int k = 1; k <= 52; ++k) xs.push_back(-1 + std::ldexp(1.5, -k));
  for (int k = 1; k <= 400; ++k) xs.push_back(std::ldexp(1.0, -k));
  xs.erase(std::remove_if(xs.begin(), xs.end(),
                          [](double v) { return std::fabs(v) >= 1 || std::fabs(v) < 1e-300; }),
           xs.end());
  double worst = 0;
  double rel = erfinv_max_rel(xs, &worst);
  std::printf(
      "[ measured ] erfinv  f64: max relative error %.3g (at x = %.17g), %zu inputs in "
      "(-1, 1)\n",
      rel, worst, xs.size());
  EXPECT_LE(rel, 1e-14) << "worst at x = " << worst;
}

// ------------------------------------------------------------------ pow

TEST(MathLib, PowFloat32) {
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> le(std::log(1e-4f), std::log(1e4f)), uy(-10, 10);
  std::uniform_int_distribution<int> iy(-40, 40);
  std::vector<float> xs, ys;
  for (int k = 0; k < (1 << 18); ++k) {
    xs.push_back(std::exp(le(rng)));
    ys.push_back(uy(rng));
  }
  for (int k = 0; k < (1 << 14); ++k) {  // negative x, integral y
    xs.push_back(-std::exp(le(rng) / 4));
    ys.push_back(static_cast<float>(iy(rng)));
  }
  auto got = run_pow<float>(xs, ys, 16);
  expect_identical(got, run_pow<float>(xs, ys, 1), xs, "pow");
  int64_t max_dist = 0;
  double max_ulps = 0;
  size_t worst = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    double r = std::pow(static_cast<double>(xs[k]), static_cast<double>(ys[k]));
    float rf = static_cast<float>(r);
    if (!std::isfinite(rf)) {
      EXPECT_EQ(got[k], rf) << "pow(" << xs[k] << ", " << ys[k] << ")";
      continue;
    }
    int64_t d = std::llabs(ulp_key(got[k]) - ulp_key(rf));
    if (d > max_dist) max_dist = d, worst = k;
    max_ulps = std::max(max_ulps, frac_ulps_f32(got[k], r));
  }
  std::printf(
      "[ measured ] pow     f32: max %.3f ulp vs exact, %lld ulp vs rounded (at %.9g^%.9g)"
      ", %zu inputs\n",
      max_ulps, static_cast<long long>(max_dist), xs[worst], ys[worst], xs.size());
  EXPECT_LE(max_dist, 2) << "worst at pow(" << xs[worst] << ", " << ys[worst] << ")";
}

TEST(MathLib, PowFloat64) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> le(std::log(1e-3), std::log(1e3)), uy(-10, 10);
  std::vector<double> xs, ys;
  for (int k = 0; k < (1 << 17); ++k) {
    xs.push_back(std::exp(le(rng)));
    ys.push_back(uy(rng));
  }
  auto got = run_pow<double>(xs, ys, 8);
  expect_identical(got, run_pow<double>(xs, ys, 1), xs, "pow");
  double max_rel = 0, max_ulps = 0;
  size_t worst = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    long double r = std::pow(static_cast<long double>(xs[k]), static_cast<long double>(ys[k]));
    double rel = static_cast<double>(std::fabs((got[k] - r) / r));
    if (rel > max_rel) max_rel = rel, worst = k;
    max_ulps = std::max(max_ulps, frac_ulps_f64(got[k], r));
  }
  std::printf(
      "[ measured ] pow     f64: max relative error %.3g = %.2f ulp (at %.17g^%.17g), "
      "x in [1e-3, 1e3], y in [-10, 10]\n",
      max_rel, max_ulps, xs[worst], ys[worst]);
  EXPECT_LE(max_rel, 1e-13) << "worst at pow(" << xs[worst] << ", " << ys[worst] << ")";
}

// Every combination of special and ordinary operands against std::pow.
template <class T>
void expect_pow_specials() {
  const std::vector<double> vals = {0,   -0.0, 1,    -1,    2,    -2,   0.5,   -0.5,  3, -3,
                                    2.5, -2.5, kInf, -kInf, kNaN, 1e10, -1e10, 1e-10, 7, -7};
  std::vector<T> xs, ys;
  for (double x : vals)
    for (double y : vals) xs.push_back(static_cast<T>(x)), ys.push_back(static_cast<T>(y));
  for (unsigned width : {1u, vector_width<T>()}) {
    std::vector<T> got = run_pow<T>(xs, ys, width);
    for (size_t k = 0; k < xs.size(); ++k) {
      T want = std::pow(xs[k], ys[k]);
      bool ok = same_bits_or_both_nan(got[k], want);
      if (!ok && std::isfinite(want) && want != 0)  // rounding of the regular path
        ok = std::fabs((got[k] - want) / want) <= (std::is_same_v<T, float> ? 1.2e-7 : 1e-13);
      EXPECT_TRUE(ok) << "width " << width << ": pow(" << xs[k] << ", " << ys[k] << ") = " << got[k]
                      << ", want " << want;
    }
  }
}

TEST(MathLib, PowSpecialCasesFloat32) { expect_pow_specials<float>(); }
TEST(MathLib, PowSpecialCasesFloat64) { expect_pow_specials<double>(); }

// ------------------------------------------------------------------ Philox random numbers

// Reference Philox-4x32-10 on a full 4-word counter block.
std::array<uint32_t, 4> philox_ref(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t{0xD2511F53u} * c[0], p1 = uint64_t{0xCD9E8D57u} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += 0x9E3779B9u;
    k[1] += 0xBB67AE85u;
  }
  return c;
}

std::array<uint32_t, 4> philox_ref(int64_t counter, uint64_t seed) {
  uint64_t u = static_cast<uint64_t>(counter);
  return philox_ref({static_cast<uint32_t>(u), static_cast<uint32_t>(u >> 32), 0, 0},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

TEST(Philox, ReferenceMatchesRandom123KnownAnswers) {
  using W = std::array<uint32_t, 4>;
  EXPECT_EQ(philox_ref(W{0, 0, 0, 0}, {0, 0}), (W{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox_ref(W{~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
            (W{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox_ref(W{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (W{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

constexpr uint64_t kSeed = 0x0123456789abcdefULL;
constexpr size_t kSamples = 1 << 20;

std::vector<int64_t> iota_counters(size_t n, int64_t start = 0) {
  std::vector<int64_t> c(n);
  for (size_t k = 0; k < n; ++k) c[k] = start + static_cast<int64_t>(k);
  return c;
}

// Counters whose high words vary too.
std::vector<int64_t> scattered_counters(size_t n) {
  std::vector<int64_t> c(n);
  for (size_t k = 0; k < n; ++k) c[k] = static_cast<int64_t>(k * 0x9E3779B97F4A7C15ULL);
  return c;
}

template <class T>
void expect_vector_matches_scalar(Random f, uint64_t seed, const std::vector<int64_t>& counters,
                                  const std::vector<T>& vec, const char* what) {
  std::vector<T> sca = run_random<T>(f, seed, counters, 1);
  size_t bad = 0;
  for (size_t k = 0; k < vec.size(); ++k) bad += !same_bits_or_both_nan(vec[k], sca[k]);
  EXPECT_EQ(bad, 0u) << what << ": vector and scalar forms differ";
}

struct Moments {
  double mean = 0, var = 0, lo = kInf, hi = -kInf;
};

template <class T>
Moments moments(const std::vector<T>& v) {
  Moments m;
  long double s = 0, s2 = 0;
  for (T x : v) {
    s += x;
    m.lo = std::min<double>(m.lo, x);
    m.hi = std::max<double>(m.hi, x);
  }
  m.mean = static_cast<double>(s / v.size());
  for (T x : v) s2 += (x - m.mean) * (x - m.mean);
  m.var = static_cast<double>(s2 / v.size());
  return m;
}

TEST(Philox, UniformMatchesReferenceBits) {
  auto cs = scattered_counters(1 << 14);
  for (uint64_t seed : {uint64_t{0}, kSeed}) {
    auto f = run_random<float>(fc::emit_random_uniform, seed, cs, 16);
    auto d = run_random<double>(fc::emit_random_uniform, seed, cs, 8);
    for (size_t k = 0; k < cs.size(); ++k) {
      auto w = philox_ref(cs[k], seed);
      ASSERT_EQ(f[k], static_cast<float>(w[0] >> 8) * 0x1p-24f) << "counter " << cs[k];
      uint64_t bits53 = ((uint64_t{w[0]} << 32) | w[1]) >> 11;
      ASSERT_EQ(d[k], static_cast<double>(bits53) * 0x1p-53) << "counter " << cs[k];
    }
  }
  // Random123's all-zero known answer through the emitted code.
  auto z = run_random<float>(fc::emit_random_uniform, 0, iota_counters(16), 16);
  EXPECT_EQ(z[0], static_cast<float>(0x6627e8d5u >> 8) * 0x1p-24f);
}

template <class T>
void check_uniform() {
  auto cs = iota_counters(kSamples);
  auto v = run_random<T>(fc::emit_random_uniform, kSeed, cs, vector_width<T>());
  expect_vector_matches_scalar<T>(fc::emit_random_uniform, kSeed, cs, v, "uniform");
  Moments m = moments(v);
  std::printf("[ measured ] uniform %s: mean %.5f var %.5f range [%.3g, %.9g]\n",
              sizeof(T) == 4 ? "f32" : "f64", m.mean, m.var, m.lo, m.hi);
  EXPECT_NEAR(m.mean, 0.5, 2e-3);
  EXPECT_NEAR(m.var, 1.0 / 12, 1e-3);
  EXPECT_GE(m.lo, 0.0);
  EXPECT_LT(m.hi, 1.0);
}

TEST(Philox, UniformFloat32) { check_uniform<float>(); }
TEST(Philox, UniformFloat64) { check_uniform<double>(); }

template <class T>
void check_normal(Random f, const char* name, double want_var, double max_abs) {
  auto cs = iota_counters(kSamples);
  auto v = run_random<T>(f, kSeed, cs, vector_width<T>());
  expect_vector_matches_scalar<T>(f, kSeed, cs, v, name);
  Moments m = moments(v);
  double within1 = 0;
  for (T x : v) within1 += std::fabs(x) < 1;
  within1 /= v.size();
  std::printf("[ measured ] %s %s: mean %.5f var %.5f P(|x|<1) %.4f range [%.4f, %.4f]\n", name,
              sizeof(T) == 4 ? "f32" : "f64", m.mean, m.var, within1, m.lo, m.hi);
  EXPECT_NEAR(m.mean, 0.0, 5e-3);
  EXPECT_NEAR(m.var, want_var, 5e-3);
  EXPECT_GE(m.lo, -max_abs);
  EXPECT_LE(m.hi, max_abs);

  // Same (counter, seed) gives the same value; another seed gives other values.
  auto again = run_random<T>(f, kSeed, cs, vector_width<T>());
  EXPECT_EQ(std::memcmp(v.data(), again.data(), v.size() * sizeof(T)), 0);
  auto other = run_random<T>(f, kSeed + 1, cs, vector_width<T>());
  size_t equal = 0;
  for (size_t k = 0; k < v.size(); ++k) equal += v[k] == other[k];
  EXPECT_LT(equal, v.size() / 1000) << name << ": seeds " << kSeed << " and " << kSeed + 1;
}

// Normal: var 1, P(|x| < 1) = 0.6827; finite (the largest |x| from 2^-24 tails is ~5.4).
TEST(Philox, NormalFloat32) { check_normal<float>(fc::emit_random_normal, "normal", 1.0, 6.0); }
TEST(Philox, NormalFloat64) { check_normal<double>(fc::emit_random_normal, "normal", 1.0, 9.0); }

// Truncated to [-2, 2]: var = 1 - 4 phi(2) / (Phi(2) - Phi(-2)) = 0.773741.
TEST(Philox, TruncatedNormalFloat32) {
  check_normal<float>(fc::emit_truncated_normal, "truncated", 0.7737413, 2.0);
}
TEST(Philox, TruncatedNormalFloat64) {
  check_normal<double>(fc::emit_truncated_normal, "truncated", 0.7737413, 2.0);
}

// ------------------------------------------------------------------ IR shape

// The message of the InternalError that `emit` throws.
std::string internal_error(const std::function<void()>& emit) {
  try {
    emit();
  } catch (const flowjit::InternalError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(MathLib, RejectsUnsupportedTypes) {
  llvm::LLVMContext ctx;
  llvm::IRBuilder<> b(ctx);
  Value* one = b.getInt32(1);
  EXPECT_NE(internal_error([&] {
              fc::emit_exp(b, one);
            }).find("emit_exp: expected float, double or a fixed vector of them, got i32"),
            std::string::npos);
  Value* x = llvm::ConstantFP::get(b.getFloatTy(), 2.0);
  Value* y = llvm::ConstantFP::get(b.getDoubleTy(), 2.0);
  EXPECT_NE(internal_error([&] {
              fc::emit_pow(b, x, y);
            }).find("emit_pow: x has type float but y has type double"),
            std::string::npos);
  Value* counters = llvm::ConstantInt::get(llvm::FixedVectorType::get(b.getInt64Ty(), 4), 1);
  EXPECT_NE(internal_error([&] {
              fc::emit_random_normal(b, counters, 0, b.getFloatTy());
            }).find("emit_random_normal: counter type <4 x i64> does not match result type float"),
            std::string::npos);
}

bool allowed_intrinsic(llvm::Intrinsic::ID id) {
  switch (id) {
    case llvm::Intrinsic::fma:
    case llvm::Intrinsic::fabs:
    case llvm::Intrinsic::floor:
    case llvm::Intrinsic::rint:
    case llvm::Intrinsic::roundeven:
    case llvm::Intrinsic::sqrt:
    case llvm::Intrinsic::copysign:
    case llvm::Intrinsic::minnum:
    case llvm::Intrinsic::maxnum:
      return true;
    default:
      return false;
  }
}

// Names the calls in `f` other than the cheap intrinsics. After optimization,
// instcombine may also have folded compares into llvm.is.fpclass (one vfpclass
// or a compare when lowered).
std::vector<std::string> forbidden_calls(const llvm::Function& f, bool optimized = false) {
  std::vector<std::string> bad;
  for (const llvm::Instruction& inst : llvm::instructions(f)) {
    if (auto* call = llvm::dyn_cast<llvm::CallBase>(&inst)) {
      const llvm::Function* callee = call->getCalledFunction();
      llvm::Intrinsic::ID id = callee ? callee->getIntrinsicID() : llvm::Intrinsic::not_intrinsic;
      if (!allowed_intrinsic(id) && !(optimized && id == llvm::Intrinsic::is_fpclass))
        bad.push_back(callee ? callee->getName().str() : "<indirect>");
    }
  }
  return bad;
}

struct Emitted {
  std::string name;
  std::vector<Elem> ins;
  Elem out;
  Body body;
};

std::vector<Emitted> all_functions() {
  std::vector<Emitted> fs;
  for (Elem e : {Elem::F32, Elem::F64}) {
    std::string suffix = e == Elem::F32 ? "_f32" : "_f64";
    auto unary = [&](const char* name, Unary f) {
      fs.push_back({name + suffix, {e}, e, [f](IRBuilderBase& b, auto v, llvm::Type*) {
                      return f(b, v[0]);
                    }});
    };
    for (const UnaryCase& c : unary_cases()) unary(c.name, c.emit);
    unary("erfinv", fc::emit_erfinv);
    fs.push_back({"pow" + suffix, {e, e}, e, [](IRBuilderBase& b, auto v, llvm::Type*) {
                    return fc::emit_pow(b, v[0], v[1]);
                  }});
    for (auto [name, f] : {std::pair{"uniform", fc::emit_random_uniform},
                           std::pair{"normal", fc::emit_random_normal},
                           std::pair{"truncated", fc::emit_truncated_normal}}) {
      fs.push_back(
          {name + suffix, {Elem::I64}, e, [f = f](IRBuilderBase& b, auto v, llvm::Type* t) {
             return f(b, v[0], 7, t);
           }});
    }
  }
  return fs;
}

TEST(MathLib, EmitsOnlyCheapIntrinsics) {
  llvm::LLVMContext ctx;
  for (const Emitted& f : all_functions()) {
    for (unsigned width : {1u, 3u, 16u}) {
      auto m = build_kernel(ctx, f.name, f.ins, f.out, width, f.body);
      EXPECT_FALSE(llvm::verifyModule(*m, &llvm::errs())) << f.name;
      auto bad = forbidden_calls(*m->getFunction(f.name));
      EXPECT_TRUE(bad.empty()) << f.name << " width " << width << " calls " << bad.front();
    }
  }
}

// The point of the library: a scalar loop over these functions, after the O3
// pipeline for the host, runs on vectors (the loop vectorizer takes it) and the
// machine code calls nothing.
TEST(MathLib, ScalarLoopVectorizesWithoutCalls) {
  auto tm = Jit::get().target_machine();
  std::printf("[ measured ] host %s %s\n", tm->getTargetCPU().str().c_str(),
              tm->getTargetFeatureString().contains("+avx512f") ? "(avx512f)" : "");
  for (const Emitted& f : all_functions()) {
    llvm::LLVMContext ctx;
    auto m = build_kernel(ctx, f.name, f.ins, f.out, 1, f.body);
    m->setDataLayout(tm->createDataLayout());
    m->setTargetTriple(tm->getTargetTriple().str());
    llvm::Function* fn = m->getFunction(f.name);
    fn->addFnAttr("target-cpu", tm->getTargetCPU());
    fn->addFnAttr("target-features", tm->getTargetFeatureString());

    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PassBuilder pb(tm.get());
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(*m, mam);

    unsigned widest = 0;
    for (const llvm::Instruction& inst : llvm::instructions(*fn)) {
      if (auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(inst.getType()))
        if (vt->getElementType()->isFloatingPointTy())
          widest = std::max(widest, vt->getNumElements());
    }
    // Vectorized at all: at least one 128-bit vector (every x86-64 host has
    // SSE2; AVX2 and AVX-512 hosts may pick wider or not, by LLVM's cost
    // model). Random kernels compute on i64 lanes and get half the float lanes.
    unsigned want = f.out == Elem::F32 && f.ins[0] != Elem::I64 ? 4 : 2;
    EXPECT_GE(widest, want) << f.name << " was not vectorized";
    auto bad = forbidden_calls(*fn, /*optimized=*/true);
    EXPECT_TRUE(bad.empty()) << f.name << " calls " << bad.front();

    llvm::SmallString<0> asm_text;
    llvm::raw_svector_ostream os(asm_text);
    llvm::legacy::PassManager pm;
    ASSERT_FALSE(tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile));
    pm.run(*m);
    EXPECT_EQ(asm_text.str().find("\tcall"), llvm::StringRef::npos)
        << f.name << " machine code calls a function";
    EXPECT_NE(asm_text.str().find(f.out == Elem::F32 ? "ps\t%" : "pd\t%"), llvm::StringRef::npos)
        << f.name << " has no packed arithmetic";
  }
}

}  // namespace
