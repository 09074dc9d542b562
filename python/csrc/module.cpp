// flowjit._C: the pybind11 module. Thin: IR construction for the tracer, the
// compiler entry point, compiled jobs and the session (variables, async).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/csrc/bindings.h"
#include "python/csrc/gpu_bindings.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "flowjit's C++ core: IR, compiler, runtime";
  flowjit::python::register_errors(m);
  flowjit::python::register_ir(m);
  flowjit::python::register_jobs(m);
  flowjit::python::register_session(m);
  flowjit::python::register_data(m);
  flowjit::python::register_gpu(m);
}
