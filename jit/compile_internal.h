// What the CPU and GPU compile drivers (jit/compile.cpp, jit/compile_gpu.cpp)
// share: filling a disk-cache entry and publishing it.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "jit/cache.h"
#include "jit/compile.h"
#include "jit/fusion.h"
#include "jit/pipeline.h"

namespace flowjit::jit::detail {

inline double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
inline std::string short_key(const std::string& key) { return key.substr(0, 12); }

// Whether the optimized LLVM IR is kept on the result (debug, dumps, tests).
inline bool keep_llvm_ir(const CompileSettings& s) {
  return s.debug >= 3 || s.keep_text || !s.dump_dir.empty();
}

// The disk cache of `settings` (none when disabled), with out.cache_key set
// from everything that decides the generated code for `target`. An
// unparsable FLOWJIT_CACHE_MAX_BYTES warns once per process.
std::optional<DiskCache> open_cache(const CompileSettings& settings, const FusedProgram& fp,
                                    const std::string& target, CompiledJob& out);

// A lookup that found nothing usable: logs the miss, or for a damaged entry
// (already removed by the caller when it could) warns once on `out` that the
// job is recompiled. Returns true when `found` is not a hit.
bool note_cache_miss(DiskCache::Found found, const std::string& why, DiskCache& cache,
                     const std::string& key, const std::string& job_name, CompiledJob& out,
                     PassLog& log, std::chrono::steady_clock::time_point t0);

// The fields every entry has: key, plan, IR texts, job, build and plan
// facts. The caller adds the code (object, llvm_ir, extra files), target and
// codegen time.
CacheEntry common_cache_entry(const CompiledJob& out, const JobDescription& job,
                              const runtime::Plan& plan, double compile_seconds);

// Stores `e` (a read-only or full cache degrades to in-memory with one
// warning per directory), then bounds the cache's size; logs both.
void publish_cache_entry(DiskCache& cache, const CacheEntry& e, CompiledJob& out, PassLog& log);

}  // namespace flowjit::jit::detail
