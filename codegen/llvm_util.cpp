// LLVM helpers shared by the backends.
#include "codegen/llvm_util.h"

#include <llvm/IR/Module.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

namespace flowjit::codegen {

void optimize_module(llvm::Module& m, llvm::TargetMachine& tm, bool slp,
                     const std::function<bool()>& interrupted, llvm::OptimizationLevel level) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PipelineTuningOptions pto;
  pto.LoopUnrolling = true;
  pto.LoopVectorization = true;
  pto.SLPVectorization = slp;
  llvm::PassInstrumentationCallbacks pic;
  bool stop = false;
  if (interrupted)
    pic.registerShouldRunOptionalPassCallback([&](llvm::StringRef, llvm::Any) {
      stop = stop || interrupted();
      return !stop;
    });
  llvm::PassBuilder pb(&tm, pto, std::nullopt, interrupted ? &pic : nullptr);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(level);
  mpm.run(m, mam);
}

std::string module_text(const llvm::Module& m) {
  std::string s;
  llvm::raw_string_ostream os(s);
  m.print(os, nullptr);
  return s;
}

}  // namespace flowjit::codegen
