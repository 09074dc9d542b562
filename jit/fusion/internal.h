// Fusion's kernel formation and plan (the entry point is jit/fusion.h).
// The stages before it are functions of their own (jit/fusion/grouping.h:
// prepare, analyze, group; jit/fusion/order.h: the launch order); the Fuser
// holds their records and builds, from them, the kernels and the plan:
//   fusion/views.cpp     how values address memory: views, windows, gathers, maps
//   fusion/grouping.cpp  prepare, analyze, group
//   fusion/kernels.cpp   building each group's loop-level kernel (codegen/kernel.h)
//   fusion/order.cpp     the launch order
//   fusion/schedule.cpp  deferred assigns, check guards, buffer lives and the plan
#pragma once

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ir/conv.h"
#include "ir/error.h"
#include "ir/printer.h"
#include "jit/fusion.h"
#include "jit/fusion/grouping.h"
#include "jit/fusion/order.h"
#include "jit/fusion/views.h"
#include "jit/memory.h"

namespace flowjit::jit::fusion_detail {

using codegen::Access;
using codegen::Kernel;
using codegen::KNode;
using codegen::KOp;
using runtime::BufferKind;

// Where a materialized value lives: the runtime's buffer kinds, with an
// arena *buffer* index (its offset comes from memory planning).
struct Storage {
  BufferKind kind = BufferKind::Arena;
  int index = 0;  // input/output index, variable index, or arena buffer index
};

struct Built {
  Kernel k;
  std::vector<const void*> arg_buffers;  // which buffer each arg is: a node, or a temporary's key
  std::vector<Storage> arg_storage;
  std::vector<const Node*> reads;  // buffers read
  std::vector<std::string> var_writes;
  std::vector<std::string> var_reads;
  std::vector<const Node*> computes;                  // members, for the description
  std::optional<runtime::CollectiveStep> collective;  // a collective's launch: no kernel code
  std::vector<NodeRef> stored;                        // the value of each store, in order
  bool status_gather = false;  // the all_gather of the devices' status buffers
};

// The launches as the stages after grouping hand them on.
struct Launches {
  std::vector<Built> kernels;  // group i's kernel at i
  std::vector<Built> copies;   // the copies of deferred assigns, launched last
  std::deque<Built> gathers;   // [harden] the status all_gathers of several devices
  std::vector<Built*> order;   // all of them, in launch order
};

// One operand of an implicit GEMM while it is being described: its index
// dims are {batch digits..., row digits..., col digits...}.
struct DigitOperand {
  std::vector<int64_t> rows, cols;  // digit extents
  Access acc;                       // strides and coords per index dim
};

class KernelBuilder;

// Thrown while building the kernel of a matmul whose fused epilogue reads or
// writes its batch dimensions in a layout that does not collapse into one
// (a broadcast mask over (batch, heads), a transposed store): fuse() runs
// the grouping again with that matmul (its position in topological order)
// kept out of its consumers' kernel.
struct SplitEpilogue {
  int matmul_pos;
};

// Groups an optimized graph's nodes into kernels and plans their launches.
class Fuser {
 public:
  // `g`: a prepared graph; `uses` and `grouping`: its analysis and groups.
  Fuser(Graph g, Uses uses, Grouping grouping, const std::string& job, FusionOptions opts);

  FusedProgram run();

  // ---- kernels

  Storage storage_of(const Node* n);

  int variable_index(const NodeRef& var);

  const DimMap& store_map(Group& g, const NodeRef& n);

  std::string kernel_name(int index, Group& g);

  // Builds every group's kernel, orders them, and writes the plan, in the
  // stages below.
  void build_and_schedule(FusedProgram& out);
  // Storage of inputs, outputs and stored values; the values of the arena
  // buffers, by buffer index.
  std::vector<const Node*> assign_storage();
  // Every group's kernel, the copies of deferred assigns, and their order
  // (launch_order). An assign whose in-place store would make a cycle, or
  // that a checking kernel or a writer before the last check would make, is
  // deferred: stored into a temporary and copied at the end.
  void form_launches(Launches& ls);
  // [harden] Kernels that write a variable after a check read the status
  // first (Kernel::guard_arg); several devices all-gather their status before.
  void guard_variable_writers(Launches& ls);
  // Memory planning's input: the live range of every arena buffer over the
  // launches (sets each asynchronous collective's complete_before).
  std::vector<BufferLife> buffer_lives(Launches& ls, const std::vector<const Node*>& arena_nodes);
  // The runtime plan and the description; moves the kernels into `out`.
  void write_plan(Launches& ls, const ArenaPlan& ap, FusedProgram& out);

