// Transcendental functions for GPU kernels: calls to libdevice (__nv_expf,
// ...) linked from libdevice.10.bc, or flowjit's own polynomials; random
// numbers from codegen/mathlib, which is plain target-independent IR.
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Linker/Linker.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Transforms/IPO/Internalize.h>

#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "codegen/mathlib.h"
#include "codegen/nvptx/nvptx_codegen.h"
#include "ir/error.h"

namespace flowjit::codegen::nvptx {

using llvm::Value;

namespace {

// Applies a scalar function to each lane of a vector.
Value* per_lane(llvm::IRBuilderBase& b, Value* x, const std::function<Value*(Value*)>& f) {
  auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(x->getType());
  if (!vt) return f(x);
  Value* out = llvm::PoisonValue::get(vt);
  for (unsigned i = 0; i < vt->getNumElements(); ++i)
    out = b.CreateInsertElement(out, f(b.CreateExtractElement(x, uint64_t{i})), uint64_t{i});
  return out;
}

Value* per_lane2(llvm::IRBuilderBase& b, Value* x, Value* y,
                 const std::function<Value*(Value*, Value*)>& f) {
  auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(x->getType());
  if (!vt) return f(x, y);
  Value* out = llvm::PoisonValue::get(vt);
  for (unsigned i = 0; i < vt->getNumElements(); ++i)
    out = b.CreateInsertElement(
        out, f(b.CreateExtractElement(x, uint64_t{i}), b.CreateExtractElement(y, uint64_t{i})),
        uint64_t{i});
  return out;
}

// sigmoid(x) = 1 / (1 + e^-|x|) for x >= 0 and e^-|x| / (1 + e^-|x|) below,
// so that large negative x keeps its relative accuracy.
Value* sigmoid_from_exp(llvm::IRBuilderBase& b, Value* x,
                        const std::function<Value*(Value*)>& exp) {
  Value* ax = b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  Value* t = exp(b.CreateFNeg(ax));
  Value* one = llvm::ConstantFP::get(x->getType(), 1.0);
  Value* r = b.CreateFDiv(one, b.CreateFAdd(one, t));
  Value* neg = b.CreateFCmpOLT(x, llvm::Constant::getNullValue(x->getType()));
  return b.CreateSelect(neg, b.CreateFMul(t, r), r);
}

class RandomFromMathlib : public MathProvider {
 public:
  Value* random(llvm::IRBuilderBase& b, OpKind op, Value* counter, Value* seed,
                llvm::Type* type) override {
    switch (op) {
      case OpKind::RandomUniform:
        return codegen::emit_random_uniform_seed_value(b, counter, seed, type);
      case OpKind::RandomNormal:
        return codegen::emit_random_normal_seed_value(b, counter, seed, type);
      case OpKind::TruncatedNormal:
        return codegen::emit_truncated_normal_seed_value(b, counter, seed, type);
      default:
        FJ_CHECK(false, "no GPU random for ", ir::op_name(op));
    }
  }
};

class LibdeviceMath : public RandomFromMathlib {
 public:
  explicit LibdeviceMath(llvm::Module& m) : m_(m) {}

  Value* unary(llvm::IRBuilderBase& b, OpKind op, Value* x) override {
    return per_lane(b, x, [&](Value* s) { return scalar_unary(b, op, s); });
  }
  Value* pow(llvm::IRBuilderBase& b, Value* x, Value* y) override {
    return per_lane2(b, x, y, [&](Value* s, Value* t) { return call(b, "pow", {s, t}); });
  }

 private:
  Value* scalar_unary(llvm::IRBuilderBase& b, OpKind op, Value* x) {
    switch (op) {
      case OpKind::Exp:
        return call(b, "exp", {x});
      case OpKind::Log:
        return call(b, "log", {x});
      case OpKind::Tanh:
        return call(b, "tanh", {x});
      case OpKind::Sin:
        return call(b, "sin", {x});
      case OpKind::Cos:
        return call(b, "cos", {x});
      case OpKind::Erf:
        return call(b, "erf", {x});
      case OpKind::Erfc:
        return call(b, "erfc", {x});
      case OpKind::Sigmoid:
        return sigmoid_from_exp(b, x, [&](Value* v) { return call(b, "exp", {v}); });
      default:
        FJ_CHECK(false, "no libdevice function for ", ir::op_name(op));
    }
  }

