// attention: scaled dot-product attention written as matmul, scale, bias,
// softmax and matmul becomes one attention op (ir/ops.def), whose kernels
// compute the softmax online and keep no score matrix in memory
// (codegen/families/attention). Runs on the traced forward graph, before
// autodiff, so the gradient is the attention op's own.
//
// The pattern, as examples/transformer_lm.py and OneFlow programs write it:
//
//   matmul(softmax(matmul(q, k, transpose_b) [* c | / c]... [+ bias], axis=-1), v)
//
// with q, k, v of one rank and the same batch dims, c scalar constants
// (matmul's alpha and fused_scale_tril's scale multiply), and
// every intermediate used only by the next op (a score matrix that is also
// returned, watched or used elsewhere stays unfused). The bias is read by
// the kernel through broadcast strides; one whose broadcast the kernel
// cannot express is broadcast over q's batch dims first. A bias that is a
// causal mask, c where the key comes after the query built from iotas as
// examples/transformer_lm.py does, with c <= -1e4, becomes the op's causal
// flag: the kernels skip those keys, whose weights exp(s + c - max) are 0
// unless a row's scores spread over more than -c - 104; so does
// fused_scale_tril's where(j - i <= 0, scores, c) around the scaled scores
// (OneFlow's GPT: fused_scale_tril_softmax_dropout). Dropout between
// the softmax and the second matmul, as flow.nn.dropout writes it (a
// where on random_uniform_at, python/flowjit/_conv.py), becomes the op's
// dropout: the kernels draw the same numbers from the same counters.
//
// When: the attention kernels recompute the probabilities in the backward
// (about 1.5x the multiply-adds of the unfused matmuls), so they pay where
// the score matrices' memory traffic outweighs that: on an AMD Zen 3 host
// (benchmarks/bench_attention.py, causal, d 64, the family's operands
// copied once) the unfused composition is faster up to 256 keys a query,
// level at 384 and slower from 512 (1.11x at 512, 1.17x at 1024, 1.26x at
// 2048). The pass fuses a match whose queries see at least kLongScores
// score pairs a group (512 x 512), or whose score matrix holds
// at least attention_min_score_bytes() (256 MiB: memory the unfused
// composition would need several times). With dropout the kernels draw
// each score's number three times (forward, dq, dk/dv) where the
// composition draws it once: level at 1024 keys, 1.06x at 2048, so a
// dropout match fuses from kLongDroppedScores (2048 x 2048) or the same
// 256 MiB. FLOWJIT_FUSE_ATTENTION=1 fuses
// every match, =0 none. flow.nn.scaled_dot_product_attention is always the
// attention op.
#pragma once

#include <cstdint>

#include <vector>

#include "ir/graph.h"

namespace flowjit::jit {

// Rewrites `g`; `keep` and `watched` are nodes the caller holds (losses,
// nodes whose gradients are requested): they count as uses and are mapped
// in place.
ir::Graph fuse_attention(const ir::Graph& g, std::vector<ir::NodeRef>& keep,
                         std::vector<ir::NodeRef>& watched, int64_t min_score_bytes);

// The smallest score matrix (bytes, over the whole batch) the pass fuses
// whatever its rows: 256 MiB, 0 (every match) with FLOWJIT_FUSE_ATTENTION=1,
// -1 (none) with =0.
int64_t attention_min_score_bytes();
// Score pairs a group (Lq x Lk) from which the pass fuses whatever the bytes.
constexpr int64_t kLongScores = int64_t{1} << 18;
// The same with dropout (its numbers drawn again in the backward).
constexpr int64_t kLongDroppedScores = int64_t{1} << 22;

}  // namespace flowjit::jit
