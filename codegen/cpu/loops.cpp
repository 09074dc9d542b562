// CPU lowering of Loop kernels: elementwise loops and phased reductions,
// vectorized along the innermost domain dimension.
//
// Loop structure, with K the kept dims and R the reduced dims (domain order):
//   for k in K (the outermost is the parallel loop over [begin, end)):
//     phase 1..P: acc = identity; for r in R: acc = combine(acc, operand(k, r))
//     store kept-space outputs at k
//     for r in R: store full-domain outputs at (k, r)
// When the innermost dim is kept ("kept-inner"), it is the vector dim of the
// k loops: lanes are 16 consecutive kept points and the r loops are scalar.
// When it is reduced ("reduced-inner"), the innermost r loop is vectorized and
// the accumulator is reduced across lanes at the end of the phase.
#include <llvm/ADT/bit.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsX86.h>

#include <algorithm>
#include <cmath>

#include "codegen/cpu/cpu_codegen.h"
#include "ir/error.h"

namespace flowjit::codegen::cpu {

using llvm::Value;

void emit_for(llvm::IRBuilderBase& b, Value* lo, Value* hi, int64_t step,
              const std::function<void(Value*)>& body, const char* name) {
  codegen::emit_for(b, lo, hi, b.getInt64(step), body, name);
}

void emit_vector_for(llvm::IRBuilderBase& b, Value* lo, Value* hi, int lanes,
                     const std::function<void(Value*, int)>& body, const char* name) {
  if (lanes <= 1) {
    emit_for(b, lo, hi, 1, [&](Value* iv) { body(iv, 1); }, name);
    return;
  }
  Value* n = b.CreateSub(hi, lo);
  Value* main_n = b.CreateMul(b.CreateSDiv(n, b.getInt64(lanes)), b.getInt64(lanes));
  Value* main_end = b.CreateAdd(lo, main_n);
  emit_for(b, lo, main_end, lanes, [&](Value* iv) { body(iv, lanes); }, name);
  emit_for(b, main_end, hi, 1, [&](Value* iv) { body(iv, 1); }, "tail");
}

namespace {

class LoopKernelEmitter {
 public:
  LoopKernelEmitter(llvm::Module& m, const Kernel& k, const CpuTarget& t, MathProvider& math)
      : m_(m), k_(k), t_(t), math_(math), b_(m.getContext()) {}

  llvm::Function* emit(abi::CpuRange& shape, bool runtime_seeds) {
    std::vector<int> randoms = runtime_seeds ? random_nodes(k_) : std::vector<int>{};
    f_ = declare_kernel(m_, k_.name, t_, !randoms.empty());
    auto* entry = llvm::BasicBlock::Create(m_.getContext(), "entry", f_);
    b_.SetInsertPoint(entry);
    entry_ = entry;
    ptrs_ = load_kernel_args(b_, f_, k_.args.size());
    e_ = std::make_unique<ExprEmitter>(k_, b_, math_, ptrs_);
    if (!randoms.empty()) {  // each seed once, before any loop
      e_->seeds.assign(k_.nodes.size(), nullptr);
      for (size_t i = 0; i < randoms.size(); ++i) {
        Value* slot = b_.CreateConstGEP1_64(b_.getInt64Ty(), f_->getArg(4), i);
        auto* seed =
            b_.CreateAlignedLoad(b_.getInt64Ty(), slot, llvm::Align(8), "seed" + std::to_string(i));
        seed->setMetadata(llvm::LLVMContext::MD_invariant_load,
                          llvm::MDNode::get(m_.getContext(), {}));
        e_->seeds[randoms[i]] = seed;
      }
    }

    int widest = 4;
    for (const KNode& n : k_.nodes) widest = std::max(widest, ir::dtype_bytes(n.dtype));
    for (const KernelArg& a : k_.args) widest = std::max(widest, ir::dtype_bytes(a.dtype));
    lanes_ = t_.lanes(widest);

    int n = k_.rank();
    for (int d = 0; d < n; ++d) (k_.reduced[d] ? red_ : kept_).push_back(d);
    vdim_ = n - 1;
    inner_reduced_ = n > 0 && k_.reduced[vdim_];
    pdim_ = k_.parallel_dim();
    begin_ = f_->getArg(1);
    end_ = f_->getArg(2);
    nt_store_ = streaming_store();

    // The invariant point: a block between the entry and the loops.
    e_->set_invariant_point(open_hoist_block(b_, "invariant", "loops"));

    emit_kept_loops(0);
    // Streaming stores are weakly ordered: fence them before the kernel
    // returns, so that whoever joins this task sees the data.
    if (nt_store_) b_.CreateIntrinsic(llvm::Intrinsic::x86_sse_sfence, {}, {});
    b_.CreateRetVoid();

    shape.range = pdim_ < 0 ? 1 : k_.domain[pdim_];
    double cost = k_.cost_per_iteration();
    shape.grain = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(kMinTaskCost / cost)));
    if (pdim_ == vdim_ && shape.grain > 1)
      shape.grain = (shape.grain + lanes_ - 1) / lanes_ * lanes_;
    return f_;
  }

