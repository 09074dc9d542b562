// backend: the one interface between the compile driver and a code
// generator. The driver (jit/compile.cpp), the disk cache's hit and store
// path and the bindings are written against it, once; each backend is an
// adapter in jit/backends/ over its code generator (codegen/<name>/) and its
// runtime, registered by one line in jit/backend.cpp.
//
//   make_backend(job, target, device)   decides the target: a codegen::TargetId
//                               (part of the disk-cache key) and whatever
//                               the code depends on beyond it
//   compile(kernels, plan)      -> CodeObject (object bytes, the backend's
//                               own entry files, the plan it runs with)
//   load(code)                  -> runtime::Program
//
// The adapters live in jit/ because loading joins the two layers below it:
// codegen/ (which makes code and must not run it) and runtime/ (which runs
// it and must not know LLVM); see tools/check_layering.py.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "codegen/kernel.h"
#include "codegen/target.h"
#include "jit/compile.h"
#include "jit/pipeline.h"
#include "runtime/executable.h"
#include "runtime/program.h"

namespace flowjit::jit {

// What compile() made, as the disk cache stores it and load() takes it.
struct CodeObject {
  // The target as the entry records it: the key's, with what compiling
  // learned (the PTX version, whether a cubin came) and the placement.
  codegen::TargetId target;
  // The plan the code runs with: fusion's launch records, into which
  // codegen wrote each launch's geometry (a CPU range or a GPU grid).
  // Stored as plan.txt.
  runtime::Plan plan;
  std::vector<char> object;  // object.o: a relocatable ELF object, a cubin (may be empty)
  // The backend's own entry files, named by its cache_files(), in order.
  std::vector<std::pair<std::string, std::string>> files;
  std::string llvm_ir;         // optimized, when kept
  std::string assembly;        // fresh code only, when asked (never stored)
  double codegen_seconds = 0;  // LLVM emit + optimize + codegen (+ ptxas)
};

// What the driver asks of compile().
struct CompileRequest {
  std::string module_name;
  int debug = 0;              // FLOWJIT_DEBUG: 3 prints LLVM IR, 4 assembly
  bool keep_text = false;     // CompileSettings::keep_text
  bool want_llvm_ir = false;  // keep the optimized LLVM IR on the CodeObject
  // Keep the assembly too (FLOWJIT_DEBUG=4 prints it, FLOWJIT_DUMP_DIR writes it).
  bool want_assembly = false;
  // Polled between kernels and passes (Ctrl-C): true stops the compile with
  // Interrupted. Empty: never.
  std::function<bool()> interrupted;
};

// One backend on one decided target (one job's compile).
class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* name() const = 0;
  // Everything that decides the code besides the kernels: part of the key.
  virtual const codegen::TargetId& target() const = 0;
  // Entry files beyond object.o, plan.txt and the texts that a cached
  // CodeObject needs (CodeObject::files, in this order).
  virtual std::vector<std::string> cache_files() const { return {}; }

  // Generates code for `kernels` (fusion's, in launch order; `plan` is
  // fusion's). Logs its stages on `log`. InternalError when LLVM rejects
  // the generated code.
  virtual CodeObject compile(const std::vector<codegen::Kernel>& kernels, const runtime::Plan& plan,
                             const CompileRequest& req, PassLog& log) const = 0;
  // A CodeObject read back from the disk cache: UserError(Value) saying
  // what is wrong when it cannot be this backend's code for `code.plan`.
  virtual void check_cached(const CodeObject& code) const {}
  // The assembly text of fresh or cached code, printed at debug 4 and
  // dumped under assembly_stage() when not empty; CompiledJob::assembly
  // keeps it when keep_assembly().
  virtual std::string assembly(const CodeObject& code, const CompileRequest& req) const = 0;
  virtual bool keep_assembly(const CompileRequest& req) const { return true; }
  virtual const char* assembly_stage() const { return "asm"; }

  // Makes the program, bound to nothing. UserError when the code cannot be
  // loaded (a damaged object, the driver's refusal).
  virtual std::shared_ptr<runtime::Program> load(const CodeObject& code, PassLog& log) const = 0;
  // Points a loaded program at the session's variables (UserError when one
  // is missing or of another type). Distributed jobs skip this: their
  // devices bind their own copies (make_distributed).
  virtual void bind(runtime::Program& program, runtime::VariableStore& store) const = 0;
};

// What a backend checks of cached code, reachable without a job or a
// device (the cache tool's verify): its Backend::cache_files() and
// Backend::check_cached().
struct CachedCodeChecks {
  std::vector<std::string> (*files)();
  void (*check)(const CodeObject& code);
};
// Those of the backend whose entries record `target` (an entry's
// TargetId::str()); null when no registered backend writes such entries.
const CachedCodeChecks* cached_code_checks(const std::string& target);

// What the graph passes may assume of `target` (jit/pipeline.h): which half
// matmuls its code generator computes natively.
OptimizeOptions optimize_options(const Target& target);
// The backend for `target` (the registration table is in backend.cpp).
// UserError when `job` cannot run there (e.g. several devices on a GPU, a
// GPU older than every supported SM).
std::unique_ptr<Backend> make_backend(const JobDescription& job, const Target& target,
                                      const RunDevice& device = {});

}  // namespace flowjit::jit
