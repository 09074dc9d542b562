// backend: the registration table. A new backend is one line here (and its
// adapter in jit/backends/).
#include "jit/backend.h"

#include "ir/error.h"
#include "jit/backends/backends.h"

namespace flowjit::jit {

namespace {

struct Registration {
  Target::Kind kind;
  std::unique_ptr<Backend> (*make)(const JobDescription&, const Target&, const RunDevice&);
};

constexpr Registration kBackends[] = {
    {Target::Kind::Cpu, &backends::make_cpu},
    {Target::Kind::Gpu, &backends::make_nvptx},
};

}  // namespace

std::unique_ptr<Backend> make_backend(const JobDescription& job, const Target& target,
                                      const RunDevice& device) {
  for (const Registration& r : kBackends)
    if (r.kind == target.kind) return r.make(job, target, device);
  FJ_CHECK(false, "no backend registered for target kind ", static_cast<int>(target.kind));
  return nullptr;
}

}  // namespace flowjit::jit
