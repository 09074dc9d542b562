// fusion: launch order, deferred assigns, arena lives and the runtime plan.
#include <algorithm>
#include <deque>
#include <filesystem>

#include "jit/fusion/internal.h"

namespace flowjit::jit::fusion_detail {

Fuser::Fuser(Graph g, Uses uses, Grouping grouping, const std::string& job, FusionOptions opts)
    : g_(std::move(g)),
      uses_(std::move(uses)),
      grouping_(std::move(grouping)),
      job_(job),
      opts_(std::move(opts)) {}

FusedProgram Fuser::run() {
  FusedProgram out;
  out.graph = g_;
  build_and_schedule(out);
  return out;
}

// Builds every group's kernel, orders them, and writes the plan: the stages
// after grouping, each a function of the record the one before made.
void Fuser::build_and_schedule(FusedProgram& out) {
  std::vector<const Node*> arena_nodes = assign_storage();
  Launches ls;
  form_launches(ls);
  guard_variable_writers(ls);
  std::vector<BufferLife> lives = buffer_lives(ls, arena_nodes);
  write_plan(ls, plan_arena(lives), out);
}

namespace {

bool writes_a_variable(const Built* b) {
  for (size_t a = 0; a < b->arg_storage.size(); ++a)
    if (b->arg_storage[a].kind == BufferKind::Variable && b->k.args[a].written) return true;
  return false;
}

}  // namespace

// Storage for inputs and for every value a group stores: an output, or an
// arena buffer (the arena buffers' values, by index, returned).
std::vector<const Node*> Fuser::assign_storage() {
  for (auto& [node, idx] : uses_.param_index) storage_[node] = {BufferKind::Input, idx};
  std::vector<const Node*> arena_nodes;
  for (auto& g : grouping_.groups) {
    const Node* r = g->root.get();
    auto o = uses_.output_of.find(r);
    if (o != uses_.output_of.end()) {
      storage_[r] = {BufferKind::Output, o->second};
    } else if (uses_.users.count(r) && !uses_.users.at(r).empty()) {
      storage_[r] = {BufferKind::Arena, static_cast<int>(arena_nodes.size())};
      arena_nodes.push_back(r);
    }
  }
  return arena_nodes;
}

// The kernels of every group and their launch order.
void Fuser::form_launches(Launches& ls) {
  // First attempt: assigns stored in place. If the schedule has a cycle or
  // an in-place hazard, those assigns go through temporaries instead.
  std::vector<int> order;
  std::set<std::string> deferred;
  // Rounds: a variable writer that cannot move after the last check (below)
  // defers its assigns and the kernels are built again.
  for (bool again = true; again;) {
    again = false;
    for (int attempt = 0; attempt < 2; ++attempt) {
      ls.kernels.clear();
      std::set<std::string> hazards;
      for (auto& g : grouping_.groups) ls.kernels.push_back(build_group(*g, deferred, hazards));
      // [harden] A kernel that checks something (check_numerics of the value
      // it stores, an index it reads) does not write a variable in place: it
      // would have written before its own check fails, which no guard at
      // its entry can stop. Its assigns are deferred: it stores into a
      // temporary, and a copy kernel at the end, guarded like every later
      // writer, updates the variable.
      for (const Built& b : ls.kernels)
        if (b.k.status_arg >= 0) hazards.insert(b.var_writes.begin(), b.var_writes.end());
      if (!hazards.empty() && attempt == 0) {
        deferred.insert(hazards.begin(), hazards.end());
        continue;
      }
      if (auto o = launch_order(launch_deps(ls.kernels))) {
        order = std::move(*o);
        break;
      }
      FJ_CHECK(attempt == 0, "fusion: no schedule even with deferred assigns");
      for (auto& [val, as] : uses_.assigns)
        for (auto& a : as) deferred.insert(a->input(0)->attrs().get_str("name"));
    }
    // Deferred assigns: copy kernels after everything else.
    ls.copies = build_deferred_copies(deferred);

    // Launch order, arena lives and the plan.
    ls.order.clear();
    for (int gi : order) ls.order.push_back(&ls.kernels[gi]);
    for (auto& c : ls.copies) ls.order.push_back(&c);
    // [harden] After a launch that checks something, every kernel that writes
    // a variable reads the status buffer first and does nothing when a check
    // failed (codegen::Kernel::guard_arg): a bad label leaves the weights as
    // they were also where the runtime learns of it only after the run.
    // Several devices: each checks only its own part, and a device that
    // skipped its update alone would leave the replicas unequal. So before
    // such a kernel the devices all-gather their status buffers, the guards
    // read every device's status, and the runtime raises on every device
    // right after the all_gather (runtime::Executable::raise_gathered_check):
    // all skip, or all stop, at the same launch. A program that checks
    // anything after its last all_gather ends with one, so that every device
    // reports a failure (the logical position: runtime::RunCheck).
    //
    // First, a kernel that writes a variable but comes before a checking
    // launch (the step counter's increment, traced first) moves to just after
    // the last one when nothing up to there touches what it writes, so that a
    // failed check leaves every variable as it was. One that cannot move (a
    // launch up to there reads a value it stores besides the variable, e.g.
    // a gather from the new value) would have written before the check fails
    // and no guard could stop it: its assigns are deferred like a checking
    // kernel's (a temporary, then a guarded copy at the end), and the kernels
    // are built again.
    int last_check = -1;
    for (size_t li = 0; li < ls.order.size(); ++li)
      if (ls.order[li]->k.status_arg >= 0) last_check = static_cast<int>(li);
    for (int li = last_check - 1; li >= 0; --li) {
      Built* w = ls.order[li];
      if (!writes_a_variable(w)) continue;
      bool touched = false;
      for (int lj = li + 1; lj <= last_check && !touched; ++lj)
        for (size_t a = 0; a < w->arg_storage.size() && !touched; ++a) {
          if (!w->k.args[a].written) continue;
          for (const Storage& s : ls.order[lj]->arg_storage)
            touched |= s.kind == w->arg_storage[a].kind && s.index == w->arg_storage[a].index;
        }
      if (touched) {
        for (const std::string& v : w->var_writes) again |= deferred.insert(v).second;
        continue;
      }
      ls.order.erase(ls.order.begin() + li);
      ls.order.insert(ls.order.begin() + last_check, w);
      --last_check;
    }
  }
}

void Fuser::guard_variable_writers(Launches& ls) {
  const int devices = std::max(1, opts_.devices);
  std::vector<Built*> ordered;
  bool checked = false;
  bool unshared = false;   // a launch checked something since the last all_gather
  size_t after_check = 0;  // in `ordered`: just after the last checking launch
  for (Built* b : ls.order) {
    bool writes_variable = writes_a_variable(b);
    if (devices > 1 && unshared && writes_variable) {
      // Right after the check: the all_gather may run on the communication
      // thread while the backward pass goes on (complete before the first
      // launch that touches the status again, below).
      ls.gathers.push_back(build_status_gather(devices));
      ordered.insert(ordered.begin() + static_cast<std::ptrdiff_t>(after_check),
                     &ls.gathers.back());
      unshared = false;
    }
    if (checked && writes_variable) {
      const void* key = devices > 1 ? gathered_status_key() : status_key();
      auto it = std::find(b->arg_buffers.begin(), b->arg_buffers.end(), key);
      if (it == b->arg_buffers.end()) {
        b->arg_buffers.push_back(key);
        b->arg_storage.push_back(
            {BufferKind::Arena, devices > 1 ? gathered_status_buffer() : status_buffer()});
        codegen::KernelArg st;
        st.dtype = DType::Int64;
        st.elements = 4 * devices;
        st.read = true;
        b->k.args.push_back(st);
        it = b->arg_buffers.end() - 1;
      } else {
        b->k.args[it - b->arg_buffers.begin()].read = true;
      }
      b->k.guard_arg = static_cast<int>(it - b->arg_buffers.begin());
      b->k.guard_words = devices;
    }
    ordered.push_back(b);
    if (b->k.status_arg >= 0) {
      checked = unshared = true;
      after_check = ordered.size();
    }
  }
  if (devices > 1 && unshared) {
    ls.gathers.push_back(build_status_gather(devices));
    ordered.push_back(&ls.gathers.back());
  }
  ls.order = std::move(ordered);
}

std::vector<BufferLife> Fuser::buffer_lives(Launches& ls,
                                            const std::vector<const Node*>& arena_nodes) {
  // Arena buffers: intermediates, then the temporaries of deferred assigns
  // (live for the whole run).
  const int arena_buffers = static_cast<int>(arena_nodes.size());
  std::vector<BufferLife> lives(arena_buffers);
  for (int i = 0; i < arena_buffers; ++i) {
    lives[i].bytes = arena_nodes[i]->type().bytes();
    lives[i].first = -1;
  }
  lives.insert(lives.end(), temp_lives_.begin(), temp_lives_.end());
  for (size_t li = 0; li < ls.order.size(); ++li) {
    Built& b = *ls.order[li];
    for (size_t a = 0; a < b.arg_storage.size(); ++a) {
      const Storage& s = b.arg_storage[a];
      if (s.kind != BufferKind::Arena) continue;
      FJ_CHECK(s.index >= 0 && s.index < static_cast<int>(lives.size()), "arena buffer index");
      BufferLife& l = lives[s.index];
      if (b.k.args[a].written && l.first < 0) l.first = static_cast<int>(li);
      l.last = std::max(l.last, static_cast<int>(li));
    }
  }
  for (auto& l : lives)
    if (l.first < 0) l.first = 0;
  for (size_t t = 0; t < temp_lives_.size(); ++t) {
    BufferLife& l = lives[arena_buffers + t];
    l.first = 0;
    l.last = static_cast<int>(ls.order.size());
  }
  // Asynchronous all_reduces and all_gathers (runtime/executable.h,
  // CollectiveStep::complete_before): complete before the first later
  // launch that touches the operand or the result; both stay alive until
  // then, so that no other value is placed in them while the communication
  // thread works. An all_gather whose result the next launch reads stays
  // synchronous (nothing could run beside it); one that only feeds a job
  // output (a data-parallel loss) no longer holds the backward pass up.
  auto same = [](const Storage& a, const Storage& b) {
    return a.kind == b.kind && a.index == b.index;
  };
  for (size_t li = 0; li < ls.order.size(); ++li) {
    Built& b = *ls.order[li];
    if (!b.collective || (b.collective->op != runtime::CollectiveStep::Op::AllReduce &&
                          b.collective->op != runtime::CollectiveStep::Op::AllGather))
      continue;
    size_t until = ls.order.size();
    for (size_t lj = li + 1; lj < ls.order.size() && until == ls.order.size(); ++lj)
      for (const Storage& s : ls.order[lj]->arg_storage)
        if (same(s, b.arg_storage[0]) || same(s, b.arg_storage[1])) {
          until = lj;
          break;
        }
    if (b.collective->op == runtime::CollectiveStep::Op::AllGather && until <= li + 1) continue;
    b.collective->complete_before = static_cast<int64_t>(until);
    for (const Storage& s : b.arg_storage)
      if (s.kind == BufferKind::Arena) {
        BufferLife& l = lives[s.index];
        l.last = std::max(l.last, static_cast<int>(until));
      }
  }
  return lives;
}

void Fuser::write_plan(Launches& ls, const ArenaPlan& ap, FusedProgram& out) {
  runtime::Plan& plan = out.plan;
  plan.job_name = job_;
  for (auto& p : g_.params) plan.inputs.push_back(p->type());
  for (auto& o : g_.outputs) plan.outputs.push_back(o->type());
  plan.arena_bytes = ap.arena_bytes;
  if (status_index_ >= 0) plan.status_offset = ap.offsets[status_index_];
  plan.checks = checks_;
  out.bytes_without_reuse = ap.total_bytes;
  plan.variables = plan_vars_;

  auto names = value_names(g_);
  std::ostringstream desc;
  plan.first_variable_write = static_cast<int64_t>(ls.order.size());
  for (size_t li = 0; li < ls.order.size(); ++li)
    if (writes_a_variable(ls.order[li])) {
      plan.first_variable_write = static_cast<int64_t>(li);
      break;
    }
  for (size_t li = 0; li < ls.order.size(); ++li) {
    Built& b = *ls.order[li];
    runtime::Launch l;
    l.symbol = b.k.name;
    for (size_t a = 0; a < b.arg_storage.size(); ++a) {
      const Storage& s = b.arg_storage[a];
      if (s.kind == BufferKind::Arena)
        l.args.push_back({BufferKind::Arena, 0, ap.offsets[s.index]});
      else
        l.args.push_back({s.kind, s.index, 0});
    }
    l.summary = b.k.summary;
    l.collective = b.collective;
    plan.launches.push_back(l);
    // Description: name, computed values, stores.
    desc << b.k.name << ":";
    std::vector<const Node*> comp = b.computes;
    std::sort(comp.begin(), comp.end(),
              [&](const Node* x, const Node* y) { return uses_.pos.at(x) < uses_.pos.at(y); });
    comp.erase(std::unique(comp.begin(), comp.end()), comp.end());
    for (const Node* c : comp) desc << " " << names[c];
    desc << " ->";
    for (auto& s : b.k.stores) {
      const Node* buf = static_cast<const Node*>(b.arg_buffers[s.where.arg]);
      const Storage& st = b.arg_storage[s.where.arg];
      switch (st.kind) {
        case BufferKind::Output:
          desc << " out" << st.index;
          break;
        case BufferKind::Variable:
          desc << " var:" << plan_vars_[st.index].first;
          break;
        default:
          desc << " " << (names.count(buf) ? names[buf] : std::string("tmp"));
          break;
      }
    }
    desc << "\n";
    out.kernels.push_back(std::move(b.k));
  }
  out.description = desc.str();
}

int Fuser::check_id(const NodeRef& check, const std::vector<int64_t>& limits) {
  auto it = check_ids_.find(check.get());
  if (it != check_ids_.end()) return it->second;
  runtime::RunCheck c;
  c.what = check->attrs().get_str("what");
  // The user's "file.py:12", as tracing errors name it.
  const ir::SourceLoc& loc = check->loc();
  if (loc.known())
    c.where = std::filesystem::path(loc.file).filename().string() + ":" + std::to_string(loc.line);
  c.numerics = check->op() == OpKind::CheckFinite;
  bool same = std::all_of(limits.begin(), limits.end(), [&](int64_t l) { return l == limits[0]; });
  c.limit = limits.empty() ? 0 : same ? limits[0] : -1;
  if (!same) c.limits = limits;
  c.shape = check->shape();
  if (check->op() == OpKind::CheckIndex)
    c.device_split = static_cast<int>(check->attrs().get_int("device_split", -1));
  c.job = opts_.checks_job;
  checks_.push_back(c);
  int id = static_cast<int>(checks_.size()) - 1;
  check_ids_[check.get()] = id;
  return id;
}

int Fuser::numerics_check_id(const std::string& kernel, const NodeRef& value,
                             const Storage& where) {
  runtime::RunCheck c;
  c.numerics = true;
  // What computed the value: through the copies fusion adds for stores.
  NodeRef v = value;
  while (v->op() == OpKind::Identity && v->inputs().size() == 1 && !v->loc().known())
    v = v->input(0);
  std::string what = std::string(op_name(v->op()));
  if (where.kind == BufferKind::Variable)
    what += ", the new value of variable '" + plan_vars_.at(where.index).first + "'";
  for (const auto& [name, index] : temp_index_)  // a deferred assign's temporary
    if (where.kind == BufferKind::Arena && where.index == index)
      what += ", the new value of variable '" + name + "'";
  c.what = "check_numerics: kernel " + kernel + " stores " + what;
  const ir::SourceLoc& loc = v->loc();
  if (loc.known())
    c.where = std::filesystem::path(loc.file).filename().string() + ":" + std::to_string(loc.line);
  c.shape = value->shape();
  c.job = opts_.checks_job;
  checks_.push_back(c);
  return static_cast<int>(checks_.size()) - 1;
}

int Fuser::status_buffer() {
  if (status_index_ >= 0) return status_index_;
  status_index_ = arena_base_count() + static_cast<int>(temp_lives_.size());
  BufferLife l;
  l.bytes = 4 * sizeof(int64_t);
  temp_lives_.push_back(l);
  return status_index_;
}

int Fuser::gathered_status_buffer() {
  if (gathered_index_ >= 0) return gathered_index_;
  gathered_index_ = arena_base_count() + static_cast<int>(temp_lives_.size());
  BufferLife l;
  l.bytes = 4 * sizeof(int64_t) * std::max(1, opts_.devices);
  temp_lives_.push_back(l);
  return gathered_index_;
}

Built Fuser::build_status_gather(int n) {
  Built b;
  b.status_gather = true;
  Kernel& k = b.k;
  k.kind = Kernel::Kind::Collective;
  k.domain = {4};
  k.reduced = {false};
  auto add_arg = [&](const void* key, int buffer, int64_t elements, bool write) {
    b.arg_buffers.push_back(key);
    b.arg_storage.push_back({BufferKind::Arena, buffer});
    codegen::KernelArg a;
    a.dtype = DType::Int64;
    a.elements = elements;
    (write ? a.written : a.read) = true;
    k.args.push_back(a);
  };
  add_arg(status_key(), status_buffer(), 4, false);
  add_arg(gathered_status_key(), gathered_status_buffer(), 4 * n, true);
  k.name = "@status" + std::to_string(status_gathers_++) + ".all_gather.i64.p" + std::to_string(n) +
           ".o1.i4";
  k.summary = "all_gather of the run's status over " + std::to_string(n) + " devices";
  runtime::CollectiveStep step;
  step.op = runtime::CollectiveStep::Op::AllGather;
  step.dtype = DType::Int64;
  step.parts = n;
  step.outer = 1;
  step.inner = 4;
  b.collective = step;
  return b;
}

int Fuser::temp_for(const std::string& name, const NodeRef& var) {
  auto it = temp_index_.find(name);
  if (it != temp_index_.end()) return it->second;
  int idx = arena_base_count() + static_cast<int>(temp_lives_.size());
  BufferLife l;
  l.bytes = var->type().bytes();
  temp_lives_.push_back(l);
  temp_index_[name] = idx;
  temp_vars_[name] = var;
  return idx;
}

int Fuser::arena_base_count() {
  int n = 0;
  for (auto& [node, s] : storage_)
    if (s.kind == BufferKind::Arena) n = std::max(n, s.index + 1);
  return n;
}

std::vector<Built> Fuser::build_deferred_copies(const std::set<std::string>& deferred) {
  std::vector<Built> out;
  int i = 0;
  for (const std::string& name : deferred) {
    auto it = temp_vars_.find(name);
    if (it == temp_vars_.end()) continue;
    const NodeRef& var = it->second;
    Built b;
    Kernel& k = b.k;
    k.name = "k" + std::to_string(grouping_.groups.size() + i++) + "_assign";
    k.kind = Kernel::Kind::Loop;
    k.domain = var->shape();
    k.reduced.assign(var->rank(), false);
    std::vector<int64_t> cs = contiguous_strides(var->shape());
    auto add_arg = [&](const void* key, Storage s, bool write) {
      b.arg_buffers.push_back(key);
      b.arg_storage.push_back(s);
      codegen::KernelArg a;
      a.dtype = var->dtype();
      a.elements = var->type().numel();
      (write ? a.written : a.read) = true;
      k.args.push_back(a);
      return static_cast<int>(k.args.size()) - 1;
    };
    int src = add_arg(temp_key(name), {BufferKind::Arena, temp_index_.at(name)}, false);
    int dst = add_arg(var.get(), {BufferKind::Variable, variable_index(var)}, true);
    k.loads.push_back({src, cs, 0});
    KNode ld;
    ld.kind = KOp::Load;
    ld.dtype = var->dtype();
    ld.access = 0;
    k.nodes.push_back(ld);
    k.stores.push_back({0, {dst, cs, 0}});
    k.summary = "assign " + name;
    k.finalize();
    out.push_back(std::move(b));
  }
  return out;
}

// The order stage's view of the kernels built from the groups (built[i] from
// group i): which kernels' results each reads, and its variables.
std::vector<LaunchDeps> Fuser::launch_deps(const std::vector<Built>& built) const {
  std::unordered_map<const Node*, int> producer;
  for (size_t i = 0; i < built.size(); ++i)
    producer[grouping_.groups[i]->root.get()] = static_cast<int>(i);
  std::vector<LaunchDeps> deps(built.size());
  for (size_t i = 0; i < built.size(); ++i) {
    const NodeRef& root = grouping_.groups[i]->root;
    deps[i].collective = is_collective(root->op());
    deps[i].program_pos = uses_.pos.at(root.get());
    for (const Node* r : built[i].reads) {
      auto p = producer.find(r);
      if (p != producer.end()) deps[i].reads.push_back(p->second);
    }
    deps[i].var_reads = built[i].var_reads;
    deps[i].var_writes = built[i].var_writes;
  }
  return deps;
}

}  // namespace flowjit::jit::fusion_detail

namespace flowjit::jit {

FusedProgram fuse(const ir::Graph& g, const std::string& job_name, FusionOptions opts) {
  using namespace fusion_detail;
  Graph prepared = prepare(g);
  GroupingOptions grouping{opts.fuse, {}};
  for (;;) {
    Uses uses = analyze(prepared);
    Grouping groups = group(uses, grouping);
    try {
      return Fuser(prepared, std::move(uses), std::move(groups), job_name, opts).run();
    } catch (const SplitEpilogue& s) {
      FJ_CHECK(grouping.unfused_matmuls.insert(s.matmul_pos).second,
               "fusion: the epilogue of the same matmul was split twice");
    }
  }
}

}  // namespace flowjit::jit
