// CudaExecutable: module loading, device buffers, staged runs tracked by events.
#include "runtime/cuda/executable.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <sstream>

#include "ir/error.h"
#include "runtime/cuda/nccl.h"
#include "runtime/distributed.h"

namespace flowjit::runtime::cuda {

namespace {
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

// ---------------------------------------------------------------- variables

struct DeviceVariables::Slot {
  ir::TensorType type;
  DeviceBuffer buf;
  std::shared_ptr<Device> device;
  bool current = false;              // holds the newest value (alone, or with the host)
  VariableStorage* owner = nullptr;  // null once the variable is gone (session cleared)
};

namespace {

using Slot = DeviceVariables::Slot;

void copy_to_device(Slot& s, const VariableStorage& v) {
  if (v.type.bytes() == 0) return;
  const Device& d = *s.device;
  Device::Scope scope(d);
  const size_t bytes = static_cast<size_t>(v.type.bytes());
  const std::string context = "uploading variable '" + v.name + "' to " + d.info().str();
  const DriverApi& api = d.api();
  check(api, api.cuMemcpyHtoDAsync(s.buf.ptr(), v.ptr(), bytes, d.stream()), "cuMemcpyHtoDAsync",
        context);
  check(api, api.cuStreamSynchronize(d.stream()), "cuStreamSynchronize", context);
}

void copy_to_host(const Slot& s, VariableStorage& v) {
  if (v.type.bytes() == 0) return;
  const Device& d = *s.device;
  Device::Scope scope(d);
  // On the stream of the runs: the copy waits for the kernels that write v.
  const size_t bytes = static_cast<size_t>(v.type.bytes());
  const std::string context = "downloading variable '" + v.name + "' from " + d.info().str();
  const DriverApi& api = d.api();
  check(api, api.cuMemcpyDtoHAsync(v.ptr(), s.buf.ptr(), bytes, d.stream()), "cuMemcpyDtoHAsync",
        context);
  check(api, api.cuStreamSynchronize(d.stream()), "cuStreamSynchronize", context);
}

// VariableStorage::device_copies of a variable that GPU jobs use: which of
// the host and the GPU copies hold the newest value. At most one GPU copy
// is newer than the host: a run on another GPU first brings the value over
// through the host.
class GpuCopies final : public DeviceCopies {
 public:
  ~GpuCopies() override {
    for (auto& w : slots)
      if (auto s = w.lock()) s->owner = nullptr;
  }

  bool sync_host(VariableStorage& host) override {
    if (host_current) return false;
    for (auto& w : slots) {
      auto s = w.lock();
      if (s && s->current) {
        copy_to_host(*s, host);
        host_current = true;
        return true;
      }
    }
    host_current = true;  // reported once; the host value is what remains
    throw_user(ErrorKind::Runtime, "variable '", host.name,
               "': its newest value was on a GPU "
               "whose device copies were released before it was brought back to the host");
  }

  void host_written() override {
    host_current = true;
    for (auto& w : slots)
      if (auto s = w.lock()) s->current = false;
  }

  // Makes `s` the only copy with the newest value.
  void device_written(Slot& s) {
    host_current = false;
    for (auto& w : slots)
      if (auto o = w.lock()) o->current = o.get() == &s;
  }

  void add(const std::shared_ptr<Slot>& s) {
    slots.erase(std::remove_if(slots.begin(), slots.end(), [](auto& w) { return w.expired(); }),
                slots.end());
    slots.push_back(s);
  }

