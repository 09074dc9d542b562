// The in-process communicator: ranks are threads of this process that read
// each other's buffers directly. Each collective is: publish the buffers,
// barrier, every rank computes its own share (a disjoint part of every
// output), barrier.
#include "runtime/comm/collective.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ir/error.h"

namespace flowjit::runtime {

namespace {

template <class T>
void add_into(void* dst, const void* src, int64_t n) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] + s[i]);
}

}  // namespace

void accumulate(void* dst, const void* src, int64_t count, ir::DType dtype) {
  using ir::DType;
  switch (dtype) {
    case DType::Bool: {
      auto* d = static_cast<uint8_t*>(dst);
      auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < count; ++i) d[i] = (d[i] | s[i]) ? 1 : 0;
      return;
    }
    case DType::Int8:
      return add_into<int8_t>(dst, src, count);
    case DType::UInt8:
      return add_into<uint8_t>(dst, src, count);
    case DType::Int32:
      return add_into<int32_t>(dst, src, count);
    case DType::Int64:
      return add_into<int64_t>(dst, src, count);
    case DType::Float32:
      return add_into<float>(dst, src, count);
    case DType::Float64:
      return add_into<double>(dst, src, count);
    case DType::Float16:
    case DType::BFloat16: {
      // Each sum is computed in float32 and rounded once.
      auto* d = static_cast<uint16_t*>(dst);
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < count; ++i)
        d[i] = ir::float_to_half(ir::half_to_float(d[i], dtype) + ir::half_to_float(s[i], dtype),
                                 dtype);
      return;
    }
  }
  FJ_CHECK(false, "accumulate: unknown dtype");
}

void Communicator::all_reduce_many(int rank, const std::vector<Buffer>& buffers, ir::DType dtype) {
  if (buffers.size() == 1)
    return all_reduce(rank, buffers[0].in, buffers[0].out, buffers[0].count, dtype);
  size_t es = static_cast<size_t>(ir::dtype_bytes(dtype));
  int64_t total = 0;
  for (auto& b : buffers) total += b.count;
  std::vector<char> pack(static_cast<size_t>(total) * es);
  size_t at = 0;
  for (auto& b : buffers) {
    std::memcpy(pack.data() + at, b.in, static_cast<size_t>(b.count) * es);
    at += static_cast<size_t>(b.count) * es;
  }
  all_reduce(rank, pack.data(), pack.data(), total, dtype);
  at = 0;
  for (auto& b : buffers) {
    std::memcpy(b.out, pack.data() + at, static_cast<size_t>(b.count) * es);
    at += static_cast<size_t>(b.count) * es;
  }
}

// ---------------------------------------------------------------- priority

namespace {

// sched_setattr(2)'s struct sched_attr (glibc has no wrapper).
struct SchedAttr {
  uint32_t size = sizeof(SchedAttr);
  uint32_t policy = 0;
  uint64_t flags = 0;
  int32_t nice = 0;
  uint32_t priority = 0;
  uint64_t runtime = 0, deadline = 0, period = 0;  // runtime: the slice of a SCHED_OTHER thread
  uint32_t util_min = 0, util_max = 0;
};

bool get_attr(SchedAttr* a) {
  return syscall(SYS_sched_getattr, 0, a, static_cast<unsigned>(sizeof(SchedAttr)), 0u) == 0;
}
bool set_attr(SchedAttr a) {
  a.size = sizeof(SchedAttr);
  a.flags = 0;
  return syscall(SYS_sched_setattr, 0, &a, 0u) == 0;
}

constexpr uint64_t kCommSliceNs = 100'000;  // Linux's shortest (sysctl base slice: 0.7-3 ms)
constexpr int kCommNiceBoost = 10;

}  // namespace

void prioritize_communication_thread() {
  const char* v = std::getenv("FLOWJIT_COMM_PRIORITY");
  if (v && std::string(v) == "0") return;
  SchedAttr a;

  const int nice = std::max(-20, getpriority(PRIO_PROCESS, 0) - kCommNiceBoost);
  if (!get_attr(&a)) {  // no sched_getattr (before Linux 3.14): nice only
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice);
    return;
  }
  if (a.policy != SCHED_OTHER) return;
  SchedAttr want = a;
  want.runtime = kCommSliceNs;  // kernels before 6.12 ignore it
  want.nice = nice;
  if (set_attr(want)) return;
  want.nice = a.nice;  // lowering nice is not permitted: the short slice alone
  if (set_attr(want)) return;
  want.runtime = 0;  // a kernel that rejects the slice: the nice value alone
  want.nice = nice;
  set_attr(want);
}

ThreadSchedule current_thread_schedule() {
  ThreadSchedule s;
  SchedAttr a;
  if (get_attr(&a)) {
    s.slice_ns = a.policy == SCHED_OTHER ? a.runtime : 0;
    s.nice = a.nice;
  } else {
    s.nice = getpriority(PRIO_PROCESS, 0);
  }
  return s;
}

