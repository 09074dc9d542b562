// The CPU backend: host description, module emission, O3 optimization,
// object emission, and loading objects with ORC LLJIT.
#include "codegen/cpu/backend.h"

#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/IRReader/IRReader.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/TargetParser/X86TargetParser.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include "codegen/cpu/cpu_codegen.h"
#include "codegen/cpu/mathlib.h"
#include "codegen/llvm_util.h"
#include "ir/error.h"

namespace flowjit::codegen::cpu {

namespace {

void init_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
  });
}

int64_t read_cache_size(int level, const char* type) {
  for (int i = 0; i < 8; ++i) {
    std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lv(dir + "level"), ty(dir + "type"), sz(dir + "size");
    int l = 0;
    std::string t, s;
    if (!(lv >> l) || !(ty >> t) || !(sz >> s)) continue;
    if (l != level || (t != type && t != "Unified")) continue;
    int64_t v = std::atoll(s.c_str());
    if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) v <<= 10;
    if (!s.empty() && s.back() == 'M') v <<= 20;
    return v;
  }
  return 0;
}

// FLOWJIT_CPU=<llvm cpu name> (x86-64-v2, x86-64-v3, znver3, skylake-avx512,
// ...) generates code for that CPU instead of the host, when the host can
// run it: tests and benchmarks of AVX2 or baseline (no FMA) code on a
// bigger host. Its features replace the host's in the target and cache key.
bool cpu_override(llvm::StringMap<bool>& feats, std::string& cpu) {
  const char* want = std::getenv("FLOWJIT_CPU");
  if (want == nullptr || *want == 0) return false;
  llvm::SmallVector<llvm::StringRef, 128> named;
  llvm::X86::getFeaturesForCPU(want, named, /*NeedPlus=*/false);
  if (named.empty()) {
    std::fprintf(stderr,
                 "flowjit: FLOWJIT_CPU=%s is not an x86-64 CPU name LLVM knows; using the host\n",
                 want);
    return false;
  }
  for (llvm::StringRef f : named) {
    auto it = feats.find(f);  // features the host does not list (x87, 64bit) are implied
    if (it != feats.end() && !it->second) {
      std::fprintf(stderr,
                   "flowjit: FLOWJIT_CPU=%s needs '%s', which this host lacks; using the host\n",
                   want, f.str().c_str());
      return false;
    }
  }
  llvm::StringMap<bool> only;
  for (auto& kv : feats) only[kv.first()] = false;
  for (llvm::StringRef f : named) {
    only[f] = true;
    llvm::X86::updateImpliedFeatures(f, true, only);  // avx2 implies avx, sse4.2, ... sse2
  }
  only["64bit"] = true;  // the process is x86-64 whatever the CPU name lists
  feats = std::move(only);
  cpu = want;
  return true;
}

CpuTarget detect_host() {
  init_llvm();
  CpuTarget t;
  t.triple = llvm::sys::getProcessTriple();
  t.cpu = llvm::sys::getHostCPUName().str();
  auto feats = llvm::sys::getHostCPUFeatures();
  cpu_override(feats, t.cpu);
  std::vector<std::string> on;
  for (auto& kv : feats) on.push_back((kv.second ? "+" : "-") + kv.first().str());
  std::sort(on.begin(), on.end());
  for (size_t i = 0; i < on.size(); ++i) t.features += (i ? "," : "") + on[i];
  auto has = [&](const char* f) {
    auto it = feats.find(f);
    return it != feats.end() && it->second;
  };
  t.vector_bits = has("avx512f") ? 512 : has("avx2") ? 256 : has("avx") ? 256 : 128;
  t.has_fma = has("fma");
  if (int64_t l1 = read_cache_size(1, "Data")) t.l1d_bytes = l1;
  if (int64_t l2 = read_cache_size(2, "Unified")) t.l2_bytes = l2;
  t.threads = std::max(1u, std::thread::hardware_concurrency());
  return t;
}

