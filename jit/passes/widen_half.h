// widen_half: runs the kernels that have no half-precision form in float32.
//
// A matmul or convolution (forward or gradient) or collective whose dtype is
// float16 or bfloat16 becomes the same op on float32 operands, its inputs
// converted up and its result rounded back: float32 accumulation, one
// rounding of each output element. Elementwise work and reductions need no
// rewrite: their kernels read and write the half types and compute in
// float32 registers (codegen/emit.h, from_mem/to_mem). The casts are
// elementwise, so fusion folds them into the producers and consumers.
//
// `f16_matmuls`, `bf16_matmuls`: matmuls of that type stay in it, for a
// target that computes them natively (the GPU's half tensor cores,
// codegen/nvptx/matmul.cpp; a CPU's AVX512-BF16 dot products,
// codegen/cpu/matmul.cpp), which accumulate in float32 and round once, as
// the widened form does.
#pragma once

#include "ir/graph.h"

namespace flowjit::jit {

ir::Graph widen_half(const ir::Graph& g, bool f16_matmuls = false, bool bf16_matmuls = false);

}  // namespace flowjit::jit
