// Fusion's internals, shared by its stages (the entry point is jit/fusion.h):
//   fusion/views.cpp     how values address memory: views, windows, gathers, maps
//   fusion/groups.cpp    preparation, analysis and grouping nodes into kernels
//   fusion/kernels.cpp   building each group's loop-level kernel (codegen/kernel.h)
//   fusion/schedule.cpp  launch order, deferred assigns, buffer lives and the plan
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <queue>
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
#include "jit/memory.h"

namespace flowjit::jit::fusion_detail {

using namespace ir;
using codegen::Access;
using codegen::Kernel;
using codegen::KNode;
using codegen::KOp;
using runtime::BufferKind;
using DimMap = std::vector<int>;  // per node dim: domain dim, or -1 (index 0)

// An index read by a gather: a strided view of an integer buffer, clamped
// into [0, limit) and scaled by `stride` (codegen::Indirect).
struct IndirectView {
  NodeRef base;
  std::vector<int64_t> strides;  // elements of base, per dim of the viewed node
  int64_t offset = 0;
  int64_t limit = 1;
  int64_t stride = 0;  // elements of the gathered buffer per index unit
  // The check_index the gather reads its indices through (or null), and the
  // position of the index element in that tensor: pos_offset + sum over the
  // viewed node's dims of idx * pos_strides.
  NodeRef check;
  std::vector<int64_t> pos_strides;
  int64_t pos_offset = 0;
};

inline bool is_gather(const NodeRef& n) {
  return n->op() == OpKind::Gather || n->op() == OpKind::GatherNd;
}

// A gather's index operand read through its check_index, if it has one.
inline NodeRef unchecked_index(const NodeRef& x) {
  return x->op() == OpKind::CheckIndex ? x->input(0) : x;
}

struct View {
  NodeRef base;                  // a buffer: parameter, variable or computed node
  std::vector<int64_t> strides;  // elements, per dim of the viewed node
  int64_t offset = 0;
  std::vector<codegen::Coord> coords;  // coef per dim of the viewed node
  double pad = 0;                      // the value of elements outside the coords' range
  std::vector<IndirectView> indirect;  // strides per dim of the viewed node
  int64_t ipad = 0;                    // pad of an integer view, exact (pad rounds beyond 2^53)
  bool plain() const { return coords.empty() && indirect.empty(); }
};

// ---------------------------------------------------------------- groups

struct Group {
  int id = 0;
  bool matmul = false;
  NodeRef root;
  NodeRef mm;  // the MatMul node of a matmul group
  Shape domain;
  std::vector<bool> reduced;
  bool has_reduce = false;
  std::vector<int> remap;  // set when absorbing a reduction renumbered the domain
  std::unordered_map<const Node*, std::vector<DimMap>> maps;  // members and their maps
  std::vector<NodeRef> members;                               // in absorption order
  int computes = 0;  // members that are computed here (not duplicated views or constants)
  bool member(const NodeRef& n) const { return maps.count(n.get()) > 0; }
};

// The most computed ops one kernel takes: a longer chain is cut into several
// kernels. LLVM's time on one function grows faster than its size (a chain of
// 10,000 fused ops compiled for over 10 minutes as one kernel); past a few
// hundred ops per element, a stored intermediate costs little.
constexpr int kMaxKernelComputes = 512;

// Where a materialized value lives: the runtime's buffer kinds, with an
// arena *buffer* index (its offset comes from memory planning).
struct Storage {
  BufferKind kind = BufferKind::Arena;
  int index = 0;  // input/output index, variable index, or arena buffer index
};

// ---------------------------------------------------------------- views

// True for a reshape that only inserts or removes extent-1 dimensions.
bool is_unit_reshape(const NodeRef& r);

// Sources (and random_uniform_at) cheap enough to recompute in every kernel
// that reads them (trait kCheap).
bool is_cheap_source(const NodeRef& n);

// Recomputed in every kernel that uses it instead of being stored.
bool is_duplicable(const NodeRef& n);

bool is_buffer_leaf(const NodeRef& n);

bool is_compute(const NodeRef& n);

// Addressed views (windows, pads, slices, gathers) read their operands
// through offsets, guarded and indirect coordinates, so the operands must
// exist in memory (like the base of a non-unit reshape).
bool is_addressed_view(const NodeRef& n);

std::optional<View> resolve_view(const NodeRef& n);

// window(x): lead dims as x's, window positions and taps through one
// coordinate per spatial dim; a coordinate that can never leave the input
// folds into plain strides.
std::optional<View> resolve_window(const NodeRef& n);

// pad(x): a guarded coordinate per padded dim (ir/array.h).
std::optional<View> resolve_pad(const NodeRef& n);

// slice(x): an offset and scaled strides.
std::optional<View> resolve_slice(const NodeRef& n);

// gather(p, idx) and gather_nd(p, idx): p's strides on the dims that are not
// indexed, and one indirect coordinate per indexed dim.
std::optional<View> resolve_gather(const NodeRef& n);

// How `n` addresses memory, when it is a view chain over a buffer.
std::optional<View> resolve_view(const NodeRef& n);

// A matmul reads an operand's batch dims as one stride: they must collapse
// (a batch broadcast by numpy rules or a transposed batch does not, and is
// copied first).
bool batch_collapses(const View& v, const NodeRef& x);

bool is_contiguous_view(const NodeRef& n);

// ---------------------------------------------------------------- maps

DimMap broadcast_map(const Shape& from, const Shape& to, const DimMap& to_map);

// The map of operand `i` of member `n`, given n's map. Reductions map their
// operand to the identity over the group's domain (checked canonical).
DimMap operand_map(const NodeRef& n, const DimMap& m, size_t i);

// A map under which a node can be stored: every non-unit dim has its own
// domain dim.
bool is_full_map(const NodeRef& n, const DimMap& m);

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
  // `unfused_matmuls`: positions of matmuls that take no epilogue.
  Fuser(const Graph& g, const std::string& job, FusionOptions opts,
        std::set<int> unfused_matmuls = {});

