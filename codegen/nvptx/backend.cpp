// The NVPTX backend: module emission, libdevice, O3 for the SM, PTX emission.
#include "codegen/nvptx/backend.h"

#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>

#include <chrono>
#include <mutex>
#include <regex>

#include "codegen/family.h"
#include "codegen/llvm_util.h"
#include "codegen/nvptx/nvptx_codegen.h"
#include "ir/error.h"

extern "C" {
void LLVMInitializeNVPTXTargetInfo();
void LLVMInitializeNVPTXTarget();
void LLVMInitializeNVPTXTargetMC();
void LLVMInitializeNVPTXAsmPrinter();
}

namespace flowjit::codegen::nvptx {

llvm::Function* emit_family_kernel(llvm::Module& m, const Kernel& k, const GpuTarget& t,
                                   MathProvider& math, abi::GpuGrid& launch, KernelNotes& notes) {
  using Emit = llvm::Function* (*)(llvm::Module&, const Kernel&, const GpuTarget&, MathProvider&,
                                   abi::GpuGrid&, KernelNotes&);
  static const Emit emitters[] = {
#define FAMILY(Op, name) emit_##name##_nvptx,
#include "codegen/families/families.def"
  };
  family_of(k);  // checks k.family
  return emitters[k.family](m, k, t, math, launch, notes);
}

namespace {

constexpr const char* kTriple = "nvptx64-nvidia-cuda";

void init_nvptx() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
  });
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

[[noreturn]] void internal(const std::string& module, const std::string& what) {
  throw InternalError("flowjit internal error (a bug in flowjit, please report it): GPU module '" +
                      module + "': " + what);
}

std::unique_ptr<llvm::TargetMachine> make_target_machine(int sm) {
  init_nvptx();
  std::string err;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(kTriple, err);
  FJ_CHECK(target != nullptr, "no LLVM NVPTX target: ", err);
  llvm::TargetOptions to;  // IEEE: no contraction, precise division and square root
  auto* tm =
      target->createTargetMachine(kTriple, "sm_" + std::to_string(sm), "", to, llvm::Reloc::PIC_,
                                  std::nullopt, llvm::CodeGenOptLevel::Aggressive);
  FJ_CHECK(tm != nullptr, "cannot create an NVPTX target machine for sm_", sm);
  return std::unique_ptr<llvm::TargetMachine>(tm);
}

int parse_ptx_version(const std::string& ptx) {
  static const std::regex re(R"(\.version\s+(\d+)\.(\d+))");
  std::smatch mt;
  if (!std::regex_search(ptx, mt, re)) return 0;
  return std::stoi(mt[1]) * 10 + std::stoi(mt[2]);
}

}  // namespace

bool is_supported_sm(int sm) {
  for (int s : kSupportedSms)
    if (s == sm) return true;
  return false;
}

std::string supported_sms_text() {
  std::string out;
  for (int s : kSupportedSms) out += (out.empty() ? "sm_" : ", sm_") + std::to_string(s);
  return out;
}

int codegen_sm(int device_sm) {
  int best = 0;
  for (int s : kSupportedSms)
    if (s <= device_sm) best = s;
  return best;
}

TargetId module_target(int sm, bool allow_tf32, const std::string& math, const std::string& ptxas,
                       int ptx_version, const std::string& cubin) {
  TargetId t;
  t.triple = kTriple;
  t.processor = "sm_" + std::to_string(sm);
  if (ptx_version > 0) t.facts.push_back("ptx" + std::to_string(ptx_version));
  t.facts.push_back(std::string("tf32=") + (allow_tf32 ? "1" : "0"));
  t.facts.push_back("math=" + math);
  if (!ptxas.empty()) t.facts.push_back("ptxas=" + ptxas);
  if (!cubin.empty()) t.facts.push_back("cubin=" + cubin);
  return t;
}

