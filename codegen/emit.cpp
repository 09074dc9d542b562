// Lowering of kernel bodies (KNode DAGs) to LLVM IR.
#include "codegen/emit.h"

#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>

#include <cmath>
#include <limits>

#include "ir/error.h"

namespace flowjit::codegen {

using llvm::Value;

llvm::BasicBlock* open_hoist_block(llvm::IRBuilderBase& b, const char* name, const char* next) {
  llvm::Function* f = b.GetInsertBlock()->getParent();
  auto* hoist = llvm::BasicBlock::Create(b.getContext(), name, f);
  auto* cont = llvm::BasicBlock::Create(b.getContext(), next, f);
  b.CreateBr(hoist);
  b.SetInsertPoint(hoist);
  b.CreateBr(cont);
  b.SetInsertPoint(cont);
  return hoist;
}

void emit_for(llvm::IRBuilderBase& b, Value* lo, Value* hi, Value* step,
              const std::function<void(Value*)>& body, const char* name) {
  llvm::Function* f = b.GetInsertBlock()->getParent();
  llvm::LLVMContext& c = b.getContext();
  llvm::BasicBlock* pre = b.GetInsertBlock();
  auto* header = llvm::BasicBlock::Create(c, std::string(name) + ".head", f);
  auto* bodyb = llvm::BasicBlock::Create(c, std::string(name) + ".body", f);
  auto* exit = llvm::BasicBlock::Create(c, std::string(name) + ".exit", f);
  b.CreateBr(header);
  b.SetInsertPoint(header);
  llvm::PHINode* iv = b.CreatePHI(lo->getType(), 2, name);
  iv->addIncoming(lo, pre);
  b.CreateCondBr(b.CreateICmpSLT(iv, hi), bodyb, exit);
  b.SetInsertPoint(bodyb);
  body(iv);
  Value* next = b.CreateAdd(iv, step, std::string(name) + ".next", true, true);
  iv->addIncoming(next, b.GetInsertBlock());
  b.CreateBr(header);
  b.SetInsertPoint(exit);
}

llvm::Type* reg_type(llvm::LLVMContext& c, DType t) {
  switch (t) {
    case DType::Bool:
      return llvm::Type::getInt1Ty(c);
    case DType::Int8:
    case DType::UInt8:
      return llvm::Type::getInt8Ty(c);
    case DType::Int32:
      return llvm::Type::getInt32Ty(c);
    case DType::Int64:
      return llvm::Type::getInt64Ty(c);
    case DType::Float32:
      return llvm::Type::getFloatTy(c);
    case DType::Float64:
      return llvm::Type::getDoubleTy(c);
    case DType::Float16:
    case DType::BFloat16:
      return llvm::Type::getFloatTy(c);  // computed in float32
  }
  FJ_CHECK(false, "bad dtype");
}

llvm::Type* mem_type(llvm::LLVMContext& c, DType t) {
  switch (t) {
    case DType::Bool:
      return llvm::Type::getInt8Ty(c);
    case DType::Float16:
      return llvm::Type::getHalfTy(c);
    case DType::BFloat16:
      // Kept as its bits: the conversions below are integer arithmetic that
      // vectorizes on every x86-64 level (LLVM's bfloat lowering calls
      // __truncsfbf2 per element where AVX512-BF16 is missing).
      return llvm::Type::getInt16Ty(c);
    default:
      return reg_type(c, t);
  }
}

Value* from_mem(llvm::IRBuilderBase& b, Value* v, DType t) {
  llvm::Type* vt = v->getType();
  int width = lanes_of(vt);
  auto wide = [&](llvm::Type* s) { return with_width(s, width); };
  switch (t) {
    case DType::Bool:
      return b.CreateICmpNE(v, llvm::Constant::getNullValue(vt));
    case DType::Float16:
      return b.CreateFPExt(v, wide(b.getFloatTy()));
    case DType::BFloat16: {
      // bfloat16 is the high half of a float32.
      Value* w = b.CreateShl(b.CreateZExt(v, wide(b.getInt32Ty())), 16);
      return b.CreateBitCast(w, wide(b.getFloatTy()));
    }
    default:
      return v;
  }
}

Value* to_mem(llvm::IRBuilderBase& b, Value* v, DType t) {
  llvm::Type* vt = v->getType();
  int width = lanes_of(vt);
  auto wide = [&](llvm::Type* s) { return with_width(s, width); };
  auto k32 = [&](uint32_t c) { return llvm::ConstantInt::get(wide(b.getInt32Ty()), c); };
  switch (t) {
    case DType::Bool:
      return b.CreateZExt(v, wide(b.getInt8Ty()));
    case DType::Float16:
      return b.CreateFPTrunc(v, wide(b.getHalfTy()));
    case DType::BFloat16: {
      // Round to nearest even on the float32 bits; a NaN stays a (quiet) NaN
      // instead of rounding into infinity.
      Value* u = b.CreateBitCast(v, wide(b.getInt32Ty()));
      Value* odd = b.CreateAnd(b.CreateLShr(u, 16), k32(1));
      Value* r = b.CreateLShr(b.CreateAdd(u, b.CreateAdd(odd, k32(0x7fff))), 16);
      Value* nan = b.CreateOr(b.CreateLShr(u, 16), k32(0x40));
      r = b.CreateSelect(b.CreateFCmpUNO(v, v), nan, r);
      return b.CreateTrunc(r, wide(b.getInt16Ty()));
    }
    default:
      return v;
  }
}

llvm::Type* with_width(llvm::Type* scalar, int width) {
  return width == 1 ? scalar : llvm::FixedVectorType::get(scalar, width);
}

int lanes_of(llvm::Type* t) {
  return t->isVectorTy() ? static_cast<int>(llvm::cast<llvm::FixedVectorType>(t)->getNumElements())
                         : 1;
}

// ---------------------------------------------------------------- reductions

namespace {

Value* typed_constant(llvm::Type* t, DType dt, double v) {
  if (ir::is_float(dt)) return llvm::ConstantFP::get(t, v);
  return llvm::ConstantInt::get(t, static_cast<uint64_t>(static_cast<int64_t>(v)), true);
}

Value* int_extreme(llvm::Type* t, DType dt, bool max) {
  unsigned bits = t->getScalarSizeInBits();
  llvm::APInt v =
      dt == DType::UInt8 || dt == DType::Bool
          ? (max ? llvm::APInt::getMaxValue(bits) : llvm::APInt::getMinValue(bits))
          : (max ? llvm::APInt::getSignedMaxValue(bits) : llvm::APInt::getSignedMinValue(bits));
  return llvm::ConstantInt::get(t, v);
}

bool is_unsigned(DType t) { return t == DType::UInt8 || t == DType::Bool; }

}  // namespace

Value* reduce_identity(llvm::IRBuilderBase& b, OpKind op, DType t, int width) {
  llvm::Type* ty = with_width(reg_type(b.getContext(), t), width);
  bool f = ir::is_float(t);
  switch (op) {
    case OpKind::ReduceSum:
      return typed_constant(ty, t, 0);
    case OpKind::ReduceProd:
      return typed_constant(ty, t, 1);
    case OpKind::ReduceMax:
    case OpKind::ArgMax:
      return f ? llvm::ConstantFP::getInfinity(ty, true) : int_extreme(ty, t, false);
    case OpKind::ReduceMin:
    case OpKind::ArgMin:
      return f ? llvm::ConstantFP::getInfinity(ty, false) : int_extreme(ty, t, true);
    default:
      FJ_CHECK(false, "not a reduction: ", ir::op_name(op));
  }
}

Value* reduce_combine(llvm::IRBuilderBase& b, OpKind op, DType t, Value* acc, Value* v) {
  bool f = ir::is_float(t);
  switch (op) {
    case OpKind::ReduceSum:
      return f ? b.CreateFAdd(acc, v) : b.CreateAdd(acc, v);
    case OpKind::ReduceProd:
      return f ? b.CreateFMul(acc, v) : b.CreateMul(acc, v);
    case OpKind::ReduceMax:
      if (f) return b.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, acc, v);
      return b.CreateBinaryIntrinsic(is_unsigned(t) ? llvm::Intrinsic::umax : llvm::Intrinsic::smax,
                                     acc, v);
    case OpKind::ReduceMin:
      if (f) return b.CreateBinaryIntrinsic(llvm::Intrinsic::minimum, acc, v);
      return b.CreateBinaryIntrinsic(is_unsigned(t) ? llvm::Intrinsic::umin : llvm::Intrinsic::smin,
                                     acc, v);
    default:
      FJ_CHECK(false, "no combine for ", ir::op_name(op));
  }
}