  FusedProgram run();
  // ---- preparation: make every output, assign value and matmul operand a
  // kernel-computed buffer.

  static NodeRef identity(const NodeRef& n) {
    return make_node(OpKind::Identity, {n}, {}, n->loc());
  }

  // Collectives write only their own buffer: a result or an assigned value
  // is copied out of it by a kernel.
  static bool needs_identity_for_store(const NodeRef& n);

  Graph materialize(const Graph& g);

  // ---- analysis

  void analyze();

  NodeRef node_ref(const Node* n);

  // Compute nodes that consume `n`, looking through duplicable users.
  void effective_users(const NodeRef& n, std::vector<const Node*>& out);

  // ---- grouping

  void form_groups();

  void new_group(const NodeRef& root);

  void add_member(Group& g, const NodeRef& n, const DimMap& m);

  // Absorbs producers, latest first, so that all users of a candidate that
  // can be in the group have been decided before the candidate.
  void grow(Group& g);

  bool try_absorb(Group& g, const NodeRef& p, std::vector<DimMap>& maps);

  // A reduction joins a loop group when its operand spans the group's domain
  // with the same reduced dims (a further phase), or when the group has no
  // reduction yet and the reduction's kept dims cover the group's domain (the
  // group becomes the reduction's epilogue; the domain grows).
  bool absorb_reduce(Group& g, const NodeRef& p, std::vector<DimMap>& maps);

  // ---- kernels

  Storage storage_of(const Node* n);

  int variable_index(const NodeRef& var);

  const DimMap& store_map(Group& g, const NodeRef& n);

  std::string kernel_name(int index, Group& g);

  // Builds every group's kernel, orders them, and writes the plan.
  void build_and_schedule(FusedProgram& out);

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

  // Kahn's algorithm over data and anti dependences (readers of a
  // variable's old value run before the kernel that overwrites it). Ties go
  // to program order. Returns false on a cycle.
  bool schedule(std::vector<Built>& built, std::vector<int>& order);

 private:
  friend class KernelBuilder;

  std::string job_;
  FusionOptions opts_;
  std::set<int> unfused_matmuls_;
  Graph g_;
  std::vector<NodeRef> topo_;
  std::unordered_map<const Node*, int> pos_;
  std::unordered_map<const Node*, std::vector<NodeRef>> users_;
  std::unordered_map<const Node*, std::vector<NodeRef>> assigns_;
  std::unordered_map<const Node*, int> output_of_;
  std::unordered_map<const Node*, int> param_index_;
  std::unordered_set<const Node*> must_store_;
  std::unordered_set<const Node*> epilogue_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::unordered_map<const Node*, int> group_of_;
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
    if (is_duplicable(n) || g_.member(n)) return inst_member(n, m);
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