  bool host_current = true;
  std::vector<std::weak_ptr<Slot>> slots;  // one per GPU holding a copy
};

GpuCopies& gpu_copies(VariableStorage& v) {
  if (!v.device_copies) v.device_copies = std::make_unique<GpuCopies>();
  auto* c = dynamic_cast<GpuCopies*>(v.device_copies.get());
  FJ_CHECK(c != nullptr, "variable '", v.name, "' has device copies of another kind");
  return *c;
}

}  // namespace

DeviceVariables::~DeviceVariables() {
  // A value only this device holds goes back to the host first, so that
  // releasing a GPU's copies never loses what its runs computed.
  for (auto& [name, s] : vars_) {
    if (!s->owner || !s->current) continue;
    auto* c = dynamic_cast<GpuCopies*>(s->owner->device_copies.get());
    if (!c || c->host_current) continue;
    try {
      c->sync_host(*s->owner);
    } catch (...) {  // nothing to report from a destructor
    }
  }
}

std::shared_ptr<Slot> DeviceVariables::slot(VariableStorage& v, bool* created) {
  *created = false;
  auto it = vars_.find(v.name);
  if (it != vars_.end()) {
    if (it->second->owner == &v) {
      FJ_CHECK(it->second->type == v.type, "variable '", v.name, "' is ", v.type.str(),
               " on the host but ", it->second->type.str(), " on the GPU");
      return it->second;
    }
    // A copy of an earlier variable of this name (the session was cleared
    // and the name reused): its value means nothing now.
    vars_.erase(it);
  }
  auto s = std::make_shared<Slot>();
  s->type = v.type;
  s->buf = DeviceBuffer(d_, static_cast<uint64_t>(std::max<int64_t>(v.type.bytes(), 1)));
  s->device = d_;
  s->owner = &v;
  // The newest value, wherever it is (another GPU, CPU devices), via the host.
  runtime::sync_host(v);
  copy_to_device(*s, v);
  s->current = true;
  gpu_copies(v).add(s);
  *created = true;
  return vars_.emplace(v.name, s).first->second;
}

CUdeviceptr DeviceVariables::get(VariableStorage& v) {
  std::lock_guard<std::mutex> lock(mu_);
  bool created;
  return slot(v, &created)->buf.ptr();
}

CUdeviceptr DeviceVariables::prepare(VariableStorage& v) {
  std::lock_guard<std::mutex> lock(mu_);
  bool created;
  auto s = slot(v, &created);
  if (!s->current) {
    runtime::sync_host(v);
    copy_to_device(*s, v);
    s->current = true;
  }
  return s->buf.ptr();
}

void DeviceVariables::written(VariableStorage& v) {
  std::lock_guard<std::mutex> lock(mu_);
  bool created;
  auto s = slot(v, &created);
  gpu_copies(v).device_written(*s);
  // The CPU devices of distributed jobs get the value through the host.
  if (v.replicas) {
    v.replicas->devices_stale = true;
    v.replicas->host_stale = false;
  }
}

void DeviceVariables::upload(VariableStorage& v) {
  std::lock_guard<std::mutex> lock(mu_);
  bool created;
  auto s = slot(v, &created);
  if (created) return;  // slot() just uploaded it
  gpu_copies(v).host_written();
  copy_to_device(*s, v);
  s->current = true;
}

void DeviceVariables::download(VariableStorage& v) {
  if (v.device_copies) v.device_copies->sync_host(v);
}

void DeviceVariables::download_all(VariableStore& store) {
  for (VariableStorage* v : store.all())
    if (has(*v)) download(*v);
}

bool DeviceVariables::has(const VariableStorage& v) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = vars_.find(v.name);
  return it != vars_.end() && it->second->owner == &v;
}

bool DeviceVariables::holds_newest(const VariableStorage& v) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = vars_.find(v.name);
  if (it == vars_.end() || it->second->owner != &v || !it->second->current) return false;
  auto* c = dynamic_cast<const GpuCopies*>(v.device_copies.get());
  return c && !c->host_current;
}

// ---------------------------------------------------------------- executable

CudaExecutable::CudaExecutable(std::shared_ptr<Device> d, Plan plan, const GpuImage& image)
    : d_(std::move(d)), plan_(std::move(plan)), image_(image) {
  for (const Launch& l : plan_.launches)
    FJ_CHECK(l.collective || l.gpu() != nullptr, "job '", plan_.job_name, "': launch ", l.symbol,
             " has no GPU grid");
  buckets_ = all_reduce_buckets(plan_);
  bucketed_.assign(buckets_.size(), false);
  for (const std::vector<size_t>& b : buckets_)
    for (size_t k = 1; k < b.size(); ++k) bucketed_[b[k]] = true;
  try {
    load_and_allocate(image);
  } catch (...) {
    release_driver_objects();
    throw;
  }
}

