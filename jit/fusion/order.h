// fusion's launch-order stage: the kernels' dependences in, an order out.
//
// Kahn's algorithm over data dependences (a kernel runs after the kernels
// whose results it reads) and anti dependences (the readers of a variable's
// old value run before the kernel that overwrites it); ties go to program
// order. Collectives start as early as they can and their consumers run as
// late as they can, so that the runtime exchanges on its communication thread
// while the kernels between them run: first the kernels that compute an
// operand of a collective (a backward pass's gradients), then all ready
// collectives at once (adjacent all_reduces are one bucket), then other
// kernels, and the kernels that read a collective's result only when nothing
// else is ready, in the order their collectives were launched.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace flowjit::jit::fusion_detail {

// One kernel (or collective launch) as the order sees it.
struct LaunchDeps {
  bool collective = false;
  int program_pos = 0;                  // its root's position in program order
  std::vector<int> reads;               // the launches whose results it reads
  std::vector<std::string> var_reads;   // variables it reads
  std::vector<std::string> var_writes;  // variables it writes
};

// The launches' indices in launch order; nullopt when the dependences have
// a cycle.
std::optional<std::vector<int>> launch_order(const std::vector<LaunchDeps>& launches);

}  // namespace flowjit::jit::fusion_detail