// The CPU's transcendental functions: flowjit's own vectorizable polynomials.
class CpuMath : public MathProvider {
 public:
  llvm::Value* unary(llvm::IRBuilderBase& b, OpKind op, llvm::Value* x) override {
    switch (op) {
      case OpKind::Exp:
        return emit_exp(b, x);
      case OpKind::Log:
        return emit_log(b, x);
      case OpKind::Tanh:
        return emit_tanh(b, x);
      case OpKind::Sigmoid:
        return emit_sigmoid(b, x);
      case OpKind::Sin:
        return emit_sin(b, x);
      case OpKind::Cos:
        return emit_cos(b, x);
      case OpKind::Erf:
        return emit_erf(b, x);
      case OpKind::Erfc:
        return emit_erfc(b, x);
      default:
        FJ_CHECK(false, "no CPU math for ", ir::op_name(op));
    }
  }
  llvm::Value* pow(llvm::IRBuilderBase& b, llvm::Value* x, llvm::Value* y) override {
    return emit_pow(b, x, y);
  }
  llvm::Value* random(llvm::IRBuilderBase& b, OpKind op, llvm::Value* counter, uint64_t seed,
                      llvm::Type* type) override {
    switch (op) {
      case OpKind::RandomUniform:
        return emit_random_uniform(b, counter, seed, type);
      case OpKind::RandomNormal:
        return emit_random_normal(b, counter, seed, type);
      case OpKind::TruncatedNormal:
        return emit_truncated_normal(b, counter, seed, type);
      default:
        FJ_CHECK(false, "no CPU random for ", ir::op_name(op));
    }
  }
};

std::unique_ptr<llvm::TargetMachine> make_target_machine(const CpuTarget& t) {
  init_llvm();
  std::string err;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(t.triple, err);
  FJ_CHECK(target != nullptr, "no LLVM target for ", t.triple, ": ", err);
  llvm::TargetOptions to;
  auto* tm = target->createTargetMachine(t.triple, t.cpu, t.features, to, llvm::Reloc::PIC_,
                                         llvm::CodeModel::Small, llvm::CodeGenOptLevel::Aggressive);
  FJ_CHECK(tm != nullptr, "cannot create a target machine for ", t.triple);
  return std::unique_ptr<llvm::TargetMachine>(tm);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string emit_file(llvm::Module& m, llvm::TargetMachine& tm, llvm::CodeGenFileType type) {
  llvm::SmallVector<char, 0> buf;
  llvm::raw_svector_ostream os(buf);
  llvm::legacy::PassManager pm;
  FJ_CHECK(!tm.addPassesToEmitFile(pm, os, nullptr, type), "the target cannot emit this file type");
  pm.run(m);
  return std::string(buf.begin(), buf.end());
}

}  // namespace

const CpuTarget& host_target() {
  static const CpuTarget t = detect_host();
  return t;
}

std::string CpuTarget::id() const { return triple + ";" + cpu + ";" + features; }

std::string host_target_id() { return host_target().id(); }
int host_vector_bits() { return host_target().vector_bits; }

llvm::Function* declare_kernel(llvm::Module& m, const std::string& name, const CpuTarget& t) {
  llvm::LLVMContext& c = m.getContext();
  auto* ptr = llvm::PointerType::getUnqual(c);
  auto* i64 = llvm::Type::getInt64Ty(c);
  auto* fty = llvm::FunctionType::get(llvm::Type::getVoidTy(c), {ptr, i64, i64, ptr}, false);
  auto* f = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, m);
  f->addFnAttr(llvm::Attribute::NoUnwind);
  f->addFnAttr("target-cpu", t.cpu);
  f->addFnAttr("target-features", t.features);
  // Our vectors are explicit: let the backend keep them at full width.
  f->addFnAttr("min-legal-vector-width", std::to_string(t.vector_bits));
  f->addFnAttr("prefer-vector-width", std::to_string(t.vector_bits));
  f->getArg(0)->setName("args");
  f->getArg(1)->setName("begin");
  f->getArg(2)->setName("end");
  f->getArg(3)->setName("scratch");
  f->getArg(0)->addAttr(llvm::Attribute::NoAlias);
  f->getArg(3)->addAttr(llvm::Attribute::NoAlias);
  return f;
}