Value* reduce_horizontal(llvm::IRBuilderBase& b, OpKind op, DType t, Value* vec) {
  if (!vec->getType()->isVectorTy()) return vec;
  bool f = ir::is_float(t);
  // Sums of floats reassociate across lanes: the vector accumulator already
  // changed the order of additions, so the lane order is not observable.
  llvm::FastMathFlags fmf;
  fmf.setAllowReassoc();
  llvm::IRBuilderBase::FastMathFlagGuard guard(b);
  b.setFastMathFlags(fmf);
  switch (op) {
    case OpKind::ReduceSum:
      return f ? b.CreateFAddReduce(llvm::ConstantFP::get(vec->getType()->getScalarType(), -0.0),
                                    vec)
               : b.CreateAddReduce(vec);
    case OpKind::ReduceProd:
      return f ? b.CreateFMulReduce(llvm::ConstantFP::get(vec->getType()->getScalarType(), 1.0),
                                    vec)
               : b.CreateMulReduce(vec);
    case OpKind::ReduceMax:
      return f ? b.CreateFPMaximumReduce(vec)
               : (is_unsigned(t) ? b.CreateIntMaxReduce(vec, false)
                                 : b.CreateIntMaxReduce(vec, true));
    case OpKind::ReduceMin:
      return f ? b.CreateFPMinimumReduce(vec)
               : (is_unsigned(t) ? b.CreateIntMinReduce(vec, false)
                                 : b.CreateIntMinReduce(vec, true));
    default:
      FJ_CHECK(false, "no horizontal reduction for ", ir::op_name(op));
  }
}