void CudaExecutable::load_and_allocate(const GpuImage& image) {
  const DriverApi& api = d_->api();
  Device::Scope scope(*d_);

  // The module: the cubin when it was made for this SM, otherwise the PTX.
  bool use_cubin = !image.cubin.empty() && image.cubin_sm == d_->info().sm;
  std::string ptx_z = image.ptx;  // NUL-terminated for the driver
  const void* data = use_cubin ? static_cast<const void*>(image.cubin.data()) : ptx_z.c_str();
  FJ_USER_CHECK(use_cubin || !image.ptx.empty(), ErrorKind::Runtime, "job '", plan_.job_name,
                "': no GPU code for ", d_->info().str(), " (a cubin for sm_", image.cubin_sm,
                " and no PTX)");
  std::vector<char> error_log(16384, 0), info_log(16384, 0);
  int options[] = {kJitErrorLogBuffer, kJitErrorLogBufferSizeBytes, kJitInfoLogBuffer,
                   kJitInfoLogBufferSizeBytes};
  void* values[] = {error_log.data(), reinterpret_cast<void*>(error_log.size() - 1),
                    info_log.data(), reinterpret_cast<void*>(info_log.size() - 1)};
  CUresult r = api.cuModuleLoadDataEx(&module_, data, 4, options, values);
  std::string cubin_rejected;
  if (r != kCudaSuccess && use_cubin && !image.ptx.empty()) {
    // A cubin from a toolkit newer than the driver can be refused where the
    // PTX is not: the driver compiles that instead.
    cubin_rejected = error_text(api, r);
    use_cubin = false;
    module_ = nullptr;
    std::fill(error_log.begin(), error_log.end(), 0);
    r = api.cuModuleLoadDataEx(&module_, ptx_z.c_str(), 4, options, values);
  }
  if (r != kCudaSuccess) {
    std::string log = error_log.data();
    check(
        api, r, "cuModuleLoadDataEx",
        "loading the kernels of job '" + plan_.job_name + "' as " +
            (use_cubin ? "a cubin for sm_" + std::to_string(image.cubin_sm) : std::string("PTX")) +
            " on " + d_->info().str() + (log.empty() ? "" : "; driver log: " + log) +
            (cubin_rejected.empty() ? "" : "; the cubin was rejected too: " + cubin_rejected));
  }
  loaded_from_ = use_cubin ? "cubin sm_" + std::to_string(image.cubin_sm)
                           : "ptx (driver JIT for sm_" + std::to_string(d_->info().sm) + ")";
  if (!cubin_rejected.empty()) loaded_from_ += " after the cubin was rejected: " + cubin_rejected;
  for (const Launch& launch : plan_.launches) {
    if (launch.collective) {  // no kernel: the communicator runs it
      FJ_USER_CHECK(launch.args.size() == 2, ErrorKind::Value, "corrupt compiled plan: collective ",
                    launch.symbol, " needs 2 buffers");
      fns_.push_back(nullptr);
      continue;
    }
    const GpuGrid& l = *launch.gpu();
    CUfunction f = nullptr;
    check(api, api.cuModuleGetFunction(&f, module_, launch.symbol.c_str()), "cuModuleGetFunction",
          "kernel '" + launch.symbol + "' of job '" + plan_.job_name + "'");
    if (l.shared_bytes > 48 * 1024)
      check(api,
            api.cuFuncSetAttribute(f, kFuncAttrMaxDynamicSharedSizeBytes,
                                   static_cast<int>(l.shared_bytes)),
            "cuFuncSetAttribute",
            "kernel '" + launch.symbol + "' asks for " + std::to_string(l.shared_bytes) +
                " bytes of shared memory");
    fns_.push_back(f);
  }

  // Device buffers and pinned staging.
  arena_ = DeviceBuffer(d_, static_cast<uint64_t>(plan_.arena_bytes));
  size_t staged = 0;
  for (const auto& t : plan_.inputs) {
    inputs_.emplace_back(d_, static_cast<uint64_t>(t.bytes()));
    stage_in_.push_back(staged);
    staged += round_up(static_cast<size_t>(t.bytes()), 256);
  }
  for (const auto& t : plan_.outputs) {
    outputs_.emplace_back(d_, static_cast<uint64_t>(t.bytes()));
    stage_out_.push_back(staged);
    staged += round_up(static_cast<size_t>(t.bytes()), 256);
  }
  if (plan_.status_offset >= 0) {
    stage_status_ = staged;
    staged += 256;
  }
  for (size_t li = 0; li < plan_.launches.size(); ++li) {
    if (!is_status_gather(plan_, plan_.launches[li])) continue;
    const CollectiveStep& c = *plan_.launches[li].collective;
    status_gathers_.emplace_back(li, staged);
    staged += round_up(static_cast<size_t>(c.parts * c.inner) * sizeof(int64_t), 256);
  }
  staging_ = PinnedBuffer(d_, staged);
  FLOWJIT_CU(api, cuEventCreate, &done_, kEventDisableTiming);
  // Overlap: per collective, its operand is ready (compute stream) and it is
  // complete (communication stream).
  produced_.assign(plan_.launches.size(), nullptr);
  completed_.assign(plan_.launches.size(), nullptr);
  for (size_t li = 0; li < plan_.launches.size(); ++li) {
    const auto& c = plan_.launches[li].collective;
    if (!c || c->op == CollectiveStep::Op::LocalSlice || bucketed_[li]) continue;
    FLOWJIT_CU(api, cuEventCreate, &produced_[li], kEventDisableTiming);
    FLOWJIT_CU(api, cuEventCreate, &completed_[li], kEventDisableTiming);
  }

  size_t total = 0;
  for (const Launch& l : plan_.launches) {
    arg_start_.push_back(total);
    total += l.args.size();
  }
  arg_values_.assign(total, 0);
  arg_ptrs_.resize(total);
  for (size_t i = 0; i < total; ++i) arg_ptrs_[i] = &arg_values_[i];
  variables_.assign(plan_.variables.size(), 0);
  host_variables_.assign(plan_.variables.size(), nullptr);
  resolve_args();
}

