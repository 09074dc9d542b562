// Elementary functions and counter-based random numbers emitted as plain LLVM IR.
//
// Contract shared by every function below:
//  - The argument `x` (and `y` for emit_pow) has type float, double, or a fixed
//    vector of either, of any width; the result has the same type. All lanes are
//    independent and the emitted code is branch-free.
//  - Nothing calls libm. The code uses arithmetic, compares, selects, bit casts,
//    integer ops and intrinsics that x86-64 with AVX-512 lowers to one or a few
//    instructions (fma, fabs, floor, roundeven, sqrt, copysign, minnum, maxnum),
//    so a loop that inlines these functions vectorizes. llvm.fma is one instruction
//    only where the target has FMA (x86-64-v3 and later); elsewhere LLVM lowers
//    it to a call to fma/fmaf.
//  - The scalar and every vector form of a function give bit-identical results.
//  - Errors below are the largest measured against the exact value, in ulps:
//    float over every input in the stated range (a one-off sweep; the test
//    samples 1e6 of them), double on about 2^18 samples. The test prints its
//    maxima. Special values follow C: NaN in gives NaN out.
//
// Counter-based random numbers: `counter` is i64 or a vector of i64 and
// `result_type` is float/double or the vector of the same width. Each element is
// a pure function of (counter, seed), so a loop over elements stays parallel.
// The generator is Philox-4x32-10 (Salmon et al., SC'11) with key = (seed low 32
// bits, seed high 32 bits) and counter block = (counter low 32, counter high 32,
// 0, 0); w0, w1 are its first two output words. The seed is a uint64_t
// constant of the code or an i64 scalar Value (a constant, or one the code
// reads at run time); both give the same numbers.
#pragma once

#include <cstdint>

namespace llvm {
class IRBuilderBase;
class Type;
class Value;
}  // namespace llvm

namespace flowjit::codegen {

// e^x. float 1.06 ulp on [-104, 89] (subnormal results included), double
// 0.97 ulp. Overflow gives +inf, underflow goes through the subnormals to 0;
// exp(-inf) = 0, exp(+inf) = +inf.
llvm::Value* emit_exp(llvm::IRBuilderBase& b, llvm::Value* x);

// Natural logarithm, subnormal inputs included. float 0.83 ulp, double 0.63 ulp.
// log(+-0) = -inf, log(x < 0) = NaN, log(+inf) = +inf.
llvm::Value* emit_log(llvm::IRBuilderBase& b, llvm::Value* x);

// Hyperbolic tangent; relative accuracy is kept near 0 (tanh(x) = x for tiny x,
// tanh(-0) = -0). float 1.93 ulp, double 1.24 ulp. tanh(+-inf) = +-1.
llvm::Value* emit_tanh(llvm::IRBuilderBase& b, llvm::Value* x);

// 1 / (1 + e^-x), computed as e^x / (1 + e^x) for x < 0 so that the result keeps
// its relative accuracy for large negative x. float 1.49 ulp on [-100, 100],
// double 1.31 ulp. sigmoid(+inf) = 1, sigmoid(-inf) = 0.
llvm::Value* emit_sigmoid(llvm::IRBuilderBase& b, llvm::Value* x);

// Sine and cosine. float 1.56 ulp for |x| <= 8192, double 1.45 ulp for
// |x| <= 1e5; beyond, the Cody-Waite reduction slowly loses accuracy.
// sin(+-inf) = cos(+-inf) = NaN.
llvm::Value* emit_sin(llvm::IRBuilderBase& b, llvm::Value* x);
llvm::Value* emit_cos(llvm::IRBuilderBase& b, llvm::Value* x);

// Error function and its complement, computed in double (see mathlib.cpp);
// erfc keeps its relative accuracy in the tail until it underflows (x ~ 27.2
// for double, 10.05 for float). float 0.52 ulp (rounded once from double);
// double erf 1.45 ulp, erfc 6.6 ulp on [-6, 26.5] (worst in the far tail).
// erf(+-0) = +-0, erf(+-inf) = +-1, erfc(-inf) = 2, erfc(+inf) = 0.
llvm::Value* emit_erf(llvm::IRBuilderBase& b, llvm::Value* x);
llvm::Value* emit_erfc(llvm::IRBuilderBase& b, llvm::Value* x);

// Inverse error function on (-1, 1) (M. Giles' polynomials). Relative error
// where the result is normal: float 2.5e-7, double 4.9e-16.
// erfinv(+-1) = +-inf, erfinv(|x| > 1) = NaN.
llvm::Value* emit_erfinv(llvm::IRBuilderBase& b, llvm::Value* x);

// x^y with C pow semantics: pow(x, +-0) = 1 and pow(1, y) = 1 for any x, y
// (NaN included); pow(+-0, y) is +-0 or +-inf by the sign of y and the parity of
// an integral y; x < 0 with integral y takes its sign from the parity of y, with
// non-integral finite y gives NaN; pow(-1, +-inf) = 1; other NaNs propagate.
// float is computed in double and rounded (0.5 ulp measured). double is
// exp(y * log|x|) in double, so the relative error grows as |y log x| * 2^-53:
// 7.7e-15 for x in [1e-3, 1e3], y in [-10, 10].
llvm::Value* emit_pow(llvm::IRBuilderBase& b, llvm::Value* x, llvm::Value* y);

// Uniform on [0, 1): float (w0 >> 8) * 2^-24; double
// (((w0 << 32) | w1) >> 11) * 2^-53.
llvm::Value* emit_random_uniform(llvm::IRBuilderBase& b, llvm::Value* counter, uint64_t seed,
                                 llvm::Type* result_type);
llvm::Value* emit_random_uniform_seed_value(llvm::IRBuilderBase& b, llvm::Value* counter,
                                            llvm::Value* seed, llvm::Type* result_type);

// Standard normal by the inverse CDF: sqrt(2) * erfinv(2u - 1) with u on the
// open interval (0, 1): u = ((w0 >> 8) + 0.5) * 2^-24 for float and
// ((((w0 << 32) | w1) >> 11) + 0.5) * 2^-53 for double. 2u - 1 is formed exactly.
llvm::Value* emit_random_normal(llvm::IRBuilderBase& b, llvm::Value* counter, uint64_t seed,
                                llvm::Type* result_type);
llvm::Value* emit_random_normal_seed_value(llvm::IRBuilderBase& b, llvm::Value* counter,
                                           llvm::Value* seed, llvm::Type* result_type);

// The standard normal truncated to [-2, 2] (TensorFlow's truncated_normal
// distribution) without rejection: u' = Phi(-2) + u * (Phi(2) - Phi(-2)) with u
// as in emit_random_normal, x = sqrt(2) * erfinv(2u' - 1). Every |x| <= 2.
llvm::Value* emit_truncated_normal(llvm::IRBuilderBase& b, llvm::Value* counter, uint64_t seed,
                                   llvm::Type* result_type);
llvm::Value* emit_truncated_normal_seed_value(llvm::IRBuilderBase& b, llvm::Value* counter,
                                              llvm::Value* seed, llvm::Type* result_type);

}  // namespace flowjit::codegen