// ---------------------------------------------------------------- emitter

ExprEmitter::ExprEmitter(const Kernel& k, llvm::IRBuilderBase& b, MathProvider& math,
                         std::vector<Value*> arg_ptrs)
    : k_(k), b_(b), math_(math), args_(std::move(arg_ptrs)) {
  idx.assign(k.domain.size(), nullptr);
  scopes_.emplace_back();
}

void ExprEmitter::push_scope() { scopes_.emplace_back(); }
void ExprEmitter::pop_scope() {
  FJ_CHECK(scopes_.size() > 1, "scope underflow");
  scopes_.pop_back();
}

void ExprEmitter::set_value(int node, Value* v) {
  int w = lanes_of(v->getType());
  scopes_.back()[{node, w}] = v;
}

void ExprEmitter::set_kept_point(llvm::BasicBlock* bb, int kept_width) {
  kept_bb_ = bb;
  kept_width_ = kept_width;
  kept_scope_ = static_cast<int>(scopes_.size()) - 1;
}

void ExprEmitter::clear_kept_point() { kept_bb_ = nullptr; }

void ExprEmitter::set_invariant_point(llvm::BasicBlock* bb) { invariant_bb_ = bb; }

Value* ExprEmitter::lookup(int node, int w) {
  int top = in_invariant_eval_ ? 0
            : in_kept_eval_    ? kept_scope_
                               : static_cast<int>(scopes_.size()) - 1;
  for (int s = top; s >= 0; --s) {
    auto it = scopes_[s].find({node, w});
    if (it != scopes_[s].end()) return it->second;
  }
  return nullptr;
}

Value* ExprEmitter::splat(Value* scalar, int w) {
  if (w == 1) return scalar;
  return b_.CreateVectorSplat(w, scalar);
}

namespace {
struct DepthGuard {
  int& depth;
  explicit DepthGuard(int& d) : depth(d) { ++depth; }
  ~DepthGuard() { --depth; }
};
}  // namespace

Value* ExprEmitter::eval(int node) {
  if (Value* v = lookup(node, width)) return v;
  if (eval_depth_ == 0) eval_operands_first(node);
  DepthGuard guard{eval_depth_};
  return eval_memoized(node);
}

// The operands of `node` that are not yet evaluated at this width, in the
// order the recursion would evaluate them (depth first, operands left to
// right, each after its own operands), each evaluated when its operands are:
// the same IR as the recursion, without its depth.
void ExprEmitter::eval_operands_first(int node) {
  auto operands_of = [&](int i) -> const std::vector<int>* {
    const KNode& n = k_.nodes[i];
    return n.kind == KOp::Compute || n.kind == KOp::Random ? &n.operands : nullptr;
  };
  std::vector<std::pair<int, size_t>> stack{{node, 0}};
  while (!stack.empty()) {
    auto& [i, next] = stack.back();
    const std::vector<int>* ops = operands_of(i);
    if (ops && next < ops->size()) {
      int o = (*ops)[next++];
      if (!lookup(o, width)) stack.push_back({o, 0});
      continue;
    }
    int done = i;
    stack.pop_back();
    if (done != node && !lookup(done, width)) {
      DepthGuard guard{eval_depth_};
      eval_memoized(done);
    }
  }
}

// `node` (invariant) at the invariant point, width 1, memoized in the
// outermost scope (which every loop's scopes see).
Value* ExprEmitter::eval_invariant(int node) {
  auto ip = b_.saveIP();
  int saved_width = width, saved_vec = vec_dim;
  Value* saved_mask = mask;
  bool saved_kept = in_kept_eval_, saved_inv = in_invariant_eval_;
  b_.SetInsertPoint(invariant_bb_->getTerminator());
  width = 1;
  vec_dim = -1;
  mask = nullptr;
  in_kept_eval_ = false;
  in_invariant_eval_ = true;
  Value* v = lookup(node, 1);
  if (!v) {
    v = eval_here(node);
    scopes_[0][{node, 1}] = v;
  }
  in_invariant_eval_ = saved_inv;
  in_kept_eval_ = saved_kept;
  width = saved_width;
  vec_dim = saved_vec;
  mask = saved_mask;
  b_.restoreIP(ip);
  return v;
}

Value* ExprEmitter::eval_memoized(int node) {
  if (Value* v = lookup(node, width)) return v;
  const KNode& n = k_.nodes[node];
  if (invariant_bb_ && n.invariant) {
    Value* v = eval_invariant(node);
    if (in_invariant_eval_) return v;
    if (width != 1) v = splat(v, width);
    int top = in_kept_eval_ ? kept_scope_ : static_cast<int>(scopes_.size()) - 1;
    scopes_[top][{node, width}] = v;
    return v;
  }
  if (kept_bb_ && n.kept_space && !in_kept_eval_ && k_.has_reduction()) {
    // Hoist to the kept point, at the kept width; splat here if narrower.
    Value* kv = nullptr;
    {
      auto ip = b_.saveIP();
      int saved_width = width, saved_vec = vec_dim;
      Value* saved_mask = mask;
      b_.SetInsertPoint(kept_bb_->getTerminator());
      width = kept_width_;
      if (kept_width_ == 1) vec_dim = -1;
      mask = nullptr;
      in_kept_eval_ = true;
      kv = lookup(node, width);
      if (!kv) {
        kv = eval_here(node);
        scopes_[kept_scope_][{node, width}] = kv;
      }
      in_kept_eval_ = false;
      width = saved_width;
      vec_dim = saved_vec;
      mask = saved_mask;
      b_.restoreIP(ip);
    }
    if (kept_width_ != width) {
      FJ_CHECK(kept_width_ == 1, "kept width mismatch");
      kv = splat(kv, width);
    }
    scopes_.back()[{node, width}] = kv;
    return kv;
  }
  Value* v = eval_here(node);
  int top = in_kept_eval_ ? kept_scope_ : static_cast<int>(scopes_.size()) - 1;
  scopes_[top][{node, width}] = v;
  return v;
}

