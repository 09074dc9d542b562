// compile: traced job to Program, one driver for every backend.
#include "jit/compile.h"

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>

#include <map>

#include "ir/diag.h"
#include "ir/error.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "jit/backend.h"
#include "jit/build_info.h"
#include "jit/cache.h"
#include "jit/fusion.h"
#include "jit/passes/attention.h"
#include "jit/passes/auto_mixed_precision.h"
#include "jit/pipeline.h"
#include "runtime/staged.h"

namespace flowjit::jit {

using namespace ir;

namespace {

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
std::string short_key(const std::string& key) { return key.substr(0, 12); }

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
bool env_flag(const char* name) {
  std::string v = env(name);
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return !(v.empty() || v == "0" || v == "false" || v == "no" || v == "off");
}

// The disk cache of `settings` (none when disabled), with out.cache_key set
// from everything that decides the generated code for `target`. An
// unparsable FLOWJIT_CACHE_MAX_BYTES warns once per process.
std::optional<DiskCache> open_cache(const CompileSettings& settings, const FusedProgram& fp,
                                    const std::string& target, CompiledJob& out) {
  std::optional<DiskCache> cache;
  if (settings.cache_dir.empty()) return cache;
  if (settings.cache_max_bytes < 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      out.warnings.push_back(
          "flowjit: FLOWJIT_CACHE_MAX_BYTES is not a byte size (e.g. 1073741824, "
          "512M, 2G); using the default bound of 1 GiB");
  }
  cache.emplace(settings.cache_dir, settings.cache_max_bytes);
  // Everything that decides the generated code is in the key. (A GPU launch
  // list follows from the kernels and the target and is stored with the code.)
  out.cache_key =
      cache_key({out.ir_optimized, fp.description, out.kernels, fp.plan.serialize(), target,
                 llvm_version(), flowjit_build_id() + "+" + loaded_binary_id(), flowjit_version()});
  // A root someone else owns or can write is not used at all: its entries
  // could be anyone's code. One warning per directory, then memory only.
  std::string why = cache->untrusted_root();
  if (!why.empty()) {
    static std::mutex mu;
    static std::set<std::string> warned;
    bool first;
    {
      std::lock_guard<std::mutex> lock(mu);
      first = warned.insert(cache->dir()).second;
    }
    if (first)
      out.warnings.push_back("flowjit: the kernel cache in " + printable_text(cache->dir()) +
                             " is not used because " + printable_text(why) +
                             "; compiled kernels are kept in memory only (chmod 700 it, or set "
                             "FLOWJIT_CACHE_DIR to a directory of your own)");
    cache.reset();
  }
  return cache;
}

// A lookup that found nothing usable: logs the miss, or for a damaged entry
// (already removed when it could be) warns once on `out` that the job is
// recompiled. Returns true when `found` is not a hit.
bool note_cache_miss(DiskCache::Found found, const std::string& why, DiskCache& cache,
                     const std::string& key, const std::string& job_name, CompiledJob& out,
                     PassLog& log, std::chrono::steady_clock::time_point t0) {
  if (found == DiskCache::Found::Untrusted) {
    // Left in place (it may not be ours to remove); warned about once.
    static std::mutex mu;
    static std::set<std::string> warned;
    bool first;
    {
      std::lock_guard<std::mutex> lock(mu);
      first = warned.insert(cache.entry_dir(key)).second;
    }
    if (first)
      out.warnings.push_back("flowjit: the disk-cache entry " + short_key(key) + " of job '" +
                             job_name + "' in " + printable_text(cache.dir()) +
                             " is not loaded because " + printable_text(why) +
                             "; the job is compiled in memory");
    log.stage("disk cache untrusted", since(t0), short_key(key) + ": " + why);
    return true;
  }
  if (found == DiskCache::Found::Damaged) {
    std::error_code ec;
    bool gone = !std::filesystem::exists(cache.entry_dir(key), ec);
    out.warnings.push_back(
        "flowjit: the disk-cache entry " + short_key(key) + " of job '" + job_name + "' in " +
        printable_text(cache.dir()) + " was damaged (" + printable_text(why) + "); " +
        (gone ? "it was removed" : "it could not be removed") + " and the job is recompiled");
    log.stage("disk cache damaged", since(t0), short_key(key) + ": " + why);
    return true;
  }
  if (found == DiskCache::Found::Miss) {
    log.stage("disk cache miss", since(t0), short_key(key) + " in " + cache.dir());
    return true;
  }
  return false;
}

// The fields every entry has: key, plan, IR texts, job, build and plan facts.
CacheEntry common_cache_entry(const CompiledJob& out, const JobDescription& job,
                              const runtime::Plan& plan, double compile_seconds) {
  CacheEntry e;
  e.key = out.cache_key;
  e.plan = plan.serialize();
  e.ir_traced = out.ir_traced;
  e.ir_optimized = out.ir_optimized;
  e.fusion_plan = out.fusion_plan;
  e.kernels = out.kernels;
  e.job_name = job.name;
  e.signature = job.signature;
  e.source = job.source;
  e.llvm_version = llvm_version();
  e.build_id = flowjit_build_id() + "+" + loaded_binary_id();
  e.version = flowjit_version();
  for (auto& t : plan.inputs) e.inputs.push_back(t.str());
  for (auto& t : plan.outputs) e.outputs.push_back(t.str());
  e.arena_bytes = plan.arena_bytes;
  e.num_kernels = static_cast<int64_t>(plan.launches.size());
  e.compile_seconds = compile_seconds;
  return e;
}

// Stores `e` (a read-only or full cache degrades to in-memory with one
// warning per directory), then bounds the cache's size; logs both.
void publish_cache_entry(DiskCache& cache, const CacheEntry& e, CompiledJob& out, PassLog& log) {
  auto t0 = std::chrono::steady_clock::now();
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
            "flowjit: the kernel cache in " + printable_text(cache.dir()) + " cannot be written (" +
            printable_text(why) +
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

// The disk-cache hit path: the entry of `key` turned back into code and
// loaded. The entry's plan must be the one fusion just made (but for what
// codegen decides per launch) and the backend must accept its files; any
// failure on the way (a damaged plan, file, object, or one the loader
// refuses) drops the entry with a warning and is a miss. Null on a miss.
std::shared_ptr<runtime::Program> load_cached(DiskCache& cache, const std::string& key,
                                              const Backend& backend, const runtime::Plan& fresh,
                                              bool want_llvm_ir, CodeObject& code, CompiledJob& out,
                                              PassLog& log) {
  auto t0 = std::chrono::steady_clock::now();
  CacheHit hit;
  std::string why;
  const std::vector<std::string> files = backend.cache_files();
  DiskCache::Found found = cache.lookup(key, want_llvm_ir, hit, why, files);
  std::shared_ptr<runtime::Program> program;
  if (found == DiskCache::Found::Hit) {
    try {
      code.plan = runtime::Plan::deserialize(hit.plan);
      if (!code.plan.same_program(fresh))
        throw_user(ErrorKind::Value, "its plan does not match the job's kernels");
      // [harden] The run checks and the first variable write come with fusion's plan.
      code.plan.status_offset = fresh.status_offset;
      code.plan.checks = fresh.checks;
      code.plan.first_variable_write = fresh.first_variable_write;
      code.target = backend.target();
      code.object = std::move(hit.object);
      code.files.clear();
      for (size_t i = 0; i < files.size(); ++i)
        code.files.emplace_back(files[i], std::move(hit.extra[i]));
      code.llvm_ir = std::move(hit.llvm_ir);
      backend.check_cached(code);
      program = backend.load(code, log);
    } catch (const std::exception& e) {
      why = e.what();
      cache.remove(key);
      found = DiskCache::Found::Damaged;
    }
  }
  if (note_cache_miss(found, why, cache, key, fresh.job_name, out, log, t0)) return nullptr;
  cache.touch(key);
  out.from_disk_cache = true;
  size_t bytes = code.object.size();
  for (auto& [name, text] : code.files) bytes += text.size();
  log.stage("disk cache hit", since(t0),
            short_key(key) + " in " + cache.dir() + ", " + std::to_string(bytes) +
                " code bytes, hit #" + std::to_string(hit.hits + 1));
  return program;
}

// The miss path's end: publishes the compiled code (a read-only or full
// cache degrades to in-memory with one warning per directory), then bounds
// the cache's size.
void store_in_cache(DiskCache& cache, CompiledJob& out, const JobDescription& job,
                    const CodeObject& code, double compile_seconds, PassLog& log) {
  if (is_unwritable_cache(cache.dir())) return;
  CacheEntry e = common_cache_entry(out, job, code.plan, compile_seconds);
  e.object = code.object;
  e.llvm_ir = code.llvm_ir;
  e.extra_files = code.files;
  e.target = code.target.str();
  e.codegen_seconds = code.codegen_seconds;
  publish_cache_entry(cache, e, out, log);
}

}  // namespace

EntryReport inspect_cache_entry(const std::string& dir, const std::string& key) {
  DiskCache cache(dir, 0);
  EntryReport r = cache.inspect(key, [](const std::string& target) {
    const CachedCodeChecks* checks = cached_code_checks(target);
    return checks ? checks->files() : std::vector<std::string>{};
  });
  if (!r.error.empty() || !r.problems.empty()) return r;
  const CachedCodeChecks* checks = cached_code_checks(r.target);
  if (checks == nullptr) {
    r.problems.push_back("its target " + printable_text(r.target) +
                         " is not one this flowjit compiles for");
    return r;
  }
  CodeObject code;
  std::string plan, object, why;
  try {
    if (!cache.read_listed(key, "plan.txt", true, plan, why) ||
        !cache.read_listed(key, "object.o", true, object, why))
      throw_user(ErrorKind::Value, why);
    code.plan = runtime::Plan::deserialize(plan);
    int64_t launches = 0;
    for (const runtime::Launch& l : code.plan.launches) launches += l.collective ? 0 : 1;
    if (launches != r.num_kernels)
      throw_user(ErrorKind::Value, "its plan has ", launches, " launches, meta.json says ",
                 r.num_kernels, " kernels");
    code.object.assign(object.begin(), object.end());
    for (const std::string& name : checks->files()) {
      std::string text;
      if (!cache.read_listed(key, name, true, text, why)) throw_user(ErrorKind::Value, why);
      code.files.emplace_back(name, std::move(text));
    }
    checks->check(code);
  } catch (const std::exception& e) {
    r.problems.push_back(printable_text(e.what()));
  }
  return r;
}

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

namespace {

// A job placed on several device sets: its optimized graph (gradients and
// updates included) cut into segments, each compiled as a job of its own on
// its placement's devices.
void compile_stages(const JobDescription& job, const Graph& opt, const CompileSettings& settings,
                    runtime::VariableStore& store, CompiledJob& out, PassLog& log) {
  auto t0 = std::chrono::steady_clock::now();
  StagePartition parts = partition_stages(opt, job.distribution);
  log.stage("stages", since(t0),
            std::to_string(job.distribution.stages.size()) + " placements, " +
                std::to_string(parts.segments.size()) + " segments");
  if (settings.debug >= 2) diag(2, job.name + " segments:\n" + parts.description);
  auto staged = std::make_shared<StagedJob>();
  staged->stages = job.distribution.stages;
  staged->outputs = parts.outputs;
  staged->job_name = job.name;
  out.ir_optimized = "segments:\n" + parts.description;
  for (size_t i = 0; i < parts.segments.size(); ++i) {
    StageSegmentGraph& sg = parts.segments[i];
    JobDescription seg;
    seg.name = job.name + ".segment" + std::to_string(i);
    seg.checks_job = job.checks_job.empty() ? job.name : job.checks_job;
    seg.graph = std::move(sg.graph);
    seg.source = job.source;
    seg.signature = job.signature;
    const std::vector<int>& devices = job.distribution.stages[sg.stage];
    seg.distribution.parts = static_cast<int>(devices.size());
    if (seg.distribution.parts > 1) seg.distribution.split_vars = job.distribution.split_vars;
    StagedJob::Segment s;
    s.stage = sg.stage;
    s.level = sg.level;
    s.inputs = std::move(sg.inputs);
    s.after = std::move(sg.after);
    s.job = compile_job(seg, settings, store);
    out.ir_optimized += "\nsegment " + std::to_string(i) + ":\n" + s.job.ir_optimized;
    out.fusion_plan += s.job.fusion_plan;
    out.kernels += s.job.kernels;
    out.llvm_ir += s.job.llvm_ir;
    out.assembly += s.job.assembly;
    for (auto& c : s.job.kernel_costs) out.kernel_costs.push_back(c);
    for (auto& w : s.job.warnings) out.warnings.push_back(w);
    out.seconds_passes += s.job.seconds_passes;
    out.seconds_codegen += s.job.seconds_codegen;
    out.from_disk_cache = (i == 0 || out.from_disk_cache) && s.job.from_disk_cache;
    staged->segments.push_back(std::move(s));
  }
  out.staged = std::move(staged);
}

}  // namespace

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
  std::vector<NodeRef> losses = job.losses, watched = job.watched_grads;
  NodeRef lr = job.lr;
  if (job.mixed_precision) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<NodeRef> keep = losses;
    if (lr) keep.push_back(lr);
    g = auto_mixed_precision(g, *job.mixed_precision, keep, watched);
    if (lr) lr = keep.back();
    losses.assign(keep.begin(), keep.begin() + static_cast<std::ptrdiff_t>(losses.size()));
    log.stage("auto_mixed_precision", since(t0), std::string(dtype_name(*job.mixed_precision)));
  }
  if (const int64_t min_bytes = attention_min_score_bytes(); min_bytes >= 0) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<NodeRef> keep = losses;
    if (lr) keep.push_back(lr);
    g = fuse_attention(g, keep, watched, min_bytes);  // maps the losses, lr and watched nodes
    if (lr) lr = keep.back();
    losses.assign(keep.begin(), keep.begin() + static_cast<std::ptrdiff_t>(losses.size()));
    log.stage("fuse_attention", since(t0), "");
  }
  if (job.train) {
    FJ_CHECK(job.optimizer.has_value(), "train job without optimizer reached the compiler");
    auto t0 = std::chrono::steady_clock::now();
    OptimizerLowering low =
        lower_optimizer(*job.optimizer, losses, lr, job.step, job.trainable, watched);
    for (auto& e : low.effects) g.effects.push_back(e);
    for (auto& w : low.watched_grads) g.outputs.push_back(w);
    out.new_variables = low.new_variables;
    log.stage("autodiff+optimizer", since(t0), optimizer_name(job.optimizer->kind));
  }
  auto stop_if_interrupted = [&] {
    if (settings.interrupted && settings.interrupted()) throw Interrupted();
  };
  stop_if_interrupted();
  for (auto& [name, type] : out.new_variables) store.get_or_create(name, type, /*trainable=*/false);
  out.writes_variables = !g.effects.empty();
  out.ir_traced = print_graph(g);
  log.dump("traced", print_graph(g, PrintOptions{true}));
  if (settings.debug >= 2) diag(2, job.name + " traced:\n" + out.ir_traced);

  auto t_passes = std::chrono::steady_clock::now();
  Graph opt = optimize(g, log, optimize_options(settings.target));
  for (auto& p : g.params) out.logical_inputs.push_back(p->type());
  for (auto& o : g.outputs) out.logical_outputs.push_back(o->type());
  if (job.distribution.stages.size() > 1) {
    compile_stages(job, opt, settings, store, out, log);
    out.seconds_total = since(t_start);
    log.stage("total", out.seconds_total);
    return out;
  }
  if (job.distribution.parts > 1) {
    auto t0 = std::chrono::steady_clock::now();
    out.distributed = distribute(opt, job.distribution);
    opt = out.distributed->local;
    verify_or_throw(opt, "distribute");
    log.stage("distribute", since(t0),
              std::to_string(job.distribution.parts) + " devices, " +
                  std::to_string(out.distributed->collectives) + " collectives");
    if (settings.debug >= 2)
      diag(2, job.name + " over " + std::to_string(job.distribution.parts) + " devices, boxing:\n" +
                  out.distributed->description);
    log.dump("distributed",
             print_graph(opt, PrintOptions{true}) + "\nboxing:\n" + out.distributed->description);
  }
  out.ir_optimized = print_graph(opt);
  stop_if_interrupted();

  auto t_fuse = std::chrono::steady_clock::now();
  FusionOptions fopts{settings.fuse, settings.check_numerics};
  fopts.devices = std::max(1, job.distribution.parts);
  fopts.checks_job = job.checks_job;
  FusedProgram fp = fuse(opt, job.name, fopts);
  out.fusion_plan = fp.description;
  for (auto& k : fp.kernels) {
    out.kernels += codegen::describe_kernel(k);
    if (auto c = codegen::kernel_cost(k)) out.kernel_costs.push_back({k.name, c->flops, c->bytes});
  }
  log.stage("fusion+memory", since(t_fuse),
            std::to_string(fp.kernels.size()) + " kernels, arena " +
                std::to_string(fp.plan.arena_bytes) + " bytes (" +
                std::to_string(fp.bytes_without_reuse) + " without reuse)");
  if (settings.debug >= 2) diag(2, job.name + " fusion plan:\n" + fp.description);
  log.dump("fusion", fp.description + "\n" + out.kernels);
  log.dump("plan", fp.plan.describe());
  out.seconds_passes = since(t_passes);
  stop_if_interrupted();

  std::unique_ptr<Backend> backend = make_backend(job, settings.target, settings.device);
  CompileRequest req;
  req.module_name = job.name;
  req.debug = settings.debug;
  req.keep_text = settings.keep_text;
  req.want_assembly = settings.debug >= 4 || !settings.dump_dir.empty();
  req.interrupted = settings.interrupted;
  const bool keep_llvm_ir = settings.debug >= 3 || settings.keep_text || !settings.dump_dir.empty();
  std::optional<DiskCache> cache = open_cache(settings, fp, backend->target().str(), out);
  req.want_llvm_ir = keep_llvm_ir || cache.has_value();  // the cache keeps it for `show`

  auto t_cg = std::chrono::steady_clock::now();
  CodeObject code;
  std::shared_ptr<runtime::Program> program;
  if (cache)
    program = load_cached(*cache, out.cache_key, *backend, fp.plan, keep_llvm_ir, code, out, log);
  const bool hit = program != nullptr;
  if (!hit) code = backend->compile(fp.kernels, fp.plan, req, log);
  if (keep_llvm_ir) out.llvm_ir = code.llvm_ir;
  if (settings.debug >= 3) diag(3, job.name + " LLVM IR:\n" + code.llvm_ir);
  log.dump("llvm", code.llvm_ir);
  std::string assembly = backend->assembly(code, req);
  if (backend->keep_assembly(req)) out.assembly = assembly;
  if (settings.debug >= 4) diag(4, job.name + " assembly:\n" + assembly);
  if (!assembly.empty()) log.dump(backend->assembly_stage(), assembly);
  if (!hit) {
    program = backend->load(code, log);
    if (cache) store_in_cache(*cache, out, job, code, since(t_start), log);
  }
  // Only assigns write variables: predict jobs leave the host value current.
  program->set_writes_variables(out.writes_variables);
  if (!out.distributed) backend->bind(*program, store);
  out.gpu_loaded_from = program->loaded_from();
  if (settings.keep_object) out.code_object = code.object;
  out.program = std::move(program);
  out.seconds_codegen = since(t_cg);
  out.seconds_total = since(t_start);
  log.stage("total", out.seconds_total);
  return out;
}

