// runtime/work_queue: FIFO order, errors kept, and timeouts of any size
// (milliseconds::max() is "forever", not an overflow into the past).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "runtime/work_queue.h"

using flowjit::runtime::WorkQueue;
using std::chrono::milliseconds;

TEST(WorkQueue, RunsInOrderAndKeepsErrors) {
  WorkQueue q("test", 4);
  std::vector<int> order;
  for (int i = 0; i < 10; ++i) {
    WorkQueue::Task t = [&, i] {
      order.push_back(i);
      if (i == 3) throw std::runtime_error("task 3");
    };
    ASSERT_TRUE(q.push_for(t, milliseconds::max()));
  }
  ASSERT_TRUE(q.wait_idle_for(milliseconds::max()));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  auto errors = q.take_errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THROW(std::rethrow_exception(errors[0]), std::runtime_error);
}

TEST(WorkQueue, HugeTimeoutsWaitInsteadOfOverflowing) {
  WorkQueue q("test", 1);
  std::atomic<bool> release{false}, finished{false};
  WorkQueue::Task slow = [&] {
    while (!release) std::this_thread::sleep_for(milliseconds(1));
    finished = true;
  };
  ASSERT_TRUE(q.push_for(slow, milliseconds::max()));
  WorkQueue::Task second = [] {};
  // The queue is full (one running, capacity one queued): the second push
  // fits; a third must wait for room, and with max() it waits, not fails.
  ASSERT_TRUE(q.push_for(second, milliseconds::max()));
  std::thread releaser([&] {
    std::this_thread::sleep_for(milliseconds(50));
    release = true;
  });
  WorkQueue::Task third = [] {};
  EXPECT_TRUE(q.push_for(third, milliseconds::max()));
  EXPECT_TRUE(q.wait_idle_for(milliseconds::max()));
  EXPECT_TRUE(finished);
  releaser.join();
  for (auto t :
       {milliseconds::max() - milliseconds(1), milliseconds(std::chrono::hours(24 * 365 * 1000))})
    EXPECT_TRUE(q.wait_idle_for(t));
}

TEST(WorkQueue, ZeroAndNegativeTimeoutsOnlyLook) {
  WorkQueue q("test", 1);
  std::atomic<bool> release{false};
  WorkQueue::Task slow = [&] {
    while (!release) std::this_thread::sleep_for(milliseconds(1));
  };
  ASSERT_TRUE(q.push_for(slow, milliseconds(0)));
  WorkQueue::Task filler = [] {};
  // Fills the one slot once the slow task has left it to run.
  while (!q.push_for(filler, milliseconds(0))) std::this_thread::yield();
  WorkQueue::Task more = [] {};
  EXPECT_FALSE(q.push_for(more, milliseconds(0)));
  EXPECT_FALSE(q.push_for(more, milliseconds::min()));
  EXPECT_FALSE(q.wait_idle_for(milliseconds::min()));
  EXPECT_FALSE(q.wait_idle_for(milliseconds(-5)));
  release = true;
  EXPECT_TRUE(q.wait_idle_for(milliseconds::max()));
}
