// GPU lowering of Loop kernels: elementwise kernels with a grid-stride thread
// mapping, and phased reductions with one thread, warp or block per kept point.
//
// Elementwise (no reduction): the coalesced domain is walked as one linear
// range of points, W consecutive points per thread and iteration, where W
// makes 128-bit accesses (4 floats, 2 doubles) when every access is
// contiguous or broadcast along the innermost dimension and W-aligned;
// otherwise W = 1.
//
// Reductions: with K the kept dims and R the reduced dims, a "group" of G
// threads owns one kept point at a time (grid-stride over the kept points):
//   phase 1..P: each thread folds every G-th reduced point into registers;
//               the group combines them (G = 32: shfl.sync butterfly; G = the
//               block: butterfly, one partial per warp in shared memory, and
//               every thread folds the partials in the same order, so all
//               threads hold the bitwise-same result)
//   kept-space stores by the group's first thread
//   full-domain stores: every G-th reduced point per thread
// G = 1 (a thread per kept point, serial phases) when the innermost dim is
// kept and there are many kept points: neighbouring threads then read
// neighbouring elements. Otherwise G = 32 for short rows, the block for long.
#include <llvm/IR/Intrinsics.h>

#include <algorithm>

#include "codegen/nvptx/nvptx_codegen.h"
#include "ir/error.h"

namespace flowjit::codegen::nvptx {

using llvm::Value;

namespace {

constexpr int kBlock = 256;
constexpr int64_t kMaxBlocks = 65535;

uint32_t blocks_for(int64_t units, int64_t per_block) {
  int64_t n = (units + per_block - 1) / per_block;
  return static_cast<uint32_t>(std::clamp<int64_t>(n, 1, kMaxBlocks));
}

class LoopEmitter {
 public:
  LoopEmitter(llvm::Module& m, const Kernel& k, const GpuTarget& t, MathProvider& math)
      : m_(m), k_(k), t_(t), math_(math), b_(m.getContext()) {}

  llvm::Function* emit(abi::GpuGrid& launch, KernelNotes& notes) {
    f_ = declare_kernel(m_, k_, kBlock);
    b_.SetInsertPoint(llvm::BasicBlock::Create(m_.getContext(), "entry", f_));
    std::vector<Value*> ptrs;
    for (auto& a : f_->args()) ptrs.push_back(&a);
    e_ = std::make_unique<ExprEmitter>(k_, b_, math_, ptrs);
    for (int d = 0; d < k_.rank(); ++d) (k_.reduced[d] ? red_ : kept_).push_back(d);
    launch.block[0] = kBlock;
    if (k_.has_reduction()) {
      emit_reduction(launch, notes);
    } else {
      emit_elementwise(launch, notes);
    }
    b_.CreateRetVoid();
    return f_;
  }

 private:
  Value* i64(int64_t v) { return b_.getInt64(v); }
  Value* tid64() { return b_.CreateZExt(thread_idx(b_), b_.getInt64Ty()); }

  // ---------------------------------------------------------------- elementwise

  // Lanes per thread: 16 bytes of the widest type, when every access allows it.
  int vector_width() const {
    int r = k_.rank();
    if (r == 0) return 1;
    int inner = r - 1;
    int widest = 1;
    for (const KNode& n : k_.nodes) widest = std::max(widest, ir::dtype_bytes(n.dtype));
    for (const KernelArg& a : k_.args) widest = std::max(widest, ir::dtype_bytes(a.dtype));
    int w = std::min(4, 16 / widest);
    if (w <= 1 || k_.domain[inner] % w != 0) return 1;
    auto aligned = [&](const Access& a, bool is_store) {
      int64_t s = a.strides[inner];
      if (s == 0) return !is_store;
      if (s != 1 || a.offset % w != 0) return false;
      for (int d = 0; d < inner; ++d)
        if (a.strides[d] % w != 0) return false;
      return true;
    };
    for (const KNode& n : k_.nodes)
      if (n.kind == KOp::Load && !aligned(k_.loads[n.access], false)) return 1;
    for (const Store& s : k_.stores)
      if (!aligned(s.where, true)) return 1;
    return w;
  }