void add_status_guard(llvm::Function* f,
                      const std::function<llvm::Value*(llvm::IRBuilderBase&)>& status, int words) {
  llvm::LLVMContext& c = f->getContext();
  llvm::BasicBlock& entry = f->getEntryBlock();
  // The allocas stay in the entry block (mem2reg promotes only those).
  llvm::BasicBlock* body = entry.splitBasicBlock(entry.getFirstNonPHIOrDbgOrAlloca(), "guarded");
  entry.getTerminator()->eraseFromParent();
  auto* skip = llvm::BasicBlock::Create(c, "check_failed", f);
  llvm::IRBuilder<> b(skip);
  b.CreateRetVoid();
  b.SetInsertPoint(&entry);
  llvm::Value* ptr = status(b);
  llvm::Value* word = b.CreateAlignedLoad(b.getInt64Ty(), ptr, llvm::Align(8), "status");
  for (int w = 1; w < words; ++w)  // one status per device: any failed
    word = b.CreateOr(
        word, b.CreateAlignedLoad(b.getInt64Ty(), b.CreateConstGEP1_64(b.getInt64Ty(), ptr, 4 * w),
                                  llvm::Align(8), "status"));
  llvm::MDBuilder md(c);
  b.CreateCondBr(b.CreateICmpNE(word, b.getInt64(0)), skip, body,
                 md.createBranchWeights(1, 1 << 20));
}

// The status report of index checks: an internal always-inline function per
// width and pointer type, so that its cold branch is made by the inliner
// and the caller's blocks (loop structure, kept points) stay as they are.
//   report(status, bad, value, pos, id): if any lane of bad is set, the first
//   such lane's value and position go to status[1], status[2] when
//   status[0] was 0 and now holds id + 1 (compare-exchange).
static llvm::Function* report_function(llvm::Module& m, llvm::Type* ptr_ty, int width) {
  std::string name = "flowjit.report.v" + std::to_string(width) + ".p" +
                     std::to_string(ptr_ty->getPointerAddressSpace());
  if (llvm::Function* f = m.getFunction(name)) return f;
  llvm::LLVMContext& c = m.getContext();
  llvm::Type* i64 = llvm::Type::getInt64Ty(c);
  llvm::Type* bad_ty = with_width(llvm::Type::getInt1Ty(c), width);
  llvm::Type* val_ty = with_width(i64, width);
  auto* fty = llvm::FunctionType::get(llvm::Type::getVoidTy(c),
                                      {ptr_ty, bad_ty, val_ty, val_ty, i64}, false);
  auto* f = llvm::Function::Create(fty, llvm::GlobalValue::InternalLinkage, name, m);
  f->addFnAttr(llvm::Attribute::AlwaysInline);
  f->addFnAttr(llvm::Attribute::NoUnwind);
  auto* entry = llvm::BasicBlock::Create(c, "entry", f);
  auto* cold = llvm::BasicBlock::Create(c, "bad", f);
  auto* write = llvm::BasicBlock::Create(c, "first", f);
  auto* done = llvm::BasicBlock::Create(c, "done", f);
  llvm::IRBuilder<> b(entry);
  llvm::Value *status = f->getArg(0), *bad = f->getArg(1), *value = f->getArg(2),
              *pos = f->getArg(3), *id = f->getArg(4);
  Value* any = width == 1 ? bad : b.CreateOrReduce(bad);
  llvm::MDBuilder md(c);
  b.CreateCondBr(any, cold, done, md.createBranchWeights(1, 1 << 20));
  b.SetInsertPoint(cold);
  Value* v = value;
  Value* p = pos;
  if (width > 1) {
    Value* bits = b.CreateBitCast(bad, b.getIntNTy(width));
    Value* lane = b.CreateBinaryIntrinsic(llvm::Intrinsic::cttz, bits, b.getFalse());
    v = b.CreateExtractElement(value, lane);
    p = b.CreateExtractElement(pos, lane);
  }
  Value* cx = b.CreateAtomicCmpXchg(status, b.getInt64(0), b.CreateAdd(id, b.getInt64(1)),
                                    llvm::MaybeAlign(8), llvm::AtomicOrdering::Monotonic,
                                    llvm::AtomicOrdering::Monotonic);
  b.CreateCondBr(b.CreateExtractValue(cx, 1), write, done);
  b.SetInsertPoint(write);
  b.CreateAlignedStore(v, b.CreateConstGEP1_64(i64, status, 1), llvm::Align(8));
  b.CreateAlignedStore(p, b.CreateConstGEP1_64(i64, status, 2), llvm::Align(8));
  b.CreateBr(done);
  b.SetInsertPoint(done);
  b.CreateRetVoid();
  return f;
}

