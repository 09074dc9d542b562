// The default session as the bindings see it: the variable store, the run
// lock, the async worker and the callback thread.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/collective.h"
#include "runtime/variables.h"
#include "runtime/work_queue.h"

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

class Session {
 public:
  static Session& get();

  runtime::VariableStore& store() { return store_; }
  std::mutex& run_mutex() { return run_mu_; }
  uint64_t generation() const { return generation_.load(); }

  // Async machinery. submit() queues a job run; each submitted run must end
  // in exactly one deliver(), which queues its callback for the callback
  // thread (the task takes the GIL itself). Back-pressure: at most
  // async_capacity() runs are outstanding (submitted, their callback not yet
  // finished); submit() waits for room with the GIL released, polling for
  // Ctrl-C. Submissions from the callback thread never wait (they could wait
  // only for themselves). post_callback() queues a callback-thread task that
  // belongs to no run (a callback attached after its result arrived); it
  // takes a slot like submit() and frees it when the task has run.
  void submit(runtime::WorkQueue::Task task);
  void deliver(runtime::WorkQueue::Task task);
  void post_callback(runtime::WorkQueue::Task task);
  size_t async_capacity();
  void set_async_capacity(size_t n);  // UserError(Value) when n < 1
  bool on_callback_thread();
  // Waits until queued job runs are done (GIL released, Ctrl-C polled).
  void wait_jobs();
  // Waits for jobs and callbacks, then raises the first recorded error.
  void sync();
  // What a synchronous call does first: sync() when async work is pending
  // (so that it sees every queued update and every error), else only
  // raise_pending().
  void sync_before_call();
  // Records an error (Python exception object) for the next sync point.
  // Requires the GIL.
  void record_error(py::object exc);
  // Raises and clears the first recorded error, if any. Requires the GIL.
  void raise_pending();
  bool has_pending_work();

  // The devices of this process for distributed jobs: `local` devices, the
  // first of global rank `first_rank`, joined by `comm` (of comm->size()
  // ranks over every process). Each device has its own variable store.
  void configure_devices(int local, std::shared_ptr<runtime::Communicator> comm, int first_rank,
                         bool several_processes);
  int local_devices() const { return static_cast<int>(device_stores_.size()); }
  std::vector<runtime::VariableStore*> device_stores();
  std::shared_ptr<runtime::Communicator> communicator() const { return comm_; }
  int first_rank() const { return first_rank_; }
  bool several_processes() const { return several_processes_; }

  void clear();     // waits for work, drops variables, bumps generation
  void shutdown();  // at interpreter exit: finishes work, stops threads

  // [harden] Errors no sync point raised (at exit: printed, then exit status 1).
  std::vector<py::object> take_errors();
  // [harden] os.fork(): before, the forking thread waits until queued jobs
  // and callbacks are done (so no worker holds a lock the child inherits);
  // in the child, whose only thread is the forking one, the worker and
  // callback threads are gone: their queues are abandoned (new ones start
  // on the next async call) and the session's locks are made anew.
  void before_fork();
  void after_fork_in_child();

 private:
  Session() = default;
  void ensure_threads();
  void wait(runtime::WorkQueue& q);
  void take_slot();  // waits for room unless on the callback thread
  void acquire_slot();
  void release_slot();
  void enqueue_callback(runtime::WorkQueue::Task task);

  runtime::VariableStore store_;
  std::vector<std::unique_ptr<runtime::VariableStore>> device_stores_;
  std::shared_ptr<runtime::Communicator> comm_;
  int first_rank_ = 0;
  bool several_processes_ = false;
  std::mutex run_mu_;
  std::atomic<uint64_t> generation_{1};
  std::mutex threads_mu_;
  std::unique_ptr<runtime::WorkQueue> worker_;
  std::unique_ptr<runtime::WorkQueue> callbacks_;
  std::vector<py::object> errors_;  // guarded by the GIL
  bool shut_down_ = false;
  // Never held while taking the GIL (the callback thread releases slots).
  std::mutex slots_mu_;
  std::condition_variable slots_cv_;
  size_t outstanding_ = 0;
  size_t async_capacity_ = 64;
};

// Records the Python exception of an async job or callback for the next sync
// point, noting the job's name on it. Requires the GIL.
void record_async_error(py::error_already_set& e, const std::string& job);
// The same for a C++ exception escaping a callback-thread task.
void record_async_error(std::exception_ptr e, const std::string& job);

}  // namespace flowjit::python
