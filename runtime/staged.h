// A job placed on several device sets (jit/stages.h): its segments, each a
// Program on one device set, run as one program. Every placement has a
// thread (the first runs on the caller's); it runs its segments in level
// order, each as soon as the segments it takes inputs from have finished,
// so placements whose inputs are ready run side by side. A value passed
// between device sets is the producer's output buffer, which the user reads
// in place: CPU devices of one process share memory, so the transfer is the
// producer writing its result (a split stage writes its rows of the whole).
// One run is one batch: micro-batches, which would let the first stage start
// the next batch while the second works on this one, are not done.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/executable.h"
#include "runtime/memory.h"
#include "runtime/program.h"

namespace flowjit::runtime {

class StagedProgram : public Program {
 public:
  // Output `index` of segment `segment`, or job input `index` (segment -1).
  struct Wire {
    int segment = -1;
    int index = 0;
  };
  struct Segment {
    std::shared_ptr<Program> program;
    int stage = 0;
    std::vector<Wire> inputs;  // per input slot of `program`
    std::vector<int> after;    // segments to wait for besides the producers
  };
  StagedProgram(std::string job_name, std::vector<Segment> segments, std::vector<Wire> outputs,
                std::vector<ir::TensorType> inputs, std::vector<ir::TensorType> result_types);

  // A summary: the job's logical inputs and results, every segment's
  // variables and launches.
  const Plan& plan() const override { return plan_; }
  std::string device() const override { return "cpu"; }
  // Each segment knows whether it writes variables.
  void set_writes_variables(bool) override {}
  std::vector<const Executable*> host_devices() const override;
  int num_segments() const { return static_cast<int>(segments_.size()); }

  // Not reentrant (callers serialize runs).
  void run(const void* const* inputs, void* const* outputs) override;

 private:
  std::vector<Segment> segments_;
  std::vector<Wire> outputs_;
  Plan plan_;
  std::vector<std::vector<AlignedBuffer>> buffers_;  // per segment, per output
  std::vector<std::vector<int>> by_stage_;           // segments of each placement, in order
  std::vector<std::vector<int>> waits_;              // per segment
};

}  // namespace flowjit::runtime