  // A collective's launch: no kernel code, args {operand, result}, and the
  // typed step the runtime runs (the name is for dumps only).
  std::vector<int> buffer_args(const NodeRef& n, Built& b, KernelBuilder& kb);
  Built build_collective(Group& g);
  Built build_family(Group& g);

  Built build_group(Group& g, const std::set<std::string>& deferred,
                    std::set<std::string>& hazards);

  // The operand `x` of a contraction as a strided buffer (materialize made
  // it one): its kernel argument, strides per dim of x, and offset.
  View contraction_operand(const NodeRef& x, Built& b, KernelBuilder& kb, int& arg);

  // Drops extent-1 digits and merges adjacent digits of one index that every
  // stride and coordinate walks contiguously, so a conv whose operand is an
  // ordinary matrix (1x1 kernels, the weight) reaches the plain fast paths.
  static void simplify_digits(DigitOperand& o, size_t nbatch);

  // A coordinate of x (channels-first, spatial dim i) read at window
  // position * stride + tap * dilation - pad; folded into plain strides when
  // it can never leave the input.
  static void add_spatial_coord(DigitOperand& o, const ConvGeometry& cg, int i, int pos_dim,
                                int tap_dim, int64_t x_stride);

  // Convolutions as implicit GEMMs (ir/conv.h). With S spatial dims, G
  // groups, Cg = C/G input and Cog = Co/G output channels per group:
  //   conv:             batch (n, g), M = Cog, N = out..., K = (Cg, k...)
  //   conv_data_grad:   batch (n, g), M = Cg,  N = in...,  K = (Cog, k...)
  //   conv_filter_grad: batch (g),    M = Cog, N = (Cg, k...), K = (n, out...)
  void build_conv_spec(Group& g, Built& b, KernelBuilder& kb);

  void build_matmul_spec(Group& g, Built& b, KernelBuilder& kb);

  // Collapses a matmul kernel's batch dims into one; false (k unchanged)
  // when an access's batch strides are not contiguous.
  static bool collapse_batch_dims(Kernel& k);

  // Temporaries for deferred assigns: one arena buffer per variable.
  // The key of a deferred assign's temporary: its variable name, whose
  // address in temp_names_ is stable.
  const void* temp_key(const std::string& name) { return &*temp_names_.insert(name).first; }
  int temp_for(const std::string& name, const NodeRef& var);
  int arena_base_count();

  std::vector<Built> build_deferred_copies(const std::set<std::string>& deferred);

  // [harden] Index checks: the id of a check_index node in the plan's check
  // table (added on first use; `limits`: the range the kernel checks, one per
  // component of a gather_nd's index), and
  // the status buffer they report to (an arena buffer live for the whole
  // run, created on first use).
  int check_id(const NodeRef& check, const std::vector<int64_t>& limits);
  // check_numerics: the check of what kernel `kernel` stores of `value` (into `where`).
  int numerics_check_id(const std::string& kernel, const NodeRef& value, const Storage& where);
  const void* status_key() const { return &status_index_; }
  int status_buffer();
  // Several devices (FusionOptions::devices): the status buffers of all of
  // them (int64[4] each; an arena buffer live for the whole run), and a
  // launch that all-gathers them into it.
  const void* gathered_status_key() const { return &gathered_index_; }
  int gathered_status_buffer();
  Built build_status_gather(int n);

  // The launch-order stage's record of the kernels built from the groups.
  std::vector<LaunchDeps> launch_deps(const std::vector<Built>& built) const;

 private:
  friend class KernelBuilder;

  Graph g_;
  Uses uses_;
  Grouping grouping_;
  std::string job_;
  FusionOptions opts_;
  std::unordered_map<const Node*, Storage> storage_;
  std::vector<std::pair<std::string, TensorType>> plan_vars_;
  std::unordered_map<std::string, int> var_index_;
  std::set<std::string> temp_names_;
  std::unordered_map<std::string, int> temp_index_;
  std::unordered_map<std::string, NodeRef> temp_vars_;
  std::vector<BufferLife> temp_lives_;
  int status_index_ = -1;
  int gathered_index_ = -1;
  int status_gathers_ = 0;  // status all_gathers made (their names)
  std::unordered_map<const Node*, int> check_ids_;
  std::vector<runtime::RunCheck> checks_;
};

class KernelBuilder {
 public:
  KernelBuilder(Fuser& f, Group& g, Built& b) : f_(f), g_(g), b_(b) {}

