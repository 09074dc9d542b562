// compile: traced job to Executable.
#include "jit/compile.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "codegen/cpu/backend.h"
#include "ir/error.h"
#include "ir/printer.h"
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
}  // namespace

CompileSettings CompileSettings::from_environment() {
  CompileSettings s;
  s.debug = std::atoi(env("FLOWJIT_DEBUG").c_str());
  s.dump_dir = env("FLOWJIT_DUMP_DIR");
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
  FusedProgram fp = fuse(opt, job.name);
  out.fusion_plan = fp.description;
  for (auto& k : fp.kernels) out.kernels += codegen::describe_kernel(k);
  log.stage("fusion+memory", since(t_fuse),
            std::to_string(fp.kernels.size()) + " kernels, arena " +
                std::to_string(fp.plan.arena_bytes) + " bytes (" +
                std::to_string(fp.bytes_without_reuse) + " without reuse)");
  if (settings.debug >= 2) std::fprintf(stderr, "[flowjit] %s fusion plan:\n%s", job.name.c_str(), fp.description.c_str());
  log.dump("fusion", fp.description + "\n" + out.kernels);
  out.seconds_passes = since(t_passes);

  auto t_cg = std::chrono::steady_clock::now();
  codegen::cpu::CompileOptions co;
  co.module_name = job.name;
  co.want_llvm_ir = settings.debug >= 3 || settings.keep_text || !settings.dump_dir.empty();
  co.want_assembly = settings.debug >= 4;
  codegen::cpu::CompiledObject obj = codegen::cpu::compile(fp.kernels, co);
  log.stage("llvm emit", obj.seconds_emit);
  log.stage("llvm optimize", obj.seconds_optimize);
  log.stage("llvm codegen", obj.seconds_codegen, std::to_string(obj.object.size()) + " bytes");
  out.llvm_ir = obj.llvm_ir;
  out.assembly = obj.assembly;
  if (settings.debug >= 3) std::fprintf(stderr, "%s", obj.llvm_ir.c_str());
  if (settings.debug >= 4) std::fprintf(stderr, "%s", obj.assembly.c_str());
  log.dump("llvm", obj.llvm_ir);
  if (!obj.assembly.empty()) log.dump("asm", obj.assembly);

  runtime::Plan plan = fp.plan;
  std::vector<std::string> symbols;
  for (size_t i = 0; i < plan.launches.size(); ++i) {
    plan.launches[i].range = obj.launches[i].range;
    plan.launches[i].grain = obj.launches[i].grain;
    plan.launches[i].scratch_bytes = obj.launches[i].scratch_bytes;
    symbols.push_back(plan.launches[i].symbol);
  }
  auto t_load = std::chrono::steady_clock::now();
  auto code = codegen::cpu::load(obj.object, symbols);
  std::vector<runtime::KernelFn> fns;
  for (size_t i = 0; i < symbols.size(); ++i)
    fns.push_back(reinterpret_cast<runtime::KernelFn>(code->address(i)));
  log.stage("load", since(t_load));
  out.seconds_codegen = since(t_cg);
  out.executable = std::make_shared<runtime::Executable>(plan, std::move(fns), code);
  out.executable->bind_variables(store);
  out.seconds_total = since(t_start);
  log.stage("total", out.seconds_total);
  return out;
}

}  // namespace flowjit::jit