// ---------------------------------------------------------------- queue

struct CollectiveQueue::State {
  std::mutex mu;
  std::condition_variable cv, done_cv;
  std::deque<std::pair<uint64_t, std::function<void()>>> work;
  uint64_t submitted = 0, done = 0;
  std::exception_ptr error;
  bool stop = false;
  std::thread thread;

  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stop || !work.empty(); });
      if (work.empty()) return;
      auto [ticket, fn] = std::move(work.front());
      work.pop_front();
      bool skip = error != nullptr;
      lock.unlock();
      std::exception_ptr failed;
      if (!skip) {
        try {
          fn();
        } catch (...) {
          failed = std::current_exception();
        }
      }
      lock.lock();
      if (failed && !error) error = failed;
      done = ticket;
      done_cv.notify_all();
    }
  }
};

CollectiveQueue::CollectiveQueue() : s_(std::make_unique<State>()) {
  s_->thread = std::thread([s = s_.get()] {
    prioritize_communication_thread();
    s->loop();
  });
}

CollectiveQueue::~CollectiveQueue() {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->stop = true;
  }
  s_->cv.notify_all();
  s_->thread.join();
}

uint64_t CollectiveQueue::submit(std::function<void()> work) {
  uint64_t t;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    t = ++s_->submitted;
    s_->work.emplace_back(t, std::move(work));
    s_->cv.notify_all();
  }
  // Let the communication thread start now: when every core runs a kernel
  // thread (a CPU job, or a loaded host) it would otherwise wait for the
  // submitter's time slice to end, and a collective meant to overlap the
  // rest of the backward pass would start after it (seen in the profiler's
  // timeline: buckets starting only once the kernel thread blocked).
  std::this_thread::yield();
  return t;
}

void CollectiveQueue::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(s_->mu);
  s_->done_cv.wait(lock, [&] { return s_->done >= ticket; });
  if (s_->error) std::rethrow_exception(s_->error);  // until drain()
}

void CollectiveQueue::wait_all() {
  uint64_t t;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    t = s_->submitted;
  }
  wait(t);
}

void CollectiveQueue::drain() noexcept {
  std::unique_lock<std::mutex> lock(s_->mu);
  s_->done_cv.wait(lock, [&] { return s_->done >= s_->submitted; });
  s_->error = nullptr;
}

namespace {
std::atomic<int64_t> delayed_messages{0}, delayed_injected_us{0}, delayed_slept_us{0};

int64_t delay_us_from(double ms) {
  return ms > 0 && ms < 1e7 ? static_cast<int64_t>(ms * 1000) : int64_t{0};
}

std::atomic<int64_t>& test_delay() {
  static std::atomic<int64_t> us{[] {
    const char* v = std::getenv("FLOWJIT_TEST_COMM_DELAY_MS");
    return delay_us_from(v ? std::strtod(v, nullptr) : 0.0);
  }()};
  return us;
}
}  // namespace

void inject_test_delay(bool counted) {
  const int64_t us = test_delay().load(std::memory_order_relaxed);
  if (us <= 0) return;
  auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::microseconds(us));
  if (!counted) return;
  auto slept =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
  delayed_messages.fetch_add(1, std::memory_order_relaxed);
  delayed_injected_us.fetch_add(us, std::memory_order_relaxed);
  delayed_slept_us.fetch_add(slept.count(), std::memory_order_relaxed);
}

void set_test_delay_ms(double ms) { test_delay().store(delay_us_from(ms)); }

TestDelayStats test_delay_stats() {
  TestDelayStats s;
  s.messages = delayed_messages.load(std::memory_order_relaxed);
  s.injected_ms = static_cast<double>(delayed_injected_us.load(std::memory_order_relaxed)) / 1000.0;
  s.slept_ms = static_cast<double>(delayed_slept_us.load(std::memory_order_relaxed)) / 1000.0;
  return s;
}

// ---------------------------------------------------------------- threads

namespace {

class ThreadCommunicator final : public Communicator {
 public:
  explicit ThreadCommunicator(int ranks) : n_(ranks), in_(ranks), out_(ranks), lists_(ranks) {}

  int size() const override { return n_; }
  std::string describe() const override { return std::to_string(n_) + " threads"; }

  void all_reduce(int rank, const void* in, void* out, int64_t count, ir::DType dtype) override {
    publish(rank, in, out);
    // Rank r owns elements [lo, hi) of every buffer: no other rank reads or
    // writes them, so it can sum them in rank order straight into rank 0's
    // output (elementwise, so an output that is its own input is fine) and
    // copy that to the other outputs without a barrier in between.
    int64_t per = (count + n_ - 1) / n_;
    int64_t lo = std::min<int64_t>(count, per * rank), hi = std::min<int64_t>(count, lo + per);
    size_t es = static_cast<size_t>(ir::dtype_bytes(dtype));
    if (hi > lo) {
      char* sum = static_cast<char*>(out_[0]) + lo * es;
      const char* first = static_cast<const char*>(in_[0]) + lo * es;
      if (sum != first) std::memcpy(sum, first, static_cast<size_t>(hi - lo) * es);
      for (int q = 1; q < n_; ++q)
        accumulate(sum, static_cast<const char*>(in_[q]) + lo * es, hi - lo, dtype);
      for (int q = 1; q < n_; ++q)
        std::memcpy(static_cast<char*>(out_[q]) + lo * es, sum, static_cast<size_t>(hi - lo) * es);
    }
    done(rank);
  }