  int arg_for(const void* buffer, Storage s, DType dt, int64_t elems, bool write) {
    for (size_t i = 0; i < b_.arg_buffers.size(); ++i)
      if (b_.arg_buffers[i] == buffer) {
        (write ? b_.k.args[i].written : b_.k.args[i].read) = true;
        return static_cast<int>(i);
      }
    b_.arg_buffers.push_back(buffer);
    b_.arg_storage.push_back(s);
    codegen::KernelArg a;
    a.dtype = dt;
    a.elements = elems;
    (write ? a.written : a.read) = true;
    b_.k.args.push_back(a);
    return static_cast<int>(b_.k.args.size()) - 1;
  }

  std::vector<int64_t> domain_strides(const std::vector<int64_t>& own, const DimMap& m) {
    std::vector<int64_t> s(g_.domain.size(), 0);
    for (size_t j = 0; j < m.size(); ++j)
      if (m[j] >= 0) s[m[j]] += own[j];
    return s;
  }

  // The kernel argument of a buffer this kernel reads.
  int read_arg(const NodeRef& base) {
    Storage st;
    if (base->op() == OpKind::Variable) {
      st = {BufferKind::Variable, f_.variable_index(base)};
      b_.var_reads.push_back(base->attrs().get_str("name"));
    } else {
      st = f_.storage_of(base.get());
    }
    if (std::find(b_.reads.begin(), b_.reads.end(), base.get()) == b_.reads.end())
      b_.reads.push_back(base.get());
    return arg_for(base.get(), st, base->dtype(), base->type().numel(), false);
  }

  int push_load(const Access& a, DType dt, std::vector<int> operands = {}) {
    b_.k.loads.push_back(a);
    KNode kn;
    kn.kind = KOp::Load;
    kn.dtype = dt;
    kn.access = static_cast<int>(b_.k.loads.size()) - 1;
    kn.operands = std::move(operands);
    return push(kn);
  }

  int leaf(const NodeRef& n, const DimMap& m) {
    auto v = resolve_view(n);
    FJ_CHECK(v.has_value(), "kernel operand is not addressable: ", op_name(n->op()));
    // Gathers: each index is a load of its own, an operand of this load.
    std::vector<codegen::Indirect> indirect;
    std::vector<int> operands;
    std::vector<int64_t> limits;  // gather_nd: one per index component
    for (const IndirectView& iv : v->indirect) limits.push_back(iv.limit);
    for (const IndirectView& iv : v->indirect) {
      Access ia{read_arg(iv.base), domain_strides(iv.strides, m), iv.offset, {}, 0, {}};
      int node = push_load(ia, iv.base->dtype());
      codegen::Indirect ind{node, iv.limit, iv.stride};
      if (iv.check) {
        ind.check = f_.check_id(iv.check, limits);
        ind.pos_strides = domain_strides(iv.pos_strides, m);
        ind.pos_offset = iv.pos_offset;
        b_.k.status_arg = status_arg();
      }
      indirect.push_back(ind);
      operands.push_back(node);
    }
    Access a{
        read_arg(v->base), domain_strides(v->strides, m), v->offset, {}, v->pad, indirect, v->ipad};
    for (codegen::Coord c : v->coords) {
      c.coef = domain_strides(c.coef, m);
      a.coords.push_back(std::move(c));
    }
    return push_load(a, n->dtype(), operands);
  }

  int push(const KNode& kn) {
    b_.k.nodes.push_back(kn);
    return static_cast<int>(b_.k.nodes.size()) - 1;
  }

  int inst(const NodeRef& n, const DimMap& m) {
    auto key = std::make_pair(n.get(), m);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    int r = inst_new(n, m);
    memo_[key] = r;
    return r;
  }

  int inst_new(const NodeRef& n, const DimMap& m) {
    if (is_view(n->op())) {
      if ((n->op() == OpKind::Reshape && !is_unit_reshape(n)) || is_addressed_view(n))
        return leaf(n, m);
      return inst(n->input(0), operand_map(n, m, 0));  // re-indexed, no arithmetic
    }
    if (is_buffer_leaf(n)) return leaf(n, m);
    if (f_.uses_.duplicated(n) || g_.member(n)) return inst_member(n, m);
    return leaf(n, m);  // computed and stored by another kernel
  }