CudaExecutable::~CudaExecutable() { release_driver_objects(); }

void CudaExecutable::release_driver_objects() {
  const DriverApi& api = d_->api();
  try {
    Device::Scope s(*d_);
    if (in_flight_ && done_) api.cuEventSynchronize(done_);
    if (done_) api.cuEventDestroy(done_);
    for (CUevent e : produced_)
      if (e) api.cuEventDestroy(e);
    for (CUevent e : completed_)
      if (e) api.cuEventDestroy(e);
    if (module_) api.cuModuleUnload(module_);
  } catch (...) {  // nothing to report from a destructor
  }
  done_ = nullptr;
  produced_.clear();
  completed_.clear();
  module_ = nullptr;
  in_flight_ = false;
}

void CudaExecutable::resolve_args() {
  for (size_t li = 0; li < plan_.launches.size(); ++li) {
    const Launch& l = plan_.launches[li];
    for (size_t ai = 0; ai < l.args.size(); ++ai) {
      const BufferRef& r = l.args[ai];
      CUdeviceptr base = 0;
      switch (r.kind) {
        case BufferKind::Input:
          base = inputs_.at(r.index).ptr();
          break;
        case BufferKind::Output:
          base = outputs_.at(r.index).ptr();
          break;
        case BufferKind::Variable:
          base = variables_.at(r.index);
          break;
        case BufferKind::Arena:
          base = arena_.ptr();
          break;
      }
      arg_values_[arg_start_[li] + ai] = base + static_cast<CUdeviceptr>(r.offset_bytes);
    }
  }
}

void CudaExecutable::bind_variables(VariableStore& host, DeviceVariables& dev) {
  FJ_CHECK(dev.device() == d_, "device variables of another device");
  for (size_t i = 0; i < plan_.variables.size(); ++i) {
    const auto& [name, type] = plan_.variables[i];
    VariableStorage* v = host.find(name);
    FJ_USER_CHECK(v != nullptr, ErrorKind::Runtime, "job '", plan_.job_name, "' uses variable '",
                  name,
                  "', which no longer exists in the session (was "
                  "flow.clear_default_session() called?)");
    FJ_USER_CHECK(v->type == type, ErrorKind::Value, "job '", plan_.job_name,
                  "' expects variable '", name, "' as ", type.str(), " but the session holds ",
                  v->type.str());
    variables_[i] = dev.get(*v);
    host_variables_[i] = v;
  }
  device_variables_ = &dev;
  resolve_args();
  bound_ = true;
}