std::shared_ptr<runtime::DistributedExecutable> make_distributed(
    const CompiledJob& job, runtime::VariableStore& host,
    const std::vector<runtime::VariableStore*>& device_stores,
    std::shared_ptr<runtime::Communicator> comm, int first_rank, bool several_processes,
    const std::vector<std::shared_ptr<runtime::DeviceState>>& device_states) {
  FJ_CHECK(job.distributed.has_value(), "make_distributed on a single-device job");
  const DistributedGraph& dg = *job.distributed;
  FJ_CHECK(job.program != nullptr, "a distributed job without code");
  const runtime::Plan& plan = job.program->plan();
  const int n = static_cast<int>(device_stores.size());
  FJ_CHECK(device_states.empty() || static_cast<int>(device_states.size()) == n,
           "a job over several GPUs needs the variable copies of each GPU");
  auto slot = [](const Sbp& s, const TensorType& logical, const TensorType& local) {
    runtime::DeviceSlot d;
    d.kind = s.kind == Sbp::Local ? runtime::DeviceSlot::PerDevice
             : s == Sbp::S(0)     ? runtime::DeviceSlot::Rows
                                  : runtime::DeviceSlot::Whole;
    FJ_CHECK(s.kind != Sbp::Split || s.axis == 0, "results split along an axis other than 0");
    FJ_CHECK(s.kind != Sbp::Partial, "partial results are reduced before they are returned");
    d.type = d.kind == runtime::DeviceSlot::PerDevice ? local : logical;
    return d;
  };
  std::vector<runtime::DeviceSlot> ins, outs;
  for (size_t i = 0; i < dg.params.size(); ++i)
    ins.push_back(slot(dg.params[i], job.logical_inputs[i], plan.inputs[i]));
  for (size_t i = 0; i < dg.outputs.size(); ++i)
    outs.push_back(slot(dg.outputs[i], job.logical_outputs[i], plan.outputs[i]));
  // Device copies of every variable, then one executable per device.
  std::map<std::string, std::pair<Sbp, TensorType>> layout;
  for (auto& [name, sbp, type] : dg.variables) layout[name] = {sbp, type};
  std::vector<runtime::VariableStorage*> host_vars;
  for (auto& [name, local_type] : plan.variables) {
    runtime::VariableStorage* h = host.find(name);
    FJ_USER_CHECK(h != nullptr, ErrorKind::Runtime, "job '", plan.job_name, "' uses variable '",
                  name, "', which no longer exists in the session");
    auto it = layout.find(name);
    FJ_CHECK(it != layout.end(), "variable without a layout: ", name);
    int axis = it->second.first.kind == Sbp::Split ? it->second.first.axis : -1;
    std::vector<runtime::VariableStorage*> locals;
    for (int d = 0; d < n; ++d)
      locals.push_back(device_stores[d]->get_or_create(name, local_type, h->trainable));
    runtime::attach_replicas(*h, axis, comm->size(), first_rank, locals);
    host_vars.push_back(h);
  }
  std::vector<std::shared_ptr<runtime::Program>> devices;
  for (int d = 0; d < n; ++d)
    devices.push_back(job.program->instance_for(
        *device_stores[d], device_states.empty() ? nullptr : device_states[d]));
  auto dist = std::make_shared<runtime::DistributedExecutable>(
      std::move(devices), std::move(comm), first_rank, std::move(ins), std::move(outs),
      std::move(host_vars), several_processes);
  for (auto& v : device_states) dist->keep_alive(v);
  dist->set_writes_variables(job.writes_variables);
  return dist;
}

