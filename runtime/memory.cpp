// Aligned host buffers.
#include "runtime/memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

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

BufferPool& BufferPool::instance() {
  static BufferPool* pool = new BufferPool();  // never destroyed: arrays may outlive statics
  return *pool;
}

namespace {
size_t pool_size(size_t bytes) {
  return (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
}
}  // namespace

void* BufferPool::acquire(size_t bytes) {
  size_t n = pool_size(bytes);
  if (n >= kMinBytes) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = free_.size(); i-- > 0;) {  // the most recently freed first: warm pages
      if (free_[i].bytes != n) continue;
      void* p = free_[i].p;
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      cached_ -= n;
      return p;
    }
  }
  void* p = std::aligned_alloc(kBufferAlignment, n == 0 ? kBufferAlignment : n);
  if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Large blocks on huge pages where the system allows it (as numpy does):
  // fewer faults the first time and fewer TLB misses in a streaming kernel.
  if (n >= (size_t{4} << 20)) {
    uintptr_t a = (reinterpret_cast<uintptr_t>(p) + 4095) & ~uintptr_t{4095};
    uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n) & ~uintptr_t{4095};
    if (e > a) madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
  }
#endif
  return p;
}

void BufferPool::release(void* p, size_t bytes) {
  if (!p) return;
  size_t n = pool_size(bytes);
  if (n < kMinBytes || n > kMaxCachedBytes) {
    std::free(p);
    return;
  }
  std::vector<void*> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back({p, n});
    cached_ += n;
    size_t k = 0;
    while (cached_ > kMaxCachedBytes) {
      cached_ -= free_[k].bytes;
      drop.push_back(free_[k++].p);
    }
    free_.erase(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(k));
  }
  for (void* q : drop) std::free(q);
}

size_t BufferPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

void BufferPool::clear() {
  std::vector<Block> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all.swap(free_);
    cached_ = 0;
  }
  for (const Block& b : all) std::free(b.p);
}

}  // namespace flowjit::runtime
