// Session: what the jobs of a process share at run time. The variable store
// (and one per device of distributed jobs), the run lock, the generation
// that a clear bumps, the async worker that runs queued jobs in call order,
// and the callback thread that delivers their results.
//
// Async contract:
//  * submit() queues a job run on the worker; each submitted run must end in
//    exactly one deliver(), which queues its callback for the callback
//    thread. post_callback() queues a callback-thread task that belongs to
//    no run (a callback attached after its result arrived).
//  * Back-pressure: at most async_capacity() runs and posted callbacks are
//    outstanding (submitted, their callback not yet finished); submit() and
//    post_callback() wait for room. Submissions from the callback thread
//    never wait (they could wait only for themselves), but are counted.
//  * A task that throws does not stop its queue (runtime::WorkQueue keeps
//    the error); the bindings catch what a job or callback raises and report
//    it at the next sync point.
//
// Blocking: every wait (for room, for the queues to drain, for the threads
// to stop) runs as `block(step)`, where step() waits a short while (at most
// ~50 ms) and returns true when the wait is over. The embedding decides what
// happens around each step: Python releases the GIL during it and checks for
// Ctrl-C between steps (throwing there ends the wait). The default steps
// until done.
//
// Thread safety: every member may be called from any thread; the store and
// the device stores are guarded by run_mutex() (runs, clears, reads).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/comm/collective.h"
#include "runtime/variables.h"
#include "runtime/work_queue.h"

namespace flowjit::runtime {

class Session {
 public:
  using Block = std::function<void(const std::function<bool()>& step)>;
  explicit Session(Block block = nullptr);
  virtual ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  VariableStore& store() { return store_; }
  std::mutex& run_mutex() { return run_mu_; }
  uint64_t generation() const { return generation_.load(); }

  void submit(WorkQueue::Task task);
  void deliver(WorkQueue::Task task);
  void post_callback(WorkQueue::Task task);
  size_t async_capacity();
  void set_async_capacity(size_t n);  // UserError(Value) when n < 1
  bool on_callback_thread();
  bool has_pending_work();
  // Waits until queued job runs are done (not from the worker itself).
  void wait_jobs();
  // Waits until queued job runs and then callbacks are done (a callback
  // waiting for callbacks returns at once: it would wait for itself).
  void wait_all();

  // The devices of this process for distributed jobs: `local` devices, the
  // first of global rank `first_rank`, joined by `comm` (of comm->size()
  // ranks over every process). Each device has its own variable store.
  // Waits for queued jobs; variables on the old devices come back to the
  // host first. Bumps the generation (jobs were bound to the old devices).
  void configure_devices(int local, std::shared_ptr<Communicator> comm, int first_rank,
                         bool several_processes);
  int local_devices() const { return static_cast<int>(device_stores_.size()); }
  std::vector<VariableStore*> device_stores();
  std::shared_ptr<Communicator> communicator() const { return comm_; }
  int first_rank() const { return first_rank_; }
  bool several_processes() const { return several_processes_; }

  // Takes the run lock (waiting for a job another thread runs), bumps the
  // generation and drops every variable. The caller waits for queued work
  // first (wait_all), so no queued run finds its variables gone unwarned:
  // runs check the generation under the run lock.
  void clear_variables();
  // Finishes queued work (an interrupted wait drops what has not started),
  // then stops the threads. Later submissions are UserError(Runtime).
  // Returns false when it had already run.
  bool shutdown();

  // os.fork(): before, the forking thread waits until queued jobs and
  // callbacks are done (not from the worker or callback thread, and an
  // interrupted wait forks without waiting); in the child, whose only thread
  // is the forking one, the parent's worker and callback threads are
  // forgotten and the locks made afresh, so the first async call starts new
  // threads.
  void before_fork();
  void after_fork_in_child();

 private:
  void ensure_threads();
  // The worker or callback queue, started if need be; UserError(Runtime) once
  // shut down. Callers keep the reference while they use the queue, so a
  // shutdown on another thread (interpreter exit while daemon threads still
  // call jobs) never destroys a queue under them.
  // The reference is a Lease: until it is dropped, shutdown() waits before it
  // destroys the queues.
  struct Lease {
    Session* session = nullptr;
    std::shared_ptr<WorkQueue> queue;
    Lease(Session* s, std::shared_ptr<WorkQueue> q) : session(s), queue(std::move(q)) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    WorkQueue* operator->() const { return queue.get(); }
  };
  Lease live_queue(bool callbacks);
  std::shared_ptr<WorkQueue> current_queue(bool callbacks);  // null when none
  void wait(WorkQueue& q);
  void take_slot();  // waits for room unless on the callback thread
  void acquire_slot();
  void release_slot();
  void enqueue_callback(WorkQueue::Task task);

  Block block_;
  VariableStore store_;
  std::vector<std::unique_ptr<VariableStore>> device_stores_;
  std::shared_ptr<Communicator> comm_;
  int first_rank_ = 0;
  bool several_processes_ = false;
  std::mutex run_mu_;
  std::atomic<uint64_t> generation_{1};
  std::mutex threads_mu_;
  std::shared_ptr<WorkQueue> worker_;
  std::shared_ptr<WorkQueue> callbacks_;
  bool shut_down_ = false;
  int leases_ = 0;  // under threads_mu_
  std::condition_variable leases_cv_;
  // Never held while blocking (the callback thread releases slots).
  std::mutex slots_mu_;
  std::condition_variable slots_cv_;
  size_t outstanding_ = 0;
  size_t async_capacity_ = 64;
};

}  // namespace flowjit::runtime
