// Session: variables, devices, the async worker and the callback thread.
#include "runtime/session.h"

#include <chrono>
#include <new>

#include "ir/error.h"
#include "runtime/distributed.h"

namespace flowjit::runtime {

using namespace std::chrono_literals;

Session::Session(Block block) : block_(std::move(block)) {
  if (!block_)
    block_ = [](const std::function<bool()>& step) {
      while (!step()) {
      }
    };
}

Session::~Session() = default;  // the queues finish their tasks, then join

void Session::ensure_threads() {
  std::lock_guard<std::mutex> lock(threads_mu_);
  if (shut_down_) throw_user(ErrorKind::Runtime, "the flowjit session has shut down");
  if (!worker_) worker_ = std::make_unique<WorkQueue>("flowjit-worker", 64);
  if (!callbacks_) callbacks_ = std::make_unique<WorkQueue>("flowjit-callbacks", 1u << 30);
}

bool Session::on_callback_thread() {
  std::lock_guard<std::mutex> lock(threads_mu_);
  return callbacks_ && callbacks_->on_worker_thread();
}

size_t Session::async_capacity() {
  std::lock_guard<std::mutex> lock(slots_mu_);
  return async_capacity_;
}

void Session::set_async_capacity(size_t n) {
  FJ_USER_CHECK(n >= 1, ErrorKind::Value, "async capacity must be at least 1, got ", n);
  {
    std::lock_guard<std::mutex> lock(slots_mu_);
    async_capacity_ = n;
  }
  slots_cv_.notify_all();
}

void Session::acquire_slot() {
  {
    std::lock_guard<std::mutex> lock(slots_mu_);
    if (outstanding_ < async_capacity_) {
      ++outstanding_;
      return;
    }
  }
  block_([&] {
    std::unique_lock<std::mutex> lock(slots_mu_);  // released before the step returns
    bool got = slots_cv_.wait_for(lock, 50ms, [&] { return outstanding_ < async_capacity_; });
    if (got) ++outstanding_;
    return got;
  });
}

void Session::release_slot() {
  {
    std::lock_guard<std::mutex> lock(slots_mu_);
    if (outstanding_ > 0) --outstanding_;
  }
  slots_cv_.notify_all();
}

void Session::take_slot() {
  if (on_callback_thread()) {
    std::lock_guard<std::mutex> lock(slots_mu_);
    ++outstanding_;  // counted, never waited for
  } else {
    acquire_slot();
  }
}

void Session::submit(WorkQueue::Task task) {
  ensure_threads();
  take_slot();
  try {
    block_([&] { return worker_->push_for(task, 50ms); });
  } catch (...) {
    release_slot();
    throw;
  }
}

void Session::deliver(WorkQueue::Task task) { enqueue_callback(std::move(task)); }

void Session::post_callback(WorkQueue::Task task) {
  ensure_threads();
  take_slot();
  try {
    enqueue_callback(std::move(task));
  } catch (...) {
    release_slot();
    throw;
  }
}

// Queues `task` for the callback thread; its slot is freed once it has run.
void Session::enqueue_callback(WorkQueue::Task task) {
  ensure_threads();
  WorkQueue::Task wrapped = [this, task = std::move(task)]() mutable {
    try {
      task();
    } catch (...) {
      release_slot();
      throw;
    }
    task = nullptr;  // drops what the task kept alive before it counts as done
    release_slot();
  };
  bool ok = callbacks_->push_for(wrapped, std::chrono::milliseconds::max());
  FJ_CHECK(ok, "callback queue refused a task");
}

void Session::wait(WorkQueue& q) {
  if (q.on_worker_thread()) return;  // a task waiting for its own queue would wait forever
  block_([&] { return q.wait_idle_for(50ms); });
}

bool Session::has_pending_work() {
  std::lock_guard<std::mutex> lock(threads_mu_);
  return (worker_ && worker_->pending() > 0) || (callbacks_ && callbacks_->pending() > 0);
}

void Session::wait_jobs() {
  if (worker_) wait(*worker_);
}

void Session::wait_all() {
  if (worker_) wait(*worker_);
  if (callbacks_) wait(*callbacks_);
}

void Session::configure_devices(int local, std::shared_ptr<Communicator> comm, int first_rank,
                                bool several_processes) {
  wait_jobs();
  std::lock_guard<std::mutex> lock(run_mu_);
  // Variables distributed over the old devices come back to the host first.
  for (auto* v : store_.all()) {
    sync_host(*v);
    v->replicas.reset();
  }
  device_stores_.clear();
  for (int d = 0; d < local; ++d) device_stores_.push_back(std::make_unique<VariableStore>());
  comm_ = std::move(comm);
  first_rank_ = first_rank;
  several_processes_ = several_processes;
  generation_.fetch_add(1);  // compiled jobs were bound to the old devices
}

std::vector<VariableStore*> Session::device_stores() {
  std::vector<VariableStore*> out;
  for (auto& s : device_stores_) out.push_back(s.get());
  return out;
}

void Session::clear_variables() {
  // A job another thread is running holds the run lock and reads the
  // variables: wait for it, then free them. A call that was about to run
  // sees the new generation under the lock and refuses.
  block_([&] {
    std::lock_guard<std::mutex> lock(run_mu_);
    generation_.fetch_add(1);
    store_.clear();
    for (auto& s : device_stores_) s->clear();
    return true;
  });
}

bool Session::shutdown() {
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    if (shut_down_) return false;
  }
  try {
    wait_all();
  } catch (...) {
    // Interrupted: drop what has not started.
    if (worker_) worker_->cancel_pending();
    if (callbacks_) callbacks_->cancel_pending();
  }
  std::unique_ptr<WorkQueue> w, c;
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    shut_down_ = true;
    w = std::move(worker_);
    c = std::move(callbacks_);
  }
  block_([&] {
    w.reset();  // runs what is left, then joins
    c.reset();
    return true;
  });
  return true;
}

void Session::before_fork() {
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    if (shut_down_ || !worker_ || worker_->on_worker_thread() ||
        (callbacks_ && callbacks_->on_worker_thread()))
      return;  // (a fork from a callback cannot wait for callbacks)
  }
  try {
    wait(*worker_);
    if (callbacks_) wait(*callbacks_);
  } catch (const std::exception&) {
    // Interrupted: fork without waiting; the child starts afresh anyway.
  }
}

void Session::after_fork_in_child() {
  // The threads of these queues exist only in the parent: destroying the
  // queues would join them. Leaked on purpose (the parent still owns its).
  (void)worker_.release();
  (void)callbacks_.release();
  // Locks another parent thread may have held at the fork.
  new (&threads_mu_) std::mutex();
  new (&slots_mu_) std::mutex();
  new (&slots_cv_) std::condition_variable();
  new (&run_mu_) std::mutex();
  outstanding_ = 0;
}

}  // namespace flowjit::runtime
