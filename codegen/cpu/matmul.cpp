// CPU lowering of MatMul kernels: packed, register-blocked, cache-blocked
// GEMM with the epilogue applied to the register tile.
//
// The algorithm (Goto/BLIS): the output is split into tasks (batch, a range
// of rows, a range of columns) that run in parallel; columns are split only
// for threads. Within a task:
//   for each KC block of k:             pack B[k-block, task cols] into Bp
//     for each MC block of rows:        pack A[m-block, k-block] into Ap once,
//                                       reused by every column panel
//       for each NR panel, MR panel:    micro-kernel: MR x NR accumulators in
//       (or MR panel, NR panel)         vector registers, one FMA per lane,
//                                       two k steps per loop iteration
// The register tile comes from the target (12x32 with 32 vector registers,
// 6x16 with AVX2, 5x8 without FMA; fewer rows when they divide m better), KC
// from L1d (the B micro-panel in at most twice L1d, KC <= 512) and MC from L2
// (the A block in half of it); the row tiles go outside the column panels
// where that keeps A's micro-panel in L1 and B's does not fit (48K L1d).
// Packing zero-fills beyond the edges so the micro-kernel always computes a
// whole tile; stores are masked. An operand is read in place instead where
// packing would not pay (a single row tile or column panel per task, or B
// rows whose stride spreads them over the cache sets); an A that is the same
// in every batch (a conv's filter) is packed once per call for all batches.
// Implicit GEMM operands (convolutions) are packed by runs of consecutive
// elements, along the lines or along k, each a masked load; what is not one
// or two such runs is a masked gather (emit_pack_general). With several KC
// blocks the C tile is loaded before and stored after the micro-kernel of
// each block but the first and last, in the output itself when one store
// can hold the raw sums (else in a per-task scratch buffer); the epilogue
// runs after the last block. The next tile's C rows are prefetched a K loop
// ahead. Every extent is a compile-time constant of the kernel.
// Compile time follows the IR emitted, so code is emitted once per kind of
// work, not once per case: one K block body for equally long blocks (the last
// picks the epilogue at run time), one transposed-packing block whatever its
// edge, edge tiles through one loop over the tile's rows, and edge paths only
// where m or n leaves partial tiles (FLOWJIT_DEBUG=2 prints each kernel's IR
// instructions as emitted and optimized).
#include <llvm/IR/ConstantFolder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsX86.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "codegen/cpu/cpu_codegen.h"
#include "ir/diag.h"
#include "ir/error.h"

namespace flowjit::codegen::cpu {

using llvm::Value;

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// The emitter's builder folds the integer identities of its address
// arithmetic on creation (x * 0, x * 1, x + 0, x - 0, x / 1, a GEP by 0), a
// fifth of the instructions it would hand LLVM otherwise, and constants as
// the default builder does. Nothing that looks through a value: a loop's
// induction PHI has only its first incoming value while the body is emitted,
// so a fold that threads over PHIs (InstSimplifyFolder) would take the loop
// start for the induction variable.
class IdentityFolder final : public llvm::IRBuilderFolder {
 public:
  Value* FoldBinOp(llvm::Instruction::BinaryOps op, Value* l, Value* r) const override {
    if (Value* v = identity(op, l, r)) return v;
    return c_.FoldBinOp(op, l, r);
  }
  Value* FoldExactBinOp(llvm::Instruction::BinaryOps op, Value* l, Value* r,
                        bool exact) const override {
    if (Value* v = identity(op, l, r)) return v;
    return c_.FoldExactBinOp(op, l, r, exact);
  }
  Value* FoldNoWrapBinOp(llvm::Instruction::BinaryOps op, Value* l, Value* r, bool nuw,
                         bool nsw) const override {
    if (Value* v = identity(op, l, r)) return v;
    return c_.FoldNoWrapBinOp(op, l, r, nuw, nsw);
  }
  Value* FoldBinOpFMF(llvm::Instruction::BinaryOps op, Value* l, Value* r,
                      llvm::FastMathFlags fmf) const override {
    return c_.FoldBinOpFMF(op, l, r, fmf);
  }
  Value* FoldUnOpFMF(llvm::Instruction::UnaryOps op, Value* v,
                     llvm::FastMathFlags fmf) const override {
    return c_.FoldUnOpFMF(op, v, fmf);
  }
  Value* FoldCmp(llvm::CmpInst::Predicate p, Value* l, Value* r) const override {
    return c_.FoldCmp(p, l, r);
  }
  Value* FoldGEP(llvm::Type* ty, Value* ptr, llvm::ArrayRef<Value*> idx,
                 llvm::GEPNoWrapFlags nw) const override {
    if (idx.size() == 1 && is_int(idx[0], 0)) return ptr;
    return c_.FoldGEP(ty, ptr, idx, nw);
  }
  Value* FoldSelect(Value* c, Value* t, Value* f) const override { return c_.FoldSelect(c, t, f); }
  Value* FoldExtractValue(Value* agg, llvm::ArrayRef<unsigned> idx) const override {
    return c_.FoldExtractValue(agg, idx);
  }
  Value* FoldInsertValue(Value* agg, Value* v, llvm::ArrayRef<unsigned> idx) const override {
    return c_.FoldInsertValue(agg, v, idx);
  }
  Value* FoldExtractElement(Value* vec, Value* idx) const override {
    return c_.FoldExtractElement(vec, idx);
  }
  Value* FoldInsertElement(Value* vec, Value* elt, Value* idx) const override {
    return c_.FoldInsertElement(vec, elt, idx);
  }
  Value* FoldShuffleVector(Value* a, Value* b, llvm::ArrayRef<int> mask) const override {
    return c_.FoldShuffleVector(a, b, mask);
  }
  Value* FoldCast(llvm::Instruction::CastOps op, Value* v, llvm::Type* to) const override {
    return c_.FoldCast(op, v, to);
  }
  Value* FoldBinaryIntrinsic(llvm::Intrinsic::ID id, Value* l, Value* r, llvm::Type* ty,
                             llvm::Instruction* fmf) const override {
    return c_.FoldBinaryIntrinsic(id, l, r, ty, fmf);
  }
  llvm::Constant* CreatePointerCast(llvm::Constant* c, llvm::Type* to) const override {
    return c_.CreatePointerCast(c, to);
  }
  llvm::Constant* CreatePointerBitCastOrAddrSpaceCast(llvm::Constant* c,
                                                      llvm::Type* to) const override {
    return c_.CreatePointerBitCastOrAddrSpaceCast(c, to);
  }

