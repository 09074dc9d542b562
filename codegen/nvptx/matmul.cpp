// GPU lowering of MatMul kernels: one thread block per (batch, BM x BN) output
// tile, operands staged through shared memory, the epilogue evaluated per
// output element from the accumulator registers.
//
// The K loop is software-pipelined through registers:
//   fetch tile 0 -> registers
//   for each K tile: registers -> shared; barrier; fetch the next tile into
//                    registers (in flight during the math); math on shared;
//                    barrier
// Tiles are zero-filled beyond M, N and K, so the math is always whole.
//
// Implicit-GEMM operands (convolutions; kernel.h, MatMulSpec digits) are
// fetched element by element: the flat row and column indices split into
// their digits, the offset and the guarded coordinates are affine in the
// digits, and an element whose coordinates are out of range is staged as 0.
// Index arithmetic is 32-bit when the buffer and extents allow. Plain
// operands keep their strided fetch.
//
// Two kinds of math:
//  * FMA (exact; every dtype): a (BM/TM) x (BN/TN) grid of threads, thread
//    (tx, ty) owning rows ty + i*BM/TM and columns tx + j*BN/TN (strided, so
//    shared reads are conflict-free and epilogue stores coalesce).
//  * TF32 tensor cores (float32 with allow_tf32, sm_80+): warps own 16 x 8
//    mma.sync.m16n8k8 tiles; operands are rounded to TF32 (cvt.rna) when
//    staged, accumulation is FP32. Fragment layouts follow the PTX ISA:
//      A (16x8, row): a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4)
//      B (8x8, col):  b0 (k=t, n=g) b1 (k=t+4, n=g)
//      C (16x8):      c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1)
//    with g = lane / 4 and t = lane % 4. Shared rows are padded (A by 4, B
//    by 8 words) so fragment reads hit 32 distinct banks.
//  * float16/bfloat16 tensor cores (sm_80+): warps own 16 x 8
//    mma.sync.m16n8k16 tiles on the operands' bits, accumulation FP32. A
//    register holds two k-consecutive elements (the first in its low half):
//      A (16x16, row): a0 (g, 2t..) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)
//      B (16x8, col):  b0 (k=2t.., n=g) b1 (k=2t+8.., n=g)
//    C as above. Shared memory holds A as [m][k] and B as [n][k] (k
//    contiguous, rows 48 bytes apart), so the fragments are 8x8 matrices of
//    16-byte rows that ldmatrix.x4 loads, four per instruction (lane l gives
//    the address of row l % 8 of matrix l / 8): A's 16x16 as (rows 0-7,
//    k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15), and two mma tiles' B as
//    (n 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15). Before sm_80,
//    half operands take the FMA path, converted to float32 when fetched.
//    When both operands are contiguous along k with rows, offsets and batch
//    strides of whole 16-byte chunks (a dense layer's x @ W^T), tiles move
//    global -> shared by cp.async (16 bytes, zero-filled past M, N and K)
//    through kStages buffers: the copies of the next kStages - 1 tiles are
//    in flight while one is multiplied; otherwise through registers as
//    above.
//  Half results are rounded to their type before the epilogue, as a float32
//  matmul cast to the half type (jit/passes/widen_half, which the CPU uses).
#include <llvm/IR/IntrinsicsNVPTX.h>

#include <algorithm>
#include <cstdlib>

#include "codegen/nvptx/nvptx_codegen.h"
#include "ir/error.h"

namespace flowjit::codegen::nvptx {

using llvm::Value;

namespace {

// Shared-memory buffers of the cp.async pipeline (half mma).
constexpr int kStages = 3;

struct TileConfig {
  bool tensor_cores = false;
  // The tensor-core kind: TF32 (float32 operands), or mma.m16n8k16 on
  // float16/bfloat16 operands.
  enum class Mma : uint8_t { Tf32, Half } mma = Mma::Tf32;
  int bm = 64, bn = 64, bk = 16;
  int tm = 4, tn = 4;            // FMA: elements per thread along m and n
  int warps_m = 2, warps_n = 2;  // tensor cores: warp grid; warp tile = (bm/warps_m) x (bn/warps_n)
  int pad_a = 4, pad_b = 4;
  int threads() const { return tensor_cores ? warps_m * warps_n * kWarp : (bm / tm) * (bn / tn); }
};

TileConfig choose_tiles(const MatMulSpec& mm, DType dt, const GpuTarget& t) {
  TileConfig c;
  bool big = mm.m >= 128 && mm.n >= 128;
  if (ir::is_half(dt) && t.sm >= 80) {
    c.tensor_cores = true;
    c.mma = TileConfig::Mma::Half;
    c.bk = 16;
    c.pad_a = c.pad_b = 8;  // 16-bit elements: rows 24 halves (48 bytes) apart
    if (big) {
      c.bm = c.bn = 128;
      c.warps_m = 2;
      c.warps_n = 4;
    } else {
      c.bm = c.bn = 64;
      c.warps_m = c.warps_n = 2;
    }
    return c;
  }
  if (dt == DType::Float32 && t.allow_tf32 && t.has_tensor_cores_tf32()) {
    c.tensor_cores = true;
    c.bk = 16;
    c.pad_a = 4;
    c.pad_b = 8;
    if (big) {
      c.bm = c.bn = 128;
      c.warps_m = 2;
      c.warps_n = 4;  // warp tile 64 x 32
    } else {
      c.bm = c.bn = 64;
      c.warps_m = c.warps_n = 2;  // warp tile 32 x 32
    }
    return c;
  }
  if (big && ir::dtype_bytes(dt) <= 4) {
    c.bm = c.bn = 128;
    c.bk = 8;
    c.tm = c.tn = 8;
  }
  return c;
}

class MatMulEmitter {
 public:
  MatMulEmitter(llvm::Module& m, const Kernel& k, const GpuTarget& t, MathProvider& math)
      : m_(m), k_(k), t_(t), math_(math), b_(m.getContext()), mm_(k.mm) {
    FJ_CHECK(k.rank() >= 2, "matmul kernel ", k.name, " has rank ", k.rank());
    FJ_CHECK((mm_.plain(0) || !mm_.a_rows.empty()) && (mm_.plain(1) || !mm_.b_rows.empty()),
             "matmul kernel ", k.name, ": operand strides must be (batch, row, col) or digits");
    dt_ = k.args.at(mm_.a.arg).dtype;
    is_float_ = ir::is_float(dt_);
    half_ = ir::is_half(dt_);
    cfg_ = choose_tiles(mm_, dt_, t);
    half_mma_ = cfg_.tensor_cores && cfg_.mma == TileConfig::Mma::Half;
    // 16-byte chunks of 8 elements along k, every one aligned (buffers are).
    auto chunked = [](const Access& a, int k_dim) {
      int other = 3 - k_dim;
      return a.strides.size() == 3 && a.strides[k_dim] == 1 && a.strides[other] % 8 == 0 &&
             a.strides[0] % 8 == 0 && a.offset % 8 == 0;
    };
    async_ = half_mma_ && mm_.plain(0) && mm_.plain(1) && chunked(mm_.a, 2) && chunked(mm_.b, 1);
  }

