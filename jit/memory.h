// memory: arena offsets for intermediate buffers from their live ranges.
//
// Each buffer is live from the launch that writes it to the last launch that
// reads it (inclusive). Buffers whose ranges overlap get disjoint, 64-byte
// aligned offsets; others may share memory. Greedy first fit in order of
// first use: the classic interval packing, not optimal but within a small
// factor of the peak live size.
#pragma once

#include <cstdint>
#include <vector>

namespace flowjit::jit {

struct BufferLife {
  int64_t bytes = 0;
  int first = 0;  // launch index that writes it
  int last = 0;   // last launch index that reads it
};

struct ArenaPlan {
  std::vector<int64_t> offsets;  // per buffer
  int64_t arena_bytes = 0;
  int64_t total_bytes = 0;  // sum of sizes, for "saved by reuse" reporting
};

ArenaPlan plan_arena(const std::vector<BufferLife>& buffers);

}  // namespace flowjit::jit