 private:
  static bool is_int(Value* v, int64_t x) {
    auto* c = llvm::dyn_cast<llvm::ConstantInt>(v);
    return c != nullptr && c->getSExtValue() == x;
  }
  static Value* identity(llvm::Instruction::BinaryOps op, Value* l, Value* r) {
    if (!l->getType()->isIntegerTy()) return nullptr;  // scalar integers only
    switch (op) {
      case llvm::Instruction::Add:
        if (is_int(r, 0)) return l;
        if (is_int(l, 0)) return r;
        return nullptr;
      case llvm::Instruction::Sub:
        return is_int(r, 0) ? l : nullptr;
      case llvm::Instruction::Mul:
        if (is_int(r, 1)) return l;
        if (is_int(l, 1)) return r;
        if (is_int(r, 0)) return r;
        if (is_int(l, 0)) return l;
        return nullptr;
      case llvm::Instruction::SDiv:
      case llvm::Instruction::UDiv:
        return is_int(r, 1) ? l : nullptr;
      default:
        return nullptr;
    }
  }
  llvm::ConstantFolder c_;
};

// Two kernel shapes. Gemm: the packed Goto/BLIS algorithm above, the register
// tile MR rows x NR columns of accumulators, broadcasting A and loading B
// vectors along n. Dot: for skinny outputs (n <= kSkinny) whose operands are
// both contiguous along k (x @ W^T with W stored (out, in)), vectors run along
// k instead: MR rows x NR columns of k-vector accumulators, one horizontal sum
// per output at the end, no packing and no lanes wasted on a short n. The
// Dot path also takes short outputs (m <= kDotRows) of any n whose B is
// contiguous along k (a predict call of x @ W^T at batch 1): a matrix-vector
// product streaming W's rows once, where the GEMM path would transpose all of
// W into a packed buffer first; its column tiles then run in a loop and its
// tasks split the columns.
enum class Path { Gemm, Dot };
constexpr int64_t kSkinny = 10;
constexpr int64_t kDotRows = 4;
// A wide Dot matmul takes a thread per this many bytes of B (memory-bound:
// each B element is read once per row tile).
constexpr int64_t kDotBytesPerTask = 128 << 10;
// k steps per iteration of the GEMM micro-kernel's loop.
constexpr int64_t kKUnroll = 2;
// How many k steps ahead the micro-kernel prefetches a B row read in place.
constexpr int64_t kBAhead = 8;

struct Blocking {
  Path path = Path::Gemm;
  int vl = 16;    // lanes per vector
  int regs = 32;  // vector registers of the target
  int mr = 12, nr = 32;
  int64_t kc = 256, mc = 144, nc = 512;
  int64_t num_kb = 1;
  int64_t task_rows = 0;  // rows per task (multiple of mr)
  int64_t task_cols = 0;  // cols per task (multiple of nr)
  int64_t row_groups = 1, col_blocks = 1;
  int64_t tasks = 1;
  // Gemm: an operand is packed only when the task reuses its panels; else
  // the micro-kernel reads it where it lies (a single row tile per task
  // reads each B element once, a single column panel each A element once).
  bool pack_a = true, pack_b = true;
  // K blocks accumulate in the output (the C tile is loaded before and
  // stored after the micro-kernel of every block but the first and last)
  // when one store can hold the raw sums (c_store); else in a scratch buffer.
  bool acc_out = false;
  // Loop order of the micro-tiles within a block: column panels outside and
  // row tiles inside (the B micro-panel stays in L1 while the A panels
  // stream), or, with `rows_outer`, row tiles outside (the A micro-panel
  // stays in L1 while the task's B block streams from L2).
  bool rows_outer = false;
  // A packed once per call of the kernel, every K block of it, for all the
  // batches of the call's tasks: where A is the same matrix in every batch
  // (a convolution's filter; x @ W over a batch of x) and a task has all of
  // its rows, packing it per task would copy the same panels once per batch
  // (a gather per element for a data gradient's flipped filter).
  bool a_once = false;
  // The bfloat16 micro-kernel (choose_blocking's `pairs`).
  bool pairs = false;
};

// Whether operand A is the same in every batch: no batch digit of extent > 1
// moves its offset or any of its coordinates.
bool a_batch_invariant(const MatMulSpec& mm) {
  if (!mm.a.indirect.empty()) return false;
  std::vector<int64_t> batch =
      mm.batch_digits.empty() ? std::vector<int64_t>{mm.batch} : mm.batch_digits;
  for (size_t d = 0; d < batch.size(); ++d) {
    if (batch[d] <= 1) continue;
    if (mm.a.strides.at(d) != 0) return false;
    for (const Coord& c : mm.a.coords)
      if (c.coef.at(d) != 0) return false;
  }
  return true;
}

// The store whose element (m, n) the micro-kernel's C tile maps to, for
// prefetching C and, when `hold_sums`, for keeping the partial sums of the K
// blocks: a plain strided access, contiguous along n, of the accumulator's
// type, to a buffer the kernel reads nowhere else (an in-place update such as
// W -= lr * dW reads the old W in its epilogue, so its partial sums cannot go
// there). -1 when there is none.
int c_store_index(const Kernel& k, DType acc_type, bool* hold_sums) {
  const MatMulSpec& mm = k.mm;
  const int r = k.rank();
  *hold_sums = false;
  for (size_t i = 0; i < k.stores.size(); ++i) {
    const Access& w = k.stores[i].where;
    if (!w.coords.empty() || !w.indirect.empty() || static_cast<int>(w.strides.size()) != r ||
        w.strides[r - 1] != 1)
      continue;
    // Distinct outputs per (batch, m, n): each dim's stride at least the span
    // of the dims inside it.
    bool dense = true;
    int64_t span = mm.n;
    for (int d = r - 2; d >= 0; --d) {
      if (k.domain[d] > 1 && w.strides[d] < span) dense = false;
      span = std::max(span, w.strides[d] * k.domain[d]);
    }
    if (!dense) continue;
    bool shared = w.arg == mm.a.arg || w.arg == mm.b.arg;
    for (const Access& l : k.loads) shared |= l.arg == w.arg;
    int same_arg = 0;
    for (const Store& o : k.stores) same_arg += o.where.arg == w.arg;
    *hold_sums = !shared && same_arg == 1 && k.args.at(w.arg).dtype == acc_type;
    return static_cast<int>(i);
  }
  return -1;
}

// Vector registers: 32 with AVX-512 (zmm0-31), 16 otherwise (ymm/xmm0-15).
int vector_registers(const CpuTarget& t) { return t.vector_bits >= 512 ? 32 : 16; }

// Threads worth using: one task per thread, but not for matmuls too small to
// pay for a fork (about a megaflop per task).
int64_t wanted_tasks(const MatMulSpec& mm, const CpuTarget& t) {
  double flops = 2.0 * mm.m * mm.n * mm.k * mm.batch;
  return std::max<int64_t>(1, std::min<int64_t>(t.threads, static_cast<int64_t>(flops / 1.5e6)));
}

bool dot_applies(const MatMulSpec& mm, int vl) {
  return mm.plain(0) && mm.plain(1) && mm.a.strides[2] == 1 && mm.b.strides[1] == 1 &&
         (mm.n <= kSkinny || mm.m <= kDotRows) && mm.k >= 2 * vl && mm.m > 0 && mm.batch > 0 &&
         mm.n > 0;
}

// A Dot matmul whose column tiles run in a loop (n > kSkinny).
bool wide_dot(const MatMulSpec& mm) { return mm.n > kSkinny; }

// Dot tile: MR x NR accumulators plus MR A vectors, one B vector and one spare
// (a product temporary without FMA) must fit the registers; NR <= VL so one
// vector holds a tile row's sums for the epilogue. Best: most accumulators
// doing useful work (edge tiles waste some), then fewest loads per FMA.
Blocking choose_dot(const MatMulSpec& mm, Blocking bl, const CpuTarget& t, int elem_bytes) {
  bl.path = Path::Dot;
  bl.pack_a = bl.pack_b = false;
  double best = -1;
  for (int c = 1; c <= std::min<int64_t>({mm.n, bl.vl, 8}); ++c) {
    // An even split of a short n; a wide one's tiles are all c wide but its last.
    int ce = wide_dot(mm) ? c : static_cast<int>(ceil_div(mm.n, ceil_div(mm.n, c)));
    for (int r = 1; r <= std::min<int64_t>(mm.m, 8); ++r) {
      if (r * ce + r + 2 > bl.regs) continue;
      double eff = static_cast<double>(mm.m * mm.n) / (round_up(mm.m, r) * round_up(mm.n, ce));
      double score = r * ce * eff - 1e-3 * (r + ce) / (r * ce);
      if (score > best) best = score, bl.mr = r, bl.nr = ce;
    }
  }
  int64_t want = wanted_tasks(mm, t);
  if (wide_dot(mm)) {
    // All rows per task (m <= kDotRows); the columns split for the threads.
    int64_t b_bytes = mm.n * mm.k * elem_bytes;
    want = std::max(want, std::min<int64_t>(t.threads, b_bytes / kDotBytesPerTask));
    bl.task_rows = round_up(mm.m, bl.mr);
    bl.row_groups = 1;
    int64_t col_blocks = std::clamp<int64_t>(ceil_div(want, mm.batch), 1, ceil_div(mm.n, bl.nr));
    bl.task_cols = round_up(ceil_div(mm.n, col_blocks), bl.nr);
    bl.col_blocks = ceil_div(mm.n, bl.task_cols);
  } else {
    int64_t row_groups = std::min<int64_t>(ceil_div(want, mm.batch), ceil_div(mm.m, bl.mr));
    row_groups = std::max<int64_t>(1, row_groups);
    bl.task_rows = round_up(ceil_div(mm.m, row_groups), bl.mr);
    bl.row_groups = ceil_div(mm.m, bl.task_rows);
    bl.task_cols = mm.n;
    bl.col_blocks = 1;
  }
  bl.kc = mm.k;
  bl.mc = bl.task_rows;
  bl.nc = bl.task_cols;
  bl.tasks = mm.batch * bl.row_groups * bl.col_blocks;
  return bl;
}

// `pairs`: the bfloat16 micro-kernel (vdpbf16ps): float32 accumulators,
// 2-byte operands packed in k pairs (both always packed), K blocks of an
// even length.
Blocking choose_blocking(const MatMulSpec& mm, int elem_bytes, const CpuTarget& t,
                         bool pairs = false) {
  Blocking bl;
  bl.pairs = pairs;
  bl.vl = t.lanes(pairs ? 4 : elem_bytes);
  bl.regs = vector_registers(t);
  if (!pairs && dot_applies(mm, bl.vl)) return choose_dot(mm, bl, t, elem_bytes);
  const int regs = bl.regs;
  // Accumulators MR x (NR / VL) plus NR / VL B vectors plus one broadcast
  // (and one product temporary where there is no FMA).
  if (mm.n <= bl.vl) {
    bl.nr = bl.vl;
    bl.mr = std::min<int>(regs - 4, 14);
  } else {
    bl.nr = 2 * bl.vl;
    // 32 registers: up to 12 x 2 (24 accumulators, BLIS's SKX shape); 16: up
    // to 6 x 2 (12 accumulators, 2 B vectors, 1 broadcast: Haswell/Zen's
    // 6x16), 5 x 2 without FMA, whose multiply needs a temporary. Fewer rows
    // when they tile m better (m = 100: 10 x 2 computes no padding rows where
    // 12 x 2 computes 8); the score's mr / (mr + 1) charges a small tile its
    // loads per FMA.
    int mr_max = regs >= 32 ? 12 : t.has_fma ? 6 : 5;
    int mr_min = regs >= 32 ? 8 : 4;
    double best = -1;
    for (int r = mr_min; r <= mr_max; ++r) {
      double eff = static_cast<double>(mm.m) / std::max<int64_t>(1, round_up(mm.m, r));
      double score = eff * r / (r + 1.0);
      if (score > best + 1e-9) best = score, bl.mr = r;
    }
  }
  bl.mr = static_cast<int>(std::min<int64_t>(bl.mr, std::max<int64_t>(1, mm.m)));
  // KC: as long as the B micro-panel (KC x NR) fits twice L1d, at most 512.
  // Each K block costs a pass over the C tiles (loaded and stored around the
  // micro-kernel), so fewer, longer blocks win as long as the packed panels
  // stream from L2; the KC x NR panel is reused across the MC / MR row tiles.
  int64_t kc_max =
      std::clamp<int64_t>(2 * t.l1d_bytes / (elem_bytes * bl.nr), 128, pairs ? 1024 : 512);
  bl.num_kb = std::max<int64_t>(1, ceil_div(mm.k, kc_max));
  bl.kc = std::max<int64_t>(1, ceil_div(mm.k, bl.num_kb));
  if (pairs && bl.num_kb > 1) {  // no k pair across two blocks
    bl.kc = round_up(bl.kc, 2);
    bl.num_kb = ceil_div(mm.k, bl.kc);
  }
  // MC: the packed A block (MC x KC), reused across every column panel of the
  // task, in half of L2.
  int64_t mc_max =
      std::max<int64_t>(bl.mr, (t.l2_bytes / 2) / (bl.kc * elem_bytes) / bl.mr * bl.mr);
  // Tasks: enough for every thread, splitting whichever dimension is larger
  // per task. A task packs its A block once per K block and reuses it across
  // all its columns (their B panels stream), so columns are split only for
  // threads, never for the cache.
  if (mm.m == 0 || mm.n == 0 || mm.batch == 0) {  // an empty result: nothing to do
    bl.tasks = 0;
    bl.task_rows = bl.mr;
    bl.task_cols = bl.nr;
    return bl;
  }
  int64_t col_blocks = 1, row_groups = 1;
  int64_t max_row_groups = ceil_div(mm.m, bl.mr), max_col_blocks = ceil_div(mm.n, bl.nr);
  int64_t want = wanted_tasks(mm, t);
  // B's rows are read in place (below) when their stride spreads them over
  // the cache sets, however the tasks split. Then only A is packed, and a
  // task packs all of its rows' A whatever its columns: splitting rows gives
  // each task its own share of A to pack, where splitting columns would pack
  // all of A once per task (twice the packing on one thread, the same per
  // thread on two; the seed's dW1 = dH^T @ x).
  bool b_rows = mm.plain(1) && mm.b.strides[2] == 1;
  bool b_spread = (mm.b.strides[1] * elem_bytes) % 128 != 0;
  bool b_in_place_anyway = b_rows && b_spread;
  while (mm.batch * row_groups * col_blocks < want) {
    bool can_cols = col_blocks < max_col_blocks;
    bool can_rows = row_groups < max_row_groups;
    if (!can_cols && !can_rows) break;
    double cols_per = static_cast<double>(mm.n) / col_blocks;
    double rows_per = static_cast<double>(mm.m) / row_groups;
    if (b_in_place_anyway) cols_per = 0;  // rows first (see above)
    if (can_cols && (cols_per >= rows_per || !can_rows)) {
      ++col_blocks;
    } else {
      ++row_groups;
    }
  }
  bl.task_cols = round_up(ceil_div(mm.n, col_blocks), bl.nr);
  bl.col_blocks = std::max<int64_t>(1, ceil_div(mm.n, bl.task_cols));
  bl.task_rows = round_up(ceil_div(mm.m, row_groups), bl.mr);
  bl.row_groups = std::max<int64_t>(1, ceil_div(mm.m, bl.task_rows));
  bl.mc = std::min(bl.task_rows, mc_max);
  bl.nc = bl.task_cols;
  bl.tasks = mm.batch * bl.row_groups * bl.col_blocks;
  // Packing pays when a panel is reused: B's across the row tiles of a task,
  // A's across its column panels. B is read in place only along contiguous
  // rows (vector loads); A's broadcasts take any plain strides.
  // B's rows are also read in place when their stride spreads them over the
  // cache sets (not a multiple of 128 bytes: 784 floats, not 1024): the
  // micro-panel then stays cached across the row tiles as a packed one would,
  // and the copy (a fifth of the time of the seed's dX = dH @ W1) is saved.
  bl.pack_b = !(b_rows && (bl.task_rows <= bl.mr || b_spread));
  // A's rows are read in place, like B's, when they are contiguous along k
  // and their stride spreads them over the cache sets: the MR rows' k range
  // stays in L1 across the column panels as a packed micro-panel would, and
  // the transposing copy (3-4% of the seed's x @ W1^T) is saved.
  bool a_rows_spread =
      mm.plain(0) && mm.a.strides[2] == 1 && (mm.a.strides[1] * elem_bytes) % 128 != 0;
  bl.pack_a = !(mm.plain(0) && (bl.task_cols <= bl.nr || a_rows_spread));
  if (pairs) bl.pack_a = bl.pack_b = true;  // the k pairs' layout
  // Row tiles outside when the B micro-panel (KC x NR) does not fit L1d but
  // the A micro-panel (MR x KC) fits half of it, and the task's B block (KC
  // x its columns) half of L2: B's panel then streams from L2 either way,
  // and the order keeps A's in L1, where the other order streams both (NR +
  // MR elements from L2 per k step instead of NR). On a 48K L1d with 12x32
  // tiles and KC 512 (64K B panels, 24K A panels) this measured 5-9% faster
  // on 1024^3; with a 32K L1d (24K A panels) or a B panel that fits
  // (AVX2's 6x16) the order is unchanged.
  const int64_t b_panel = bl.kc * bl.nr * elem_bytes, a_panel = bl.kc * bl.mr * elem_bytes;
  bl.rows_outer = bl.task_rows > bl.mr && bl.task_cols > bl.nr && b_panel > t.l1d_bytes &&
                  2 * a_panel <= t.l1d_bytes && 2 * bl.kc * bl.task_cols * elem_bytes <= t.l2_bytes;
  // All of A packed (every K block) must stay in half of L2 across the
  // batches it serves.
  bl.a_once = bl.pack_a && mm.batch > 1 && bl.row_groups == 1 && bl.mc >= bl.task_rows &&
              a_batch_invariant(mm) &&
              2 * bl.task_rows * bl.num_kb * bl.kc * elem_bytes <= t.l2_bytes;
  return bl;
}

// What FLOWJIT_DEBUG=1 prints for a matmul kernel: the target facts the
// choice came from and the choice.
std::string describe_blocking(const Kernel& k, const Blocking& bl, const CpuTarget& t) {
  const MatMulSpec& mm = k.mm;
  std::string s = k.name + ": matmul " + std::to_string(mm.batch) + "x" + std::to_string(mm.m) +
                  "x" + std::to_string(mm.k) + "x" + std::to_string(mm.n) + " on " + t.cpu + " (" +
                  std::to_string(t.vector_bits) + "-bit vectors, " + std::to_string(bl.regs) +
                  " registers, " + (t.has_fma ? "fma" : "no fma") + ", L1d " +
                  std::to_string(t.l1d_bytes >> 10) + "K, L2 " + std::to_string(t.l2_bytes >> 10) +
                  "K, " + std::to_string(t.threads) + " threads): ";
  if (bl.path == Path::Dot) {
    s += "dot path, " + std::to_string(bl.mr) + " rows x " + std::to_string(bl.nr) + " cols of " +
         std::to_string(bl.vl) + "-lane k vectors, no packing";
  } else {
    s += "gemm, tile " + std::to_string(bl.mr) + "x" + std::to_string(bl.nr) + " (" +
         std::to_string(bl.mr * (bl.nr / bl.vl)) + " accumulators of " + std::to_string(bl.vl) +
         " lanes), kc " + std::to_string(bl.kc) + " x " + std::to_string(bl.num_kb) + ", mc " +
         std::to_string(bl.mc) + ", nc " + std::to_string(bl.nc) + ", A " +
         (bl.pack_a ? (bl.a_once ? "packed once for all batches" : "packed") : "in place") +
         ", B " + (bl.pack_b ? "packed" : "in place") +
         (bl.pairs ? ", bfloat16 k pairs (vdpbf16ps)" : "") +
         (bl.rows_outer ? ", row tiles outside" : ", column panels outside");
    if (bl.num_kb > 1)
      s += bl.acc_out ? ", K blocks sum in the output" : ", K blocks sum in scratch";
  }
  s += ", " + std::to_string(bl.tasks) + " task(s)";
  return s;
}

bool debug_enabled() {
  const char* d = std::getenv("FLOWJIT_DEBUG");
  return d != nullptr && std::atoi(d) >= 1;
}

class MatMulEmitter {
 public:
  MatMulEmitter(llvm::Module& m, const Kernel& k, const CpuTarget& t, MathProvider& math)
      : m_(m), k_(k), t_(t), math_(math), b_(m.getContext()), mm_(k.mm) {
    FJ_CHECK(k.rank() >= 2, "matmul kernel ", k.name, " has rank ", k.rank());
    FJ_CHECK((mm_.plain(0) || !mm_.a_rows.empty()) && (mm_.plain(1) || !mm_.b_rows.empty()),
             "matmul kernel ", k.name, ": operand strides must be (batch, row, col) or digits");
    dt_ = k.args.at(mm_.a.arg).dtype;
    // bfloat16 operands: the vdpbf16ps micro-kernel, float32 accumulators
    // (jit/passes/widen_half widens them on targets without it).
    const bool pairs = dt_ == DType::BFloat16;
    FJ_CHECK(!pairs || (t.has_avx512bf16 && mm_.plain(0) && mm_.plain(1)), "matmul kernel ", k.name,
             ": bfloat16 operands need AVX512-BF16 and plain accesses");
    FJ_CHECK(!ir::is_half(dt_) || pairs, "matmul kernel ", k.name, " of ", ir::dtype_name(dt_),
             " has no CPU micro-kernel (widen_half widens it)");
    eb_ = pairs ? 4 : ir::dtype_bytes(dt_);  // of the accumulators and the sums kept
    is_float_ = ir::is_float(dt_);
    bl_ = choose_blocking(mm_, ir::dtype_bytes(dt_), t, pairs);
    bool hold = false;
    c_store_ = c_store_index(k_, pairs ? DType::Float32 : dt_, &hold);
    bl_.acc_out = bl_.path == Path::Gemm && hold;
    if (debug_enabled()) ir::diag(1, describe_blocking(k_, bl_, t_));
  }