std::vector<llvm::Value*> load_kernel_args(llvm::IRBuilderBase& b, llvm::Function* f, size_t n) {
  std::vector<llvm::Value*> out;
  auto* ptr = llvm::PointerType::getUnqual(b.getContext());
  for (size_t i = 0; i < n; ++i) {
    llvm::Value* slot = b.CreateConstGEP1_64(ptr, f->getArg(0), i);
    auto* p = b.CreateAlignedLoad(ptr, slot, llvm::Align(8), "arg" + std::to_string(i));
    p->setMetadata(llvm::LLVMContext::MD_invariant_load, llvm::MDNode::get(b.getContext(), {}));
    out.push_back(p);
  }
  return out;
}

CompiledObject compile(const std::vector<Kernel>& kernels, const CompileOptions& opts) {
  const CpuTarget& t = host_target();
  CompiledObject out;
  auto t0 = std::chrono::steady_clock::now();
  llvm::LLVMContext ctx;
  llvm::Module m(opts.module_name, ctx);
  m.setTargetTriple(t.triple);
  auto tm = make_target_machine(t);
  m.setDataLayout(tm->createDataLayout());
  CpuMath math;
  for (const Kernel& k : kernels) {
    LaunchShape shape;
    if (k.kind == Kernel::Kind::MatMul) {
      emit_matmul_kernel(m, k, t, math, shape);
    } else {
      emit_loop_kernel(m, k, t, math, shape);
    }
    out.launches.push_back({k.name, shape.range, shape.grain, shape.scratch_bytes});
    if (opts.interrupted && opts.interrupted()) throw Interrupted();
  }
  std::string verify_err;
  llvm::raw_string_ostream vos(verify_err);
  if (llvm::verifyModule(m, &vos)) {
    throw InternalError(
        "flowjit internal error (a bug in flowjit, please report it): generated "
        "LLVM IR for module '" +
        opts.module_name + "' is invalid: " + verify_err);
  }
  if (opts.want_unoptimized_ir) out.unoptimized_ir = module_text(m);
  out.seconds_emit = seconds_since(t0);

  auto t1 = std::chrono::steady_clock::now();
  optimize_module(m, *tm, /*slp=*/true, opts.interrupted);
  if (opts.interrupted && opts.interrupted()) throw Interrupted();
  out.seconds_optimize = seconds_since(t1);
  if (opts.want_llvm_ir) out.llvm_ir = module_text(m);

  auto t2 = std::chrono::steady_clock::now();
  if (opts.want_assembly) out.assembly = emit_file(m, *tm, llvm::CodeGenFileType::AssemblyFile);
  std::string obj = emit_file(m, *tm, llvm::CodeGenFileType::ObjectFile);
  out.object.assign(obj.begin(), obj.end());
  out.seconds_codegen = seconds_since(t2);
  return out;
}

CompiledObject compile_ir_text(const std::string& llvm_ir) {
  init_llvm();
  llvm::LLVMContext ctx;
  llvm::SMDiagnostic diag;
  auto buf = llvm::MemoryBuffer::getMemBuffer(llvm_ir, "input.ll", false);
  std::unique_ptr<llvm::Module> m = llvm::parseIR(buf->getMemBufferRef(), diag, ctx);
  FJ_CHECK(m != nullptr, "cannot parse LLVM IR: ", diag.getMessage().str());
  auto tm = make_target_machine(host_target());
  m->setTargetTriple(host_target().triple);
  m->setDataLayout(tm->createDataLayout());
  optimize_module(*m, *tm, /*slp=*/true);
  CompiledObject out;
  std::string obj = emit_file(*m, *tm, llvm::CodeGenFileType::ObjectFile);
  out.object.assign(obj.begin(), obj.end());
  return out;
}

