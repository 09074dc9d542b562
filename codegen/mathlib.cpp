// Vectorizable elementary functions and Philox random numbers, emitted as LLVM IR.
#include "codegen/mathlib.h"

#include <array>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/Support/raw_ostream.h>

#include "ir/error.h"

namespace flowjit::codegen {

using llvm::Type;
using llvm::Value;
using llvm::Intrinsic::ID;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string type_name(Type* t) {
  std::string s;
  llvm::raw_string_ostream os(s);
  t->print(os);
  return s;
}

// `elem` with the lane count of `like` (scalar if `like` is scalar).
Type* with_lanes(Type* like, Type* elem) {
  if (auto* v = llvm::dyn_cast<llvm::VectorType>(like))
    return llvm::VectorType::get(elem, v->getElementCount());
  return elem;
}

void check_fp_type(Type* t, const char* fn) {
  Type* s = t->getScalarType();
  FJ_CHECK((s->isFloatTy() || s->isDoubleTy()) && !llvm::isa<llvm::ScalableVectorType>(t), fn,
           ": expected float, double or a fixed vector of them, got ", type_name(t));
}

// The floating-point type being computed, its same-width integer type, and
// shorthands for the builder calls the routines below are made of.
struct Ops {
  Ops(llvm::IRBuilderBase& b, Type* t)
      : b(b),
        ft(t),
        it(with_lanes(t, t->getScalarType()->isDoubleTy() ? b.getInt64Ty() : b.getInt32Ty())),
        f64(t->getScalarType()->isDoubleTy()) {}

  llvm::IRBuilderBase& b;
  Type* ft;
  Type* it;
  bool f64;