  llvm::Function* emit(abi::CpuRange& shape) {
    f_ = declare_kernel(m_, k_.name, t_);
    llvm::LLVMContext& c = m_.getContext();
    entry_ = llvm::BasicBlock::Create(c, "entry", f_);
    b_.SetInsertPoint(entry_);
    ptrs_ = load_kernel_args(b_, f_, k_.args.size());
    e_ = std::make_unique<ExprEmitter>(k_, b_, math_, ptrs_);
    et_ = reg_type(c, dt_);
    vt_ = with_width(et_, bl_.vl);
    ot_ = bl_.pairs ? mem_type(c, dt_) : et_;

    // Scratch: Ap (MC x KC), Bp (KC x NC), and partial sums when K is blocked.
    Value* scratch = f_->getArg(3);
    if (bl_.pairs) {
      // 16-bit cells, KC rounded up to whole k pairs; the sums in float32.
      const int64_t kc2 = round_up(bl_.kc, 2);
      int64_t ap_bytes =
          bl_.pack_a ? round_up(bl_.mc, bl_.mr) * kc2 * 2 * (bl_.a_once ? bl_.num_kb : 1) : 0;
      int64_t bp_bytes = round_up(bl_.nc, bl_.nr) * kc2 * 2;
      int64_t cp_elems = bl_.num_kb > 1 && !bl_.acc_out ? bl_.task_rows * bl_.task_cols : 0;
      ap_bytes = round_up(ap_bytes + 64, 64);
      bp_bytes = round_up(bp_bytes + 64, 64);
      ap_ = scratch;
      bp_ = b_.CreateGEP(b_.getInt8Ty(), scratch, b_.getInt64(ap_bytes));
      cp_ = b_.CreateGEP(b_.getInt8Ty(), bp_, b_.getInt64(bp_bytes));
      shape.scratch_bytes = ap_bytes + bp_bytes + cp_elems * eb_ + 64;
    } else {
      int64_t ap_elems =
          bl_.pack_a ? round_up(bl_.mc, bl_.mr) * bl_.kc * (bl_.a_once ? bl_.num_kb : 1) : 0;
      int64_t bp_elems = bl_.pack_b ? round_up(bl_.nc, bl_.nr) * bl_.kc : 0;
      int64_t cp_elems = bl_.num_kb > 1 && !bl_.acc_out ? bl_.task_rows * bl_.task_cols : 0;
      // Each packed buffer is followed by slack: a vector (store_packed) and
      // VL k rows of a panel (the last block of emit_pack_transposed).
      int64_t ap_room = round_up(ap_elems + (ap_elems ? bl_.vl * (bl_.mr + 1) : 0), 16);
      int64_t bp_room = round_up(bp_elems + (bp_elems ? bl_.vl * (bl_.nr + 1) : 0), 16);
      ap_ = scratch;
      bp_ = b_.CreateGEP(et_, scratch, b_.getInt64(ap_room));
      cp_ = b_.CreateGEP(et_, bp_, b_.getInt64(bp_room));
      shape.scratch_bytes = (ap_room + bp_room + cp_elems) * eb_ + 64;
    }

    if (bl_.a_once) emit_pack_a_once();
    emit_for(
        b_, f_->getArg(1), f_->getArg(2), 1,
        [&](Value* task) {
          if (bl_.path == Path::Dot) {
            emit_dot_task(task);
          } else {
            emit_task(task);
          }
        },
        "task");
    b_.CreateRetVoid();

    shape.range = bl_.tasks;
    shape.grain = 1;
    double flops = 2.0 * mm_.m * mm_.n * mm_.k * mm_.batch;
    if (flops < 4 * kMinTaskCost) shape.grain = bl_.tasks;  // too small to split
    return f_;
  }

 private:
  Value* i64(int64_t v) { return b_.getInt64(v); }
  Value* min64(Value* a, Value* b) { return b_.CreateSelect(b_.CreateICmpSLT(a, b), a, b); }

  // ---------------------------------------------------------------- task

  void emit_task(Value* task) {
    Value* per_batch = i64(bl_.row_groups * bl_.col_blocks);
    bi_ = b_.CreateSDiv(task, per_batch);
    Value* rem = b_.CreateSRem(task, per_batch);
    Value* rg = b_.CreateSDiv(rem, i64(bl_.col_blocks));
    Value* cb = b_.CreateSRem(rem, i64(bl_.col_blocks));
    m_lo_ = b_.CreateMul(rg, i64(bl_.task_rows));
    m_hi_ = min64(b_.CreateAdd(m_lo_, i64(bl_.task_rows)), i64(mm_.m));
    n_lo_ = b_.CreateMul(cb, i64(bl_.task_cols));
    n_hi_ = min64(b_.CreateAdd(n_lo_, i64(bl_.task_cols)), i64(mm_.n));
    // K blocks: all but the last share one copy of the code (a runtime loop
    // whose first iteration starts from zero); the last applies the epilogue.
    int64_t kc = bl_.kc;
    int64_t kc_last = mm_.k - (bl_.num_kb - 1) * kc;
    // When all blocks are equally long (k a multiple of the block count), the
    // last one runs in the same loop too: one copy of the packing and the
    // micro-kernel, whose end picks the epilogue or keeping the sums at run time.
    if (bl_.num_kb > 1 && kc_last == kc) {
      emit_for(
          b_, i64(0), i64(bl_.num_kb), 1,
          [&](Value* kb) {
            emit_k_block(b_.CreateMul(kb, i64(kc)), kc, b_.CreateICmpEQ(kb, i64(0)),
                         b_.CreateICmpEQ(kb, i64(bl_.num_kb - 1)));
          },
          "kb");
      return;
    }
    if (bl_.num_kb > 1) {
      emit_for(
          b_, i64(0), i64(bl_.num_kb - 1), 1,
          [&](Value* kb) {
            Value* first = b_.CreateICmpEQ(kb, i64(0));
            emit_k_block(b_.CreateMul(kb, i64(kc)), kc, first, b_.getFalse());
          },
          "kb");
    }
    emit_k_block(i64((bl_.num_kb - 1) * kc), kc_last,
                 bl_.num_kb == 1 ? b_.getTrue() : b_.getFalse(), b_.getTrue());
  }

  // ---------------------------------------------------------------- dot

  // One task: rows [m_lo, m_hi) and columns [n_lo, n_hi) of one batch, in
  // tiles of MR rows x NR columns: a short n's column tiles unrolled, a wide
  // one's in a loop (and the last, narrower tile of the last column block).
  void emit_dot_task(Value* task) {
    Value* per_batch = i64(bl_.row_groups * bl_.col_blocks);
    bi_ = b_.CreateSDiv(task, per_batch);
    Value* rem = b_.CreateSRem(task, per_batch);
    Value* rg = b_.CreateSDiv(rem, i64(bl_.col_blocks));
    Value* cb = b_.CreateSRem(rem, i64(bl_.col_blocks));
    m_lo_ = b_.CreateMul(rg, i64(bl_.task_rows));
    m_hi_ = min64(b_.CreateAdd(m_lo_, i64(bl_.task_rows)), i64(mm_.m));
    n_lo_ = b_.CreateMul(cb, i64(bl_.task_cols));
    n_hi_ = min64(b_.CreateAdd(n_lo_, i64(bl_.task_cols)), i64(mm_.n));
    if (!wide_dot(mm_)) {
      emit_for(
          b_, m_lo_, m_hi_, bl_.mr,
          [&](Value* m0) {
            for (int64_t n0 = 0; n0 < mm_.n; n0 += bl_.nr)
              emit_dot_tile(m0, i64(n0), static_cast<int>(std::min<int64_t>(bl_.nr, mm_.n - n0)));
          },
          "dm");
      return;
    }
    const int64_t whole = mm_.n / bl_.nr * bl_.nr;  // columns in whole tiles
    const int edge = static_cast<int>(mm_.n - whole);
    emit_for(
        b_, m_lo_, m_hi_, bl_.mr,
        [&](Value* m0) {
          emit_for(
              b_, n_lo_, min64(n_hi_, i64(whole)), bl_.nr,
              [&](Value* n0) { emit_dot_tile(m0, n0, bl_.nr); }, "dn");
          if (edge == 0) return;
          llvm::LLVMContext& c = m_.getContext();
          auto* tail = llvm::BasicBlock::Create(c, "dn.edge", f_);
          auto* done = llvm::BasicBlock::Create(c, "dn.done", f_);
          b_.CreateCondBr(b_.CreateICmpEQ(n_hi_, i64(mm_.n)), tail, done);
          b_.SetInsertPoint(tail);
          emit_dot_tile(m0, i64(whole), edge);
          b_.CreateBr(done);
          b_.SetInsertPoint(done);
        },
        "dm");
  }

  // acc[i][j] += A[m0 + i, k:k+VL] * B[k:k+VL, n0 + j] over k, then each
  // row's cols horizontal sums go into one vector for the epilogue.
  void emit_dot_tile(Value* m0, Value* n0, int cols) {
    const int mr = bl_.mr, vl = bl_.vl;
    std::vector<llvm::AllocaInst*> acc(mr * cols);
    {
      llvm::IRBuilder<> eb(entry_, entry_->begin());
      for (auto& a : acc) a = eb.CreateAlloca(vt_, nullptr, "d");
    }
    for (auto* a : acc) b_.CreateStore(llvm::Constant::getNullValue(vt_), a);
    std::vector<Value*> row(mr);
    for (int i = 0; i < mr; ++i) row[i] = min64(b_.CreateAdd(m0, i64(i)), i64(mm_.m - 1));
    auto step = [&](Value* k, Value* mask) {
      auto load = [&](Value* p) {
        if (mask)
          return static_cast<Value*>(
              b_.CreateMaskedLoad(vt_, p, ealign(), mask, llvm::Constant::getNullValue(vt_)));
        return static_cast<Value*>(b_.CreateAlignedLoad(vt_, p, ealign()));
      };
      std::vector<Value*> av(mr);
      for (int i = 0; i < mr; ++i) av[i] = load(a_ptr(row[i], k));
      for (int j = 0; j < cols; ++j) {
        Value* bv = load(b_ptr(k, b_.CreateAdd(n0, i64(j))));
        for (int i = 0; i < mr; ++i) {
          Value* c = b_.CreateLoad(vt_, acc[i * cols + j]);
          b_.CreateStore(fma(av[i], bv, c), acc[i * cols + j]);
        }
      }
    };
    int64_t full = mm_.k / vl * vl;
    emit_for(b_, i64(0), i64(full), vl, [&](Value* k) { step(k, nullptr); }, "dk");
    if (mm_.k > full) step(i64(full), lane_mask(i64(mm_.k - full)));
    llvm::LLVMContext& c = m_.getContext();
    auto* sums = [&] {
      llvm::IRBuilder<> eb(entry_, entry_->begin());
      return eb.CreateAlloca(vt_, nullptr, "dsum");
    }();
    Value* mask = cols < vl ? lane_mask(i64(cols)) : nullptr;
    for (int i = 0; i < mr; ++i) {
      auto* in = llvm::BasicBlock::Create(c, "drow", f_);
      auto* next = llvm::BasicBlock::Create(c, "drow.next", f_);
      b_.CreateCondBr(b_.CreateICmpSLT(b_.CreateAdd(m0, i64(i)), m_hi_), in, next);
      b_.SetInsertPoint(in);
      std::vector<Value*> row_acc(cols);
      for (int j = 0; j < cols; ++j) row_acc[j] = b_.CreateLoad(vt_, acc[i * cols + j]);
      Value* v = horizontal_sums(row_acc);
      std::vector<Value*> sc(cols);
      for (int j = 0; j < cols; ++j) sc[j] = b_.CreateExtractElement(v, i64(j));
      if (native_masks() || cols == vl) {
        b_.CreateStore(v, sums);
        epilogue(i, 0, m0, n0, sums, mask);
      } else {
        for (int j = 0; j < cols; ++j)
          epilogue_at(b_.CreateAdd(m0, i64(i)), b_.CreateAdd(n0, i64(j)), sc[j], nullptr, 1);
      }
      b_.CreateBr(next);
      b_.SetInsertPoint(next);
    }
  }

  // Lane j of the result: the sum of the lanes of x[j] (x.size() <= VL).
  // A tree of pairwise merges instead of one reduction per vector: each merge
  // halves the lanes every sum is spread over and packs two vectors' partial
  // sums into one (two shuffles and an add), so cols vectors cost about
  // 2 * cols merges where cols separate reductions cost log2(VL) each.
  Value* horizontal_sums(const std::vector<Value*>& x) {
    const int vl = bl_.vl;
    Value* zero = llvm::Constant::getNullValue(vt_);
    std::vector<Value*> vecs = x;
    std::vector<std::vector<int>> ids;  // per vector: the output of each lane block
    for (size_t j = 0; j < x.size(); ++j) ids.push_back({static_cast<int>(j)});
    for (int w = vl; w > 1; w /= 2) {  // w: lanes per output in every vector
      if (vecs.size() % 2) vecs.push_back(zero), ids.push_back(std::vector<int>(ids[0].size(), -1));
      std::vector<Value*> next;
      std::vector<std::vector<int>> next_ids;
      for (size_t p = 0; p < vecs.size(); p += 2) {
        // Blocks of w/2 lanes: a's block q, then b's block q, for each q.
        std::vector<int> lo(vl), hi(vl), merged;
        for (int pos = 0; pos < vl; ++pos) {
          int blk = pos / (w / 2), l = pos % (w / 2), src = (blk % 2) * vl + (blk / 2) * w + l;
          lo[pos] = src;
          hi[pos] = src + w / 2;
        }
        for (size_t q = 0; q < ids[p].size(); ++q)
          merged.push_back(ids[p][q]), merged.push_back(ids[p + 1][q]);
        Value* a = b_.CreateShuffleVector(vecs[p], vecs[p + 1], lo);
        Value* c = b_.CreateShuffleVector(vecs[p], vecs[p + 1], hi);
        next.push_back(is_float_ ? b_.CreateFAdd(a, c) : b_.CreateAdd(a, c));
        next_ids.push_back(merged);
      }
      vecs = std::move(next);
      ids = std::move(next_ids);
    }
    FJ_CHECK(vecs.size() == 1, "kernel ", k_.name, ": horizontal sums left ", vecs.size());
    std::vector<int> perm(vl, 0);
    for (int pos = 0; pos < vl; ++pos)
      if (ids[0][pos] >= 0) perm[ids[0][pos]] = pos;
    return b_.CreateShuffleVector(vecs[0], vecs[0], perm);
  }

  // Every K block of A, each into its own slot of the A buffer (a_once).
  void emit_pack_a_once() {
    bi_ = i64(0);  // A is the same in every batch
    m_lo_ = i64(0);
    m_hi_ = i64(mm_.m);
    const int64_t kc = bl_.kc, kc_last = mm_.k - (bl_.num_kb - 1) * kc;
    auto block = [&](Value* k0, int64_t len) { emit_pack_a(m_lo_, m_hi_, k0, len, a_slot(k0)); };
    if (bl_.num_kb > 1)
      emit_for(
          b_, i64(0), i64(bl_.num_kb - 1), 1,
          [&](Value* kb) { block(b_.CreateMul(kb, i64(kc)), kc); }, "pak");
    block(i64((bl_.num_kb - 1) * kc), kc_last);
  }
  // The packed A of the K block starting at k0: its own slot with a_once.
  Value* a_slot(Value* k0) {
    if (!bl_.a_once) return ap_;
    return b_.CreateGEP(ot_, ap_, b_.CreateMul(k0, i64(round_up(bl_.mc, bl_.mr))));
  }

  void emit_k_block(Value* k0, int64_t kc, Value* first, Value* last) {
    if (bl_.pack_b) emit_pack_b(k0, kc);
    a_block_ = a_slot(k0);
    emit_for(
        b_, m_lo_, m_hi_, bl_.mc,
        [&](Value* ic) {
          Value* mc_hi = min64(b_.CreateAdd(ic, i64(bl_.mc)), m_hi_);
          if (bl_.pack_a && !bl_.a_once) emit_pack_a(ic, mc_hi, k0, kc, ap_);
          auto tile = [&](Value* ir, Value* jr) {
            emit_micro_tile(ic, jr, ir, mc_hi, k0, kc, first, last);
          };
          if (bl_.rows_outer) {
            emit_for(
                b_, ic, mc_hi, bl_.mr,
                [&](Value* ir) {
                  emit_for(b_, n_lo_, n_hi_, bl_.nr, [&](Value* jr) { tile(ir, jr); }, "jr");
                },
                "ir");
            return;
          }
          emit_for(
              b_, n_lo_, n_hi_, bl_.nr,
              [&](Value* jr) {
                emit_for(b_, ic, mc_hi, bl_.mr, [&](Value* ir) { tile(ir, jr); }, "ir");
              },
              "jr");
        },
        "ic");
  }

