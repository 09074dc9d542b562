// The NVPTX backend: codegen/nvptx's PTX (and a cubin when ptxas is found),
// loaded through the CUDA driver into a runtime::cuda::CudaExecutable.
//
// Codegen writes each launch's GPU grid (grid, block, shared memory) into
// the plan's launch record. A job spread over several GPUs compiles its
// per-device graph like one GPU's: its collective launches have no code
// (the CudaExecutable runs them through NCCL) and keep fusion's record. The
// disk cache keeps the plan (plan.txt, grids included), the cubin as
// object.o (empty without ptxas) and kernels.ptx, under a target naming the
// SM, TF32, the math library (with libdevice's hash: another toolkit's
// libdevice is other code), ptxas and the placement.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "codegen/nvptx/backend.h"
#include "ir/error.h"
#include "jit/backends/backends.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/executable.h"
#include "runtime/sha256.h"

namespace flowjit::jit::backends {

namespace {

namespace nv = codegen::nvptx;
namespace rc = runtime::cuda;

constexpr const char* kPtxFile = "kernels.ptx";

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// SHA-256 prefix of libdevice, once per path.
std::string libdevice_hash(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::string> hashes;
  std::lock_guard<std::mutex> lock(mu);
  auto it = hashes.find(path);
  if (it != hashes.end()) return it->second;
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string h = runtime::sha256_hex(ss.str()).substr(0, 16);
  hashes[path] = h;
  return h;
}

const std::string& file(const CodeObject& code, const char* name) {
  for (auto& [n, text] : code.files)
    if (n == name) return text;
  throw_user(ErrorKind::Value, "it has no ", name);
}

class NvptxBackend : public Backend {
 public:
  // What codegen will use is decided here, once, so the key and the code agree.
  NvptxBackend(const JobDescription& job, const Target& t, const RunDevice& device)
      : t_(t), variables_(std::dynamic_pointer_cast<rc::DeviceVariables>(device.state)) {
    FJ_CHECK(variables_ && variables_->device(), "a GPU job without its GPU's variable copies");
    const rc::DeviceInfo& info = variables_->device()->info();
    sm_ = t.sm > 0 ? t.sm : nv::codegen_sm(info.sm);
    FJ_USER_CHECK(sm_ > 0, ErrorKind::Runtime, "job '", job.name, "' is placed on GPU ",
                  info.ordinal, ", ", info.str(), ", but flowjit generates code for sm_",
                  nv::kSupportedSms[0], " and newer only");
    if (t.math != nv::MathLibrary::Builtin) {
      libdevice_ = nv::find_libdevice();
      if (!libdevice_.empty()) math_ = nv::MathLibrary::Libdevice;
      FJ_USER_CHECK(!(t.math == nv::MathLibrary::Libdevice && libdevice_.empty()),
                    ErrorKind::Runtime,
                    "GPU code generation needs libdevice.10.bc from the CUDA toolkit and none was "
                    "found (set FLOWJIT_LIBDEVICE or CUDA_HOME)");
    }
    if (t.run_ptxas) ptxas_ = nv::find_ptxas();
    if (job.distribution.parts > 1)  // the per-device program of a job over several GPUs
      placement_ = "x" + std::to_string(job.distribution.parts) +
                   (job.distribution.mirrored ? " mirrored" : " devices");
    target_ = nv::module_target(sm_, t.allow_tf32, math_text(), ptxas_text());
    target_.placement = placement_;
  }

  const char* name() const override { return "nvptx"; }
  const codegen::TargetId& target() const override { return target_; }
  std::vector<std::string> cache_files() const override { return nvptx_cache_files(); }