  int inst_member(const NodeRef& n, const DimMap& m) {
    KNode kn;
    kn.dtype = n->dtype();
    const Attrs& a = n->attrs();
    switch (n->op()) {
      case OpKind::Fill: {
        kn.kind = KOp::Const;
        kn.value = a.get_float("value");
        const AttrValue* v = a.find("value");
        if (auto* i = std::get_if<int64_t>(v))
          kn.ivalue = *i;  // exact for int64
        else
          kn.ivalue = static_cast<int64_t>(kn.value);
        return push(kn);
      }
      case OpKind::Iota: {
        kn.kind = KOp::Index;
        kn.index_strides.assign(g_.domain.size(), 0);
        int axis = static_cast<int>(a.get_int("axis"));
        if (m[axis] >= 0) kn.index_strides[m[axis]] = 1;
        return push(kn);
      }
      case OpKind::RandomUniform:
      case OpKind::RandomNormal:
      case OpKind::TruncatedNormal:
        kn.kind = KOp::Random;
        kn.op = n->op();
        kn.seed = a.get_int("seed");
        kn.index_strides = domain_strides(contiguous_strides(n->shape()), m);
        return push(kn);
      case OpKind::RandomUniformAt:
        kn.kind = KOp::Random;
        kn.op = OpKind::RandomUniform;
        kn.seed = a.get_int("seed");
        kn.index_strides = domain_strides(contiguous_strides(n->shape()), m);
        kn.operands = {inst(n->input(0), operand_map(n, m, 0))};
        return push(kn);
      case OpKind::CheckIndex:  // [harden] index checks
        kn.kind = KOp::Compute;
        kn.op = n->op();
        kn.ivalue = a.get_int("limit");
        kn.check = f_.check_id(n, {kn.ivalue});
        kn.index_strides = domain_strides(contiguous_strides(n->shape()), m);
        kn.operands = {inst(n->input(0), operand_map(n, m, 0))};
        b_.k.status_arg = status_arg();
        return push(kn);
      case OpKind::CheckFinite:
        kn.kind = KOp::Compute;
        kn.op = n->op();
        kn.check = f_.check_id(n, {});
        kn.index_strides = domain_strides(contiguous_strides(n->shape()), m);
        kn.operands = {inst(n->input(0), operand_map(n, m, 0))};
        b_.k.status_arg = status_arg();
        return push(kn);
      case OpKind::MatMul:
      case OpKind::Conv:
      case OpKind::ConvDataGrad:
      case OpKind::ConvFilterGrad:
        FJ_CHECK(n == g_.mm, "second matmul in a kernel");
        kn.kind = KOp::Acc;
        b_.computes.push_back(n.get());
        return push(kn);
      default:
        break;
    }
    if (is_reduce(n->op())) {
      kn.kind = KOp::Reduce;
      kn.op = n->op();
      DimMap om = operand_map(n, m, 0);
      kn.operands = {inst(n->input(0), om)};
      if (n->op() == OpKind::ArgMax || n->op() == OpKind::ArgMin) {
        kn.index_strides.assign(g_.domain.size(), 0);
        kn.index_strides[a.get_ints("axes")[0]] = 1;
      }
      b_.computes.push_back(n.get());
      return push(kn);
    }
    FJ_CHECK(is_elementwise(n->op()), "cannot lower ", op_name(n->op()), " inside a kernel");
    kn.kind = KOp::Compute;
    kn.op = n->op();
    for (size_t i = 0; i < n->inputs().size(); ++i)
      kn.operands.push_back(inst(n->input(i), operand_map(n, m, i)));
    if (!is_duplicable(n)) b_.computes.push_back(n.get());
    return push(kn);
  }

  // The run's status buffer as an argument of this kernel (written).
  int status_arg() {
    return arg_for(f_.status_key(), {BufferKind::Arena, f_.status_buffer()}, DType::Int64, 4, true);
  }

  void store(const NodeRef& n, const DimMap& m, const void* buffer, Storage s) {
    int node = inst(n, m);
    int arg = arg_for(buffer, s, n->dtype(), n->type().numel(), true);
    Access a{arg, domain_strides(contiguous_strides(n->shape()), m), 0};
    b_.k.stores.push_back({node, a});
    b_.stored.push_back(n);
  }

  // [harden] check_numerics: every float value this kernel stores goes
  // through a CheckFinite node (reported at its element in the buffer).
  void check_stores_finite() {
    for (size_t i = 0; i < b_.k.stores.size(); ++i) {
      codegen::Store& st = b_.k.stores[i];
      if (!is_float(b_.k.args[st.where.arg].dtype)) continue;
      const Storage& where = b_.arg_storage[st.where.arg];
      KNode kn;
      kn.kind = KOp::Compute;
      kn.op = OpKind::CheckFinite;
      kn.dtype = b_.k.nodes[st.node].dtype;
      kn.operands = {st.node};
      kn.index_strides = st.where.strides;
      kn.ivalue = st.where.offset;
      kn.check = f_.numerics_check_id(b_.k.name, b_.stored.at(i), where);
      b_.k.status_arg = status_arg();
      st.node = push(kn);
    }
  }

 private:
  Fuser& f_;
  Group& g_;
  Built& b_;
  std::map<std::pair<const Node*, DimMap>, int> memo_;
};

}  // namespace flowjit::jit::fusion_detail