  // A element (batch bi, row m, col k) address.
  Value* a_ptr(Value* m, Value* k) {
    const Access& a = mm_.a;
    Value* off = i64(a.offset);
    off = b_.CreateAdd(off, b_.CreateMul(bi_, i64(a.strides[0])));
    off = b_.CreateAdd(off, b_.CreateMul(m, i64(a.strides[1])));
    off = b_.CreateAdd(off, b_.CreateMul(k, i64(a.strides[2])));
    return b_.CreateGEP(ot_, ptrs_.at(a.arg), off);
  }
  Value* b_ptr(Value* k, Value* n) {
    const Access& a = mm_.b;
    Value* off = i64(a.offset);
    off = b_.CreateAdd(off, b_.CreateMul(bi_, i64(a.strides[0])));
    off = b_.CreateAdd(off, b_.CreateMul(k, i64(a.strides[1])));
    off = b_.CreateAdd(off, b_.CreateMul(n, i64(a.strides[2])));
    return b_.CreateGEP(ot_, ptrs_.at(a.arg), off);
  }

  llvm::Align ealign() const { return llvm::Align(eb_); }

  // Bp[q][k][j] = B[k0 + k, n_lo + q*NR + j], zero beyond n_hi.
  void emit_pack_b(Value* k0, int64_t kc) {
    const auto& st = mm_.b.strides;  // (batch, k, n)
    if (bl_.pairs) {
      emit_pack_b_pairs(k0, kc);
      return;
    }
    if (mm_.plain(1) && st[2] == 1) {
      emit_pack_b_rows(k0, kc);
      return;
    }
    emit_for(
        b_, n_lo_, n_hi_, bl_.nr,
        [&](Value* n0) {
          Value* q = b_.CreateSDiv(b_.CreateSub(n0, n_lo_), i64(bl_.nr));
          Value* panel = b_.CreateGEP(et_, bp_, b_.CreateMul(q, i64(kc * bl_.nr)));
          Value* width = b_.CreateSub(n_hi_, n0);  // valid columns in this panel (may exceed NR)
          auto src = [&](Value* line, Value* k) {
            return b_ptr(b_.CreateAdd(k, k0), b_.CreateAdd(n0, line));
          };
          if (!mm_.plain(1)) {
            emit_pack_general(1, n0, width, bl_.nr, panel, k0, kc);
          } else if (st[2] == 1) {
            emit_pack_lines_contiguous(src, width, bl_.nr, panel, kc);
          } else if (st[1] == 1) {
            emit_pack_transposed(src, width, bl_.nr, panel, kc);
          } else {
            emit_pack_scalar(src, width, bl_.nr, panel, kc);
          }
        },
        "pbn");
  }

  // B's rows contiguous along n: row by row, each row's task columns into
  // every panel. The reads run along the rows, which the hardware
  // prefetchers follow; panel by panel they would read NR columns of each row
  // a row stride apart (4K on 1024^3), a demand miss per row.
  void emit_pack_b_rows(Value* k0, int64_t kc) {
    const int nr = bl_.nr, vl = bl_.vl;
    Value* whole_end = b_.CreateAdd(
        n_lo_, b_.CreateMul(b_.CreateSDiv(b_.CreateSub(n_hi_, n_lo_), i64(nr)), i64(nr)));
    emit_for(
        b_, i64(0), i64(kc), 1,
        [&](Value* k) {
          auto panel = [&](Value* n0, bool masked) {
            Value* q = b_.CreateSDiv(b_.CreateSub(n0, n_lo_), i64(nr));
            Value* row = b_.CreateAdd(b_.CreateMul(q, i64(kc * nr)), b_.CreateMul(k, i64(nr)));
            for (int g = 0; g < nr; g += vl) {
              Value* src = b_ptr(b_.CreateAdd(k, k0), b_.CreateAdd(n0, i64(g)));
              Value* x = masked ? (Value*)b_.CreateMaskedLoad(
                                      vt_, src, ealign(),
                                      lane_mask(b_.CreateSub(b_.CreateSub(n_hi_, n0), i64(g))),
                                      llvm::Constant::getNullValue(vt_))
                                : b_.CreateAlignedLoad(vt_, src, ealign());
              b_.CreateAlignedStore(x, b_.CreateGEP(et_, bp_, b_.CreateAdd(row, i64(g))), ealign());
            }
          };
          emit_for(b_, n_lo_, whole_end, nr, [&](Value* n0) { panel(n0, false); }, "pbr");
          if (col_edges()) {
            llvm::LLVMContext& c = m_.getContext();
            auto* edge = llvm::BasicBlock::Create(c, "pbr.edge", f_);
            auto* done = llvm::BasicBlock::Create(c, "pbr.done", f_);
            b_.CreateCondBr(b_.CreateICmpSLT(whole_end, n_hi_), edge, done);
            b_.SetInsertPoint(edge);
            panel(whole_end, true);
            b_.CreateBr(done);
            b_.SetInsertPoint(done);
          }
        },
        "pbk");
  }

  // Ap[p][k][i] = A[ic + p*MR + i, k0 + k], zero beyond mc_hi.
  void emit_pack_a(Value* ic, Value* mc_hi, Value* k0, int64_t kc, Value* dst) {
    const auto& st = mm_.a.strides;  // (batch, m, k)
    if (bl_.pairs) {
      emit_pack_a_pairs(ic, mc_hi, k0, kc, dst);
      return;
    }
    emit_for(
        b_, ic, mc_hi, bl_.mr,
        [&](Value* m0) {
          Value* p = b_.CreateSDiv(b_.CreateSub(m0, ic), i64(bl_.mr));
          Value* panel = b_.CreateGEP(et_, dst, b_.CreateMul(p, i64(kc * bl_.mr)));
          Value* rows = b_.CreateSub(mc_hi, m0);
          auto src = [&](Value* line, Value* k) {
            return a_ptr(b_.CreateAdd(m0, line), b_.CreateAdd(k, k0));
          };
          if (!mm_.plain(0)) {
            emit_pack_general(0, m0, rows, bl_.mr, panel, k0, kc);
          } else if (st[1] == 1) {
            emit_pack_lines_contiguous(src, rows, bl_.mr, panel, kc);
          } else if (st[2] == 1) {
            emit_pack_transposed(src, rows, bl_.mr, panel, kc);
          } else {
            emit_pack_scalar(src, rows, bl_.mr, panel, kc);
          }
        },
        "pam");
  }

  // The packing routines copy a panel of `lines` lines (columns of B or rows
  // of A) into dst[k * lines + line], zero-filling lines >= valid. src(line,
  // k) is the element's address; it is only dereferenced for valid lines.

  // Lines adjacent in memory: for each k, vector loads across the lines.
  void emit_pack_lines_contiguous(const std::function<Value*(Value*, Value*)>& src, Value* valid,
                                  int lines, Value* dst, int64_t kc) {
    auto body = [&](bool whole) {
      emit_for(
          b_, i64(0), i64(kc), 1,
          [&](Value* k) {
            for (int g = 0; g < lines; g += bl_.vl) {
              int n = std::min(bl_.vl, lines - g);
              Value* x;
              if (whole && n == bl_.vl) {
                x = b_.CreateAlignedLoad(vt_, src(i64(g), k), ealign());
              } else {
                Value* mask =
                    b_.CreateAnd(lane_mask(b_.CreateSub(valid, i64(g))), lane_mask(i64(n)));
                x = b_.CreateMaskedLoad(vt_, src(i64(g), k), ealign(), mask,
                                        llvm::Constant::getNullValue(vt_));
              }
              Value* d = b_.CreateGEP(et_, dst, b_.CreateAdd(b_.CreateMul(k, i64(lines)), i64(g)));
              store_packed(x, d, n, lines);
            }
          },
          "pk");
    };
    whole_or_part(valid, lines, body);
  }

