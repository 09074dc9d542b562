// Bindings: the default session (runtime::Session waiting the Python way,
// async errors, sync) and runtime knobs.
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>

#include "codegen/cpu/backend.h"
#include "codegen/cpu/peak.h"
#include "ir/diag.h"
#include "ir/error.h"
#include "jit/build_info.h"
#include "jit/cache.h"
#include "python/csrc/bindings.h"
#include "python/csrc/session.h"
#include "runtime/comm/collective.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/distributed.h"
#include "runtime/executable.h"

namespace flowjit::python {

using namespace std::chrono_literals;

runtime::VariableStore& default_store() { return Session::get().store(); }

namespace {
// runtime::Session's waits: each step with the GIL released, Ctrl-C
// polled between steps (KeyboardInterrupt ends the wait).
void wait_releasing_the_gil(const std::function<bool()>& step) {
  while (true) {
    bool done;
    {
      GilRelease release;
      done = step();
    }
    if (done) return;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}
}  // namespace

Session::Session() : runtime::Session(&wait_releasing_the_gil) {}

Session& Session::get() {
  static Session* s = new Session();  // lives until exit; shutdown() stops its threads
  return *s;
}

void record_async_error(py::error_already_set& e, const std::string& job) {
  py::object exc = e.value();
  if (exc.is_none())
    exc =
        py::reinterpret_steal<py::object>(PyObject_CallFunction(PyExc_RuntimeError, "s", e.what()));
  try {
    py::module_::import("flowjit._core.futures").attr("annotate_error")(exc, job);
  } catch (py::error_already_set&) {
    // The exception itself is what matters; a failed note must not lose it.
  }
  Session::get().record_error(exc);
}

void record_async_error(std::exception_ptr e, const std::string& job) {
  try {
    rethrow_as_python(e);
  } catch (py::error_already_set& pe) {
    record_async_error(pe, job);
  }
}

void Session::sync() {
  wait_all();
  raise_pending();
}

void Session::sync_before_call() {
  if (has_pending_work())
    sync();
  else
    raise_pending();
}

void Session::record_error(py::object exc) { errors_.push_back(std::move(exc)); }

void Session::raise_pending() {
  if (errors_.empty()) return;
  // One sync point reports every error recorded before it: the first is
  // raised, the others are counted in its notes (5,000 failed callbacks
  // took 5,000 sync_default_session() calls to clear before).
  py::object e = errors_.front();
  if (errors_.size() > 1) {
    try {
      py::object next = errors_[1];
      std::string note = std::to_string(errors_.size() - 1) +
                         " more error(s) of asynchronous jobs or callbacks were recorded before "
                         "this sync point and are cleared with it; the next was " +
                         py::str(py::type::handle_of(next).attr("__name__")).cast<std::string>() +
                         ": " + py::str(next).cast<std::string>();
      if (py::hasattr(e, "add_note")) e.attr("add_note")(note);
    } catch (py::error_already_set&) {
      // A note that cannot be made must not lose the error itself.
    }
  }
  errors_.clear();
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
  throw py::error_already_set();
}

void Session::clear() {
  sync();
  clear_variables();
}

namespace {
std::mutex g_exit_mu;
std::condition_variable g_exit_cv;
bool g_exiting = false;
std::thread::id g_exit_thread;
int g_retaking = 0;  // threads between the exit check and holding the GIL again
}  // namespace

GilRelease::GilRelease() : state_(PyEval_SaveThread()) {}

GilRelease::~GilRelease() {
  {
    std::unique_lock<std::mutex> lock(g_exit_mu);
    if (g_exiting && std::this_thread::get_id() != g_exit_thread) {
      lock.unlock();
      while (true) std::this_thread::sleep_for(std::chrono::hours(1));  // ends with the process
    }
    ++g_retaking;
  }
  PyEval_RestoreThread(state_);
  std::lock_guard<std::mutex> lock(g_exit_mu);
  --g_retaking;
  g_exit_cv.notify_all();
}

void begin_exit() {
  std::unique_lock<std::mutex> lock(g_exit_mu);
  if (g_exiting) return;
  g_exiting = true;
  g_exit_thread = std::this_thread::get_id();
  if (g_retaking == 0) return;
  // Those threads wait for the GIL we hold: let them have it (bounded).
  lock.unlock();
  PyThreadState* state = PyEval_SaveThread();
  {
    std::unique_lock<std::mutex> wait_lock(g_exit_mu);
    g_exit_cv.wait_for(wait_lock, std::chrono::seconds(10), [] { return g_retaking == 0; });
  }
  PyEval_RestoreThread(state);
}

// ---- diagnostics through logging (ir/diag.h)

namespace {
PyObject* g_log_fn = nullptr;  // flowjit._core.log._from_core, kept for the process

// Hands a C++ diagnostic to Python's logging (logger "flowjit"), from any
// thread: compiles run with the GIL released and kernels compile on the
// pool. Once the interpreter exits (begin_exit, or finalizing) it writes to
// stderr instead, as it does when the call fails.
void diag_to_logging(int level, std::string_view msg) {
  {
    std::lock_guard<std::mutex> lock(g_exit_mu);
    if (g_exiting || g_log_fn == nullptr || !Py_IsInitialized() || _Py_IsFinalizing()) {
      ir::diag_to_stderr(level, msg);
      return;
    }
    ++g_retaking;  // begin_exit waits for us to be done with the GIL
  }
  PyGILState_STATE st = PyGILState_Ensure();
  // A pending exception of this thread (a KeyboardInterrupt the compile's
  // Ctrl-C poll keeps for the binding) survives the call.
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyObject* fn = g_log_fn;  // read with the GIL: set_log_sink may have changed it
  PyObject* r = nullptr;
  if (fn != nullptr) {
    PyObject* text =
        PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()), "replace");
    PyObject* lvl = PyLong_FromLong(level);
    if (text != nullptr && lvl != nullptr) r = PyObject_CallFunctionObjArgs(fn, lvl, text, nullptr);
    Py_XDECREF(text);
    Py_XDECREF(lvl);
  }
  if (r != nullptr) {
    Py_DECREF(r);
  } else {
    // Signal handlers may run inside the call: a Ctrl-C there is tripped
    // again for the compile's own poll to see. Anything else is reported.
    if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
      PyErr_Clear();
      PyErr_SetInterrupt();
    } else if (PyErr_Occurred()) {
      PyErr_WriteUnraisable(fn);  // says why, then the line itself
    }
    ir::diag_to_stderr(level, msg);
  }
  PyErr_Restore(type, value, trace);
  PyGILState_Release(st);
  std::lock_guard<std::mutex> lock(g_exit_mu);
  --g_retaking;
  g_exit_cv.notify_all();
}
}  // namespace