void ExprEmitter::check_range(Value* value, int64_t limit, Value* pos, int check) {
  // Unsigned: negative values are out of range too.
  report(b_.CreateICmpUGE(value, splat(b_.getInt64(limit), width)), value, pos, check);
}

void ExprEmitter::report(Value* bad, Value* value, Value* pos, int check) {
  FJ_CHECK(k_.status_arg >= 0, "kernel ", k_.name, ": a check without a status buffer");
  Value* status = args_.at(k_.status_arg);
  if (mask && width > 1) bad = b_.CreateAnd(bad, mask);
  llvm::Module& m = *b_.GetInsertBlock()->getModule();
  llvm::Function* f = report_function(m, status->getType(), width);
  b_.CreateCall(f, {status, bad, value, pos, b_.getInt64(check)});
}

Value* ExprEmitter::element_offset(const std::vector<int64_t>& strides, int64_t offset) {
  Value* off = b_.getInt64(offset);
  for (size_t d = 0; d < strides.size(); ++d) {
    if (strides[d] == 0 || idx[d] == nullptr) continue;
    Value* term = strides[d] == 1 ? idx[d] : b_.CreateMul(idx[d], b_.getInt64(strides[d]));
    off = b_.CreateAdd(off, term);
  }
  return off;
}

Value* ExprEmitter::lane_offsets(int64_t stride) {
  std::vector<llvm::Constant*> lanes;
  for (int i = 0; i < width; ++i) lanes.push_back(b_.getInt64(static_cast<int64_t>(i) * stride));
  return llvm::ConstantVector::get(lanes);
}

// A load through guarded coordinates (ir/conv.h geometry) and indirect ones
// (gathers: an index value clamped into range): lanes whose
// element does not exist read `pad`. Coordinates out of range are clamped to
// 0, so every address formed is inside the buffer even where it is unused.
Value* ExprEmitter::guarded_load(const Access& a, DType t) {
  llvm::LLVMContext& c = b_.getContext();
  llvm::Type* mt = mem_type(c, t);
  auto align = llvm::Align(mt->getPrimitiveSizeInBits() / 8);
  auto k64 = [&](int64_t v) { return splat(b_.getInt64(v), width); };
  Value* off = index_value(a.strides, a.offset);
  Value* valid = nullptr;
  for (const Indirect& ind : a.indirect) {
    const KNode& in = k_.nodes.at(ind.node);
    Value* iv = cast(eval(ind.node), in.dtype, DType::Int64);
    if (ind.check >= 0)
      check_range(iv, ind.limit, index_value(ind.pos_strides, ind.pos_offset), ind.check);
    iv = b_.CreateSelect(b_.CreateICmpSLT(iv, k64(0)), k64(0), iv);
    iv = b_.CreateSelect(b_.CreateICmpSGT(iv, k64(ind.limit - 1)), k64(ind.limit - 1), iv);
    off = b_.CreateAdd(off, b_.CreateMul(iv, k64(ind.stride)));
  }
  for (const Coord& co : a.coords) {
    Value* cv = index_value(co.coef, co.c0);
    Value* ok =
        b_.CreateAnd(b_.CreateICmpSGE(cv, k64(0)), b_.CreateICmpSLT(cv, k64(co.limit * co.div)));
    Value* safe = b_.CreateSelect(ok, cv, k64(0));
    Value* q = safe;
    if (co.div != 1) {
      ok = b_.CreateAnd(ok, b_.CreateICmpEQ(b_.CreateURem(safe, k64(co.div)), k64(0)));
      q = b_.CreateSelect(ok, b_.CreateUDiv(safe, k64(co.div)), k64(0));
    }
    off = b_.CreateAdd(off, b_.CreateMul(q, k64(co.stride)));
    valid = valid ? b_.CreateAnd(valid, ok) : ok;
  }
  Value* pad = ir::is_int(t) ? llvm::ConstantInt::get(reg_type(b_.getContext(), t),
                                                      static_cast<uint64_t>(a.ipad), true)
                             : constant(a.pad, t);
  pad = to_mem(b_, splat(pad, width), t);
  Value* base = args_.at(a.arg);
  Value* v;
  if (width == 1) {
    v = b_.CreateAlignedLoad(mt, b_.CreateGEP(mt, base, off), align);
    if (valid) v = b_.CreateSelect(valid, v, pad);
  } else {
    Value* all = llvm::Constant::getAllOnesValue(with_width(b_.getInt1Ty(), width));
    Value* m = valid ? (mask ? b_.CreateAnd(valid, mask) : valid) : (mask ? mask : all);
    v = b_.CreateMaskedGather(with_width(mt, width), b_.CreateGEP(mt, base, off), align, m, pad);
  }
  return from_mem(b_, v, t);
}

