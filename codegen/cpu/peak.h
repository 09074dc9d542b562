// A generated FMA loop that measures the host's floating-point peak, so
// benchmarks can report kernels as a fraction of what the machine can do.
#pragma once

namespace flowjit::codegen::cpu {

struct PeakResult {
  double gflops_per_thread = 0;  // float32, one thread
  int lanes = 0;                 // float32 lanes per vector
  int accumulators = 0;
};

// JIT-compiles a loop of independent vector FMAs (enough accumulators to
// hide latency) and times it for about `seconds` on the calling thread.
PeakResult measure_fma_peak(double seconds);

}  // namespace flowjit::codegen::cpu