std::shared_ptr<runtime::Program> make_staged(
    const CompiledJob& job, runtime::VariableStore& host,
    const std::vector<runtime::VariableStore*>& device_stores) {
  FJ_CHECK(job.staged != nullptr, "make_staged on a job without placements");
  const StagedJob& sj = *job.staged;
  std::vector<std::shared_ptr<runtime::Communicator>> comms(sj.stages.size());
  std::vector<runtime::StagedProgram::Segment> segs;
  for (const StagedJob::Segment& s : sj.segments) {
    runtime::StagedProgram::Segment r;
    r.stage = s.stage;
    r.after = s.after;
    for (const StageWire& w : s.inputs) r.inputs.push_back({w.segment, w.index});
    if (s.job.distributed) {
      const std::vector<int>& ids = sj.stages[s.stage];
      std::vector<runtime::VariableStore*> stores;
      for (int id : ids) {
        FJ_USER_CHECK(id >= 0 && id < static_cast<int>(device_stores.size()), ErrorKind::Value,
                      "job '", sj.job_name, "' is placed on CPU device ", id,
                      ", but the session has ", device_stores.size(),
                      " device(s) (flow.config.cpu_device_num)");
        stores.push_back(device_stores[id]);
      }
      if (!comms[s.stage])
        comms[s.stage] = runtime::make_thread_communicator(static_cast<int>(ids.size()));
      r.program = make_distributed(s.job, host, stores, comms[s.stage], 0, false);
    } else {
      r.program = s.job.program;
    }
    segs.push_back(std::move(r));
  }
  std::vector<runtime::StagedProgram::Wire> outs;
  for (const StageWire& w : sj.outputs) outs.push_back({w.segment, w.index});
  return std::make_shared<runtime::StagedProgram>(sj.job_name, std::move(segs), std::move(outs),
                                                  job.logical_inputs, job.logical_outputs);
}

}  // namespace flowjit::jit