  llvm::Function* emit(abi::GpuGrid& launch, KernelNotes& notes) {
    llvm::LLVMContext& c = m_.getContext();
    f_ = declare_kernel(m_, k_, cfg_.threads());
    b_.SetInsertPoint(llvm::BasicBlock::Create(c, "entry", f_));
    for (auto& a : f_->args()) ptrs_.push_back(&a);
    e_ = std::make_unique<ExprEmitter>(k_, b_, math_, ptrs_);
    et_ = mem_type(c, dt_);  // an element in global memory
    ct_ = reg_type(c, dt_);  // the FMA path's arithmetic (float32 for the half types)
    // What shared memory holds: TF32 bits, half bits, or the arithmetic type.
    st_ = !cfg_.tensor_cores ? ct_ : half_mma_ ? b_.getInt16Ty() : b_.getInt32Ty();

    tiles_m_ = ceil_div(mm_.m, cfg_.bm);
    tiles_n_ = ceil_div(mm_.n, cfg_.bn);
    int64_t blocks = mm_.batch * tiles_m_ * tiles_n_;
    FJ_USER_CHECK(blocks < (int64_t{1} << 31), ErrorKind::NotImplemented, "matmul ", k_.name,
                  ": too many output tiles for one GPU launch (", blocks, ")");
    launch.grid[0] = static_cast<uint32_t>(std::max<int64_t>(blocks, 1));
    launch.block[0] = static_cast<uint32_t>(cfg_.threads());
    bool implicit = !mm_.plain(0) || !mm_.plain(1);
    notes.mapping = std::string(implicit ? "implicit-gemm " : "matmul ") +
                    (half_mma_           ? std::string(ir::dtype_name(dt_)) + " mma "
                     : cfg_.tensor_cores ? std::string("tf32 mma ")
                                         : std::string("fma ")) +
                    std::to_string(cfg_.bm) + "x" + std::to_string(cfg_.bn) + "x" +
                    std::to_string(cfg_.bk);

    lda_ = cfg_.tensor_cores ? cfg_.bk + cfg_.pad_a : cfg_.bm + cfg_.pad_a;
    // B: [k][n], or [n][k] for the half mma (its registers pair k values).
    ldb_ = half_mma_ ? cfg_.bk + cfg_.pad_b : cfg_.bn + cfg_.pad_b;
    a_cells_ = cfg_.tensor_cores ? int64_t{cfg_.bm} * lda_ : int64_t{cfg_.bk} * lda_;
    b_cells_ = half_mma_ ? int64_t{cfg_.bn} * ldb_ : int64_t{cfg_.bk} * ldb_;
    const int stages = async_ ? kStages : 1;
    int64_t a_cells = a_cells_ * stages, b_cells = b_cells_ * stages;
    as_ = shared_array(m_, k_.name + ".a", st_, a_cells);
    bs_ = shared_array(m_, k_.name + ".b", st_, b_cells);
    notes.static_shared_bytes =
        static_cast<uint32_t>((a_cells + b_cells) * (st_->getPrimitiveSizeInBits() / 8));

    if (blocks == 0) {  // an empty output: nothing to compute or store
      b_.CreateRetVoid();
      return f_;
    }
    // Which output tile this block computes.
    tid_ = thread_idx(b_);
    Value* tile = b_.CreateZExt(block_idx(b_), b_.getInt64Ty());
    Value* per_batch = i64(tiles_m_ * tiles_n_);
    bi_ = b_.CreateUDiv(tile, per_batch);
    Value* rem = b_.CreateURem(tile, per_batch);
    m0_ = b_.CreateMul(b_.CreateUDiv(rem, i64(tiles_n_)), i64(cfg_.bm));
    n0_ = b_.CreateMul(b_.CreateURem(rem, i64(tiles_n_)), i64(cfg_.bn));
    if (mm_.plain(0))
      a_base_ =
          b_.CreateGEP(et_, ptrs_.at(mm_.a.arg),
                       b_.CreateAdd(i64(mm_.a.offset), b_.CreateMul(bi_, i64(mm_.a.strides[0]))));
    else
      setup_digits(0);
    if (mm_.plain(1))
      b_base_ =
          b_.CreateGEP(et_, ptrs_.at(mm_.b.arg),
                       b_.CreateAdd(i64(mm_.b.offset), b_.CreateMul(bi_, i64(mm_.b.strides[0]))));
    else
      setup_digits(1);
    // The batch dims of the domain, row-major in bi_, for the epilogue.
    batch_idx_.assign(static_cast<size_t>(k_.rank() - 2), nullptr);
    Value* rest = bi_;
    for (int d = k_.rank() - 3; d >= 0; --d) {
      if (d == 0) {
        batch_idx_[0] = rest;
      } else {
        batch_idx_[d] = b_.CreateURem(rest, i64(k_.domain[d]));
        rest = b_.CreateUDiv(rest, i64(k_.domain[d]));
      }
    }

    a_stage_ = b_stage_ = i32(0);
    init_accumulators();
    if (async_) {
      notes.mapping += " cp.async x" + std::to_string(kStages);
      emit_async_k_loop();
    } else {
      emit_k_loop();
    }
    emit_epilogue();
    b_.CreateRetVoid();
    return f_;
  }