  void emit_elementwise(abi::GpuGrid& launch, KernelNotes& notes) {
    int w = vector_width();
    int64_t points = ir::num_elements(k_.domain);
    int64_t units = points / w;
    launch.grid[0] = blocks_for(units, kBlock);
    notes.mapping = w > 1 ? "elementwise x" + std::to_string(w) : "elementwise";
    Value* gid = b_.CreateAdd(
        b_.CreateMul(b_.CreateZExt(block_idx(b_), b_.getInt64Ty()), i64(kBlock)), tid64());
    Value* stride = b_.CreateMul(b_.CreateZExt(grid_dim(b_), b_.getInt64Ty()), i64(kBlock));
    emit_for(
        b_, gid, i64(units), stride,
        [&](Value* u) {
          Value* p = w > 1 ? b_.CreateMul(u, i64(w)) : u;
          std::vector<Value*> idx = delinearize(b_, p, k_.domain);
          e_->push_scope();
          e_->idx = idx;
          e_->vec_dim = w > 1 ? k_.rank() - 1 : -1;
          e_->width = w;
          for (const Store& s : k_.stores) e_->store(s, e_->eval(s.node));
          e_->pop_scope();
        },
        "pt");
    if (w > 1) align_vector_accesses();
  }

  // The vector loads and stores are the W-aligned contiguous accesses checked
  // by vector_width(); argument bases are 16-byte aligned (the kernel ABI).
  void align_vector_accesses() {
    for (llvm::BasicBlock& bb : *f_)
      for (llvm::Instruction& inst : bb) {
        auto bytes_of = [](llvm::Type* t) -> uint64_t {
          auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(t);
          if (!vt) return 0;
          return vt->getNumElements() * vt->getElementType()->getPrimitiveSizeInBits() / 8;
        };
        if (auto* ld = llvm::dyn_cast<llvm::LoadInst>(&inst)) {
          if (uint64_t n = bytes_of(ld->getType())) ld->setAlignment(llvm::Align(n));
        } else if (auto* st = llvm::dyn_cast<llvm::StoreInst>(&inst)) {
          if (uint64_t n = bytes_of(st->getValueOperand()->getType()))
            st->setAlignment(llvm::Align(n));
        }
      }
  }

  // ---------------------------------------------------------------- reductions

  std::vector<int64_t> extents(const std::vector<int>& dims) const {
    std::vector<int64_t> e;
    for (int d : dims) e.push_back(k_.domain[d]);
    return e;
  }

  int choose_group(int64_t kept_points, int64_t red_points) const {
    bool inner_kept = k_.rank() > 0 && !k_.reduced[k_.rank() - 1];
    if (inner_kept && (kept_points >= 1024 || red_points <= 4)) return 1;
    if (red_points <= 4096) return kWarp;
    return kBlock;
  }

  struct Accum {
    int node;
    OpKind op;
    DType t;
    llvm::AllocaInst* val = nullptr;
    llvm::AllocaInst* idx = nullptr;  // arg-reductions
    int slot = 0;                     // shared-memory slot (block groups)
  };

  static bool is_arg(OpKind op) { return op == OpKind::ArgMax || op == OpKind::ArgMin; }

  void emit_reduction(abi::GpuGrid& launch, KernelNotes& notes) {
    int64_t kept_points = ir::num_elements(extents(kept_));
    int64_t red_points = ir::num_elements(extents(red_));
    g_ = choose_group(kept_points, red_points);
    int per_block = kBlock / g_;
    launch.grid[0] = blocks_for(kept_points, per_block);
    notes.mapping = g_ == 1 ? "reduce thread" : g_ == kWarp ? "reduce warp" : "reduce block";
    max_phase_ = 0;
    for (int r : k_.reduce_order) max_phase_ = std::max(max_phase_, k_.nodes[r].phase);
    if (g_ == kBlock) {
      // One 8-byte cell per warp for every value (and index) of a phase.
      int slots = 0;
      for (int p = 1; p <= max_phase_; ++p) {
        int s = 0;
        for (int r : k_.reduce_order)
          if (k_.nodes[r].phase == p) s += is_arg(k_.nodes[r].op) ? 2 : 1;
        slots = std::max(slots, s);
      }
      smem_ = shared_array(m_, k_.name + ".partials", b_.getInt64Ty(),
                           int64_t{slots} * (kBlock / kWarp));
      notes.static_shared_bytes = static_cast<uint32_t>(slots * (kBlock / kWarp) * 8);
    }
    tid_ = tid64();
    lane_ = g_ == 1 ? i64(0) : g_ == kBlock ? tid_ : b_.CreateURem(tid_, i64(g_));
    Value* blk = b_.CreateZExt(block_idx(b_), b_.getInt64Ty());
    Value* first = g_ == kBlock ? blk
                                : b_.CreateAdd(b_.CreateMul(blk, i64(per_block)),
                                               b_.CreateUDiv(tid_, i64(g_)));
    Value* stride = b_.CreateMul(b_.CreateZExt(grid_dim(b_), b_.getInt64Ty()), i64(per_block));
    emit_for(
        b_, first, i64(kept_points), stride,
        [&](Value* kp) {
          std::vector<Value*> kidx = delinearize(b_, kp, extents(kept_));
          for (size_t j = 0; j < kept_.size(); ++j) e_->idx[kept_[j]] = kidx[j];
          emit_kept_point(red_points);
        },
        "kp");
  }

