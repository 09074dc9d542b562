// The default session as the bindings see it: the variable store, the run
// lock, the async worker and the callback thread.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/variables.h"
#include "runtime/work_queue.h"

namespace flowjit::python {

namespace py = pybind11;

class Session {
 public:
  static Session& get();

  runtime::VariableStore& store() { return store_; }
  std::mutex& run_mutex() { return run_mu_; }
  uint64_t generation() const { return generation_.load(); }

  // Async machinery. submit() queues a job run (waits for room, polling for
  // Ctrl-C); deliver() queues a callback for the callback thread, which runs
  // it holding the GIL.
  void submit(runtime::WorkQueue::Task task);
  void deliver(runtime::WorkQueue::Task task);
  // Waits until queued job runs are done (GIL released, Ctrl-C polled).
  void wait_jobs();
  // Waits for jobs and callbacks, then raises the first recorded error.
  void sync();
  // Records an error (Python exception object) for the next sync point.
  // Requires the GIL.
  void record_error(py::object exc);
  // Raises and clears the first recorded error, if any. Requires the GIL.
  void raise_pending();
  bool has_pending_work();

  void clear();      // waits for work, drops variables, bumps generation
  void shutdown();   // at interpreter exit: finishes work, stops threads

 private:
  Session() = default;
  void ensure_threads();
  void wait(runtime::WorkQueue& q);

  runtime::VariableStore store_;
  std::mutex run_mu_;
  std::atomic<uint64_t> generation_{1};
  std::mutex threads_mu_;
  std::unique_ptr<runtime::WorkQueue> worker_;
  std::unique_ptr<runtime::WorkQueue> callbacks_;
  std::vector<py::object> errors_;  // guarded by the GIL
  bool shut_down_ = false;
};

}  // namespace flowjit::python