void Session::shutdown() {
  begin_exit();
  runtime::Session::shutdown();
}

// ---- [harden] exit and fork

std::vector<py::object> Session::take_errors() {
  std::vector<py::object> out;
  out.swap(errors_);
  return out;
}

namespace {

bool g_failed_exit = false;
// After finalization (Py_AtExit): the process exits with status 1.
void exit_failed() {
  std::fflush(nullptr);
  std::_Exit(1);
}

py::array variable_value(const std::string& name) {
  Session::get().wait_jobs();
  // Looked up under the run lock: clear_default_session() frees variables
  // under it.
  std::lock_guard<std::mutex> lock(Session::get().run_mutex());
  runtime::VariableStorage* v = default_store().find(name);
  if (!v) throw_user(ErrorKind::Value, "no variable named '", name, "' in the session");
  std::vector<py::ssize_t> shape(v->type.shape.begin(), v->type.shape.end());
  py::array out(to_numpy_dtype(v->type.dtype), shape);
  runtime::sync_host(*v);
  std::memcpy(out.mutable_data(), v->ptr(), static_cast<size_t>(v->type.bytes()));
  return out;
}

void set_variable_value(const std::string& name, const py::array& value) {
  Session::get().wait_jobs();
  std::lock_guard<std::mutex> lock(Session::get().run_mutex());
  runtime::VariableStorage* v = default_store().find(name);
  if (!v) throw_user(ErrorKind::Value, "no variable named '", name, "' in the session");
  FJ_USER_CHECK(numpy_dtype_matches(value.dtype(), v->type.dtype), ErrorKind::Type, "variable '",
                name, "' is ", ir::dtype_name(v->type.dtype), " but the value is ",
                std::string(py::str(value.dtype())), "; convert it with .astype(np.",
                ir::dtype_name(v->type.dtype), ")");
  ir::Shape shape(value.shape(), value.shape() + value.ndim());
  FJ_USER_CHECK(shape == v->type.shape, ErrorKind::Value, "variable '", name, "' has shape ",
                ir::shape_str(v->type.shape), " but the value has shape ", ir::shape_str(shape));
  py::array c = py::array::ensure(value, py::array::c_style | py::array::forcecast);
  std::memcpy(v->ptr(), c.data(), static_cast<size_t>(v->type.bytes()));
  runtime::mark_host_written(*v);
  v->initialized = true;
}

}  // namespace