  void set_reduced_idx(Value* r) {
    std::vector<Value*> ridx = delinearize(b_, r, extents(red_));
    for (size_t j = 0; j < red_.size(); ++j) e_->idx[red_[j]] = ridx[j];
  }
  void clear_reduced_idx() {
    for (int d : red_) e_->idx[d] = nullptr;
  }

  // A block that dominates the following loop over the reduced points, where
  // kept-space values are computed once per kept point.
  void open_kept_point() { e_->set_kept_point(open_hoist_block(b_, "kept", "reduce"), 1); }

  // Every G-th reduced point, starting at this thread's lane.
  void for_my_reduced_points(int64_t red_points, const std::function<void()>& body) {
    open_kept_point();
    emit_for(
        b_, lane_, i64(red_points), i64(g_),
        [&](Value* r) {
          set_reduced_idx(r);
          e_->push_scope();
          body();
          e_->pop_scope();
        },
        "r");
    e_->clear_kept_point();
    clear_reduced_idx();
  }

  void emit_kept_point(int64_t red_points) {
    e_->push_scope();
    for (int p = 1; p <= max_phase_; ++p) emit_phase(p, red_points);
    // Kept-space stores, by the first thread of the group. Values are
    // computed by every thread, outside the branch, so they dominate later uses.
    std::vector<std::pair<const Store*, Value*>> kept_stores;
    std::vector<const Store*> full;
    for (const Store& s : k_.stores) {
      if (k_.store_per_kept_point(s)) {
        kept_stores.emplace_back(&s, e_->eval(s.node));
      } else {
        full.push_back(&s);
      }
    }
    if (!kept_stores.empty()) {
      if_first_lane([&] {
        for (auto& [s, v] : kept_stores) e_->store(*s, v);
      });
    }
    if (!full.empty()) {
      for_my_reduced_points(red_points, [&] {
        for (const Store* s : full) e_->store(*s, e_->eval(s->node));
      });
    }
    e_->pop_scope();
  }

  void if_first_lane(const std::function<void()>& body) {
    if (g_ == 1) {
      body();
      return;
    }
    auto* then = llvm::BasicBlock::Create(m_.getContext(), "lane0", f_);
    auto* cont = llvm::BasicBlock::Create(m_.getContext(), "lane0.end", f_);
    b_.CreateCondBr(b_.CreateICmpEQ(lane_, i64(0)), then, cont);
    b_.SetInsertPoint(then);
    body();
    b_.CreateBr(cont);
    b_.SetInsertPoint(cont);
  }

  void emit_phase(int phase, int64_t red_points) {
    llvm::LLVMContext& c = m_.getContext();
    std::vector<Accum> accs;
    int slot = 0;
    for (int r : k_.reduce_order) {
      const KNode& rn = k_.nodes[r];
      if (rn.phase != phase) continue;
      Accum a;
      a.node = r;
      a.op = rn.op;
      a.t = k_.nodes[rn.operands[0]].dtype;
      a.val = entry_alloca(f_, reg_type(c, a.t), "acc");
      b_.CreateStore(reduce_identity(b_, a.op, a.t, 1), a.val);
      if (is_arg(a.op)) {
        a.idx = entry_alloca(f_, b_.getInt64Ty(), "acc.idx");
        b_.CreateStore(i64(INT64_MAX), a.idx);  // no element yet: loses every tie
      }
      a.slot = slot;
      slot += is_arg(a.op) ? 2 : 1;
      accs.push_back(a);
    }
    for_my_reduced_points(red_points, [&] {
      for (Accum& a : accs) {
        const KNode& rn = k_.nodes[a.node];
        Value* v = e_->eval(rn.operands[0]);
        Value* acc = b_.CreateLoad(a.val->getAllocatedType(), a.val);
        if (!is_arg(a.op)) {
          b_.CreateStore(reduce_combine(b_, a.op, a.t, acc, v), a.val);
          continue;
        }
        Value* iacc = b_.CreateLoad(b_.getInt64Ty(), a.idx);
        Value* pos = e_->element_offset(rn.index_strides, 0);
        Value* better = arg_better(b_, a.op, a.t, v, pos, acc, iacc);
        b_.CreateStore(b_.CreateSelect(better, v, acc), a.val);
        b_.CreateStore(b_.CreateSelect(better, pos, iacc), a.idx);
      }
    });
    std::vector<Value*> vals, idxs;
    for (Accum& a : accs) {
      vals.push_back(b_.CreateLoad(a.val->getAllocatedType(), a.val));
      idxs.push_back(a.idx ? b_.CreateLoad(b_.getInt64Ty(), a.idx) : nullptr);
    }
    if (g_ > 1) group_reduce(accs, vals, idxs);
    for (size_t i = 0; i < accs.size(); ++i) {
      const KNode& rn = k_.nodes[accs[i].node];
      Value* result =
          is_arg(accs[i].op) ? b_.CreateIntCast(idxs[i], reg_type(c, rn.dtype), true) : vals[i];
      e_->set_value(accs[i].node, result);
    }
  }