  // body(true) when all `lines` lines are valid, else body(false).
  void whole_or_part(Value* valid, int lines, const std::function<void(bool)>& body) {
    llvm::LLVMContext& c = m_.getContext();
    auto* whole = llvm::BasicBlock::Create(c, "pack.whole", f_);
    auto* part = llvm::BasicBlock::Create(c, "pack.part", f_);
    auto* done = llvm::BasicBlock::Create(c, "pack.done", f_);
    b_.CreateCondBr(b_.CreateICmpSGE(valid, i64(lines)), whole, part);
    b_.SetInsertPoint(whole);
    body(true);
    b_.CreateBr(done);
    b_.SetInsertPoint(part);
    body(false);
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  // Stores the first n lanes of x at d, the packed line group of a panel of
  // `lines` lines. A panel narrower than a vector (MR rows of A: 6 of 8 AVX2
  // lanes) is stored with whole vectors where there are no mask registers
  // (vmaskmovps stores are slow): the k rows are stored in increasing order,
  // so each store's extra lanes land in the next row and are overwritten by
  // its own store; the last one's land in the next panel (written later) or
  // in the vector of slack after each packed buffer (emit).
  void store_packed(Value* x, Value* d, int n, int lines) {
    if (n == bl_.vl) {
      b_.CreateAlignedStore(x, d, ealign());
    } else if (!native_masks() && n == lines) {
      b_.CreateAlignedStore(x, d, ealign());
    } else {
      b_.CreateMaskedStore(x, d, ealign(), lane_mask(i64(n)));
    }
  }

  // Each line contiguous along k: blocks of VL lines x VL k are loaded as VL
  // vectors along k, transposed in registers, and stored as VL vectors
  // across the lines. One copy of the block's code for every block (the
  // transpose's shuffles are the costliest code of the kernel to compile):
  // lines past `valid` load as zeros under a lane mask (invariant in the k
  // loop), and when kc is not a multiple of VL the last block starts VL
  // before kc, repacking some rows of the one before (kc < VL: k past kc
  // loads as zeros, and the block's extra rows land in the next panel,
  // packed after this one, or the slack after the buffer: emit).
  void emit_pack_transposed(const std::function<Value*(Value*, Value*)>& src, Value* valid,
                            int lines, Value* dst, int64_t kc) {
    const int vl = bl_.vl;
    Value* kmask = kc < vl ? lane_mask(i64(kc)) : nullptr;
    auto group = [&](Value* g, int n) {
      std::vector<Value*> ok(n), line(n), mask(n);
      for (int j = 0; j < n; ++j) {
        Value* l = b_.CreateAdd(g, i64(j));
        ok[j] = b_.CreateICmpSLT(l, valid);
        line[j] = b_.CreateSelect(ok[j], l, i64(0));
        mask[j] = b_.CreateVectorSplat(vl, ok[j]);
        if (kmask) mask[j] = b_.CreateAnd(kmask, mask[j]);
      }
      emit_for(
          b_, i64(0), i64(round_up(kc, vl)), vl,
          [&](Value* kb) {
            Value* kk = kc > vl && kc % vl != 0 ? min64(kb, i64(kc - vl)) : kb;
            std::vector<Value*> v(vl);
            for (int j = 0; j < vl; ++j)
              v[j] = j >= n ? static_cast<Value*>(llvm::Constant::getNullValue(vt_))
                            : b_.CreateMaskedLoad(vt_, src(line[j], kk), ealign(), mask[j],
                                                  llvm::Constant::getNullValue(vt_));
            store_transposed(v, kk, g, n, lines, dst);
          },
          "pt");
    };
    for_each_group(lines, group, "ptg");
  }

  // Groups of VL lines: the whole ones in a loop (one copy of their code),
  // then the partial one. group(first line, lines in the group).
  void for_each_group(int lines, const std::function<void(Value*, int)>& group, const char* name) {
    const int vl = bl_.vl;
    const int whole = lines / vl * vl;
    if (whole == vl) {
      group(i64(0), vl);
    } else if (whole > vl) {
      emit_for(b_, i64(0), i64(whole), vl, [&](Value* g) { group(g, vl); }, name);
    }
    if (lines > whole) group(i64(whole), lines - whole);
  }

  // v[j] holds VL consecutive k (from kk) of line g + j: transposed, row t
  // goes to panel row kk + t, lines g.. (n of them).
  void store_transposed(std::vector<Value*>& v, Value* kk, Value* g, int n, int lines, Value* dst) {
    transpose_in_registers(v);
    for (int t = 0; t < bl_.vl; ++t) {
      Value* d = b_.CreateGEP(et_, dst,
                              b_.CreateAdd(b_.CreateMul(b_.CreateAdd(kk, i64(t)), i64(lines)), g));
      store_packed(v[t], d, n, lines);
    }
  }

  // v[r] holds row r of a VL x VL block; afterwards v[r] holds column r.
  // log2(VL) stages, each swapping the off-diagonal blocks of size b.
  void transpose_in_registers(std::vector<Value*>& v) {
    const int vl = static_cast<int>(v.size());
    for (int b = vl / 2; b >= 1; b /= 2) {
      std::vector<int> lo(vl), hi(vl);
      for (int c = 0; c < vl; ++c) {
        lo[c] = (c & b) ? vl + c - b : c;
        hi[c] = (c & b) ? vl + c : c + b;
      }
      for (int r = 0; r < vl; ++r) {
        if (r & b) continue;
        Value* x = v[r];
        Value* y = v[r + b];
        v[r] = b_.CreateShuffleVector(x, y, lo);
        v[r + b] = b_.CreateShuffleVector(x, y, hi);
      }
    }
  }

  // The row-major digits of `flat` (a scalar or a vector of indices) over
  // the extents `ext`; the first digit is not reduced.
  std::vector<Value*> split_digits(Value* flat, const std::vector<int64_t>& ext) {
    std::vector<Value*> d(ext.size());
    for (size_t i = ext.size(); i-- > 0;) {
      if (i == 0) {
        d[0] = flat;
        break;
      }
      Value* e = llvm::ConstantInt::get(flat->getType(), static_cast<uint64_t>(ext[i]));
      d[i] = b_.CreateURem(flat, e);
      flat = b_.CreateUDiv(flat, e);
    }
    return d;
  }

  // Implicit GEMM operands (kernel.h, MatMulSpec digits): for each k, the
  // digits of k once, then VL lines at a time: their digits, the element
  // offsets and the guarded coordinates as vectors, and a masked gather.
  // Index arithmetic is 32-bit when the buffer and extents allow (AVX2 has
  // no 64-bit vector multiply).
  void emit_pack_general(int operand, Value* line0, Value* valid, int lines, Value* dst, Value* k0,
                         int64_t kc) {
    const Access& acc = operand == 0 ? mm_.a : mm_.b;
    const std::vector<int64_t>& rows = operand == 0 ? mm_.a_rows : mm_.b_rows;
    const std::vector<int64_t>& cols = operand == 0 ? mm_.a_cols : mm_.b_cols;
    const std::vector<int64_t>& kdig = operand == 0 ? cols : rows;
    const std::vector<int64_t>& ldig = operand == 0 ? rows : cols;
    std::vector<int64_t> batch =
        mm_.batch_digits.empty() ? std::vector<int64_t>{mm_.batch} : mm_.batch_digits;
    const int vl = bl_.vl;
    bool narrow = k_.args.at(acc.arg).elements < (int64_t{1} << 30) && mm_.m < (1 << 30) &&
                  mm_.n < (1 << 30) && mm_.k < (1 << 30) && mm_.batch < (1 << 30);
    for (const Coord& c : acc.coords)
      narrow &= std::abs(c.c0) < (1 << 28) && c.limit * c.div < (1 << 28);
    llvm::Type* it = narrow ? b_.getInt32Ty() : b_.getInt64Ty();
    auto cs = [&](int64_t v) { return llvm::ConstantInt::get(it, static_cast<uint64_t>(v), true); };
    auto cv = [&](int64_t v) { return b_.CreateVectorSplat(vl, cs(v)); };
    auto digits = [&](Value* flat, const std::vector<int64_t>& ext) {
      return split_digits(flat, ext);
    };
    auto to_it = [&](Value* v) { return b_.CreateIntCast(v, it, true); };
    std::vector<Value*> bd = digits(to_it(bi_), batch);
    std::vector<llvm::Constant*> iota;
    for (int l = 0; l < vl; ++l) iota.push_back(cs(l));
    Value* lanes = llvm::ConstantVector::get(iota);
    // Index dims {batch..., rows..., cols...}; the lines' are vectors, the
    // others (batch, k) scalars.
    const size_t nb = bd.size();
    const size_t line_dim0 = operand == 0 ? nb : nb + rows.size();
    const size_t ndims = acc.strides.size();
    FJ_CHECK(ndims == nb + rows.size() + cols.size(), "kernel ", k_.name, ": operand index dims");
    auto is_line = [&](size_t d) { return d >= line_dim0 && d < line_dim0 + ldig.size(); };
    std::vector<std::vector<Value*>> group_digits;
    for (int g = 0; g < lines; g += vl)
      group_digits.push_back(digits(
          b_.CreateAdd(b_.CreateVectorSplat(vl, to_it(b_.CreateAdd(line0, i64(g)))), lanes), ldig));
    // The element of each lane: a masked gather at the guarded offsets.
    auto gather = [&](const std::vector<Value*>& kd, int g) {
      const int n = std::min(vl, lines - g);
      const std::vector<Value*>& ld = group_digits[static_cast<size_t>(g / vl)];
      std::vector<Value*> dims;
      for (Value* v : bd) dims.push_back(b_.CreateVectorSplat(vl, v));
      const std::vector<Value*>& rd = operand == 0 ? ld : kd;
      const std::vector<Value*>& cd = operand == 0 ? kd : ld;
      for (Value* v : rd)
        dims.push_back(v->getType()->isVectorTy() ? v : b_.CreateVectorSplat(vl, v));
      for (Value* v : cd)
        dims.push_back(v->getType()->isVectorTy() ? v : b_.CreateVectorSplat(vl, v));
      auto affine = [&](const std::vector<int64_t>& coef, int64_t c0) {
        Value* r = cv(c0);
        for (size_t d = 0; d < dims.size(); ++d)
          if (coef[d] != 0)
            r = b_.CreateAdd(r, coef[d] == 1 ? dims[d] : b_.CreateMul(dims[d], cv(coef[d])));
        return r;
      };
      Value* off = affine(acc.strides, acc.offset);
      Value* m = b_.CreateAnd(lane_mask(b_.CreateSub(valid, i64(g))), lane_mask(i64(n)));
      for (const Coord& c : acc.coords) {
        Value* x = affine(c.coef, c.c0);
        Value* ok =
            b_.CreateAnd(b_.CreateICmpSGE(x, cv(0)), b_.CreateICmpSLT(x, cv(c.limit * c.div)));
        Value* q = b_.CreateSelect(ok, x, cv(0));
        if (c.div != 1) {
          ok = b_.CreateAnd(ok, b_.CreateICmpEQ(b_.CreateURem(q, cv(c.div)), cv(0)));
          q = b_.CreateSelect(ok, b_.CreateUDiv(q, cv(c.div)), cv(0));
        }
        off = b_.CreateAdd(off, b_.CreateMul(q, cv(c.stride)));
        m = b_.CreateAnd(m, ok);
      }
      Value* ptrs = b_.CreateGEP(et_, ptrs_.at(acc.arg), off);
      return static_cast<Value*>(
          b_.CreateMaskedGather(vt_, ptrs, ealign(), m, llvm::Constant::getNullValue(vt_)));
    };
    auto store = [&](Value* x, Value* k, int g) {
      const int n = std::min(vl, lines - g);
      Value* d = b_.CreateGEP(et_, dst, b_.CreateAdd(b_.CreateMul(k, i64(lines)), i64(g)));
      if (n == vl) {
        b_.CreateAlignedStore(x, d, ealign());
      } else {
        b_.CreateMaskedStore(x, d, ealign(), lane_mask(i64(n)));
      }
    };
    bool affine_coords = acc.indirect.empty();
    for (const Coord& c : acc.coords) affine_coords &= c.div == 1;
    if (!affine_coords) {
      emit_for(
          b_, i64(0), i64(kc), 1,
          [&](Value* k) {
            std::vector<Value*> kd = digits(to_it(b_.CreateAdd(k, k0)), kdig);
            for (int g = 0; g < lines; g += vl) store(gather(kd, g), k, g);
          },
          "pg");
      return;
    }
    // Every coordinate and the offset computed from them unguarded are sums
    // of a part of the scalar dims (batch and k, once per k for all groups)
    // and a part of the line dims (a vector per group, once for all k).
    // Where a group's lines are consecutive elements (its offsets' line part
    // grows by one per lane: a conv's output positions along an input row),
    // the group is one masked load at lane 0's offset, its mask the lanes
    // whose coordinates are in range: a few vector operations per k instead
    // of the gather, which AVX2 hosts that prefer no gather run element by
    // element. Masked-off lanes are not read, so lane 0's offset may lie
    // outside the buffer (a left padding column).
    std::vector<int64_t> raw_coef(acc.strides);
    int64_t raw_c0 = acc.offset;
    for (const Coord& c : acc.coords) {
      raw_c0 += c.stride * c.c0;
      for (size_t d = 0; d < ndims; ++d) raw_coef[d] += c.stride * c.coef[d];
    }
    // Runs along k instead (a filter gradient's operands: consecutive k are
    // consecutive output positions along a row, and the lines are channels
    // and taps): each line's VL consecutive k are loaded as one or two runs
    // and VL lines transposed in registers.
    const size_t k_dim0 = operand == 0 ? nb + rows.size() : nb;
    auto run_length = [&](const std::vector<int64_t>& dig, size_t dim0) -> int64_t {
      return !dig.empty() && raw_coef[dim0 + dig.size() - 1] == 1 ? dig.back() : 0;
    };
    if (run_length(kdig, k_dim0) > run_length(ldig, line_dim0)) {
      emit_pack_general_along_k(acc, kdig, ldig, k_dim0, line_dim0, bd, raw_coef, raw_c0, it, line0,
                                valid, lines, dst, k0, kc);
      return;
    }
    auto line_part = [&](const std::vector<int64_t>& coef, const std::vector<Value*>& ld) {
      Value* r = cv(0);
      for (size_t i = 0; i < ld.size(); ++i)
        if (int64_t a = coef[line_dim0 + i]; a != 0)
          r = b_.CreateAdd(r, a == 1 ? ld[i] : b_.CreateMul(ld[i], cv(a)));
      return r;
    };
    // A group that crosses the end of an input row (rows not a whole number
    // of vectors: LeNet's 28 and 14) is two such runs where its lanes before
    // and from the first break each grow by one: two masked loads.
    struct Group {
      Value* contiguous;          // i1: one run
      Value* two_runs;            // i1: two runs, the second from lane `split`
      Value* first;               // lane 0's line part of the raw offset
      Value* second;              // that of lane `split`, less `split`
      Value* low;                 // lanes < split
      Value* mask;                // the lanes that exist
      std::vector<Value*> coord;  // each coordinate's line part
    };
    std::vector<Group> groups;
    for (int g = 0; g < lines; g += vl) {
      const std::vector<Value*>& ld = group_digits[static_cast<size_t>(g / vl)];
      const int n = std::min(vl, lines - g);
      Group gr;
      Value* raw = line_part(raw_coef, ld);
      gr.first = b_.CreateExtractElement(raw, uint64_t{0});
      Value* same = b_.CreateICmpEQ(b_.CreateSub(raw, b_.CreateVectorSplat(vl, gr.first)), lanes);
      if (n < vl) same = b_.CreateOr(same, b_.CreateICmpSGE(lanes, cv(n)));  // lanes never loaded
      gr.contiguous = b_.CreateAndReduce(same);
      llvm::Type* bits_t = b_.getIntNTy(static_cast<unsigned>(vl));
      Value* split = b_.CreateIntCast(
          b_.CreateBinaryIntrinsic(llvm::Intrinsic::cttz,
                                   b_.CreateNot(b_.CreateBitCast(same, bits_t)), b_.getFalse()),
          it, false);  // the leading lanes of the first run (vl: all)
      gr.low = b_.CreateICmpSLT(lanes, b_.CreateVectorSplat(vl, split));
      Value* at = b_.CreateSelect(b_.CreateICmpSLT(split, cs(vl)), split, cs(vl - 1));
      gr.second = b_.CreateSub(b_.CreateExtractElement(raw, at), split);
      Value* tail = b_.CreateICmpEQ(b_.CreateSub(raw, b_.CreateVectorSplat(vl, gr.second)), lanes);
      if (n < vl) tail = b_.CreateOr(tail, b_.CreateICmpSGE(lanes, cv(n)));
      gr.two_runs = b_.CreateAndReduce(b_.CreateOr(gr.low, tail));
      gr.mask = b_.CreateAnd(lane_mask(b_.CreateSub(valid, i64(g))), lane_mask(i64(n)));
      for (const Coord& c : acc.coords) gr.coord.push_back(line_part(c.coef, ld));
      groups.push_back(std::move(gr));
    }
    emit_for(
        b_, i64(0), i64(kc), 1,
        [&](Value* k) {
          std::vector<Value*> kd = digits(to_it(b_.CreateAdd(k, k0)), kdig);
          std::vector<Value*> sdims(ndims, nullptr);  // the scalar dims' values
          for (size_t d = 0; d < nb; ++d) sdims[d] = bd[d];
          for (size_t d = nb, i = 0; d < ndims; ++d)
            if (!is_line(d)) sdims[d] = kd[i++];
          auto scalar_part = [&](const std::vector<int64_t>& coef, int64_t c0) {
            Value* r = cs(c0);
            for (size_t d = 0; d < ndims; ++d)
              if (sdims[d] && coef[d] != 0)
                r = b_.CreateAdd(r, coef[d] == 1 ? sdims[d] : b_.CreateMul(sdims[d], cs(coef[d])));
            return r;
          };
          Value* raw_k = scalar_part(raw_coef, raw_c0);
          std::vector<Value*> coord_k;
          for (const Coord& c : acc.coords) coord_k.push_back(scalar_part(c.coef, c.c0));
          for (int g = 0; g < lines; g += vl) {
            const Group& gr = groups[static_cast<size_t>(g / vl)];
            llvm::LLVMContext& c = m_.getContext();
            auto* load_bb = llvm::BasicBlock::Create(c, "pg.load", f_);
            auto* not_one_bb = llvm::BasicBlock::Create(c, "pg.runs", f_);
            auto* two_bb = llvm::BasicBlock::Create(c, "pg.load2", f_);
            auto* gather_bb = llvm::BasicBlock::Create(c, "pg.gather", f_);
            auto* done_bb = llvm::BasicBlock::Create(c, "pg.done", f_);
            // The lanes that exist and whose coordinates are in range.
            auto in_range = [&] {
              Value* m = gr.mask;
              for (size_t i = 0; i < acc.coords.size(); ++i) {
                Value* x = b_.CreateAdd(gr.coord[i], b_.CreateVectorSplat(vl, coord_k[i]));
                m = b_.CreateAnd(m, b_.CreateAnd(b_.CreateICmpSGE(x, cv(0)),
                                                 b_.CreateICmpSLT(x, cv(acc.coords[i].limit))));
              }
              return m;
            };
            auto run = [&](Value* line_part, Value* m) {
              Value* at = b_.CreateSExt(b_.CreateAdd(raw_k, line_part), b_.getInt64Ty());
              return static_cast<Value*>(
                  b_.CreateMaskedLoad(vt_, b_.CreateGEP(et_, ptrs_.at(acc.arg), at), ealign(), m,
                                      llvm::Constant::getNullValue(vt_)));
            };
            b_.CreateCondBr(gr.contiguous, load_bb, not_one_bb);
            b_.SetInsertPoint(load_bb);
            Value* loaded = run(gr.first, in_range());
            b_.CreateBr(done_bb);
            b_.SetInsertPoint(not_one_bb);
            b_.CreateCondBr(gr.two_runs, two_bb, gather_bb);
            b_.SetInsertPoint(two_bb);
            Value* m = in_range();
            Value* lo = run(gr.first, b_.CreateAnd(m, gr.low));
            Value* hi = run(gr.second, b_.CreateAnd(m, b_.CreateNot(gr.low)));
            Value* loaded2 = b_.CreateSelect(gr.low, lo, hi);
            b_.CreateBr(done_bb);
            b_.SetInsertPoint(gather_bb);
            Value* gathered = gather(kd, g);
            auto* gather_end = b_.GetInsertBlock();
            b_.CreateBr(done_bb);
            b_.SetInsertPoint(done_bb);
            llvm::PHINode* phi = b_.CreatePHI(vt_, 3);
            phi->addIncoming(loaded, load_bb);
            phi->addIncoming(loaded2, two_bb);
            phi->addIncoming(gathered, gather_end);
            store(phi, k, g);
          }
        },
        "pg");
  }

  // emit_pack_general's runs along k: for each block of VL k (the last one
  // ending at kc, as in emit_pack_transposed) the k digits' part of every
  // coordinate and of the unguarded offset is a vector shared by all lines,
  // each line's part a scalar made once per panel. A block whose offsets
  // grow by one per k (or do in two runs) is one or two masked loads per
  // line; another is a gather per line. VL lines are then transposed in
  // registers into VL rows of the panel.
  void emit_pack_general_along_k(const Access& acc, const std::vector<int64_t>& kdig,
                                 const std::vector<int64_t>& ldig, size_t k_dim0, size_t line_dim0,
                                 const std::vector<Value*>& bd,
                                 const std::vector<int64_t>& raw_coef, int64_t raw_c0,
                                 llvm::Type* it, Value* line0, Value* valid, int lines, Value* dst,
                                 Value* k0, int64_t kc) {
    const int vl = bl_.vl;
    auto cs = [&](int64_t v) { return llvm::ConstantInt::get(it, static_cast<uint64_t>(v), true); };
    auto cv = [&](int64_t v) { return b_.CreateVectorSplat(vl, cs(v)); };
    auto to_it = [&](Value* v) { return b_.CreateIntCast(v, it, true); };
    auto digits = [&](Value* flat, const std::vector<int64_t>& ext) {
      return split_digits(flat, ext);
    };
    // A form's part over dims [dim0, dim0 + vals.size()) (vectors or scalars).
    auto part = [&](const std::vector<int64_t>& coef, size_t dim0, const std::vector<Value*>& vals,
                    Value* init) {
      Value* r = init;
      for (size_t i = 0; i < vals.size(); ++i) {
        int64_t a = coef[dim0 + i];
        if (a == 0) continue;
        Value* f = vals[i]->getType()->isVectorTy() ? cv(a) : cs(a);
        r = b_.CreateAdd(r, a == 1 ? vals[i] : b_.CreateMul(vals[i], f));
      }
      return r;
    };
    const size_t nc = acc.coords.size();
    std::vector<llvm::Constant*> iota;
    for (int l = 0; l < vl; ++l) iota.push_back(cs(l));
    Value* lanes = llvm::ConstantVector::get(iota);
    Value* zero = llvm::Constant::getNullValue(vt_);
    Value* kmask = kc < vl ? b_.CreateICmpSLT(lanes, cv(kc)) : nullptr;
    auto group = [&](Value* g, int n) {
      // Per line: whether it exists, and its parts (scalars, once per panel).
      std::vector<Value*> exists(n), raw_l(n);
      std::vector<std::vector<Value*>> coord_l(n);
      for (int j = 0; j < n; ++j) {
        Value* lj = b_.CreateAdd(g, i64(j));
        Value* l = b_.CreateAdd(line0, lj);
        exists[j] = b_.CreateVectorSplat(vl, b_.CreateICmpSLT(lj, valid));
        std::vector<Value*> ld = digits(to_it(l), ldig);
        raw_l[j] = part(raw_coef, line_dim0, ld, part(raw_coef, 0, bd, cs(raw_c0)));
        for (const Coord& c : acc.coords)
          coord_l[j].push_back(part(c.coef, line_dim0, ld, part(c.coef, 0, bd, cs(c.c0))));
      }
      emit_for(
          b_, i64(0), i64(round_up(kc, vl)), vl,
          [&](Value* kb) {
            Value* kk = kc > vl && kc % vl != 0 ? min64(kb, i64(kc - vl)) : kb;
            Value* kv = b_.CreateAdd(b_.CreateVectorSplat(vl, to_it(b_.CreateAdd(kk, k0))), lanes);
            std::vector<Value*> kd = digits(kv, kdig);
            Value* raw_k = part(raw_coef, k_dim0, kd, cv(0));
            std::vector<Value*> coord_k;
            for (const Coord& c : acc.coords) coord_k.push_back(part(c.coef, k_dim0, kd, cv(0)));
            // The runs of this block (the same for every line).
            Value* first = b_.CreateExtractElement(raw_k, uint64_t{0});
            Value* same =
                b_.CreateICmpEQ(b_.CreateSub(raw_k, b_.CreateVectorSplat(vl, first)), lanes);
            if (kmask) same = b_.CreateOr(same, b_.CreateNot(kmask));
            Value* one_run = b_.CreateAndReduce(same);
            Value* split = b_.CreateIntCast(
                b_.CreateBinaryIntrinsic(
                    llvm::Intrinsic::cttz,
                    b_.CreateNot(b_.CreateBitCast(same, b_.getIntNTy(static_cast<unsigned>(vl)))),
                    b_.getFalse()),
                it, false);
            Value* low = b_.CreateICmpSLT(lanes, b_.CreateVectorSplat(vl, split));
            Value* at = b_.CreateSelect(b_.CreateICmpSLT(split, cs(vl)), split, cs(vl - 1));
            Value* second = b_.CreateSub(b_.CreateExtractElement(raw_k, at), split);
            Value* tail =
                b_.CreateICmpEQ(b_.CreateSub(raw_k, b_.CreateVectorSplat(vl, second)), lanes);
            if (kmask) tail = b_.CreateOr(tail, b_.CreateNot(kmask));
            Value* two_runs = b_.CreateAndReduce(b_.CreateOr(low, tail));
            llvm::LLVMContext& c = m_.getContext();
            std::vector<Value*> v(vl, zero);
            for (int j = 0; j < n; ++j) {
              // The k whose coordinates are in range, of a line that exists.
              Value* m = kmask ? b_.CreateAnd(kmask, exists[j]) : exists[j];
              std::vector<Value*> x(nc);
              for (size_t i = 0; i < nc; ++i) {
                x[i] = b_.CreateAdd(coord_k[i], b_.CreateVectorSplat(vl, coord_l[j][i]));
                m = b_.CreateAnd(m, b_.CreateAnd(b_.CreateICmpSGE(x[i], cv(0)),
                                                 b_.CreateICmpSLT(x[i], cv(acc.coords[i].limit))));
              }
              auto load = [&](Value* k_part, Value* mask) {
                Value* off = b_.CreateSExt(b_.CreateAdd(raw_l[j], k_part), b_.getInt64Ty());
                return static_cast<Value*>(b_.CreateMaskedLoad(
                    vt_, b_.CreateGEP(et_, ptrs_.at(acc.arg), off), ealign(), mask, zero));
              };
              auto* one_bb = llvm::BasicBlock::Create(c, "pk.load", f_);
              auto* not_one_bb = llvm::BasicBlock::Create(c, "pk.runs", f_);
              auto* two_bb = llvm::BasicBlock::Create(c, "pk.load2", f_);
              auto* gather_bb = llvm::BasicBlock::Create(c, "pk.gather", f_);
              auto* done_bb = llvm::BasicBlock::Create(c, "pk.done", f_);
              b_.CreateCondBr(one_run, one_bb, not_one_bb);
              b_.SetInsertPoint(one_bb);
              Value* v1 = load(first, m);
              b_.CreateBr(done_bb);
              b_.SetInsertPoint(not_one_bb);
              b_.CreateCondBr(two_runs, two_bb, gather_bb);
              b_.SetInsertPoint(two_bb);
              Value* v2 = b_.CreateSelect(low, load(first, b_.CreateAnd(m, low)),
                                          load(second, b_.CreateAnd(m, b_.CreateNot(low))));
              b_.CreateBr(done_bb);
              b_.SetInsertPoint(gather_bb);
              // The offsets with each coordinate clamped into range where
              // masked off (the raw offset less what it contributed).
              Value* off = b_.CreateAdd(raw_k, b_.CreateVectorSplat(vl, raw_l[j]));
              for (size_t i = 0; i < nc; ++i) {
                Value* ok = b_.CreateAnd(b_.CreateICmpSGE(x[i], cv(0)),
                                         b_.CreateICmpSLT(x[i], cv(acc.coords[i].limit)));
                Value* q = b_.CreateSelect(ok, x[i], cv(0));
                off = b_.CreateAdd(off,
                                   b_.CreateMul(b_.CreateSub(q, x[i]), cv(acc.coords[i].stride)));
              }
              Value* v3 = b_.CreateMaskedGather(vt_, b_.CreateGEP(et_, ptrs_.at(acc.arg), off),
                                                ealign(), m, zero);
              b_.CreateBr(done_bb);
              b_.SetInsertPoint(done_bb);
              llvm::PHINode* phi = b_.CreatePHI(vt_, 3);
              phi->addIncoming(v1, one_bb);
              phi->addIncoming(v2, two_bb);
              phi->addIncoming(v3, gather_bb);
              v[j] = phi;
            }
            store_transposed(v, kk, g, n, lines, dst);
          },
          "pk");
    };
    for_each_group(lines, group, "pkgr");
  }

  // General strides: element by element.
  void emit_pack_scalar(const std::function<Value*(Value*, Value*)>& src, Value* valid, int lines,
                        Value* dst, int64_t kc) {
    emit_for(
        b_, i64(0), i64(lines), 1,
        [&](Value* j) {
          Value* ok = b_.CreateICmpSLT(j, valid);
          Value* line = b_.CreateSelect(ok, j, i64(0));
          emit_for(
              b_, i64(0), i64(kc), 1,
              [&](Value* k) {
                Value* x = b_.CreateAlignedLoad(et_, src(line, k), ealign());
                x = b_.CreateSelect(ok, x, llvm::Constant::getNullValue(et_));
                b_.CreateAlignedStore(
                    x, b_.CreateGEP(et_, dst, b_.CreateAdd(b_.CreateMul(k, i64(lines)), j)),
                    ealign());
              },
              "psk");
        },
        "psj");
  }

  // <VL x i1>: lane < valid.
  Value* lane_mask(Value* valid) {
    std::vector<llvm::Constant*> lanes;
    for (int l = 0; l < bl_.vl; ++l) lanes.push_back(b_.getInt64(l));
    Value* lv = llvm::ConstantVector::get(lanes);
    return b_.CreateICmpSLT(lv, b_.CreateVectorSplat(bl_.vl, valid));
  }

  Value* fma(Value* a, Value* b, Value* c) {
    if (is_float_) return b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {a->getType()}, {a, b, c});
    return b_.CreateAdd(b_.CreateMul(a, b), c);
  }

