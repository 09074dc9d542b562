// segment_sum on x86-64: one task per (outer row, chunk of the inner dim,
// block of segments); each zeroes its part of the output, then walks the ids
// in order and adds the chunk of each data row whose segment is in its block
// (vector adds along the inner dim).
#include <algorithm>
#include <cmath>

#include "codegen/cpu/cpu_codegen.h"
#include "codegen/families/segment_sum/emit.h"
#include "codegen/families/segment_sum/segment_sum.h"

namespace flowjit::codegen::cpu {

using llvm::Value;

llvm::Function* emit_segment_sum_cpu(llvm::Module& m, const Kernel& k, const CpuTarget& t,
                                     MathProvider&, abi::CpuRange& shape) {
  const SegmentSumParams p(k);
  llvm::LLVMContext& ctx = m.getContext();
  llvm::IRBuilder<> b(ctx);
  llvm::Function* f = declare_kernel(m, k.name, t);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", f));
  std::vector<Value*> args = load_kernel_args(b, f, k.args.size());
  Value *data = args[p.arg[0]], *ids = args[p.arg[1]], *out = args[p.arg[2]];

  llvm::Type* elem = mem_type(ctx, p.data);
  const int64_t elem_bytes = ir::dtype_bytes(p.data);
  const int lanes = t.lanes(static_cast<int>(elem_bytes));
  // Tasks: (outer row, chunk of the inner dim, block of segments). A chunk
  // is a few vectors, so a wide inner dim gives every thread work while its
  // rows stay in cache; a block of segments is zeroed by its task, which then
  // scans every id and adds the rows whose id falls in the block. Blocks let
  // a large table with a narrow inner dim (Wide&Deep's 16-wide embeddings)
  // zero in parallel; they hold at least as many elements as there are ids,
  // so the scans cost no more than the zeroing.
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(p.inner, 64 * lanes));
  const int64_t chunks = p.inner == 0 ? 1 : (p.inner + chunk - 1) / chunk;
  const int64_t block =
      std::clamp<int64_t>(std::max<int64_t>((32768 + chunk - 1) / chunk, (p.n + chunk - 1) / chunk),
                          1, std::max<int64_t>(p.segments, 1));
  const int64_t blocks = p.segments == 0 ? 1 : (p.segments + block - 1) / block;
  shape.range = p.outer() * chunks * blocks;
  const double cost = static_cast<double>(block + p.n) * static_cast<double>(chunk) + 1;
  shape.grain = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(kMinTaskCost / cost)));
  shape.scratch_bytes = 0;

  const bool is_float = ir::is_float(p.data);
  auto add = [&](Value* a, Value* c) {
    a = from_mem(b, a, p.data);
    c = from_mem(b, c, p.data);
    return to_mem(b, is_float ? b.CreateFAdd(a, c) : b.CreateAdd(a, c), p.data);
  };
  auto at = [&](Value* base, Value* element) { return b.CreateGEP(elem, base, element); };
  auto align = llvm::Align(elem_bytes);

  emit_for(
      b, f->getArg(1), f->getArg(2), 1,
      [&](Value* it) {
        Value* o = b.CreateSDiv(it, b.getInt64(chunks * blocks), "o");
        Value* rem = b.CreateSRem(it, b.getInt64(chunks * blocks));
        Value* c0 = b.CreateMul(b.CreateSDiv(rem, b.getInt64(blocks)), b.getInt64(chunk), "c0");
        Value* c1 =
            b.CreateSelect(b.CreateICmpSLT(b.CreateAdd(c0, b.getInt64(chunk)), b.getInt64(p.inner)),
                           b.CreateAdd(c0, b.getInt64(chunk)), b.getInt64(p.inner), "c1");
        Value* s0 = b.CreateMul(b.CreateSRem(rem, b.getInt64(blocks)), b.getInt64(block), "s0");
        Value* s1 = b.CreateSelect(
            b.CreateICmpSLT(b.CreateAdd(s0, b.getInt64(block)), b.getInt64(p.segments)),
            b.CreateAdd(s0, b.getInt64(block)), b.getInt64(p.segments), "s1");
        // out[o, s, c] for s in [s0, s1): the first element of each row.
        Value* out_o = b.CreateMul(o, b.getInt64(p.segments * p.inner));
        emit_for(
            b, s0, s1, 1,
            [&](Value* s) {
              Value* row = b.CreateAdd(out_o, b.CreateMul(s, b.getInt64(p.inner)));
              emit_vector_for(
                  b, c0, c1, lanes,
                  [&](Value* c, int w) {
                    llvm::Type* vt = with_width(elem, w);
                    b.CreateAlignedStore(llvm::Constant::getNullValue(vt),
                                         at(out, b.CreateAdd(row, c)), align);
                  },
                  "z");
            },
            "s");
        Value* ids_row =
            b.CreateMul(b.CreateSDiv(o, b.getInt64(std::max<int64_t>(p.rest, 1))), b.getInt64(p.n));
        Value* data_o = b.CreateMul(o, b.getInt64(p.n * p.inner));
        Value* span = b.CreateSub(s1, s0);
        emit_for(
            b, b.getInt64(0), b.getInt64(p.n), 1,
            [&](Value* j) {
              if_id_in_block(b, f, ids, b.CreateAdd(ids_row, j), p.ids, s0, span, [&](Value* id) {
                Value* dst = b.CreateAdd(out_o, b.CreateMul(id, b.getInt64(p.inner)));
                Value* src = b.CreateAdd(data_o, b.CreateMul(j, b.getInt64(p.inner)));
                emit_vector_for(
                    b, c0, c1, lanes,
                    [&](Value* c, int w) {
                      llvm::Type* vt = with_width(elem, w);
                      Value* d = at(out, b.CreateAdd(dst, c));
                      Value* x = b.CreateAlignedLoad(vt, at(data, b.CreateAdd(src, c)), align);
                      b.CreateAlignedStore(add(b.CreateAlignedLoad(vt, d, align), x), d, align);
                    },
                    "c");
              });
            },
            "j");
      },
      "it");
  b.CreateRetVoid();
  return f;
}

}  // namespace flowjit::codegen::cpu
