// The default session as the bindings see it: runtime::Session with the
// GIL released while it waits, and the errors of async work.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/session.h"

namespace flowjit::python {

namespace py = pybind11;

// Releases the GIL for a blocking section, as py::gil_scoped_release does,
// but safe for daemon threads at interpreter exit. A thread that retakes the
// GIL once the interpreter finalizes is ended by pthread_exit, and from a C++
// destructor (noexcept) that is std::terminate: "terminate called without an
// active exception", SIGABRT. So once begin_exit() has run, any other thread
// leaving a GilRelease never touches Python again: it parks until the
// process ends. begin_exit() lets threads that were already retaking the GIL
// finish first. The thread that called begin_exit() is exempt.
class GilRelease {
 public:
  GilRelease();
  ~GilRelease();
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};
// At interpreter exit, with the GIL (the atexit hook; Session::shutdown).
void begin_exit();

// The default session: runtime::Session (variables, devices, worker and
// callback thread; runtime/session.h) waiting the Python way (GIL released
// while it waits, Ctrl-C polled), plus the errors of async jobs and
// callbacks, kept as Python exception objects for the next sync point.
class Session : public runtime::Session {
 public:
  static Session& get();

  // Waits for jobs and callbacks, then raises the first recorded error.
  void sync();
  // What a synchronous call does first: sync() when async work is pending
  // (so that it sees every queued update and every error), else only
  // raise_pending().
  void sync_before_call();
  // Records an error (Python exception object) for the next sync point.
  // Requires the GIL.
  void record_error(py::object exc);
  // Raises the first recorded error, if any, with the count of the others
  // in its notes, and clears them all. Requires the GIL.
  void raise_pending();

  void clear();     // sync(), then drops variables and bumps the generation
  void shutdown();  // at interpreter exit: finishes work, stops threads

  // [harden] Errors no sync point raised (at exit: printed, then exit status 1).
  std::vector<py::object> take_errors();

 private:
  Session();
  std::vector<py::object> errors_;  // guarded by the GIL
};

// Records the Python exception of an async job or callback for the next sync
// point, noting the job's name on it. Requires the GIL.
void record_async_error(py::error_already_set& e, const std::string& job);
// The same for a C++ exception escaping a callback-thread task.
void record_async_error(std::exception_ptr e, const std::string& job);

}  // namespace flowjit::python
