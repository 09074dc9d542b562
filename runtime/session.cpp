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
  if (!worker_) worker_ = std::make_shared<WorkQueue>("flowjit-worker", 64);
  if (!callbacks_) callbacks_ = std::make_shared<WorkQueue>("flowjit-callbacks", 1u << 30);
}

Session::Lease Session::live_queue(bool callbacks) {
  ensure_threads();
  std::lock_guard<std::mutex> lock(threads_mu_);
  if (shut_down_) throw_user(ErrorKind::Runtime, "the flowjit session has shut down");
  ++leases_;
  return Lease(this, callbacks ? callbacks_ : worker_);
}

Session::Lease::~Lease() {
  queue.reset();  // never the last reference: shutdown() keeps its own until leases end
  {
    std::lock_guard<std::mutex> lock(session->threads_mu_);
    --session->leases_;
  }
  session->leases_cv_.notify_all();
}

std::shared_ptr<WorkQueue> Session::current_queue(bool callbacks) {
  std::lock_guard<std::mutex> lock(threads_mu_);
  return callbacks ? callbacks_ : worker_;
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
  take_slot();  // may wait, while another thread shuts the session down
  try {
    // The lease is held only within a step: a step runs without the GIL and
    // returns, while a thread parked at interpreter exit parks after its step
    // (python/csrc GilRelease), so shutdown() never waits for a parked thread.
    block_([&] {
      Lease worker = live_queue(false);
      return worker->push_for(task, 50ms);
    });
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
  Lease callbacks = live_queue(true);
  bool ok = callbacks->push_for(wrapped, std::chrono::milliseconds::max());
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
  if (auto w = current_queue(false)) wait(*w);
}

void Session::wait_all() {
  if (auto w = current_queue(false)) wait(*w);
  if (auto c = current_queue(true)) wait(*c);
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
    if (auto w = current_queue(false)) w->cancel_pending();
    if (auto c = current_queue(true)) c->cancel_pending();
  }
  std::shared_ptr<WorkQueue> w, c;
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    shut_down_ = true;
    w = std::move(worker_);
    c = std::move(callbacks_);
  }
  // A thread that leased a queue before the shutdown (a daemon thread calling a
  // job at interpreter exit) finishes its push first; then the queues go.
  block_([&] {
    std::unique_lock<std::mutex> lock(threads_mu_);
    return leases_cv_.wait_for(lock, 50ms, [&] { return leases_ == 0; });
  });
  block_([&] {
    w.reset();  // runs what is left, then joins
    c.reset();
    return true;
  });
  return true;
}

void Session::before_fork() {
  std::shared_ptr<WorkQueue> w, c;
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    if (shut_down_ || !worker_ || worker_->on_worker_thread() ||
        (callbacks_ && callbacks_->on_worker_thread()))
      return;  // (a fork from a callback cannot wait for callbacks)
    w = worker_;
    c = callbacks_;
  }
  try {
    wait(*w);
    if (c) wait(*c);
  } catch (const std::exception&) {
    // Interrupted: fork without waiting; the child starts afresh anyway.
  }
}

void Session::after_fork_in_child() {
  // The threads of these queues exist only in the parent: destroying the
  // queues would join them. Leaked on purpose (the parent still owns its).
  new std::shared_ptr<WorkQueue>(std::move(worker_));
  new std::shared_ptr<WorkQueue>(std::move(callbacks_));
  // Locks another parent thread may have held at the fork.
  new (&threads_mu_) std::mutex();
  new (&slots_mu_) std::mutex();
  new (&slots_cv_) std::condition_variable();
  new (&run_mu_) std::mutex();
  new (&leases_cv_) std::condition_variable();
  leases_ = 0;
  outstanding_ = 0;
}

}  // namespace flowjit::runtime