 private:
  static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
  Value* i64(int64_t v) { return b_.getInt64(v); }
  Value* i32(int64_t v) { return b_.getInt32(static_cast<uint32_t>(v)); }
  Value* zero() { return llvm::Constant::getNullValue(et_); }

  // ---------------------------------------------------------------- staging

  // One operand tile: rows x cols of the operand seen as (row, col) with
  // strides (sr, sc) from `base`, valid below (limit_r, limit_c) in global
  // coordinates starting at (r0, c0). Each thread moves `count` elements.
  struct TileLoad {
    Value* base;
    int64_t sr, sc;
    int rows, cols;
    int64_t limit_r, limit_c;
    llvm::GlobalVariable* smem;
    int64_t ld_r, ld_c;  // shared index = r * ld_r + c * ld_c
    std::vector<llvm::AllocaInst*> regs;
    int operand = -1;  // 0 or 1 for an implicit-GEMM operand (dig_), else -1 (base, sr, sc)
  };

  // An implicit-GEMM operand: index dims {batch digits..., row digits...,
  // col digits...}, with strides and coordinates per index dim.
  struct DigitOperand {
    const Access* acc = nullptr;
    std::vector<int64_t> rows, cols;  // digit extents of the row and the column index
    size_t nbatch = 0;
    llvm::Type* it = nullptr;  // index arithmetic: i32 when every value fits
    Value* off0 = nullptr;     // offset plus the batch digits' part (per block)
    std::vector<Value*> c0;    // per coordinate: c0 plus the batch digits' part
  };

  Value* ci(const DigitOperand& o, int64_t v) {
    return llvm::ConstantInt::get(o.it, static_cast<uint64_t>(v), true);
  }

  // Digits of `flat` over `ext`, row-major (the first takes what remains).
  std::vector<Value*> split(const DigitOperand& o, Value* flat, const std::vector<int64_t>& ext) {
    std::vector<Value*> d(ext.size());
    for (size_t i = ext.size(); i-- > 0;) {
      if (i == 0) {
        d[0] = flat;
      } else {
        d[i] = b_.CreateURem(flat, ci(o, ext[i]));
        flat = b_.CreateUDiv(flat, ci(o, ext[i]));
      }
    }
    return d;
  }

  // acc += sum over dims [first, first + v.size()) of v[i] * coef[first + i].
  Value* add_terms(const DigitOperand& o, Value* acc, const std::vector<int64_t>& coef,
                   size_t first, const std::vector<Value*>& v) {
    for (size_t i = 0; i < v.size(); ++i) {
      int64_t c = coef[first + i];
      if (c == 0) continue;
      acc = b_.CreateAdd(acc, c == 1 ? v[i] : b_.CreateMul(v[i], ci(o, c)));
    }
    return acc;
  }

  // The per-block part of operand `operand`'s addressing: the batch digits.
  void setup_digits(int operand) {
    DigitOperand& o = dig_[operand];
    o.acc = operand == 0 ? &mm_.a : &mm_.b;
    o.rows = operand == 0 ? mm_.a_rows : mm_.b_rows;
    o.cols = operand == 0 ? mm_.a_cols : mm_.b_cols;
    std::vector<int64_t> batch = mm_.batch_digits;
    if (batch.empty()) batch = {mm_.batch};
    o.nbatch = batch.size();
    size_t dims = o.nbatch + o.rows.size() + o.cols.size();
    FJ_CHECK(!o.rows.empty() && !o.cols.empty() && o.acc->strides.size() == dims, "matmul kernel ",
             k_.name, ": operand ", operand,
             " needs row and column digits and one stride per index dim (", o.acc->strides.size(),
             " for ", dims, ")");
    bool narrow = k_.args.at(o.acc->arg).elements < (int64_t{1} << 30) && mm_.m < (1 << 30) &&
                  mm_.n < (1 << 30) && mm_.k < (1 << 30) && mm_.batch < (1 << 30);
    for (const Coord& c : o.acc->coords) {
      FJ_CHECK(c.coef.size() == dims, "matmul kernel ", k_.name, ": coordinate of operand ",
               operand);
      narrow &= std::abs(c.c0) < (1 << 28) && c.limit * c.div < (1 << 28);
    }
    o.it = narrow ? b_.getInt32Ty() : b_.getInt64Ty();
    std::vector<Value*> bd = split(o, b_.CreateIntCast(bi_, o.it, false), batch);
    o.off0 = add_terms(o, ci(o, o.acc->offset), o.acc->strides, 0, bd);
    o.c0.clear();
    for (const Coord& c : o.acc->coords) o.c0.push_back(add_terms(o, ci(o, c.c0), c.coef, 0, bd));
  }

  // The element offset per unit step of the last row (or column) digit of
  // an implicit-GEMM operand, for choosing which way threads walk a tile.
  int64_t unit_step(const DigitOperand& o, bool row) const {
    size_t d = o.nbatch + o.rows.size() + (row ? 0 : o.cols.size()) - 1;
    int64_t s = o.acc->strides[d];
    for (const Coord& c : o.acc->coords)
      if (c.div == 1) s += c.coef[d] * c.stride;
    return s;
  }

  int per_thread(const TileLoad& t) const { return t.rows * t.cols / cfg_.threads(); }

  // The tile coordinates of this thread's e-th element: consecutive threads
  // walk the operand's contiguous dimension.
  std::pair<Value*, Value*> tile_coord(const TileLoad& t, int e) {
    Value* l = b_.CreateAdd(tid_, i32(int64_t{e} * cfg_.threads()));
    bool fast_rows = t.sc != 1 && t.sr == 1;
    if (fast_rows) return {b_.CreateURem(l, i32(t.rows)), b_.CreateUDiv(l, i32(t.rows))};
    return {b_.CreateUDiv(l, i32(t.cols)), b_.CreateURem(l, i32(t.cols))};
  }

