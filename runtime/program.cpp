// Program: the defaults every kind of program shares.
#include "runtime/program.h"

#include "ir/error.h"
#include "runtime/executable.h"

namespace flowjit::runtime {

namespace {
// A run that finished inside start().
class FinishedRun : public PendingRun {
 public:
  void complete() override {}
};
}  // namespace

std::vector<ProgramSlot> Program::input_slots() const {
  std::vector<ProgramSlot> out;
  for (const ir::TensorType& t : plan().inputs) out.push_back({t, 1, false});
  return out;
}

std::vector<ProgramSlot> Program::output_slots() const {
  std::vector<ProgramSlot> out;
  for (const ir::TensorType& t : plan().outputs) out.push_back({t, 1, false});
  return out;
}

std::shared_ptr<PendingRun> Program::start(const void* const* inputs, std::vector<void*> outputs) {
  run(inputs, outputs.data());
  return std::make_shared<FinishedRun>();
}

void Program::bind(VariableStore&, const std::shared_ptr<DeviceState>&) {
  FJ_CHECK(false, "job '", plan().job_name, "' on ", device(),
           " binds its parts when it is made, not afterwards");
}

std::shared_ptr<Program> Program::instance_for(VariableStore&,
                                               const std::shared_ptr<DeviceState>&) const {
  throw_user(ErrorKind::NotImplemented, "job '", plan().job_name, "' runs on ", device(),
             ", which cannot be one device of a job spread over several");
}

void Program::set_device(std::shared_ptr<Communicator>, int) {
  throw_user(ErrorKind::NotImplemented, "job '", plan().job_name, "' runs on ", device(),
             ", which cannot be one device of a job spread over several");
}

void Program::gather_variable_pieces(size_t, void*, int64_t, int64_t) {
  throw_user(ErrorKind::NotImplemented, "job '", plan().job_name, "' runs on ", device(),
             ", which cannot gather split variables between processes");
}

size_t Program::count_arrays(const std::vector<ProgramSlot>& slots) {
  size_t n = 0;
  for (const ProgramSlot& s : slots) n += static_cast<size_t>(s.arrays);
  return n;
}

}  // namespace flowjit::runtime
