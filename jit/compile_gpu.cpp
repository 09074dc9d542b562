// compile_gpu: the GPU half of compile_job, from the fused program to a
// CudaExecutable.
//
// Everything up to fusion is the CPU path's (jit/compile.cpp): the same
// optimized graph, kernels and plan. Here the kernels go through the NVPTX
// backend (PTX, and a cubin when ptxas is found) and the launch list codegen
// chose (grid, block, shared memory) comes with them. The disk cache keeps
// all three like a CPU object: the cubin as object.o (empty without ptxas),
// kernels.ptx and launches.txt, under a key whose target names nvptx, the
// SM, TF32, the math library (with libdevice's hash) and ptxas.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "codegen/nvptx/backend.h"
#include "ir/error.h"
#include "jit/build_info.h"
#include "jit/cache.h"
#include "jit/compile.h"
#include "jit/compile_internal.h"
#include "jit/fusion.h"
#include "jit/pipeline.h"
#include "jit/sha256.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/executable.h"

namespace flowjit::jit {

namespace nv = codegen::nvptx;
namespace rc = runtime::cuda;
using namespace ir;
using detail::short_key;
using detail::since;

namespace {

constexpr const char* kPtxFile = "kernels.ptx";
constexpr const char* kLaunchesFile = "launches.txt";

// SHA-256 prefix of libdevice, once per path: another toolkit's libdevice
// is other code, so it must be another key.
std::string libdevice_hash(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::string> hashes;
  std::lock_guard<std::mutex> lock(mu);
  auto it = hashes.find(path);
  if (it != hashes.end()) return it->second;
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string h = sha256_hex(ss.str()).substr(0, 16);
  hashes[path] = h;
  return h;
}

// What codegen will use, decided once so that the key and the code agree.
struct GpuChoices {
  int sm = 0;
  nv::MathLibrary math = nv::MathLibrary::Builtin;
  std::string libdevice;  // when math is Libdevice
  std::string ptxas;      // "" without a cubin
};

GpuChoices resolve(const Target& t, int sm) {
  GpuChoices c;
  c.sm = sm;
  if (t.math != nv::MathLibrary::Builtin) {
    c.libdevice = nv::find_libdevice();
    if (!c.libdevice.empty()) c.math = nv::MathLibrary::Libdevice;
    FJ_USER_CHECK(!(t.math == nv::MathLibrary::Libdevice && c.libdevice.empty()),
                  ErrorKind::Runtime,
                  "GPU code generation needs libdevice.10.bc from the CUDA toolkit and none was "
                  "found (set FLOWJIT_LIBDEVICE or CUDA_HOME)");
  }
  if (t.run_ptxas) c.ptxas = nv::find_ptxas();
  return c;
}

std::string target_id(const Target& t, const GpuChoices& c) {
  std::string math = c.math == nv::MathLibrary::Libdevice
                         ? "libdevice:" + libdevice_hash(c.libdevice)
                         : std::string("builtin");
  return "nvptx64-nvidia-cuda;sm_" + std::to_string(c.sm) + ";tf32=" + (t.allow_tf32 ? "1" : "0") +
         ";math=" + math + ";ptxas=" + (c.ptxas.empty() ? "none" : c.ptxas);
}

std::vector<rc::GpuLaunch> to_gpu_launches(const std::vector<nv::KernelLaunch>& ls) {
  std::vector<rc::GpuLaunch> out;
  for (const nv::KernelLaunch& l : ls) {
    rc::GpuLaunch g;
    g.symbol = l.symbol;
    std::copy(l.grid, l.grid + 3, g.grid);
    std::copy(l.block, l.block + 3, g.block);
    g.shared_bytes = l.shared_bytes;
    out.push_back(g);
  }
  return out;
}

struct GpuCode {
  rc::GpuImage image;
  std::vector<rc::GpuLaunch> launches;
};

// The hit path: the entry's plan must be the one fusion just made and its
// launch list must name the plan's kernels. A damaged entry is dropped with
// a warning and is a miss.
bool load_cached(DiskCache& cache, const std::string& key, const runtime::Plan& plan, int sm,
                 bool want_llvm_ir, GpuCode& code, CompiledJob& out, PassLog& log) {
  auto t0 = std::chrono::steady_clock::now();
  CacheHit hit;
  std::string why;
  DiskCache::Found found = cache.lookup(key, want_llvm_ir, hit, why, {kPtxFile, kLaunchesFile});
  if (found == DiskCache::Found::Hit) {
    try {
      if (hit.plan != plan.serialize())
        throw_user(ErrorKind::Value, "its plan does not match the job's kernels");
      std::vector<rc::GpuLaunch> launches = rc::deserialize_launches(hit.extra[1]);
      if (launches.size() != plan.launches.size())
        throw_user(ErrorKind::Value, "its launch list has ", launches.size(), " kernels, the plan ",
                   plan.launches.size());
      for (size_t i = 0; i < launches.size(); ++i)
        if (launches[i].symbol != plan.launches[i].symbol)
          throw_user(ErrorKind::Value, "its launch list names kernel '", launches[i].symbol,
                     "' where the plan has '", plan.launches[i].symbol, "'");
      if (hit.extra[0].empty()) throw_user(ErrorKind::Value, "its PTX is empty");
      if (!hit.object.empty() &&
          std::string(hit.object.data(), std::min<size_t>(4, hit.object.size())) !=
              "\x7f"
              "ELF")
        throw_user(ErrorKind::Value, "its cubin is not an ELF image");
      code.image.ptx = std::move(hit.extra[0]);
      code.image.cubin = std::move(hit.object);
      code.image.cubin_sm = code.image.cubin.empty() ? 0 : sm;
      code.launches = std::move(launches);
    } catch (const UserError& e) {
      why = e.what();
      cache.remove(key);
      found = DiskCache::Found::Damaged;
    }
  }
  if (detail::note_cache_miss(found, why, cache, key, plan.job_name, out, log, t0)) return false;
  cache.touch(key);
  out.from_disk_cache = true;
  out.llvm_ir = std::move(hit.llvm_ir);
  log.stage("disk cache hit", since(t0),
            short_key(key) + " in " + cache.dir() + ", " + std::to_string(code.image.ptx.size()) +
                " PTX bytes, " + std::to_string(code.image.cubin.size()) + " cubin bytes, hit #" +
                std::to_string(hit.hits + 1));
  return true;
}

// The miss path's end, as the CPU path's: a read-only or full cache degrades
// to in-memory with one warning per directory, then the size is bounded.
void store_in_cache(DiskCache& cache, CompiledJob& out, const JobDescription& job,
                    const runtime::Plan& plan, const std::string& target,
                    const nv::CompiledModule& mod, const std::vector<rc::GpuLaunch>& launches,
                    double compile_seconds, PassLog& log) {
  if (is_unwritable_cache(cache.dir())) return;
  CacheEntry e = detail::common_cache_entry(out, job, plan, compile_seconds);
  e.object = mod.cubin;
  e.llvm_ir = mod.llvm_ir;
  e.extra_files = {{kPtxFile, mod.ptx}, {kLaunchesFile, rc::serialize_launches(launches)}};
  // The key's target, with the PTX version and whether a cubin came along.
  size_t after_sm = target.find(';', target.find(";sm_") + 1);
  e.target = target.substr(0, after_sm) + ";ptx" + std::to_string(mod.ptx_version) +
             target.substr(after_sm) + ";cubin=" + (mod.cubin.empty() ? "none" : "yes");
  e.codegen_seconds =
      mod.seconds_emit + mod.seconds_optimize + mod.seconds_codegen + mod.seconds_ptxas;
  detail::publish_cache_entry(cache, e, out, log);
}

}  // namespace

const runtime::Plan& CompiledJob::plan() const {
  if (gpu_executable) return gpu_executable->plan();
  FJ_CHECK(executable != nullptr, "a compiled job without an executable");
  return executable->plan();
}

int gpu_codegen_sm(int device_sm) {
  int best = 0;
  for (int s : {70, 72, 75, 80, 86, 87, 89, 90})
    if (s <= device_sm) best = s;
  return best;
}

std::string gpu_target_id(const Target& t, int sm) { return target_id(t, resolve(t, sm)); }

void compile_for_gpu(const JobDescription& job, const CompileSettings& settings,
                     const FusedProgram& fp, runtime::VariableStore& store, CompiledJob& out,
                     PassLog& log, std::chrono::steady_clock::time_point t_start) {
  const Target& target = settings.target;
  FJ_USER_CHECK(job.distribution.parts <= 1, ErrorKind::NotImplemented, "job '", job.name,
                "' is placed on a GPU and spread over ", job.distribution.parts,
                " devices, but several GPUs per job need NCCL collectives, which flowjit does not "
                "have yet; place the job on one GPU (\"0:0\")");
  FJ_CHECK(target.gpu && target.gpu_variables, "a GPU target without its device or variables");
  const rc::DeviceInfo& info = target.gpu->info();
  int sm = target.sm > 0 ? target.sm : gpu_codegen_sm(info.sm);
  FJ_USER_CHECK(sm > 0, ErrorKind::Runtime, "job '", job.name, "' is placed on GPU ", info.ordinal,
                ", ", info.str(), ", but flowjit generates code for sm_70 and newer only");
  for (const codegen::Kernel& k : fp.kernels)
    FJ_CHECK(k.kind != codegen::Kernel::Kind::Collective, "a collective in a single-GPU job");
  const bool keep_llvm_ir = detail::keep_llvm_ir(settings);
  GpuChoices choices = resolve(target, sm);

  const std::string target_text = target_id(target, choices);
  std::optional<DiskCache> cache = detail::open_cache(settings, fp, target_text, out);

  auto t_cg = std::chrono::steady_clock::now();
  GpuCode code;
  bool hit = cache && load_cached(*cache, out.cache_key, fp.plan, sm, keep_llvm_ir, code, out, log);
  if (hit) {
    if (settings.debug >= 3) std::fprintf(stderr, "%s", out.llvm_ir.c_str());
    log.dump("llvm", out.llvm_ir);
  } else {
    nv::CompileOptions co;
    co.module_name = job.name;
    co.sm = sm;
    co.allow_tf32 = target.allow_tf32;
    co.math = choices.math;
    co.libdevice_path = choices.libdevice;
    co.run_ptxas = !choices.ptxas.empty();
    co.ptxas_path = choices.ptxas;
    co.want_llvm_ir = keep_llvm_ir || cache.has_value();  // the cache keeps it for `show`
    nv::CompiledModule mod = nv::compile(fp.kernels, co);
    log.stage("llvm emit", mod.seconds_emit);
    log.stage("llvm optimize", mod.seconds_optimize);
    log.stage("llvm codegen", mod.seconds_codegen, std::to_string(mod.ptx.size()) + " PTX bytes");
    if (!mod.cubin.empty())
      log.stage("ptxas", mod.seconds_ptxas, std::to_string(mod.cubin.size()) + " cubin bytes");
    if (keep_llvm_ir) out.llvm_ir = mod.llvm_ir;
    if (settings.debug >= 3) std::fprintf(stderr, "%s", mod.llvm_ir.c_str());
    log.dump("llvm", mod.llvm_ir);
    code.launches = to_gpu_launches(mod.launches);
    code.image.ptx = mod.ptx;
    code.image.cubin = mod.cubin;
    code.image.cubin_sm = mod.cubin.empty() ? 0 : sm;
    if (cache)
      store_in_cache(*cache, out, job, fp.plan, target_text, mod, code.launches, since(t_start),
                     log);
  }
  if (settings.debug >= 4 || settings.keep_text) out.assembly = code.image.ptx;
  if (settings.debug >= 4) std::fprintf(stderr, "%s", code.image.ptx.c_str());
  log.dump("ptx", code.image.ptx);

  auto t_load = std::chrono::steady_clock::now();
  auto exe = std::make_shared<rc::CudaExecutable>(target.gpu, fp.plan, code.launches, code.image);
  // Only assigns write variables: predict jobs leave the host value current.
  exe->set_writes_variables(out.writes_variables);
  exe->bind_variables(store, *target.gpu_variables);
  log.stage("load", since(t_load), exe->loaded_from() + " on " + info.str());
  out.gpu_loaded_from = exe->loaded_from();
  out.gpu_executable = std::move(exe);
  out.seconds_codegen = since(t_cg);
  out.seconds_total = since(t_start);
  log.stage("total", out.seconds_total);
}

}  // namespace flowjit::jit