std::string assembly_from_ir(const std::string& llvm_ir) {
  init_llvm();
  llvm::LLVMContext ctx;
  llvm::SMDiagnostic diag;
  auto buf = llvm::MemoryBuffer::getMemBuffer(llvm_ir, "cached.ll", false);
  std::unique_ptr<llvm::Module> m = llvm::parseIR(buf->getMemBufferRef(), diag, ctx);
  if (!m)
    throw_user(ErrorKind::Value, "cannot parse the cached LLVM IR: ", diag.getMessage().str());
  auto tm = make_target_machine(host_target());
  m->setDataLayout(tm->createDataLayout());
  return emit_file(*m, *tm, llvm::CodeGenFileType::AssemblyFile);
}

// ---------------------------------------------------------------- loading

namespace {

class Jit {
 public:
  static Jit& get() {
    static Jit* j = new Jit();  // intentionally leaked: code may outlive statics
    return *j;
  }

  llvm::orc::LLJIT& lljit() { return *jit_; }
  std::mutex& mu() { return mu_; }
  std::string next_name() { return "fj_obj_" + std::to_string(counter_++); }

 private:
  Jit() {
    init_llvm();
    auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
    FJ_CHECK(static_cast<bool>(jtmb), "cannot detect the host for the JIT");
    jtmb->setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
    auto j = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(*jtmb)).create();
    if (!j) {
      std::string msg = llvm::toString(j.takeError());
      FJ_CHECK(false, "cannot create the ORC JIT: ", msg);
    }
    jit_ = std::move(*j);
  }
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  std::mutex mu_;
  std::atomic<uint64_t> counter_{0};
};

class OrcCode : public LoadedCode {
 public:
  OrcCode(llvm::orc::JITDylib* jd, std::vector<void*> addrs) : jd_(jd), addrs_(std::move(addrs)) {}
  ~OrcCode() override {
    Jit& j = Jit::get();
    std::lock_guard<std::mutex> lock(j.mu());
    llvm::consumeError(j.lljit().getExecutionSession().removeJITDylib(*jd_));
  }
  void* address(size_t i) const override { return addrs_.at(i); }

 private:
  llvm::orc::JITDylib* jd_;
  std::vector<void*> addrs_;
};

}  // namespace

std::shared_ptr<LoadedCode> load(const std::vector<char>& object,
                                 const std::vector<std::string>& symbols) {
  Jit& j = Jit::get();
  std::lock_guard<std::mutex> lock(j.mu());
  auto& es = j.lljit().getExecutionSession();
  llvm::orc::JITDylib& jd = es.createBareJITDylib(j.next_name());
  auto gen = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
      j.lljit().getDataLayout().getGlobalPrefix());
  if (gen) jd.addGenerator(std::move(*gen));
  auto fail = [&](llvm::Error e) {
    std::string msg = llvm::toString(std::move(e));
    llvm::consumeError(es.removeJITDylib(jd));
    throw_user(ErrorKind::Runtime, "cannot load compiled kernels: ", msg);
  };
  auto buf = llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size()),
                                                  "flowjit-kernels.o");
  if (auto e = j.lljit().addObjectFile(jd, std::move(buf))) fail(std::move(e));
  std::vector<void*> addrs;
  for (const std::string& s : symbols) {
    auto a = j.lljit().lookup(jd, s);
    if (!a) fail(a.takeError());
    addrs.push_back(a->toPtr<void*>());
  }
  return std::make_shared<OrcCode>(&jd, std::move(addrs));
}

}  // namespace flowjit::codegen::cpu