  // Global -> registers, zero outside the operand.
  void fetch(TileLoad& t, Value* r0, Value* c0) {
    for (int e = 0; e < per_thread(t); ++e) {
      auto [r, c] = tile_coord(t, e);
      Value* gr = b_.CreateAdd(r0, b_.CreateZExt(r, b_.getInt64Ty()));
      Value* gc = b_.CreateAdd(c0, b_.CreateZExt(c, b_.getInt64Ty()));
      // A bound is needed only where the tile can overhang the extent.
      bool bound_r = t.limit_r % t.rows != 0, bound_c = t.limit_c % t.cols != 0;
      Value* v;
      if (t.operand >= 0) {
        v = load_digits(dig_[t.operand], t.operand, gr, gc,
                        bound_r ? b_.CreateICmpSLT(gr, i64(t.limit_r)) : nullptr,
                        bound_c ? b_.CreateICmpSLT(gc, i64(t.limit_c)) : nullptr);
      } else {
        Value* ok = b_.getTrue();
        if (bound_r) ok = b_.CreateAnd(ok, b_.CreateICmpSLT(gr, i64(t.limit_r)));
        if (bound_c) ok = b_.CreateAnd(ok, b_.CreateICmpSLT(gc, i64(t.limit_c)));
        if (auto* k = llvm::dyn_cast<llvm::ConstantInt>(ok); k && k->isOne()) {
          v = load_at(t, gr, gc);
        } else {
          Value* sgr = b_.CreateSelect(ok, gr, i64(0));
          Value* sgc = b_.CreateSelect(ok, gc, i64(0));
          v = b_.CreateSelect(ok, load_at(t, sgr, sgc), zero());
        }
      }
      b_.CreateStore(to_shared(v), t.regs[e]);
    }
  }

  // A fetched element (global memory's type) as shared memory holds it.
  Value* to_shared(Value* v) {
    if (half_mma_) return dt_ == DType::Float16 ? b_.CreateBitCast(v, b_.getInt16Ty()) : v;
    if (cfg_.tensor_cores)
      return b_.CreateIntrinsic(b_.getInt32Ty(), llvm::Intrinsic::nvvm_f2tf32_rna, {v});
    return half_ ? from_mem(b_, v, dt_) : v;
  }

  Value* load_at(const TileLoad& t, Value* gr, Value* gc) {
    Value* off = b_.CreateAdd(b_.CreateMul(gr, i64(t.sr)), b_.CreateMul(gc, i64(t.sc)));
    return b_.CreateAlignedLoad(et_, b_.CreateGEP(et_, t.base, off),
                                llvm::Align(ir::dtype_bytes(dt_)));
  }

  // Element (gr, gc) of an implicit-GEMM operand: 0 outside the operand
  // (ok_r, ok_c: row and column bounds, null where the tile cannot overhang)
  // or where a coordinate is out of range. Out-of-range indices and
  // coordinates are clamped to 0, so the address is always inside the
  // buffer and the load needs no branch. Each index is clamped by its own
  // bound and the terms that do not depend on K come first, so the M (or N)
  // side of the address is invariant in the K loop.
  Value* load_digits(const DigitOperand& o, int operand, Value* gr, Value* gc, Value* ok_r,
                     Value* ok_c) {
    if (ok_r) gr = b_.CreateSelect(ok_r, gr, i64(0));
    if (ok_c) gc = b_.CreateSelect(ok_c, gc, i64(0));
    std::vector<Value*> rd = split(o, b_.CreateIntCast(gr, o.it, false), o.rows);
    std::vector<Value*> cd = split(o, b_.CreateIntCast(gc, o.it, false), o.cols);
    size_t row_first = o.nbatch, col_first = o.nbatch + o.rows.size();
    // Operand a's rows are M and b's columns are N: those terms come first.
    auto affine = [&](Value* base, const std::vector<int64_t>& coef) {
      if (operand == 0)
        return add_terms(o, add_terms(o, base, coef, row_first, rd), coef, col_first, cd);
      return add_terms(o, add_terms(o, base, coef, col_first, cd), coef, row_first, rd);
    };
    Value* off = affine(o.off0, o.acc->strides);
    Value* valid = ok_r && ok_c ? b_.CreateAnd(ok_r, ok_c) : ok_r ? ok_r : ok_c;
    for (size_t i = 0; i < o.acc->coords.size(); ++i) {
      const Coord& c = o.acc->coords[i];
      Value* x = affine(o.c0[i], c.coef);
      Value* in =
          b_.CreateAnd(b_.CreateICmpSGE(x, ci(o, 0)), b_.CreateICmpSLT(x, ci(o, c.limit * c.div)));
      Value* q = b_.CreateSelect(in, x, ci(o, 0));
      if (c.div != 1) {
        in = b_.CreateAnd(in, b_.CreateICmpEQ(b_.CreateURem(q, ci(o, c.div)), ci(o, 0)));
        q = b_.CreateSelect(in, b_.CreateUDiv(q, ci(o, c.div)), ci(o, 0));
      }
      off = b_.CreateAdd(off, c.stride == 1 ? q : b_.CreateMul(q, ci(o, c.stride)));
      valid = valid ? b_.CreateAnd(valid, in) : in;
    }
    Value* p = b_.CreateGEP(et_, ptrs_.at(o.acc->arg), b_.CreateSExt(off, b_.getInt64Ty()));
    Value* v = b_.CreateAlignedLoad(et_, p, llvm::Align(ir::dtype_bytes(dt_)));
    return valid ? b_.CreateSelect(valid, v, zero()) : v;
  }

  // Registers -> shared.
  void stage(TileLoad& t) {
    for (int e = 0; e < per_thread(t); ++e) {
      auto [r, c] = tile_coord(t, e);
      Value* idx = b_.CreateAdd(b_.CreateMul(r, i32(t.ld_r)), b_.CreateMul(c, i32(t.ld_c)));
      Value* v = b_.CreateLoad(st_, t.regs[e]);
      b_.CreateStore(v, b_.CreateGEP(st_, t.smem, b_.CreateZExt(idx, b_.getInt64Ty())));
    }
  }