  // ---------------------------------------------------------- k pairs
  //
  // The bfloat16 micro-kernel's packed panels: for each k pair p of the K
  // block, a 32-bit cell per line (row of A, column of B) holding the line's
  // elements k0 + 2p and k0 + 2p + 1 (the first in the low half), as
  // vdpbf16ps multiplies them: cell (p, line) is at 16-bit offset
  // (p * lines + line) * 2. Zero for lines >= valid and for the missing
  // second element of an odd block's last pair.

  // Bp: B's panels of the task's columns.
  void emit_pack_b_pairs(Value* k0, int64_t kc) {
    const auto& st = mm_.b.strides;  // (batch, k, n)
    const int64_t kc2 = round_up(kc, 2);
    if (st[2] == 1) {
      // Rows contiguous along n: pair by pair, two rows into every panel
      // (the reads run along the rows, as emit_pack_b_rows's do).
      auto pair = [&](Value* p, bool odd) {
        Value* r0 = b_.CreateAdd(k0, b_.CreateMul(p, i64(2)));
        emit_for(
            b_, n_lo_, n_hi_, bl_.nr,
            [&](Value* n0) {
              Value* q = b_.CreateSDiv(b_.CreateSub(n0, n_lo_), i64(bl_.nr));
              Value* panel = b_.CreateGEP(ot_, bp_, b_.CreateMul(q, i64(kc2 * bl_.nr)));
              interleave_lines(b_ptr(r0, n0), odd ? nullptr : b_ptr(b_.CreateAdd(r0, i64(1)), n0),
                               b_.CreateSub(n_hi_, n0), bl_.nr,
                               b_.CreateGEP(ot_, panel, b_.CreateMul(p, i64(2 * bl_.nr))));
            },
            "pbn");
      };
      emit_for(b_, i64(0), i64(kc / 2), 1, [&](Value* p) { pair(p, false); }, "pbp");
      if (kc % 2) pair(i64(kc / 2), true);
      return;
    }
    emit_for(
        b_, n_lo_, n_hi_, bl_.nr,
        [&](Value* n0) {
          Value* q = b_.CreateSDiv(b_.CreateSub(n0, n_lo_), i64(bl_.nr));
          Value* panel = b_.CreateGEP(ot_, bp_, b_.CreateMul(q, i64(kc2 * bl_.nr)));
          pack_pairs_by_line(b_ptr(k0, n0), st[2], st[1], b_.CreateSub(n_hi_, n0), bl_.nr, panel,
                             kc);
        },
        "pbn");
  }

  // Ap: A's panels of rows [ic, mc_hi).
  void emit_pack_a_pairs(Value* ic, Value* mc_hi, Value* k0, int64_t kc, Value* dst) {
    const auto& st = mm_.a.strides;  // (batch, m, k)
    const int64_t kc2 = round_up(kc, 2);
    emit_for(
        b_, ic, mc_hi, bl_.mr,
        [&](Value* m0) {
          Value* p = b_.CreateSDiv(b_.CreateSub(m0, ic), i64(bl_.mr));
          Value* panel = b_.CreateGEP(ot_, dst, b_.CreateMul(p, i64(kc2 * bl_.mr)));
          Value* rows = b_.CreateSub(mc_hi, m0);
          if (st[1] != 1) {
            pack_pairs_by_line(a_ptr(m0, k0), st[1], st[2], rows, bl_.mr, panel, kc);
            return;
          }
          // Columns of A contiguous (A stored transposed): two k lines at once.
          auto pair = [&](Value* kp, bool odd) {
            Value* k = b_.CreateAdd(k0, b_.CreateMul(kp, i64(2)));
            interleave_lines(a_ptr(m0, k), odd ? nullptr : a_ptr(m0, b_.CreateAdd(k, i64(1))), rows,
                             bl_.mr, b_.CreateGEP(ot_, panel, b_.CreateMul(kp, i64(2 * bl_.mr))));
          };
          emit_for(b_, i64(0), i64(kc / 2), 1, [&](Value* kp) { pair(kp, false); }, "pap");
          if (kc % 2) pair(i64(kc / 2), true);
        },
        "pam");
  }

  // One k pair of a panel whose lines are contiguous in memory: the `lines`
  // cells at dst from the elements at `first` (k) and `second` (k + 1; null:
  // zeros), lines >= valid zero, 16 lines per vector.
  void interleave_lines(Value* first, Value* second, Value* valid, int lines, Value* dst) {
    for (int g = 0; g < lines; g += 16) {
      const int w = std::min(16, lines - g);
      llvm::Type* row_t = llvm::FixedVectorType::get(ot_, w);  // a vector even of 1
      std::vector<llvm::Constant*> lane;
      for (int l = 0; l < w; ++l) lane.push_back(b_.getInt64(l));
      Value* mask = b_.CreateICmpSLT(llvm::ConstantVector::get(lane),
                                     b_.CreateVectorSplat(w, b_.CreateSub(valid, i64(g))));
      Value* zero = llvm::Constant::getNullValue(row_t);
      auto row = [&](Value* at) {
        if (at == nullptr) return zero;
        return static_cast<Value*>(
            b_.CreateMaskedLoad(row_t, b_.CreateGEP(ot_, at, i64(g)), llvm::Align(2), mask, zero));
      };
      Value* r0 = row(first);
      Value* r1 = row(second);

      std::vector<int> mix;
      for (int l = 0; l < w; ++l) mix.push_back(l), mix.push_back(w + l);
      b_.CreateAlignedStore(b_.CreateShuffleVector(r0, r1, mix), b_.CreateGEP(ot_, dst, i64(2 * g)),
                            llvm::Align(2));
    }
  }