  void combine(const Accum& a, Value*& v, Value*& i, Value* ov, Value* oi) {
    if (!is_arg(a.op)) {
      v = reduce_combine(b_, a.op, a.t, v, ov);
      return;
    }
    Value* better = arg_better(b_, a.op, a.t, ov, oi, v, i);
    v = b_.CreateSelect(better, ov, v);
    i = b_.CreateSelect(better, oi, i);
  }

  void group_reduce(const std::vector<Accum>& accs, std::vector<Value*>& vals,
                    std::vector<Value*>& idxs) {
    for (int off = kWarp / 2; off >= 1; off /= 2) {
      for (size_t a = 0; a < accs.size(); ++a) {
        Value* ov = shuffle_xor(b_, vals[a], off);
        Value* oi = idxs[a] ? shuffle_xor(b_, idxs[a], off) : nullptr;
        combine(accs[a], vals[a], idxs[a], ov, oi);
      }
    }
    if (g_ != kBlock) return;
    const int warps = kBlock / kWarp;
    Value* warp = b_.CreateUDiv(tid_, i64(kWarp));
    Value* wlane = b_.CreateURem(tid_, i64(kWarp));
    auto cell = [&](int slot, Value* w) {
      return b_.CreateGEP(b_.getInt64Ty(), smem_, b_.CreateAdd(i64(int64_t{slot} * warps), w));
    };
    auto* then = llvm::BasicBlock::Create(m_.getContext(), "warp0", f_);
    auto* cont = llvm::BasicBlock::Create(m_.getContext(), "warp0.end", f_);
    b_.CreateCondBr(b_.CreateICmpEQ(wlane, i64(0)), then, cont);
    b_.SetInsertPoint(then);
    for (size_t a = 0; a < accs.size(); ++a) {
      b_.CreateAlignedStore(vals[a], cell(accs[a].slot, warp), llvm::Align(8));
      if (idxs[a]) b_.CreateAlignedStore(idxs[a], cell(accs[a].slot + 1, warp), llvm::Align(8));
    }
    b_.CreateBr(cont);
    b_.SetInsertPoint(cont);
    barrier(b_);
    for (size_t a = 0; a < accs.size(); ++a) {
      llvm::Type* t = vals[a]->getType();
      Value* v = b_.CreateAlignedLoad(t, cell(accs[a].slot, i64(0)), llvm::Align(8));
      Value* i = idxs[a] ? b_.CreateAlignedLoad(b_.getInt64Ty(), cell(accs[a].slot + 1, i64(0)),
                                                llvm::Align(8))
                         : nullptr;
      for (int w = 1; w < warps; ++w) {
        Value* ov = b_.CreateAlignedLoad(t, cell(accs[a].slot, i64(w)), llvm::Align(8));
        Value* oi = idxs[a] ? b_.CreateAlignedLoad(b_.getInt64Ty(), cell(accs[a].slot + 1, i64(w)),
                                                   llvm::Align(8))
                            : nullptr;
        combine(accs[a], v, i, ov, oi);
      }
      vals[a] = v;
      idxs[a] = i;
    }
    barrier(b_);  // the cells are reused by the next phase or kept point
  }

  llvm::Module& m_;
  const Kernel& k_;
  const GpuTarget& t_;
  MathProvider& math_;
  llvm::IRBuilder<> b_;
  llvm::Function* f_ = nullptr;
  std::unique_ptr<ExprEmitter> e_;
  std::vector<int> kept_, red_;
  int g_ = 1;
  int max_phase_ = 0;
  llvm::GlobalVariable* smem_ = nullptr;
  Value* tid_ = nullptr;
  Value* lane_ = nullptr;
};

}  // namespace

llvm::Function* emit_loop_kernel(llvm::Module& m, const Kernel& k, const GpuTarget& t,
                                 MathProvider& math, abi::GpuGrid& launch, KernelNotes& notes) {
  Kernel flat = k;
  coalesce_domain(flat);
  return LoopEmitter(m, flat, t, math).emit(launch, notes);
}

}  // namespace flowjit::codegen::nvptx
