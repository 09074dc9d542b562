// memory: arena offsets from live ranges (greedy first fit).
#include "jit/memory.h"

#include <algorithm>
#include <numeric>

namespace flowjit::jit {

ArenaPlan plan_arena(const std::vector<BufferLife>& buffers) {
  constexpr int64_t kAlign = 64;
  ArenaPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (buffers[a].first != buffers[b].first) return buffers[a].first < buffers[b].first;
    return buffers[a].bytes > buffers[b].bytes;
  });
  std::vector<size_t> placed;
  for (size_t i : order) {
    const BufferLife& b = buffers[i];
    int64_t size = (std::max<int64_t>(b.bytes, 1) + kAlign - 1) / kAlign * kAlign;
    plan.total_bytes += size;
    // Regions of buffers whose lives overlap this one, sorted by offset.
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (size_t j : placed) {
      const BufferLife& o = buffers[j];
      if (o.last < b.first || b.last < o.first) continue;
      int64_t osize = (std::max<int64_t>(o.bytes, 1) + kAlign - 1) / kAlign * kAlign;
      busy.emplace_back(plan.offsets[j], plan.offsets[j] + osize);
    }
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (auto& [lo, hi] : busy) {
      if (at + size <= lo) break;
      at = std::max(at, hi);
    }
    plan.offsets[i] = at;
    plan.arena_bytes = std::max(plan.arena_bytes, at + size);
    placed.push_back(i);
  }
  return plan;
}

}  // namespace flowjit::jit