std::vector<CUdeviceptr> CudaExecutable::kernel_args(size_t i) const {
  size_t n = plan_.launches.at(i).args.size();
  return {arg_values_.begin() + static_cast<ptrdiff_t>(arg_start_[i]),
          arg_values_.begin() + static_cast<ptrdiff_t>(arg_start_[i] + n)};
}

void CudaExecutable::submit(const void* const* inputs) {
  FJ_CHECK(!in_flight_, "job '", plan_.job_name,
           "': a GPU run was submitted before the previous one finished");
  FJ_CHECK(bound_ || plan_.variables.empty(), "GPU executable run before bind_variables");
  const DriverApi& api = d_->api();
  Device::Scope scope(*d_);
  CUstream s = d_->stream();
  // Variables written on the host (or on another GPU) since the last run.
  bool moved = false;
  for (size_t i = 0; i < host_variables_.size(); ++i) {
    CUdeviceptr p = device_variables_->prepare(*host_variables_[i]);
    moved |= p != variables_[i];
    variables_[i] = p;
  }
  if (moved) resolve_args();
  for (size_t i = 0; i < inputs_.size(); ++i) {
    size_t n = static_cast<size_t>(plan_.inputs[i].bytes());
    if (n == 0) continue;
    char* stage = staging_.data() + stage_in_[i];
    std::memcpy(stage, inputs[i], n);
    check(api, api.cuMemcpyHtoDAsync(inputs_[i].ptr(), stage, n, s), "cuMemcpyHtoDAsync",
          "input " + std::to_string(i) + " of job '" + plan_.job_name + "'");
  }
  // [harden] The status buffer starts at zero (the staged copy of the last
  // run's is zeroed first: finish() read it before this submit).
  const size_t kStatusBytes = 4 * sizeof(int64_t);
  if (plan_.status_offset >= 0) {
    std::memset(staging_.data() + stage_status_, 0, kStatusBytes);
    for (auto& [li, at] : status_gathers_) {
      const CollectiveStep& c = *plan_.launches[li].collective;
      std::memset(staging_.data() + at, 0, static_cast<size_t>(c.parts * c.inner) * 8);
    }
    check(api,
          api.cuMemcpyHtoDAsync(arena_.ptr() + static_cast<CUdeviceptr>(plan_.status_offset),
                                staging_.data() + stage_status_, kStatusBytes, s),
          "cuMemcpyHtoDAsync", "the status buffer of job '" + plan_.job_name + "'");
  }
  // Overlap: a collective with a completion point runs on the communication
  // stream, and the compute stream waits for it just before the launch that
  // needs it (`pending`: its completion point and launch).
  overlapped_ = nccl_ != nullptr && overlap_enabled();
  std::vector<std::pair<int64_t, size_t>> pending;
  auto settle = [&](int64_t li) {
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->first > li) {
        ++it;
        continue;
      }
      check(api, api.cuStreamWaitEvent(s, completed_[it->second], 0), "cuStreamWaitEvent",
            "launch " + std::to_string(li) + " of job '" + plan_.job_name + "' waiting for " +
                plan_.launches[it->second].symbol);
      it = pending.erase(it);
    }
  };
  for (size_t li = 0; li < plan_.launches.size(); ++li) {
    if (!pending.empty()) settle(static_cast<int64_t>(li));
    if (plan_.launches[li].collective) {
      if (!overlapped_ || !completed_[li]) {
        run_collective(li);  // in place on the compute stream (or a later member of a bucket)
        stage_gathered_status(li, s);
        continue;
      }
      int64_t before = enqueue_collective(li);
      if (before > static_cast<int64_t>(li)) {
        pending.emplace_back(before, li);
      } else {
        pending.emplace_back(-1, li);
        settle(static_cast<int64_t>(li));
      }
      continue;
    }
    const GpuGrid& l = *plan_.launches[li].gpu();
    void** params = plan_.launches[li].args.empty() ? nullptr : &arg_ptrs_[arg_start_[li]];
    CUresult r = api.cuLaunchKernel(fns_[li], l.grid[0], l.grid[1], l.grid[2], l.block[0],
                                    l.block[1], l.block[2], l.shared_bytes, s, params, nullptr);
    if (r != kCudaSuccess)
      check(api, r, "cuLaunchKernel",
            "kernel '" + plan_.launches[li].symbol + "' of job '" + plan_.job_name + "', grid " +
                std::to_string(l.grid[0]) + "x" + std::to_string(l.grid[1]) + "x" +
                std::to_string(l.grid[2]) + ", block " + std::to_string(l.block[0]) + "x" +
                std::to_string(l.block[1]) + "x" + std::to_string(l.block[2]));
  }
  settle(std::numeric_limits<int64_t>::max());  // those due at the end of the run
  for (size_t i = 0; i < outputs_.size(); ++i) {
    size_t n = static_cast<size_t>(plan_.outputs[i].bytes());
    if (n == 0) continue;
    check(api, api.cuMemcpyDtoHAsync(staging_.data() + stage_out_[i], outputs_[i].ptr(), n, s),
          "cuMemcpyDtoHAsync", "output " + std::to_string(i) + " of job '" + plan_.job_name + "'");
  }
  if (plan_.status_offset >= 0)
    check(api,
          api.cuMemcpyDtoHAsync(staging_.data() + stage_status_,
                                arena_.ptr() + static_cast<CUdeviceptr>(plan_.status_offset),
                                kStatusBytes, s),
          "cuMemcpyDtoHAsync", "the status buffer of job '" + plan_.job_name + "'");
  FLOWJIT_CU(api, cuEventRecord, done_, s);
  in_flight_ = true;
  // Host reads download after the kernels (same stream), whenever they come.
  if (writes_variables_)
    for (VariableStorage* v : host_variables_) device_variables_->written(*v);
}

