// fusion: launch order, deferred assigns, arena lives and the runtime plan.
#include <algorithm>
#include <deque>
#include <filesystem>

#include "jit/fusion/internal.h"

namespace flowjit::jit::fusion_detail {

Fuser::Fuser(const Graph& g, const std::string& job, FusionOptions opts,
             std::set<int> unfused_matmuls)
    : job_(job), opts_(opts), unfused_matmuls_(std::move(unfused_matmuls)) {
  g_ = materialize(g);
}

FusedProgram Fuser::run() {
  analyze();
  form_groups();
  FusedProgram out;
  out.graph = g_;
  build_and_schedule(out);
  return out;
}

// Builds every group's kernel, orders them, and writes the plan.
void Fuser::build_and_schedule(FusedProgram& out) {
  // Storage for inputs and for every value a group stores.
  for (auto& [node, idx] : param_index_) storage_[node] = {BufferKind::Input, idx};
  int arena_buffers = 0;
  std::vector<const Node*> arena_nodes;
  for (auto& g : groups_) {
    const Node* r = g->root.get();
    auto o = output_of_.find(r);
    if (o != output_of_.end()) {
      storage_[r] = {BufferKind::Output, o->second};
    } else if (users_.count(r) && !users_[r].empty()) {
      storage_[r] = {BufferKind::Arena, arena_buffers++};
      arena_nodes.push_back(r);
    }
  }
  // First attempt: assigns stored in place. If the schedule has a cycle or
  // an in-place hazard, those assigns go through temporaries instead.
  std::vector<Built> built;
  std::vector<int> order;
  std::set<std::string> deferred;
  std::vector<Built> copies;
  std::vector<Built*> launches;
  runtime::Plan& plan = out.plan;
  auto writes_a_variable = [](const Built* b) {
    for (size_t a = 0; a < b->arg_storage.size(); ++a)
      if (b->arg_storage[a].kind == BufferKind::Variable && b->k.args[a].written) return true;
    return false;
  };
  // Rounds: a variable writer that cannot move after the last check (below)
  // defers its assigns and the kernels are built again.
  for (bool again = true; again;) {
    again = false;
    for (int attempt = 0; attempt < 2; ++attempt) {
      built.clear();
      std::set<std::string> hazards;
      for (auto& g : groups_) built.push_back(build_group(*g, deferred, hazards));
      // [harden] A kernel that checks something (check_numerics of the value
      // it stores, an index it reads) does not write a variable in place: it
      // would have written before its own check fails, which no guard at
      // its entry can stop. Its assigns are deferred: it stores into a
      // temporary, and a copy kernel at the end, guarded like every later
      // writer, updates the variable.
      for (const Built& b : built)
        if (b.k.status_arg >= 0) hazards.insert(b.var_writes.begin(), b.var_writes.end());
      if (!hazards.empty() && attempt == 0) {
        deferred.insert(hazards.begin(), hazards.end());
        continue;
      }
      if (schedule(built, order)) break;
      FJ_CHECK(attempt == 0, "fusion: no schedule even with deferred assigns");
      for (auto& [val, as] : assigns_)
        for (auto& a : as) deferred.insert(a->input(0)->attrs().get_str("name"));
    }
    // Deferred assigns: copy kernels after everything else.
    copies = build_deferred_copies(deferred);

    // Launch order, arena lives and the plan.
    launches.clear();
    for (int gi : order) launches.push_back(&built[gi]);
    for (auto& c : copies) launches.push_back(&c);
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
    for (size_t li = 0; li < launches.size(); ++li)
      if (launches[li]->k.status_arg >= 0) last_check = static_cast<int>(li);
    for (int li = last_check - 1; li >= 0; --li) {
      Built* w = launches[li];
      if (!writes_a_variable(w)) continue;
      bool touched = false;
      for (int lj = li + 1; lj <= last_check && !touched; ++lj)
        for (size_t a = 0; a < w->arg_storage.size() && !touched; ++a) {
          if (!w->k.args[a].written) continue;
          for (const Storage& s : launches[lj]->arg_storage)
            touched |= s.kind == w->arg_storage[a].kind && s.index == w->arg_storage[a].index;
        }
      if (touched) {
        for (const std::string& v : w->var_writes) again |= deferred.insert(v).second;
        continue;
      }
      launches.erase(launches.begin() + li);
      launches.insert(launches.begin() + last_check, w);
      --last_check;
    }
  }  // rounds
  plan.job_name = job_;
  for (auto& p : g_.params) plan.inputs.push_back(p->type());
  for (auto& o : g_.outputs) plan.outputs.push_back(o->type());
  const int devices = std::max(1, opts_.devices);
  std::deque<Built> gathers;
  std::vector<Built*> ordered;
  bool checked = false;
  bool unshared = false;   // a launch checked something since the last all_gather
  size_t after_check = 0;  // in `ordered`: just after the last checking launch
  for (Built* b : launches) {
    bool writes_variable = writes_a_variable(b);
    if (devices > 1 && unshared && writes_variable) {
      // Right after the check: the all_gather may run on the communication
      // thread while the backward pass goes on (complete before the first
      // launch that touches the status again, below).
      gathers.push_back(build_status_gather(devices));
      ordered.insert(ordered.begin() + static_cast<std::ptrdiff_t>(after_check), &gathers.back());
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
    gathers.push_back(build_status_gather(devices));
    ordered.push_back(&gathers.back());
  }
  launches = std::move(ordered);

  // Arena buffers: intermediates, then the temporaries of deferred assigns
  // (live for the whole run).
  std::vector<BufferLife> lives(arena_buffers);
  for (int i = 0; i < arena_buffers; ++i) {
    lives[i].bytes = arena_nodes[i]->type().bytes();
    lives[i].first = -1;
  }
  lives.insert(lives.end(), temp_lives_.begin(), temp_lives_.end());
  for (size_t li = 0; li < launches.size(); ++li) {
    Built& b = *launches[li];
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
    l.last = static_cast<int>(launches.size());
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
  for (size_t li = 0; li < launches.size(); ++li) {
    Built& b = *launches[li];
    if (!b.collective || (b.collective->op != runtime::CollectiveStep::Op::AllReduce &&
                          b.collective->op != runtime::CollectiveStep::Op::AllGather))
      continue;
    size_t until = launches.size();
    for (size_t lj = li + 1; lj < launches.size() && until == launches.size(); ++lj)
      for (const Storage& s : launches[lj]->arg_storage)
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
  ArenaPlan ap = plan_arena(lives);
  plan.arena_bytes = ap.arena_bytes;
  if (status_index_ >= 0) plan.status_offset = ap.offsets[status_index_];
  plan.checks = checks_;
  out.bytes_without_reuse = ap.total_bytes;
  plan.variables = plan_vars_;

  auto names = value_names(g_);
  std::ostringstream desc;
  plan.first_variable_write = static_cast<int64_t>(launches.size());
  for (size_t li = 0; li < launches.size(); ++li)
    if (writes_a_variable(launches[li])) {
      plan.first_variable_write = static_cast<int64_t>(li);
      break;
    }
  for (size_t li = 0; li < launches.size(); ++li) {
    Built& b = *launches[li];
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
              [&](const Node* x, const Node* y) { return pos_[x] < pos_[y]; });
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
    k.name = "k" + std::to_string(groups_.size() + i++) + "_assign";
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

// Kahn's algorithm over data and anti dependences (readers of a
// variable's old value run before the kernel that overwrites it). Ties go
// to program order. Returns false on a cycle.
bool Fuser::schedule(std::vector<Built>& built, std::vector<int>& order) {
  size_t n = built.size();
  std::vector<std::set<int>> succ(n);
  std::vector<int> indeg(n, 0);
  std::unordered_map<const Node*, int> producer;
  for (size_t i = 0; i < n; ++i) producer[groups_[i]->root.get()] = static_cast<int>(i);
  auto edge = [&](int from, int to) {
    if (from == to) return;
    if (succ[from].insert(to).second) ++indeg[to];
  };
  std::unordered_map<std::string, int> writer;
  for (size_t i = 0; i < n; ++i)
    for (auto& v : built[i].var_writes) writer[v] = static_cast<int>(i);
  for (size_t i = 0; i < n; ++i) {
    for (const Node* r : built[i].reads) {
      auto p = producer.find(r);
      if (p != producer.end()) edge(p->second, static_cast<int>(i));
    }
    for (auto& v : built[i].var_reads) {
      auto w = writer.find(v);
      if (w != writer.end()) edge(static_cast<int>(i), w->second);
    }
  }
  // Collectives start as early as they can and their consumers run as
  // late as they can, so that the runtime exchanges on its communication
  // thread while the kernels between them run (overlap): first the kernels
  // that compute an operand of a collective (a backward pass's gradients),
  // then all ready collectives at once (adjacent all_reduces are one
  // bucket: one exchange instead of one per variable), then other kernels,
  // and the kernels that read a collective's result only when nothing else
  // is ready (the updates wait for their own bucket only).
  using Queue =
      std::priority_queue<std::pair<int, int>, std::vector<std::pair<int, int>>, std::greater<>>;
  std::vector<bool> feeds(n, false), waits(n, false);
  for (size_t i = 0; i < n; ++i) {
    bool coll = is_collective(groups_[i]->root->op());
    for (const Node* r : built[i].reads) {
      auto p = producer.find(r);
      if (p == producer.end()) continue;
      if (coll) feeds[p->second] = true;
      if (is_collective(groups_[p->second]->root->op())) waits[i] = true;
    }
  }
  Queue feeders, collectives, ready;
  // Consumers go in the order their collectives were launched (an update
  // of the first bucket does not wait behind the last), then program order.
  using Key = std::pair<std::pair<int, int>, int>;
  std::priority_queue<Key, std::vector<Key>, std::greater<>> consumers;
  std::vector<int> at(n, -1);  // position in `order`
  auto push = [&](int i) {
    const Node* r = groups_[i]->root.get();
    if (waits[i] && !is_collective(r->op()) && !feeds[i]) {
      int last = -1;
      for (const Node* x : built[i].reads) {
        auto p = producer.find(x);
        if (p != producer.end() && is_collective(groups_[p->second]->root->op()))
          last = std::max(last, at[p->second]);
      }
      consumers.push({{last, pos_[r]}, i});
      return;
    }
    Queue& q = is_collective(r->op()) ? collectives : feeds[i] ? feeders : ready;
    q.push({pos_[r], i});
  };
  for (size_t i = 0; i < n; ++i)
    if (indeg[i] == 0) push(static_cast<int>(i));
  order.clear();
  auto take = [&](auto& q) {
    int i = q.top().second;
    q.pop();
    at[i] = static_cast<int>(order.size());
    order.push_back(i);
    for (int s : succ[i])
      if (--indeg[s] == 0) push(s);
  };
  while (!feeders.empty() || !collectives.empty() || !ready.empty() || !consumers.empty()) {
    if (!feeders.empty()) {
      take(feeders);
    } else if (!collectives.empty()) {
      while (!collectives.empty()) take(collectives);
    } else if (!ready.empty()) {
      take(ready);
    } else {
      take(consumers);
    }
  }
  return order.size() == n;
}

}  // namespace flowjit::jit::fusion_detail

namespace flowjit::jit {

FusedProgram fuse(const ir::Graph& g, const std::string& job_name, FusionOptions opts) {
  std::set<int> unfused;
  for (;;) {
    try {
      return fusion_detail::Fuser(g, job_name, opts, unfused).run();
    } catch (const fusion_detail::SplitEpilogue& s) {
      FJ_CHECK(unfused.insert(s.matmul_pos).second,
               "fusion: the epilogue of the same matmul was split twice");
    }
  }
}

}  // namespace flowjit::jit
