// attention on x86-64, in blocks as flash attention does. A task owns a
// block of kRows queries (of keys for dk and dv) and walks the other side in
// blocks of 64 (cols_); every product is one register-tiled kernel, gemm below:
// 4 rows x 2 host vectors of accumulators fed by broadcasts of one operand
// and vector loads of the other along its rows. That is why the ops take k
// transposed (kt) and the gradients each operand and its transpose: the
// scores of a query block are q . kt, the output is p . v, and so on.
// Per-row state (running max and sum, the output rows) and the score block
// live in the thread's scratch; only the scores of one block exist at a time.
#include <algorithm>
#include <cmath>

#include "codegen/cpu/cpu_codegen.h"
#include "codegen/families/attention/attention.h"

namespace flowjit::codegen::cpu {

using llvm::Value;

namespace {

using P = AttentionParams;

constexpr int64_t kTileRows = 4;  // rows of a gemm tile
constexpr int64_t kRows = 32;  // rows a task owns (32 x 64 blocks: fastest of 32/64 each on Zen 3)

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

class AttentionEmitter {
 public:
  AttentionEmitter(llvm::Module& m, const Kernel& k, const CpuTarget& t, MathProvider& math)
      : m_(m), k_(k), p_(k), t_(t), math_(math), b_(m.getContext()) {
    FJ_CHECK(p_.dtype == DType::Float32 || p_.dtype == DType::Float64, "attention kernel ", k.name,
             " of ", ir::dtype_name(p_.dtype), " (widen_half widens half attention)");
    elem_ = mem_type(m.getContext(), p_.dtype);
    lanes_ = t.lanes(ir::dtype_bytes(p_.dtype));
    chunk_ = 2 * lanes_;
    cols_ = round_up(64, chunk_);
    wide_ = round_up(std::max(p_.d, p_.dv), chunk_);
  }

  llvm::Function* emit(abi::CpuRange& shape) {
    llvm::LLVMContext& ctx = m_.getContext();
    f_ = declare_kernel(m_, k_.name, t_);
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", f_));
    const std::vector<Value*> ptrs = load_kernel_args(b_, f_, k_.args.size());
    for (int o = 0; o < P::kOperands; ++o) ptr_[o] = p_.arg[o] >= 0 ? ptrs[p_.arg[o]] : nullptr;
    if (p_.dropout > 0)
      offset_ = b_.CreateAlignedLoad(b_.getInt64Ty(), ptr_[P::Offset], llvm::Align(8), "offset");
    // Scratch: two score blocks, the row state and the rows being summed.
    Value* scratch = f_->getArg(3);
    int64_t at = 0;
    auto carve = [&](int64_t n) {
      Value* v = b_.CreateGEP(elem_, scratch, i64(at));
      at += round_up(n, 16);
      return v;
    };
    s_ = carve(kRows * cols_);
    t2_ = carve(kRows * cols_);
    m_row_ = carve(kRows);
    l_row_ = carve(kRows);
    acc_ = carve(kRows * wide_);
    acc2_ = carve(kRows * wide_);
    shape.scratch_bytes = at * ir::dtype_bytes(p_.dtype) + 64;

    const int64_t own = p_.per_key() ? p_.lk : p_.lq;
    const int64_t blocks = (own + kRows - 1) / kRows;
    shape.range = p_.groups * blocks;
    const double other = static_cast<double>(p_.per_key() ? p_.lq : p_.lk) / (p_.causal ? 2 : 1);
    const double cost = kRows * other * static_cast<double>(2 * p_.d + 2 * p_.dv) + 1;
    shape.grain = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(kMinTaskCost / cost)));

    emit_for(
        b_, f_->getArg(1), f_->getArg(2), 1,
        [&](Value* task) {
          Value* g = b_.CreateSDiv(task, i64(blocks), "g");
          Value* r0 = b_.CreateMul(b_.CreateSRem(task, i64(blocks)), i64(kRows), "r0");
          Value* n = min(i64(kRows), b_.CreateSub(i64(own), r0));
          bias0_ = b_.CreateMul(b_.CreateSRem(b_.CreateSDiv(g, i64(p_.gdiv)), i64(p_.gmod)),
                                i64(p_.gstride));
          if (p_.per_key())
            key_task(g, r0, n);
          else
            query_task(g, r0, n);
        },
        "task");
    b_.CreateRetVoid();
    return f_;
  }

