// The CPU backend: host description, module emission, O3 optimization,
// object emission, and loading objects with ORC LLJIT.
#include "codegen/cpu/backend.h"

#include <llvm/Analysis/VectorUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/IRReader/IRReader.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SHA256.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/TargetParser/Triple.h>
#include <llvm/TargetParser/X86TargetParser.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include <tbb/parallel_for.h>
#include <tbb/parallel_for_each.h>
#include <tbb/task_arena.h>

#include "codegen/cpu/cpu_codegen.h"
#include "codegen/cpu/kernel_units.h"
#include "codegen/family.h"
#include "codegen/llvm_util.h"
#include "codegen/mathlib.h"
#include "ir/diag.h"
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

// The features of LLVM's x86-64 CPU `name` (its own and those they imply),
// every other feature of `feats` off; false when LLVM does not know the name.
bool features_of_cpu(const std::string& name, llvm::StringMap<bool>& feats) {
  if (llvm::X86::parseArchX86(name, /*Only64Bit=*/true) == llvm::X86::CK_None) return false;
  llvm::SmallVector<llvm::StringRef, 128> named;
  llvm::X86::getFeaturesForCPU(name, named, /*NeedPlus=*/false);
  if (named.empty()) return false;
  llvm::StringMap<bool> only;
  for (auto& kv : feats) only[kv.first()] = false;
  for (llvm::StringRef f : named) {
    only[f] = true;
    llvm::X86::updateImpliedFeatures(f, true, only);  // avx2 implies avx, sse4.2, ... sse2
  }
  only["64bit"] = true;  // the process is x86-64 whatever the CPU name lists
  feats = std::move(only);
  return true;
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
    ir::diag(0, std::string("FLOWJIT_CPU=") + want +
                    " is not an x86-64 CPU name LLVM knows; using the host");
    return false;
  }
  for (llvm::StringRef f : named) {
    auto it = feats.find(f);  // features the host does not list (x87, 64bit) are implied
    if (it != feats.end() && !it->second) {
      ir::diag(0, std::string("FLOWJIT_CPU=") + want + " needs '" + f.str() +
                      "', which this host lacks; using the host");
      return false;
    }
  }
  features_of_cpu(want, feats);
  cpu = want;
  return true;
}

// The target of CPU `cpu` with features `feats`, the host's cache sizes and threads.
CpuTarget make_target(const std::string& cpu, const llvm::StringMap<bool>& feats) {
  CpuTarget t;
  t.triple = llvm::sys::getProcessTriple();
  t.cpu = cpu;
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
  t.has_avx512bf16 = t.vector_bits >= 512 && has("avx512bf16");
  if (int64_t l1 = read_cache_size(1, "Data")) t.l1d_bytes = l1;
  if (int64_t l2 = read_cache_size(2, "Unified")) t.l2_bytes = l2;
  t.threads = std::max(1u, std::thread::hardware_concurrency());
  return t;
}

CpuTarget detect_host() {
  init_llvm();
  std::string cpu = llvm::sys::getHostCPUName().str();
  auto feats = llvm::sys::getHostCPUFeatures();
  cpu_override(feats, cpu);
  return make_target(cpu, feats);
}

// The CPU's transcendental functions: flowjit's own vectorizable polynomials.
//
// With 16 vector registers (AVX2 and older: no AVX-512) a fused chain of
// several functions needs more constants than there are registers, and LLVM
// then rematerializes each splat constant inside the loop by a broadcast
// from the constant pool. On Zen 4 (and Intel cores alike) a broadcast to a
// ymm register takes a shuffle slot on the vector pipes besides its load:
// the 8-op chain's AVX2 loop had 22 of them in 74 instructions. So on such
// targets every vector constant a math function uses (floating-point
// operands, and the integer operands of add, sub and compares) is made once
// per kernel in the entry block and passed through an empty inline-asm
// statement, which the register allocator cannot rematerialize: what does
// not fit in a register is spilled once and reloaded as a full-width memory
// operand folded into its user (a load, no shuffle). The values, and so the
// results, are bit-identical.
class CpuMath : public MathProvider {
 public:
  explicit CpuMath(const CpuTarget& t)
      : pin_bits_(t.vector_bits < 512 && llvm::Triple(t.triple).isX86() ? t.vector_bits : 0) {}

  llvm::Value* unary(llvm::IRBuilderBase& b, OpKind op, llvm::Value* x) override {
    return pinned(b, [&] { return unary_math(b, op, x); });
  }
  llvm::Value* pow(llvm::IRBuilderBase& b, llvm::Value* x, llvm::Value* y) override {
    return pinned(b, [&] { return emit_pow(b, x, y); });
  }
  llvm::Value* random(llvm::IRBuilderBase& b, OpKind op, llvm::Value* counter, llvm::Value* seed,
                      llvm::Type* type) override {
    switch (op) {
      case OpKind::RandomUniform:
        return emit_random_uniform_seed_value(b, counter, seed, type);
      case OpKind::RandomNormal:
        return emit_random_normal_seed_value(b, counter, seed, type);
      case OpKind::TruncatedNormal:
        return emit_truncated_normal_seed_value(b, counter, seed, type);
      default:
        FJ_CHECK(false, "no CPU random for ", ir::op_name(op));
    }
  }

