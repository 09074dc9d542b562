// The launch record: what one step of a compiled job runs, as data that
// fusion produces, a backend's code generator completes and the runtime
// executes. It is the contract between codegen/ and runtime/, so it lives
// below both (tools/check_layering.py: abi/ includes only ir/ and abi/).
//
//   fusion (jit/)       symbol, buffers, summary, optional collective step
//   codegen/<backend>   the geometry of each coded launch: a CPU range or a
//                       GPU grid, written into the record itself
//   runtime/            runs the record as it is; runtime::Plan serializes
//                       it (the disk cache's plan.txt), in one place
//
// Nothing converts a launch record into another type on the way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ir/types.h"

namespace flowjit::abi {

enum class BufferKind : uint8_t { Input, Output, Variable, Arena };

struct BufferRef {
  BufferKind kind = BufferKind::Arena;
  int32_t index = 0;         // input/output/variable index (unused for Arena)
  int64_t offset_bytes = 0;  // arena offset, or offset into the named buffer
  bool operator==(const BufferRef& o) const {
    return kind == o.kind && index == o.index && offset_bytes == o.offset_bytes;
  }
};

// A collective run between kernels (args {operand, result}): op, dtype,
// parts, and the [outer][inner] element counts of one device's piece (see
// runtime/comm/collective.h).
//
// complete_before >= 0 (all_reduce and all_gather): the collective may run on the
// device's communication thread while the launches after it run; it must
// be complete before launch `complete_before` (the first that touches its
// operand or result; the plan's size: the end of the run). The compiler
// keeps both buffers alive until then. -1: it runs in place, synchronously.
struct CollectiveStep {
  enum class Op : uint8_t { AllReduce, AllGather, ReduceScatter, LocalSlice } op = Op::AllReduce;
  ir::DType dtype = ir::DType::Float32;
  int64_t parts = 1, outer = 1, inner = 1;
  int64_t complete_before = -1;
  bool operator==(const CollectiveStep& o) const {
    return op == o.op && dtype == o.dtype && parts == o.parts && outer == o.outer &&
           inner == o.inner && complete_before == o.complete_before;
  }
};

// A CPU launch: fn(args, begin, end, scratch) over [0, range), split into
// chunks of at least `grain` iterations on the thread pool; each thread
// gets `scratch_bytes` of scratch memory. What fusion leaves before codegen
// (and what a collective, which has no code, keeps): {1, 1, 0}.
struct CpuRange {
  int64_t range = 1;  // iterations of the parallel loop
  int64_t grain = 1;  // smallest chunk worth a task
  int64_t scratch_bytes = 0;
  bool operator==(const CpuRange& o) const {
    return range == o.range && grain == o.grain && scratch_bytes == o.scratch_bytes;
  }
};

// A GPU launch: cuLaunchKernel's grid, block and dynamic shared memory.
// The kernels loop (grid-stride) over their work, so the grid may be capped.
struct GpuGrid {
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t shared_bytes = 0;  // dynamic shared memory (0: all static)
  bool operator==(const GpuGrid& o) const {
    return std::equal(grid, grid + 3, o.grid) && std::equal(block, block + 3, o.block) &&
           shared_bytes == o.shared_bytes;
  }
};

using Geometry = std::variant<CpuRange, GpuGrid>;

struct Launch {
  std::string symbol;  // the kernel's symbol; for a collective, a name for dumps only
  std::vector<BufferRef> args;
  Geometry geometry;                         // written by the backend's codegen
  std::string summary;                       // what the kernel computes, for dumps
  std::optional<CollectiveStep> collective;  // set: no code, the runtime runs this collective

  // The geometry of a launch that is known to be of one kind (the runtime
  // of that kind checks every launch when it loads a plan); null otherwise.
  const CpuRange* cpu() const { return std::get_if<CpuRange>(&geometry); }
  const GpuGrid* gpu() const { return std::get_if<GpuGrid>(&geometry); }
};

}  // namespace flowjit::abi