 private:
  Value* i64(int64_t v) { return b_.getInt64(v); }
  Value* fconst(double v, int w = 1) {
    Value* c = llvm::ConstantFP::get(elem_, v);
    return w == 1 ? c : b_.CreateVectorSplat(w, c);
  }
  Value* splat(Value* x, int w) { return w == 1 ? x : b_.CreateVectorSplat(w, x); }
  Value* min(Value* x, Value* y) { return b_.CreateSelect(b_.CreateICmpSLT(x, y), x, y); }
  Value* at(Value* base, Value* i) { return b_.CreateGEP(elem_, base, i); }
  llvm::Align align() const { return llvm::Align(ir::dtype_bytes(p_.dtype)); }
  Value* load(Value* base, Value* i, int w = 1) {
    return b_.CreateAlignedLoad(with_width(elem_, w), at(base, i), align());
  }
  void store(Value* v, Value* base, Value* i) { b_.CreateAlignedStore(v, at(base, i), align()); }
  Value* fma(Value* a, Value* x, Value* y) {  // a * x + y, fused where the target fuses
    return b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {a->getType()}, {a, x, y});
  }
  Value* local(llvm::Type* t, const char* name) {
    llvm::BasicBlock& entry = f_->getEntryBlock();
    llvm::IRBuilder<> e(&entry, entry.begin());
    return e.CreateAlloca(t, nullptr, name);
  }
  void loop(Value* lo, Value* hi, const std::function<void(Value*)>& body, const char* name) {
    emit_for(b_, lo, hi, 1, body, name);
  }
  void vloop(Value* lo, Value* hi, const std::function<void(Value*, int)>& body, const char* name) {
    emit_vector_for(b_, lo, hi, lanes_, body, name);
  }
  // op (ReduceMax or ReduceSum) over [0, n) of body(x, width).
  Value* reduce(OpKind op, Value* n, const std::function<Value*(Value*, int)>& body) {
    llvm::Type* vt = with_width(elem_, lanes_);
    Value* vacc = local(vt, "red_v");
    Value* sacc = local(elem_, "red_s");
    const double init = op == OpKind::ReduceMax ? -INFINITY : 0.0;
    b_.CreateStore(fconst(init, lanes_), vacc);
    b_.CreateStore(fconst(init), sacc);
    vloop(
        i64(0), n,
        [&](Value* x, int w) {
          Value* slot = w == 1 ? sacc : vacc;
          Value* cur = b_.CreateLoad(with_width(elem_, w), slot);
          Value* v = body(x, w);
          b_.CreateStore(op == OpKind::ReduceMax
                             ? b_.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, cur, v)
                             : b_.CreateFAdd(cur, v),
                         slot);
        },
        "red");
    Value* v = b_.CreateLoad(vt, vacc);
    Value* s = b_.CreateLoad(elem_, sacc);
    if (lanes_ > 1) v = reduce_horizontal(b_, op, p_.dtype, v);
    return op == OpKind::ReduceMax ? b_.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, v, s)
                                   : b_.CreateFAdd(v, s);
  }

  // c[r * ldc + x] (+)= sum over y < depth of a[a_row(r) + y] * bm[b0 + y *
  // bs + x], for the task's kRows rows r and x < cols. c has room for cols
  // rounded up to two vectors; bm is read with masked loads past cols.
  void gemm(const std::function<Value*(Value*)>& a_row, Value* a, Value* depth, Value* bm,
            Value* b0, int64_t bs, Value* cols, Value* c, int64_t ldc, bool accumulate) {
    llvm::Type* vt = with_width(elem_, lanes_);
    Value* chunks = b_.CreateSDiv(b_.CreateAdd(cols, i64(chunk_ - 1)), i64(chunk_));
    Value* acc[kTileRows][2];
    for (auto& row : acc)
      for (auto& v : row) v = local(vt, "tile");
    std::vector<llvm::Constant*> iota;
    for (int l = 0; l < lanes_; ++l) iota.push_back(b_.getInt64(l));
    Value* lane = llvm::ConstantVector::get(iota);
    loop(
        i64(0), i64(kRows / kTileRows),
        [&](Value* rt) {
          Value* r0 = b_.CreateMul(rt, i64(kTileRows));
          Value* rows[kTileRows];
          for (int i = 0; i < kTileRows; ++i) rows[i] = a_row(b_.CreateAdd(r0, i64(i)));
          loop(
              i64(0), chunks,
              [&](Value* ch) {
                Value* x0 = b_.CreateMul(ch, i64(chunk_));
                Value* mask[2];
                for (int v = 0; v < 2; ++v) {
                  Value* first = b_.CreateAdd(x0, i64(v * lanes_));
                  mask[v] = b_.CreateICmpSLT(b_.CreateAdd(splat(first, lanes_), lane),
                                             splat(cols, lanes_));
                }
                auto c_at = [&](int i, int v) {
                  return b_.CreateAdd(b_.CreateMul(b_.CreateAdd(r0, i64(i)), i64(ldc)),
                                      b_.CreateAdd(x0, i64(v * lanes_)));
                };
                for (int i = 0; i < kTileRows; ++i)
                  for (int v = 0; v < 2; ++v)
                    b_.CreateStore(accumulate ? load(c, c_at(i, v), lanes_) : fconst(0, lanes_),
                                   acc[i][v]);
                loop(
                    i64(0), depth,
                    [&](Value* y) {
                      Value* brow = b_.CreateAdd(b0, b_.CreateMul(y, i64(bs)));
                      Value* bv[2];
                      for (int v = 0; v < 2; ++v)
                        bv[v] = b_.CreateMaskedLoad(
                            vt, at(bm, b_.CreateAdd(brow, b_.CreateAdd(x0, i64(v * lanes_)))),
                            align(), mask[v], fconst(0, lanes_));
                      for (int i = 0; i < kTileRows; ++i) {
                        Value* av = splat(load(a, b_.CreateAdd(rows[i], y)), lanes_);
                        for (int v = 0; v < 2; ++v)
                          b_.CreateStore(fma(av, bv[v], b_.CreateLoad(vt, acc[i][v])), acc[i][v]);
                      }
                    },
                    "y");
                for (int i = 0; i < kTileRows; ++i)
                  for (int v = 0; v < 2; ++v) store(b_.CreateLoad(vt, acc[i][v]), c, c_at(i, v));
              },
              "chunk");
        },
        "tile");
  }

  // The bias of scores (i, j0 + x), x along a vector of w; i and j0 are
  // clamped indices.
  Value* bias_along_keys(Value* i, Value* j0, Value* x, int w) {
    Value* e =
        b_.CreateAdd(bias0_, b_.CreateAdd(b_.CreateMul(i, i64(p_.qstride)),
                                          b_.CreateMul(b_.CreateAdd(j0, x), i64(p_.kstride))));
    return p_.kstride ? load(ptr_[P::Bias], e, w) : splat(load(ptr_[P::Bias], e), w);
  }

  // Element offset of the task's row r (of `rows` rows a group, `width`
  // wide) of group g, rows from `first`; clamped, so rows past the block
  // read a real row (their results are never written).
  Value* row_at(Value* g, Value* first, Value* r, int64_t rows, int64_t width) {
    return b_.CreateMul(
        b_.CreateAdd(b_.CreateMul(g, i64(rows)), min(b_.CreateAdd(first, r), i64(rows - 1))),
        i64(width));
  }
  Value* s_row(Value* r) { return b_.CreateMul(r, i64(cols_)); }  // a row of s_ and t2_

  // The dropout's factors z (0 or 1 / (1 - dropout)) of w scores whose
  // indices in [groups, lq, lk] are first + l * step for lanes l; null
  // without dropout.
  Value* keep(Value* first, int64_t step, int w) {
    if (p_.dropout <= 0) return nullptr;
    Value* counter =
        b_.CreateAdd(splat(b_.CreateAdd(first, offset_), w),
                     step == 1 ? lane_iota(w) : b_.CreateMul(lane_iota(w), splat(i64(step), w)));
    return dropout_factor(b_, math_, p_, counter, with_width(elem_, w));
  }
  Value* times(Value* x, Value* z) { return z ? b_.CreateFMul(x, z) : x; }

  // The task's accumulators to zero (and, for the forward, its row state).
  void init_rows(const std::vector<Value*>& accs, bool softmax_state) {
    loop(
        i64(0), i64(kRows),
        [&](Value* r) {
          if (softmax_state) {
            store(fconst(-INFINITY), m_row_, r);
            store(fconst(0), l_row_, r);
          }
          vloop(
              i64(0), i64(wide_),
              [&](Value* x, int w) {
                for (Value* acc : accs) store(fconst(0, w), acc, b_.CreateAdd(s_row_w(r), x));
              },
              "zero");
        },
        "init");
  }

  // A block of queries [q0, q0 + n) of group g: the forward, dq and the
  // scores' gradient.
  void query_task(Value* g, Value* q0, Value* n) {
    const P::Part part = p_.part;
    const bool grad = part == P::DQ || part == P::DScores;
    const int64_t width = part == P::DQ ? p_.d : p_.dv;
    auto q_row = [&](Value* r) { return row_at(g, q0, r, p_.lq, p_.d); };
    auto do_row = [&](Value* r) { return row_at(g, q0, r, p_.lq, p_.dv); };
    auto s_rows = [&](Value* r) { return s_row(r); };
    init_rows({acc_}, part == P::Out);
    Value* end = i64(p_.lk);
    if (p_.causal) end = min(end, b_.CreateAdd(q0, n));  // keys j <= the block's last query
    Value* blocks = b_.CreateSDiv(b_.CreateAdd(end, i64(cols_ - 1)), i64(cols_));
    loop(
        i64(0), blocks,
        [&](Value* kb) {
          Value* j0 = b_.CreateMul(kb, i64(cols_));
          Value* jn = min(i64(cols_), b_.CreateSub(end, j0));
          gemm(q_row, ptr_[P::Q], i64(p_.d), ptr_[P::KT],
               b_.CreateAdd(b_.CreateMul(g, i64(p_.d * p_.lk)), j0), p_.lk, jn, s_, cols_, false);
          if (grad)
            gemm(do_row, ptr_[P::DOut], i64(p_.dv), ptr_[P::VT],
                 b_.CreateAdd(b_.CreateMul(g, i64(p_.dv * p_.lk)), j0), p_.lk, jn, t2_, cols_,
                 false);
          loop(
              i64(0), i64(kRows),
              [&](Value* r) {
                Value* i = b_.CreateAdd(q0, r);
                Value* ic = min(i, i64(p_.lq - 1));
                Value* srow = s_row(r);
                // the index of score (ic, j0) in [groups, lq, lk]
                Value* score0 = b_.CreateAdd(
                    b_.CreateMul(b_.CreateAdd(b_.CreateMul(g, i64(p_.lq)), ic), i64(p_.lk)), j0);
                auto score = [&](Value* x, int w) {
                  Value* s = fma(load(s_, b_.CreateAdd(srow, x), w), fconst(p_.scale, w),
                                 bias_along_keys(ic, j0, x, w));
                  if (!p_.causal) return s;
                  Value* j = b_.CreateAdd(splat(b_.CreateAdd(j0, x), w), lane_iota(w));
                  return b_.CreateSelect(b_.CreateICmpSGT(j, splat(i, w)), fconst(-INFINITY, w), s);
                };
                if (grad) {
                  Value* qi = b_.CreateAdd(b_.CreateMul(g, i64(p_.lq)), ic);
                  Value* lse = load(ptr_[P::LseIn], qi);
                  Value* delta = load(ptr_[P::Delta], qi);
                  vloop(
                      i64(0), jn,
                      [&](Value* x, int w) {
                        Value* pr =
                            math_.unary(b_, OpKind::Exp, b_.CreateFSub(score(x, w), splat(lse, w)));
                        Value* dp = times(load(t2_, b_.CreateAdd(srow, x), w),
                                          keep(b_.CreateAdd(score0, x), 1, w));
                        Value* ds = b_.CreateFMul(pr, b_.CreateFSub(dp, splat(delta, w)));
                        store(ds, s_, b_.CreateAdd(srow, x));
                      },
                      "ds");
                  if (part == P::DScores)
                    if_row(r, n, [&] {
                      Value* o = b_.CreateAdd(
                          b_.CreateMul(b_.CreateAdd(b_.CreateMul(g, i64(p_.lq)), i), i64(p_.lk)),
                          j0);
                      vloop(
                          i64(0), jn,
                          [&](Value* x, int w) {
                            store(load(s_, b_.CreateAdd(srow, x), w), ptr_[P::Result],
                                  b_.CreateAdd(o, x));
                          },
                          "out");
                    });
                  return;
                }
                // Online softmax: the block's max, the rescale of what came
                // before, then the block's probabilities in place.
                Value* bm = reduce(OpKind::ReduceMax, jn, [&](Value* x, int w) {
                  Value* s = score(x, w);
                  store(s, s_, b_.CreateAdd(srow, x));
                  return s;
                });
                Value* m_old = load(m_row_, r);
                Value* m_new = b_.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, m_old, bm);
                // A row whose scores are all -inf so far subtracts 0, not -inf.
                Value* base =
                    b_.CreateSelect(b_.CreateFCmpOEQ(m_new, fconst(-INFINITY)), fconst(0), m_new);
                Value* corr = math_.unary(b_, OpKind::Exp, b_.CreateFSub(m_old, base));
                Value* sum = reduce(OpKind::ReduceSum, jn, [&](Value* x, int w) {
                  Value* e = math_.unary(
                      b_, OpKind::Exp,
                      b_.CreateFSub(load(s_, b_.CreateAdd(srow, x), w), splat(base, w)));
                  // the output sums the dropped-out probabilities, the sum all
                  store(times(e, keep(b_.CreateAdd(score0, x), 1, w)), s_, b_.CreateAdd(srow, x));
                  return e;
                });
                store(fma(load(l_row_, r), corr, sum), l_row_, r);
                store(m_new, m_row_, r);
                if (part == P::Out)
                  vloop(
                      i64(0), i64(p_.dv),
                      [&](Value* x, int w) {
                        Value* e = b_.CreateAdd(s_row_w(r), x);
                        store(b_.CreateFMul(load(acc_, e, w), splat(corr, w)), acc_, e);
                      },
                      "rescale");
              },
              "row");
          if (part == P::Out)
            gemm(s_rows, s_, jn, ptr_[P::V],
                 b_.CreateMul(b_.CreateAdd(b_.CreateMul(g, i64(p_.lk)), j0), i64(p_.dv)), p_.dv,
                 i64(p_.dv), acc_, wide_, true);
          else if (part == P::DQ)
            gemm(s_rows, s_, jn, ptr_[P::K],
                 b_.CreateMul(b_.CreateAdd(b_.CreateMul(g, i64(p_.lk)), j0), i64(p_.d)), p_.d,
                 i64(p_.d), acc_, wide_, true);
        },
        "kblock");
    // The rows of the block.
    loop(
        i64(0), n,
        [&](Value* r) {
          Value* qi = b_.CreateAdd(b_.CreateMul(g, i64(p_.lq)), b_.CreateAdd(q0, r));
          if (part == P::DScores) {  // keys after the causal end: gradient 0
            Value* o = b_.CreateMul(qi, i64(p_.lk));
            vloop(
                end, i64(p_.lk),
                [&](Value* x, int w) { store(fconst(0, w), ptr_[P::Result], b_.CreateAdd(o, x)); },
                "masked");
            return;
          }
          Value* factor =
              part == P::Out ? b_.CreateFDiv(fconst(1), load(l_row_, r)) : fconst(p_.scale);
          // The forward's rows hold the output, then the log-sum-exp (ops.def).
          Value* o = b_.CreateMul(qi, i64(part == P::Out ? width + 1 : width));
          vloop(
              i64(0), i64(width),
              [&](Value* x, int w) {
                store(b_.CreateFMul(load(acc_, b_.CreateAdd(s_row_w(r), x), w), splat(factor, w)),
                      ptr_[P::Result], b_.CreateAdd(o, x));
              },
              "result");
          if (part == P::Out)
            store(b_.CreateFAdd(load(m_row_, r), math_.unary(b_, OpKind::Log, load(l_row_, r))),
                  ptr_[P::Result], b_.CreateAdd(o, i64(width)));
        },
        "finish");
  }

  // A block of keys [k0, k0 + n) of group g: dk and dv, summed over the
  // queries that see them.
  void key_task(Value* g, Value* k0, Value* n) {
    // dk sums ds . q into acc_, dv sums p . dout into acc2_ (both for DKV).
    const bool dk = p_.part != P::DV, dv = p_.part != P::DK, both = dk && dv;
    auto row_of = [&](Value* r, int64_t w) { return row_at(g, k0, r, p_.lk, w); };
    auto s_rows = [&](Value* r) { return s_row(r); };
    std::vector<Value*> accs;
    if (dk) accs.push_back(acc_);
    if (dv) accs.push_back(acc2_);
    init_rows(accs, false);
    Value* start = p_.causal ? min(k0, i64(p_.lq)) : i64(0);  // queries i >= j see key j
    Value* blocks =
        b_.CreateSDiv(b_.CreateAdd(b_.CreateSub(i64(p_.lq), start), i64(cols_ - 1)), i64(cols_));
    Value* lq_g = b_.CreateMul(g, i64(p_.lq));
    loop(
        i64(0), blocks,
        [&](Value* ib) {
          Value* i0 = b_.CreateAdd(start, b_.CreateMul(ib, i64(cols_)));
          Value* in = min(i64(cols_), b_.CreateSub(i64(p_.lq), i0));
          gemm([&](Value* r) { return row_of(r, p_.d); }, ptr_[P::K], i64(p_.d), ptr_[P::QT],
               b_.CreateAdd(b_.CreateMul(g, i64(p_.d * p_.lq)), i0), p_.lq, in, s_, cols_, false);
          if (dk)
            gemm([&](Value* r) { return row_of(r, p_.dv); }, ptr_[P::V], i64(p_.dv), ptr_[P::DOutT],
                 b_.CreateAdd(b_.CreateMul(g, i64(p_.dv * p_.lq)), i0), p_.lq, in, t2_, cols_,
                 false);
          loop(
              i64(0), i64(kRows),
              [&](Value* r) {
                Value* j = b_.CreateAdd(k0, r);
                Value* jc = min(j, i64(p_.lk - 1));
                Value* srow = s_row(r);
                Value* bias_j = b_.CreateAdd(bias0_, b_.CreateMul(jc, i64(p_.kstride)));
                if (p_.qstride)  // the bias varies along the queries: added one by one
                  loop(
                      i64(0), in,
                      [&](Value* x) {
                        Value* e = b_.CreateAdd(srow, x);
                        Value* bi = b_.CreateAdd(
                            bias_j, b_.CreateMul(b_.CreateAdd(i0, x), i64(p_.qstride)));
                        store(fma(load(s_, e), fconst(p_.scale), load(ptr_[P::Bias], bi)), s_, e);
                      },
                      "bias");
                Value* bias = p_.qstride ? nullptr : load(ptr_[P::Bias], bias_j);
                vloop(
                    i64(0), in,
                    [&](Value* x, int w) {
                      Value* e = b_.CreateAdd(srow, x);
                      Value* s = load(s_, e, w);
                      if (bias) s = fma(s, fconst(p_.scale, w), splat(bias, w));
                      Value* i = b_.CreateAdd(splat(b_.CreateAdd(i0, x), w), lane_iota(w));
                      if (p_.causal)
                        s = b_.CreateSelect(b_.CreateICmpSLT(i, splat(j, w)), fconst(-INFINITY, w),
                                            s);
                      Value* qi = b_.CreateAdd(lq_g, b_.CreateAdd(i0, x));
                      Value* pr = math_.unary(b_, OpKind::Exp,
                                              b_.CreateFSub(s, load(ptr_[P::LseIn], qi, w)));
                      // score (i0 + x, jc) is at (qi lk + jc) in [groups, lq, lk]
                      Value* z = keep(b_.CreateAdd(b_.CreateMul(qi, i64(p_.lk)), jc), p_.lk, w);
                      Value* ds = nullptr;
                      if (dk)
                        ds = b_.CreateFMul(pr, b_.CreateFSub(times(load(t2_, e, w), z),
                                                             load(ptr_[P::Delta], qi, w)));
                      // s_ gets the block's z p (dv) or ds (dk alone); t2_ ds when both
                      store(dv ? times(pr, z) : ds, s_, e);
                      if (both) store(ds, t2_, e);
                    },
                    "p");
              },
              "row");
          Value* src0 = b_.CreateAdd(lq_g, i0);
          if (dk)
            gemm(s_rows, both ? t2_ : s_, in, ptr_[P::Q], b_.CreateMul(src0, i64(p_.d)), p_.d,
                 i64(p_.d), acc_, wide_, true);
          if (dv)
            gemm(s_rows, s_, in, ptr_[P::DOut], b_.CreateMul(src0, i64(p_.dv)), p_.dv, i64(p_.dv),
                 acc2_, wide_, true);
        },
        "qblock");
    // The rows of the block: dk (scaled) and/or dv, side by side for DKV.
    const int64_t row_width = (dk ? p_.d : 0) + (dv ? p_.dv : 0);
    loop(
        i64(0), n,
        [&](Value* r) {
          Value* o = b_.CreateMul(b_.CreateAdd(b_.CreateMul(g, i64(p_.lk)), b_.CreateAdd(k0, r)),
                                  i64(row_width));
          auto write = [&](Value* acc, int64_t width, double factor, Value* at) {
            vloop(
                i64(0), i64(width),
                [&](Value* x, int w) {
                  store(b_.CreateFMul(load(acc, b_.CreateAdd(s_row_w(r), x), w), fconst(factor, w)),
                        ptr_[P::Result], b_.CreateAdd(at, x));
                },
                "result");
          };
          if (dk) write(acc_, p_.d, p_.scale, o);
          if (dv) write(acc2_, p_.dv, 1.0, dk ? b_.CreateAdd(o, i64(p_.d)) : o);
        },
        "finish");
  }

  Value* s_row_w(Value* r) { return b_.CreateMul(r, i64(wide_)); }  // a row of acc_
  Value* lane_iota(int w) {
    if (w == 1) return i64(0);
    std::vector<llvm::Constant*> v;
    for (int l = 0; l < w; ++l) v.push_back(b_.getInt64(l));
    return llvm::ConstantVector::get(v);
  }
  void if_row(Value* r, Value* n, const std::function<void()>& body) {
    auto* yes = llvm::BasicBlock::Create(m_.getContext(), "row_in", f_);
    auto* next = llvm::BasicBlock::Create(m_.getContext(), "row_next", f_);
    b_.CreateCondBr(b_.CreateICmpSLT(r, n), yes, next);
    b_.SetInsertPoint(yes);
    body();
    b_.CreateBr(next);
    b_.SetInsertPoint(next);
  }

  llvm::Module& m_;
  const Kernel& k_;
  const P p_;
  const CpuTarget& t_;
  MathProvider& math_;
  llvm::IRBuilder<> b_;
  llvm::Function* f_ = nullptr;
  llvm::Type* elem_ = nullptr;
  int lanes_ = 1;
  int64_t chunk_ = 2, cols_ = 64, wide_ = 0;
  Value* ptr_[P::kOperands] = {};
  Value *s_ = nullptr, *t2_ = nullptr, *m_row_ = nullptr, *l_row_ = nullptr, *acc_ = nullptr,
        *acc2_ = nullptr;
  Value* bias0_ = nullptr;
  Value* offset_ = nullptr;  // the dropout's counter offset
};

}  // namespace

llvm::Function* emit_attention_cpu(llvm::Module& m, const Kernel& k, const CpuTarget& t,
                                   MathProvider& math, abi::CpuRange& shape) {
  return AttentionEmitter(m, k, t, math).emit(shape);
}
llvm::Function* emit_attention_grad_cpu(llvm::Module& m, const Kernel& k, const CpuTarget& t,
                                        MathProvider& math, abi::CpuRange& shape) {
  return AttentionEmitter(m, k, t, math).emit(shape);
}

}  // namespace flowjit::codegen::cpu