  Value* smem_load(llvm::GlobalVariable* s, Value* idx32) {
    return b_.CreateLoad(st_, b_.CreateGEP(st_, s, b_.CreateZExt(idx32, b_.getInt64Ty())));
  }

  void emit_k_loop() {
    // A is (m, k) with strides (a1, a2); B is (k, n) with strides (b1, b2).
    TileLoad ta{
        a_base_, mm_.a.strides[1], mm_.a.strides[2], cfg_.bm, cfg_.bk, mm_.m, mm_.k, as_, 0, 0, {},
        -1};
    TileLoad tb{b_base_,
                mm_.b.strides[1],
                mm_.b.strides[2],
                cfg_.bk,
                cfg_.bn,
                mm_.k,
                mm_.n,
                bs_,
                ldb_,
                1,
                {},
                -1};
    // Implicit-GEMM operands: threads walk the digit with unit steps.
    for (auto [t, op] : {std::pair<TileLoad*, int>{&ta, 0}, {&tb, 1}}) {
      if (mm_.plain(op)) continue;
      t->operand = op;
      t->base = nullptr;
      t->sr = unit_step(dig_[op], true);
      t->sc = unit_step(dig_[op], false);
    }
    if (half_mma_) {
      tb.ld_r = 1;  // Bs[n][k]
      tb.ld_c = ldb_;
    }
    if (cfg_.tensor_cores) {
      ta.ld_r = lda_;  // As[m][k]
      ta.ld_c = 1;
    } else {
      ta.ld_r = 1;  // As[k][m]
      ta.ld_c = lda_;
    }
    FJ_CHECK(per_thread(ta) * cfg_.threads() == ta.rows * ta.cols &&
                 per_thread(tb) * cfg_.threads() == tb.rows * tb.cols,
             "matmul tile does not divide among the threads");
    for (int e = 0; e < per_thread(ta); ++e) ta.regs.push_back(entry_alloca(f_, st_, "pa"));
    for (int e = 0; e < per_thread(tb); ++e) tb.regs.push_back(entry_alloca(f_, st_, "pb"));

    if (mm_.k == 0) return;  // the accumulators stay zero
    int64_t k_tiles = ceil_div(mm_.k, cfg_.bk);
    fetch(ta, m0_, i64(0));
    fetch(tb, i64(0), n0_);
    emit_for(
        b_, i64(0), i64(k_tiles), i64(1),
        [&](Value* kt) {
          stage(ta);
          stage(tb);
          barrier(b_);
          // Prefetch the next K tile while this one is multiplied.
          Value* next = b_.CreateAdd(kt, i64(1));
          auto* pre = llvm::BasicBlock::Create(m_.getContext(), "prefetch", f_);
          auto* math = llvm::BasicBlock::Create(m_.getContext(), "math", f_);
          b_.CreateCondBr(b_.CreateICmpSLT(next, i64(k_tiles)), pre, math);
          b_.SetInsertPoint(pre);
          Value* k0 = b_.CreateMul(next, i64(cfg_.bk));
          fetch(ta, m0_, k0);
          fetch(tb, k0, n0_);
          b_.CreateBr(math);
          b_.SetInsertPoint(math);
          if (half_mma_) {
            emit_half_mma_math();
          } else if (cfg_.tensor_cores) {
            emit_mma_math();
          } else {
            emit_fma_math();
          }
          barrier(b_);
        },
        "kt");
  }

  // ---------------------------------------------------------------- cp.async

  // This thread's cp.async copies of K tile `kt` (i64) of one operand into
  // stage `stage` (i32): `rows` rows (m of A, n of B) of bk elements, as
  // 16-byte chunks (8 elements) at row * ld + chunk * 8 of the stage;
  // global element (r0 + row, k) is at base + row * row_stride + k. Chunks
  // past the rows or K are zero-filled (src-size 0 or the valid bytes).
  void issue_tile(llvm::GlobalVariable* smem, int64_t cells, int64_t ld, Value* base,
                  int64_t row_stride, Value* r0, int64_t limit_r, Value* kt, Value* stage,
                  int rows) {
    const int per_row = cfg_.bk / 8, chunks = rows * per_row;
    FJ_CHECK(chunks % cfg_.threads() == 0, "matmul ", k_.name, ": cp.async chunks do not divide");
    llvm::Function* cp =
        llvm::Intrinsic::getDeclaration(&m_, llvm::Intrinsic::nvvm_cp_async_cg_shared_global_16_s);
    llvm::Type* gptr = cp->getFunctionType()->getParamType(1);
    Value* k0 = b_.CreateMul(kt, i64(cfg_.bk));
    for (int e = 0; e < chunks / cfg_.threads(); ++e) {
      Value* c = b_.CreateAdd(tid_, i32(int64_t{e} * cfg_.threads()));
      Value* row = b_.CreateUDiv(c, i32(per_row));
      Value* kc = b_.CreateMul(b_.CreateURem(c, i32(per_row)), i32(8));
      Value* gr = b_.CreateAdd(r0, b_.CreateZExt(row, b_.getInt64Ty()));
      Value* gk = b_.CreateAdd(k0, b_.CreateZExt(kc, b_.getInt64Ty()));
      // Valid elements of the chunk: 0 past the rows, else min(8, K - k).
      Value* left = b_.CreateSub(i64(mm_.k), gk);
      Value* n = b_.CreateSelect(b_.CreateICmpSLT(left, i64(8)), left, i64(8));
      n = b_.CreateSelect(b_.CreateICmpSLT(n, i64(0)), i64(0), n);
      n = b_.CreateSelect(b_.CreateICmpSLT(gr, i64(limit_r)), n, i64(0));
      // A chunk with nothing to read reads from the operand's start (valid).
      Value* off = b_.CreateSelect(b_.CreateICmpSGT(n, i64(0)),
                                   b_.CreateAdd(b_.CreateMul(gr, i64(row_stride)), gk), i64(0));
      Value* src = b_.CreateAddrSpaceCast(b_.CreateGEP(et_, base, off), gptr);
      Value* cell = b_.CreateAdd(b_.CreateMul(stage, i32(cells)),
                                 b_.CreateAdd(b_.CreateMul(row, i32(ld)), kc));
      Value* dst = b_.CreateGEP(st_, smem, b_.CreateZExt(cell, b_.getInt64Ty()));
      b_.CreateCall(cp, {dst, src, b_.CreateTrunc(b_.CreateMul(n, i64(2)), b_.getInt32Ty())});
    }
  }