Value* ExprEmitter::load(const Access& a, DType t) {
  if (!a.coords.empty() || !a.indirect.empty()) return guarded_load(a, t);
  llvm::LLVMContext& c = b_.getContext();
  llvm::Type* mt = mem_type(c, t);
  Value* base = args_.at(a.arg);
  Value* off = element_offset(a.strides, a.offset);
  int64_t vs = (vec_dim >= 0 && width > 1) ? a.strides[vec_dim] : 0;
  auto align = llvm::Align(mt->getPrimitiveSizeInBits() / 8);
  Value* v;
  if (width == 1 || vs == 0) {
    v = b_.CreateAlignedLoad(mt, b_.CreateGEP(mt, base, off), align);
    return splat(from_mem(b_, v, t), width);
  }
  llvm::Type* vt = with_width(mt, width);
  if (vs == 1) {
    Value* p = b_.CreateGEP(mt, base, off);
    if (mask) {
      v = b_.CreateMaskedLoad(vt, p, align, mask, llvm::Constant::getNullValue(vt));
    } else {
      v = b_.CreateAlignedLoad(vt, p, align);
    }
  } else {
    Value* offs = b_.CreateAdd(splat(off, width), lane_offsets(vs));
    Value* ptrs = b_.CreateGEP(mt, base, offs);
    Value* m = mask ? mask : llvm::Constant::getAllOnesValue(with_width(b_.getInt1Ty(), width));
    v = b_.CreateMaskedGather(vt, ptrs, align, m, llvm::Constant::getNullValue(vt));
  }
  return from_mem(b_, v, t);
}

void ExprEmitter::store(const Store& s, Value* v) {
  llvm::LLVMContext& c = b_.getContext();
  DType t = k_.args.at(s.where.arg).dtype;
  llvm::Type* mt = mem_type(c, t);
  v = to_mem(b_, v, t);
  Value* base = args_.at(s.where.arg);
  Value* off = element_offset(s.where.strides, s.where.offset);
  int64_t vs = (vec_dim >= 0 && width > 1) ? s.where.strides[vec_dim] : 0;
  auto align = llvm::Align(mt->getPrimitiveSizeInBits() / 8);
  if (width == 1) {
    b_.CreateAlignedStore(v, b_.CreateGEP(mt, base, off), align);
    return;
  }
  // vs == 0: the stored value is broadcast along the vector dimension (a
  // (1,) value assigned in a (4, 3) domain), so every lane holds the same
  // element; the scatter below writes them, in lane order, to one address.
  if (vs == 1) {
    Value* p = b_.CreateGEP(mt, base, off);
    if (mask) {
      b_.CreateMaskedStore(v, p, align, mask);
    } else if (s.where.arg == nontemporal_arg) {
      // Streaming store: the line is written without being read first, so a
      // large output costs its bytes once instead of twice (read for
      // ownership + write-back).
      auto* st =
          b_.CreateAlignedStore(v, p, llvm::Align(static_cast<uint64_t>(width) * align.value()));
      st->setMetadata(llvm::LLVMContext::MD_nontemporal,
                      llvm::MDNode::get(c, llvm::ConstantAsMetadata::get(b_.getInt32(1))));
    } else {
      b_.CreateAlignedStore(v, p, align);
    }
    return;
  }
  Value* offs = b_.CreateAdd(splat(off, width), lane_offsets(vs));
  Value* ptrs = b_.CreateGEP(mt, base, offs);
  Value* m = mask ? mask : llvm::Constant::getAllOnesValue(with_width(b_.getInt1Ty(), width));
  b_.CreateMaskedScatter(v, ptrs, align, m);
}

Value* ExprEmitter::index_value(const std::vector<int64_t>& strides, int64_t base) {
  Value* off = element_offset(strides, base);
  if (width == 1) return off;
  int64_t vs = vec_dim >= 0 ? strides[vec_dim] : 0;
  Value* v = splat(off, width);
  if (vs != 0) v = b_.CreateAdd(v, lane_offsets(vs));
  return v;
}

Value* ExprEmitter::constant(double v, DType t) {
  llvm::Type* ty = reg_type(b_.getContext(), t);
  if (t == DType::Bool) return b_.getInt1(v != 0);
  if (ir::is_half(t)) v = ir::round_to_float_dtype(v, t);
  return typed_constant(ty, t, v);
}

Value* ExprEmitter::eval_here(int node) {
  const KNode& n = k_.nodes[node];
  switch (n.kind) {
    case KOp::Load:
      return load(k_.loads.at(n.access), n.dtype);
    case KOp::Const:
      if (ir::is_int(n.dtype))
        return splat(llvm::ConstantInt::get(reg_type(b_.getContext(), n.dtype),
                                            static_cast<uint64_t>(n.ivalue), true),
                     width);
      return splat(constant(n.value, n.dtype), width);
    case KOp::Index:
      return cast(index_value(n.index_strides, 0), DType::Int64, n.dtype);
    case KOp::Random: {
      Value* counter = index_value(n.index_strides, 0);
      if (!n.operands.empty())
        counter = b_.CreateAdd(counter, eval(n.operands[0]));  // random_uniform_at
      llvm::Type* ty = with_width(reg_type(b_.getContext(), n.dtype), width);
      Value* seed = static_cast<size_t>(node) < seeds.size() && seeds[node] != nullptr
                        ? seeds[node]
                        : b_.getInt64(static_cast<uint64_t>(n.seed));
      return math_.random(b_, n.op, counter, seed, ty);
    }
    case KOp::Compute: {
      std::vector<Value*> ops;
      for (int o : n.operands) ops.push_back(eval(o));
      return compute(n, ops);
    }
    case KOp::Reduce:
    case KOp::Acc:
      break;
  }
  FJ_CHECK(false, "kernel ", k_.name, ": node $", node, " (", ir::op_name(n.op),
           ") evaluated before its value was computed");
}

