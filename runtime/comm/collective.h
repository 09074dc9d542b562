// Collectives: the communication a job spread over several devices does.
//
// A Communicator joins `size()` ranks; a rank is one device. One process may
// hold several ranks (its local devices), each calling from its own thread;
// ranks of other processes are reached over Gloo (runtime/gloo_communicator).
// Every call is collective: all ranks make the same calls in the same order
// with the same sizes. Reductions add in rank order, so every rank gets
// bit-identical results.
//
// Failure: a rank that throws (or a peer process that dies) aborts the
// communicator; every rank blocked in, or later entering, a collective throws
// UserError(Runtime) with the first reason instead of waiting forever.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ir/types.h"

namespace flowjit::runtime {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int size() const = 0;
  virtual std::string describe() const = 0;  // "2 threads", "gloo: 2 processes x 1 device"

  // out[i] = sum over ranks of in[i], `count` elements of `dtype` (Bool: or).
  // `in` and `out` may be the same buffer.
  virtual void all_reduce(int rank, const void* in, void* out, int64_t count, ir::DType dtype) = 0;
  // in: [outer][inner_bytes]; out: [outer][size()][inner_bytes], rank r's
  // block at position r (the gather of a tensor split along one axis).
  virtual void all_gather(int rank, const void* in, void* out, int64_t outer,
                          int64_t inner_bytes) = 0;
  // in: [outer][size()][inner] elements; out[o][i] = sum over ranks q of
  // in_q[o][rank][i] (the scatter of a partial sum along one axis).
  virtual void reduce_scatter(int rank, const void* in, void* out, int64_t outer, int64_t inner,
                              ir::DType dtype) = 0;
  // Several all_reduces of one dtype as one exchange (a bucket). The
  // default packs them into one buffer around all_reduce.
  struct Buffer {
    const void* in;
    void* out;
    int64_t count;
  };
  virtual void all_reduce_many(int rank, const std::vector<Buffer>& buffers, ir::DType dtype);
  virtual void barrier(int rank) = 0;
  // Makes every rank blocked in, or later entering, a collective throw.
  virtual void abort(const std::string& why) = 0;
};

// One device's communication thread: runs submitted work (collectives) in
// submission order while the device's own thread goes on with kernels.
// After a failure the rest of the queue is skipped and every wait rethrows
// the first error.
class CollectiveQueue {
 public:
  CollectiveQueue();
  ~CollectiveQueue();  // waits for what was submitted
  CollectiveQueue(const CollectiveQueue&) = delete;
  CollectiveQueue& operator=(const CollectiveQueue&) = delete;
  // Returns a ticket for wait().
  uint64_t submit(std::function<void()> work);
  // Waits until the work of `ticket` and everything before it has run.
  void wait(uint64_t ticket);
  void wait_all();
  // Waits for everything and forgets any error (the end of a run).
  void drain() noexcept;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Makes the calling thread, one that communicates, run as soon as it wakes
// (a peer's message arrived, a bucket was submitted, a delay ended) rather
// than when a kernel thread holding its core ends its time slice: on a host
// where every core runs kernel threads, each such wake-up otherwise waits
// for up to a slice (milliseconds), several per message. It asks Linux for
// the shortest scheduler slice (0.1 ms; EEVDF, Linux 6.12+, unprivileged),
// which lets a woken thread preempt, and lowers its nice value by 10 where
// permitted (CAP_SYS_NICE or RLIMIT_NICE). Whatever is not permitted or not
// known to this kernel is left as it is, silently; a thread with a real-time,
// batch or idle policy is left alone. Threads it then creates inherit the
// setting. FLOWJIT_COMM_PRIORITY=0 turns it off (to measure its effect).
void prioritize_communication_thread();
// The calling thread's scheduler slice in ns as the kernel reports it (0
// where it does not) and its nice value: what
// prioritize_communication_thread() changes.
struct ThreadSchedule {
  uint64_t slice_ns = 0;
  int nice = 0;
};
ThreadSchedule current_thread_schedule();

// The test-only injected delay per message (FLOWJIT_TEST_COMM_DELAY_MS,
// read once; set_test_delay_ms changes it): every collective a communicator
// runs sleeps this long after its exchange, before it returns,
// as a slower network would make it wait. 0 when unset. `counted`: this
// call is the one that counts the message for its process (the first local
// device's, or the Gloo leader's: the other local devices sleep beside it).
void inject_test_delay(bool counted = true);

// What the injected delay cost this process so far: the messages counted
// above, the delay they were meant to pay (messages x the setting) and the
// time their sleeps took (more on a loaded host: a woken thread waits for a
// core). Benchmarks read the difference over their timed steps.
struct TestDelayStats {
  int64_t messages = 0;
  double injected_ms = 0;
  double slept_ms = 0;
};
TestDelayStats test_delay_stats();
// Changes the delay from now on (a benchmark alternates delays in one run).
void set_test_delay_ms(double ms);

// `ranks` devices of this process, exchanging through shared memory.
std::shared_ptr<Communicator> make_thread_communicator(int ranks);

// dst[i] += src[i] for `count` elements (Bool: |=). Shared by communicators.
void accumulate(void* dst, const void* src, int64_t count, ir::DType dtype);

}  // namespace flowjit::runtime
