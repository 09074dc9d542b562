// The CPU backend: codegen/cpu's object code, loaded with ORC into a
// runtime::Executable. Collective launches have no code (the runtime runs
// them); codegen writes each coded launch's CPU range (range, grain, scratch
// bytes) into the plan's launch record, which the code runs with (and the
// entry's plan.txt keeps).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string_view>

#include "codegen/cpu/backend.h"
#include "codegen/cpu/kernel_units.h"
#include "ir/diag.h"
#include "ir/error.h"
#include "jit/backends/backends.h"

namespace flowjit::jit::backends {

namespace {

namespace cg = codegen::cpu;

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The CPU backend's compile counters, for the log.
std::string compile_counts(const cg::CompiledObject& obj, bool run_once) {
  return std::to_string(obj.kernels_compiled) + " kernels compiled (" + (run_once ? "O0" : "O3") +
         ", " + std::to_string(obj.threads) + " threads), " + std::to_string(obj.kernels_shared) +
         " identical to another, " + std::to_string(obj.kernels_reused) +
         " reused from this process";
}

class CpuBackend : public Backend {
 public:
  CpuBackend(const JobDescription& job, const Target& target)
      : target_(cg::target_id_for(target.cpu)), cpu_(target.cpu), run_once_(job.run_once) {
    if (job.distribution.parts > 1)  // the per-device program of a distributed job
      placement_ = "x" + std::to_string(job.distribution.parts) +
                   (job.distribution.mirrored ? " mirrored" : " devices");
  }

  const char* name() const override { return "cpu"; }
  const codegen::TargetId& target() const override { return target_; }

  CodeObject compile(const std::vector<codegen::Kernel>& kernels, const runtime::Plan& plan,
                     const CompileRequest& req, PassLog& log) const override {
    CodeObject code;
    code.target = target_;
    code.target.placement = placement_;
    code.plan = plan;
    cg::CompileOptions co;
    co.module_name = req.module_name;
    co.want_llvm_ir = req.want_llvm_ir;
    co.want_assembly = req.want_assembly;
    co.run_once = run_once_;
    co.cpu = cpu_;
    co.interrupted = req.interrupted;
    cg::CompiledObject obj = cg::compile(kernels, code.plan.launches, co);
    log.stage("llvm emit", obj.seconds_emit);
    log.stage("llvm optimize", obj.seconds_optimize);
    log.stage("llvm codegen", obj.seconds_codegen, std::to_string(obj.object.size()) + " bytes");
    log.stage("llvm compile", obj.seconds_wall, compile_counts(obj, run_once_));
    if (req.debug >= 2) {  // a line per kernel compiled
      std::string_view times = obj.kernel_times;
      for (size_t at = 0; at < times.size();) {
        size_t end = std::min(times.find('\n', at), times.size());
        ir::diag(2, times.substr(at, end - at));
        at = end + 1;
      }
    }

    code.object = std::move(obj.object);
    code.llvm_ir = std::move(obj.llvm_ir);
    code.assembly = std::move(obj.assembly);
    code.codegen_seconds = obj.seconds_emit + obj.seconds_optimize + obj.seconds_codegen;
    return code;
  }

  void check_cached(const CodeObject& code) const override { check_cached_cpu(code); }

  std::string assembly(const CodeObject& code, const CompileRequest& req) const override {
    if (!code.assembly.empty() || !req.want_assembly) return code.assembly;
    return cg::assembly_from_ir(code.llvm_ir);  // cached code keeps only its LLVM IR
  }

  std::shared_ptr<runtime::Program> load(const CodeObject& code, PassLog& log) const override {
    auto t0 = std::chrono::steady_clock::now();
    const runtime::Plan& plan = code.plan;
    std::vector<std::string> symbols;
    std::vector<size_t> coded;  // launch index of each generated kernel
    for (size_t i = 0; i < plan.launches.size(); ++i) {
      if (plan.launches[i].collective) continue;
      symbols.push_back(plan.launches[i].symbol);
      coded.push_back(i);
    }
    std::shared_ptr<cg::LoadedCode> loaded = cg::load(code.object, symbols);
    std::vector<runtime::KernelFn> fns(plan.launches.size(), nullptr);
    for (size_t j = 0; j < coded.size(); ++j)
      fns[coded[j]] = reinterpret_cast<runtime::KernelFn>(loaded->address(j));
    auto exe = std::make_shared<runtime::Executable>(plan, std::move(fns), loaded);
    log.stage("load", since(t0));
    return exe;
  }

  void bind(runtime::Program& program, runtime::VariableStore& store) const override {
    program.bind(store, nullptr);
  }

 private:
  codegen::TargetId target_;
  std::string cpu_;  // Target::cpu
  std::string placement_;
  bool run_once_;
};

}  // namespace

// Every launch of a cached plan must be a CPU range, and the object an ELF
// object or a container of them.
void check_cached_cpu(const CodeObject& code) {
  for (const runtime::Launch& l : code.plan.launches)
    if (!l.cpu()) throw_user(ErrorKind::Value, "its launch ", l.symbol, " has a GPU grid");
  auto elf = [](const char* p, size_t n) {
    return n >= 4 && std::string_view(p, 4) ==
                         "\x7f"
                         "ELF";
  };
  if (elf(code.object.data(), code.object.size())) return;
  if (!cg::is_container(code.object))
    throw_user(ErrorKind::Value, "its object.o is not an ELF object or an object container");
  const cg::UnpackedObjects u = cg::unpack_objects(code.object);
  for (size_t i = 0; i < u.objects.size(); ++i)
    if (!elf(u.objects[i].first, u.objects[i].second))
      throw_user(ErrorKind::Value, "its object.o's object ", i, " is not ELF");
}

OptimizeOptions cpu_optimize_options(const Target& target) {
  OptimizeOptions o;
  o.bf16_matmuls = cg::bf16_matmuls(target.cpu);
  return o;
}

std::unique_ptr<Backend> make_cpu(const JobDescription& job, const Target& target,
                                  const RunDevice&) {
  return std::make_unique<CpuBackend>(job, target);
}

}  // namespace flowjit::jit::backends