Value* ExprEmitter::cast(Value* v, DType from, DType to) {
  if (from == to) return v;
  // A half value computed in a float32 register (a fused chain or
  // reduction) is rounded to its type before it converts: a cast reads the
  // value the half type holds, as if it had been stored.
  if (ir::is_half(from) && !ir::is_half(to)) v = from_mem(b_, to_mem(b_, v, from), from);
  llvm::Type* tt = with_width(reg_type(b_.getContext(), to), lanes_of(v->getType()));
  if (to == DType::Bool) {
    return ir::is_float(from) ? b_.CreateFCmpUNE(v, llvm::Constant::getNullValue(v->getType()))
                              : b_.CreateICmpNE(v, llvm::Constant::getNullValue(v->getType()));
  }
  if (ir::is_half(to)) {
    // Round to the half type and hold the result in float32. A float64
    // converts to float16 directly (no double rounding); to bfloat16 it goes
    // through float32, as PyTorch and ml_dtypes convert it.
    if (from == DType::Float64 && to == DType::Float16) {
      return from_mem(b_, b_.CreateFPTrunc(v, with_width(b_.getHalfTy(), lanes_of(tt))), to);
    }
    return from_mem(b_, to_mem(b_, cast(v, from, DType::Float32), to), to);
  }
  bool from_f = ir::is_float(from), to_f = ir::is_float(to);
  if (from_f && to_f) return b_.CreateFPCast(v, tt);
  if (from_f) {
    // Saturating conversion: out-of-range values clamp and NaN gives 0, so no
    // input leads to undefined behaviour.
    auto id = is_unsigned(to) ? llvm::Intrinsic::fptoui_sat : llvm::Intrinsic::fptosi_sat;
    return b_.CreateIntrinsic(id, {tt, v->getType()}, {v});
  }
  if (to_f) return is_unsigned(from) ? b_.CreateUIToFP(v, tt) : b_.CreateSIToFP(v, tt);
  return b_.CreateIntCast(v, tt, !is_unsigned(from));
}

