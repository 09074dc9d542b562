// fusion: building each group's loop-level kernel, matmul and implicit-GEMM specs.
#include "codegen/family.h"
#include "jit/fusion/internal.h"

namespace flowjit::jit::fusion_detail {

// ---- kernels
Storage Fuser::storage_of(const Node* n) {
  auto it = storage_.find(n);
  FJ_CHECK(it != storage_.end(), "value read before it is materialized: ", op_name(n->op()));
  return it->second;
}

int Fuser::variable_index(const NodeRef& var) {
  const std::string& name = var->attrs().get_str("name");
  auto it = var_index_.find(name);
  if (it != var_index_.end()) return it->second;
  int idx = static_cast<int>(plan_vars_.size());
  plan_vars_.emplace_back(name, var->type());
  var_index_[name] = idx;
  return idx;
}

const DimMap& Fuser::store_map(Group& g, const NodeRef& n) {
  for (auto& m : g.maps[n.get()])
    if (is_full_map(n, m)) return m;
  return g.maps[n.get()].front();
}

std::string Fuser::kernel_name(int index, Group& g) {
  std::string s = "k" + std::to_string(index);
  std::set<std::string> seen;
  int count = 0;
  std::vector<NodeRef> ordered = g.members;
  std::sort(ordered.begin(), ordered.end(), [&](const NodeRef& a, const NodeRef& b) {
    return uses_.pos.at(a.get()) < uses_.pos.at(b.get());
  });
  for (auto& n : ordered) {
    if (is_view(n->op()) || is_cheap_source(n)) continue;
    std::string op(op_name(n->op()));
    if (seen.insert(op).second && count++ < 4) s += "_" + op;
  }
  return s;
}

// The args of a launch that reads its operands and writes its result as
// whole buffers (collectives, family kernels): {operands..., result}, one
// arg per buffer; returns the arg of each operand and of the result.
std::vector<int> Fuser::buffer_args(const NodeRef& n, Built& b, KernelBuilder& kb) {
  std::vector<int> args;
  for (const NodeRef& x : n->inputs()) {
    Storage st;
    if (x->op() == OpKind::Variable) {
      st = {BufferKind::Variable, variable_index(x)};
      b.var_reads.push_back(x->attrs().get_str("name"));
    } else {
      st = storage_of(x.get());
    }
    b.reads.push_back(x.get());
    args.push_back(kb.arg_for(x.get(), st, x->dtype(), x->type().numel(), false));
  }
  FJ_CHECK(storage_.count(n.get()), op_name(n->op()), " result without storage");
  args.push_back(kb.arg_for(n.get(), storage_[n.get()], n->dtype(), n->type().numel(), true));
  return args;
}

// A collective's launch: no kernel code, args {operand, result}, and the
// typed step the runtime runs (the name is for dumps only).
Built Fuser::build_collective(Group& g) {
  Built b;
  Kernel& k = b.k;
  const NodeRef& c = g.root;
  const NodeRef& x = c->input(0);
  k.kind = Kernel::Kind::Collective;
  k.domain = c->shape();
  k.reduced.assign(c->rank(), false);
  KernelBuilder kb(*this, g, b);
  buffer_args(c, b, kb);
  // [outer][parts][inner] around the axis: inner counts the elements of one
  // device's piece per outer index.
  int64_t parts = c->attrs().get_int("parts");
  int64_t outer = 1, inner = c->type().numel();
  if (c->op() != OpKind::AllReduce) {
    int axis = static_cast<int>(c->attrs().get_int("axis"));
    const Shape& piece = c->op() == OpKind::AllGather ? x->shape() : c->shape();
    outer = 1;
    for (int d = 0; d < axis; ++d) outer *= piece[d];
    inner = 1;
    for (size_t d = axis; d < piece.size(); ++d) inner *= piece[d];
  }
  std::string op(op_name(c->op()));
  k.name = "@k" + std::to_string(g.id) + "." + op + "." +
           std::string(dtype_short_name(c->dtype())) + ".p" + std::to_string(parts) + ".o" +
           std::to_string(outer) + ".i" + std::to_string(inner);
  k.summary = op + " " + x->type().str() + " -> " + c->type().str() + " over " +
              std::to_string(parts) + " devices";
  runtime::CollectiveStep step;
  switch (c->op()) {
    case OpKind::AllReduce:
      step.op = runtime::CollectiveStep::Op::AllReduce;
      break;
    case OpKind::AllGather:
      step.op = runtime::CollectiveStep::Op::AllGather;
      break;
    case OpKind::ReduceScatter:
      step.op = runtime::CollectiveStep::Op::ReduceScatter;
      break;
    case OpKind::LocalSlice:
      step.op = runtime::CollectiveStep::Op::LocalSlice;
      break;
    default:
      FJ_CHECK(false, "build_collective: ", op_name(c->op()));
  }
  step.dtype = c->dtype();
  step.parts = parts;
  step.outer = outer;
  step.inner = inner;
  b.collective = step;
  b.computes.push_back(c.get());
  return b;
}

// A family kernel: args {operands..., result} (one per buffer), its params
// from the family's record, then each operand's arg (codegen/family.h).
Built Fuser::build_family(Group& g) {
  Built b;
  Kernel& k = b.k;
  const NodeRef& n = g.root;
  const codegen::KernelFamily* fam = codegen::family_for_op(n->op());
  FJ_CHECK(fam != nullptr, "no kernel family computes ", op_name(n->op()));
  k.kind = Kernel::Kind::Family;
  k.family = static_cast<int>(
      std::find(codegen::kernel_families().begin(), codegen::kernel_families().end(), fam) -
      codegen::kernel_families().begin());
  k.params = fam->params(*n);
  k.name = kernel_name(static_cast<int>(g.id), g);
  k.domain = n->shape();
  k.reduced.assign(n->rank(), false);
  KernelBuilder kb(*this, g, b);
  for (int a : buffer_args(n, b, kb)) k.params.push_back(a);  // codegen/family.h
  if (op_arity(n->op()) < 0) k.params.push_back(static_cast<int64_t>(n->inputs().size()));
  k.summary = fam->summary(k);
  b.computes.push_back(n.get());
  return b;
}

Built Fuser::build_group(Group& g, const std::set<std::string>& deferred,
                         std::set<std::string>& hazards) {
  if (is_collective(g.root->op())) return build_collective(g);
  if (is_family(g.root->op())) return build_family(g);
  Built b;
  Kernel& k = b.k;
  k.name = kernel_name(static_cast<int>(g.id), g);
  k.kind = g.matmul ? Kernel::Kind::MatMul : Kernel::Kind::Loop;
  k.domain = g.domain;
  k.reduced = g.reduced;
  KernelBuilder kb(*this, g, b);
  // Stores: the root's buffer, then assigns of any member.
  const Node* r = g.root.get();
  if (storage_.count(r)) kb.store(g.root, store_map(g, g.root), r, storage_[r]);
  std::vector<std::pair<NodeRef, NodeRef>> stores;  // (value, variable)
  for (auto& n : g.members) {
    auto it = uses_.assigns.find(n.get());
    if (it == uses_.assigns.end()) continue;
    for (auto& a : it->second) stores.emplace_back(n, a->input(0));
  }
  for (auto& [val, var] : stores) {
    const std::string& name = var->attrs().get_str("name");
    if (deferred.count(name)) {
      int t = temp_for(name, var);
      kb.store(val, store_map(g, val), temp_key(name), {BufferKind::Arena, t});
    } else {
      kb.store(val, store_map(g, val), var.get(), {BufferKind::Variable, variable_index(var)});
      b.var_writes.push_back(name);
    }
  }
  if (opts_.check_numerics) kb.check_stores_finite();
  if (g.matmul) build_matmul_spec(g, b, kb);
  // In place is safe when every read of the variable in this kernel is at
  // the element being written.
  for (const std::string& name : b.var_writes) {
    int vi = var_index_.at(name);
    const Access* w = nullptr;
    for (auto& s : k.stores)
      if (b.arg_storage[s.where.arg].kind == BufferKind::Variable &&
          b.arg_storage[s.where.arg].index == vi)
        w = &s.where;
    for (auto& l : k.loads)
      if (b.arg_storage[l.arg].kind == BufferKind::Variable && b.arg_storage[l.arg].index == vi &&
          !(w && l == *w))
        hazards.insert(name);
    if (g.matmul && (k.mm.a.arg == w->arg || k.mm.b.arg == w->arg)) hazards.insert(name);
  }
  k.finalize();
  std::ostringstream sum;
  std::vector<NodeRef> ordered = g.members;
  std::sort(ordered.begin(), ordered.end(), [&](const NodeRef& x, const NodeRef& y) {
    return uses_.pos.at(x.get()) < uses_.pos.at(y.get());
  });
  bool first = true;
  for (auto& n : ordered) {
    if (is_view(n->op()) || is_cheap_source(n)) continue;
    sum << (first ? "" : ", ") << op_name(n->op());
    first = false;
  }
  k.summary = sum.str();
  return b;
}

// The operand `x` of a contraction as a strided buffer (materialize made
// it one): its kernel argument, strides per dim of x, and offset.
View Fuser::contraction_operand(const NodeRef& x, Built& b, KernelBuilder& kb, int& arg) {
  auto v = resolve_view(x);
  FJ_CHECK(v.has_value() && v->plain(), "contraction operand not addressable");
  const Node* base = v->base.get();
  Storage st = base->op() == OpKind::Variable
                   ? Storage{BufferKind::Variable, variable_index(v->base)}
                   : storage_of(base);
  if (base->op() == OpKind::Variable) b.var_reads.push_back(v->base->attrs().get_str("name"));
  if (std::find(b.reads.begin(), b.reads.end(), base) == b.reads.end()) b.reads.push_back(base);
  arg = kb.arg_for(base, st, v->base->dtype(), v->base->type().numel(), false);
  return *v;
}

// Drops extent-1 digits and merges adjacent digits of one index that every
// stride and coordinate walks contiguously, so a conv whose operand is an
// ordinary matrix (1x1 kernels, the weight) reaches the plain fast paths.
void Fuser::simplify_digits(DigitOperand& o, size_t nbatch) {
  std::vector<std::vector<int64_t>*> all{&o.acc.strides};
  for (auto& c : o.acc.coords) all.push_back(&c.coef);
  auto simplify = [&](std::vector<int64_t>& ext, size_t first) {
    for (size_t d = ext.size(); d-- > 0;) {
      if (ext[d] != 1 || ext.size() == 1) continue;
      ext.erase(ext.begin() + d);
      for (auto* v : all) v->erase(v->begin() + first + d);
    }
    for (size_t d = ext.size(); d-- > 1;) {
      bool ok = true;
      for (auto* v : all) ok &= (*v)[first + d - 1] == (*v)[first + d] * ext[d];
      if (!ok) continue;
      ext[d - 1] *= ext[d];
      for (auto* v : all) {
        (*v)[first + d - 1] = (*v)[first + d];
        v->erase(v->begin() + first + d);
      }
      ext.erase(ext.begin() + d);
    }
  };
  simplify(o.rows, nbatch);
  simplify(o.cols, nbatch + o.rows.size());
}

// A coordinate of x (channels-first, spatial dim i) read at window
// position * stride + tap * dilation - pad; folded into plain strides when
// it can never leave the input.
void Fuser::add_spatial_coord(DigitOperand& o, const ConvGeometry& cg, int i, int pos_dim,
                              int tap_dim, int64_t x_stride) {
  bool inside = cg.pads_lo[i] == 0 &&
                (cg.out[i] - 1) * cg.strides[i] + (cg.kernel[i] - 1) * cg.dilations[i] < cg.in[i];
  if (inside) {
    o.acc.strides[pos_dim] += cg.strides[i] * x_stride;
    o.acc.strides[tap_dim] += cg.dilations[i] * x_stride;
    return;
  }
  codegen::Coord c;
  c.coef.assign(o.acc.strides.size(), 0);
  c.coef[pos_dim] = cg.strides[i];
  c.coef[tap_dim] = cg.dilations[i];
  c.c0 = -cg.pads_lo[i];
  c.limit = cg.in[i];
  c.stride = x_stride;
  o.acc.coords.push_back(c);
}

// Convolutions as implicit GEMMs (ir/conv.h). With S spatial dims, G
// groups, Cg = C/G input and Cog = Co/G output channels per group:
//   conv:             batch (n, g), M = Cog, N = out..., K = (Cg, k...)
//   conv_data_grad:   batch (n, g), M = Cg,  N = in...,  K = (Cog, k...)
//   conv_filter_grad: batch (g),    M = Cog, N = (Cg, k...), K = (n, out...)
void Fuser::build_conv_spec(Group& g, Built& b, KernelBuilder& kb) {
  Kernel& k = b.k;
  const NodeRef& c = g.mm;
  ConvGeometry cg = geometry_of(*c);
  const int S = cg.spatial;
  const NodeRef &p0 = c->input(0), &p1 = c->input(1);
  int arg0 = -1, arg1 = -1;
  View v0 = contraction_operand(p0, b, kb, arg0);
  View v1 = contraction_operand(p1, b, kb, arg1);
  const int64_t G = cg.groups;
  auto after = [&](const std::vector<int64_t>& ext, int i) {  // row-major stride of digit i
    int64_t p = 1;
    for (size_t j = i + 1; j < ext.size(); ++j) p *= ext[j];
    return p;
  };
  DigitOperand A, B;
  std::vector<int64_t> batch;
  switch (c->op()) {
    case OpKind::Conv: {  // p0 = x [N, C, in...], p1 = w [Co, Cg, k...]
      const auto &xs = v0.strides, &ws = v1.strides;
      int64_t N = p0->shape()[0], Cg = p1->shape()[1], Cog = p1->shape()[0] / G;
      batch = {N, G};
      A.rows = {Cog};
      A.cols = {Cg};
      A.cols.insert(A.cols.end(), cg.kernel.begin(), cg.kernel.end());
      A.acc.strides = {0, Cog * ws[0], ws[0], ws[1]};
      for (int i = 0; i < S; ++i) A.acc.strides.push_back(ws[2 + i]);
      A.acc.arg = arg1;
      A.acc.offset = v1.offset;
      B.rows = A.cols;
      B.cols = cg.out;
      B.acc.strides = {xs[0], Cg * xs[1], xs[1]};
      B.acc.strides.resize(3 + 2 * S, 0);
      for (int i = 0; i < S; ++i) add_spatial_coord(B, cg, i, 3 + S + i, 3 + i, xs[2 + i]);
      B.acc.arg = arg0;
      B.acc.offset = v0.offset;
      k.mm.m = Cog;
      k.mm.n = cg.out_size();
      k.mm.k = Cg * cg.kernel_size();
      break;
    }
    case OpKind::ConvDataGrad: {  // p0 = dy [N, G, Cog, P], p1 = w [Co, Cg, k...]
      const auto &ds = v0.strides, &ws = v1.strides;
      int64_t N = p0->shape()[0], Cog = p0->shape()[2], Cg = p1->shape()[1];
      batch = {N, G};
      A.rows = {Cg};
      A.cols = {Cog};
      A.cols.insert(A.cols.end(), cg.kernel.begin(), cg.kernel.end());
      A.acc.strides = {0, Cog * ws[0], ws[1], ws[0]};
      for (int i = 0; i < S; ++i) A.acc.strides.push_back(ws[2 + i]);
      A.acc.arg = arg1;
      A.acc.offset = v1.offset;
      B.rows = A.cols;
      B.cols = cg.in;
      B.acc.strides = {ds[0], ds[1], ds[2]};
      B.acc.strides.resize(3 + 2 * S, 0);
      for (int i = 0; i < S; ++i) {
        // position (in + pad - tap * dilation) / stride in [0, out)
        codegen::Coord co;
        co.coef.assign(B.acc.strides.size(), 0);
        co.coef[3 + S + i] = 1;
        co.coef[3 + i] = -cg.dilations[i];
        co.c0 = cg.pads_lo[i];
        co.div = cg.strides[i];
        co.limit = cg.out[i];
        co.stride = ds[3] * after(cg.out, i);
        B.acc.coords.push_back(co);
      }
      B.acc.arg = arg0;
      B.acc.offset = v0.offset;
      k.mm.m = Cg;
      k.mm.n = cg.in_size();
      k.mm.k = Cog * cg.kernel_size();
      break;
    }
    case OpKind::ConvFilterGrad: {  // p0 = x [N, C, in...], p1 = dy [N, G, Cog, P]
      const auto &xs = v0.strides, &ds = v1.strides;
      int64_t N = p0->shape()[0], Cog = p1->shape()[2], Cg = p0->shape()[1] / G;
      batch = {G};
      A.rows = {Cog};
      A.cols = {N};
      A.cols.insert(A.cols.end(), cg.out.begin(), cg.out.end());
      A.acc.strides = {ds[1], ds[2], ds[0]};
      for (int i = 0; i < S; ++i) A.acc.strides.push_back(ds[3] * after(cg.out, i));
      A.acc.arg = arg1;
      A.acc.offset = v1.offset;
      B.rows = A.cols;
      B.cols = {Cg};
      B.cols.insert(B.cols.end(), cg.kernel.begin(), cg.kernel.end());
      B.acc.strides = {Cg * xs[1], xs[0]};
      B.acc.strides.resize(2 + S, 0);
      B.acc.strides.push_back(xs[1]);
      B.acc.strides.resize(3 + 2 * S, 0);
      for (int i = 0; i < S; ++i) add_spatial_coord(B, cg, i, 2 + i, 3 + S + i, xs[2 + i]);
      B.acc.arg = arg0;
      B.acc.offset = v0.offset;
      k.mm.m = Cog;
      k.mm.n = Cg * cg.kernel_size();
      k.mm.k = N * cg.out_size();
      break;
    }
    default:
      FJ_CHECK(false, "build_conv_spec: ", op_name(c->op()));
  }
  // Batch digits: extent-1 ones dropped; a single one left is the plain
  // batch index. The epilogue still sees every batch dim of the domain.
  FJ_CHECK(k.rank() == static_cast<int>(batch.size()) + 2, "conv kernel domain rank");
  int64_t total = 1;
  for (int64_t e : batch) total *= e;
  k.mm.batch = total;
  for (size_t d = batch.size(); d-- > 0;) {
    if (batch[d] != 1 || batch.size() == 1) continue;
    batch.erase(batch.begin() + d);
    for (DigitOperand* o : {&A, &B}) {
      o->acc.strides.erase(o->acc.strides.begin() + d);
      for (auto& co : o->acc.coords) co.coef.erase(co.coef.begin() + d);
    }
  }
  size_t nb = batch.size();
  simplify_digits(A, nb);
  simplify_digits(B, nb);
  if (nb > 1) k.mm.batch_digits = batch;
  auto digits_needed = [&](const DigitOperand& o) {
    return nb > 1 || o.rows.size() > 1 || o.cols.size() > 1 || !o.acc.coords.empty();
  };
  k.mm.a = A.acc;
  k.mm.b = B.acc;
  if (digits_needed(A)) {
    k.mm.a_rows = A.rows;
    k.mm.a_cols = A.cols;
  }
  if (digits_needed(B)) {
    k.mm.b_rows = B.rows;
    k.mm.b_cols = B.cols;
  }
}

void Fuser::build_matmul_spec(Group& g, Built& b, KernelBuilder& kb) {
  if (g.mm->op() != OpKind::MatMul) return build_conv_spec(g, b, kb);
  Kernel& k = b.k;
  const NodeRef& mm = g.mm;
  bool ta = mm->attrs().get_bool("transpose_a"), tb = mm->attrs().get_bool("transpose_b");
  const NodeRef &a = mm->input(0), &bb = mm->input(1);
  int r = mm->rank();
  k.mm.m = mm->shape()[r - 2];
  k.mm.n = mm->shape()[r - 1];
  k.mm.k = ta ? a->shape()[a->rank() - 2] : a->shape()[a->rank() - 1];
  int64_t batch = 1;
  for (int i = 0; i < r - 2; ++i) batch *= mm->shape()[i];
  k.mm.batch = batch;
  auto operand = [&](const NodeRef& x, bool trans) {
    auto v = resolve_view(x);
    FJ_CHECK(v.has_value(), "matmul operand not addressable");
    const Node* base = v->base.get();
    Storage st = base->op() == OpKind::Variable
                     ? Storage{BufferKind::Variable, variable_index(v->base)}
                     : storage_of(base);
    if (base->op() == OpKind::Variable) b.var_reads.push_back(v->base->attrs().get_str("name"));
    if (std::find(b.reads.begin(), b.reads.end(), base) == b.reads.end()) b.reads.push_back(base);
    int arg = kb.arg_for(base, st, v->base->dtype(), v->base->type().numel(), false);
    int xr = x->rank();
    // Batch stride: the batch dims must collapse into one.
    int64_t bstride = 0;
    if (xr > 2) {
      for (int i = xr - 3; i >= 0; --i) {
        if (i < xr - 3)
          FJ_USER_CHECK(v->strides[i] == v->strides[i + 1] * x->shape()[i + 1],
                        ErrorKind::NotImplemented,
                        "matmul: an operand whose batch dimensions are not contiguous is not "
                        "supported yet (operand ",
                        x->type().str(), ")");
      }
      bstride = v->strides[xr - 3];
    }
    int64_t s_row = v->strides[xr - 2], s_col = v->strides[xr - 1];
    Access acc;
    acc.arg = arg;
    acc.offset = v->offset;
    // a as (batch, m, k) and b as (batch, k, n): a transpose swaps the two.
    acc.strides = {bstride, trans ? s_col : s_row, trans ? s_row : s_col};
    return acc;
  };
  k.mm.a = operand(a, ta);
  k.mm.b = operand(bb, tb);
  // The epilogue's domain: collapse batch dims into one.
  if (r > 3 && !collapse_batch_dims(k)) {
    // The matmul alone stores a fresh contiguous buffer and its operands were
    // checked when grouped: only an epilogue's access can be in the way.
    FJ_CHECK(g.members.size() > 1, "matmul kernel ", k.name, ": batch dims do not collapse");
    throw SplitEpilogue{uses_.pos.at(mm.get())};
  }
}

bool Fuser::collapse_batch_dims(Kernel& k) {
  int r = k.rank();
  std::vector<std::vector<int64_t>*> all;
  for (auto& l : k.loads) {
    all.push_back(&l.strides);
    for (auto& i : l.indirect)
      if (!i.pos_strides.empty()) all.push_back(&i.pos_strides);
  }
  for (auto& s : k.stores) all.push_back(&s.where.strides);
  for (auto& n : k.nodes)
    if (!n.index_strides.empty()) all.push_back(&n.index_strides);
  for (int d = r - 3; d > 0; --d)
    for (auto* v : all)
      if ((*v)[d - 1] != (*v)[d] * k.domain[d]) return false;
  for (int d = r - 3; d > 0; --d) {
    k.domain[d - 1] *= k.domain[d];
    k.domain.erase(k.domain.begin() + d);
    k.reduced.erase(k.reduced.begin() + d);
    for (auto* v : all) {
      (*v)[d - 1] = (*v)[d];
      v->erase(v->begin() + d);
    }
  }
  return true;
}

}  // namespace flowjit::jit::fusion_detail
