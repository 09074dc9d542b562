// A first-fit allocator of offsets in [0, capacity) with a coalescing free
// list: the bookkeeping of the device arena, pure host logic so it is tested
// without a GPU.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace flowjit::runtime::cuda {

class RangeAllocator {
 public:
  // Offsets and sizes are multiples of `alignment` (a power of two).
  explicit RangeAllocator(uint64_t capacity, uint64_t alignment = 256);

  // The lowest free offset that fits `bytes` (rounded up; 0 takes one unit),
  // or nullopt when no free range is large enough.
  std::optional<uint64_t> allocate(uint64_t bytes);
  // Returns a range given by allocate(); neighbours merge. InternalError for
  // an offset that is not allocated.
  void release(uint64_t offset);

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_bytes_; }
  uint64_t largest_free() const;
  size_t allocations() const { return used_.size(); }
  bool empty() const { return used_.empty(); }

 private:
  uint64_t capacity_, alignment_;
  uint64_t used_bytes_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> size
  std::map<uint64_t, uint64_t> used_;  // offset -> size
};

}  // namespace flowjit::runtime::cuda
