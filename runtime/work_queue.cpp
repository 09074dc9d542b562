// A single-threaded FIFO work queue with a bounded backlog.
#include "runtime/work_queue.h"

namespace flowjit::runtime {

namespace {

// cv.wait_for(timeout) waits until now() + timeout, a sum that overflows for
// timeouts near milliseconds::max() (the "forever" callers pass), and the
// conversion to the clock's nanoseconds overflows already past ~292 years:
// undefined behaviour that in practice turned "forever" into "not at all".
// Timeouts of a century or more wait without a deadline; zero or negative
// ones only test the predicate.
template <class Pred>
bool wait_up_to(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                std::chrono::milliseconds timeout, Pred pred) {
  if (timeout.count() <= 0) return pred();
  if (timeout >= std::chrono::hours(24 * 365 * 100)) {
    cv.wait(lock, pred);
    return true;
  }
  return cv.wait_for(lock, timeout, pred);
}

}  // namespace

WorkQueue::WorkQueue(std::string name, size_t capacity)
    : name_(std::move(name)), capacity_(capacity ? capacity : 1) {
  thread_ = std::thread([this] { loop(); });
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  not_empty_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool WorkQueue::push_for(Task& task, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!wait_up_to(not_full_, lock, timeout, [&] { return tasks_.size() < capacity_; }))
    return false;
  tasks_.push_back(std::move(task));
  lock.unlock();
  not_empty_.notify_one();
  return true;
}

bool WorkQueue::wait_idle_for(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return wait_up_to(idle_, lock, timeout, [&] { return tasks_.empty() && !running_task_; });
}

size_t WorkQueue::cancel_pending() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = tasks_.size();
  tasks_.clear();
  not_full_.notify_all();
  if (!running_task_) idle_.notify_all();
  return n;
}

std::vector<std::exception_ptr> WorkQueue::take_errors() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::exception_ptr> out;
  out.swap(errors_);
  return out;
}

size_t WorkQueue::pending() {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.size() + (running_task_ ? 1 : 0);
}

void WorkQueue::loop() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      not_empty_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop_ with nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
      running_task_ = true;
    }
    not_full_.notify_one();
    try {
      task();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      errors_.push_back(std::current_exception());
    }
    task = nullptr;  // release captured state before reporting idle
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_task_ = false;
      if (tasks_.empty()) idle_.notify_all();
    }
  }
}

}  // namespace flowjit::runtime