  // Every rank publishes its buffer list; rank r reduces its share of each
  // buffer as in all_reduce; one barrier at each end for the whole bucket.
  void all_reduce_many(int rank, const std::vector<Buffer>& buffers, ir::DType dtype) override {
    lists_[rank] = &buffers;
    wait(rank);
    size_t es = static_cast<size_t>(ir::dtype_bytes(dtype));
    for (size_t b = 0; b < buffers.size(); ++b) {
      int64_t count = buffers[b].count;
      int64_t per = (count + n_ - 1) / n_;
      int64_t lo = std::min<int64_t>(count, per * rank), hi = std::min<int64_t>(count, lo + per);
      if (hi <= lo) continue;
      char* sum = static_cast<char*>((*lists_[0])[b].out) + lo * es;
      const char* first = static_cast<const char*>((*lists_[0])[b].in) + lo * es;
      if (sum != first) std::memcpy(sum, first, static_cast<size_t>(hi - lo) * es);
      for (int q = 1; q < n_; ++q)
        accumulate(sum, static_cast<const char*>((*lists_[q])[b].in) + lo * es, hi - lo, dtype);
      for (int q = 1; q < n_; ++q)
        std::memcpy(static_cast<char*>((*lists_[q])[b].out) + lo * es, sum,
                    static_cast<size_t>(hi - lo) * es);
    }
    done(rank);
  }

  void all_gather(int rank, const void* in, void* out, int64_t outer,
                  int64_t inner_bytes) override {
    publish(rank, in, out);
    // Rank r writes its own block into every output.
    const char* src = static_cast<const char*>(in);
    for (int q = 0; q < n_; ++q) {
      char* dst = static_cast<char*>(out_[q]);
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(dst + (o * n_ + rank) * inner_bytes, src + o * inner_bytes,
                    static_cast<size_t>(inner_bytes));
    }
    done(rank);
  }

  void reduce_scatter(int rank, const void* in, void* out, int64_t outer, int64_t inner,
                      ir::DType dtype) override {
    publish(rank, in, out);
    // Rank r computes its own output from block r of every input.
    size_t es = static_cast<size_t>(ir::dtype_bytes(dtype));
    std::vector<char> sum(static_cast<size_t>(outer * inner) * es);
    for (int64_t o = 0; o < outer; ++o) {
      char* d = sum.data() + o * inner * es;
      std::memcpy(d, static_cast<const char*>(in_[0]) + (o * n_ + rank) * inner * es, inner * es);
      for (int q = 1; q < n_; ++q)
        accumulate(d, static_cast<const char*>(in_[q]) + (o * n_ + rank) * inner * es, inner,
                   dtype);
    }
    wait(rank);                                                  // out may alias in
    if (!sum.empty()) std::memcpy(out, sum.data(), sum.size());  // out may be null when empty
    done(rank);
  }

  void barrier(int rank) override { wait(rank); }

  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.empty()) aborted_ = why.empty() ? "a device failed" : why;
    cv_.notify_all();
  }

 private:
  void publish(int rank, const void* in, void* out) {
    FJ_CHECK(rank >= 0 && rank < n_, "communicator rank out of range");
    in_[rank] = in;
    out_[rank] = out;
    wait(rank);
  }

  // The last barrier of a collective, then the test-only delay: each rank's
  // result arrives that much later, as over a slower network.
  void done(int rank) {
    wait(rank);
    inject_test_delay(rank == 0);
  }

  // A reusable barrier that gives up when the communicator is aborted.
  void wait(int) {
    std::unique_lock<std::mutex> lock(mu_);
    check_aborted();
    uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || !aborted_.empty(); });
    if (generation_ == gen) check_aborted();
  }

  void check_aborted() {
    if (!aborted_.empty()) throw_user(ErrorKind::Runtime, "a collective was aborted: ", aborted_);
  }

  int n_;
  std::vector<const void*> in_;
  std::vector<void*> out_;
  std::vector<const std::vector<Buffer>*> lists_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::string aborted_;
};

}  // namespace

std::shared_ptr<Communicator> make_thread_communicator(int ranks) {
  FJ_CHECK(ranks >= 1, "a communicator needs at least one rank");
  return std::make_shared<ThreadCommunicator>(ranks);
}

}  // namespace flowjit::runtime
