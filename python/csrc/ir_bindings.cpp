// Bindings: error translation, dtypes, the op enum and IR node construction.
#include <pybind11/stl.h>

#include "ir/error.h"
#include "ir/graph.h"
#include "ir/printer.h"
#include "jit/cache.h"
#include "python/csrc/bindings.h"

namespace flowjit::python {

namespace {

py::object g_internal_error;

void translate(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const UserError& e) {
    // Messages may quote paths and file texts, which need not be UTF-8.
    std::string what = jit::printable_text(e.what());
    switch (e.kind()) {
      case ErrorKind::Type:
        PyErr_SetString(PyExc_TypeError, what.c_str());
        break;
      case ErrorKind::Value:
        PyErr_SetString(PyExc_ValueError, what.c_str());
        break;
      case ErrorKind::NotImplemented:
        PyErr_SetString(PyExc_NotImplementedError, what.c_str());
        break;
      case ErrorKind::Runtime:
        PyErr_SetString(PyExc_RuntimeError, what.c_str());
        break;
      case ErrorKind::Index:
        PyErr_SetString(PyExc_IndexError, what.c_str());
        break;
      case ErrorKind::FloatingPoint:
        PyErr_SetString(PyExc_FloatingPointError, what.c_str());
        break;
      case ErrorKind::Memory:
        PyErr_SetString(PyExc_MemoryError, what.c_str());
        break;
    }
  } catch (const InternalError& e) {
    PyErr_SetString(g_internal_error.ptr(), jit::printable_text(e.what()).c_str());
  }
}

ir::AttrValue to_attr(const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) return v.cast<int64_t>();
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<ir::DType>(v)) return v.cast<ir::DType>();
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    ir::IntList out;
    for (auto item : v) {
      if (!py::isinstance<py::int_>(item) || py::isinstance<py::bool_>(item))
        throw_user(ErrorKind::Type, "expected a list of ints, got an element of type ",
                   std::string(py::str(item.get_type().attr("__name__"))));
      out.push_back(item.cast<int64_t>());
    }
    return out;
  }
  throw_user(ErrorKind::Type, "unsupported attribute value of type ",
             std::string(py::str(v.get_type().attr("__name__"))));
}

py::object attr_to_py(const ir::AttrValue& v) {
  return std::visit([](const auto& x) -> py::object { return py::cast(x); }, v);
}

}  // namespace

[[noreturn]] void rethrow_as_python(std::exception_ptr e) {
  translate(e);
  throw py::error_already_set();
}

// numpy has no bfloat16: ml_dtypes provides it (JAX and TensorFlow use it).
py::dtype bfloat16_numpy_dtype() {
  py::module_ m;
  try {
    m = py::module_::import("ml_dtypes");
  } catch (py::error_already_set&) {
    throw_user(ErrorKind::NotImplemented,
               "bfloat16 arrays need the ml_dtypes package (numpy has no bfloat16): "
               "pip install ml_dtypes");
  }
  return py::dtype::from_args(m.attr("bfloat16"));
}

py::dtype to_numpy_dtype(ir::DType t) {
  switch (t) {
    case ir::DType::Bool:
      return py::dtype::of<bool>();
    case ir::DType::Int8:
      return py::dtype::of<int8_t>();
    case ir::DType::UInt8:
      return py::dtype::of<uint8_t>();
    case ir::DType::Int32:
      return py::dtype::of<int32_t>();
    case ir::DType::Int64:
      return py::dtype::of<int64_t>();
    case ir::DType::Float32:
      return py::dtype::of<float>();
    case ir::DType::Float64:
      return py::dtype::of<double>();
    case ir::DType::Float16:
      return py::dtype("float16");
    case ir::DType::BFloat16:
      return bfloat16_numpy_dtype();
  }
  throw InternalError("bad dtype");
}

bool numpy_dtype_matches(const py::dtype& d, ir::DType t) {
  char k = d.kind();
  int sz = static_cast<int>(d.itemsize());
  // Native byte order: '=' (native), '|' (not applicable) or '<' here.
  char order = d.byteorder();
  if (order == '>') return false;
  switch (t) {
    case ir::DType::Bool:
      return k == 'b';
    case ir::DType::Int8:
      return k == 'i' && sz == 1;
    case ir::DType::UInt8:
      return k == 'u' && sz == 1;
    case ir::DType::Int32:
      return k == 'i' && sz == 4;
    case ir::DType::Int64:
      return k == 'i' && sz == 8;
    case ir::DType::Float32:
      return k == 'f' && sz == 4;
    case ir::DType::Float64:
      return k == 'f' && sz == 8;
    case ir::DType::Float16:
      return k == 'f' && sz == 2;
    case ir::DType::BFloat16:
      // ml_dtypes' bfloat16 (what JAX and TensorFlow hand out): a 2-byte
      // numpy extension type named "bfloat16".
      return k == 'V' && sz == 2 && std::string(py::str(d)) == "bfloat16";
  }
  return false;
}