bool CudaExecutable::done() {
  if (!in_flight_) return true;
  const DriverApi& api = d_->api();
  Device::Scope scope(*d_);
  CUresult r = api.cuEventQuery(done_);
  if (r == kCudaErrorNotReady) return false;
  if (r != kCudaSuccess) {
    in_flight_ = false;
    check(api, r, "cuEventQuery", "running job '" + plan_.job_name + "' on " + d_->info().str());
  }
  return true;
}

void CudaExecutable::finish(void* const* outputs) {
  FJ_CHECK(in_flight_, "job '", plan_.job_name, "': finish without a submitted GPU run");
  const DriverApi& api = d_->api();
  Device::Scope scope(*d_);
  in_flight_ = false;
  if (overlapped_) {
    // Polled, so that a peer failing (or an abort) stops the wait: the run
    // ends after collectives that wait for the other GPUs.
    nccl_->wait_event(rank_, done_, "the run of job '" + plan_.job_name + "'");
  } else {
    check(api, api.cuEventSynchronize(done_), "cuEventSynchronize",
          "running job '" + plan_.job_name + "' on " + d_->info().str());
  }
  // [harden] A failed check of a distributed run: the first status
  // all_gather that holds one, as the CPU devices raise it
  // (raise_first_gathered_check): every GPU raises the same error,
  // the position in the whole batch, and the communicator stays usable.
  for (auto& [li, at] : status_gathers_)
    raise_first_gathered_check(plan_, *plan_.launches[li].collective,
                               reinterpret_cast<const int64_t*>(staging_.data() + at));
  if (plan_.status_offset >= 0) {  // [harden] a failed check of the run
    const auto* st = reinterpret_cast<const int64_t*>(staging_.data() + stage_status_);
    if (st[0] != 0) {
      int64_t id = st[0] - 1;
      FJ_CHECK(id >= 0 && id < static_cast<int64_t>(plan_.checks.size()), "job '", plan_.job_name,
               "': a GPU kernel reported check #", id, " which the plan does not have");
      const RunCheck& c = plan_.checks[id];
      throw_user(c.numerics ? ErrorKind::FloatingPoint : ErrorKind::Index,
                 describe_failed_check(plan_.job_name, c, st[1], st[2]));
    }
  }
  for (size_t i = 0; i < outputs_.size(); ++i) {
    size_t n = static_cast<size_t>(plan_.outputs[i].bytes());
    if (n > 0) std::memcpy(outputs[i], staging_.data() + stage_out_[i], n);
  }
}

// ---------------------------------------------------------------- collectives