  // A panel from any strides (elements): the element of line l and k offset
  // j is at base + l * ls + j * ks. Lines one by one; a pair is one 32-bit
  // load when the two elements are adjacent (ks == 1).
  void pack_pairs_by_line(Value* base, int64_t ls, int64_t ks, Value* valid, int lines, Value* dst,
                          int64_t kc) {
    Value* stop = min64(valid, i64(lines));
    llvm::Type* cell = b_.getInt32Ty();
    auto at = [&](Value* l, Value* p) {  // the cell (p, l) of the panel
      return b_.CreateGEP(ot_, dst,
                          b_.CreateMul(b_.CreateAdd(b_.CreateMul(p, i64(lines)), l), i64(2)));
    };
    auto elem = [&](Value* line, Value* j) {
      return b_.CreateAlignedLoad(ot_, b_.CreateGEP(ot_, line, b_.CreateMul(j, i64(ks))),
                                  llvm::Align(2));
    };
    auto widen = [&](Value* x) {
      return b_.CreateZExt(b_.CreateBitCast(x, b_.getInt16Ty()), cell);
    };
    emit_for(
        b_, i64(0), stop, 1,
        [&](Value* l) {
          Value* line = b_.CreateGEP(ot_, base, b_.CreateMul(l, i64(ls)));
          emit_for(
              b_, i64(0), i64(kc / 2), 1,
              [&](Value* p) {
                Value* j = b_.CreateMul(p, i64(2));
                Value* x;
                if (ks == 1) {
                  x = b_.CreateAlignedLoad(cell, b_.CreateGEP(ot_, line, j), llvm::Align(2));
                } else {
                  x = b_.CreateOr(widen(elem(line, j)),
                                  b_.CreateShl(widen(elem(line, b_.CreateAdd(j, i64(1)))), 16));
                }
                b_.CreateAlignedStore(x, at(l, p), llvm::Align(4));
              },
              "ppk");
          if (kc % 2)
            b_.CreateAlignedStore(widen(elem(line, i64(kc - 1))), at(l, i64(kc / 2)),
                                  llvm::Align(4));
        },
        "ppl");
    // Lines past the valid ones: zero cells.
    emit_for(
        b_, stop, i64(lines), 1,
        [&](Value* l) {
          emit_for(
              b_, i64(0), i64(ceil_div(kc, 2)), 1,
              [&](Value* p) { b_.CreateAlignedStore(b_.getInt32(0), at(l, p), llvm::Align(4)); },
              "ppz");
        },
        "ppe");
  }

  // The bfloat16 micro-kernel's K loop: per k pair, NR / 16 cells of B (32
  // bfloat16 each) and MR broadcast cells of A, one vdpbf16ps per
  // accumulator; two pairs per iteration.
  void emit_pair_steps(Value* ap, Value* bp, const std::vector<llvm::AllocaInst*>& acc,
                       int64_t kc) {
    const int mr = bl_.mr, nv = bl_.nr / bl_.vl;
    llvm::Type* bfv = llvm::FixedVectorType::get(b_.getBFloatTy(), 2 * bl_.vl);
    auto step = [&](Value* p) {
      std::vector<Value*> bv(nv);
      for (int v = 0; v < nv; ++v)
        bv[v] = b_.CreateAlignedLoad(
            bfv,
            b_.CreateGEP(ot_, bp,
                         b_.CreateAdd(b_.CreateMul(p, i64(2 * bl_.nr)), i64(2 * v * bl_.vl))),
            llvm::Align(4));
      for (int i = 0; i < mr; ++i) {
        Value* cell = b_.CreateAlignedLoad(
            b_.getInt32Ty(),
            b_.CreateGEP(ot_, ap, b_.CreateAdd(b_.CreateMul(p, i64(2 * mr)), i64(2 * i))),
            llvm::Align(4));
        Value* as = b_.CreateBitCast(b_.CreateVectorSplat(bl_.vl, cell), bfv);
        for (int v = 0; v < nv; ++v) {
          Value* c = b_.CreateLoad(vt_, acc[i * nv + v]);
          b_.CreateStore(
              b_.CreateIntrinsic(llvm::Intrinsic::x86_avx512bf16_dpbf16ps_512, {}, {c, as, bv[v]}),
              acc[i * nv + v]);
        }
      }
    };
    emit_unrolled(ceil_div(kc, 2), step, "kp");
  }

  // step(i) for i in [0, n): kKUnroll steps per iteration of a loop (its
  // own increment and branch are a sixth of the instructions of an AVX2 6x16
  // step), then the rest.
  void emit_unrolled(int64_t n, const std::function<void(Value*)>& step, const char* name) {
    const int64_t whole = n / kKUnroll * kKUnroll;
    if (whole > 0)
      emit_for(
          b_, i64(0), i64(whole), kKUnroll,
          [&](Value* i) {
            for (int64_t u = 0; u < kKUnroll; ++u) step(b_.CreateAdd(i, i64(u)));
          },
          name);
    for (int64_t i = whole; i < n; ++i) step(i64(i));
  }

  // ---------------------------------------------------------------- tile

  void emit_micro_tile(Value* ic, Value* jr, Value* ir, Value* mc_hi, Value* k0, int64_t kc,
                       Value* first, Value* last) {
    const int mr = bl_.mr, nv = bl_.nr / bl_.vl;
    Value* p = b_.CreateSDiv(b_.CreateSub(ir, ic), i64(mr));
    Value* q = b_.CreateSDiv(b_.CreateSub(jr, n_lo_), i64(bl_.nr));
    const int64_t kcp = bl_.pairs ? round_up(kc, 2) : kc;  // k cells per line of a panel
    Value* ap = b_.CreateGEP(ot_, a_block_, b_.CreateMul(p, i64(kcp * mr)));
    Value* bp = b_.CreateGEP(ot_, bp_, b_.CreateMul(q, i64(kcp * bl_.nr)));
    // Accumulators as allocas in the entry block; SROA turns them into registers.
    std::vector<llvm::AllocaInst*> acc(mr * nv);
    {
      llvm::IRBuilder<> eb(entry_, entry_->begin());
      for (auto& a : acc) a = eb.CreateAlloca(vt_, nullptr, "c");
    }
    Value* rows = b_.CreateSub(min64(mc_hi, m_hi_), ir);
    Value* cols = b_.CreateSub(n_hi_, jr);
    prefetch_next_c(ic, jr, ir, mc_hi);
    auto zero = [&] {
      for (auto* a : acc) b_.CreateStore(llvm::Constant::getNullValue(vt_), a);
    };
    if (bl_.num_kb == 1) {
      zero();
    } else {
      // The first K block starts from zero, the others from the sums so far.
      llvm::LLVMContext& c = m_.getContext();
      auto* from_zero = llvm::BasicBlock::Create(c, "c.zero", f_);
      auto* from_sums = llvm::BasicBlock::Create(c, "c.load", f_);
      auto* ready = llvm::BasicBlock::Create(c, "c.ready", f_);
      b_.CreateCondBr(first, from_zero, from_sums);
      b_.SetInsertPoint(from_zero);
      zero();
      b_.CreateBr(ready);
      b_.SetInsertPoint(from_sums);
      if (bl_.acc_out) {
        load_c_tile(acc, ir, jr, rows, cols);
      } else {
        for (int i = 0; i < mr; ++i)
          for (int v = 0; v < nv; ++v)
            b_.CreateStore(load_partial(i, v, ir, jr, rows, cols), acc[i * nv + v]);
      }
      b_.CreateBr(ready);
      b_.SetInsertPoint(ready);
    }
    // A in place: rows past the end read the last row (their sums are never
    // stored). B in place: an edge panel loads with a lane mask.
    std::vector<Value*> arow(mr);
    if (!bl_.pack_a)
      for (int i = 0; i < mr; ++i) arow[i] = min64(b_.CreateAdd(ir, i64(i)), i64(mm_.m - 1));
    auto kloop = [&](bool masked) {
      if (bl_.pairs) {
        emit_pair_steps(ap, bp, acc, kc);
        return;
      }
      std::vector<Value*> bmask(nv);
      if (masked)
        for (int v = 0; v < nv; ++v) bmask[v] = lane_mask(b_.CreateSub(cols, i64(v * bl_.vl)));
      auto step = [&](Value* k) {
        std::vector<Value*> bv(nv);
        if (!bl_.pack_b && kc * bl_.nr * eb_ > t_.l1d_bytes / 2) {
          // B in place, its micro-panel streamed from L2 (larger than half
          // L1d): its rows are a page apart or so, which the hardware
          // prefetchers follow poorly; fetch the row kBAhead steps ahead.
          Value* row = b_ptr(b_.CreateAdd(k0, b_.CreateAdd(k, i64(kBAhead))), jr);
          for (int64_t o = 0; o < int64_t{bl_.nr} * eb_; o += 64)
            b_.CreateIntrinsic(llvm::Intrinsic::prefetch, {row->getType()},
                               {b_.CreateGEP(b_.getInt8Ty(), row, i64(o)), b_.getInt32(0),
                                b_.getInt32(3), b_.getInt32(1)});
        }
        for (int v = 0; v < nv; ++v) {
          if (bl_.pack_b) {
            bv[v] = b_.CreateAlignedLoad(
                vt_,
                b_.CreateGEP(et_, bp, b_.CreateAdd(b_.CreateMul(k, i64(bl_.nr)), i64(v * bl_.vl))),
                ealign());
          } else {
            Value* src = b_ptr(b_.CreateAdd(k0, k), b_.CreateAdd(jr, i64(v * bl_.vl)));
            if (masked) {
              bv[v] = b_.CreateMaskedLoad(vt_, src, ealign(), bmask[v],
                                          llvm::Constant::getNullValue(vt_));
            } else {
              bv[v] = b_.CreateAlignedLoad(vt_, src, ealign());
            }
          }
        }
        for (int i = 0; i < mr; ++i) {
          Value* src = bl_.pack_a
                           ? b_.CreateGEP(et_, ap, b_.CreateAdd(b_.CreateMul(k, i64(mr)), i64(i)))
                           : a_ptr(arow[i], b_.CreateAdd(k0, k));
          Value* as = b_.CreateVectorSplat(bl_.vl, b_.CreateAlignedLoad(et_, src, ealign()));
          for (int v = 0; v < nv; ++v) {
            Value* c = b_.CreateLoad(vt_, acc[i * nv + v]);
            b_.CreateStore(fma(as, bv[v], c), acc[i * nv + v]);
          }
        }
      };
      emit_unrolled(kc, step, "kk");
    };
    // B in place: an edge panel loads under lane masks, whole panels in a
    // loop of their own (one masked loop for all measured 10% slower on the
    // seed's dX with AVX-512).
    if (bl_.pack_b || !col_edges()) {
      kloop(false);
    } else {
      llvm::LLVMContext& c = m_.getContext();
      auto* whole = llvm::BasicBlock::Create(c, "kk.whole", f_);
      auto* part = llvm::BasicBlock::Create(c, "kk.part", f_);
      auto* join = llvm::BasicBlock::Create(c, "kk.done", f_);
      b_.CreateCondBr(b_.CreateICmpSGE(cols, i64(bl_.nr)), whole, part);
      b_.SetInsertPoint(whole);
      kloop(false);
      b_.CreateBr(join);
      b_.SetInsertPoint(part);
      kloop(true);
      b_.CreateBr(join);
      b_.SetInsertPoint(join);
    }
    // The last K block applies the epilogue, the others keep the sums.
    auto* known = llvm::dyn_cast<llvm::ConstantInt>(last);
    if (known != nullptr) {
      known->isOne() ? tile_epilogue(acc, ir, jr, rows, cols) : keep_sums(acc, ir, jr, rows, cols);
      return;
    }
    llvm::LLVMContext& c = m_.getContext();
    auto* epi = llvm::BasicBlock::Create(c, "tile.last", f_);
    auto* keep = llvm::BasicBlock::Create(c, "tile.keep", f_);
    auto* after = llvm::BasicBlock::Create(c, "tile.after", f_);
    b_.CreateCondBr(last, epi, keep);
    b_.SetInsertPoint(epi);
    tile_epilogue(acc, ir, jr, rows, cols);
    b_.CreateBr(after);
    b_.SetInsertPoint(keep);
    keep_sums(acc, ir, jr, rows, cols);
    b_.CreateBr(after);
    b_.SetInsertPoint(after);
  }

  // The sums of a K block but the last: in the output or the scratch buffer.
  void keep_sums(const std::vector<llvm::AllocaInst*>& acc, Value* ir, Value* jr, Value* rows,
                 Value* cols) {
    const int mr = bl_.mr, nv = bl_.nr / bl_.vl;
    if (bl_.acc_out) {
      store_c_tile(acc, ir, jr, rows, cols);
      return;
    }
    for (int i = 0; i < mr; ++i)
      for (int v = 0; v < nv; ++v)
        store_partial(i, v, ir, jr, rows, cols, b_.CreateLoad(vt_, acc[i * nv + v]));
  }