  // __nv_<base>f for float, __nv_<base> for double.
  Value* call(llvm::IRBuilderBase& b, const std::string& base, std::vector<Value*> args) {
    llvm::Type* t = args[0]->getType();
    FJ_CHECK(t->isFloatTy() || t->isDoubleTy(), "libdevice ", base, " on a non-float type");
    std::string name = "__nv_" + base + (t->isFloatTy() ? "f" : "");
    std::vector<llvm::Type*> params(args.size(), t);
    auto callee = m_.getOrInsertFunction(name, llvm::FunctionType::get(t, params, false));
    if (auto* f = llvm::dyn_cast<llvm::Function>(callee.getCallee())) {
      f->setDoesNotThrow();
      f->setDoesNotAccessMemory();
    }
    return b.CreateCall(callee, args);
  }

  llvm::Module& m_;
};

class BuiltinMath : public RandomFromMathlib {
 public:
  Value* unary(llvm::IRBuilderBase& b, OpKind op, Value* x) override {
    switch (op) {
      case OpKind::Exp:
        return codegen::emit_exp(b, x);
      case OpKind::Log:
        return codegen::emit_log(b, x);
      case OpKind::Tanh:
        return codegen::emit_tanh(b, x);
      case OpKind::Sigmoid:
        return codegen::emit_sigmoid(b, x);
      case OpKind::Sin:
        return codegen::emit_sin(b, x);
      case OpKind::Cos:
        return codegen::emit_cos(b, x);
      case OpKind::Erf:
        return codegen::emit_erf(b, x);
      case OpKind::Erfc:
        return codegen::emit_erfc(b, x);
      default:
        FJ_CHECK(false, "no builtin GPU math for ", ir::op_name(op));
    }
  }
  Value* pow(llvm::IRBuilderBase& b, Value* x, Value* y) override {
    return codegen::emit_pow(b, x, y);
  }
};

// libdevice.10.bc is read once per path; each compilation parses its own
// module from the bytes (modules belong to one LLVMContext).
const std::string& libdevice_bytes(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::string> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(path);
  if (it != cache.end()) return it->second;
  std::ifstream in(path, std::ios::binary);
  FJ_USER_CHECK(in.good(), ErrorKind::Runtime, "cannot read libdevice at ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return cache[path] = ss.str();
}

}  // namespace

std::unique_ptr<MathProvider> make_math(llvm::Module& m, bool libdevice) {
  if (libdevice) return std::make_unique<LibdeviceMath>(m);
  return std::make_unique<BuiltinMath>();
}

void link_libdevice(llvm::Module& m, const std::string& path) {
  bool needed = false;
  for (llvm::Function& f : m)
    if (f.isDeclaration() && f.getName().starts_with("__nv_") && !f.use_empty()) needed = true;
  if (needed) {
    const std::string& bytes = libdevice_bytes(path);
    auto buf = llvm::MemoryBuffer::getMemBuffer(llvm::StringRef(bytes), "libdevice.10.bc", false);
    auto lib = llvm::parseBitcodeFile(buf->getMemBufferRef(), m.getContext());
    if (!lib) {
      std::string msg = llvm::toString(lib.takeError());
      throw_user(ErrorKind::Runtime, "cannot parse libdevice at ", path, ": ", msg);
    }
    std::unique_ptr<llvm::Module> ld = std::move(*lib);
    ld->setTargetTriple(m.getTargetTriple());
    ld->setDataLayout(m.getDataLayout());
    bool failed = llvm::Linker::linkModules(m, std::move(ld), llvm::Linker::Flags::LinkOnlyNeeded);
    FJ_CHECK(!failed, "linking libdevice from ", path, " failed");
  }
  // Everything but the kernels becomes internal, so that the optimizer inlines
  // what it uses and drops the rest.
  llvm::internalizeModule(m, [](const llvm::GlobalValue& gv) {
    auto* f = llvm::dyn_cast<llvm::Function>(&gv);
    return f && f->getCallingConv() == llvm::CallingConv::PTX_Kernel;
  });
}

}  // namespace flowjit::codegen::nvptx
