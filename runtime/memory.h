// Aligned host buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace flowjit::runtime {

constexpr size_t kBufferAlignment = 64;  // a cache line; also the widest vector

struct AlignedFree {
  void operator()(void* p) const;
};

// A zero-initialized, 64-byte aligned block of `bytes` (at least 1 byte is
// allocated so the pointer is never null).
using AlignedBuffer = std::unique_ptr<char[], AlignedFree>;
AlignedBuffer allocate_aligned(size_t bytes);

// A process-wide cache of large uninitialized buffers, for the arrays jobs
// return. A fresh 64 MiB result costs its page faults (the kernel zeroes
// every page) on every call, which took as long as the whole one-pass
// kernel writing it; a freed result of the same size is handed out again
// instead. Buffers below kMinBytes are not cached (the C allocator reuses
// those without faults); at most kMaxCachedBytes are held, the oldest freed
// going back to the system first. Thread-safe.
class BufferPool {
 public:
  static constexpr size_t kMinBytes = size_t{1} << 20;
  static constexpr size_t kMaxCachedBytes = size_t{256} << 20;

  static BufferPool& instance();
  // A 64-byte aligned block of at least `bytes`, not zeroed (as np.empty);
  // give it back with release(p, bytes) with the same `bytes`.
  void* acquire(size_t bytes);
  void release(void* p, size_t bytes);
  size_t cached_bytes() const;
  void clear();  // frees every cached block

 private:
  struct Block {
    void* p;
    size_t bytes;
  };
  mutable std::mutex mu_;
  std::vector<Block> free_;  // oldest first
  size_t cached_ = 0;
};

inline bool is_aligned(const void* p, size_t a = kBufferAlignment) {
  return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0;
}

}  // namespace flowjit::runtime
