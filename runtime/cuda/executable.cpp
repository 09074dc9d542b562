// CudaExecutable: module loading, device buffers, staged runs tracked by events.
#include "runtime/cuda/executable.h"

#include <cstring>
#include <sstream>

#include "ir/error.h"

namespace flowjit::runtime::cuda {

namespace {
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

// ---------------------------------------------------------------- launches text

std::string serialize_launches(const std::vector<GpuLaunch>& launches) {
  std::ostringstream os;
  for (const GpuLaunch& l : launches)
    os << "gpulaunch " << l.symbol << " " << l.grid[0] << " " << l.grid[1] << " " << l.grid[2] << " "
       << l.block[0] << " " << l.block[1] << " " << l.block[2] << " " << l.shared_bytes << "\n";
  return os.str();
}

std::vector<GpuLaunch> deserialize_launches(const std::string& text) {
  std::vector<GpuLaunch> out;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    if (line.empty()) continue;
    std::istringstream ls(line);
    std::string key;
    GpuLaunch l;
    ls >> key >> l.symbol >> l.grid[0] >> l.grid[1] >> l.grid[2] >> l.block[0] >> l.block[1] >>
        l.block[2] >> l.shared_bytes;
    std::string rest;
    if (key != "gpulaunch" || ls.fail() || (ls >> rest) || l.symbol.empty())
      throw_user(ErrorKind::Value, "corrupt GPU launch list: bad line '", line, "'");
    for (uint32_t v : {l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2]})
      if (v == 0) throw_user(ErrorKind::Value, "corrupt GPU launch list: zero extent in '", line, "'");
    out.push_back(l);
  }
  return out;
}

// ---------------------------------------------------------------- variables

DeviceVariables::Entry& DeviceVariables::entry(const VariableStorage& v) {
  auto it = vars_.find(v.name);
  if (it != vars_.end()) {
    FJ_USER_CHECK(it->second.type == v.type, ErrorKind::Value, "variable '", v.name, "' is ",
                  v.type.str(), " on the host but ", it->second.type.str(), " on the GPU");
    return it->second;
  }
  Entry e{v.type, DeviceBuffer(d_, static_cast<uint64_t>(v.type.bytes()))};
  if (v.type.bytes() > 0) {
    Device::Scope s(*d_);
    FLOWJIT_CU(d_->api(), cuMemcpyHtoDAsync, e.buf.ptr(), v.ptr(), static_cast<size_t>(v.type.bytes()),
               d_->stream());
    FLOWJIT_CU(d_->api(), cuStreamSynchronize, d_->stream());
  }
  return vars_.emplace(v.name, std::move(e)).first->second;
}

CUdeviceptr DeviceVariables::get(const VariableStorage& v) {
  std::lock_guard<std::mutex> lock(mu_);
  return entry(v).buf.ptr();
}

void DeviceVariables::upload(const VariableStorage& v) {
  std::lock_guard<std::mutex> lock(mu_);
  bool existed = vars_.count(v.name) > 0;
  Entry& e = entry(v);
  if (!existed || v.type.bytes() == 0) return;  // entry() just uploaded it
  Device::Scope s(*d_);
  FLOWJIT_CU(d_->api(), cuMemcpyHtoDAsync, e.buf.ptr(), v.ptr(), static_cast<size_t>(v.type.bytes()),
             d_->stream());
  FLOWJIT_CU(d_->api(), cuStreamSynchronize, d_->stream());
}

void DeviceVariables::download(VariableStorage& v) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = vars_.find(v.name);
  if (it == vars_.end() || v.type.bytes() == 0) return;
  FJ_USER_CHECK(it->second.type == v.type, ErrorKind::Value, "variable '", v.name, "' is ",
                v.type.str(), " on the host but ", it->second.type.str(), " on the GPU");
  Device::Scope s(*d_);
  FLOWJIT_CU(d_->api(), cuMemcpyDtoHAsync, v.ptr(), it->second.buf.ptr(),
             static_cast<size_t>(v.type.bytes()), d_->stream());
  FLOWJIT_CU(d_->api(), cuStreamSynchronize, d_->stream());
}

void DeviceVariables::download_all(VariableStore& store) {
  for (VariableStorage* v : store.all())
    if (has(v->name)) download(*v);
}

bool DeviceVariables::has(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return vars_.count(name) > 0;
}

// ---------------------------------------------------------------- executable

