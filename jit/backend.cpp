// backend: the registration table. A new backend is one line here (and its
// adapter in jit/backends/).
#include "jit/backend.h"

#include "ir/error.h"
#include "jit/backends/backends.h"

namespace flowjit::jit {

namespace {

std::vector<std::string> no_files() { return {}; }

struct Registration {
  Target::Kind kind;
  std::unique_ptr<Backend> (*make)(const JobDescription&, const Target&, const RunDevice&);
  OptimizeOptions (*optimize_options)(const Target&);  // what its code generator computes
  const char* triple_prefix;  // of the targets (TargetId::triple) its entries record
  CachedCodeChecks checks;    // its cache_files() and check_cached(), without a job
};

const Registration kBackends[] = {
    {Target::Kind::Cpu,
     &backends::make_cpu,
     &backends::cpu_optimize_options,
     "x86_64-",
     {&no_files, &backends::check_cached_cpu}},
    {Target::Kind::Gpu,
     &backends::make_nvptx,
     &backends::nvptx_optimize_options,
     "nvptx64-",
     {&backends::nvptx_cache_files, &backends::check_cached_nvptx}},
};

}  // namespace

std::unique_ptr<Backend> make_backend(const JobDescription& job, const Target& target,
                                      const RunDevice& device) {
  for (const Registration& r : kBackends)
    if (r.kind == target.kind) return r.make(job, target, device);
  FJ_CHECK(false, "no backend registered for target kind ", static_cast<int>(target.kind));
  return nullptr;
}

OptimizeOptions optimize_options(const Target& target) {
  for (const Registration& r : kBackends)
    if (r.kind == target.kind) return r.optimize_options(target);
  FJ_CHECK(false, "no backend registered for target kind ", static_cast<int>(target.kind));
  return {};
}

const CachedCodeChecks* cached_code_checks(const std::string& target) {
  for (const Registration& r : kBackends)
    if (target.rfind(r.triple_prefix, 0) == 0) return &r.checks;
  return nullptr;
}

}  // namespace flowjit::jit