void register_session(py::module_& m) {
  m.def(
      "configure_devices",
      [](int local) {
        FJ_USER_CHECK(local >= 1, ErrorKind::Value, "at least one device is needed, got ", local);
        Session& s = Session::get();
        if (s.local_devices() == local && s.communicator() && !s.several_processes()) return;
        s.configure_devices(local, runtime::make_thread_communicator(local), 0, false);
      },
      py::arg("local"));
  m.def(
      "configure_processes",
      [](int local, int rank, int processes, const std::string& addr, int port, double timeout) {
        FJ_USER_CHECK(local >= 1, ErrorKind::Value, "at least one device is needed, got ", local);
        runtime::GlooOptions o;
        o.process_rank = rank;
        o.num_processes = processes;
        o.local_devices = local;
        o.master_addr = addr;
        o.port = port;
        o.timeout_seconds = timeout;
        o.tag = "session";
        std::shared_ptr<runtime::Communicator> comm;
        {
          GilRelease release;  // the rendezvous waits for the other processes
          comm = runtime::make_gloo_communicator(o);
        }
        Session::get().configure_devices(local, std::move(comm), rank * local, processes > 1);
      },
      py::arg("local"), py::arg("rank"), py::arg("processes"), py::arg("addr"), py::arg("port"),
      py::arg("timeout"));
  m.def("device_info", [] {
    Session& s = Session::get();
    py::dict d;
    d["local_devices"] = s.local_devices();
    d["ranks"] = s.communicator() ? s.communicator()->size() : 0;
    d["first_rank"] = s.first_rank();
    d["several_processes"] = s.several_processes();
    d["communicator"] = s.communicator() ? s.communicator()->describe() : std::string();
    return d;
  });
  m.def("variable_names", [] {
    std::vector<std::string> out;
    std::lock_guard<std::mutex> lock(Session::get().run_mutex());  // against clear()
    for (auto* v : default_store().all()) out.push_back(v->name);
    return out;
  });
  m.def("variable_info", [](const std::string& name) -> py::object {
    std::lock_guard<std::mutex> lock(Session::get().run_mutex());  // against clear()
    runtime::VariableStorage* v = default_store().find(name);
    if (!v) return py::none();
    py::tuple shape(v->type.rank());
    for (int i = 0; i < v->type.rank(); ++i) shape[i] = v->type.shape[i];
    return py::make_tuple(shape, v->type.dtype, v->trainable, v->initialized);
  });
  m.def(
      "create_variable",
      [](const std::string& name, const std::vector<int64_t>& shape, ir::DType dt, bool trainable) {
        bool created = false;
        default_store().get_or_create(name, ir::TensorType{dt, shape}, trainable, &created);
        return created;
      },
      py::arg("name"), py::arg("shape"), py::arg("dtype"), py::arg("trainable"));
  m.def("mark_initialized", [](const std::string& name) {
    std::lock_guard<std::mutex> lock(Session::get().run_mutex());
    if (auto* v = default_store().find(name)) v->initialized = true;
  });
  m.def("variable_value", &variable_value);
  m.def("set_variable_value", &set_variable_value);
  m.def("session_generation", [] { return Session::get().generation(); });
  m.def("clear_session", [] { Session::get().clear(); });
  m.def("sync_session", [] { Session::get().sync(); });
  m.def("shutdown_session", [] { Session::get().shutdown(); });
  m.def("record_async_error", [](py::object e) { Session::get().record_error(std::move(e)); });
  m.def(
      "post_callback",
      [](py::object fn, const std::string& job) {
        // Runs fn() on the callback thread, after the callbacks already
        // queued; an exception is kept for the next sync point.
        auto holder = std::make_shared<py::object>(std::move(fn));
        Session::get().post_callback([holder, job]() {
          py::gil_scoped_acquire gil;
          try {
            (*holder)();
          } catch (py::error_already_set& e) {
            record_async_error(e, job);
          } catch (...) {
            record_async_error(std::current_exception(), job);
          }
          *holder = py::object();  // released with the GIL held
        });
      },
      py::arg("fn"), py::arg("job"));
  m.def("async_capacity", [] { return Session::get().async_capacity(); });
  m.def(
      "set_async_capacity",
      [](int64_t n) {
        FJ_USER_CHECK(n >= 1, ErrorKind::Value, "async capacity must be at least 1, got ", n);
        Session::get().set_async_capacity(static_cast<size_t>(n));
      },
      py::arg("n"));
  m.def("raise_pending_errors", [] { Session::get().raise_pending(); });
  // [harden] exit and fork (python/flowjit/__init__.py).
  m.def("take_pending_errors", [] { return Session::get().take_errors(); });
  m.def("fail_exit_status", [] {
    if (!g_failed_exit && Py_AtExit(&exit_failed) == 0) g_failed_exit = true;
  });
  // Diagnostics of the C++ core go to fn(level, message): flowjit._core.log.
  m.def(
      "set_log_sink",
      [](py::object fn) {
        PyObject* old = g_log_fn;
        g_log_fn = fn.is_none() ? nullptr : fn.inc_ref().ptr();
        ir::set_diag_sink(g_log_fn ? &diag_to_logging : nullptr);
        Py_XDECREF(old);
      },
      py::arg("fn"));
  m.def("before_fork", [] { Session::get().before_fork(); });
  m.def("after_fork_in_child", [] { Session::get().after_fork_in_child(); });

  m.def("test_comm_delay_stats", [] {
    runtime::TestDelayStats d = runtime::test_delay_stats();
    py::dict r;
    r["messages"] = d.messages;
    r["injected_ms"] = d.injected_ms;
    r["slept_ms"] = d.slept_ms;
    return r;
  });
  m.def("set_test_comm_delay_ms", &runtime::set_test_delay_ms, py::arg("ms"));
  m.def("num_threads", &runtime::num_threads);
  m.def("set_num_threads", &runtime::set_num_threads);
  m.def(
      "measure_fma_peak",
      [](double seconds) {
        codegen::cpu::PeakResult r;
        {
          GilRelease release;
          r = codegen::cpu::measure_fma_peak(seconds);
        }
        py::dict d;
        d["gflops_per_thread"] = r.gflops_per_thread;
        d["lanes"] = r.lanes;
        d["accumulators"] = r.accumulators;
        return d;
      },
      py::arg("seconds") = 0.5);
  m.def("assembly_from_ir", &codegen::cpu::assembly_from_ir);
  // An x86-64 CPU name for code made elsewhere (flowjit.export): its target
  // string and whether this host runs its code. UserError for unknown names.
  m.def("cpu_target", [](const std::string& cpu) {
    return py::make_tuple(codegen::cpu::target_id_for(cpu).str(), codegen::cpu::host_runs(cpu));
  });
  m.def("build_info", [] {
    py::dict d;
    d["version"] = jit::flowjit_version();
    d["build_id"] = jit::flowjit_build_id();
    d["binary_id"] = jit::loaded_binary_id();  // with build_id, in every disk-cache key (cheap)
    d["llvm_version"] = jit::llvm_version();
    d["target"] = codegen::cpu::host_target_id().str();
    d["vector_bits"] = codegen::cpu::host_vector_bits();
    // bfloat16 matmuls on the host's vdpbf16ps (AVX512-BF16), else in float32.
    d["bf16_matmuls"] = codegen::cpu::bf16_matmuls("");
    return d;
  });
}

}  // namespace flowjit::python
