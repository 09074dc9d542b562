// What the CPU and GPU compile drivers (jit/compile.cpp, jit/compile_gpu.cpp)
// share: filling a disk-cache entry and publishing it.
#pragma once

#include <string>

#include "jit/cache.h"
#include "jit/compile.h"
#include "jit/pipeline.h"

namespace flowjit::jit::detail {

// The fields every entry has: key, plan, IR texts, job, build and plan
// facts. The caller adds the code (object, llvm_ir, extra files), target and
// codegen time.
CacheEntry common_cache_entry(const CompiledJob& out, const JobDescription& job,
                              const runtime::Plan& plan, double compile_seconds);

// Stores `e` (a read-only or full cache degrades to in-memory with one
// warning per directory), then bounds the cache's size; logs both.
void publish_cache_entry(DiskCache& cache, const CacheEntry& e, CompiledJob& out, PassLog& log);

}  // namespace flowjit::jit::detail
