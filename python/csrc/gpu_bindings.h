// The session's GPUs as the bindings use them: devices opened once, their
// copies of the session's variables, and how a GPU job's runs are submitted
// and completed (synchronously, or through the worker and the callback
// thread).
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <memory>
#include <mutex>
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

// The runs of one GPU job. At most one is in flight (the executable has one
// set of staging buffers); it is completed by whoever needs it first: the
// callback thread delivering its results, or the next submit of the same
// job, which then waits only for the GPU. So the worker never waits for the
// callback thread, and never for the GPU beyond a back-to-back run of the
// same job.
class GpuRunner {
 public:
  struct Ticket {
    std::vector<void*> outputs;  // where the results go (kept alive by the caller)
    bool done = false;
    std::exception_ptr error;
  };

  explicit GpuRunner(std::shared_ptr<runtime::cuda::CudaExecutable> exe) : exe_(std::move(exe)) {}

  // Enqueues a run: inputs are staged before it returns. The caller holds
  // the session's run mutex (variables move between host and device here).
  std::shared_ptr<Ticket> submit(const void* const* inputs, std::vector<void*> outputs);
  // Waits for the ticket's run through its event and copies its results
  // out (nothing when the next submit did so already); rethrows its error.
  // Needs no run mutex, so the callback thread calls it without blocking
  // the worker.
  void complete(const std::shared_ptr<Ticket>& t);
  // submit + complete, for synchronous calls.
  void run(const void* const* inputs, void* const* outputs);

  const runtime::cuda::CudaExecutable& executable() const { return *exe_; }

 private:
  void finish_locked(Ticket& t);  // requires mu_

  std::shared_ptr<runtime::cuda::CudaExecutable> exe_;
  std::mutex mu_;
  std::shared_ptr<Ticket> in_flight_;
};

}  // namespace flowjit::python