Value* ExprEmitter::compute(const KNode& n, const std::vector<Value*>& ops) {
  using llvm::Intrinsic::ID;
  DType in = n.operands.empty() ? n.dtype : k_.nodes[n.operands[0]].dtype;
  if (n.op == OpKind::Where && n.operands.size() == 3) in = k_.nodes[n.operands[1]].dtype;
  bool f = ir::is_float(in);
  bool u = is_unsigned(in);
  Value* x = ops.empty() ? nullptr : ops[0];
  Value* y = ops.size() > 1 ? ops[1] : nullptr;
  auto zero = [&](Value* like) { return llvm::Constant::getNullValue(like->getType()); };
  auto fconst = [&](Value* like, double c) { return llvm::ConstantFP::get(like->getType(), c); };
  auto unary_intr = [&](ID id, Value* a) { return b_.CreateUnaryIntrinsic(id, a); };
  switch (n.op) {
    case OpKind::Identity:
      return x;
    case OpKind::Cast:
      return cast(x, in, n.dtype);
    case OpKind::CheckIndex:
      check_range(cast(x, in, DType::Int64), n.ivalue, index_value(n.index_strides, 0), n.check);
      return x;
    case OpKind::CheckFinite: {
      // NaN (unordered) or +-inf: |x| ueq inf. Reported as the double's bits.
      Value* d = cast(x, in, DType::Float64);
      Value* bad = b_.CreateFCmpUEQ(unary_intr(llvm::Intrinsic::fabs, d),
                                    llvm::ConstantFP::getInfinity(d->getType()));
      report(bad, b_.CreateBitCast(d, with_width(b_.getInt64Ty(), width)),
             index_value(n.index_strides, n.ivalue), n.check);
      return x;
    }
    case OpKind::Neg:
      return f ? b_.CreateFNeg(x) : b_.CreateNeg(x);
    case OpKind::Abs:
      return f ? unary_intr(llvm::Intrinsic::fabs, x)
               : (u ? x : b_.CreateBinaryIntrinsic(llvm::Intrinsic::abs, x, b_.getFalse()));
    case OpKind::Sign: {
      if (f) {
        Value* pos = b_.CreateFCmpOGT(x, zero(x));
        Value* neg = b_.CreateFCmpOLT(x, zero(x));
        return b_.CreateSelect(pos, fconst(x, 1.0), b_.CreateSelect(neg, fconst(x, -1.0), x));
      }
      Value* pos = u ? b_.CreateICmpUGT(x, zero(x)) : b_.CreateICmpSGT(x, zero(x));
      Value* neg = u ? b_.getFalse() : b_.CreateICmpSLT(x, zero(x));
      if (x->getType()->isVectorTy() && u) neg = zero(pos);
      Value* one = llvm::ConstantInt::get(x->getType(), 1);
      Value* mone = llvm::ConstantInt::getSigned(x->getType(), -1);
      return b_.CreateSelect(pos, one, b_.CreateSelect(neg, mone, zero(x)));
    }
    case OpKind::Floor:
      return unary_intr(llvm::Intrinsic::floor, x);
    case OpKind::Ceil:
      return unary_intr(llvm::Intrinsic::ceil, x);
    case OpKind::Round:
      return unary_intr(llvm::Intrinsic::roundeven, x);
    case OpKind::Sqrt:
      return unary_intr(llvm::Intrinsic::sqrt, x);
    case OpKind::Rsqrt:
      return b_.CreateFDiv(fconst(x, 1.0), unary_intr(llvm::Intrinsic::sqrt, x));
    case OpKind::Reciprocal:
      return b_.CreateFDiv(fconst(x, 1.0), x);
    case OpKind::Square:
      return f ? b_.CreateFMul(x, x) : b_.CreateMul(x, x);
    case OpKind::Relu:
      if (f) return b_.CreateSelect(b_.CreateFCmpOLT(x, zero(x)), zero(x), x);
      return u ? x : b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, x, zero(x));
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Tanh:
    case OpKind::Sigmoid:
    case OpKind::Sin:
    case OpKind::Cos:
    case OpKind::Erf:
    case OpKind::Erfc:
      return math_.unary(b_, n.op, x);
    case OpKind::LogicalNot:
      return b_.CreateNot(x);
    case OpKind::Add:
      return f ? b_.CreateFAdd(x, y) : b_.CreateAdd(x, y);
    case OpKind::Sub:
      return f ? b_.CreateFSub(x, y) : b_.CreateSub(x, y);
    case OpKind::Mul:
      return f ? b_.CreateFMul(x, y) : b_.CreateMul(x, y);
    case OpKind::Div: {
      if (f) return b_.CreateFDiv(x, y);
      // Integer division truncates toward zero; division by zero gives 0 and
      // INT_MIN / -1 wraps, so no input traps.
      Value* yz = b_.CreateICmpEQ(y, zero(y));
      if (u) {
        Value* safe = b_.CreateSelect(yz, llvm::ConstantInt::get(y->getType(), 1), y);
        return b_.CreateSelect(yz, zero(x), b_.CreateUDiv(x, safe));
      }
      Value* ym1 = b_.CreateICmpEQ(y, llvm::ConstantInt::getSigned(y->getType(), -1));
      Value* safe =
          b_.CreateSelect(b_.CreateOr(yz, ym1), llvm::ConstantInt::get(y->getType(), 1), y);
      Value* q = b_.CreateSDiv(x, safe);
      return b_.CreateSelect(yz, zero(x), b_.CreateSelect(ym1, b_.CreateNeg(x), q));
    }
    case OpKind::Pow:
      return math_.pow(b_, x, y);
    case OpKind::Maximum:
      if (f) return b_.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, x, y);
      return b_.CreateBinaryIntrinsic(u ? llvm::Intrinsic::umax : llvm::Intrinsic::smax, x, y);
    case OpKind::Minimum:
      if (f) return b_.CreateBinaryIntrinsic(llvm::Intrinsic::minimum, x, y);
      return b_.CreateBinaryIntrinsic(u ? llvm::Intrinsic::umin : llvm::Intrinsic::smin, x, y);
    case OpKind::Equal:
      return f ? b_.CreateFCmpOEQ(x, y) : b_.CreateICmpEQ(x, y);
    case OpKind::NotEqual:
      return f ? b_.CreateFCmpUNE(x, y) : b_.CreateICmpNE(x, y);
    case OpKind::Less:
      return f ? b_.CreateFCmpOLT(x, y) : (u ? b_.CreateICmpULT(x, y) : b_.CreateICmpSLT(x, y));
    case OpKind::LessEqual:
      return f ? b_.CreateFCmpOLE(x, y) : (u ? b_.CreateICmpULE(x, y) : b_.CreateICmpSLE(x, y));
    case OpKind::Greater:
      return f ? b_.CreateFCmpOGT(x, y) : (u ? b_.CreateICmpUGT(x, y) : b_.CreateICmpSGT(x, y));
    case OpKind::GreaterEqual:
      return f ? b_.CreateFCmpOGE(x, y) : (u ? b_.CreateICmpUGE(x, y) : b_.CreateICmpSGE(x, y));
    case OpKind::LogicalAnd:
      return b_.CreateAnd(x, y);
    case OpKind::LogicalOr:
      return b_.CreateOr(x, y);
    case OpKind::Where:
      return b_.CreateSelect(ops[0], ops[1], ops[2]);
    default:
      break;
  }
  FJ_CHECK(false, "kernel ", k_.name, ": no lowering for elementwise op ", ir::op_name(n.op));
}

}  // namespace flowjit::codegen