CudaExecutable::CudaExecutable(std::shared_ptr<Device> d, Plan plan, std::vector<GpuLaunch> launches,
                               const GpuImage& image)
    : d_(std::move(d)), plan_(std::move(plan)), launches_(std::move(launches)) {
  FJ_CHECK(launches_.size() == plan_.launches.size(), "one GPU launch per plan launch (",
           launches_.size(), " vs ", plan_.launches.size(), ")");
  for (size_t i = 0; i < launches_.size(); ++i)
    FJ_CHECK(launches_[i].symbol == plan_.launches[i].symbol, "GPU launch ", i, " is ",
             launches_[i].symbol, " but the plan launches ", plan_.launches[i].symbol);
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
  void* values[] = {error_log.data(), reinterpret_cast<void*>(error_log.size() - 1), info_log.data(),
                    reinterpret_cast<void*>(info_log.size() - 1)};
  CUresult r = api.cuModuleLoadDataEx(&module_, data, 4, options, values);
  if (r != kCudaSuccess) {
    std::string log = error_log.data();
    check(api, r, "cuModuleLoadDataEx",
          "loading the kernels of job '" + plan_.job_name + "' as " +
              (use_cubin ? "a cubin for sm_" + std::to_string(image.cubin_sm) : std::string("PTX")) +
              " on " + d_->info().str() + (log.empty() ? "" : "; driver log: " + log));
  }
  loaded_from_ = use_cubin ? "cubin sm_" + std::to_string(image.cubin_sm)
                           : "ptx (driver JIT for sm_" + std::to_string(d_->info().sm) + ")";
  for (const GpuLaunch& l : launches_) {
    CUfunction f = nullptr;
    check(api, api.cuModuleGetFunction(&f, module_, l.symbol.c_str()), "cuModuleGetFunction",
          "kernel '" + l.symbol + "' of job '" + plan_.job_name + "'");
    if (l.shared_bytes > 48 * 1024)
      check(api, api.cuFuncSetAttribute(f, kFuncAttrMaxDynamicSharedSizeBytes, static_cast<int>(l.shared_bytes)),
            "cuFuncSetAttribute", "kernel '" + l.symbol + "' asks for " + std::to_string(l.shared_bytes) +
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
  staging_ = PinnedBuffer(d_, staged);
  FLOWJIT_CU(api, cuEventCreate, &done_, kEventDisableTiming);

  size_t total = 0;
  for (const Launch& l : plan_.launches) {
    arg_start_.push_back(total);
    total += l.args.size();
  }
  arg_values_.assign(total, 0);
  arg_ptrs_.resize(total);
  for (size_t i = 0; i < total; ++i) arg_ptrs_[i] = &arg_values_[i];
  variables_.assign(plan_.variables.size(), 0);
  resolve_args();
}

CudaExecutable::~CudaExecutable() { release_driver_objects(); }

void CudaExecutable::release_driver_objects() {
  const DriverApi& api = d_->api();
  try {
    Device::Scope s(*d_);
    if (in_flight_ && done_) api.cuEventSynchronize(done_);
    if (done_) api.cuEventDestroy(done_);
    if (module_) api.cuModuleUnload(module_);
  } catch (...) {  // nothing to report from a destructor
  }
  done_ = nullptr;
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
        case BufferKind::Input: base = inputs_.at(r.index).ptr(); break;
        case BufferKind::Output: base = outputs_.at(r.index).ptr(); break;
        case BufferKind::Variable: base = variables_.at(r.index); break;
        case BufferKind::Arena: base = arena_.ptr(); break;
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
                  name, "', which no longer exists in the session (was "
                  "flow.clear_default_session() called?)");
    FJ_USER_CHECK(v->type == type, ErrorKind::Value, "job '", plan_.job_name, "' expects variable '",
                  name, "' as ", type.str(), " but the session holds ", v->type.str());
    variables_[i] = dev.get(*v);
  }
  resolve_args();
  bound_ = true;
}

std::vector<CUdeviceptr> CudaExecutable::kernel_args(size_t i) const {
  size_t n = plan_.launches.at(i).args.size();
  return {arg_values_.begin() + static_cast<ptrdiff_t>(arg_start_[i]),
          arg_values_.begin() + static_cast<ptrdiff_t>(arg_start_[i] + n)};
}

void CudaExecutable::submit(const void* const* inputs) {
  FJ_CHECK(!in_flight_, "job '", plan_.job_name, "': a GPU run was submitted before the previous one finished");
  FJ_CHECK(bound_ || plan_.variables.empty(), "GPU executable run before bind_variables");
  const DriverApi& api = d_->api();
  Device::Scope scope(*d_);
  CUstream s = d_->stream();
  for (size_t i = 0; i < inputs_.size(); ++i) {
    size_t n = static_cast<size_t>(plan_.inputs[i].bytes());
    if (n == 0) continue;
    char* stage = staging_.data() + stage_in_[i];
    std::memcpy(stage, inputs[i], n);
    check(api, api.cuMemcpyHtoDAsync(inputs_[i].ptr(), stage, n, s), "cuMemcpyHtoDAsync",
          "input " + std::to_string(i) + " of job '" + plan_.job_name + "'");
  }
  for (size_t li = 0; li < launches_.size(); ++li) {
    const GpuLaunch& l = launches_[li];
    void** params = plan_.launches[li].args.empty() ? nullptr : &arg_ptrs_[arg_start_[li]];
    CUresult r = api.cuLaunchKernel(fns_[li], l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1],
                                    l.block[2], l.shared_bytes, s, params, nullptr);
    if (r != kCudaSuccess)
      check(api, r, "cuLaunchKernel",
            "kernel '" + l.symbol + "' of job '" + plan_.job_name + "', grid " + std::to_string(l.grid[0]) +
                "x" + std::to_string(l.grid[1]) + "x" + std::to_string(l.grid[2]) + ", block " +
                std::to_string(l.block[0]) + "x" + std::to_string(l.block[1]) + "x" +
                std::to_string(l.block[2]));
  }
  for (size_t i = 0; i < outputs_.size(); ++i) {
    size_t n = static_cast<size_t>(plan_.outputs[i].bytes());
    if (n == 0) continue;
    check(api, api.cuMemcpyDtoHAsync(staging_.data() + stage_out_[i], outputs_[i].ptr(), n, s),
          "cuMemcpyDtoHAsync", "output " + std::to_string(i) + " of job '" + plan_.job_name + "'");
  }
  FLOWJIT_CU(api, cuEventRecord, done_, s);
  in_flight_ = true;
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
  check(api, api.cuEventSynchronize(done_), "cuEventSynchronize",
        "running job '" + plan_.job_name + "' on " + d_->info().str());
  for (size_t i = 0; i < outputs_.size(); ++i) {
    size_t n = static_cast<size_t>(plan_.outputs[i].bytes());
    if (n > 0) std::memcpy(outputs[i], staging_.data() + stage_out_[i], n);
  }
}

}  // namespace flowjit::runtime::cuda
