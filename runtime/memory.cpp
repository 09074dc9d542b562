// Aligned host buffers.
#include "runtime/memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace flowjit::runtime {

void AlignedFree::operator()(void* p) const { std::free(p); }

AlignedBuffer allocate_aligned(size_t bytes) {
  size_t n = (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  if (n == 0) n = kBufferAlignment;
  void* p = std::aligned_alloc(kBufferAlignment, n);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, n);
  return AlignedBuffer(static_cast<char*>(p));
}

}  // namespace flowjit::runtime
