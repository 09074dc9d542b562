// Shared declarations of the binding units of flowjit._C.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>

#include "ir/node.h"
#include "runtime/variables.h"

namespace flowjit::python {

namespace py = pybind11;

void register_errors(py::module_& m);
void register_ir(py::module_& m);
void register_jobs(py::module_& m);
void register_session(py::module_& m);
void register_data(py::module_& m);

// An IR node handle as Python sees it.
struct PyNode {
  ir::NodeRef ref;
};

// numpy dtype <-> IR dtype.
py::dtype to_numpy_dtype(ir::DType t);
bool numpy_dtype_matches(const py::dtype& d, ir::DType t);
ir::DType from_numpy_dtype(const py::dtype& d);  // throws TypeError

// The process-wide default session's variable store.
runtime::VariableStore& default_store();

// Rethrows a C++ exception as the matching Python exception (for errors
// raised on worker threads and kept for later).
[[noreturn]] void rethrow_as_python(std::exception_ptr e);

}  // namespace flowjit::python