ir::DType from_numpy_dtype(const py::dtype& d) {
  for (int i = 0; i < ir::kNumDTypes; ++i) {
    auto t = static_cast<ir::DType>(i);
    if (numpy_dtype_matches(d, t)) return t;
  }
  throw_user(ErrorKind::Type, "numpy dtype ", std::string(py::str(d)),
             " has no flowjit equivalent");
}

void register_errors(py::module_& m) {
  g_internal_error = py::reinterpret_borrow<py::object>(
      py::exception<InternalError>(m, "InternalError", PyExc_RuntimeError).ptr());
  py::register_exception_translator(&translate);
}

void register_ir(py::module_& m) {
  py::enum_<ir::DType> dt(m, "DType");
#define DTYPE(E, name, sname, bytes, kind) dt.value(name, ir::DType::E);
#include "ir/dtypes.def"
  m.def("dtype_bytes", [](ir::DType t) { return ir::dtype_bytes(t); });
  m.def("numpy_dtype", &to_numpy_dtype);
  m.def("dtype_from_numpy", [](py::object d) { return from_numpy_dtype(py::dtype::from_args(d)); });

  // The op enum, generated from the one op list.
  py::enum_<ir::OpKind> ops(m, "OpKind");
#define OP(E, name, arity, traits, grad) ops.value(name, ir::OpKind::E);
#include "ir/ops.def"

  py::class_<ir::SourceLoc>(m, "SourceLoc")
      .def_readonly("file", &ir::SourceLoc::file)
      .def_readonly("line", &ir::SourceLoc::line);

  py::class_<PyNode>(m, "Node")
      .def_property_readonly("op", [](const PyNode& n) { return n.ref->op(); })
      .def_property_readonly("op_name",
                             [](const PyNode& n) { return std::string(ir::op_name(n.ref->op())); })
      .def_property_readonly("shape",
                             [](const PyNode& n) {
                               py::tuple t(n.ref->rank());
                               for (int i = 0; i < n.ref->rank(); ++i) t[i] = n.ref->shape()[i];
                               return t;
                             })
      .def_property_readonly("dtype", [](const PyNode& n) { return n.ref->dtype(); })
      .def_property_readonly("inputs",
                             [](const PyNode& n) {
                               std::vector<PyNode> out;
                               for (auto& i : n.ref->inputs()) out.push_back({i});
                               return out;
                             })
      .def("attr",
           [](const PyNode& n, const std::string& key) -> py::object {
             const ir::AttrValue* v = n.ref->attrs().find(key);
             if (!v) return py::none();
             return attr_to_py(*v);
           })
      .def("same", [](const PyNode& a, const PyNode& b) { return a.ref == b.ref; })
      .def("__repr__", [](const PyNode& n) {
        return "<flowjit IR node " + std::string(ir::op_name(n.ref->op())) + " : " +
               n.ref->type().str() + ">";
      });

  // make_node(op, inputs, attrs, file, line): the checking factory.
  m.def(
      "make_node",
      [](ir::OpKind op, const std::vector<PyNode>& inputs, const py::dict& attrs,
         const std::string& file, int line) {
        std::vector<ir::NodeRef> ins;
        for (auto& i : inputs) ins.push_back(i.ref);
        ir::Attrs a;
        for (auto [k, v] : attrs) a.set(k.cast<std::string>(), to_attr(v));
        return PyNode{ir::make_node(op, std::move(ins), std::move(a), ir::SourceLoc{file, line})};
      },
      py::arg("op"), py::arg("inputs"), py::arg("attrs"), py::arg("file") = "",
      py::arg("line") = 0);

  // The placement index make_node gives ops while a placement scope is open
  // in a job body (ir::SourceLoc::placement; -1: none).
  m.def("current_placement", &ir::current_placement);
  m.def("set_current_placement", &ir::set_current_placement, py::arg("placement"));

  m.def(
      "print_graph",
      [](const std::vector<PyNode>& params, const std::vector<PyNode>& outputs,
         const std::string& name, bool locations) {
        ir::Graph g;
        g.name = name;
        for (auto& p : params) g.params.push_back(p.ref);
        for (auto& o : outputs) {
          if (ir::is_effect(o.ref->op())) {
            g.effects.push_back(o.ref);
          } else {
            g.outputs.push_back(o.ref);
          }
        }
        return ir::print_graph(g, ir::PrintOptions{locations});
      },
      py::arg("params"), py::arg("outputs"), py::arg("name") = "job", py::arg("locations") = false);
}

}  // namespace flowjit::python
