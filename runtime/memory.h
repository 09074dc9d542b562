// Aligned host buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace flowjit::runtime {

constexpr size_t kBufferAlignment = 64;  // a cache line; also the widest vector

struct AlignedFree {
  void operator()(void* p) const;
};

// A zero-initialized, 64-byte aligned block of `bytes` (at least 1 byte is
// allocated so the pointer is never null).
using AlignedBuffer = std::unique_ptr<char[], AlignedFree>;
AlignedBuffer allocate_aligned(size_t bytes);

inline bool is_aligned(const void* p, size_t a = kBufferAlignment) {
  return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0;
}

}  // namespace flowjit::runtime
