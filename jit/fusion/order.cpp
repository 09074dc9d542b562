// fusion's launch-order stage (jit/fusion/order.h).
#include "jit/fusion/order.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <unordered_map>
#include <utility>

namespace flowjit::jit::fusion_detail {

std::optional<std::vector<int>> launch_order(const std::vector<LaunchDeps>& launches) {
  const size_t n = launches.size();
  std::vector<std::set<int>> succ(n);
  std::vector<int> indeg(n, 0);
  auto edge = [&](int from, int to) {
    if (from == to) return;
    if (succ[from].insert(to).second) ++indeg[to];
  };
  std::unordered_map<std::string, int> writer;
  for (size_t i = 0; i < n; ++i)
    for (const std::string& v : launches[i].var_writes) writer[v] = static_cast<int>(i);
  for (size_t i = 0; i < n; ++i) {
    for (int p : launches[i].reads) edge(p, static_cast<int>(i));
    for (const std::string& v : launches[i].var_reads) {
      auto w = writer.find(v);
      if (w != writer.end()) edge(static_cast<int>(i), w->second);
    }
  }
  // feeds: computes an operand of a collective; waits: reads a collective's result.
  std::vector<bool> feeds(n, false), waits(n, false);
  for (size_t i = 0; i < n; ++i)
    for (int p : launches[i].reads) {
      if (launches[i].collective) feeds[p] = true;
      if (launches[p].collective) waits[i] = true;
    }
  using Queue =
      std::priority_queue<std::pair<int, int>, std::vector<std::pair<int, int>>, std::greater<>>;
  Queue feeders, collectives, ready;
  // Consumers go in the order their collectives were launched (an update
  // of the first bucket does not wait behind the last), then program order.
  using Key = std::pair<std::pair<int, int>, int>;
  std::priority_queue<Key, std::vector<Key>, std::greater<>> consumers;
  std::vector<int> at(n, -1);  // position in `order`
  std::vector<int> order;
  auto push = [&](int i) {
    const LaunchDeps& l = launches[i];
    if (waits[i] && !l.collective && !feeds[i]) {
      int last = -1;
      for (int p : l.reads)
        if (launches[p].collective) last = std::max(last, at[p]);
      consumers.push({{last, l.program_pos}, i});
      return;
    }
    Queue& q = l.collective ? collectives : feeds[i] ? feeders : ready;
    q.push({l.program_pos, i});
  };
  for (size_t i = 0; i < n; ++i)
    if (indeg[i] == 0) push(static_cast<int>(i));
  auto take = [&](auto& q) {
    int i = q.top().second;
    q.pop();
    at[i] = static_cast<int>(order.size());
    order.push_back(i);
    for (int s : succ[i])
      if (--indeg[s] == 0) push(s);
  };
  while (!feeders.empty() || !collectives.empty() || !ready.empty() || !consumers.empty()) {
    if (!feeders.empty()) {
      take(feeders);
    } else if (!collectives.empty()) {
      while (!collectives.empty()) take(collectives);
    } else if (!ready.empty()) {
      take(ready);
    } else {
      take(consumers);
    }
  }
  if (order.size() != n) return std::nullopt;
  return order;
}

}  // namespace flowjit::jit::fusion_detail