  CodeObject compile(const std::vector<codegen::Kernel>& kernels, const runtime::Plan& plan,
                     const CompileRequest& req, PassLog& log) const override {
    nv::CompileOptions co;
    co.module_name = req.module_name;
    co.sm = sm_;
    co.allow_tf32 = t_.allow_tf32;
    co.math = math_;
    co.libdevice_path = libdevice_;
    co.run_ptxas = !ptxas_.empty();
    co.ptxas_path = ptxas_;
    co.want_llvm_ir = req.want_llvm_ir;
    CodeObject code;
    code.plan = plan;
    nv::CompiledModule mod = nv::compile(kernels, code.plan.launches, co);
    log.stage("llvm emit", mod.seconds_emit);
    log.stage("llvm optimize", mod.seconds_optimize);
    log.stage("llvm codegen", mod.seconds_codegen, std::to_string(mod.ptx.size()) + " PTX bytes");
    if (!mod.cubin.empty())
      log.stage("ptxas", mod.seconds_ptxas, std::to_string(mod.cubin.size()) + " cubin bytes");
    code.target = nv::module_target(sm_, t_.allow_tf32, math_text(), ptxas_text(), mod.ptx_version,
                                    mod.cubin.empty() ? "none" : "yes");
    code.target.placement = placement_;
    code.object = std::move(mod.cubin);
    code.files = {{kPtxFile, std::move(mod.ptx)}};
    code.llvm_ir = std::move(mod.llvm_ir);
    code.codegen_seconds =
        mod.seconds_emit + mod.seconds_optimize + mod.seconds_codegen + mod.seconds_ptxas;
    return code;
  }

  void check_cached(const CodeObject& code) const override { check_cached_nvptx(code); }

  std::string assembly(const CodeObject& code, const CompileRequest&) const override {
    return file(code, kPtxFile);
  }
  bool keep_assembly(const CompileRequest& req) const override {
    return req.debug >= 4 || req.keep_text;
  }
  const char* assembly_stage() const override { return "ptx"; }

  std::shared_ptr<runtime::Program> load(const CodeObject& code, PassLog& log) const override {
    auto t0 = std::chrono::steady_clock::now();
    rc::GpuImage image;
    image.ptx = file(code, kPtxFile);
    image.cubin = code.object;
    image.cubin_sm = image.cubin.empty() ? 0 : sm_;
    const std::shared_ptr<rc::Device>& gpu = variables_->device();
    auto exe = std::make_shared<rc::CudaExecutable>(gpu, code.plan, image);
    log.stage("load", since(t0), exe->loaded_from() + " on " + gpu->info().str());
    return exe;
  }

  void bind(runtime::Program& program, runtime::VariableStore& store) const override {
    program.bind(store, variables_);
  }

 private:
  std::string math_text() const {
    return math_ == nv::MathLibrary::Libdevice ? "libdevice:" + libdevice_hash(libdevice_)
                                               : std::string("builtin");
  }
  std::string ptxas_text() const { return ptxas_.empty() ? "none" : ptxas_; }

  Target t_;
  // The GPU's copies of the session's variables: this backend's RunDevice
  // state, which holds the GPU.
  std::shared_ptr<rc::DeviceVariables> variables_;
  int sm_ = 0;
  nv::MathLibrary math_ = nv::MathLibrary::Builtin;
  std::string libdevice_;  // when math_ is Libdevice
  std::string ptxas_;      // "" without a cubin
  std::string placement_;  // "x2 devices" for the per-device program of several GPUs
  codegen::TargetId target_;
};

}  // namespace

std::vector<std::string> nvptx_cache_files() { return {kPtxFile}; }

// Half matmuls stay half for the tensor cores (codegen/nvptx/matmul.cpp).
OptimizeOptions nvptx_optimize_options(const Target&) { return OptimizeOptions{true, true}; }

// Every launch of the entry's plan must carry its GPU grid (an entry
// written before plans held grids has none: a miss, recompiled).
void check_cached_nvptx(const CodeObject& code) {
  for (const runtime::Launch& l : code.plan.launches)
    if (!l.collective && !l.gpu())
      throw_user(ErrorKind::Value, "its launch ", l.symbol, " has no GPU grid");
  if (file(code, kPtxFile).find(".entry ") == std::string::npos)
    throw_user(ErrorKind::Value, "its PTX has no kernel (.entry)");
  const std::vector<char>& cubin = code.object;
  if (!cubin.empty() && std::string(cubin.data(), std::min<size_t>(4, cubin.size())) !=
                            "\x7f"
                            "ELF")
    throw_user(ErrorKind::Value, "its cubin is not an ELF image");
}

std::unique_ptr<Backend> make_nvptx(const JobDescription& job, const Target& target,
                                    const RunDevice& device) {
  return std::make_unique<NvptxBackend>(job, target, device);
}

}  // namespace flowjit::jit::backends
