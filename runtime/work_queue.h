// A single-threaded FIFO work queue with a bounded backlog.
//
// Tasks run one at a time, in push order, on the queue's own thread. A task
// that throws does not stop the queue: the exception is kept and handed out
// by take_errors(), in order. Waiting calls come in a timed form so that a
// caller can poll for interruption (Ctrl-C in Python); any timeout is
// valid, milliseconds::max() meaning "no timeout".
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace flowjit::runtime {

class WorkQueue {
 public:
  using Task = std::function<void()>;

  WorkQueue(std::string name, size_t capacity);
  ~WorkQueue();  // finishes queued tasks, then joins
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `task`, waiting up to `timeout` for room. Returns false on timeout.
  bool push_for(Task& task, std::chrono::milliseconds timeout);
  // Waits up to `timeout` until every queued task has finished.
  bool wait_idle_for(std::chrono::milliseconds timeout);
  // Drops tasks that have not started (used on interrupt). Returns how many.
  size_t cancel_pending();

  std::vector<std::exception_ptr> take_errors();
  size_t pending();
  bool on_worker_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void loop();

  std::string name_;
  size_t capacity_;
  std::mutex mu_;
  std::condition_variable not_empty_, not_full_, idle_;
  std::deque<Task> tasks_;
  std::vector<std::exception_ptr> errors_;
  bool running_task_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace flowjit::runtime
