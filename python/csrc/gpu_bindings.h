// The session's GPUs as the bindings use them: devices opened once and
// their copies of the session's variables. (A GPU job's runs go through
// runtime::Program like every other job's.)
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

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

}  // namespace flowjit::python
