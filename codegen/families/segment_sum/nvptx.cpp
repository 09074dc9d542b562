// segment_sum on NVIDIA GPUs: one thread per (outer row, block of segments,
// inner element), grid-stride. Neighbouring threads own neighbouring
// elements of a row, so every load and store of a warp is coalesced; each
// thread zeroes its column of the block, then walks the ids in order (no
// atomics: the sums are the CPU's, bit for bit).
#include <algorithm>

#include "codegen/families/segment_sum/emit.h"
#include "codegen/families/segment_sum/segment_sum.h"
#include "codegen/nvptx/nvptx_codegen.h"

namespace flowjit::codegen::nvptx {

using llvm::Value;

llvm::Function* emit_segment_sum_nvptx(llvm::Module& m, const Kernel& k, const GpuTarget&,
                                       MathProvider&, abi::GpuGrid& launch, KernelNotes& notes) {
  constexpr int kBlock = 256;
  const SegmentSumParams p(k);
  llvm::LLVMContext& ctx = m.getContext();
  llvm::IRBuilder<> b(ctx);
  llvm::Function* f = declare_kernel(m, k, kBlock);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", f));
  Value *data = f->getArg(p.arg[0]), *ids = f->getArg(p.arg[1]), *out = f->getArg(p.arg[2]);
  llvm::Type* elem = mem_type(ctx, p.data);
  const auto align = llvm::Align(ir::dtype_bytes(p.data));
  // A thread per (outer row, block of segments, inner element): it zeroes
  // its column of the block, then scans every id and adds the rows whose id
  // falls in the block. Blocks hold at least as many segments as a quarter
  // of the ids, so the scans cost no more than a few times the zeroing.
  const int64_t block = std::clamp<int64_t>(std::max<int64_t>(128, (p.n + 3) / 4), 1,
                                            std::max<int64_t>(p.segments, 1));
  const int64_t blocks = p.segments == 0 ? 1 : (p.segments + block - 1) / block;
  const int64_t inner = std::max<int64_t>(p.inner, 1);
  const int64_t threads = p.outer() * blocks * p.inner;
  launch.block[0] = kBlock;
  launch.grid[0] =
      static_cast<uint32_t>(std::clamp<int64_t>((threads + kBlock - 1) / kBlock, 1, 65535));
  notes.mapping = "segment_sum: a thread per output column of a block of segments";

  const bool is_float = ir::is_float(p.data);
  auto at = [&](Value* base, Value* element) { return b.CreateGEP(elem, base, element); };
  auto i64 = [&](int64_t v) { return b.getInt64(v); };
  Value* gid = b.CreateAdd(b.CreateMul(b.CreateZExt(block_idx(b), b.getInt64Ty()), i64(kBlock)),
                           b.CreateZExt(thread_idx(b), b.getInt64Ty()));
  Value* stride = b.CreateMul(b.CreateZExt(grid_dim(b), b.getInt64Ty()), i64(kBlock));
  emit_for(
      b, gid, i64(threads), stride,
      [&](Value* t) {
        Value* o = b.CreateUDiv(t, i64(blocks * inner), "o");
        Value* rem = b.CreateURem(t, i64(blocks * inner));
        Value* s0 = b.CreateMul(b.CreateUDiv(rem, i64(inner)), i64(block), "s0");
        Value* c = b.CreateURem(rem, i64(inner), "c");
        Value* s1 = b.CreateSelect(b.CreateICmpULT(b.CreateAdd(s0, i64(block)), i64(p.segments)),
                                   b.CreateAdd(s0, i64(block)), i64(p.segments), "s1");
        Value* out_oc = b.CreateAdd(b.CreateMul(o, i64(p.segments * p.inner)), c);
        emit_for(
            b, s0, s1, i64(1),
            [&](Value* s) {
              b.CreateAlignedStore(llvm::Constant::getNullValue(elem),
                                   at(out, b.CreateAdd(out_oc, b.CreateMul(s, i64(p.inner)))),
                                   align);
            },
            "s");
        Value* ids_row = b.CreateMul(b.CreateUDiv(o, i64(std::max<int64_t>(p.rest, 1))), i64(p.n));
        Value* data_oc = b.CreateAdd(b.CreateMul(o, i64(p.n * p.inner)), c);
        Value* span = b.CreateSub(s1, s0);
        emit_for(
            b, i64(0), i64(p.n), i64(1),
            [&](Value* j) {
              if_id_in_block(b, f, ids, b.CreateAdd(ids_row, j), p.ids, s0, span, [&](Value* id) {
                Value* d = at(out, b.CreateAdd(out_oc, b.CreateMul(id, i64(p.inner))));
                Value* x = from_mem(
                    b,
                    b.CreateAlignedLoad(
                        elem, at(data, b.CreateAdd(data_oc, b.CreateMul(j, i64(p.inner)))), align),
                    p.data);
                Value* y = from_mem(b, b.CreateAlignedLoad(elem, d, align), p.data);
                b.CreateAlignedStore(
                    to_mem(b, is_float ? b.CreateFAdd(y, x) : b.CreateAdd(y, x), p.data), d, align);
              });
            },
            "j");
      },
      "t");
  b.CreateRetVoid();
  return f;
}

}  // namespace flowjit::codegen::nvptx
