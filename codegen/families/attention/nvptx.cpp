// attention on NVIDIA GPUs: one thread per query (a key's for dk and dv),
// grid-stride, with scalar loops: the forward walks the query's keys keeping
// the running max, sum and output row (in local memory), rescaled when the
// max grows; the gradients recompute each probability from lse (attention.cpp
// has the identities, dropout's too). A first kernel that is right everywhere; tiles in
// shared memory and a warp per row are what a faster one adds.
#include <algorithm>
#include <cmath>

#include "codegen/families/attention/attention.h"
#include "codegen/nvptx/nvptx_codegen.h"

namespace flowjit::codegen::nvptx {

using llvm::Value;

namespace {

llvm::Function* emit_attention_any(llvm::Module& m, const Kernel& k, MathProvider& math,
                                   abi::GpuGrid& launch, KernelNotes& notes) {
  using P = AttentionParams;
  constexpr int kBlock = 128;
  const P p(k);
  FJ_CHECK(p.dtype == DType::Float32 || p.dtype == DType::Float64, "attention kernel ", k.name,
           " of ", ir::dtype_name(p.dtype), " (widen_half widens half attention)");
  llvm::LLVMContext& ctx = m.getContext();
  llvm::IRBuilder<> b(ctx);
  llvm::Function* f = declare_kernel(m, k, kBlock);
  auto* entry = llvm::BasicBlock::Create(ctx, "entry", f);
  b.SetInsertPoint(entry);
  auto ptr = [&](P::Operand o) { return f->getArg(static_cast<unsigned>(p.arg[o])); };
  const int64_t rows = p.groups * (p.per_key() ? p.lk : p.lq);
  launch.block[0] = kBlock;
  launch.grid[0] =
      static_cast<uint32_t>(std::clamp<int64_t>((rows + kBlock - 1) / kBlock, 1, 65535));
  notes.mapping = "attention: a thread per row, online softmax in local memory";

  llvm::Type* elem = mem_type(ctx, p.dtype);
  const auto align = llvm::Align(ir::dtype_bytes(p.dtype));
  auto i64 = [&](int64_t v) { return b.getInt64(v); };
  auto fc = [&](double v) { return llvm::ConstantFP::get(elem, v); };
  auto load = [&](Value* base, Value* i) {
    return b.CreateAlignedLoad(elem, b.CreateGEP(elem, base, i), align);
  };
  auto store = [&](Value* v, Value* base, Value* i) {
    b.CreateAlignedStore(v, b.CreateGEP(elem, base, i), align);
  };
  auto local = [&](int64_t n, const char* name) -> Value* {
    llvm::IRBuilder<> e(entry, entry->begin());
    return e.CreateAlloca(elem, e.getInt64(n), name);
  };
  auto var = [&](const char* name, Value* init) {
    Value* v = local(1, name);
    b.CreateStore(init, v);
    return v;
  };
  auto get = [&](Value* v) { return b.CreateLoad(elem, v); };
  auto loop = [&](Value* lo, Value* hi, const std::function<void(Value*)>& body, const char* n) {
    emit_for(b, lo, hi, i64(1), body, n);
  };
  auto min_i = [&](Value* x, Value* y) { return b.CreateSelect(b.CreateICmpSLT(x, y), x, y); };
  auto exp = [&](Value* x) { return math.unary(b, OpKind::Exp, x); };
  // The dropout's factor z of score (i, j) of group g (attention.h), or x
  // itself without dropout: x z.
  Value* offset =
      p.dropout > 0 ? b.CreateAlignedLoad(b.getInt64Ty(), ptr(P::Offset), llvm::Align(8), "offset")
                    : nullptr;
  auto dropped = [&](Value* x, Value* g, Value* i, Value* j) -> Value* {
    if (!offset) return x;
    Value* counter = b.CreateAdd(
        b.CreateAdd(b.CreateMul(b.CreateAdd(b.CreateMul(g, i64(p.lq)), i), i64(p.lk)), j), offset);
    return b.CreateFMul(x, dropout_factor(b, math, p, counter, elem));
  };
  // sum over c < n of a[a0 + c * as] * c[c0 + c * cs]
  auto dot = [&](Value* a, Value* a0, int64_t as, Value* c, Value* c0, int64_t cs, int64_t n) {
    Value* acc = var("dot", fc(0));
    loop(
        i64(0), i64(n),
        [&](Value* x) {
          Value* t = b.CreateFMul(load(a, b.CreateAdd(a0, b.CreateMul(x, i64(as)))),
                                  load(c, b.CreateAdd(c0, b.CreateMul(x, i64(cs)))));
          b.CreateStore(b.CreateFAdd(get(acc), t), acc);
        },
        "dot");
    return get(acc);
  };

  // acc: the output row, or dq's or dk's; acc2: dv's beside dk's for DKV.
  const bool dkv = p.part == P::DKV;
  const int64_t width = p.part == P::DQ || p.part == P::DK || dkv ? p.d : p.dv;
  Value* acc = local(width, "acc");
  Value* acc2 = dkv ? local(p.dv, "acc2") : nullptr;
  Value* gid = b.CreateAdd(b.CreateMul(b.CreateZExt(block_idx(b), b.getInt64Ty()), i64(kBlock)),
                           b.CreateZExt(thread_idx(b), b.getInt64Ty()));
  Value* stride = b.CreateMul(b.CreateZExt(grid_dim(b), b.getInt64Ty()), i64(kBlock));
  emit_for(
      b, gid, i64(rows), stride,
      [&](Value* row) {
        const int64_t per = p.per_key() ? p.lk : p.lq;
        Value* g = b.CreateSDiv(row, i64(per), "g");
        Value* r = b.CreateSRem(row, i64(per), "r");
        Value *lo = i64(0), *hi = i64(p.per_key() ? p.lq : p.lk);
        if (p.causal) {
          if (p.per_key())
            lo = min_i(r, hi);  // queries i >= j see key j
          else
            hi = min_i(b.CreateAdd(r, i64(1)), hi);  // keys j <= i
        }
        Value* qrow0 = b.CreateMul(g, i64(p.lq));  // row index of lse, delta
        Value* krow0 = b.CreateMul(g, i64(p.lk));
        Value* bias0 =
            b.CreateMul(b.CreateSRem(b.CreateSDiv(g, i64(p.gdiv)), i64(p.gmod)), i64(p.gstride));
        // The score of query i and key j: k read from kt in the forward.
        auto score = [&](Value* i, Value* j) {
          Value* qi = b.CreateMul(b.CreateAdd(qrow0, i), i64(p.d));
          Value* s = p.part == P::Out
                         ? dot(ptr(P::Q), qi, 1, ptr(P::KT),
                               b.CreateAdd(b.CreateMul(g, i64(p.d * p.lk)), j), p.lk, p.d)
                         : dot(ptr(P::Q), qi, 1, ptr(P::K),
                               b.CreateMul(b.CreateAdd(krow0, j), i64(p.d)), 1, p.d);
          Value* bi = b.CreateAdd(
              bias0, b.CreateAdd(b.CreateMul(i, i64(p.qstride)), b.CreateMul(j, i64(p.kstride))));
          return b.CreateFAdd(b.CreateFMul(s, fc(p.scale)), load(ptr(P::Bias), bi));
        };
        loop(i64(0), i64(width), [&](Value* c) { store(fc(0), acc, c); }, "zero");
        if (acc2) loop(i64(0), i64(p.dv), [&](Value* c) { store(fc(0), acc2, c); }, "zero2");
        if (p.part == P::Out) {
          Value* mx = var("m", fc(-INFINITY));
          Value* l = var("l", fc(0));
          loop(
              lo, hi,
              [&](Value* j) {
                Value* s = score(r, j);
                Value* m_old = get(mx);
                Value* m_new = b.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, m_old, s);
                Value* base = b.CreateSelect(b.CreateFCmpOEQ(m_new, fc(-INFINITY)), fc(0), m_new);
                Value* corr = exp(b.CreateFSub(m_old, base));
                Value* e = exp(b.CreateFSub(s, base));
                b.CreateStore(b.CreateFAdd(b.CreateFMul(get(l), corr), e), l);
                b.CreateStore(m_new, mx);
                {
                  Value* ez = dropped(e, g, r, j);  // the sum is the undropped softmax's
                  Value* v0 = b.CreateMul(b.CreateAdd(krow0, j), i64(p.dv));
                  loop(
                      i64(0), i64(p.dv),
                      [&](Value* c) {
                        Value* a = b.CreateFMul(load(acc, c), corr);
                        a = b.CreateFAdd(a, b.CreateFMul(ez, load(ptr(P::V), b.CreateAdd(v0, c))));
                        store(a, acc, c);
                      },
                      "pv");
                }
              },
              "j");
          // The output row, then the log-sum-exp (ops.def).
          Value* inv = b.CreateFDiv(fc(1), get(l));
          Value* o0 = b.CreateMul(row, i64(p.dv + 1));
          loop(
              i64(0), i64(p.dv),
              [&](Value* c) {
                store(b.CreateFMul(load(acc, c), inv), ptr(P::Result), b.CreateAdd(o0, c));
              },
              "out");
          store(b.CreateFAdd(get(mx), math.unary(b, OpKind::Log, get(l))), ptr(P::Result),
                b.CreateAdd(o0, i64(p.dv)));
          return;
        }
        if (p.part == P::DScores) {  // the masked scores' gradient is 0
          Value* row0 = b.CreateMul(row, i64(p.lk));
          loop(
              hi, i64(p.lk), [&](Value* j) { store(fc(0), ptr(P::Result), b.CreateAdd(row0, j)); },
              "masked");
        }
        loop(
            lo, hi,
            [&](Value* x) {
              Value* i = p.per_key() ? x : r;
              Value* j = p.per_key() ? r : x;
              Value* qi = b.CreateAdd(qrow0, i);
              Value* pr = exp(b.CreateFSub(score(i, j), load(ptr(P::LseIn), qi)));
              // acc += x * src[src0 + c] for c < n
              auto axpy = [&](Value* into, Value* x, Value* src, Value* src0, int64_t n) {
                loop(
                    i64(0), i64(n),
                    [&](Value* c) {
                      store(b.CreateFAdd(load(into, c),
                                         b.CreateFMul(x, load(src, b.CreateAdd(src0, c)))),
                            into, c);
                    },
                    "acc");
              };
              if (dkv)
                axpy(acc2, dropped(pr, g, i, j), ptr(P::DOut), b.CreateMul(qi, i64(p.dv)), p.dv);
              if (p.part != P::DV) {
                Value* dp = dot(ptr(P::DOut), b.CreateMul(qi, i64(p.dv)), 1, ptr(P::V),
                                b.CreateMul(b.CreateAdd(krow0, j), i64(p.dv)), 1, p.dv);
                pr = b.CreateFMul(pr, b.CreateFSub(dropped(dp, g, i, j), load(ptr(P::Delta), qi)));
              } else {
                pr = dropped(pr, g, i, j);
              }
              if (p.part == P::DScores) {
                store(pr, ptr(P::Result), b.CreateAdd(b.CreateMul(row, i64(p.lk)), j));
                return;
              }
              const bool dk = p.part == P::DK || dkv;
              Value* src = p.part == P::DQ ? ptr(P::K) : dk ? ptr(P::Q) : ptr(P::DOut);
              Value* src0 = p.part == P::DQ ? b.CreateMul(b.CreateAdd(krow0, j), i64(p.d))
                            : dk            ? b.CreateMul(qi, i64(p.d))
                                            : b.CreateMul(qi, i64(p.dv));
              axpy(acc, pr, src, src0, width);
            },
            "x");
        if (p.part == P::DScores) return;
        Value* factor = fc(p.part == P::DV ? 1.0 : p.scale);  // dq and dk carry the scale
        Value* o0 = b.CreateMul(row, i64(width + (dkv ? p.dv : 0)));
        loop(
            i64(0), i64(width),
            [&](Value* c) {
              store(b.CreateFMul(load(acc, c), factor), ptr(P::Result), b.CreateAdd(o0, c));
            },
            "grad");
        if (dkv)  // dv beside dk
          loop(
              i64(0), i64(p.dv),
              [&](Value* c) {
                store(load(acc2, c), ptr(P::Result), b.CreateAdd(o0, b.CreateAdd(i64(p.d), c)));
              },
              "grad2");
      },
      "row");
  b.CreateRetVoid();
  return f;
}

}  // namespace

llvm::Function* emit_attention_nvptx(llvm::Module& m, const Kernel& k, const GpuTarget&,
                                     MathProvider& math, abi::GpuGrid& launch, KernelNotes& notes) {
  return emit_attention_any(m, k, math, launch, notes);
}
llvm::Function* emit_attention_grad_nvptx(llvm::Module& m, const Kernel& k, const GpuTarget&,
                                          MathProvider& math, abi::GpuGrid& launch,
                                          KernelNotes& notes) {
  return emit_attention_any(m, k, math, launch, notes);
}

}  // namespace flowjit::codegen::nvptx
