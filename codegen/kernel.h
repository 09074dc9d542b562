// The loop-level kernel description that jit/fusion produces and every
// backend (codegen/cpu, codegen/nvptx) lowers. It knows no LLVM.
//
// A kernel iterates a rectangular domain (a shape). Every memory access is an
// affine function of the domain indices: element offset = offset + sum over d
// of idx[d] * strides[d] (stride 0 broadcasts). The body is a small DAG of
// scalar operations (KNode), evaluated at each domain point; backends evaluate
// it on vectors of consecutive points along the innermost domain dimension.
//
// Loop kernels may reduce over a subset of the domain dimensions (`reduced`).
// Their reductions are computed in phases: phase p evaluates every reduction
// whose operand depends only on reductions of earlier phases, looping over the
// reduced dimensions at each point of the kept dimensions. Nodes that do not
// depend on a reduced index are "kept-space" nodes and are evaluated once per
// kept point. Stores of kept-space nodes happen once per kept point; stores of
// full-domain nodes happen in a final loop over the reduced dimensions.
//
// MatMul kernels compute acc[b, m, n] = sum_k A[b, m, k] * B[b, k, n] and then
// evaluate their body (the epilogue) over the domain [batch..., M, N], where
// the KNode `Acc` stands for the accumulated value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/node.h"

namespace flowjit::codegen {

using ir::DType;
using ir::OpKind;
using ir::Shape;

// A guarded coordinate of an access (padding, sliding windows and their
// adjoints): c = c0 + sum over d of idx[d] * coef[d]. The element exists
// when c >= 0, c % div == 0 and c / div < limit; it then adds
// (c / div) * stride to the element offset.
struct Coord {
  std::vector<int64_t> coef;  // one per index dim of the access
  int64_t c0 = 0;
  int64_t div = 1;
  int64_t limit = 0;
  int64_t stride = 0;
  bool operator==(const Coord& o) const {
    return coef == o.coef && c0 == o.c0 && div == o.div && limit == o.limit && stride == o.stride;
  }
};

// An indirect coordinate (gathers): the integer value of KNode `node`,
// evaluated at the same domain point, clamped into [0, limit), adds
// value * stride to the element offset. The node is an operand of the load.
// With `check` >= 0 a value outside [0, limit) is also reported (see
// Kernel::status_arg) with its position in the index tensor,
// pos_offset + sum over d of idx[d] * pos_strides[d].
struct Indirect {
  int node = -1;
  int64_t limit = 1;
  int64_t stride = 0;
  int check = -1;
  std::vector<int64_t> pos_strides;  // one per domain dim
  int64_t pos_offset = 0;
  bool operator==(const Indirect& o) const {
    return node == o.node && limit == o.limit && stride == o.stride && check == o.check &&
           pos_strides == o.pos_strides && pos_offset == o.pos_offset;
  }
};

// An access to one kernel argument: affine in the domain indices, plus
// guarded and indirect coordinates. A load of an element that does not exist
// (some guarded coordinate out of range) yields `pad`; stores never have
// coordinates.
struct Access {
  int arg = -1;                  // index into Kernel::args
  std::vector<int64_t> strides;  // elements per domain index, one per domain dim
  int64_t offset = 0;            // elements
  std::vector<Coord> coords;
  double pad = 0;
  std::vector<Indirect> indirect;
  int64_t ipad = 0;  // the pad of an integer load, exact (pad rounds beyond 2^53)
  bool operator==(const Access& o) const {
    return arg == o.arg && strides == o.strides && offset == o.offset && coords == o.coords &&
           pad == o.pad && indirect == o.indirect && ipad == o.ipad;
  }
};

enum class KOp : uint8_t {
  Load,     // access; operands: the index nodes of its indirect coordinates
  Const,    // value
  Index,    // sum over d of idx[d] * index_strides[d], as `dtype`
  Random,   // op = RandomUniform/RandomNormal/TruncatedNormal; counter from index_strides
            // (plus operand 0, an i64 scalar, when it has one: random_uniform_at)
  Compute,  // op = an elementwise OpKind over operands
  Reduce,   // op = ReduceSum/Max/Min/Prod/ArgMax/ArgMin of operand 0 over the reduced dims
  Acc,      // the matmul accumulator (MatMul kernels only)
};

struct KNode {
  KOp kind = KOp::Compute;
  OpKind op = OpKind::Identity;  // for Compute, Reduce and Random
  DType dtype = DType::Float32;  // result type
  std::vector<int> operands;     // indices of earlier KNodes
  int access = -1;               // Load: index into Kernel::loads
  double value = 0;              // Const (floating-point)
  int64_t ivalue = 0;            // Const (integers: exact)
  std::vector<int64_t>
      index_strides;  // Index, Random (counter), ArgMax/ArgMin (index along the axis)
  int64_t seed = 0;   // Random
  // Compute CheckIndex: reports operand 0 outside [0, ivalue) as check
  // `check` of the program, at position sum over d of idx[d] *
  // index_strides[d]; the result is operand 0. Compute CheckFinite: reports
  // a NaN or an infinity, at position ivalue + that sum.
  int check = -1;
  bool kept_space = false;  // depends on no reduced index (set by Kernel::finalize)
  // Depends on no domain index at all (set by Kernel::finalize): a constant,
  // a load with every stride 0 from an argument the kernel does not write, or
  // a computation of such nodes; the CPU loops compute it once per call.
  bool invariant = false;
  int phase = 0;  // Reduce: 1 + max phase of reductions it depends on
};

struct Store {
  int node = -1;  // KNode to store
  Access where;
};

struct MatMulSpec {
  // A is addressed as (batch, m, k) and B as (batch, k, n); strides in elements.
  Access a;  // strides: {batch strides..., m, k}
  Access b;  // strides: {batch strides..., k, n}
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;  // product of the batch extents (domain dims before M, N)
  // Implicit GEMM (convolutions): an operand's row or column index may be a
  // flat row-major index over several digits. When an operand's digit lists
  // are not empty, its index dims are {batch, row digits..., col digits...}
  // (a: rows are m and cols k; b: rows k, cols n), its strides and coords
  // are per index dim, and the digit extents multiply to the index's extent.
  std::vector<int64_t> a_rows, a_cols, b_rows, b_cols;
  // Batch digits: when not empty, the flat batch index is row-major over
  // these extents (the domain dims before M and N, which the epilogue reads
  // one by one), and every operand's index dims start with one per digit.
  std::vector<int64_t> batch_digits;
  // True when operand 0 (a) or 1 (b) is a plain (batch, row, col) access.
  bool plain(int operand) const {
    const Access& x = operand == 0 ? a : b;
    const auto& r = operand == 0 ? a_rows : b_rows;
    return r.empty() && batch_digits.empty() && x.coords.empty() && x.strides.size() == 3;
  }
};

struct KernelArg {
  DType dtype;
  int64_t elements = 0;  // size of the buffer, for bounds reasoning and tests
  bool written = false;
  bool read = false;
};

struct Kernel {
  // Collective: no code; the runtime runs the collective that `name`
  // describes (runtime::CollectiveStep in runtime/executable.h) with args {operand, result}.
  // Family: a kernel of a registered family (codegen/family.h), args
  // {operands..., result}, described by `family` and `params` alone.
  enum class Kind : uint8_t { Loop, MatMul, Collective, Family };

