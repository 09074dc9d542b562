// Running the segments of a job placed on several device sets.
#include "runtime/staged.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <set>
#include <thread>

#include "ir/error.h"

namespace flowjit::runtime {

StagedProgram::StagedProgram(std::string job_name, std::vector<Segment> segments,
                             std::vector<Wire> outputs, std::vector<ir::TensorType> inputs,
                             std::vector<ir::TensorType> result_types)
    : segments_(std::move(segments)), outputs_(std::move(outputs)) {
  FJ_CHECK(!segments_.empty(), "a staged job without segments");
  plan_.job_name = std::move(job_name);
  plan_.inputs = std::move(inputs);
  plan_.outputs = std::move(result_types);
  std::set<std::string> seen;
  int stages = 0;
  for (size_t s = 0; s < segments_.size(); ++s) {
    const Segment& seg = segments_[s];
    const Plan& p = seg.program->plan();
    for (auto& v : p.variables)
      if (seen.insert(v.first).second) plan_.variables.push_back(v);
    for (auto& l : p.launches) plan_.launches.push_back(l);
    plan_.arena_bytes += p.arena_bytes;
    std::vector<AlignedBuffer> outs;
    for (const ProgramSlot& slot : seg.program->output_slots()) {
      FJ_CHECK(slot.arrays == 1, "a segment with per-device results");
      outs.push_back(
          allocate_aligned(static_cast<size_t>(std::max<int64_t>(slot.type.bytes(), 1))));
    }
    buffers_.push_back(std::move(outs));
    std::vector<int> wait = seg.after;
    for (const Wire& w : seg.inputs) {
      FJ_CHECK(w.segment < static_cast<int>(s), "segment ", s, " takes an input of segment ",
               w.segment, ", which runs after it");
      if (w.segment >= 0) wait.push_back(w.segment);
    }
    std::sort(wait.begin(), wait.end());
    wait.erase(std::unique(wait.begin(), wait.end()), wait.end());
    waits_.push_back(std::move(wait));
    stages = std::max(stages, seg.stage + 1);
  }
  by_stage_.resize(stages);
  for (size_t s = 0; s < segments_.size(); ++s)
    by_stage_[segments_[s].stage].push_back(static_cast<int>(s));
}

std::vector<const Executable*> StagedProgram::host_devices() const {
  std::vector<const Executable*> out;
  for (const Segment& s : segments_)
    for (const Executable* e : s.program->host_devices()) out.push_back(e);
  return out;
}

void StagedProgram::run(const void* const* inputs, void* const* outputs) {
  const size_t n = segments_.size();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> done(n, 0);
  bool failed = false;
  std::exception_ptr error;
  auto source = [&](const Wire& w) -> const void* {
    return w.segment < 0 ? inputs[w.index] : buffers_[w.segment][w.index].get();
  };
  auto run_stage = [&](int stage) {
    for (int s : by_stage_[stage]) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] {
          if (failed) return true;
          for (int w : waits_[s])
            if (!done[w]) return false;
          return true;
        });
        if (failed) return;
      }
      try {
        const Segment& seg = segments_[s];
        std::vector<const void*> ins;
        for (const Wire& w : seg.inputs) ins.push_back(source(w));
        std::vector<void*> outs;
        for (auto& b : buffers_[s]) outs.push_back(b.get());
        seg.program->run(ins.data(), outs.data());
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed = true;
        cv.notify_all();
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        done[s] = 1;
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> threads;
  for (size_t st = 1; st < by_stage_.size(); ++st)
    if (!by_stage_[st].empty()) threads.emplace_back(run_stage, static_cast<int>(st));
  run_stage(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  for (size_t o = 0; o < outputs_.size(); ++o)
    std::memcpy(outputs[o], source(outputs_[o]), static_cast<size_t>(plan_.outputs[o].bytes()));
}

}  // namespace flowjit::runtime