  // Epilogue: a fast path for whole tiles, a masked path for edges.
  void tile_epilogue(const std::vector<llvm::AllocaInst*>& acc, Value* ir, Value* jr, Value* rows,
                     Value* cols) {
    const int mr = bl_.mr, nv = bl_.nr / bl_.vl;
    llvm::LLVMContext& c = m_.getContext();
    if (!edges()) {
      for (int i = 0; i < mr; ++i)
        for (int v = 0; v < nv; ++v) epilogue(i, v, ir, jr, acc[i * nv + v], nullptr);
      return;
    }
    Value* full =
        b_.CreateAnd(b_.CreateICmpSGE(rows, i64(mr)), b_.CreateICmpSGE(cols, i64(bl_.nr)));
    auto* fast = llvm::BasicBlock::Create(c, "tile.full", f_);
    auto* edge = llvm::BasicBlock::Create(c, "tile.edge", f_);
    auto* done = llvm::BasicBlock::Create(c, "tile.done", f_);
    b_.CreateCondBr(full, fast, edge);
    b_.SetInsertPoint(fast);
    for (int i = 0; i < mr; ++i)
      for (int v = 0; v < nv; ++v) epilogue(i, v, ir, jr, acc[i * nv + v], nullptr);
    b_.CreateBr(done);
    b_.SetInsertPoint(edge);
    // Edge tiles: the tile in memory and a loop over the rows that exist
    // (one copy of the epilogue per vector, not per row); per vector, a
    // masked store with AVX-512 (mask registers: whole vectors too), else
    // whole (plain stores) or partial (the valid lanes one by one: vmaskmovps
    // stores are slow).
    Value* tile = spill_tile(acc);
    emit_for(
        b_, i64(0), min64(rows, i64(mr)), 1,
        [&](Value* i) {
          Value* m = b_.CreateAdd(ir, i);
          for (int v = 0; v < nv; ++v) {
            Value* at = tile_slot(tile, i, v);
            Value* n = b_.CreateAdd(jr, i64(v * bl_.vl));
            Value* valid = b_.CreateSub(cols, i64(v * bl_.vl));
            if (native_masks()) {
              partial_vector_epilogue(m, n, at, valid);
              continue;
            }
            auto* whole = llvm::BasicBlock::Create(c, "vec.whole", f_);
            auto* part = llvm::BasicBlock::Create(c, "vec.part", f_);
            auto* after = llvm::BasicBlock::Create(c, "vec.next", f_);
            b_.CreateCondBr(b_.CreateICmpSGE(valid, i64(bl_.vl)), whole, part);
            b_.SetInsertPoint(whole);
            epilogue_at(m, n, b_.CreateLoad(vt_, at), nullptr, bl_.vl);
            b_.CreateBr(after);
            b_.SetInsertPoint(part);
            partial_vector_epilogue(m, n, at, valid);
            b_.CreateBr(after);
            b_.SetInsertPoint(after);
          }
        },
        "erow");
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  // The register tile in memory (one buffer in the kernel's frame for all
  // tiles), for the edge paths that index its rows at run time.
  // With no accumulators: the buffer only.
  Value* spill_tile(const std::vector<llvm::AllocaInst*>& acc) {
    if (tile_buf_ == nullptr) {
      llvm::IRBuilder<> eb(entry_, entry_->begin());
      tile_buf_ = eb.CreateAlloca(vt_, eb.getInt64(int64_t{bl_.mr} * (bl_.nr / bl_.vl)), "tile");
    }
    for (size_t j = 0; j < acc.size(); ++j)
      b_.CreateStore(b_.CreateLoad(vt_, acc[j]), b_.CreateGEP(vt_, tile_buf_, i64(j)));
    return tile_buf_;
  }
  Value* tile_slot(Value* tile, Value* i, int v) {
    return b_.CreateGEP(vt_, tile, b_.CreateAdd(b_.CreateMul(i, i64(bl_.nr / bl_.vl)), i64(v)));
  }

  // ------------------------------------------------- C in the output

  // Address of C element (m, n) of this task's batch in the c_store.
  Value* c_ptr(Value* m, Value* n) {
    const Access& w = k_.stores.at(c_store_).where;
    const int r = k_.rank();
    Value* off = b_.CreateAdd(i64(w.offset), b_.CreateMul(m, i64(w.strides[r - 2])));
    off = b_.CreateAdd(off, n);
    // The batch dims of the domain, row-major in bi_ (as the epilogue reads them).
    Value* rest = bi_;
    for (int d = r - 3; d >= 0; --d) {
      Value* digit = d == 0 ? rest : b_.CreateURem(rest, i64(k_.domain[d]));
      if (d > 0) rest = b_.CreateUDiv(rest, i64(k_.domain[d]));
      off = b_.CreateAdd(off, b_.CreateMul(digit, i64(w.strides[d])));
    }
    return b_.CreateGEP(mem_type(m_.getContext(), k_.args.at(w.arg).dtype), ptrs_.at(w.arg), off);
  }

  // Software prefetch of the C tile the next micro-kernel call reads or
  // writes (the next row tile of this block, else the first of the next
  // column panel; with rows_outer the next column panel, else the first of
  // the next row tile), issued a whole K loop ahead: the tile's rows are MR
  // separate lines that the hardware prefetchers do not see coming.
  void prefetch_next_c(Value* ic, Value* jr, Value* ir, Value* mc_hi) {
    if (c_store_ < 0) return;
    const int mr = bl_.mr;
    Value *pm, *pn;
    if (bl_.rows_outer) {
      Value* njr = b_.CreateAdd(jr, i64(bl_.nr));
      Value* same = b_.CreateICmpSLT(njr, n_hi_);
      pm = b_.CreateSelect(same, ir, b_.CreateAdd(ir, i64(mr)));
      pn = b_.CreateSelect(same, njr, n_lo_);
    } else {
      Value* nir = b_.CreateAdd(ir, i64(mr));
      Value* same = b_.CreateICmpSLT(nir, mc_hi);
      pm = b_.CreateSelect(same, nir, ic);
      pn = b_.CreateSelect(same, jr, b_.CreateAdd(jr, i64(bl_.nr)));
    }
    const int64_t bytes =
        int64_t{bl_.nr} * ir::dtype_bytes(k_.args.at(k_.stores.at(c_store_).where.arg).dtype);
    std::vector<int64_t> at;
    for (int64_t o = 0; o < bytes; o += 64) at.push_back(o);
    at.push_back(bytes - 1);  // the row's last byte: its line when the row is not line-aligned
    for (int i = 0; i < mr; ++i) {
      Value* row = c_ptr(min64(b_.CreateAdd(pm, i64(i)), i64(mm_.m - 1)), pn);
      for (int64_t o : at)
        b_.CreateIntrinsic(llvm::Intrinsic::prefetch, {row->getType()},
                           {b_.CreateGEP(b_.getInt8Ty(), row, i64(o)), b_.getInt32(1),
                            b_.getInt32(3), b_.getInt32(1)});
    }
  }

  // acc[i][v] = C[ir + i, jr + v*VL ...], the sums of the K blocks so far.
  // Edge tiles read the rows that exist (the others repeat the last one; their
  // sums are never stored) and the columns under a lane mask.
  void load_c_tile(const std::vector<llvm::AllocaInst*>& acc, Value* ir, Value* jr, Value* rows,
                   Value* cols) {
    const int mr = bl_.mr, nv = bl_.nr / bl_.vl;
    llvm::LLVMContext& c = m_.getContext();
    auto* fast = llvm::BasicBlock::Create(c, "cl.full", f_);
    auto* edge = llvm::BasicBlock::Create(c, "cl.edge", f_);
    auto* done = llvm::BasicBlock::Create(c, "cl.done", f_);
    if (edges()) {
      b_.CreateCondBr(
          b_.CreateAnd(b_.CreateICmpSGE(rows, i64(mr)), b_.CreateICmpSGE(cols, i64(bl_.nr))), fast,
          edge);
    } else {
      b_.CreateBr(fast);
      edge->eraseFromParent();
      edge = nullptr;
    }
    b_.SetInsertPoint(fast);
    for (int i = 0; i < mr; ++i)
      for (int v = 0; v < nv; ++v)
        b_.CreateStore(
            b_.CreateAlignedLoad(
                vt_, c_ptr(b_.CreateAdd(ir, i64(i)), b_.CreateAdd(jr, i64(v * bl_.vl))), ealign()),
            acc[i * nv + v]);
    b_.CreateBr(done);
    if (edge == nullptr) {
      b_.SetInsertPoint(done);
      return;
    }
    b_.SetInsertPoint(edge);
    // A loop over the tile's rows into memory, then into the accumulators.
    Value* tile = spill_tile({});
    emit_for(
        b_, i64(0), i64(mr), 1,
        [&](Value* i) {
          Value* row = min64(b_.CreateAdd(ir, i), b_.CreateSub(m_hi_, i64(1)));
          for (int v = 0; v < nv; ++v) {
            Value* mask = lane_mask(b_.CreateSub(cols, i64(v * bl_.vl)));
            b_.CreateStore(b_.CreateMaskedLoad(vt_, c_ptr(row, b_.CreateAdd(jr, i64(v * bl_.vl))),
                                               ealign(), mask, llvm::Constant::getNullValue(vt_)),
                           tile_slot(tile, i, v));
          }
        },
        "clrow");
    for (size_t j = 0; j < acc.size(); ++j)
      b_.CreateStore(b_.CreateLoad(vt_, b_.CreateGEP(vt_, tile, i64(j))), acc[j]);
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  // C[ir + i, jr + v*VL ...] = acc[i][v], the outputs that exist.
  void store_c_tile(const std::vector<llvm::AllocaInst*>& acc, Value* ir, Value* jr, Value* rows,
                    Value* cols) {
    const int mr = bl_.mr, nv = bl_.nr / bl_.vl;
    llvm::LLVMContext& c = m_.getContext();
    if (!edges()) {
      for (int i = 0; i < mr; ++i)
        for (int v = 0; v < nv; ++v)
          b_.CreateAlignedStore(b_.CreateLoad(vt_, acc[i * nv + v]),
                                c_ptr(b_.CreateAdd(ir, i64(i)), b_.CreateAdd(jr, i64(v * bl_.vl))),
                                ealign());
      return;
    }
    Value* full =
        b_.CreateAnd(b_.CreateICmpSGE(rows, i64(mr)), b_.CreateICmpSGE(cols, i64(bl_.nr)));
    auto* fast = llvm::BasicBlock::Create(c, "cs.full", f_);
    auto* edge = llvm::BasicBlock::Create(c, "cs.edge", f_);
    auto* done = llvm::BasicBlock::Create(c, "cs.done", f_);
    b_.CreateCondBr(full, fast, edge);
    b_.SetInsertPoint(fast);
    for (int i = 0; i < mr; ++i)
      for (int v = 0; v < nv; ++v)
        b_.CreateAlignedStore(b_.CreateLoad(vt_, acc[i * nv + v]),
                              c_ptr(b_.CreateAdd(ir, i64(i)), b_.CreateAdd(jr, i64(v * bl_.vl))),
                              ealign());
    b_.CreateBr(done);
    b_.SetInsertPoint(edge);
    Value* tile = spill_tile(acc);
    emit_for(
        b_, i64(0), min64(rows, i64(mr)), 1,
        [&](Value* i) {
          Value* m = b_.CreateAdd(ir, i);
          for (int v = 0; v < nv; ++v) {
            Value* n = b_.CreateAdd(jr, i64(v * bl_.vl));
            Value* valid = b_.CreateSub(cols, i64(v * bl_.vl));
            Value* x = b_.CreateLoad(vt_, tile_slot(tile, i, v));
            if (native_masks()) {
              b_.CreateMaskedStore(x, c_ptr(m, n), ealign(), lane_mask(valid));
              continue;
            }
            // Without mask registers (vmaskmovps stores are slow): whole vectors
            // plainly, a partial one lane by lane.
            auto* whole = llvm::BasicBlock::Create(c, "cs.whole", f_);
            auto* part = llvm::BasicBlock::Create(c, "cs.part", f_);
            auto* after = llvm::BasicBlock::Create(c, "cs.next", f_);
            b_.CreateCondBr(b_.CreateICmpSGE(valid, i64(bl_.vl)), whole, part);
            b_.SetInsertPoint(whole);
            b_.CreateAlignedStore(x, c_ptr(m, n), ealign());
            b_.CreateBr(after);
            b_.SetInsertPoint(part);
            emit_for(
                b_, i64(0), valid, 1,
                [&](Value* l) {
                  b_.CreateAlignedStore(b_.CreateExtractElement(x, l), c_ptr(m, b_.CreateAdd(n, l)),
                                        ealign());
                },
                "cs.lane");
            b_.CreateBr(after);
            b_.SetInsertPoint(after);
          }
        },
        "csrow");
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  // Outputs (m, n..n+valid), valid < VL (it may be <= 0: nothing to do).
  void partial_vector_epilogue(Value* m, Value* n, Value* acc, Value* valid) {
    if (native_masks()) {
      epilogue_at(m, n, b_.CreateLoad(vt_, acc), lane_mask(valid), bl_.vl);
      return;
    }
    Value* accv = b_.CreateLoad(vt_, acc);
    emit_for(
        b_, i64(0), valid, 1,
        [&](Value* l) {
          epilogue_at(m, b_.CreateAdd(n, l), b_.CreateExtractElement(accv, l), nullptr, 1);
        },
        "lane");
  }
  // AVX-512 stores under a mask register at full speed.
  bool native_masks() const { return t_.vector_bits >= 512; }
  // Whether some tile is partial: tasks and blocks start at multiples of the
  // tile (task_rows, mc, task_cols are), so only the matrix's own ends make
  // edges. Without them the edge paths are not emitted.
  bool col_edges() const { return mm_.n % bl_.nr != 0 || bl_.task_cols % bl_.nr != 0; }
  bool edges() const {
    return col_edges() || mm_.m % bl_.mr != 0 || bl_.task_rows % bl_.mr != 0 ||
           bl_.mc % bl_.mr != 0;
  }

  Value* partial_ptr(int i, int v, Value* ir, Value* jr) {
    Value* r = b_.CreateAdd(b_.CreateSub(ir, m_lo_), i64(i));
    Value* col = b_.CreateAdd(b_.CreateSub(jr, n_lo_), i64(v * bl_.vl));
    return b_.CreateGEP(et_, cp_, b_.CreateAdd(b_.CreateMul(r, i64(bl_.task_cols)), col));
  }
  Value* load_partial(int i, int v, Value* ir, Value* jr, Value* rows, Value* cols) {
    // The partial buffer covers whole tiles (task_rows x task_cols), so no mask.
    return b_.CreateAlignedLoad(vt_, partial_ptr(i, v, ir, jr), ealign());
  }
  void store_partial(int i, int v, Value* ir, Value* jr, Value* rows, Value* cols, Value* x) {
    b_.CreateAlignedStore(x, partial_ptr(i, v, ir, jr), ealign());
  }

  void epilogue(int i, int v, Value* ir, Value* jr, llvm::AllocaInst* acc, Value* mask) {
    epilogue_at(b_.CreateAdd(ir, i64(i)), b_.CreateAdd(jr, i64(v * bl_.vl)),
                b_.CreateLoad(vt_, acc), mask, bl_.vl);
  }

  // The epilogue for `width` outputs (m, n..n+width) whose sums are `accv`
  // (a scalar when width is 1).
  void epilogue_at(Value* m, Value* n, Value* accv, Value* mask, int width) {
    int r = k_.rank();
    // bfloat16: the float32 sums rounded once, as a float32 matmul cast to
    // bfloat16 (the widened form) rounds them.
    if (bl_.pairs) accv = from_mem(b_, to_mem(b_, accv, dt_), dt_);
    // The batch dims of the domain, row-major in bi_.
    Value* rest = bi_;
    for (int d = r - 3; d >= 0; --d) {
      if (d == 0) {
        e_->idx[0] = rest;
      } else {
        e_->idx[d] = b_.CreateURem(rest, i64(k_.domain[d]));
        rest = b_.CreateUDiv(rest, i64(k_.domain[d]));
      }
    }
    e_->idx[r - 2] = m;
    e_->idx[r - 1] = n;
    e_->vec_dim = r - 1;
    e_->width = width;
    e_->mask = mask;
    e_->push_scope();
    for (size_t j = 0; j < k_.nodes.size(); ++j)
      if (k_.nodes[j].kind == KOp::Acc) e_->set_value(static_cast<int>(j), accv);
    for (const Store& s : k_.stores) e_->store(s, e_->eval(s.node));
    e_->pop_scope();
    e_->mask = nullptr;
  }

  llvm::Module& m_;
  const Kernel& k_;
  const CpuTarget& t_;
  MathProvider& math_;
  llvm::IRBuilder<IdentityFolder> b_;
  const MatMulSpec& mm_;
  DType dt_;
  int eb_ = 4;
  bool is_float_ = true;
  Blocking bl_;
  int c_store_ = -1;  // c_store_index
  llvm::Function* f_ = nullptr;
  llvm::BasicBlock* entry_ = nullptr;
  std::vector<Value*> ptrs_;
  std::unique_ptr<ExprEmitter> e_;
  llvm::Type* et_ = nullptr;  // the accumulators' scalar (float32 for bfloat16 operands)
  llvm::Type* vt_ = nullptr;
  llvm::Type* ot_ =
      nullptr;  // the operands' cells in memory and packed (et_ but for bfloat16: i16)
  Value *ap_ = nullptr, *bp_ = nullptr, *cp_ = nullptr;
  Value* a_block_ = nullptr;              // the packed A of the current K block
  llvm::AllocaInst* tile_buf_ = nullptr;  // spill_tile
  Value *bi_ = nullptr, *m_lo_ = nullptr, *m_hi_ = nullptr, *n_lo_ = nullptr, *n_hi_ = nullptr;
};

}  // namespace

llvm::Function* emit_matmul_kernel(llvm::Module& m, const Kernel& k, const CpuTarget& t,
                                   MathProvider& math, abi::CpuRange& shape) {
  return MatMulEmitter(m, k, t, math).emit(shape);
}

}  // namespace flowjit::codegen::cpu