  std::string name;  // symbol name, unique within a module
  Kind kind = Kind::Loop;
  Shape domain;
  std::vector<bool> reduced;  // per domain dim (Loop kernels)
  std::vector<KernelArg> args;
  std::vector<Access> loads;
  std::vector<KNode> nodes;  // topological: operands come first
  std::vector<Store> stores;
  MatMulSpec mm;  // MatMul kernels
  // Family kernels: the index of the family in kernel_families() and the
  // parameters its emitters read.
  int family = -1;
  std::vector<int64_t> params;
  // The run's status buffer (int64[4], zero before a run) when the kernel
  // checks something: the first failing check writes {check + 1, value,
  // position} (a compare-exchange on word 0 decides which one).
  int status_arg = -1;
  // [harden] The status buffer again (read) for a kernel that writes
  // variables after an earlier launch checks something: it returns at once
  // when word 0 is set, so a run whose check failed applies no variable
  // update even where the runtime learns of it only at the end (the GPU,
  // whose launches are queued ahead; the devices of a distributed job).
  int guard_arg = -1;
  // Several devices: guard_arg is the all-gathered status of every device
  // (int64[4] each); the kernel returns when any device's word 0 is set.
  int guard_words = 1;

  // What the kernel computes, for plans and dumps: "fused: matmul, add, relu".
  std::string summary;

  // Derived by finalize(): kept_space and phase of every node, and
  // reduce_order (Reduce nodes sorted by phase).
  std::vector<int> reduce_order;
  void finalize();
  // Whether a store happens once per kept point: its value is kept-space and
  // its destination does not move along a reduced dim. (A kept-space value
  // stored to a full-domain destination, e.g. softmax of a broadcast view whose
  // reduced axis has stride 0, is written at every reduced point.)
  bool store_per_kept_point(const Store& s) const;

  bool has_reduction() const { return !reduce_order.empty(); }
  int rank() const { return static_cast<int>(domain.size()); }
  // Extent of the parallel loop: the outermost kept domain dim (1 if none).
  int64_t parallel_extent() const;
  int parallel_dim() const;  // -1 when every dim is reduced
  // A rough cost per parallel iteration, in "element operations", used to
  // pick a grain size.
  double cost_per_iteration() const;
};

// Simplifies a Loop kernel's domain without changing what it computes: drops
// extent-1 dimensions and merges adjacent dimensions that every access walks
// contiguously (same reduced-ness, stride[d] == stride[d+1] * extent[d+1]).
// Elementwise kernels over contiguous buffers become one flat loop.
void coalesce_domain(Kernel& k);

// What one launch of a kernel computes and touches, for the profiler's
// GFLOP/s and GB/s. flops: 2 * m * n * k * batch for a MatMul kernel (its
// MatMulSpec dims, implicit GEMMs included) plus the arithmetic nodes (not
// Load, Const, Index, Acc, nor Compute Identity/Cast) times the domain
// points; bytes: each argument's elements * dtype size, once per read and
// once per write (at least once).
struct KernelCost {
  int64_t flops = 0;
  int64_t bytes = 0;
};

// The cost of `k`; std::nullopt for collectives (the runtime runs them).
std::optional<KernelCost> kernel_cost(const Kernel& k);

// Human-readable form of a kernel for FLOWJIT_DEBUG dumps and golden tests.
std::string describe_kernel(const Kernel& k);

}  // namespace flowjit::codegen