  Value* c(double v) const { return llvm::ConstantFP::get(ft, v); }
  Value* i(uint64_t v) const { return llvm::ConstantInt::get(it, v); }
  Value* call(ID id, Value* a) const { return b.CreateUnaryIntrinsic(id, a); }
  Value* call(ID id, Value* a0, Value* a1) const { return b.CreateBinaryIntrinsic(id, a0, a1); }
  Value* fma(Value* m0, Value* m1, Value* a) const {
    return b.CreateIntrinsic(llvm::Intrinsic::fma, {ft}, {m0, m1, a});
  }
  Value* clamp(Value* v, double lo, double hi) const {
    return call(llvm::Intrinsic::minnum, call(llvm::Intrinsic::maxnum, v, c(lo)), c(hi));
  }
  // min(v, hi) and max(v, lo) that return a NaN v unchanged: `lo > v ? lo : v` is
  // one minps/maxps on x86 (which returns its second operand on NaN), where
  // maxnum/minnum would turn NaN into the bound.
  Value* min_keep_nan(Value* v, double hi) const {
    return b.CreateSelect(b.CreateFCmpOLT(c(hi), v), c(hi), v);
  }
  Value* max_keep_nan(Value* v, double lo) const {
    return b.CreateSelect(b.CreateFCmpOGT(c(lo), v), c(lo), v);
  }
  Value* to_bits(Value* v) const { return b.CreateBitCast(v, it); }
  Value* from_bits(Value* v) const { return b.CreateBitCast(v, ft); }
  Value* is_nan(Value* v) const { return b.CreateFCmpUNO(v, v); }
  // Horner's rule with fma; coefficients from the highest degree down.
  Value* horner(Value* t, std::initializer_list<double> coeffs) const {
    Value* p = nullptr;
    for (double k : coeffs) p = p ? fma(p, t, c(k)) : c(k);
    return p;
  }
  // fptosi and sitofp of integral values |v| < 2^51. x86 has no vector
  // double <-> int64 conversion before AVX-512DQ and scalarizes each lane
  // (a double erfc kernel spent most of its time there); for doubles the
  // shifter S = 1.5 * 2^52 puts v in the low mantissa bits of v + S exactly,
  // so both are one add and one integer op, with the same results.
  Value* to_int(Value* k) const {
    if (!f64) return b.CreateFPToSI(k, it);
    return b.CreateSub(to_bits(b.CreateFAdd(k, c(0x1.8p52))), i(0x4338000000000000ULL));
  }
  Value* to_fp(Value* e) const {
    if (!f64) return b.CreateSIToFP(e, ft);
    return b.CreateFSub(from_bits(b.CreateAdd(e, i(0x4338000000000000ULL))), c(0x1.8p52));
  }
  // 2^k for an integer k with 2^k a normal number.
  Value* pow2(Value* k) const {
    int mant = f64 ? 52 : 23;
    int bias = f64 ? 1023 : 127;
    return from_bits(b.CreateShl(b.CreateAdd(k, i(bias)), mant));
  }
};

// ---------------------------------------------------------------- exp
// float exp(x), about 17 vector instructions:
// 1. x is clamped to [-104, 89] by min/max that keep NaN (so no NaN select is
//    needed: NaN flows through the arithmetic). t = fma(x, log2e, S) with the
//    shifter S = 1.5 * 2^23 + 126 rounds x log2e to the nearest integer k in the
//    low mantissa bits of t (ties to even) and k = t - S exactly.
// 2. r = x - k ln2 by two fmas (Cody-Waite, ln2 = hi + lo), |r| <= ln2/2 + 1e-5.
// 3. 2 e^r by a degree-6 polynomial (constant term 2; relative minimax error
//    2e-9 on [-0.34675, 0.34675]): 6 fmas.
// 4. The scale 2^(k-1) is the bits of t shifted left by 23 (the low 9 bits of t
//    hold k + 126; the factor 2 is in the polynomial so k = 128 stays finite and
//    the product rounds to inf by itself above ln(FLT_MAX)). For x < -64.1, which
//    covers every result below 2^-126, the scale gets an exponent 32 higher and
//    the product one more multiply by 2^-32 (exact for normal results), so
//    subnormal results are rounded once and underflow reaches 0.
// Error: 1.06 ulp over every input in [-104, 89].
Value* exp_f32(const Ops& o, Value* x) {
  constexpr double kShift = 0x1.8p23 + 126;
  Value* xc = o.max_keep_nan(o.min_keep_nan(x, 89.0), -104.0);
  Value* t = o.fma(xc, o.c(0x1.715476p+0), o.c(kShift));
  Value* k = o.b.CreateFSub(t, o.c(kShift));
  Value* r = o.fma(k, o.c(-0x1.62e430p-1), xc);
  r = o.fma(k, o.c(0x1.05c610p-29), r);
  Value* p2 = o.horner(r, {0x1.6ae6e0p-9, 0x1.1267d8p-6, 0x1.555824p-4, 0x1.555418p-2,
                           0x1.fffffcp-1, 0x1.0p+1, 2.0});
  Value* sbits = o.b.CreateShl(o.to_bits(t), 23);
  // "x < -64" as k + 126 < 34 (x < -64.1), read from the scale's bits: the
  // low 9 bits of t hold k + 126, which is negative below k = -126 and then
  // wraps to a negative sbits, so tiny is sbits < 34 << 23 as a signed
  // integer. An integer compare, which x86 runs on more ports than a float
  // one. A NaN lane takes either path and stays NaN (p2 is NaN).
  Value* tiny = o.b.CreateICmpSLT(sbits, o.i(34u << 23));
  sbits = o.b.CreateSelect(tiny, o.b.CreateAdd(sbits, o.i(32u << 23)), sbits);
  Value* res = o.b.CreateFMul(p2, o.from_bits(sbits));
  return o.b.CreateSelect(tiny, o.b.CreateFMul(res, o.c(0x1p-32)), res);
}

// double exp(x): 1. k = roundeven(x / ln2), r = x - k ln2 with ln2 split in two
// so that the first fma is exact (Cody-Waite), |r| <= ln2/2 + tiny. 2. e^r =
// 1 + r + r^2 P(r). 3. Scale by 2^k as 2^(k/2) * 2^(k - k/2): each factor is
// normal for every k in range, so results near overflow and subnormal results
// are rounded once. x is clamped first so that k fits and the scale saturates
// to inf or 0 by itself. Error: 0.97 ulp.
Value* estrin(const Ops& o, Value* t, const double* a, int n);

// `float_grade`: a double e^x accurate to about 2e-10 relative, for results
// rounded to float (the float erfc): the Taylor series to degree 8 by
// Estrin's scheme instead of degree 13 by Horner's rule.
Value* exp_f64(const Ops& o, Value* x, bool float_grade = false) {
  Value* xc = o.clamp(x, -746.0, 710.0);
  Value* k = o.call(llvm::Intrinsic::roundeven, o.b.CreateFMul(xc, o.c(0x1.71547652b82fep+0)));
  Value* r = o.fma(k, o.c(-0x1.62e42fefa39efp-1), xc);
  r = o.fma(k, o.c(-0x1.abc9e3b39803fp-56), r);
  Value* er;
  if (float_grade) {
    // 1 + r + ... + r^8/8!: truncation < 2.1e-10 for |r| <= 0.35.
    static const double a[] = {1.0,       1.0,       1.0 / 2,    1.0 / 6,    1.0 / 24,
                               1.0 / 120, 1.0 / 720, 1.0 / 5040, 1.0 / 40320};
    er = estrin(o, r, a, 9);
  } else {
    // Taylor series to degree 13: truncation error < 2^-57 for |r| <= 0.35.
    Value* p =
        o.horner(r, {1.0 / 6227020800, 1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880,
                     1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5});
    er = o.b.CreateFAdd(o.fma(p, o.b.CreateFMul(r, r), r), o.c(1.0));
  }
  Value* ki = o.to_int(k);  // |k| <= 1077
  Value* k1 = o.b.CreateAShr(ki, 1);
  Value* k2 = o.b.CreateSub(ki, k1);
  Value* res = o.b.CreateFMul(o.b.CreateFMul(er, o.pow2(k1)), o.pow2(k2));
  return o.b.CreateSelect(o.is_nan(x), x, res);
}

Value* exp_impl(const Ops& o, Value* x) { return o.f64 ? exp_f64(o, x) : exp_f32(o, x); }

// ---------------------------------------------------------------- log
// Splits x = 2^e * m with m in [sqrt(1/2), sqrt(2)) by integer ops on the bits
// (subnormals are first scaled by 2^24 or 2^54) and returns f = m - 1 and e.
std::pair<Value*, Value*> log_reduce(const Ops& o, Value* x) {
  const bool d = o.f64;
  const uint64_t sqrt_half = d ? 0x3fe6a09e667f3bcdULL : 0x3f3504f3ULL;
  const uint64_t one = d ? 0x3ff0000000000000ULL : 0x3f800000ULL;
  const uint64_t mant_mask = d ? 0x000fffffffffffffULL : 0x007fffffULL;
  const int mant = d ? 52 : 23;
  Value* tiny = o.b.CreateFCmpOLT(x, o.c(d ? 0x1p-1022 : 0x1p-126));
  Value* xs = o.b.CreateSelect(tiny, o.b.CreateFMul(x, o.c(d ? 0x1p54 : 0x1p24)), x);
  Value* ix = o.b.CreateAdd(o.to_bits(xs), o.i(one - sqrt_half));
  Value* e = o.b.CreateSub(o.b.CreateLShr(ix, mant), o.i(d ? 1023 : 127));
  e = o.b.CreateSub(e, o.b.CreateSelect(tiny, o.i(d ? 54 : 24), o.i(0)));
  Value* m = o.from_bits(o.b.CreateAdd(o.b.CreateAnd(ix, o.i(mant_mask)), o.i(sqrt_half)));
  return {o.b.CreateFSub(m, o.c(1.0)), o.to_fp(e)};  // |e| < 1100
}

// log(1 + f) + e ln2, float: Cephes logf, log(1+f) = f - f^2/2 + f^3 P(f) with
// P of degree 8; ln2 = 0.693359375 - 2.1219444e-4 so that e * 0.693359375 is
// exact. Error: 0.83 ulp.
Value* log_f32(const Ops& o, Value* f, Value* e) {
  Value* z = o.b.CreateFMul(f, f);
  Value* p = o.horner(
      f, {7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
          -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1});
  Value* y = o.b.CreateFMul(o.b.CreateFMul(f, z), p);
  y = o.fma(e, o.c(-2.12194440e-4), y);
  y = o.fma(z, o.c(-0.5), y);
  return o.fma(e, o.c(0.693359375), o.b.CreateFAdd(f, y));
}

// log(1 + f) + e ln2, double: fdlibm's e_log.c method. s = f / (2 + f),
// log(1+f) = f - f^2/2 + s (f^2/2 + R(s^2)) with R a degree-7 minimax in s^2
// (approximation error < 2^-58.45); ln2 split so that e * ln2_hi is exact.
// Error: 0.63 ulp.
Value* log_f64(const Ops& o, Value* f, Value* e) {
  Value* s = o.b.CreateFDiv(f, o.b.CreateFAdd(f, o.c(2.0)));
  Value* z = o.b.CreateFMul(s, s);
  Value* r = o.b.CreateFMul(
      z, o.horner(z, {1.479819860511658591e-01, 1.531383769920937332e-01, 1.818357216161805012e-01,
                      2.222219843214978396e-01, 2.857142874366239149e-01, 3.999999999940941908e-01,
                      6.666666666666735130e-01}));
  Value* hfsq = o.b.CreateFMul(o.b.CreateFMul(f, f), o.c(0.5));
  Value* lo = o.fma(s, o.b.CreateFAdd(hfsq, r), o.b.CreateFMul(e, o.c(1.90821492927058770002e-10)));
  Value* t = o.b.CreateFSub(o.b.CreateFSub(hfsq, lo), f);
  return o.b.CreateFSub(o.b.CreateFMul(e, o.c(6.93147180369123816490e-01)), t);
}

Value* log_impl(const Ops& o, Value* x) {
  auto [f, e] = log_reduce(o, x);
  Value* r = o.f64 ? log_f64(o, f, e) : log_f32(o, f, e);
  r = o.b.CreateSelect(o.b.CreateFCmpOEQ(x, o.c(kInf)), x, r);
  r = o.b.CreateSelect(o.b.CreateFCmpOEQ(x, o.c(0.0)), o.c(-kInf), r);
  return o.b.CreateSelect(o.b.CreateFCmpULT(x, o.c(0.0)), o.c(kNaN), r);
}

// ---------------------------------------------------------------- sin, cos
// sin(|x| + quarter_turns pi/2), so quarter_turns 0 is sin(|x|), 1 is cos(x):
// 1. j = roundeven(|x| 2/pi), r = |x| - j pi/2 with pi/2 split in three
//    (Cody-Waite; the first fma is exact), |r| <= pi/4 + tiny.
// 2. sin r and cos r by minimax polynomials on [-pi/4, pi/4]: float Cephes
//    sinf/cosf (degree 7 and 8), double fdlibm __kernel_sin/__kernel_cos
//    (approximation error < 2^-58) with the rounding of 1 - r^2/2 compensated.
// 3. With q = j + quarter_turns, sin(r + q pi/2) is sin r or cos r by bit 0 of
//    q, negated by bit 1; sin then takes the sign of x.
// Error: float 1.56 ulp for |x| <= 8192 and accurate reduction to about
// 1e15 (reduced in double), double 1.45 ulp for |x| <= 1e5.
Value* sincos_impl(const Ops& o, Value* x, int quarter_turns) {
  const bool d = o.f64;
  Value* ax = o.call(llvm::Intrinsic::fabs, x);
  // Float arguments are reduced in double: a float has 24 significant bits,
  // so j * (pi/2)_hi stays exact far beyond float's own 3-part split (8192),
  // up to |x| ~ 1e15. jq is j mod 4 (exact while j < 2^53), which is all the
  // quadrant needs.
  Type* dt = d ? o.ft : with_lanes(o.ft, o.b.getDoubleTy());
  auto dc = [&](double v) { return llvm::ConstantFP::get(dt, v); };
  auto dfma = [&](Value* m0, Value* m1, Value* a) {
    return o.b.CreateIntrinsic(llvm::Intrinsic::fma, {dt}, {m0, m1, a});
  };
  Value* axd = d ? ax : o.b.CreateFPExt(ax, dt);
  Value* j = o.b.CreateUnaryIntrinsic(llvm::Intrinsic::roundeven,
                                      o.b.CreateFMul(axd, dc(0x1.45f306dc9c883p-1)));
  Value* rd = dfma(j, dc(-0x1.921fb54442d18p+0), axd);
  rd = dfma(j, dc(-0x1.1a62633145c07p-54), rd);
  rd = dfma(j, dc(0x1.f1976b7ed8fbcp-110), rd);
  Value* jq = o.b.CreateFSub(
      j, o.b.CreateFMul(dc(4.0), o.b.CreateUnaryIntrinsic(llvm::Intrinsic::floor,
                                                          o.b.CreateFMul(j, dc(0.25)))));
  Value* r = d ? rd : o.b.CreateFPTrunc(rd, o.ft);
  // Beyond the accurate range r is noise: keep it where the polynomials are
  // bounded (|r| <= pi/4 + tiny inside the range; NaN passes through).
  r = o.max_keep_nan(o.min_keep_nan(r, 0.8), -0.8);
  Value* z = o.b.CreateFMul(r, r);

  Value* sin_p;
  Value* cos_r;
  if (d) {
    sin_p = o.horner(
        z, {1.58969099521155010221e-10, -2.50507602534068634195e-08, 2.75573137070700676789e-06,
            -1.98412698298579493134e-04, 8.33333333332248946124e-03, -1.66666666666666324348e-01});
    Value* cos_p = o.horner(
        z, {-1.13596475577881948265e-11, 2.08757232129817482790e-09, -2.75573143513906633035e-07,
            2.48015872894767294178e-05, -1.38888888888741095749e-03, 4.16666666666666019037e-02});
    Value* hz = o.b.CreateFMul(z, o.c(0.5));
    Value* w = o.b.CreateFSub(o.c(1.0), hz);
    Value* w_err = o.b.CreateFSub(o.b.CreateFSub(o.c(1.0), w), hz);
    cos_r = o.b.CreateFAdd(w, o.fma(o.b.CreateFMul(z, z), cos_p, w_err));
  } else {
    sin_p = o.horner(z, {-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1});
    Value* cos_p = o.horner(z, {2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2});
    cos_r = o.fma(o.b.CreateFMul(z, z), cos_p, o.fma(z, o.c(-0.5), o.c(1.0)));
  }
  Value* sin_r = o.fma(o.b.CreateFMul(z, r), sin_p, r);

  // minnum turns a NaN jq (infinite x) into 4: the result is NaN either way.
  Value* q =
      o.b.CreateFPToSI(o.b.CreateBinaryIntrinsic(llvm::Intrinsic::minnum, jq, dc(4.0)), o.it);
  q = o.b.CreateAdd(q, o.i(quarter_turns));
  Value* odd = o.b.CreateICmpNE(o.b.CreateAnd(q, o.i(1)), o.i(0));
  Value* res = o.b.CreateSelect(odd, cos_r, sin_r);
  int sign_shift = d ? 62 : 30;
  Value* sign = o.b.CreateShl(o.b.CreateAnd(q, o.i(2)), sign_shift);
  if (quarter_turns == 0)  // sin is odd: sin(x) = sign(x) sin(|x|)
    sign = o.b.CreateXor(sign, o.b.CreateAnd(o.to_bits(x), o.i(1ULL << (d ? 63 : 31))));
  return o.from_bits(o.b.CreateXor(o.to_bits(res), sign));
}

// ---------------------------------------------------------------- tanh, sigmoid
// float tanh(x) = sign(x) tanh(a), a = min(|x|, 10) (the min keeps NaN), from
// one expm1 and one division, no select: with E = e^(-2a),
// tanh(a) = (1 - E) / (1 + E) = m / d. m keeps relative accuracy for tiny a
// (m = 2a exactly there, so tanh(x) = x) and the quotient saturates to 1 by
// itself (tanh(10) rounds to 1).
// 1. k = round(-2a log2e) by the shifter as in exp_f32 (the low bits of t hold
//    k + 128, so t << 23 is s2 = 2^(k+1)); h = a + k ln2/2 by two fmas, so that
//    -2a = k ln2 - 2h, |h| <= ln2/4 + tiny.
// 2. g = (1 - e^(-2h)) / 2 = h + h^2 P(h), P of degree 4 (a degree-6 relative
//    minimax for expm1 on [-0.34675, 0.34675], error 1.3e-8, rescaled by powers
//    of -2); the leading h is added last, so g is rounded about once.
// 3. E = 2^k (1 - 2g): m = fma(s2, g, 1 - 2^k) and d = fma(-s2, g, 1 + 2^k),
//    each rounded once from g (1 - 2^k is exact for k >= -24; d is not
//    derived from the rounded m, which would double m's error near tanh = 1).
//    2^k is s2 with its exponent field one lower, so 1 - 2^k and 1 + 2^k
//    are an add and a subtract (x86 runs them on other ports than the fmas).
// 4. The sign: m >= +0 and d > 0, so the quotient's sign bit is clear (at
//    a = 0 too, where m = +0) and x's sign bit is or-ed in.
// About 20 vector instructions plus the division. Error: 1.93 ulp over every
// input (the three roundings of m, d and the quotient, worst near |x| = 0.5).
Value* tanh_f32(const Ops& o, Value* x) {
  constexpr double kShift = 0x1.8p23 + 128;
  Value* a = o.min_keep_nan(o.call(llvm::Intrinsic::fabs, x), 10.0);
  Value* t = o.fma(a, o.c(-0x1.715476p+1), o.c(kShift));
  Value* k = o.b.CreateFSub(t, o.c(kShift));
  Value* h = o.fma(k, o.c(0x1.62e430p-2), a);
  h = o.fma(k, o.c(-0x1.05c610p-30), h);
  Value* p =
      o.horner(h, {-0x1.6bebfep-5, 0x1.1227b0p-3, -0x1.555674p-2, 0x1.5554b0p-1, -0x1.fffffep-1});
  Value* g = o.fma(p, o.b.CreateFMul(h, h), h);
  Value* sbits = o.b.CreateShl(o.to_bits(t), 23);
  Value* s2 = o.from_bits(sbits);
  // 2^k = s2 / 2 by the exponent field (an integer subtract, which x86 runs on
  // more ports than a multiply), so that 2^k - 1 and -1 - 2^k are plain
  // subtractions, each rounded once as an fma of s2 would round them.
  Value* pk = o.from_bits(o.b.CreateSub(sbits, o.i(1u << 23)));
  Value* ns2 = o.b.CreateFNeg(s2);
  Value* m = o.fma(s2, g, o.b.CreateFSub(o.c(1.0), pk));
  Value* d = o.fma(ns2, g, o.b.CreateFAdd(o.c(1.0), pk));
  // Step 4: one or, where copysign would also clear the quotient's sign bit
  // (an and, an and-not and an or on x86 without AVX-512's ternary logic).
  Value* q = o.to_bits(o.b.CreateFDiv(m, d));
  return o.from_bits(o.b.CreateOr(q, o.b.CreateAnd(o.to_bits(x), o.i(0x80000000u))));
}

// double tanh(x) = sign(x) tanh(|x|). For |x| < 0.625 the odd form
// |x| + |x| z P(z)/Q(z), z = x^2 (Cephes tanh: rational 2/3), which keeps
// relative accuracy for tiny x; above it 1 - 2 / (e^(2|x|) + 1), which saturates
// to 1 by itself. Error: 1.24 ulp.
Value* tanh_f64(const Ops& o, Value* x) {
  Value* ax = o.call(llvm::Intrinsic::fabs, x);
  Value* z = o.b.CreateFMul(ax, ax);
  Value* p = o.horner(
      z, {-9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3});
  Value* q = o.horner(
      z, {1.0, 1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3});
  Value* small = o.fma(o.b.CreateFMul(ax, z), o.b.CreateFDiv(p, q), ax);
  Value* e2 = exp_impl(o, o.b.CreateFMul(ax, o.c(2.0)));
  Value* large = o.b.CreateFSub(o.c(1.0), o.b.CreateFDiv(o.c(2.0), o.b.CreateFAdd(e2, o.c(1.0))));
  Value* res = o.b.CreateSelect(o.b.CreateFCmpOLT(ax, o.c(0.625)), small, large);
  return o.call(llvm::Intrinsic::copysign, res, x);
}

Value* tanh_impl(const Ops& o, Value* x) { return o.f64 ? tanh_f64(o, x) : tanh_f32(o, x); }

// sigmoid(x) = num / (1 + e) with e = e^-|x| and num = 1 for x >= 0, e for
// x < 0: e never overflows and the x < 0 branch keeps relative accuracy down to
// the subnormals. The rounding of d = 1 + e is undone: its error d_err =
// (1 - d) + e is exact, and the quotient q = num / d is corrected once,
// s = q + (num - q d - q d_err) / (1 + e), with 1 / (1 + e) ~ q (x >= 0) or 1 - q
// (x < 0). Error: 0.5 ulp plus exp's error scaled by at most 1; measured float
// 1.49 ulp, double 1.31 ulp.
Value* sigmoid_impl(const Ops& o, Value* x) {
  Value* e = exp_impl(o, o.b.CreateFNeg(o.call(llvm::Intrinsic::fabs, x)));
  Value* pos = o.b.CreateFCmpOGE(x, o.c(0.0));
  Value* num = o.b.CreateSelect(pos, o.c(1.0), e);
  Value* d = o.b.CreateFAdd(e, o.c(1.0));
  Value* d_err = o.b.CreateFAdd(o.b.CreateFSub(o.c(1.0), d), e);
  Value* q = o.b.CreateFDiv(num, d);
  Value* neg_q = o.b.CreateFNeg(q);
  Value* rem = o.fma(neg_q, d_err, o.fma(neg_q, d, num));
  Value* inv_d = o.b.CreateSelect(pos, q, o.b.CreateFSub(o.c(1.0), q));
  return o.fma(rem, inv_d, q);
}

// ---------------------------------------------------------------- erfinv
// M. Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011):
// w = -log(1 - x^2); erfinv(x) = x p(w) with p a polynomial in w - c (central
// region) or sqrt(w) - c (tails); float has 2 regions, double 3. All regions
// are evaluated and selected, as a vector does anyway. 1 - x^2 is one fma,
// rounded once. Relative error: float 2.5e-7, double 4.9e-16.
Value* erfinv_impl(const Ops& o, Value* x) {
  Value* w = o.b.CreateFNeg(log_impl(o, o.fma(o.b.CreateFNeg(x), x, o.c(1.0))));
  Value* sw = o.call(llvm::Intrinsic::sqrt, w);
  Value* p;
  if (o.f64) {
    Value* p1 = o.horner(
        o.b.CreateFSub(w, o.c(3.125)),
        {-3.6444120640178196996e-21, -1.685059138182016589e-19,  1.2858480715256400167e-18,
         1.115787767802518096e-17,   -1.333171662854620906e-16,  2.0972767875968561637e-17,
         6.6376381343583238325e-15,  -4.0545662729752068639e-14, -8.1519341976054721522e-14,
         2.6335093153082322977e-12,  -1.2975133253453532498e-11, -5.4154120542946279317e-11,
         1.051212273321532285e-09,   -4.1126339803469836976e-09, -2.9070369957882005086e-08,
         4.2347877827932403518e-07,  -1.3654692000834678645e-06, -1.3882523362786468719e-05,
         0.0001867342080340571352,   -0.00074070253416626697512, -0.0060336708714301490533,
         0.24015818242558961693,     1.6536545626831027356});
    Value* p2 =
        o.horner(o.b.CreateFSub(sw, o.c(3.25)),
                 {2.2137376921775787049e-09, 9.0756561938885390979e-08, -2.7517406297064545428e-07,
                  1.8239629214389227755e-08, 1.5027403968909827627e-06, -4.013867526981545969e-06,
                  2.9234449089955446044e-06, 1.2475304481671778723e-05, -4.7318229009055733981e-05,
                  6.8284851459573175448e-05, 2.4031110387097893999e-05, -0.0003550375203628474796,
                  0.00095328937973738049703, -0.0016882755560235047313, 0.0024914420961078508066,
                  -0.0037512085075692412107, 0.005370914553590063617, 1.0052589676941592334,
                  3.0838856104922207635});
    Value* p3 =
        o.horner(o.b.CreateFSub(sw, o.c(5.0)),
                 {-2.7109920616438573243e-11, -2.5556418169965252055e-10, 1.5076572693500548083e-09,
                  -3.7894654401267369937e-09, 7.6157012080783393804e-09, -1.4960026627149240478e-08,
                  2.9147953450901080826e-08, -6.7711997758452339498e-08, 2.2900482228026654717e-07,
                  -9.9298272942317002539e-07, 4.5260625972231537039e-06, -1.9681778105531670567e-05,
                  7.5995277030017761139e-05, -0.00021503011930044477347, -0.00013871931833623122026,
                  1.0103004648645343977, 4.8499064014085844221});
    p = o.b.CreateSelect(o.b.CreateFCmpOLT(w, o.c(16.0)), p2, p3);
    p = o.b.CreateSelect(o.b.CreateFCmpOLT(w, o.c(6.25)), p1, p);
  } else {
    Value* p1 = o.horner(o.b.CreateFSub(w, o.c(2.5)),
                         {2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                          0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941});
    Value* p2 = o.horner(o.b.CreateFSub(sw, o.c(3.0)),
                         {-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                          0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682});
    p = o.b.CreateSelect(o.b.CreateFCmpOLT(w, o.c(5.0)), p1, p2);
  }
  Value* res = o.b.CreateFMul(p, x);
  Value* pole = o.b.CreateFCmpOEQ(o.call(llvm::Intrinsic::fabs, x), o.c(1.0));
  return o.b.CreateSelect(pole, o.call(llvm::Intrinsic::copysign, o.c(kInf), x), res);
}

// ---------------------------------------------------------------- erf, erfc
// Both are computed in double (float inputs are widened, evaluated with
// shorter series and rounded once at the end), from two approximations whose
// coefficients tools/fit_erf.py fits with mpmath:
// 1. erf(x) = x P(x^2) for |x| < 1: P a relative least-squares fit on [0, 1],
//    degree 11 (double; 2.2e-16) or 6 (float; 1.2e-9).
// 2. erfc(z) for z >= 0 as h(u) e^(-z^2) / (z + K) with u = (z - K) / (z + K)
//    and K = 3: h = (z + K) erfc(z) e^(z^2) is smooth on u in [-1, 1] (it tends
//    to 1/sqrt(pi) as z -> inf), so a Chebyshev series in u converges fast: 27
//    terms for double (truncation 4e-18), 14 for float (3e-10), evaluated by
//    Clenshaw's recurrence (double), or as the same terms expanded into a polynomial
//    evaluated by Estrin's scheme (float). 1 / (z + K) is one division, shared by u and the
//    scale. For double, e^(-z^2) is e^(-hi) (1 - lo) with z^2 = hi + lo split
//    by an fma, since the rounding of z^2 alone would cost up to 700 ulp in the
//    tail. z is clamped where erfc has underflowed (28, or 10.5 for float),
//    which keeps z^2 finite; the clamp keeps NaN.
// erf(x) for |x| >= 1 is sign(x) (1 - erfc(|x|)) and erfc(x < 0) = 2 - erfc(|x|),
// neither of which cancels (erfc(|x|) <= 0.16 there, erfc(-x) >= 1).
constexpr double kErfcK = 3.0;
constexpr double kErfcCheb[] = {
    1.4134382239808719605,       -1.1314768490746973784,     0.35410810034248636275,
    -0.085087040099085454546,    0.014615273272816639163,    -0.0013795571636296328358,
    -0.000064290667143159455807, 0.000039043421097724046549, -2.64278507485605409e-6,
    -8.239440143910853358e-7,    1.3247975697671356525e-7,   1.9195225156726448524e-8,
    -5.0305071637453932508e-9,   -5.842006410267007244e-10,  1.8742323910408168522e-10,
    2.4373672656733487206e-11,   -6.9909438396676971757e-12, -1.2573115617675998927e-12,
    2.4580005806439089578e-13,   7.0057416323787789868e-14,  -6.7327756947496092912e-15,
    -3.8434305894151518485e-15,  3.3163748896188907e-18,     1.933738540694711909e-16,
    1.9575527926615459386e-17,   -8.0386516602744545093e-18, -2.0047100385362378473e-18,
};
constexpr int kErfcTermsF64 = 27;
constexpr int kErfcTermsF32 = 14;
static_assert(sizeof(kErfcCheb) / sizeof(double) == kErfcTermsF64);

// The float series (the first kErfcTermsF32 Chebyshev terms) as a polynomial
// in u, lowest degree first: sum c_k T_k(u) expanded with T_(k+1) = 2u T_k -
// T_(k-1) in long double. Its coefficients sum to 3.0 in magnitude while h >=
// 0.56 on [-1, 1], so evaluating it in double loses nothing a float result
// can see.
const std::array<double, kErfcTermsF32>& erfc_f32_monomials() {
  static const std::array<double, kErfcTermsF32> a = [] {
    constexpr int n = kErfcTermsF32;
    std::array<std::array<long double, n>, n> t{};  // t[k][j]: coefficient of u^j in T_k
    t[0][0] = 1;
    t[1][1] = 1;
    for (int k = 2; k < n; ++k)
      for (int j = 0; j < n; ++j) t[k][j] = (j > 0 ? 2 * t[k - 1][j - 1] : 0) - t[k - 2][j];
    std::array<double, n> out{};
    for (int j = 0; j < n; ++j) {
      long double sum = 0;
      for (int k = 0; k < n; ++k) sum += static_cast<long double>(kErfcCheb[k]) * t[k][j];
      out[j] = static_cast<double>(sum);
    }
    return out;
  }();
  return a;
}

// sum a[j] t^j by Estrin's scheme: pairs, then pairs of pairs with t^2,
// t^4, ...: a dependency chain of about log2(n) fmas where Horner's rule and
// Clenshaw's recurrence have n (the float erfc spent its time waiting on its
// 14-step Clenshaw chain).
Value* estrin(const Ops& o, Value* t, const double* a, int n) {
  std::vector<Value*> level;
  for (int j = 0; j < n; j += 2)
    level.push_back(j + 1 < n ? o.fma(o.c(a[j + 1]), t, o.c(a[j])) : o.c(a[j]));
  Value* power = t;
  while (level.size() > 1) {
    power = o.b.CreateFMul(power, power);
    std::vector<Value*> next;
    for (size_t j = 0; j < level.size(); j += 2)
      next.push_back(j + 1 < level.size() ? o.fma(level[j + 1], power, level[j]) : level[j]);
    level = std::move(next);
  }
  return level[0];
}

// erfc(z) for z >= 0 (or NaN), `od` a double Ops; `full` selects double accuracy.
Value* erfc_nonneg(const Ops& od, Value* z, bool full) {
  Value* zc = od.min_keep_nan(z, full ? 28.0 : 10.5);
  Value* r = od.b.CreateFDiv(od.c(1.0), od.b.CreateFAdd(zc, od.c(kErfcK)));
  Value* u = od.b.CreateFMul(od.b.CreateFSub(zc, od.c(kErfcK)), r);
  Value* h;
  if (full) {
    // Clenshaw: b_k = c_k + 2u b_(k+1) - b_(k+2); h = c_0 + u b_1 - b_2.
    Value* u2 = od.b.CreateFAdd(u, u);
    Value* b1 = od.c(0.0);
    Value* b2 = od.c(0.0);
    for (int k = kErfcTermsF64 - 1; k >= 1; --k) {
      Value* bk = od.fma(u2, b1, od.b.CreateFSub(od.c(kErfcCheb[k]), b2));
      b2 = b1;
      b1 = bk;
    }
    h = od.fma(u, b1, od.b.CreateFSub(od.c(kErfcCheb[0]), b2));
  } else {
    h = estrin(od, u, erfc_f32_monomials().data(), kErfcTermsF32);
  }
  Value* hi = od.b.CreateFMul(zc, zc);
  Value* e = exp_f64(od, od.b.CreateFNeg(hi), /*float_grade=*/!full);
  if (full) {
    Value* lo = od.fma(zc, zc, od.b.CreateFNeg(hi));
    e = od.fma(e, od.b.CreateFNeg(lo), e);
  }
  return od.b.CreateFMul(od.b.CreateFMul(h, r), e);
}

// x in the caller's type, widened to double lanes for float.
Value* to_f64(const Ops& o, const Ops& od, Value* x) {
  return o.f64 ? x : o.b.CreateFPExt(x, od.ft);
}
Value* from_f64(const Ops& o, Value* v) { return o.f64 ? v : o.b.CreateFPTrunc(v, o.ft); }

Value* erf_impl(const Ops& o, Value* x) {
  Ops od(o.b, with_lanes(o.ft, o.b.getDoubleTy()));
  Value* xd = to_f64(o, od, x);
  Value* ax = od.call(llvm::Intrinsic::fabs, xd);
  Value* t = od.b.CreateFMul(xd, xd);
  Value* p =
      o.f64
          ? od.horner(
                t,
                {-7.7768291373628105931e-10, 1.3709519207384054734e-8, -1.6205964194101387582e-7,
                 1.6447084274239356277e-6, -0.000014924708324571507839, 0.00012055293361789940774,
                 -0.00085483259218328840198, 0.0052239776059559766634, -0.026866170643090833844,
                 0.11283791670944049985, -0.37612638903183516095, 1.1283791670955125655})
          : od.horner(t, {0.000078472591269656871559, -0.0008008189323165635183,
                          0.0051880988894004591798, -0.026853691099714645343,
                          0.11283582247992895491, -0.37612625567399251684, 1.1283791656893225228});
  Value* small = od.b.CreateFMul(xd, p);
  Value* big = od.b.CreateFSub(od.c(1.0), erfc_nonneg(od, ax, o.f64));
  big = od.call(llvm::Intrinsic::copysign, big, xd);
  return from_f64(o, od.b.CreateSelect(od.b.CreateFCmpOLT(ax, od.c(1.0)), small, big));
}

Value* erfc_impl(const Ops& o, Value* x) {
  Ops od(o.b, with_lanes(o.ft, o.b.getDoubleTy()));
  Value* xd = to_f64(o, od, x);
  Value* e = erfc_nonneg(od, od.call(llvm::Intrinsic::fabs, xd), o.f64);
  Value* neg = od.b.CreateFCmpOLT(xd, od.c(0.0));
  return from_f64(o, od.b.CreateSelect(neg, od.b.CreateFSub(od.c(2.0), e), e));
}

// ---------------------------------------------------------------- Philox
// Philox-4x32-10: ten rounds of (c0, c1, c2, c3) <- (hi(M1 c2) ^ c1 ^ k0,
// lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0)), bumping the key by the Weyl
// constants between rounds. The key is the i64 `seed`: a constant (then every
// round's key is a constant of the code) or a value the code reads at run
// time (one kernel's code shared by initializers that differ only in their
// seed). Integer arithmetic either way, so both give the same bits.
std::array<Value*, 4> philox4x32_10(llvm::IRBuilderBase& b, Value* counter, Value* seed) {
  Type* t64 = counter->getType();
  Type* t32 = with_lanes(t64, b.getInt32Ty());
  auto k32 = [&](uint32_t v) { return llvm::ConstantInt::get(t32, v); };
  auto mulhilo = [&](uint32_t m, Value* v) {
    Value* p = b.CreateMul(b.CreateZExt(v, t64), llvm::ConstantInt::get(t64, m));
    return std::pair{b.CreateTrunc(b.CreateLShr(p, 32), t32), b.CreateTrunc(p, t32)};
  };
  std::array<Value*, 4> c = {b.CreateTrunc(counter, t32),
                             b.CreateTrunc(b.CreateLShr(counter, 32), t32), k32(0), k32(0)};
  FJ_CHECK(seed->getType()->isIntegerTy(64), "philox: the seed must be an i64 scalar, got ",
           type_name(seed->getType()));
  if (auto* known = llvm::dyn_cast<llvm::ConstantInt>(seed)) {
    uint64_t s = known->getZExtValue();
    uint32_t k0 = static_cast<uint32_t>(s);
    uint32_t k1 = static_cast<uint32_t>(s >> 32);
    for (int round = 0; round < 10; ++round) {
      auto [hi0, lo0] = mulhilo(0xD2511F53u, c[0]);
      auto [hi1, lo1] = mulhilo(0xCD9E8D57u, c[2]);
      c = {b.CreateXor(b.CreateXor(hi1, c[1]), k32(k0)), lo1,
           b.CreateXor(b.CreateXor(hi0, c[3]), k32(k1)), lo0};
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    return c;
  }
  // The scalar key schedule, then each round's key broadcast to the lanes.
  Value* k0 = b.CreateTrunc(seed, b.getInt32Ty());
  Value* k1 = b.CreateTrunc(b.CreateLShr(seed, 32), b.getInt32Ty());
  auto lanes = [&](Value* k) -> Value* {
    auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(t32);
    return vt ? b.CreateVectorSplat(vt->getNumElements(), k) : k;
  };
  for (int round = 0; round < 10; ++round) {
    auto [hi0, lo0] = mulhilo(0xD2511F53u, c[0]);
    auto [hi1, lo1] = mulhilo(0xCD9E8D57u, c[2]);
    c = {b.CreateXor(b.CreateXor(hi1, c[1]), lanes(k0)), lo1,
         b.CreateXor(b.CreateXor(hi0, c[3]), lanes(k1)), lo0};
    k0 = b.CreateAdd(k0, b.getInt32(0x9E3779B9u));
    k1 = b.CreateAdd(k1, b.getInt32(0xBB67AE85u));
  }
  return c;
}

// The random bits a result element is made of: w0 >> 8 (24 bits) for float,
// ((w0 << 32) | w1) >> 11 (53 bits) for double, as an integer of the result's
// lane width, plus the Ops of the result type.
std::pair<Value*, Ops> random_bits(llvm::IRBuilderBase& b, Value* counter, Value* seed,
                                   Type* result_type, const char* fn) {
  check_fp_type(result_type, fn);
  Type* ct = counter->getType();
  FJ_CHECK(ct->getScalarType()->isIntegerTy(64) && !llvm::isa<llvm::ScalableVectorType>(ct), fn,
           ": counter must be i64 or a fixed vector of i64, got ", type_name(ct));
  FJ_CHECK(with_lanes(ct, result_type->getScalarType()) == result_type, fn, ": counter type ",
           type_name(ct), " does not match result type ", type_name(result_type));
  Ops o(b, result_type);
  auto w = philox4x32_10(b, counter, seed);
  if (!o.f64) return {b.CreateLShr(w[0], 8), o};
  Value* hi = b.CreateShl(b.CreateZExt(w[0], ct), 32);
  return {b.CreateLShr(b.CreateOr(hi, b.CreateZExt(w[1], ct)), 11), o};
}

// 2u - 1 for u = (m + 0.5) 2^-bits, formed exactly as (2m + 1 - 2^bits) 2^-bits:
// an odd integer below 2^bits in magnitude, so strictly inside (-1, 1).
Value* symmetric_open_unit(const Ops& o, Value* m) {
  int bits = o.f64 ? 53 : 24;
  Value* n = o.b.CreateSub(o.b.CreateOr(o.b.CreateShl(m, 1), o.i(1)), o.i(1ULL << bits));
  return o.b.CreateFMul(o.b.CreateSIToFP(n, o.ft), o.c(std::ldexp(1.0, -bits)));
}

}  // namespace

Value* emit_exp(llvm::IRBuilderBase& b, Value* x) {
  check_fp_type(x->getType(), "emit_exp");
  return exp_impl(Ops(b, x->getType()), x);
}

Value* emit_log(llvm::IRBuilderBase& b, Value* x) {
  check_fp_type(x->getType(), "emit_log");
  return log_impl(Ops(b, x->getType()), x);
}

Value* emit_tanh(llvm::IRBuilderBase& b, Value* x) {
  check_fp_type(x->getType(), "emit_tanh");
  return tanh_impl(Ops(b, x->getType()), x);
}

Value* emit_sigmoid(llvm::IRBuilderBase& b, Value* x) {
  check_fp_type(x->getType(), "emit_sigmoid");
  return sigmoid_impl(Ops(b, x->getType()), x);
}

Value* emit_sin(llvm::IRBuilderBase& b, Value* x) {
  check_fp_type(x->getType(), "emit_sin");
  return sincos_impl(Ops(b, x->getType()), x, 0);
}

Value* emit_cos(llvm::IRBuilderBase& b, Value* x) {
  check_fp_type(x->getType(), "emit_cos");
  return sincos_impl(Ops(b, x->getType()), x, 1);
}

Value* emit_erf(llvm::IRBuilderBase& b, Value* x) {
  check_fp_type(x->getType(), "emit_erf");
  return erf_impl(Ops(b, x->getType()), x);
}

Value* emit_erfc(llvm::IRBuilderBase& b, Value* x) {
  check_fp_type(x->getType(), "emit_erfc");
  return erfc_impl(Ops(b, x->getType()), x);
}

Value* emit_erfinv(llvm::IRBuilderBase& b, Value* x) {
  check_fp_type(x->getType(), "emit_erfinv");
  return erfinv_impl(Ops(b, x->getType()), x);
}

// pow(x, y) = sign * exp(y log|x|), the special cases selected afterwards:
// 1. magnitude: exp(y log|x|), in double for float inputs; zeros, infinities
//    and |x| != 1 with y = +-inf come out right by IEEE arithmetic on +-inf.
// 2. x with the sign bit set and y an odd integer: negate (covers -0, -inf).
// 3. finite x < 0 with y not an integer: NaN (y = +-inf counts as integral).
// 4. |x| = 1 with y = +-inf, x = 1, or y = +-0: 1.
Value* emit_pow(llvm::IRBuilderBase& b, Value* x, Value* y) {
  check_fp_type(x->getType(), "emit_pow");
  FJ_CHECK(x->getType() == y->getType(), "emit_pow: x has type ", type_name(x->getType()),
           " but y has type ", type_name(y->getType()));
  Ops o(b, x->getType());
  Value* ax = o.call(llvm::Intrinsic::fabs, x);
  Value* mag;
  if (o.f64) {
    mag = exp_impl(o, b.CreateFMul(y, log_impl(o, ax)));
  } else {
    Ops od(b, with_lanes(x->getType(), b.getDoubleTy()));
    Value* t = b.CreateFMul(b.CreateFPExt(y, od.ft), log_impl(od, b.CreateFPExt(ax, od.ft)));
    mag = b.CreateFPTrunc(exp_impl(od, t), o.ft);
  }
  auto is_integral = [&](Value* v) {
    return b.CreateFCmpOEQ(o.call(llvm::Intrinsic::floor, v), v);
  };
  Value* y_int = is_integral(y);
  Value* y_odd = b.CreateAnd(y_int, b.CreateNot(is_integral(b.CreateFMul(y, o.c(0.5)))));
  Value* x_neg = b.CreateICmpSLT(o.to_bits(x), o.i(0));
  Value* r = b.CreateSelect(b.CreateAnd(x_neg, y_odd), b.CreateFNeg(mag), mag);

  Value* x_neg_finite = b.CreateAnd(b.CreateFCmpOLT(x, o.c(0.0)), b.CreateFCmpONE(ax, o.c(kInf)));
  r = b.CreateSelect(b.CreateAnd(x_neg_finite, b.CreateNot(y_int)), o.c(kNaN), r);

  Value* unit_inf = b.CreateAnd(b.CreateFCmpOEQ(ax, o.c(1.0)),
                                b.CreateFCmpOEQ(o.call(llvm::Intrinsic::fabs, y), o.c(kInf)));
  Value* one =
      b.CreateOr(unit_inf, b.CreateOr(b.CreateFCmpOEQ(x, o.c(1.0)), b.CreateFCmpOEQ(y, o.c(0.0))));
  return b.CreateSelect(one, o.c(1.0), r);
}

Value* emit_random_uniform_seed_value(llvm::IRBuilderBase& b, Value* counter, Value* seed,
                                      Type* result_type) {
  auto [m, o] = random_bits(b, counter, seed, result_type, "emit_random_uniform");
  return b.CreateFMul(b.CreateSIToFP(m, o.ft), o.c(o.f64 ? 0x1p-53 : 0x1p-24));
}

Value* emit_random_normal_seed_value(llvm::IRBuilderBase& b, Value* counter, Value* seed,
                                     Type* result_type) {
  auto [m, o] = random_bits(b, counter, seed, result_type, "emit_random_normal");
  Value* v = symmetric_open_unit(o, m);
  return b.CreateFMul(erfinv_impl(o, v), o.c(0x1.6a09e667f3bcdp+0));
}

// 2u' - 1 = (2 Phi(-2) - 1) + 2u (Phi(2) - Phi(-2)) = erf(sqrt 2) (2u - 1), so the
// truncation is one multiply of the normal's erfinv argument. The clamp absorbs
// the rounding of erf(sqrt 2) at the edges.
Value* emit_truncated_normal_seed_value(llvm::IRBuilderBase& b, Value* counter, Value* seed,
                                        Type* result_type) {
  auto [m, o] = random_bits(b, counter, seed, result_type, "emit_truncated_normal");
  Value* v = b.CreateFMul(symmetric_open_unit(o, m), o.c(0x1.e8b4307d3627ap-1));
  return o.clamp(b.CreateFMul(erfinv_impl(o, v), o.c(0x1.6a09e667f3bcdp+0)), -2.0, 2.0);
}

Value* emit_random_uniform(llvm::IRBuilderBase& b, Value* counter, uint64_t seed,
                           Type* result_type) {
  return emit_random_uniform_seed_value(b, counter, b.getInt64(seed), result_type);
}

Value* emit_random_normal(llvm::IRBuilderBase& b, Value* counter, uint64_t seed,
                          Type* result_type) {
  return emit_random_normal_seed_value(b, counter, b.getInt64(seed), result_type);
}

Value* emit_truncated_normal(llvm::IRBuilderBase& b, Value* counter, uint64_t seed,
                             Type* result_type) {
  return emit_truncated_normal_seed_value(b, counter, b.getInt64(seed), result_type);
}

}  // namespace flowjit::codegen