 private:
  static llvm::Value* unary_math(llvm::IRBuilderBase& b, OpKind op, llvm::Value* x) {
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

  // Runs `emit` (straight-line code at the builder's insertion point, as
  // every mathlib function is) and then pins the vector constants of the
  // instructions it made.
  template <class F>
  llvm::Value* pinned(llvm::IRBuilderBase& b, F&& emit) {
    llvm::BasicBlock* bb = b.GetInsertBlock();
    llvm::Instruction* before =
        b.GetInsertPoint() == bb->begin() ? nullptr : &*std::prev(b.GetInsertPoint());
    llvm::Value* result = emit();
    if (pin_bits_ == 0 || b.GetInsertBlock() != bb) return result;
    auto it = before ? std::next(before->getIterator()) : bb->begin();
    for (; it != b.GetInsertPoint(); ++it) {
      for (llvm::Use& u : it->operands()) {
        auto* c = llvm::dyn_cast<llvm::Constant>(u.get());
        if (c && pinnable(*it, *c, pin_bits_)) u.set(pin(*bb->getParent(), c));
      }
    }
    return result;
  }

  // A splat of one whole register, or of two or four whole registers: a
  // loop can run two registers per vector for more independent work, and a
  // float function computed in double lanes doubles its registers. A splat
  // of several registers is one pinned register repeated.
  static bool pinnable(const llvm::Instruction& user, const llvm::Constant& c, int reg_bits) {
    auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(c.getType());
    if (vt == nullptr || c.getSplatValue() == nullptr || llvm::isa<llvm::UndefValue>(c))
      return false;
    uint64_t bits = vt->getPrimitiveSizeInBits().getFixedValue();
    uint64_t reg = static_cast<uint64_t>(reg_bits);
    if (bits != 128 && bits != reg && bits != 2 * reg && bits != 4 * reg) return false;
    if (llvm::isa<llvm::ShuffleVectorInst>(user) || llvm::isa<llvm::ExtractElementInst>(user) ||
        llvm::isa<llvm::InsertElementInst>(user))
      return false;
    if (vt->getElementType()->isFloatingPointTy()) return true;
    // Integer constants only where x86 takes them as a vector operand: not
    // shift amounts (an immediate) nor masks LLVM folds into other forms.
    unsigned op = user.getOpcode();
    return op == llvm::Instruction::Add || op == llvm::Instruction::Sub ||
           op == llvm::Instruction::ICmp;
  }

  llvm::Value* pin(llvm::Function& f, llvm::Constant* c) {
    llvm::Value*& v = pins_[{&f, c}];
    if (v != nullptr) return v;
    auto* vt = llvm::cast<llvm::FixedVectorType>(c->getType());
    unsigned reg_lanes = static_cast<unsigned>(pin_bits_) / vt->getScalarSizeInBits();
    if (vt->getNumElements() > reg_lanes) {  // one pinned register, repeated
      llvm::Value* part = pin(f, llvm::ConstantVector::getSplat(
                                     llvm::ElementCount::getFixed(reg_lanes), c->getSplatValue()));
      auto* at = llvm::cast<llvm::Instruction>(part);
      llvm::IRBuilder<> eb(at->getParent(), std::next(at->getIterator()));
      llvm::SmallVector<llvm::Value*, 4> parts(vt->getNumElements() / reg_lanes, part);
      return v = llvm::concatenateVectors(eb, parts);
    }
    llvm::IRBuilder<> eb(&*f.getEntryBlock().getFirstInsertionPt());
    auto* fty = llvm::FunctionType::get(c->getType(), {c->getType()}, false);
    auto* call = eb.CreateCall(fty, llvm::InlineAsm::get(fty, "", "=x,0", false), {c});
    call->setDoesNotAccessMemory();
    call->setDoesNotThrow();
    return v = call;
  }

  int pin_bits_;  // the vector register's bits where constants are pinned, else 0
  std::map<std::pair<llvm::Function*, llvm::Constant*>, llvm::Value*> pins_;
};

std::unique_ptr<llvm::TargetMachine> make_target_machine(
    const CpuTarget& t, llvm::CodeGenOptLevel level = llvm::CodeGenOptLevel::Aggressive) {
  init_llvm();
  std::string err;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(t.triple, err);
  FJ_CHECK(target != nullptr, "no LLVM target for ", t.triple, ": ", err);
  llvm::TargetOptions to;
  auto* tm = target->createTargetMachine(t.triple, t.cpu, t.features, to, llvm::Reloc::PIC_,
                                         llvm::CodeModel::Small, level);
  FJ_CHECK(tm != nullptr, "cannot create a target machine for ", t.triple);
  if (level == llvm::CodeGenOptLevel::None) {
    tm->setO0WantsFastISel(true);
    tm->setFastISel(true);
  }
  return std::unique_ptr<llvm::TargetMachine>(tm);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU seconds of the calling thread: the stages of one kernel's compile,
// which other threads (compiling other kernels, or other processes on a
// shared machine) do not inflate.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
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

const CpuTarget& target_for(const std::string& cpu) {
  if (cpu.empty()) return host_target();
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<CpuTarget>> named;
  std::lock_guard<std::mutex> lock(mu);
  auto it = named.find(cpu);
  if (it != named.end()) return *it->second;
  init_llvm();
  auto feats = llvm::sys::getHostCPUFeatures();
  if (!features_of_cpu(cpu, feats))
    throw_user(ErrorKind::Value, "'", cpu,
               "' is not an x86-64 CPU name LLVM knows (expected a level such as 'x86-64-v3' or a "
               "CPU such as 'znver4', 'skylake-avx512')");
  auto t = std::make_unique<CpuTarget>(make_target(cpu, feats));
  return *named.emplace(cpu, std::move(t)).first->second;
}

bool host_runs(const std::string& cpu) {
  if (cpu.empty()) return true;
  target_for(cpu);  // UserError for an unknown name
  auto host = llvm::sys::getHostCPUFeatures();
  llvm::SmallVector<llvm::StringRef, 128> named;
  llvm::X86::getFeaturesForCPU(cpu, named, /*NeedPlus=*/false);
  for (llvm::StringRef f : named) {
    auto it = host.find(f);
    if (it != host.end() && !it->second) return false;
  }
  return true;
}

TargetId target_id_for(const std::string& cpu) { return target_for(cpu).target_id(); }

// The matmul's tiles come from the features (vector width, registers, FMA);
// its cache blocking and task split from the cache sizes and thread count,
// so those are part of the key too.
TargetId CpuTarget::target_id() const {
  return TargetId{triple,
                  cpu,
                  {features, "l1d=" + std::to_string(l1d_bytes), "l2=" + std::to_string(l2_bytes),
                   "threads=" + std::to_string(threads)},
                  ""};
}

std::string CpuTarget::id() const { return target_id().str(); }

TargetId host_target_id() { return host_target().target_id(); }
int host_vector_bits() { return host_target().vector_bits; }
bool host_has_fma() { return host_target().has_fma; }
bool bf16_matmuls(const std::string& cpu) { return target_for(cpu).has_avx512bf16; }

llvm::Function* declare_kernel(llvm::Module& m, const std::string& name, const CpuTarget& t,
                               bool seeded) {
  llvm::LLVMContext& c = m.getContext();
  auto* ptr = llvm::PointerType::getUnqual(c);
  auto* i64 = llvm::Type::getInt64Ty(c);
  std::vector<llvm::Type*> params = {ptr, i64, i64, ptr};
  if (seeded) params.push_back(ptr);
  auto* fty = llvm::FunctionType::get(llvm::Type::getVoidTy(c), params, false);
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
  if (seeded) {
    f->getArg(4)->setName("seeds");
    f->getArg(4)->addAttr(llvm::Attribute::NoAlias);
    f->getArg(4)->addAttr(llvm::Attribute::ReadOnly);
  }
  return f;
}

std::vector<int> random_nodes(const Kernel& k) {
  std::vector<int> out;
  for (size_t i = 0; i < k.nodes.size(); ++i)
    if (k.nodes[i].kind == KOp::Random) out.push_back(static_cast<int>(i));
  return out;
}

void emit_seed_thunks(llvm::Module& m, const std::vector<SeedThunk>& thunks, const CpuTarget& t) {
  llvm::LLVMContext& c = m.getContext();
  auto* i64 = llvm::Type::getInt64Ty(c);
  for (const SeedThunk& th : thunks) {
    llvm::Function* body = m.getFunction(th.body);
    if (body == nullptr) {
      body = declare_kernel(m, th.body, t, /*seeded=*/true);
      body->setLinkage(llvm::Function::ExternalLinkage);
    }
    std::vector<llvm::Constant*> vals;
    for (int64_t s : th.seeds)
      vals.push_back(llvm::ConstantInt::get(i64, static_cast<uint64_t>(s)));
    auto* aty = llvm::ArrayType::get(i64, vals.size());
    auto* table =
        new llvm::GlobalVariable(m, aty, /*isConstant=*/true, llvm::GlobalValue::PrivateLinkage,
                                 llvm::ConstantArray::get(aty, vals), th.name + ".seeds");
    table->setUnnamedAddr(llvm::GlobalValue::UnnamedAddr::Global);
    table->setAlignment(llvm::Align(8));
    llvm::Function* f = declare_kernel(m, th.name, t);
    llvm::IRBuilder<> b(llvm::BasicBlock::Create(c, "entry", f));
    auto* call =
        b.CreateCall(body, {f->getArg(0), f->getArg(1), f->getArg(2), f->getArg(3), table});
    call->setTailCall(true);
    b.CreateRetVoid();
  }
}

llvm::Function* emit_family_kernel(llvm::Module& m, const Kernel& k, const CpuTarget& t,
                                   MathProvider& math, abi::CpuRange& shape) {
  using Emit = llvm::Function* (*)(llvm::Module&, const Kernel&, const CpuTarget&, MathProvider&,
                                   abi::CpuRange&);
  static const Emit emitters[] = {
#define FAMILY(Op, name) emit_##name##_cpu,
#include "codegen/families/families.def"
  };
  family_of(k);  // checks k.family
  return emitters[k.family](m, k, t, math, shape);
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

namespace {

// The two optimization levels of kernels: O3 for kernels that run many
// times, O0 with fast instruction selection for those that run once. Neither
// uses fast-math flags or contracts anything the IR did not (fmuladd is
// fused by the same rule at both), so both compute the same numbers. The
// emitters write SSA vector code, so the IR passes of O1 buy a run-once
// kernel little: the +8 MLP's initializer job ran in the same 12 ms CPU at
// O0 as at O1, and its truncated-normal body (the init job's critical path)
// compiled in about half the time (no 19 ms of O1 passes before codegen).
struct Level {
  llvm::OptimizationLevel ir;
  llvm::CodeGenOptLevel cg;
  const char* id;
};
Level level_for(bool run_once) {
  if (run_once) return {llvm::OptimizationLevel::O0, llvm::CodeGenOptLevel::None, "O0"};
  return {llvm::OptimizationLevel::O3, llvm::CodeGenOptLevel::Aggressive, "O3"};
}

// A Loop kernel with Random nodes compiles to a seeded body (its seeds read
// at run time, see declare_kernel) and a thunk per seed list: initializers
// of equal shape share one body whatever their seeds. (A MatMul kernel's
// epilogue keeps its seeds as constants.)
bool seeded_body(const Kernel& k) {
  if (k.kind != Kernel::Kind::Loop) return false;
  for (const KNode& n : k.nodes)
    if (n.kind == KOp::Random) return true;
  return false;
}

// The thunks of one compile() call, compiled together: a few instructions
// each, so no IR optimization and fast instruction selection.
std::shared_ptr<CompiledUnit> compile_thunks(const std::vector<SeedThunk>& thunks,
                                             const CompileOptions& opts) {
  const CpuTarget& t = target_for(opts.cpu);
  auto u = std::make_shared<CompiledUnit>();
  double t0 = thread_seconds();
  llvm::LLVMContext ctx;
  llvm::Module m("fjk_seed_thunks", ctx);
  m.setTargetTriple(t.triple);
  auto tm = make_target_machine(t, llvm::CodeGenOptLevel::None);
  m.setDataLayout(tm->createDataLayout());
  emit_seed_thunks(m, thunks, t);
  std::string verify_err;
  llvm::raw_string_ostream vos(verify_err);
  if (llvm::verifyModule(m, &vos))
    throw InternalError(
        "flowjit internal error (a bug in flowjit, please report it): the seed thunks of "
        "module '" +
        opts.module_name + "' are invalid: " + verify_err);
  u->seconds_emit = thread_seconds() - t0;
  if (opts.want_llvm_ir || opts.want_assembly) u->llvm_ir = module_text(m);
  double t2 = thread_seconds();
  if (opts.want_assembly) u->assembly = emit_file(m, *tm, llvm::CodeGenFileType::AssemblyFile);
  std::string obj = emit_file(m, *tm, llvm::CodeGenFileType::ObjectFile);
  u->object.assign(obj.begin(), obj.end());
  u->seconds_codegen = thread_seconds() - t2;
  return u;
}

std::string hex_digest(const std::string& bytes, int n) {
  std::array<uint8_t, 32> h = llvm::SHA256::hash(
      llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < n; ++i) {
    s.push_back(hex[h[i] >> 4]);
    s.push_back(hex[h[i] & 15]);
  }
  return s;
}

// Compiles one kernel alone, under `symbol`, in a context of its own (so
// several run at once on different threads).
// A kernel's module, emitted and verified, before optimization.
struct EmittedUnit {
  std::unique_ptr<llvm::LLVMContext> ctx;
  std::unique_ptr<llvm::Module> m;
  std::unique_ptr<llvm::TargetMachine> tm;
  std::shared_ptr<CompiledUnit> u;  // symbol, shape, seconds_emit so far
  void clear() {                    // the module before its context
    m.reset();
    tm.reset();
    ctx.reset();
  }
};

EmittedUnit emit_unit(const Kernel& kernel, const std::string& symbol, const Level& level,
                      const CompileOptions& opts, std::string* unoptimized_ir) {
  const CpuTarget& t = target_for(opts.cpu);
  EmittedUnit e;
  e.u = std::make_shared<CompiledUnit>();
  e.u->symbol = symbol;
  double t0 = thread_seconds();
  e.ctx = std::make_unique<llvm::LLVMContext>();
  e.m = std::make_unique<llvm::Module>(symbol, *e.ctx);
  llvm::Module& m = *e.m;
  m.setTargetTriple(t.triple);
  e.tm = make_target_machine(t, level.cg);
  m.setDataLayout(e.tm->createDataLayout());
  CpuMath math(t);
  Kernel k = kernel;
  k.name = symbol;
  llvm::Function* f = k.kind == Kernel::Kind::MatMul ? emit_matmul_kernel(m, k, t, math, e.u->shape)
                      : k.kind == Kernel::Kind::Family
                          ? emit_family_kernel(m, k, t, math, e.u->shape)
                          : emit_loop_kernel(m, k, t, math, e.u->shape, seeded_body(k));
  if (k.guard_arg >= 0)  // args[guard_arg] is the status buffer
    add_status_guard(
        f,
        [&](llvm::IRBuilderBase& b) -> llvm::Value* {
          auto* ptr = llvm::PointerType::getUnqual(*e.ctx);
          return b.CreateAlignedLoad(ptr, b.CreateConstGEP1_64(ptr, f->getArg(0), k.guard_arg),
                                     llvm::Align(8), "status_buffer");
        },
        k.guard_words);
  if (opts.interrupted && opts.interrupted()) throw Interrupted();
  std::string verify_err;
  llvm::raw_string_ostream vos(verify_err);
  if (llvm::verifyModule(m, &vos)) {
    throw InternalError(
        "flowjit internal error (a bug in flowjit, please report it): generated "
        "LLVM IR for kernel '" +
        kernel.name + "' of module '" + opts.module_name + "' is invalid: " + verify_err);
  }
  if (unoptimized_ir != nullptr) *unoptimized_ir = module_text(m);
  e.u->ir_emitted = m.getInstructionCount();
  e.u->seconds_emit = thread_seconds() - t0;
  return e;
}

// Optimizes and compiles an emitted unit; frees its module.
std::shared_ptr<CompiledUnit> finish_unit(EmittedUnit& e, const Level& level,
                                          const CompileOptions& opts) {
  llvm::Module& m = *e.m;
  CompiledUnit& u = *e.u;
  double t1 = thread_seconds();
  optimize_module(m, *e.tm, /*slp=*/true, opts.interrupted, level.ir);
  if (opts.interrupted && opts.interrupted()) throw Interrupted();
  u.seconds_optimize = thread_seconds() - t1;
  u.ir_optimized = m.getInstructionCount();
  if (opts.want_llvm_ir || opts.want_assembly) u.llvm_ir = module_text(m);

  double t2 = thread_seconds();
  if (opts.want_assembly) u.assembly = emit_file(m, *e.tm, llvm::CodeGenFileType::AssemblyFile);
  std::string obj = emit_file(m, *e.tm, llvm::CodeGenFileType::ObjectFile);
  u.object.assign(obj.begin(), obj.end());
  u.seconds_codegen = thread_seconds() - t2;
  e.clear();
  return e.u;
}

}  // namespace

void clear_kernel_cache() { UnitCache::process().clear(); }

CompiledObject compile(const std::vector<Kernel>& kernels, std::vector<abi::Launch>& launches,
                       const CompileOptions& opts) {
  auto t_start = std::chrono::steady_clock::now();
  FJ_CHECK(launches.size() == kernels.size(), "compile: ", kernels.size(), " kernels but ",
           launches.size(), " launch records");
  const CpuTarget& t = target_for(opts.cpu);
  const Level level = level_for(opts.run_once);
  CompiledObject out;
  // 1. One unit per distinct kernel: its key is the kernel's structure, the
  // target and the level, never the kernel's name.
  std::vector<size_t> unit_of(kernels.size());
  std::vector<std::string> unit_keys;
  std::vector<size_t> first_kernel;  // of each unit
  std::vector<std::vector<std::string>> names;
  {
    std::unordered_map<std::string, size_t> seen;
    for (size_t i = 0; i < kernels.size(); ++i) {
      if (kernels[i].kind == Kernel::Kind::Collective) continue;  // no code: the runtime runs it
      const bool seeded = seeded_body(kernels[i]);
      std::string key =
          structural_key(kernels[i], /*with_seeds=*/!seeded) + '\0' + t.id() + '\0' + level.id;
      auto [it, inserted] = seen.emplace(std::move(key), unit_keys.size());
      if (inserted) {
        unit_keys.push_back(it->first);
        first_kernel.push_back(i);
        names.emplace_back();
      } else {
        ++out.kernels_shared;
      }
      unit_of[i] = it->second;
      names[it->second].push_back(kernels[i].name);
    }
  }
  // 2. Units this process compiled before (with their IR when it is asked for).
  const bool need_ir = opts.want_llvm_ir || opts.want_assembly;
  const bool bypass = opts.want_unoptimized_ir;  // the unoptimized text needs a fresh emit
  std::vector<std::shared_ptr<const CompiledUnit>> units(unit_keys.size());
  std::vector<size_t> missing;
  for (size_t u = 0; u < units.size(); ++u) {
    if (!bypass) units[u] = UnitCache::process().find(unit_keys[u]);
    if (!bypass && !units[u] && opts.run_once) {  // O3 code of the kernel computes the same bits
      const std::string& k = unit_keys[u];
      units[u] = UnitCache::process().find(k.substr(0, k.size() - 2) + level_for(false).id);
    }
    if (units[u] && need_ir && units[u]->llvm_ir.empty()) units[u] = nullptr;
    if (units[u]) {
      out.kernels_reused += static_cast<int>(names[u].size());
    } else {
      missing.push_back(u);
    }
  }
  // 3. Seeded bodies are emitted first: bodies of equal code text (kernels
  // that differ only in extents their code never names, such as the flat
  // loops of initializers of different sizes) are optimized and compiled
  // once, under the symbol of their text, each keeping its own launch shape.
  std::vector<std::string> unopt(units.size());
  std::vector<size_t> seeded, compile_now;
  for (size_t u : missing)
    (seeded_body(kernels[first_kernel[u]]) ? seeded : compile_now).push_back(u);
  std::vector<EmittedUnit> emitted(units.size());
  std::vector<std::string> text_key(units.size());
  auto emit_seeded = [&](size_t u) {
    emitted[u] = emit_unit(kernels[first_kernel[u]], "fjk_seeded_body", level, opts, nullptr);
    double t0 = thread_seconds();
    std::string text = module_text(*emitted[u].m);
    if (opts.want_unoptimized_ir) unopt[u] = text;
    text_key[u] = "seeded body\0" + hex_digest(text, 32) + '\0' + t.id() + '\0' + level.id;
    emitted[u].u->seconds_emit += thread_seconds() - t0;
  };
  if (seeded.size() > 1) {
    tbb::parallel_for_each(seeded.begin(), seeded.end(), emit_seeded);
  } else if (!seeded.empty()) {
    emit_seeded(seeded[0]);
  }
  std::vector<size_t> same_text_as(units.size(), SIZE_MAX);  // the unit compiled for it
  {
    std::unordered_map<std::string, size_t> first_of;
    for (size_t u : seeded) {
      auto [it, inserted] = first_of.emplace(text_key[u], u);
      if (!inserted) {
        same_text_as[u] = it->second;
        out.kernels_shared += static_cast<int>(names[u].size());
        continue;
      }
      std::shared_ptr<const CompiledUnit> known =
          bypass ? nullptr : UnitCache::process().find(text_key[u]);
      if (known && need_ir && known->llvm_ir.empty()) known = nullptr;
      if (known) {  // this process compiled the same text before
        auto mine = std::make_shared<CompiledUnit>(*known);
        mine->shape = emitted[u].u->shape;
        mine->seconds_emit = emitted[u].u->seconds_emit;
        mine->seconds_optimize = mine->seconds_codegen = 0;
        units[u] = std::move(mine);
        emitted[u].clear();
        out.kernels_reused += static_cast<int>(names[u].size());
        continue;
      }
      const std::string sym = unit_symbol(text_key[u]);
      llvm::Module& m = *emitted[u].m;
      m.getFunction("fjk_seeded_body")->setName(sym);
      m.setModuleIdentifier(sym);
      m.setSourceFileName(sym);
      emitted[u].u->symbol = sym;
      compile_now.push_back(u);
    }
  }
  // 4. The units to compile in parallel: all emitted first (about 1 ms
  // each), then optimized and compiled biggest first by their emitted IR,
  // each thread taking the next one when it is done, so no big unit starts
  // last and runs alone (the +8 MLP's 1368-instruction forward matmul did,
  // from 855 to 1097 ms, under a parallel_for_each that split the sorted list).
  std::vector<size_t> to_emit;
  for (size_t u : compile_now)
    if (!emitted[u].m) to_emit.push_back(u);
  auto emit = [&](size_t u) {
    emitted[u] = emit_unit(kernels[first_kernel[u]], unit_symbol(unit_keys[u]), level, opts,
                           opts.want_unoptimized_ir ? &unopt[u] : nullptr);
  };
  if (to_emit.size() > 1) {
    tbb::parallel_for_each(to_emit.begin(), to_emit.end(), emit);
  } else if (!to_emit.empty()) {
    emit(to_emit[0]);
  }
  std::stable_sort(compile_now.begin(), compile_now.end(), [&](size_t a, size_t b) {
    return emitted[a].u->ir_emitted > emitted[b].u->ir_emitted;
  });
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < compile_now.size();) {
      try {
        units[compile_now[i]] = finish_unit(emitted[compile_now[i]], level, opts);
      } catch (...) {
        next = compile_now.size();  // the other threads stop after their current unit
        throw;
      }
    }
  };
  out.threads = std::max(1, std::min<int>(static_cast<int>(compile_now.size()),
                                          tbb::this_task_arena::max_concurrency()));
  if (out.threads > 1) {
    tbb::parallel_for(0, out.threads, [&](int) { worker(); }, tbb::simple_partitioner());
  } else {
    worker();
  }
  out.kernels_compiled = static_cast<int>(compile_now.size());
  for (size_t u : seeded) {
    if (same_text_as[u] == SIZE_MAX) continue;
    const CompiledUnit& code = *units[same_text_as[u]];
    auto mine = std::make_shared<CompiledUnit>(code);
    mine->shape = emitted[u].u->shape;
    mine->seconds_emit = emitted[u].u->seconds_emit;
    mine->seconds_optimize = mine->seconds_codegen = 0;
    mine->assembly.clear();
    units[u] = std::move(mine);
    emitted[u].clear();
  }
  for (size_t u : missing) {
    const bool compiled = std::find(compile_now.begin(), compile_now.end(), u) != compile_now.end();
    out.seconds_emit += units[u]->seconds_emit;
    if (compiled) {
      char line[200];
      std::snprintf(line, sizeof line,
                    ": %s emit %.1f, optimize %.1f, codegen %.1f ms, %zu bytes, %zu IR "
                    "instructions (%zu optimized)\n",
                    level.id, 1e3 * units[u]->seconds_emit, 1e3 * units[u]->seconds_optimize,
                    1e3 * units[u]->seconds_codegen, units[u]->object.size(), units[u]->ir_emitted,
                    units[u]->ir_optimized);
      out.kernel_times +=
          "  " + kernels[first_kernel[u]].name +
          (names[u].size() > 1 ? " (+" + std::to_string(names[u].size() - 1) + ")" : "") + line;
      out.seconds_optimize += units[u]->seconds_optimize;
      out.seconds_codegen += units[u]->seconds_codegen;
    }
    std::shared_ptr<const CompiledUnit> keep = units[u];
    if (!units[u]->assembly.empty()) {  // the cache keeps code and IR, not one call's assembly
      auto kept = std::make_shared<CompiledUnit>(*units[u]);
      kept->assembly.clear();
      keep = std::move(kept);
    }
    UnitCache::process().put(unit_keys[u], keep);
    if (compiled && !text_key[u].empty()) UnitCache::process().put(text_key[u], keep);
  }
  // 5. A seeded unit's kernels run through thunks passing their own seeds.
  std::vector<std::string> entry(kernels.size());
  std::vector<SeedThunk> thunks;
  {
    std::set<std::string> made;
    for (size_t i = 0; i < kernels.size(); ++i) {
      if (kernels[i].kind == Kernel::Kind::Collective) continue;
      const CompiledUnit& u = *units[unit_of[i]];
      entry[i] = u.symbol;
      if (!seeded_body(kernels[i])) continue;
      SeedThunk th;
      th.body = u.symbol;
      std::string bytes;
      for (int r : random_nodes(kernels[i])) {
        th.seeds.push_back(kernels[i].nodes[r].seed);
        bytes += std::to_string(kernels[i].nodes[r].seed) + ",";
      }
      th.name = u.symbol + "_s" + hex_digest(bytes, 8);
      entry[i] = th.name;
      if (made.insert(th.name).second) thunks.push_back(std::move(th));
    }
  }
  std::shared_ptr<const CompiledUnit> thunk_unit;
  if (!thunks.empty()) {
    std::string key = "seed thunks";
    for (const SeedThunk& th : thunks) key += '\0' + th.name;
    key += '\0' + t.id();
    thunk_unit = bypass ? nullptr : UnitCache::process().find(key);
    if (thunk_unit && need_ir && thunk_unit->llvm_ir.empty()) thunk_unit = nullptr;
    if (!thunk_unit) {
      auto made = compile_thunks(thunks, opts);
      out.seconds_emit += made->seconds_emit;
      out.seconds_codegen += made->seconds_codegen;
      thunk_unit = made;
      if (made->assembly.empty()) {
        UnitCache::process().put(key, made);
      } else {
        auto kept = std::make_shared<CompiledUnit>(*made);
        kept->assembly.clear();
        UnitCache::process().put(key, std::move(kept));
      }
    }
  }
  // 6. One container: every unit's object and every kernel name's symbol.
  std::vector<const std::vector<char>*> objects;
  std::vector<std::pair<std::string, std::string>> aliases;
  // (Units of equal code text share one object: the first of them.)
  std::map<std::string, std::string> lists;  // symbol -> its kernels' names
  for (size_t u = 0; u < units.size(); ++u)
    for (const std::string& n : names[u]) {
      std::string& list = lists[units[u]->symbol];
      list += (list.empty() ? "" : ", ") + n;
    }
  std::set<std::string> placed;
  for (size_t u = 0; u < units.size(); ++u) {
    if (opts.want_unoptimized_ir && !unopt[u].empty()) out.unoptimized_ir += unopt[u];
    if (!placed.insert(units[u]->symbol).second) continue;
    objects.push_back(&units[u]->object);
    if (need_ir)
      out.llvm_ir += "; flowjit kernels " + lists[units[u]->symbol] + ": " + units[u]->symbol +
                     "\n" + units[u]->llvm_ir;
    if (opts.want_assembly)
      out.assembly +=
          units[u]->assembly.empty() ? assembly_from_ir(units[u]->llvm_ir) : units[u]->assembly;
  }
  if (thunk_unit) {
    objects.push_back(&thunk_unit->object);
    if (need_ir) out.llvm_ir += "; flowjit seed thunks\n" + thunk_unit->llvm_ir;
    if (opts.want_assembly)
      out.assembly += thunk_unit->assembly.empty() ? assembly_from_ir(thunk_unit->llvm_ir)
                                                   : thunk_unit->assembly;
  }
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (kernels[i].kind == Kernel::Kind::Collective) continue;
    FJ_CHECK(launches[i].symbol == kernels[i].name, "launch record ", i, " is ", launches[i].symbol,
             " but the kernel is ", kernels[i].name);
    const CompiledUnit& u = *units[unit_of[i]];
    aliases.emplace_back(kernels[i].name, entry[i]);
    launches[i].geometry = u.shape;
  }
  out.object = pack_objects(objects, aliases);
  out.seconds_wall = seconds_since(t_start);
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
  // compile() keeps one module per kernel: the text is their concatenation.
  std::vector<std::string> modules;
  std::vector<size_t> starts;
  const std::string mark = "; ModuleID = ";
  for (size_t p = llvm_ir.find(mark); p != std::string::npos; p = llvm_ir.find(mark, p + 1))
    if (p == 0 || llvm_ir[p - 1] == '\n') starts.push_back(p);
  if (starts.empty()) starts.push_back(0);
  for (size_t i = 0; i < starts.size(); ++i) {
    size_t end = i + 1 < starts.size() ? starts[i + 1] : llvm_ir.size();
    modules.push_back(llvm_ir.substr(starts[i], end - starts[i]));
  }
  auto tm = make_target_machine(host_target());
  std::string out;
  for (const std::string& text : modules) {
    llvm::LLVMContext ctx;
    llvm::SMDiagnostic diag;
    auto buf = llvm::MemoryBuffer::getMemBuffer(text, "cached.ll", false);
    std::unique_ptr<llvm::Module> m = llvm::parseIR(buf->getMemBufferRef(), diag, ctx);
    if (!m)
      throw_user(ErrorKind::Value, "cannot parse the cached LLVM IR: ", diag.getMessage().str());
    // parseIR does not verify: IR that parses but is malformed (read from a
    // cache entry someone else may have edited) must not reach the code generator,
    // which asserts or crashes on it.
    std::string verify_err;
    llvm::raw_string_ostream vos(verify_err);
    if (llvm::verifyModule(*m, &vos))
      throw_user(ErrorKind::Value, "the cached LLVM IR is not valid: ", vos.str());
    m->setDataLayout(tm->createDataLayout());
    out += emit_file(*m, *tm, llvm::CodeGenFileType::AssemblyFile);
  }
  return out;
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

// The float16 conversions LLVM calls where the CPU has no instruction for
// them (F16C converts float <-> half; nothing converts double -> half before
// AVX512-FP16). libgcc has them since GCC 12, but it is loaded privately
// (RTLD_LOCAL) behind this module, so kernels are linked to these copies,
// which follow the same ABI: a half travels as _Float16 in an SSE register.
_Float16 bits_to_f16(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return h;
}
uint16_t f16_to_bits(_Float16 h) {
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
float extend_hf_sf(_Float16 h) { return ir::half_to_float(f16_to_bits(h), ir::DType::Float16); }
double extend_hf_df(_Float16 h) { return extend_hf_sf(h); }
_Float16 trunc_sf_hf(float v) { return bits_to_f16(ir::double_to_float16(v)); }
_Float16 trunc_df_hf(double v) { return bits_to_f16(ir::double_to_float16(v)); }

llvm::Error define_half_helpers(llvm::orc::JITDylib& jd, llvm::orc::ExecutionSession& es) {
  llvm::orc::SymbolMap m;
  auto def = [&](const char* name, auto* fn) {
    m[es.intern(name)] = {llvm::orc::ExecutorAddr::fromPtr(fn),
                          llvm::JITSymbolFlags::Exported | llvm::JITSymbolFlags::Callable};
  };
  def("__extendhfsf2", &extend_hf_sf);
  def("__extendhfdf2", &extend_hf_df);
  def("__truncsfhf2", &trunc_sf_hf);
  def("__truncdfhf2", &trunc_df_hf);
  return jd.define(llvm::orc::absoluteSymbols(std::move(m)));
}

}  // namespace

CodeParts unpack_code(const std::vector<char>& object) {
  CodeParts out;
  if (!is_container(object)) {
    out.objects.push_back(object);
    return out;
  }
  UnpackedObjects parts = unpack_objects(object);
  for (auto& [p, n] : parts.objects) out.objects.emplace_back(p, p + n);
  out.aliases.assign(parts.aliases.begin(), parts.aliases.end());
  return out;
}

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
  if (auto e = define_half_helpers(jd, es)) fail(std::move(e));
  UnpackedObjects parts;
  try {
    if (is_container(object)) {
      parts = unpack_objects(object);
    } else {
      parts.objects.emplace_back(object.data(), object.size());  // one plain ELF object
    }
  } catch (const UserError& e) {
    llvm::consumeError(es.removeJITDylib(jd));
    throw;
  }
  for (size_t i = 0; i < parts.objects.size(); ++i) {
    auto buf = llvm::MemoryBuffer::getMemBufferCopy(
        llvm::StringRef(parts.objects[i].first, parts.objects[i].second),
        "flowjit-kernels-" + std::to_string(i) + ".o");
    if (auto e = j.lljit().addObjectFile(jd, std::move(buf))) fail(std::move(e));
  }
  std::vector<void*> addrs;
  for (const std::string& name : symbols) {
    auto alias = parts.aliases.find(name);
    const std::string& s = alias == parts.aliases.end() ? name : alias->second;
    auto a = j.lljit().lookup(jd, s);
    if (!a) fail(a.takeError());
    addrs.push_back(a->toPtr<void*>());
  }
  return std::make_shared<OrcCode>(&jd, std::move(addrs));
}

}  // namespace flowjit::codegen::cpu
