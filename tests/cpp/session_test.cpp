// Tests of runtime::Session: job order, back-pressure, the callback thread,
// clears, devices and shutdown, without Python.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ir/error.h"
#include "runtime/comm/collective.h"
#include "runtime/session.h"

namespace flowjit {
namespace {

using namespace std::chrono_literals;
using runtime::Session;

ir::TensorType f32(std::vector<int64_t> shape) { return ir::TensorType{ir::DType::Float32, shape}; }

// A job run as the bindings queue one: the run on the worker, its result
// delivered on the callback thread.
void submit_run(Session& s, std::function<void()> run, std::function<void()> deliver) {
  s.submit([&s, run, deliver] {
    run();
    s.deliver(deliver);
  });
}

TEST(Session, RunsJobsInCallOrderAndDeliversInThatOrder) {
  Session s;
  std::mutex mu;
  std::vector<int> ran, delivered;
  std::thread::id worker, callbacks;
  for (int i = 0; i < 20; ++i)
    submit_run(
        s,
        [&, i] {
          std::lock_guard<std::mutex> lock(mu);
          ran.push_back(i);
          worker = std::this_thread::get_id();
        },
        [&, i] {
          std::lock_guard<std::mutex> lock(mu);
          delivered.push_back(i);
          callbacks = std::this_thread::get_id();
          EXPECT_TRUE(s.on_callback_thread());
        });
  s.wait_all();
  EXPECT_FALSE(s.has_pending_work());
  ASSERT_EQ(ran.size(), 20u);
  ASSERT_EQ(delivered.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(ran[i], i);
    EXPECT_EQ(delivered[i], i);
  }
  EXPECT_NE(worker, std::this_thread::get_id());
  EXPECT_NE(callbacks, worker) << "callbacks run on their own thread, not the worker";
  EXPECT_FALSE(s.on_callback_thread());
}

TEST(Session, AtMostCapacityRunsAreOutstanding) {
  Session s;
  s.set_async_capacity(2);
  EXPECT_EQ(s.async_capacity(), 2u);
  std::promise<void> open;
  std::shared_future<void> gate = open.get_future().share();
  std::atomic<int> delivered{0};
  // Two runs whose callbacks wait at the gate hold both slots.
  for (int i = 0; i < 2; ++i)
    submit_run(
        s, [] {},
        [gate, &delivered] {
          gate.wait();
          ++delivered;
        });
  std::atomic<bool> third_queued{false};
  std::thread t([&] {
    submit_run(s, [] {}, [&delivered] { ++delivered; });
    third_queued = true;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(third_queued) << "a third run waits for a slot";
  open.set_value();
  t.join();
  EXPECT_TRUE(third_queued);
  s.wait_all();
  EXPECT_EQ(delivered, 3);
  EXPECT_THROW(s.set_async_capacity(0), UserError);
}

TEST(Session, SubmissionsFromTheCallbackThreadNeverWait) {
  Session s;
  s.set_async_capacity(1);
  std::atomic<int> inner{0};
  // The only slot is held by this run while its callback submits more runs
  // (as a Python callback calling a job does): they must not wait for it.
  submit_run(
      s, [] {},
      [&] {
        for (int i = 0; i < 3; ++i) submit_run(s, [] {}, [&] { ++inner; });
      });
  s.wait_all();
  s.wait_all();  // the inner runs' callbacks were queued by the worker after the first wait
  EXPECT_EQ(inner, 3);
}

TEST(Session, PostedCallbacksRunAfterThoseQueuedAndFreeTheirSlot) {
  Session s;
  s.set_async_capacity(1);
  std::vector<int> order;
  submit_run(s, [] {}, [&] { order.push_back(1); });
  s.post_callback([&] { order.push_back(2); });
  s.post_callback([&] { order.push_back(3); });
  s.wait_all();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(Session, AThrowingTaskDoesNotStopTheQueues) {
  Session s;
  std::atomic<int> after{0};
  s.submit([&s] {  // a run delivers (its error) even when it fails
    s.deliver([] {});
    throw std::runtime_error("job failed");
  });
  s.post_callback([] { throw std::runtime_error("callback failed"); });
  submit_run(s, [&] { ++after; }, [&] { ++after; });
  s.wait_all();
  EXPECT_EQ(after, 2);
  // The failed callback's slot came back: with capacity 1 this would hang otherwise.
  s.set_async_capacity(1);
  s.post_callback([&] { ++after; });
  s.wait_all();
  EXPECT_EQ(after, 3);
}

TEST(Session, ClearDropsVariablesAndBumpsTheGeneration) {
  Session s;
  s.store().get_or_create("w", f32({4}), true);
  uint64_t g = s.generation();
  s.clear_variables();
  EXPECT_GT(s.generation(), g);
  EXPECT_EQ(s.store().find("w"), nullptr);
  // A queued run sees the clear under the run lock and can refuse.
  uint64_t compiled_in = s.generation();
  std::atomic<bool> refused{false};
  std::promise<void> open;
  std::shared_future<void> gate = open.get_future().share();
  s.submit([gate] { gate.wait(); });
  s.submit([&] {
    std::lock_guard<std::mutex> lock(s.run_mutex());
    refused = compiled_in != s.generation();
  });
  s.clear_variables();
  open.set_value();
  s.wait_jobs();
  EXPECT_TRUE(refused);
}

TEST(Session, ConfigureDevicesMakesOneStorePerDevice) {
  Session s;
  EXPECT_EQ(s.local_devices(), 0);
  uint64_t g = s.generation();
  s.configure_devices(3, runtime::make_thread_communicator(3), 0, false);
  EXPECT_EQ(s.local_devices(), 3);
  EXPECT_EQ(s.device_stores().size(), 3u);
  EXPECT_EQ(s.communicator()->size(), 3);
  EXPECT_FALSE(s.several_processes());
  EXPECT_GT(s.generation(), g) << "jobs bound to the old devices must recompile";
  s.configure_devices(1, runtime::make_thread_communicator(1), 0, false);
  EXPECT_EQ(s.local_devices(), 1);
}

TEST(Session, ShutdownFinishesQueuedWorkThenRefusesMore) {
  Session s;
  std::atomic<int> ran{0};
  for (int i = 0; i < 5; ++i) submit_run(s, [&] { ++ran; }, [&] { ++ran; });
  EXPECT_TRUE(s.shutdown());
  EXPECT_EQ(ran, 10);
  EXPECT_FALSE(s.shutdown()) << "a second shutdown does nothing";
  try {
    s.submit([] {});
    FAIL() << "a submit after shutdown must be refused";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("shut down"), std::string::npos) << e.what();
  }
}

TEST(Session, ASubmitThatMeetsAShutdownOnAnotherThreadIsRefusedNotACrash) {
  // Interpreter exit with daemon threads still calling a job: the submitter
  // passed its checks and is about to push when the main thread shuts the
  // session down and destroys the queues. The push must see the shutdown
  // (a UserError), never a queue that is gone (it dereferenced a moved-from
  // pointer before).
  std::atomic<std::thread::id> submitter{};
  std::atomic<bool> in_step{false};
  std::promise<void> shut;
  std::shared_future<void> shut_done = shut.get_future().share();
  Session s([&](const std::function<bool()>& step) {
    if (std::this_thread::get_id() == submitter.load()) {
      in_step = true;
      shut_done.wait();  // the shutdown completes between the checks and the push
    }
    while (!step()) {
    }
  });
  s.submit([] {});
  s.wait_all();  // the queues exist
  std::atomic<bool> refused{false};
  std::thread t([&] {
    submitter = std::this_thread::get_id();
    try {
      s.submit([] {});
    } catch (const UserError& e) {
      refused = std::string(e.what()).find("shut down") != std::string::npos;
    }
  });
  while (!in_step) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(s.shutdown());
  shut.set_value();
  t.join();
  EXPECT_TRUE(refused);
}

TEST(Session, WaitsGoThroughTheEmbeddingsBlockHook) {
  // The hook decides how waits are spent (Python: GIL released, Ctrl-C
  // polled); an exception from it ends the wait and reaches the caller.
  std::atomic<int> steps{0};
  std::atomic<bool> interrupt{false};
  Session s([&](const std::function<bool()>& step) {
    while (!step()) {
      ++steps;
      if (interrupt) throw std::runtime_error("interrupted");
    }
  });
  std::promise<void> open;
  std::shared_future<void> gate = open.get_future().share();
  s.submit([gate] { gate.wait(); });
  interrupt = true;
  EXPECT_THROW(s.wait_jobs(), std::runtime_error);
  EXPECT_GT(steps, 0);
  interrupt = false;
  open.set_value();
  s.wait_jobs();
  EXPECT_FALSE(s.has_pending_work());
}

}  // namespace
}  // namespace flowjit