CompiledModule compile(const std::vector<Kernel>& kernels, std::vector<abi::Launch>& launches,
                       const CompileOptions& opts) {
  FJ_USER_CHECK(is_supported_sm(opts.sm), ErrorKind::Value, "GPU code generation: sm_", opts.sm,
                " is not supported (supported: ", supported_sms_text(), ")");
  CompiledModule out;
  auto t0 = std::chrono::steady_clock::now();
  llvm::LLVMContext ctx;
  llvm::Module m(opts.module_name, ctx);
  m.setTargetTriple(kTriple);
  auto tm = make_target_machine(opts.sm);
  m.setDataLayout(tm->createDataLayout());
  m.addModuleFlag(llvm::Module::Override, "nvvm-reflect-ftz", uint32_t{0});

  std::string libdevice = opts.libdevice_path.empty() ? find_libdevice() : opts.libdevice_path;
  bool use_libdevice =
      opts.math == MathLibrary::Libdevice || (opts.math == MathLibrary::Auto && !libdevice.empty());
  FJ_USER_CHECK(
      !(use_libdevice && libdevice.empty()), ErrorKind::Runtime,
      "GPU code generation needs libdevice.10.bc from the CUDA toolkit and none was found "
      "(set FLOWJIT_LIBDEVICE or CUDA_HOME)");
  out.math_library = use_libdevice ? "libdevice" : "builtin";
  auto math = make_math(m, use_libdevice);

  GpuTarget target;
  target.sm = opts.sm;
  target.allow_tf32 = opts.allow_tf32;
  FJ_CHECK(launches.size() == kernels.size(), "compile: ", kernels.size(), " kernels but ",
           launches.size(), " launch records");
  for (size_t i = 0; i < kernels.size(); ++i) {
    const Kernel& k = kernels[i];
    if (k.kind == Kernel::Kind::Collective) continue;  // no code: the runtime runs it
    FJ_CHECK(launches[i].symbol == k.name, "launch record ", i, " is ", launches[i].symbol,
             " but the kernel is ", k.name);
    abi::GpuGrid grid;
    KernelNotes notes;
    llvm::Function* f =
        k.kind == Kernel::Kind::MatMul   ? emit_matmul_kernel(m, k, target, *math, grid, notes)
        : k.kind == Kernel::Kind::Family ? emit_family_kernel(m, k, target, *math, grid, notes)
                                         : emit_loop_kernel(m, k, target, *math, grid, notes);
    if (k.guard_arg >= 0)  // the status buffer is the kernel's parameter guard_arg
      add_status_guard(
          f,
          [&](llvm::IRBuilderBase&) -> llvm::Value* {
            return f->getArg(static_cast<unsigned>(k.guard_arg));
          },
          k.guard_words);
    launches[i].geometry = grid;
    out.notes.push_back(std::move(notes));
  }
  std::string verify_err;
  llvm::raw_string_ostream vos(verify_err);
  if (llvm::verifyModule(m, &vos))
    internal(opts.module_name, "generated LLVM IR is invalid: " + verify_err);
  link_libdevice(m, libdevice);
  out.seconds_emit = seconds_since(t0);

  auto t1 = std::chrono::steady_clock::now();
  optimize_module(m, *tm, /*slp=*/false);
  out.seconds_optimize = seconds_since(t1);
  for (llvm::Function& f : m)
    if (f.isDeclaration() && !f.isIntrinsic() && !f.use_empty())
      internal(opts.module_name, "unresolved function '" + f.getName().str() + "' after linking");
  if (opts.want_llvm_ir) out.llvm_ir = module_text(m);

  auto t2 = std::chrono::steady_clock::now();
  {
    llvm::SmallVector<char, 0> buf;
    llvm::raw_svector_ostream os(buf);
    llvm::legacy::PassManager pm;
    FJ_CHECK(!tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile),
             "the NVPTX target cannot emit PTX");
    pm.run(m);
    out.ptx.assign(buf.begin(), buf.end());
  }
  out.seconds_codegen = seconds_since(t2);
  out.ptx_version = parse_ptx_version(out.ptx);
  out.target_id =
      module_target(opts.sm, opts.allow_tf32, out.math_library, "", out.ptx_version).str();

  if (opts.run_ptxas) {
    std::string ptxas = opts.ptxas_path.empty() ? find_ptxas() : opts.ptxas_path;
    if (!ptxas.empty()) {
      auto t3 = std::chrono::steady_clock::now();
      PtxasResult r = run_ptxas(out.ptx, opts.sm, ptxas);
      out.seconds_ptxas = seconds_since(t3);
      if (!r.ok)
        internal(opts.module_name, "ptxas (" + ptxas + ") rejected the PTX for sm_" +
                                       std::to_string(opts.sm) + ":\n" + r.log);
      out.cubin = std::move(r.cubin);
      out.ptxas_log = std::move(r.log);
      out.ptxas_path = ptxas;
    }
  }
  return out;
}

}  // namespace flowjit::codegen::nvptx
