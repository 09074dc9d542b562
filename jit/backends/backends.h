// The backends jit/backend.cpp registers: one factory per backend.
#pragma once

#include <memory>

#include "jit/backend.h"

namespace flowjit::jit::backends {

// The host CPU (codegen/cpu, runtime::Executable).
std::unique_ptr<Backend> make_cpu(const JobDescription& job, const Target& target,
                                  const RunDevice& device);
void check_cached_cpu(const CodeObject& code);  // CpuBackend::check_cached
OptimizeOptions cpu_optimize_options(const Target& target);
// NVIDIA GPUs (codegen/nvptx, runtime::cuda::CudaExecutable).
std::unique_ptr<Backend> make_nvptx(const JobDescription& job, const Target& target,
                                    const RunDevice& device);
std::vector<std::string> nvptx_cache_files();  // NvptxBackend::cache_files
OptimizeOptions nvptx_optimize_options(const Target& target);
void check_cached_nvptx(const CodeObject& code);  // NvptxBackend::check_cached

}  // namespace flowjit::jit::backends
