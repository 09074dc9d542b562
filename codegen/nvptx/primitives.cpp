// NVPTX building blocks: kernel declaration, special registers, barriers,
// warp shuffles, loops and index arithmetic.
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "codegen/nvptx/nvptx_codegen.h"
#include "ir/error.h"

namespace flowjit::codegen::nvptx {

using llvm::Value;

llvm::Function* declare_kernel(llvm::Module& m, const Kernel& k, int max_threads) {
  llvm::LLVMContext& c = m.getContext();
  auto* gptr = llvm::PointerType::get(c, kGlobalAS);
  std::vector<llvm::Type*> params(k.args.size(), gptr);
  auto* fty = llvm::FunctionType::get(llvm::Type::getVoidTy(c), params, false);
  auto* f = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, k.name, m);
  f->setCallingConv(llvm::CallingConv::PTX_Kernel);
  f->addFnAttr(llvm::Attribute::NoUnwind);
  for (size_t i = 0; i < k.args.size(); ++i) {
    f->getArg(static_cast<unsigned>(i))->setName("arg" + std::to_string(i));
    f->addParamAttr(static_cast<unsigned>(i),
                    llvm::Attribute::getWithAlignment(c, llvm::Align(16)));
    if (!k.args[i].written) f->addParamAttr(static_cast<unsigned>(i), llvm::Attribute::ReadOnly);
  }
  auto* i32 = llvm::Type::getInt32Ty(c);
  llvm::Metadata* md[] = {llvm::ValueAsMetadata::get(f), llvm::MDString::get(c, "kernel"),
                          llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(i32, 1)),
                          llvm::MDString::get(c, "maxntidx"),
                          llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(i32, max_threads))};
  m.getOrInsertNamedMetadata("nvvm.annotations")->addOperand(llvm::MDNode::get(c, md));
  return f;
}

llvm::GlobalVariable* shared_array(llvm::Module& m, const std::string& name, llvm::Type* elem,
                                   int64_t count) {
  auto* at = llvm::ArrayType::get(elem, static_cast<uint64_t>(std::max<int64_t>(count, 1)));
  auto* g = new llvm::GlobalVariable(m, at, false, llvm::GlobalValue::InternalLinkage,
                                     llvm::UndefValue::get(at), name, nullptr,
                                     llvm::GlobalValue::NotThreadLocal, kSharedAS);
  g->setAlignment(llvm::Align(16));
  return g;
}

namespace {
Value* sreg(llvm::IRBuilderBase& b, llvm::Intrinsic::ID id) {
  return b.CreateIntrinsic(b.getInt32Ty(), id, {});
}
}  // namespace

Value* thread_idx(llvm::IRBuilderBase& b) {
  return sreg(b, llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x);
}
Value* block_idx(llvm::IRBuilderBase& b) {
  return sreg(b, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x);
}
Value* grid_dim(llvm::IRBuilderBase& b) {
  return sreg(b, llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x);
}

void barrier(llvm::IRBuilderBase& b) { b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {}); }

namespace {
Value* shfl32(llvm::IRBuilderBase& b, Value* v, int lane_mask) {
  bool f = v->getType()->isFloatTy();
  auto id = f ? llvm::Intrinsic::nvvm_shfl_sync_bfly_f32 : llvm::Intrinsic::nvvm_shfl_sync_bfly_i32;
  return b.CreateIntrinsic(v->getType(), id,
                           {b.getInt32(0xffffffffu), v, b.getInt32(lane_mask), b.getInt32(0x1f)});
}
}  // namespace

Value* shuffle_xor(llvm::IRBuilderBase& b, Value* v, int lane_mask) {
  llvm::Type* t = v->getType();
  if (t->isFloatTy() || t->isIntegerTy(32)) return shfl32(b, v, lane_mask);
  if (t->isIntegerTy() && t->getIntegerBitWidth() < 32) {
    Value* w = shfl32(b, b.CreateZExt(v, b.getInt32Ty()), lane_mask);
    return b.CreateTrunc(w, t);
  }
  FJ_CHECK(t->isDoubleTy() || t->isIntegerTy(64), "shuffle of an unsupported type");
  Value* bits = t->isDoubleTy() ? b.CreateBitCast(v, b.getInt64Ty()) : v;
  Value* lo = shfl32(b, b.CreateTrunc(bits, b.getInt32Ty()), lane_mask);
  Value* hi = shfl32(b, b.CreateTrunc(b.CreateLShr(bits, 32), b.getInt32Ty()), lane_mask);
  Value* r = b.CreateOr(b.CreateZExt(lo, b.getInt64Ty()),
                        b.CreateShl(b.CreateZExt(hi, b.getInt64Ty()), 32));
  return t->isDoubleTy() ? b.CreateBitCast(r, t) : r;
}

std::vector<Value*> delinearize(llvm::IRBuilderBase& b, Value* linear,
                                const std::vector<int64_t>& extents) {
  std::vector<Value*> out(extents.size(), nullptr);
  if (extents.empty()) return out;
  int64_t total = 1;
  for (int64_t e : extents) total *= std::max<int64_t>(e, 1);
  bool narrow = total < (int64_t{1} << 31);
  llvm::Type* it = narrow ? b.getInt32Ty() : b.getInt64Ty();
  Value* rest = b.CreateZExtOrTrunc(linear, it);
  for (size_t d = extents.size(); d-- > 0;) {
    Value* v;
    if (d == 0) {
      v = rest;
    } else {
      Value* e = llvm::ConstantInt::get(it, static_cast<uint64_t>(extents[d]));
      v = b.CreateURem(rest, e);
      rest = b.CreateUDiv(rest, e);
    }
    out[d] = narrow ? b.CreateZExt(v, b.getInt64Ty()) : v;
  }
  return out;
}

llvm::AllocaInst* entry_alloca(llvm::Function* f, llvm::Type* t, const char* name) {
  llvm::BasicBlock& entry = f->getEntryBlock();
  llvm::IRBuilder<> eb(&entry, entry.begin());
  return eb.CreateAlloca(t, nullptr, name);
}

Value* arg_better(llvm::IRBuilderBase& b, OpKind op, DType t, Value* v, Value* i, Value* best,
                  Value* bi) {
  Value* lower = b.CreateICmpSLT(i, bi);
  if (ir::is_float(t)) {
    Value* strictly = op == OpKind::ArgMax ? b.CreateFCmpOGT(v, best) : b.CreateFCmpOLT(v, best);
    Value* vnan = b.CreateFCmpUNO(v, v);
    Value* bnan = b.CreateFCmpUNO(best, best);
    strictly = b.CreateOr(strictly, b.CreateAnd(vnan, b.CreateNot(bnan)));
    Value* tie = b.CreateOr(b.CreateFCmpOEQ(v, best), b.CreateAnd(vnan, bnan));
    return b.CreateOr(strictly, b.CreateAnd(tie, lower));
  }
  bool u = t == DType::UInt8 || t == DType::Bool;
  Value* strictly = op == OpKind::ArgMax
                        ? (u ? b.CreateICmpUGT(v, best) : b.CreateICmpSGT(v, best))
                        : (u ? b.CreateICmpULT(v, best) : b.CreateICmpSLT(v, best));
  return b.CreateOr(strictly, b.CreateAnd(b.CreateICmpEQ(v, best), lower));
}

}  // namespace flowjit::codegen::nvptx