void CudaExecutable::stage_gathered_status(size_t li, CUstream s) {
  for (auto& [gl, at] : status_gathers_) {
    if (gl != li) continue;
    const CollectiveStep& c = *plan_.launches[li].collective;
    const DriverApi& api = d_->api();
    check(api,
          api.cuMemcpyDtoHAsync(staging_.data() + at, arg_values_[arg_start_[li] + 1],
                                static_cast<size_t>(c.parts * c.inner) * sizeof(int64_t), s),
          "cuMemcpyDtoHAsync", "the gathered status of job '" + plan_.job_name + "'");
  }
}

namespace {
DeviceVariables& gpu_copies(const std::shared_ptr<DeviceState>& device) {
  auto* v = dynamic_cast<DeviceVariables*>(device.get());
  FJ_CHECK(v != nullptr, "a GPU program needs its device's variable copies");
  return *v;
}
}  // namespace

void CudaExecutable::bind(VariableStore& store, const std::shared_ptr<DeviceState>& device) {
  bind_variables(store, gpu_copies(device));
}

std::shared_ptr<Program> CudaExecutable::instance_for(
    VariableStore& store, const std::shared_ptr<DeviceState>& device) const {
  DeviceVariables& copies = gpu_copies(device);
  auto e = instance(copies.device());
  e->bind_variables(store, copies);
  return e;
}

std::shared_ptr<CudaExecutable> CudaExecutable::instance(std::shared_ptr<Device> d) const {
  return std::make_shared<CudaExecutable>(std::move(d), plan_, image_);
}

void CudaExecutable::set_device(std::shared_ptr<Communicator> comm, int rank) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(comm.get());
  FJ_USER_CHECK(nccl != nullptr, ErrorKind::NotImplemented, "job '", plan_.job_name, "' runs on ",
                d_->info().str(), " as one of several devices, but its collectives ",
                "need an NCCL communicator between GPUs, not ",
                comm ? comm->describe() : std::string("none"));
  FJ_USER_CHECK(rank >= nccl->first_rank() && rank < nccl->first_rank() + nccl->local_ranks() &&
                    &nccl->device(rank) == d_.get(),
                ErrorKind::Runtime, "job '", plan_.job_name, "': rank ", rank, " of ",
                comm->describe(), " is not ", d_->info().str(), " of this executable");
  comm_ = std::move(comm);
  nccl_ = nccl;
  rank_ = rank;
}

int64_t CudaExecutable::enqueue_collective(size_t li) {
  const DriverApi& api = d_->api();
  CUstream s = d_->stream(), cs = d_->comm_stream();
  const std::string context = "collective " + plan_.launches[li].symbol + " of job '" +
                              plan_.job_name + "' on the communication stream";
  // After the launches before it on the compute stream (its producers)...
  check(api, api.cuEventRecord(produced_[li], s), "cuEventRecord", context);
  check(api, api.cuStreamWaitEvent(cs, produced_[li], 0), "cuStreamWaitEvent", context);
  {
    NcclCommunicator::Enqueued on(*nccl_, rank_, cs);
    run_collective(li);
  }
  stage_gathered_status(li, cs);
  // ...and complete before its completion point: that of the bucket's first
  // member to need its result; -1 (now) when a member has none.
  check(api, api.cuEventRecord(completed_[li], cs), "cuEventRecord", context);
  const CollectiveStep& c = *plan_.launches[li].collective;
  if (buckets_[li].empty()) return c.complete_before;
  int64_t before = static_cast<int64_t>(plan_.launches.size());
  for (size_t m : buckets_[li]) {
    int64_t b = plan_.launches[m].collective->complete_before;
    if (b < 0) return -1;
    before = std::min(before, b);
  }
  return before;
}

