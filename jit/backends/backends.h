// The backends jit/backend.cpp registers: one factory per backend.
#pragma once

#include <memory>

#include "jit/backend.h"

namespace flowjit::jit::backends {

// The host CPU (codegen/cpu, runtime::Executable).
std::unique_ptr<Backend> make_cpu(const JobDescription& job, const Target& target,
                                  const RunDevice& device);
// NVIDIA GPUs (codegen/nvptx, runtime::cuda::CudaExecutable).
std::unique_ptr<Backend> make_nvptx(const JobDescription& job, const Target& target,
                                    const RunDevice& device);

}  // namespace flowjit::jit::backends
