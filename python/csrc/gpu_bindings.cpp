// Bindings: the session's GPUs (discovery, the devices jobs are placed on,
// their variable copies).
#include "python/csrc/gpu_bindings.h"

#include <pybind11/stl.h>

#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <thread>

#include "codegen/nvptx/backend.h"
#include "ir/error.h"
#include "python/csrc/bindings.h"
#include "python/csrc/session.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/driver_api.h"
#include "runtime/cuda/nccl.h"
#include "runtime/distributed.h"

namespace flowjit::python {

namespace rc = runtime::cuda;

namespace {

struct SessionGpu {
  std::shared_ptr<rc::Device> device;
  std::shared_ptr<rc::DeviceVariables> variables;
  uint64_t generation = 0;
};

std::mutex g_gpus_mu;

// Never destroyed: releasing contexts and device memory from static
// destructors would call a driver that may already be torn down at exit.
std::map<int, SessionGpu>& session_gpus() {
  static auto* gpus = new std::map<int, SessionGpu>();
  return *gpus;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  std::string s = v ? v : "";
  return !(s.empty() || s == "0" || s == "false" || s == "no" || s == "off");
}

// Why GPU `ordinal` cannot be used, or "" when it can (without opening it).
std::string gpu_problem(int ordinal) {
  std::string why;
  if (!rc::driver_available(&why)) return why;
  int n = rc::device_count();
  if (n == 0) return "the CUDA driver (" + rc::driver().library + ") sees no GPU";
  if (ordinal < 0 || ordinal >= n)
    return "GPU " + std::to_string(ordinal) + " does not exist: the CUDA driver sees " +
           std::to_string(n) +
           (n == 1 ? " GPU (GPU 0)" : " GPUs (GPU 0 to " + std::to_string(n - 1) + ")");
  return "";
}

py::dict info_dict(const rc::DeviceInfo& d) {
  py::dict out;
  out["ordinal"] = d.ordinal;
  out["name"] = d.name;
  out["sm"] = d.sm;
  out["codegen_sm"] = codegen::nvptx::codegen_sm(d.sm);
  out["multiprocessors"] = d.multiprocessors;
  out["total_bytes"] = d.total_bytes;
  out["description"] = d.str();
  return out;
}

}  // namespace

void set_gpu_target(jit::CompileSettings& s, int ordinal) {
  FJ_USER_CHECK(ordinal >= 0, ErrorKind::Value, "GPU ordinal must be non-negative, got ", ordinal);
  std::string why = gpu_problem(ordinal);
  if (!why.empty()) throw_user(ErrorKind::Runtime, why);
  std::lock_guard<std::mutex> lock(g_gpus_mu);
  SessionGpu& g = session_gpus()[ordinal];
  if (!g.device) g.device = rc::Device::open(ordinal);
  uint64_t generation = Session::get().generation();
  if (!g.variables || g.generation != generation) {
    // The jobs of an earlier generation keep the old copies alive while
    // they exist; they never run again (they recompile).
    g.variables = std::make_shared<rc::DeviceVariables>(g.device);
    g.generation = generation;
  }
  s.target.kind = jit::Target::Kind::Gpu;
  s.device.state = g.variables;
  s.target.allow_tf32 = env_flag("FLOWJIT_ALLOW_TF32");
}

std::vector<runtime::VariableStore*> GpuGroup::store_ptrs() const {
  std::vector<runtime::VariableStore*> out;
  for (auto& st : stores) out.push_back(st.get());
  return out;
}

std::shared_ptr<GpuGroup> gpu_group(const std::vector<int>& ordinals, int processes, int first_rank,
                                    int world) {
  static auto* groups =
      new std::map<std::vector<int>, std::pair<uint64_t, std::shared_ptr<GpuGroup>>>();
  uint64_t generation = Session::get().generation();
  {
    std::lock_guard<std::mutex> lock(g_gpus_mu);
    auto it = groups->find(ordinals);
    if (it != groups->end() && it->second.first == generation) return it->second.second;
  }
  auto g = std::make_shared<GpuGroup>();
  std::vector<std::shared_ptr<rc::Device>> devices;
  for (int o : ordinals) {
    jit::CompileSettings one;
    set_gpu_target(one, o);
    std::shared_ptr<rc::Device> device;
    {
      std::lock_guard<std::mutex> lock(g_gpus_mu);
      device = session_gpus().at(o).device;
    }
    devices.push_back(device);
    // Copies of the replicas, not of the session's variables (which jobs on
    // this GPU alone bind): the two meet through the host.
    g->copies.push_back(std::make_shared<rc::DeviceVariables>(device));
    g->stores.push_back(std::make_unique<runtime::VariableStore>());
  }
  std::string why;
  const int gpus = static_cast<int>(ordinals.size());
  if (!rc::nccl_available(&why))
    throw_user(ErrorKind::Runtime, "a job on ", gpus * processes, " GPUs needs NCCL: ", why);
  if (processes <= 1) {
    g->comm = rc::NcclCommunicator::create(devices);
  } else {
    // The NCCL id: process 0's, gathered over the session's communicator,
    // whose every rank (each CPU device of each process) takes part, each
    // from its own thread as the communicator's contract asks.
    Session& s = Session::get();
    std::shared_ptr<runtime::Communicator> session = s.communicator();
    const int local = s.local_devices();
    FJ_CHECK(session && s.several_processes() && session->size() == processes * local,
             "GPU jobs over ", processes, " processes without the session's communicator");
    FJ_CHECK(world >= gpus && first_rank >= 0 && first_rank + gpus <= world, "GPU ranks ",
             first_rank, "..", first_rank + gpus - 1, " of ", world);
    const int first = s.first_rank();
    const size_t n = static_cast<size_t>(session->size());
    std::vector<rc::ncclUniqueId> mine(static_cast<size_t>(local));
    std::vector<std::vector<rc::ncclUniqueId>> all(static_cast<size_t>(local),
                                                   std::vector<rc::ncclUniqueId>(n));
    if (first == 0) mine[0] = rc::nccl_unique_id();
    std::vector<std::exception_ptr> errors(static_cast<size_t>(local));
    auto gather = [&](int d) {
      try {
        session->all_gather(first + d, &mine[static_cast<size_t>(d)],
                            all[static_cast<size_t>(d)].data(), 1, sizeof(rc::ncclUniqueId));
      } catch (...) {
        errors[static_cast<size_t>(d)] = std::current_exception();
        session->abort("sharing the NCCL id failed");
      }
    };
    {
      std::vector<std::thread> others;
      for (int d = 1; d < local; ++d) others.emplace_back(gather, d);
      gather(0);
      for (auto& t : others) t.join();
    }
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    const rc::ncclUniqueId id = all[0][0];
    g->first_rank = first_rank;
    g->several_processes = true;
    g->comm = rc::NcclCommunicator::create(id, world, first_rank, devices);
  }
  std::lock_guard<std::mutex> lock(g_gpus_mu);
  (*groups)[ordinals] = {generation, g};
  return g;
}

// ---------------------------------------------------------------- module

void register_gpu(py::module_& m) {
  m.def(
      "gpu_status",
      [](int ordinal) {
        // Never raises: the Python layer turns the reason into its error
        // (or a warning, with CPU fallback).
        py::dict d;
        std::string why;
        {
          GilRelease release;
          why = gpu_problem(ordinal);
        }
        d["available"] = why.empty();
        d["reason"] = why;
        d["ordinal"] = ordinal;
        return d;
      },
      py::arg("ordinal") = 0,
      "Whether GPU `ordinal` can run jobs; 'reason' says why not (no driver, no GPU).");
  m.def(
      "gpu_devices",
      [] {
        std::string why;
        if (!rc::driver_available(&why)) throw_user(ErrorKind::Runtime, why);
        py::list out;
        for (const rc::DeviceInfo& d : rc::list_devices()) out.append(info_dict(d));
        return out;
      },
      "The GPUs the CUDA driver sees (RuntimeError without a driver).");
  m.def(
      "gpu_variable_on_device",
      [](const std::string& name, int ordinal) {
        // For tests: whether GPU `ordinal` holds a newer value of the
        // variable than the host (a read would download it).
        runtime::VariableStorage* v = default_store().find(name);
        if (!v) throw_user(ErrorKind::Value, "no variable named '", name, "' in the session");
        std::lock_guard<std::mutex> lock(g_gpus_mu);
        auto it = session_gpus().find(ordinal);
        return it != session_gpus().end() && it->second.variables &&
               it->second.variables->holds_newest(*v);
      },
      py::arg("name"), py::arg("ordinal") = 0);
}

}  // namespace flowjit::python