void CudaExecutable::run_collective(size_t li) {
  if (bucketed_[li]) return;  // ran with its bucket
  const CollectiveStep& c = *plan_.launches[li].collective;
  FJ_USER_CHECK(comm_ != nullptr, ErrorKind::Runtime, "job '", plan_.job_name,
                "' has collectives but runs without GPUs to exchange data with");
  FJ_USER_CHECK(comm_->size() == c.parts, ErrorKind::Runtime, "job '", plan_.job_name,
                "' was compiled for ", c.parts, " devices but runs on ", comm_->size());
  auto arg = [&](size_t l, int a) { return arg_values_[arg_start_[l] + static_cast<size_t>(a)]; };
  auto ptr = [](CUdeviceptr p) { return reinterpret_cast<void*>(p); };
  if (buckets_[li].size() > 1) {
    std::vector<Communicator::Buffer> bufs;
    for (size_t m : buckets_[li])
      bufs.push_back({ptr(arg(m, 0)), ptr(arg(m, 1)), plan_.launches[m].collective->inner});
    comm_->all_reduce_many(rank_, bufs, c.dtype);
    return;
  }
  const int64_t es = ir::dtype_bytes(c.dtype);
  switch (c.op) {
    case CollectiveStep::Op::AllReduce:
      comm_->all_reduce(rank_, ptr(arg(li, 0)), ptr(arg(li, 1)), c.inner, c.dtype);
      break;
    case CollectiveStep::Op::AllGather:
      comm_->all_gather(rank_, ptr(arg(li, 0)), ptr(arg(li, 1)), c.outer, c.inner * es);
      break;
    case CollectiveStep::Op::ReduceScatter:
      comm_->reduce_scatter(rank_, ptr(arg(li, 0)), ptr(arg(li, 1)), c.outer, c.inner, c.dtype);
      break;
    case CollectiveStep::Op::LocalSlice: {  // this rank's block of each row, on the stream
      size_t piece = static_cast<size_t>(c.inner * es);
      strided_copy(*d_, arg(li, 1), piece, arg(li, 0) + static_cast<CUdeviceptr>(rank_) * piece,
                   piece * static_cast<size_t>(c.parts), piece, static_cast<size_t>(c.outer));
      break;
    }
  }
}

void CudaExecutable::gather_variable_pieces(size_t index, void* dst, int64_t outer,
                                            int64_t piece_bytes) {
  FJ_CHECK(comm_ != nullptr && index < variables_.size(), "gathering variable ", index, " of job '",
           plan_.job_name, "' outside a distributed job");
  uint64_t bytes = static_cast<uint64_t>(outer * piece_bytes * comm_->size());
  if (bytes == 0) return;
  DeviceBuffer all(d_, bytes);
  comm_->all_gather(rank_, reinterpret_cast<const void*>(variables_[index]),
                    reinterpret_cast<void*>(all.ptr()), outer, piece_bytes);
  const DriverApi& api = d_->api();
  Device::Scope scope(*d_);
  check(
      api, api.cuMemcpyDtoHAsync(dst, all.ptr(), bytes, d_->stream()), "cuMemcpyDtoHAsync",
      "gathering variable '" + plan_.variables[index].first + "' of job '" + plan_.job_name + "'");
  d_->synchronize();
}

// ---------------------------------------------------------------- runs

class CudaExecutable::Run : public PendingRun {
 public:
  Run(CudaExecutable* exe, std::vector<void*> outputs) : exe_(exe), outputs_(std::move(outputs)) {}
  void complete() override {
    {
      std::lock_guard<std::mutex> lock(exe_->runs_mu_);
      if (!done_) {
        FJ_CHECK(exe_->pending_.get() == this, "a GPU run completed out of order");
        exe_->finish_locked(*this);
      }
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  friend class CudaExecutable;
  CudaExecutable* exe_;
  std::vector<void*> outputs_;  // where the results go (kept alive by the caller)
  bool done_ = false;
  std::exception_ptr error_;
};

void CudaExecutable::finish_locked(Run& r) {
  try {
    finish(r.outputs_.data());
  } catch (...) {
    r.error_ = std::current_exception();  // belongs to that run, reported with its results
  }
  r.done_ = true;
  pending_.reset();
}

std::shared_ptr<PendingRun> CudaExecutable::start(const void* const* inputs,
                                                  std::vector<void*> outputs) {
  std::lock_guard<std::mutex> lock(runs_mu_);
  // The previous run of this job still owns the staging buffers.
  if (pending_) finish_locked(*pending_);
  auto r = std::make_shared<Run>(this, std::move(outputs));
  submit(inputs);
  pending_ = r;
  return r;
}

void CudaExecutable::run(const void* const* inputs, void* const* outputs) {
  size_t n = plan_.outputs.size();
  start(inputs, std::vector<void*>(outputs, outputs + n))->complete();
}

}  // namespace flowjit::runtime::cuda
