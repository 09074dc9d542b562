// The session's GPUs as the bindings use them: devices opened once and
// their copies of the session's variables. (A GPU job's runs go through
// runtime::Program like every other job's.)
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "jit/compile.h"
#include "runtime/cuda/executable.h"

namespace flowjit::python {

namespace py = pybind11;

void register_gpu(py::module_& m);

// Points `s` at GPU `ordinal` of the session: the device (opened on first
// use and kept) and its copies of the session's variables (a fresh set per
// session generation, so a cleared session starts with none on the GPU).
// UserError(Runtime) saying why when there is no driver (libcuda.so.1) or
// no such GPU. The caller holds the session's run mutex.
void set_gpu_target(jit::CompileSettings& s, int ordinal);

// GPUs `ordinals` of this process for one job spread over them: a store per
// GPU for the variables' replicas, the replicas' copies on each GPU, and an NcclCommunicator over
// the session's Devices. One group per set of GPUs and session generation. UserError(Runtime)
// naming what is missing (driver, GPU, NCCL). The caller holds the session's run mutex.
// In a session over several processes (`processes` > 1) every process
// passes its own GPUs (any number): the communicator joins all of them
// (this process's first GPU is global rank `first_rank` of `world`, from the
// placement), from an NCCL id process 0 makes and the session's
// communicator carries to the others (every CPU device of every process
// takes part in that all_gather), so every process must make the same
// groups in the same order (as they call the same jobs).
struct GpuGroup {
  std::vector<std::shared_ptr<runtime::DeviceState>> copies;  // cuda::DeviceVariables
  std::vector<std::unique_ptr<runtime::VariableStore>> stores;
  std::shared_ptr<runtime::Communicator> comm;
  int first_rank = 0;
  bool several_processes = false;
  std::vector<runtime::VariableStore*> store_ptrs() const;
};
// Over several processes, this process's GPUs are NCCL ranks `first_rank`
// .. of `world` (processes may hold different numbers of the job's GPUs).
std::shared_ptr<GpuGroup> gpu_group(const std::vector<int>& ordinals, int processes = 1,
                                    int first_rank = 0, int world = 0);

}  // namespace flowjit::python
