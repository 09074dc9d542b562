// compile: traced job to Executable.
#include "jit/compile.h"

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "codegen/cpu/backend.h"
#include "ir/error.h"
#include "ir/printer.h"
#include "jit/build_info.h"
#include "jit/cache.h"
#include "jit/fusion.h"
#include "jit/pipeline.h"

namespace flowjit::jit {

using namespace ir;

namespace {
double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
bool env_flag(const char* name) {
  std::string v = env(name);
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return !(v.empty() || v == "0" || v == "false" || v == "no" || v == "off");
}
std::string short_key(const std::string& key) { return key.substr(0, 12); }

bool same_launches(const runtime::Plan& a, const runtime::Plan& b) {
  if (a.job_name != b.job_name || a.inputs != b.inputs || a.outputs != b.outputs ||
      a.variables != b.variables || a.arena_bytes != b.arena_bytes ||
      a.launches.size() != b.launches.size())
    return false;
  for (size_t i = 0; i < a.launches.size(); ++i)
    if (a.launches[i].symbol != b.launches[i].symbol || a.launches[i].args != b.launches[i].args)
      return false;
  return true;
}

// The disk-cache hit path: the plan and object of `key`, checked against the
// plan fusion just made and loaded. Returns null on a miss; a damaged entry
// (checksum, plan, object) is dropped with a warning and is a miss too.
std::shared_ptr<codegen::cpu::LoadedCode> load_cached(DiskCache& cache, const std::string& key,
                                                      const runtime::Plan& fresh,
                                                      const std::vector<std::string>& symbols,
                                                      bool want_llvm_ir, runtime::Plan& plan,
                                                      CompiledJob& out, PassLog& log) {
  auto t0 = std::chrono::steady_clock::now();
  CacheHit hit;
  std::string why;
  DiskCache::Found found = cache.lookup(key, want_llvm_ir, hit, why);
  std::shared_ptr<codegen::cpu::LoadedCode> code;
  if (found == DiskCache::Found::Hit) {
    try {
      runtime::Plan cached = runtime::Plan::deserialize(hit.plan);
      if (!same_launches(cached, fresh))
        throw_user(ErrorKind::Value, "its plan does not match the job's kernels");
      code = codegen::cpu::load(hit.object, symbols);
      plan = std::move(cached);
    } catch (const std::exception& e) {
      why = e.what();
      cache.remove(key);
      found = DiskCache::Found::Damaged;
    }
  }
  if (found == DiskCache::Found::Damaged) {
    std::error_code ec;
    bool gone = !std::filesystem::exists(cache.entry_dir(key), ec);
    out.warnings.push_back("flowjit: the disk-cache entry " + short_key(key) + " of job '" +
                           fresh.job_name + "' in " + cache.dir() + " was damaged (" + why + "); " +
                           (gone ? "it was removed" : "it could not be removed") +
                           " and the job is recompiled");
    log.stage("disk cache damaged", since(t0), short_key(key) + ": " + why);
    return nullptr;
  }
  if (found == DiskCache::Found::Miss) {
    log.stage("disk cache miss", since(t0), short_key(key) + " in " + cache.dir());
    return nullptr;
  }
  cache.touch(key);
  out.from_disk_cache = true;
  out.llvm_ir = std::move(hit.llvm_ir);
  log.stage("disk cache hit", since(t0),
            short_key(key) + " in " + cache.dir() + ", " + std::to_string(hit.object.size()) +
                " object bytes, hit #" + std::to_string(hit.hits + 1));
  return code;
}

// The miss path's end: publishes the compiled job (a read-only or full cache
// degrades to in-memory with one warning per directory), then bounds the size.
void store_in_cache(DiskCache& cache, CompiledJob& out, const JobDescription& job,
                    const runtime::Plan& plan, const codegen::cpu::CompiledObject& obj,
                    double compile_seconds, PassLog& log) {
  if (is_unwritable_cache(cache.dir())) return;
  auto t0 = std::chrono::steady_clock::now();
  CacheEntry e;
  e.key = out.cache_key;
  e.object = obj.object;
  e.plan = plan.serialize();
  e.ir_traced = out.ir_traced;
  e.ir_optimized = out.ir_optimized;
  e.fusion_plan = out.fusion_plan;
  e.kernels = out.kernels;
  e.llvm_ir = obj.llvm_ir;
  e.job_name = job.name;
  e.signature = job.signature;
  e.source = job.source;
  e.target = codegen::cpu::host_target_id();
  e.llvm_version = llvm_version();
  e.build_id = flowjit_build_id() + "+" + loaded_binary_id();
  e.version = flowjit_version();
  for (auto& t : plan.inputs) e.inputs.push_back(t.str());
  for (auto& t : plan.outputs) e.outputs.push_back(t.str());
  e.arena_bytes = plan.arena_bytes;
  e.num_kernels = static_cast<int64_t>(plan.launches.size());
  e.compile_seconds = compile_seconds;
  e.codegen_seconds = obj.seconds_emit + obj.seconds_optimize + obj.seconds_codegen;
  std::string why;
  switch (cache.store(e, why)) {
    case DiskCache::Stored::Published:
      log.stage("disk cache store", since(t0), short_key(e.key) + " published in " + cache.dir());
      break;
    case DiskCache::Stored::AlreadyPresent:
      log.stage("disk cache store", since(t0),
                short_key(e.key) + " already present (kept that one)");
      return;
    case DiskCache::Stored::Failed:
      log.stage("disk cache store", since(t0), "failed: " + why);
      if (note_unwritable_cache(cache.dir()))
        out.warnings.push_back(
            "flowjit: the kernel cache in " + cache.dir() + " cannot be written (" + why +
            "); compiled kernels are kept in memory only (set FLOWJIT_CACHE_DIR to a "
            "writable directory, or FLOWJIT_DISABLE_CACHE=1)");
      return;
  }
  auto t_evict = std::chrono::steady_clock::now();
  int evicted = cache.evict(e.key);
  if (evicted > 0)
    log.stage("disk cache evict", since(t_evict),
              std::to_string(evicted) + " least recently used entries (bound " +
                  std::to_string(cache.max_bytes()) + " bytes)");
}
}  // namespace

CompileSettings CompileSettings::from_environment() {
  CompileSettings s;
  s.debug = std::atoi(env("FLOWJIT_DEBUG").c_str());
  s.dump_dir = env("FLOWJIT_DUMP_DIR");
  s.fuse = env("FLOWJIT_DISABLE_FUSION") != "1";
  if (!env_flag("FLOWJIT_DISABLE_CACHE")) {
    s.cache_dir = env("FLOWJIT_CACHE_DIR");
    if (s.cache_dir.empty()) s.cache_dir = default_cache_dir();
  }
  std::string max_bytes = env("FLOWJIT_CACHE_MAX_BYTES");
  if (!max_bytes.empty()) s.cache_max_bytes = parse_byte_size(max_bytes);
  return s;
}

CompiledJob compile_job(const JobDescription& job, const CompileSettings& settings,
                        runtime::VariableStore& store) {
  auto t_start = std::chrono::steady_clock::now();
  CompiledJob out;
  PassLog log;
  log.job = job.name;
  log.debug = settings.debug;
  log.dump_dir = settings.dump_dir;

  Graph g = job.graph;
  g.name = job.name;
  if (job.train) {
    FJ_CHECK(job.optimizer.has_value(), "train job without optimizer reached the compiler");
    auto t0 = std::chrono::steady_clock::now();
    OptimizerLowering low = lower_optimizer(*job.optimizer, job.losses, job.lr, job.step, job.trainable);
    for (auto& e : low.effects) g.effects.push_back(e);
    out.new_variables = low.new_variables;
    log.stage("autodiff+optimizer", since(t0), optimizer_name(job.optimizer->kind));
  }
  for (auto& [name, type] : out.new_variables) store.get_or_create(name, type, /*trainable=*/false);
  out.ir_traced = print_graph(g);
  log.dump("traced", print_graph(g, PrintOptions{true}));
  if (settings.debug >= 2) std::fprintf(stderr, "%s", out.ir_traced.c_str());

  auto t_passes = std::chrono::steady_clock::now();
  Graph opt = optimize(g, log);
  out.ir_optimized = print_graph(opt);

  auto t_fuse = std::chrono::steady_clock::now();
  FusedProgram fp = fuse(opt, job.name, FusionOptions{settings.fuse});
  out.fusion_plan = fp.description;
  for (auto& k : fp.kernels) out.kernels += codegen::describe_kernel(k);
  log.stage("fusion+memory", since(t_fuse),
            std::to_string(fp.kernels.size()) + " kernels, arena " +
                std::to_string(fp.plan.arena_bytes) + " bytes (" +
                std::to_string(fp.bytes_without_reuse) + " without reuse)");
  if (settings.debug >= 2) std::fprintf(stderr, "[flowjit] %s fusion plan:\n%s", job.name.c_str(), fp.description.c_str());
  log.dump("fusion", fp.description + "\n" + out.kernels);
  out.seconds_passes = since(t_passes);

  runtime::Plan plan = fp.plan;
  std::vector<std::string> symbols;
  for (auto& l : plan.launches) symbols.push_back(l.symbol);
  const bool keep_llvm_ir = settings.debug >= 3 || settings.keep_text || !settings.dump_dir.empty();

  // The disk cache: everything that decides the generated code is in the key.
  std::optional<DiskCache> cache;
  if (!settings.cache_dir.empty()) {
    if (settings.cache_max_bytes < 0) {
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true))
        out.warnings.push_back(
            "flowjit: FLOWJIT_CACHE_MAX_BYTES is not a byte size (e.g. 1073741824, "
            "512M, 2G); using the default bound of 1 GiB");
    }
    cache.emplace(settings.cache_dir, settings.cache_max_bytes);
    out.cache_key = cache_key({out.ir_optimized, fp.description, out.kernels, fp.plan.serialize(),
                               codegen::cpu::host_target_id(), llvm_version(),
                               flowjit_build_id() + "+" + loaded_binary_id(), flowjit_version()});
  }

  auto t_cg = std::chrono::steady_clock::now();
  std::shared_ptr<codegen::cpu::LoadedCode> code;
  if (cache)
    code = load_cached(*cache, out.cache_key, fp.plan, symbols, keep_llvm_ir, plan, out, log);
  if (code) {
    if (settings.debug >= 3) std::fprintf(stderr, "%s", out.llvm_ir.c_str());
    if (settings.debug >= 4) {
      out.assembly = codegen::cpu::assembly_from_ir(out.llvm_ir);
      std::fprintf(stderr, "%s", out.assembly.c_str());
    }
    log.dump("llvm", out.llvm_ir);
    if (!out.assembly.empty()) log.dump("asm", out.assembly);
  } else {
    codegen::cpu::CompileOptions co;
    co.module_name = job.name;
    co.want_llvm_ir = keep_llvm_ir || cache.has_value();  // the cache keeps it for `show`
    co.want_assembly = settings.debug >= 4;
    codegen::cpu::CompiledObject obj = codegen::cpu::compile(fp.kernels, co);
    log.stage("llvm emit", obj.seconds_emit);
    log.stage("llvm optimize", obj.seconds_optimize);
    log.stage("llvm codegen", obj.seconds_codegen, std::to_string(obj.object.size()) + " bytes");
    if (keep_llvm_ir) out.llvm_ir = obj.llvm_ir;
    out.assembly = obj.assembly;
    if (settings.debug >= 3) std::fprintf(stderr, "%s", obj.llvm_ir.c_str());
    if (settings.debug >= 4) std::fprintf(stderr, "%s", obj.assembly.c_str());
    log.dump("llvm", obj.llvm_ir);
    if (!obj.assembly.empty()) log.dump("asm", obj.assembly);

    for (size_t i = 0; i < plan.launches.size(); ++i) {
      plan.launches[i].range = obj.launches[i].range;
      plan.launches[i].grain = obj.launches[i].grain;
      plan.launches[i].scratch_bytes = obj.launches[i].scratch_bytes;
    }
    auto t_load = std::chrono::steady_clock::now();
    code = codegen::cpu::load(obj.object, symbols);
    log.stage("load", since(t_load));
    if (cache) store_in_cache(*cache, out, job, plan, obj, since(t_start), log);
  }
  std::vector<runtime::KernelFn> fns;
  for (size_t i = 0; i < symbols.size(); ++i)
    fns.push_back(reinterpret_cast<runtime::KernelFn>(code->address(i)));
  out.seconds_codegen = since(t_cg);
  out.executable = std::make_shared<runtime::Executable>(plan, std::move(fns), code);
  out.executable->bind_variables(store);
  out.seconds_total = since(t_start);
  log.stage("total", out.seconds_total);
  return out;
}

}  // namespace flowjit::jit
