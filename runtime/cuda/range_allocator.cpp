// First-fit range allocation with coalescing.
#include "runtime/cuda/range_allocator.h"

#include <algorithm>

#include "ir/error.h"

namespace flowjit::runtime::cuda {

RangeAllocator::RangeAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity / alignment * alignment), alignment_(alignment) {
  FJ_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0, "alignment must be a power of two");
  if (capacity_ > 0) free_[0] = capacity_;
}

std::optional<uint64_t> RangeAllocator::allocate(uint64_t bytes) {
  uint64_t need =
      std::max<uint64_t>(alignment_, (bytes + alignment_ - 1) / alignment_ * alignment_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    uint64_t off = it->first, size = it->second;
    free_.erase(it);
    if (size > need) free_[off + need] = size - need;
    used_[off] = need;
    used_bytes_ += need;
    return off;
  }
  return std::nullopt;
}

void RangeAllocator::release(uint64_t offset) {
  auto it = used_.find(offset);
  FJ_CHECK(it != used_.end(), "release of offset ", offset, " which is not allocated");
  uint64_t size = it->second;
  used_.erase(it);
  used_bytes_ -= size;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_[offset] = size;
}

uint64_t RangeAllocator::largest_free() const {
  uint64_t m = 0;
  for (auto& [off, size] : free_) m = std::max(m, size);
  return m;
}

}  // namespace flowjit::runtime::cuda