  void issue_tiles(Value* kt, Value* stage) {
    issue_tile(as_, a_cells_, lda_, a_base_, mm_.a.strides[1], m0_, mm_.m, kt, stage, cfg_.bm);
    issue_tile(bs_, b_cells_, ldb_, b_base_, mm_.b.strides[2], n0_, mm_.n, kt, stage, cfg_.bn);
  }

  void commit() { b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_commit_group, {}, {}); }

  // kStages - 1 tiles in flight: at tile kt, wait until its copies (this
  // thread's) are done, barrier (everyone's), start tile kt + kStages - 1
  // into the buffer tile kt - 1 used (all threads are past its math), then
  // multiply tile kt. A group is committed every iteration, empty or not,
  // so wait_group's count always means the same tiles.
  void emit_async_k_loop() {
    if (mm_.k == 0) return;  // the accumulators stay zero
    const int64_t k_tiles = ceil_div(mm_.k, cfg_.bk);
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_tiles) issue_tiles(i64(s), i32(s));
      commit();
    }
    emit_for(
        b_, i64(0), i64(k_tiles), i64(1),
        [&](Value* kt) {
          b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_wait_group, {}, {i32(kStages - 2)});
          barrier(b_);
          Value* next = b_.CreateAdd(kt, i64(kStages - 1));
          auto* pre = llvm::BasicBlock::Create(m_.getContext(), "issue", f_);
          auto* math = llvm::BasicBlock::Create(m_.getContext(), "math", f_);
          b_.CreateCondBr(b_.CreateICmpSLT(next, i64(k_tiles)), pre, math);
          b_.SetInsertPoint(pre);
          issue_tiles(next, b_.CreateTrunc(b_.CreateURem(next, i64(kStages)), b_.getInt32Ty()));
          b_.CreateBr(math);
          b_.SetInsertPoint(math);
          commit();
          Value* stage = b_.CreateTrunc(b_.CreateURem(kt, i64(kStages)), b_.getInt32Ty());
          a_stage_ = b_.CreateMul(stage, i32(a_cells_));
          b_stage_ = b_.CreateMul(stage, i32(b_cells_));
          emit_half_mma_math();
        },
        "kt");
  }

  // ---------------------------------------------------------------- FMA math

  int fma_tx_count() const { return cfg_.bn / cfg_.tn; }
  int fma_ty_count() const { return cfg_.bm / cfg_.tm; }

  void init_accumulators() {
    int n = cfg_.tensor_cores ? mma_mi() * mma_ni() * 4 : cfg_.tm * cfg_.tn;
    llvm::Type* at = cfg_.tensor_cores ? b_.getFloatTy() : ct_;
    for (int i = 0; i < n; ++i) {
      acc_.push_back(entry_alloca(f_, at, "acc"));
      b_.CreateStore(llvm::Constant::getNullValue(at), acc_.back());
    }
  }

  Value* madd(Value* a, Value* b, Value* c) {
    if (is_float_) return b_.CreateIntrinsic(llvm::Intrinsic::fma, {a->getType()}, {a, b, c});
    return b_.CreateAdd(b_.CreateMul(a, b), c);
  }

  void emit_fma_math() {
    Value* tx = b_.CreateURem(tid_, i32(fma_tx_count()));
    Value* ty = b_.CreateUDiv(tid_, i32(fma_tx_count()));
    std::vector<Value*> acc(acc_.size());
    for (size_t i = 0; i < acc_.size(); ++i) acc[i] = b_.CreateLoad(ct_, acc_[i]);
    for (int kk = 0; kk < cfg_.bk; ++kk) {
      std::vector<Value*> av(cfg_.tm), bv(cfg_.tn);
      for (int i = 0; i < cfg_.tm; ++i)
        av[i] =
            smem_load(as_, b_.CreateAdd(ty, i32(int64_t{kk} * lda_ + int64_t{i} * fma_ty_count())));
      for (int j = 0; j < cfg_.tn; ++j)
        bv[j] =
            smem_load(bs_, b_.CreateAdd(tx, i32(int64_t{kk} * ldb_ + int64_t{j} * fma_tx_count())));
      for (int i = 0; i < cfg_.tm; ++i)
        for (int j = 0; j < cfg_.tn; ++j)
          acc[i * cfg_.tn + j] = madd(av[i], bv[j], acc[i * cfg_.tn + j]);
    }
    for (size_t i = 0; i < acc_.size(); ++i) b_.CreateStore(acc[i], acc_[i]);
  }

  // ---------------------------------------------------------------- mma math

  int warp_tile_m() const { return cfg_.bm / cfg_.warps_m; }
  int warp_tile_n() const { return cfg_.bn / cfg_.warps_n; }
  int mma_mi() const { return warp_tile_m() / 16; }
  int mma_ni() const { return warp_tile_n() / 8; }

  struct WarpCoords {
    Value* g;   // lane / 4
    Value* t;   // lane % 4
    Value* rb;  // first row of the warp tile within the block tile
    Value* cb;  // first column
  };
  WarpCoords warp_coords() {
    Value* warp = b_.CreateUDiv(tid_, i32(kWarp));
    Value* lane = b_.CreateURem(tid_, i32(kWarp));
    WarpCoords w;
    w.g = b_.CreateUDiv(lane, i32(4));
    w.t = b_.CreateURem(lane, i32(4));
    w.rb = b_.CreateMul(b_.CreateUDiv(warp, i32(cfg_.warps_n)), i32(warp_tile_m()));
    w.cb = b_.CreateMul(b_.CreateURem(warp, i32(cfg_.warps_n)), i32(warp_tile_n()));
    return w;
  }

  void emit_mma_math() {
    WarpCoords w = warp_coords();
    std::vector<Value*> acc(acc_.size());
    for (size_t i = 0; i < acc_.size(); ++i) acc[i] = b_.CreateLoad(b_.getFloatTy(), acc_[i]);
    for (int kk = 0; kk < cfg_.bk; kk += 8) {
      std::vector<std::array<Value*, 4>> a(mma_mi());
      std::vector<std::array<Value*, 2>> bf(mma_ni());
      for (int mi = 0; mi < mma_mi(); ++mi) {
        Value* row = b_.CreateAdd(w.rb, b_.CreateAdd(w.g, i32(mi * 16)));
        auto at = [&](Value* r, int dk) {
          return smem_load(
              as_, b_.CreateAdd(b_.CreateMul(r, i32(lda_)), b_.CreateAdd(w.t, i32(kk + dk))));
        };
        Value* row8 = b_.CreateAdd(row, i32(8));
        a[mi] = {at(row, 0), at(row8, 0), at(row, 4), at(row8, 4)};
      }
      for (int ni = 0; ni < mma_ni(); ++ni) {
        Value* col = b_.CreateAdd(w.cb, b_.CreateAdd(w.g, i32(ni * 8)));
        auto bt = [&](int dk) {
          Value* k = b_.CreateAdd(w.t, i32(kk + dk));
          return smem_load(bs_, b_.CreateAdd(b_.CreateMul(k, i32(ldb_)), col));
        };
        bf[ni] = {bt(0), bt(4)};
      }
      for (int mi = 0; mi < mma_mi(); ++mi)
        for (int ni = 0; ni < mma_ni(); ++ni) {
          int base = (mi * mma_ni() + ni) * 4;
          Value* r =
              b_.CreateIntrinsic(llvm::Intrinsic::nvvm_mma_m16n8k8_row_col_tf32, {},
                                 {a[mi][0], a[mi][1], a[mi][2], a[mi][3], bf[ni][0], bf[ni][1],
                                  acc[base], acc[base + 1], acc[base + 2], acc[base + 3]});
          for (unsigned q = 0; q < 4; ++q) acc[base + q] = b_.CreateExtractValue(r, {q});
        }
    }
    for (size_t i = 0; i < acc_.size(); ++i) b_.CreateStore(acc[i], acc_[i]);
  }

  // ldmatrix.x4: four 8x8 matrices of 16-bit elements from shared memory,
  // this lane giving the address of element `idx32` (the start of its row).
  std::array<Value*, 4> ldmatrix_x4(llvm::GlobalVariable* s, Value* idx32) {
    Value* p = b_.CreateGEP(st_, s, b_.CreateZExt(idx32, b_.getInt64Ty()));
    Value* r = b_.CreateIntrinsic(llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_b16,
                                  {p->getType()}, {p});
    return {b_.CreateExtractValue(r, {0}), b_.CreateExtractValue(r, {1}),
            b_.CreateExtractValue(r, {2}), b_.CreateExtractValue(r, {3})};
  }

  void emit_half_mma_math() {
    WarpCoords w = warp_coords();
    llvm::Function* mma = llvm::Intrinsic::getDeclaration(
        &m_, dt_ == DType::Float16 ? llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_f32_f32
                                   : llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_bf16);
    llvm::FunctionType* ft = mma->getFunctionType();
    FJ_CHECK(mma_ni() % 2 == 0, "matmul ", k_.name, ": an odd number of mma columns per warp");
    std::vector<Value*> acc(acc_.size());
    for (size_t i = 0; i < acc_.size(); ++i) acc[i] = b_.CreateLoad(b_.getFloatTy(), acc_[i]);
    // This lane's row of an ldmatrix.x4: row lane % 8 of matrix q = lane / 8.
    Value* lane = b_.CreateURem(tid_, i32(kWarp));
    Value* r8 = b_.CreateURem(lane, i32(8));
    Value* q = b_.CreateUDiv(lane, i32(8));
    Value *q_lo = b_.CreateAnd(q, i32(1)), *q_hi = b_.CreateLShr(q, i32(1));
    for (int kk = 0; kk < cfg_.bk; kk += 16) {
      std::vector<std::array<Value*, 4>> a(mma_mi());
      std::vector<std::array<Value*, 2>> bf(mma_ni());
      for (int mi = 0; mi < mma_mi(); ++mi) {
        // A: matrices (rows +0/+8 by q's low bit, k +0/+8 by its high bit).
        Value* row = b_.CreateAdd(b_.CreateAdd(w.rb, i32(mi * 16)),
                                  b_.CreateAdd(b_.CreateMul(q_lo, i32(8)), r8));
        Value* col = b_.CreateAdd(i32(kk), b_.CreateMul(q_hi, i32(8)));
        a[mi] = ldmatrix_x4(
            as_, b_.CreateAdd(a_stage_, b_.CreateAdd(b_.CreateMul(row, i32(lda_)), col)));
      }
      for (int ni = 0; ni < mma_ni(); ni += 2) {
        // B of tiles ni and ni + 1: (n +0/+8 by q's high bit, k +0/+8 by its low bit).
        Value* n = b_.CreateAdd(b_.CreateAdd(w.cb, i32(ni * 8)),
                                b_.CreateAdd(b_.CreateMul(q_hi, i32(8)), r8));
        Value* k = b_.CreateAdd(i32(kk), b_.CreateMul(q_lo, i32(8)));
        std::array<Value*, 4> m4 =
            ldmatrix_x4(bs_, b_.CreateAdd(b_stage_, b_.CreateAdd(b_.CreateMul(n, i32(ldb_)), k)));
        bf[ni] = {m4[0], m4[1]};
        bf[ni + 1] = {m4[2], m4[3]};
      }
      for (int mi = 0; mi < mma_mi(); ++mi)
        for (int ni = 0; ni < mma_ni(); ++ni) {
          int base = (mi * mma_ni() + ni) * 4;
          std::vector<Value*> args = {a[mi][0],      a[mi][1],     a[mi][2],  a[mi][3],
                                      bf[ni][0],     bf[ni][1],    acc[base], acc[base + 1],
                                      acc[base + 2], acc[base + 3]};
          for (unsigned i = 0; i < 6; ++i)  // <2 x half> for float16, i32 for bfloat16
            args[i] = b_.CreateBitCast(args[i], ft->getParamType(i));
          Value* r = b_.CreateCall(mma, args);
          for (unsigned c = 0; c < 4; ++c) acc[base + c] = b_.CreateExtractValue(r, {c});
        }
    }
    for (size_t i = 0; i < acc_.size(); ++i) b_.CreateStore(acc[i], acc_[i]);
  }

  // ---------------------------------------------------------------- epilogue

  void emit_epilogue() {
    llvm::Type* at = cfg_.tensor_cores ? b_.getFloatTy() : ct_;
    if (cfg_.tensor_cores) {
      WarpCoords w = warp_coords();
      for (int mi = 0; mi < mma_mi(); ++mi)
        for (int ni = 0; ni < mma_ni(); ++ni)
          for (int q = 0; q < 4; ++q) {
            Value* r = b_.CreateAdd(w.rb, b_.CreateAdd(w.g, i32(mi * 16 + (q >= 2 ? 8 : 0))));
            Value* c =
                b_.CreateAdd(w.cb, b_.CreateAdd(b_.CreateMul(w.t, i32(2)), i32(ni * 8 + (q & 1))));
            int a = (mi * mma_ni() + ni) * 4 + q;
            element(r, c, b_.CreateLoad(at, acc_[a]));
          }
      return;
    }
    Value* tx = b_.CreateURem(tid_, i32(fma_tx_count()));
    Value* ty = b_.CreateUDiv(tid_, i32(fma_tx_count()));
    for (int i = 0; i < cfg_.tm; ++i)
      for (int j = 0; j < cfg_.tn; ++j)
        element(b_.CreateAdd(ty, i32(int64_t{i} * fma_ty_count())),
                b_.CreateAdd(tx, i32(int64_t{j} * fma_tx_count())),
                b_.CreateLoad(at, acc_[i * cfg_.tn + j]));
  }

  // The epilogue at tile-local (r, c), guarded by the output bounds.
  void element(Value* r, Value* c, Value* accv) {
    if (half_) accv = from_mem(b_, to_mem(b_, accv, dt_), dt_);  // the half type's value
    Value* m = b_.CreateAdd(m0_, b_.CreateZExt(r, b_.getInt64Ty()));
    Value* n = b_.CreateAdd(n0_, b_.CreateZExt(c, b_.getInt64Ty()));
    Value* ok = b_.getTrue();
    if (mm_.m % cfg_.bm != 0) ok = b_.CreateAnd(ok, b_.CreateICmpSLT(m, i64(mm_.m)));
    if (mm_.n % cfg_.bn != 0) ok = b_.CreateAnd(ok, b_.CreateICmpSLT(n, i64(mm_.n)));
    llvm::BasicBlock* cont = nullptr;
    if (!llvm::isa<llvm::Constant>(ok)) {
      auto* then = llvm::BasicBlock::Create(m_.getContext(), "out", f_);
      cont = llvm::BasicBlock::Create(m_.getContext(), "out.end", f_);
      b_.CreateCondBr(ok, then, cont);
      b_.SetInsertPoint(then);
    }
    int rank = k_.rank();
    for (int d = 0; d < rank - 2; ++d) e_->idx[d] = batch_idx_[d];
    e_->idx[rank - 2] = m;
    e_->idx[rank - 1] = n;
    e_->vec_dim = -1;
    e_->width = 1;
    e_->push_scope();
    for (size_t j = 0; j < k_.nodes.size(); ++j)
      if (k_.nodes[j].kind == KOp::Acc) e_->set_value(static_cast<int>(j), accv);
    for (const Store& s : k_.stores) e_->store(s, e_->eval(s.node));
    e_->pop_scope();
    if (cont) {
      b_.CreateBr(cont);
      b_.SetInsertPoint(cont);
    }
  }

  llvm::Module& m_;
  const Kernel& k_;
  const GpuTarget& t_;
  MathProvider& math_;
  llvm::IRBuilder<> b_;
  const MatMulSpec& mm_;
  DType dt_;
  bool is_float_ = true;
  bool half_ = false;                              // float16 or bfloat16 operands
  bool half_mma_ = false;                          // ... on mma.m16n8k16
  bool async_ = false;                             // ... fed by the cp.async pipeline
  int64_t a_cells_ = 0, b_cells_ = 0;              // one stage's shared elements
  Value *a_stage_ = nullptr, *b_stage_ = nullptr;  // this K tile's stage offsets (elements)
  TileConfig cfg_;
  llvm::Function* f_ = nullptr;
  std::vector<Value*> ptrs_;
  std::unique_ptr<ExprEmitter> e_;
  llvm::Type* et_ = nullptr;  // an element in global memory (mem_type)
  llvm::Type* ct_ = nullptr;  // the FMA path's arithmetic (reg_type)
  llvm::Type* st_ = nullptr;
  int64_t tiles_m_ = 1, tiles_n_ = 1;
  int64_t lda_ = 0, ldb_ = 0;
  llvm::GlobalVariable* as_ = nullptr;
  llvm::GlobalVariable* bs_ = nullptr;
  Value* tid_ = nullptr;
  Value *bi_ = nullptr, *m0_ = nullptr, *n0_ = nullptr;
  Value *a_base_ = nullptr, *b_base_ = nullptr;
  DigitOperand dig_[2];
  std::vector<Value*> batch_idx_;  // the domain's batch dims, for the epilogue
  std::vector<llvm::AllocaInst*> acc_;
};

}  // namespace

llvm::Function* emit_matmul_kernel(llvm::Module& m, const Kernel& k, const GpuTarget& t,
                                   MathProvider& math, abi::GpuGrid& launch, KernelNotes& notes) {
  return MatMulEmitter(m, k, t, math).emit(launch, notes);
}

}  // namespace flowjit::codegen::nvptx
