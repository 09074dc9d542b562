// The NVPTX backend: lowers kernels to one LLVM module for nvptx64-nvidia-cuda,
// links libdevice, emits PTX and (when ptxas is installed) a cubin. No LLVM
// types in this header.
//
// Kernel ABI (what the runtime must provide):
//  * one `.entry` per codegen::Kernel, named Kernel::name, whose parameters
//    are the kernel's argument base addresses (global memory, u64), in order;
//  * every argument base is 16-byte aligned (cuMemAlloc gives 256; arena
//    offsets are multiples of 64), which the 128-bit vector accesses rely on;
//  * the launch uses exactly the grid, block and shared bytes that compile()
//    wrote into the kernel's launch record (abi::GpuGrid). The kernels loop
//    (grid-stride) over their work, so the grid may be capped.
//  Every extent and stride is a compile-time constant of the kernel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "abi/launch.h"
#include "codegen/kernel.h"
#include "codegen/target.h"

namespace flowjit::codegen::nvptx {

using codegen::MathLibrary;

// The SMs flowjit generates code for (compute capability x 10), oldest
// first. The only list: support checks, messages and device mapping read it.
inline constexpr int kSupportedSms[] = {70, 72, 75, 80, 86, 87, 89, 90};

struct CompileOptions {
  std::string module_name = "flowjit";
  int sm = 80;  // compute capability x 10: 80, 86, 89, 90 (sm_70 and newer)
  // Tensor cores for float32 matmuls (TF32 inputs, FP32 accumulation, about
  // 10 bits of mantissa per product). Off: an exact FP32 FMA kernel.
  bool allow_tf32 = false;
  MathLibrary math = MathLibrary::Auto;
  bool run_ptxas = true;       // produce a cubin when ptxas is found
  bool want_llvm_ir = false;   // keep the optimized module's text
  std::string libdevice_path;  // "" searches (see find_libdevice)
  std::string ptxas_path;      // "" searches (see find_ptxas)
};

// What the emitter chose for one kernel, for reports and tests (how it is
// launched is in its launch record).
struct KernelNotes {
  std::string mapping;               // thread mapping, e.g. "elementwise x4", "reduce warp"
  uint32_t static_shared_bytes = 0;  // declared by the kernel
};

struct CompiledModule {
  std::string ptx;
  std::vector<char> cubin;         // empty when ptxas was not run or not found
  std::string ptxas_log;           // ptxas' messages (warnings), when it ran
  std::string ptxas_path;          // the ptxas that produced `cubin`
  std::vector<KernelNotes> notes;  // one per kernel, in order
  std::string llvm_ir;             // optimized (if asked)
  std::string target_id;           // part of the disk-cache key: triple, SM, PTX version, options
  std::string math_library;        // "libdevice" or "builtin"
  int ptx_version = 0;             // e.g. 70 for ".version 7.0"
  double seconds_emit = 0, seconds_optimize = 0, seconds_codegen = 0, seconds_ptxas = 0;
};

// Lowers `kernels` into one module, optimizes it at O3 for the SM and emits
// PTX, then a cubin when ptxas is found. `launches` are the plan's launch
// records, one per kernel (fusion's): compile writes each one's GPU grid. Throws InternalError when
// LLVM or ptxas rejects the generated code (a flowjit bug) and UserError for a bad option
// (unsupported SM, libdevice required but missing).
CompiledModule compile(const std::vector<Kernel>& kernels, std::vector<abi::Launch>& launches,
                       const CompileOptions& opts);

// "" when not found. Search order: $FLOWJIT_PTXAS (when set, and nothing else:
// set it empty to run without ptxas), $CUDA_HOME/bin, $CUDA_PATH/bin,
// /usr/local/cuda/bin, then $PATH.
std::string find_ptxas();
// "" when not found. $FLOWJIT_LIBDEVICE (when set, and nothing else), then
// nvvm/libdevice/libdevice.10.bc under $CUDA_HOME, $CUDA_PATH, /usr/local/cuda,
// and /usr/lib/nvidia-cuda-toolkit/libdevice.
std::string find_libdevice();

struct PtxasResult {
  bool ok = false;
  int exit_code = -1;
  std::vector<char> cubin;
  std::string log;  // stdout and stderr
};

// Assembles `ptx` for sm_<sm> with `ptxas` (a path). Never throws for a
// rejected PTX: the result says so, with ptxas' messages.
PtxasResult run_ptxas(const std::string& ptx, int sm, const std::string& ptxas,
                      const std::vector<std::string>& extra_args = {});

// Whether `sm` is in kSupportedSms; "sm_70, sm_72, ..." for messages.
bool is_supported_sm(int sm);
std::string supported_sms_text();

// The SM flowjit generates code for on a device of compute capability
// `device_sm` (x 10): the newest supported one not above it (PTX of an older
// SM runs on newer GPUs through the driver). 0 when the device is older than
// every supported SM.
int codegen_sm(int device_sm);

// The target of a module for `sm`: the key's part (tf32, math, ptxas) and,
// once compiled, what came out (ptx_version > 0 adds "ptx78" after the SM;
// cubin adds "cubin=yes|none" at the end).
TargetId module_target(int sm, bool allow_tf32, const std::string& math, const std::string& ptxas,
                       int ptx_version = 0, const std::string& cubin = "");

}  // namespace flowjit::codegen::nvptx