 private:
  // The store that goes non-temporal, or nullptr: an elementwise kernel (no
  // reduced dims) with one output, contiguous along the vector dim, of at
  // least 4-byte elements and larger than kStreamingStoreL2s times the L2
  // of all threads together: such an output does not stay in the caches for
  // its next reader anyway, and writing it around them halves the memory
  // traffic of the store (no read for ownership), which is what a one-pass
  // chain over a large array is bound by.
  const Store* streaming_store() const {
    if (!red_.empty() || k_.stores.size() != 1 || vdim_ < 0 || lanes_ <= 1) return nullptr;
    const Store& s = k_.stores[0];
    int elem = ir::dtype_bytes(k_.args.at(s.where.arg).dtype);
    if (elem < 4 || s.where.strides.at(vdim_) != 1 || !s.where.coords.empty() ||
        !s.where.indirect.empty())
      return nullptr;
    double bytes = elem;
    for (int64_t e : k_.domain) bytes *= static_cast<double>(e);
    double caches = static_cast<double>(t_.l2_bytes) * std::max(1, t_.threads);
    return bytes >= kStreamingStoreL2s * caches ? &s : nullptr;
  }
  static constexpr double kStreamingStoreL2s = 4;

  // The vectorized kept loop over [lo, hi) when the output streams: scalar
  // iterations until the store address is aligned to a whole iteration of
  // the vector loop (kStreamingVectors vectors, stored as one vector whose
  // alignment the store claims: non-temporal vector stores must be aligned,
  // and LLVM stores a two-vector value with one instruction where the
  // target's vectors are wider than the kernel's, e.g. 16 floats at once
  // in a kernel of 8 lanes for its int64 indices on AVX-512), then the
  // vector loop with streaming stores, then at most one vector and the
  // scalar tail. An address that is not even element-aligned runs every
  // iteration scalar.
  //
  // The vector loop runs kStreamingVectors vectors per iteration and
  // prefetches its contiguous inputs kPrefetchBytes ahead. Measured on an
  // Intel Xeon (AVX-512 host, 2026-12-02, benchmarks/README.md): with
  // streaming stores the hardware prefetchers left the loads of a
  // compute-heavy loop (the 8-op chain: a ~100-cycle dependency chain per
  // vector) waiting on memory, so its time per element was that of few
  // overlapped iterations: AVX2 code 2.4x and AVX-512 code 1.65x its time
  // in L2, and a plain loop with 16 dependent fmas per vector the same (1.7
  // ns/element with streaming stores, 0.85 with plain ones, 0.73 with a
  // prefetch 2 KiB ahead). The second vector per iteration is independent
  // work in the same instructions (the two are interleaved), which overlaps
  // more of each miss.
  void emit_streaming_for(int d, Value* lo, Value* hi,
                          const std::function<void(Value*, int)>& body) {
    const Store& s = *nt_store_;
    DType t = k_.args.at(s.where.arg).dtype;
    int64_t elem = ir::dtype_bytes(t);
    int64_t vbytes = elem * lanes_ * kStreamingVectors;
    e_->idx[d] = lo;
    Value* first = b_.CreateGEP(mem_type(m_.getContext(), t), ptrs_.at(s.where.arg),
                                e_->element_offset(s.where.strides, s.where.offset));
    e_->idx[d] = nullptr;
    Value* addr = b_.CreatePtrToInt(first, b_.getInt64Ty());
    Value* n = b_.CreateSub(hi, lo);
    Value* to_edge = b_.CreateAnd(b_.CreateNeg(addr), b_.getInt64(vbytes - 1));
    Value* peel = b_.CreateLShr(to_edge, b_.getInt64(static_cast<int64_t>(std::log2(elem))));
    Value* odd = b_.CreateICmpNE(b_.CreateAnd(addr, b_.getInt64(elem - 1)), b_.getInt64(0));
    peel = b_.CreateSelect(odd, n, b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, peel, n));
    Value* mid = b_.CreateAdd(lo, peel);
    emit_for(b_, lo, mid, 1, [&](Value* iv) { body(iv, 1); }, "peel");
    e_->nontemporal_arg = s.where.arg;
    int wide = lanes_ * kStreamingVectors;
    Value* wide_n =
        b_.CreateMul(b_.CreateSDiv(b_.CreateSub(hi, mid), b_.getInt64(wide)), b_.getInt64(wide));
    Value* wide_end = b_.CreateAdd(mid, wide_n);
    emit_for(
        b_, mid, wide_end, wide,
        [&](Value* iv) {
          prefetch_inputs(d, iv, wide);
          body(iv, wide);
        },
        "k");
    emit_vector_for(b_, wide_end, hi, lanes_, body, "k.rest");
    e_->nontemporal_arg = -1;
  }
  static constexpr int kStreamingVectors = 2;
  // Measured on an AMD Zen 3 host (AVX2, 2026-12-07): the column sum of a
  // [4096, 512] float32 array took 1.0 ms with one vector per kept point and
  // 0.39 ms with four (0.40 with eight).
  static constexpr int kReducedVectors = 4;
  static constexpr int64_t kPrefetchBytes = 2048;
  static constexpr int64_t kLineBytes = 64;

  // Prefetches, kPrefetchBytes ahead of the w points at iv along the vector
  // dim d, of every cache line of each input read contiguously along d (once
  // per argument). A prefetch past the end of an array does not fault.
  void prefetch_inputs(int d, Value* iv, int w) {
    std::vector<int> seen;
    for (const Access& a : k_.loads) {
      if (a.strides.at(d) != 1 || !a.coords.empty() || !a.indirect.empty()) continue;
      if (std::find(seen.begin(), seen.end(), a.arg) != seen.end()) continue;
      seen.push_back(a.arg);
      DType t = k_.args.at(a.arg).dtype;
      e_->idx[d] = iv;
      Value* at = b_.CreateGEP(mem_type(m_.getContext(), t), ptrs_.at(a.arg),
                               e_->element_offset(a.strides, a.offset));
      e_->idx[d] = nullptr;
      int64_t span = static_cast<int64_t>(w) * ir::dtype_bytes(t);
      for (int64_t off = 0; off < std::max(span, int64_t{1}); off += kLineBytes) {
        Value* p = b_.CreateGEP(b_.getInt8Ty(), at, b_.getInt64(kPrefetchBytes + off));
        b_.CreateIntrinsic(llvm::Intrinsic::prefetch, {p->getType()},
                           {p, b_.getInt32(0), b_.getInt32(3), b_.getInt32(1)});
      }
    }
  }

  Value* lo_of(int d) { return d == pdim_ ? begin_ : b_.getInt64(0); }
  Value* hi_of(int d) { return d == pdim_ ? end_ : b_.getInt64(k_.domain[d]); }

  // Loops over the kept dims; the innermost kept dim is vectorized when it is
  // also the innermost domain dim.
  void emit_kept_loops(size_t level) {
    if (level == kept_.size()) {
      e_->vec_dim = -1;
      e_->width = 1;
      emit_kept_point(1);
      return;
    }
    int d = kept_[level];
    if (d == vdim_ && !inner_reduced_) {
      auto body = [&](Value* iv, int w) {
        e_->push_scope();
        e_->idx[d] = iv;
        e_->vec_dim = d;
        e_->width = w;
        emit_kept_point(w);
        e_->pop_scope();
      };
      if (nt_store_) {
        emit_streaming_for(d, lo_of(d), hi_of(d), body);
      } else if (!red_.empty()) {
        // Reduced dims outside the vector dim (a column sum): kReducedVectors
        // vectors per kept point, so that each step of the reduced loops
        // reads that many consecutive vectors of a row (whole cache lines)
        // into as many independent accumulators, then the rest one vector
        // at a time.
        Value* lo = lo_of(d);
        Value* hi = hi_of(d);
        const int wide = lanes_ * kReducedVectors;
        Value* n = b_.CreateSub(hi, lo);
        Value* mid =
            b_.CreateAdd(lo, b_.CreateMul(b_.CreateSDiv(n, b_.getInt64(wide)), b_.getInt64(wide)));
        emit_for(b_, lo, mid, wide, [&](Value* iv) { body(iv, wide); }, "kw");
        emit_vector_for(b_, mid, hi, lanes_, body, "k");
      } else {
        emit_vector_for(b_, lo_of(d), hi_of(d), lanes_, body, "k");
      }
      return;
    }
    emit_for(
        b_, lo_of(d), hi_of(d), 1,
        [&](Value* iv) {
          e_->push_scope();
          e_->idx[d] = iv;
          emit_kept_loops(level + 1);
          e_->pop_scope();
        },
        "k");
  }

  // Row stashes. A kernel reduced along its innermost dim makes one pass
  // over a row per phase, then one for the full-domain stores; a
  // transcendental (or random) value that several of those passes use is
  // computed in the first and kept in a stack buffer of one row for the
  // others (softmax: exp(x - max) for the sum and again for the output),
  // while all of a kernel's stashed rows fit kStashBytes.
  struct Stash {
    int node;
    int phase;  // the pass that computes it and stores it
    llvm::AllocaInst* buf;
  };

  void plan_stashes(int max_phase) {
    stashes_.clear();
    if (!inner_reduced_ || max_phase < 1 || max_phase >= 63) return;
    int64_t row = 1;
    stash_strides_.assign(k_.rank(), 0);
    for (auto it = red_.rbegin(); it != red_.rend(); ++it) {
      stash_strides_[*it] = row;
      row *= k_.domain[*it];
    }
    // need[i]: bit p for each pass p (max_phase + 1: the stores) that
    // evaluates node i inside its reduced loops.
    const size_t n = k_.nodes.size();
    std::vector<uint64_t> need(n, 0);
    std::vector<std::pair<int, int>> roots;  // (node, pass)
    for (int r : k_.reduce_order) roots.push_back({k_.nodes[r].operands[0], k_.nodes[r].phase});
    for (const Store& st : k_.stores)
      if (!k_.store_per_kept_point(st)) roots.push_back({st.node, max_phase + 1});
    for (auto [root, pass] : roots) {
      std::vector<int> stack{root};
      const uint64_t bit = uint64_t{1} << pass;
      while (!stack.empty()) {
        int i = stack.back();
        stack.pop_back();
        const KNode& kn = k_.nodes[i];
        if (kn.kept_space || kn.invariant || (need[i] & bit)) continue;
        need[i] |= bit;
        if (kn.kind == KOp::Compute || kn.kind == KOp::Random)
          for (int o : kn.operands) stack.push_back(o);
      }
    }
    int64_t bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      const KNode& kn = k_.nodes[i];
      const bool costly = kn.kind == KOp::Random ||
                          (kn.kind == KOp::Compute && ir::has_trait(kn.op, ir::kTranscendental));
      if (!costly || llvm::popcount(need[i]) < 2) continue;
      if (kn.dtype != DType::Float32 && kn.dtype != DType::Float64) continue;
      const int64_t b = row * ir::dtype_bytes(kn.dtype);
      if (bytes + b > kStashBytes) continue;
      bytes += b;
      llvm::Type* t = reg_type(m_.getContext(), kn.dtype);
      llvm::AllocaInst* buf = entry_alloca(llvm::ArrayType::get(t, row), "stash");
      buf->setAlignment(llvm::Align(64));
      stashes_.push_back({static_cast<int>(i), llvm::countr_zero(need[i]), buf});
    }
  }

  // The address of the current reduced point's element of a stash.
  Value* stash_ptr(const Stash& s) {
    llvm::Type* t = reg_type(m_.getContext(), k_.nodes[s.node].dtype);
    return b_.CreateGEP(t, s.buf, e_->element_offset(stash_strides_, 0));
  }

  // In pass `pass` at one reduced point: stores the stashes that pass
  // computes, then makes the earlier passes' stashes the values of their
  // nodes.
  void store_stashes(int pass) {
    for (const Stash& s : stashes_)
      if (s.phase == pass) b_.CreateAlignedStore(e_->eval(s.node), stash_ptr(s), elem_align(s));
  }
  void load_stashes(int pass) {
    for (const Stash& s : stashes_) {
      if (s.phase >= pass) continue;
      llvm::Type* t = with_width(reg_type(m_.getContext(), k_.nodes[s.node].dtype), e_->width);
      e_->set_value(s.node, b_.CreateAlignedLoad(t, stash_ptr(s), elem_align(s)));
    }
  }
  llvm::Align elem_align(const Stash& s) const {
    return llvm::Align(ir::dtype_bytes(k_.nodes[s.node].dtype));
  }

  // At one kept point (or one vector of kept points, width w).
  void emit_kept_point(int w) {
    e_->push_scope();
    int max_phase = 0;
    for (int r : k_.reduce_order) max_phase = std::max(max_phase, k_.nodes[r].phase);
    if (!stashes_planned_) {
      plan_stashes(max_phase);
      stashes_planned_ = true;
    }
    for (int p = 1; p <= max_phase; ++p) emit_phase(p, w);
    // Kept-space stores, then the full-domain stores in one pass over R.
    std::vector<const Store*> full;
    for (const Store& s : k_.stores) {
      if (k_.store_per_kept_point(s) || red_.empty()) {
        e_->store(s, e_->eval(s.node));
      } else {
        full.push_back(&s);
      }
    }
    if (!full.empty()) {
      open_kept_point(w);
      emit_reduced_loops(0, [&](int) {
        load_stashes(max_phase + 1);
        for (const Store* s : full) e_->store(*s, e_->eval(s->node));
      });
      e_->clear_kept_point();
    }
    e_->pop_scope();
  }

  // A block that dominates the following reduced loops, where kept-space
  // values are computed once per kept point.
  void open_kept_point(int w) { e_->set_kept_point(open_hoist_block(b_, "kept", "reduce"), w); }

  struct Accum {
    int node;
    OpKind op;
    DType t;
    llvm::AllocaInst* vec = nullptr;   // width `lanes_` (reduced-inner) or w
    llvm::AllocaInst* vidx = nullptr;  // arg-reductions: index of the best value
    llvm::AllocaInst* tail = nullptr;  // width 1 (reduced-inner remainder)
    llvm::AllocaInst* tidx = nullptr;
    int vec_width = 1;
  };

  llvm::AllocaInst* entry_alloca(llvm::Type* t, const char* name) {
    llvm::IRBuilder<> eb(entry_, entry_->begin());
    return eb.CreateAlloca(t, nullptr, name);
  }

  static bool is_arg(OpKind op) { return op == OpKind::ArgMax || op == OpKind::ArgMin; }

  void emit_phase(int phase, int w) {
    std::vector<Accum> accs;
    llvm::LLVMContext& c = m_.getContext();
    int vw = inner_reduced_ ? lanes_ : w;
    for (int r : k_.reduce_order) {
      const KNode& rn = k_.nodes[r];
      if (rn.phase != phase) continue;
      Accum a;
      a.node = r;
      a.op = rn.op;
      a.t = k_.nodes[rn.operands[0]].dtype;
      a.vec_width = vw;
      llvm::Type* st = reg_type(c, a.t);
      a.vec = entry_alloca(with_width(st, vw), "acc");
      b_.CreateStore(reduce_identity(b_, a.op, a.t, vw), a.vec);
      if (is_arg(a.op)) {
        a.vidx = entry_alloca(with_width(b_.getInt64Ty(), vw), "acc.idx");
        b_.CreateStore(llvm::Constant::getNullValue(with_width(b_.getInt64Ty(), vw)), a.vidx);
      }
      if (inner_reduced_ && vw > 1) {
        a.tail = entry_alloca(st, "acc.tail");
        b_.CreateStore(reduce_identity(b_, a.op, a.t, 1), a.tail);
        if (is_arg(a.op)) {
          a.tidx = entry_alloca(b_.getInt64Ty(), "acc.tidx");
          b_.CreateStore(b_.getInt64(0), a.tidx);
        }
      }
      accs.push_back(a);
    }
    open_kept_point(inner_reduced_ ? 1 : w);
    emit_reduced_loops(0, [&](int width) {
      load_stashes(phase);
      for (Accum& a : accs) {
        const KNode& rn = k_.nodes[a.node];
        Value* v = e_->eval(rn.operands[0]);
        bool tail = width == 1 && a.tail;
        llvm::AllocaInst* slot = tail ? a.tail : a.vec;
        llvm::Type* slot_t = slot->getAllocatedType();
        Value* acc = b_.CreateLoad(slot_t, slot);
        if (!is_arg(a.op)) {
          b_.CreateStore(reduce_combine(b_, a.op, a.t, acc, v), slot);
          continue;
        }
        llvm::AllocaInst* islot = tail ? a.tidx : a.vidx;
        Value* iacc = b_.CreateLoad(islot->getAllocatedType(), islot);
        Value* pos = e_->element_offset(rn.index_strides, 0);
        if (width > 1) {
          int64_t vs = e_->vec_dim >= 0 ? rn.index_strides[e_->vec_dim] : 0;
          pos = b_.CreateAdd(e_->splat(pos, width), e_->lane_offsets(vs));
        }
        Value* better = arg_better(a.op, a.t, v, pos, acc, iacc);
        b_.CreateStore(b_.CreateSelect(better, v, acc), slot);
        b_.CreateStore(b_.CreateSelect(better, pos, iacc), islot);
      }
      store_stashes(phase);
    });
    e_->clear_kept_point();
    // Combine lanes and the scalar remainder into the kept-space result.
    for (Accum& a : accs) {
      Value* acc = b_.CreateLoad(a.vec->getAllocatedType(), a.vec);
      Value* result;
      if (!is_arg(a.op)) {
        result = inner_reduced_ ? reduce_horizontal(b_, a.op, a.t, acc) : acc;
        if (a.tail)
          result = reduce_combine(b_, a.op, a.t, result,
                                  b_.CreateLoad(a.tail->getAllocatedType(), a.tail));
      } else {
        Value* iacc = b_.CreateLoad(a.vidx->getAllocatedType(), a.vidx);
        Value* best_v = acc;
        Value* best_i = iacc;
        if (inner_reduced_ && a.vec_width > 1) {
          best_v = b_.CreateExtractElement(acc, uint64_t{0});
          best_i = b_.CreateExtractElement(iacc, uint64_t{0});
          for (int l = 1; l < a.vec_width; ++l) {
            Value* v = b_.CreateExtractElement(acc, uint64_t(l));
            Value* i = b_.CreateExtractElement(iacc, uint64_t(l));
            Value* better = arg_better(a.op, a.t, v, i, best_v, best_i, /*tie_by_index=*/true);
            best_v = b_.CreateSelect(better, v, best_v);
            best_i = b_.CreateSelect(better, i, best_i);
          }
          Value* tv = b_.CreateLoad(a.tail->getAllocatedType(), a.tail);
          Value* ti = b_.CreateLoad(a.tidx->getAllocatedType(), a.tidx);
          Value* better = arg_better(a.op, a.t, tv, ti, best_v, best_i, true);
          best_i = b_.CreateSelect(better, ti, best_i);
        }
        const KNode& rn = k_.nodes[a.node];
        result = b_.CreateIntCast(
            best_i,
            with_width(reg_type(c, rn.dtype), a.vec_width > 1 && !inner_reduced_ ? a.vec_width : 1),
            true);
      }
      e_->set_value(a.node, result);
    }
  }

  // Whether (v, i) should replace (best, bi) in an arg-reduction. NaN counts
  // as the extreme value (numpy); ties keep the lower index.
  Value* arg_better(OpKind op, DType t, Value* v, Value* i, Value* best, Value* bi,
                    bool tie_by_index = false) {
    Value* strictly;
    if (ir::is_float(t)) {
      strictly = op == OpKind::ArgMax ? b_.CreateFCmpOGT(v, best) : b_.CreateFCmpOLT(v, best);
      Value* vnan = b_.CreateFCmpUNO(v, v);
      Value* bnan = b_.CreateFCmpUNO(best, best);
      strictly = b_.CreateOr(strictly, b_.CreateAnd(vnan, b_.CreateNot(bnan)));
      if (tie_by_index) {
        Value* tie = b_.CreateOr(b_.CreateFCmpOEQ(v, best), b_.CreateAnd(vnan, bnan));
        strictly = b_.CreateOr(strictly, b_.CreateAnd(tie, b_.CreateICmpSLT(i, bi)));
      }
      return strictly;
    }
    bool u = t == DType::UInt8 || t == DType::Bool;
    strictly = op == OpKind::ArgMax ? (u ? b_.CreateICmpUGT(v, best) : b_.CreateICmpSGT(v, best))
                                    : (u ? b_.CreateICmpULT(v, best) : b_.CreateICmpSLT(v, best));
    if (tie_by_index)
      strictly =
          b_.CreateOr(strictly, b_.CreateAnd(b_.CreateICmpEQ(v, best), b_.CreateICmpSLT(i, bi)));
    return strictly;
  }

  // Loops over the reduced dims; body(width) runs at each point.
  void emit_reduced_loops(size_t level, const std::function<void(int)>& body) {
    if (level == red_.size()) {
      e_->push_scope();
      body(e_->width);
      e_->pop_scope();
      return;
    }
    int d = red_[level];
    if (d == vdim_) {
      int saved_w = e_->width, saved_v = e_->vec_dim;
      emit_vector_for(
          b_, b_.getInt64(0), b_.getInt64(k_.domain[d]), lanes_,
          [&](Value* iv, int w) {
            e_->idx[d] = iv;
            e_->vec_dim = d;
            e_->width = w;
            emit_reduced_loops(level + 1, body);
          },
          "r");
      e_->width = saved_w;
      e_->vec_dim = saved_v;
      e_->idx[d] = nullptr;
      return;
    }
    emit_for(
        b_, b_.getInt64(0), b_.getInt64(k_.domain[d]), 1,
        [&](Value* iv) {
          e_->idx[d] = iv;
          emit_reduced_loops(level + 1, body);
        },
        "r");
    e_->idx[d] = nullptr;
  }

  llvm::Module& m_;
  const Kernel& k_;
  const CpuTarget& t_;
  MathProvider& math_;
  llvm::IRBuilder<> b_;
  llvm::Function* f_ = nullptr;
  llvm::BasicBlock* entry_ = nullptr;
  std::unique_ptr<ExprEmitter> e_;
  std::vector<Value*> ptrs_;
  const Store* nt_store_ = nullptr;
  std::vector<int> kept_, red_;
  int vdim_ = -1, pdim_ = -1, lanes_ = 1;
  bool inner_reduced_ = false;
  std::vector<Stash> stashes_;
  std::vector<int64_t> stash_strides_;  // per domain dim: row-major over the reduced dims
  bool stashes_planned_ = false;
  static constexpr int64_t kStashBytes = 16 << 10;
  Value* begin_ = nullptr;
  Value* end_ = nullptr;
};

}  // namespace

llvm::Function* emit_loop_kernel(llvm::Module& m, const Kernel& k, const CpuTarget& t,
                                 MathProvider& math, abi::CpuRange& shape, bool runtime_seeds) {
  Kernel flat = k;
  coalesce_domain(flat);
  return LoopKernelEmitter(m, flat, t, math).emit(shape, runtime_seeds);
}

}  // namespace flowjit::codegen::cpu
