// Bindings: compiling a traced job and running compiled jobs, synchronously
// or through the session's worker with callbacks.
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include <llvm/Support/JSON.h>

#include "codegen/cpu/backend.h"
#include "codegen/cpu/kernel_units.h"
#include "ir/error.h"
#include "jit/autodiff.h"
#include "jit/cache.h"
#include "jit/compile.h"
#include "python/csrc/bindings.h"
#include "python/csrc/gpu_bindings.h"
#include "python/csrc/session.h"
#include "runtime/memory.h"
#include "runtime/program.h"

namespace flowjit::python {

namespace {

// A JSON value as Python's json module would give it.
py::object json_value(const llvm::json::Value& v) {
  switch (v.kind()) {
    case llvm::json::Value::Null:
      return py::none();
    case llvm::json::Value::Boolean:
      return py::bool_(*v.getAsBoolean());
    case llvm::json::Value::Number:
      if (auto i = v.getAsInteger()) return py::int_(*i);
      return py::float_(*v.getAsNumber());
    case llvm::json::Value::String:
      return py::str(v.getAsString()->str());
    case llvm::json::Value::Array: {
      py::list out;
      for (const llvm::json::Value& x : *v.getAsArray()) out.append(json_value(x));
      return out;
    }
    case llvm::json::Value::Object: {
      py::dict out;
      for (const auto& [k, x] : *v.getAsObject()) out[py::str(k.str())] = json_value(x);
      return out;
    }
  }
  return py::none();
}

// Text jit::DiskCache checked to be a JSON object (EntryReport::meta).
py::object json_to_python(const std::string& text) {
  llvm::Expected<llvm::json::Value> v = llvm::json::parse(text);
  if (!v) {
    llvm::consumeError(v.takeError());
    throw py::value_error("meta.json does not parse");
  }
  return json_value(*v);
}

// The thread that imported flowjit: Python's main thread, where signal
// handlers run.
std::thread::id& main_thread() {
  static std::thread::id id = std::this_thread::get_id();
  return id;
}

// [harden] While a synchronous run is in progress on the main thread: a
// SIGINT handler in front of the one installed (Python's) that asks the run
// to stop (runtime::interrupt_requested) and then calls it. Nothing is
// installed when SIGINT is ignored or has its default action (Python is not
// handling it). The destructor puts the handler back and clears the request.
struct sigaction g_sigint_behind;

void sigint_in_front(int sig, siginfo_t* info, void* context) {
  runtime::interrupt_requested().store(true);
  if (g_sigint_behind.sa_flags & SA_SIGINFO) {
    if (g_sigint_behind.sa_sigaction) g_sigint_behind.sa_sigaction(sig, info, context);
  } else if (g_sigint_behind.sa_handler != SIG_DFL && g_sigint_behind.sa_handler != SIG_IGN) {
    g_sigint_behind.sa_handler(sig);
  }
}

class SigintWatch {
 public:
  explicit SigintWatch(bool on) {
    if (!on) return;
    struct sigaction now;
    if (sigaction(SIGINT, nullptr, &now) != 0) return;
    if (!(now.sa_flags & SA_SIGINFO) && (now.sa_handler == SIG_DFL || now.sa_handler == SIG_IGN))
      return;
    g_sigint_behind = now;
    runtime::interrupt_requested().store(false);
    struct sigaction mine = now;
    mine.sa_flags = (now.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
    mine.sa_sigaction = &sigint_in_front;
    installed_ = sigaction(SIGINT, &mine, nullptr) == 0;
  }
  ~SigintWatch() {
    if (!installed_) return;
    sigaction(SIGINT, &g_sigint_behind, nullptr);
    runtime::interrupt_requested().store(false);
  }
  SigintWatch(const SigintWatch&) = delete;
  SigintWatch& operator=(const SigintWatch&) = delete;

 private:
  bool installed_ = false;
};

std::vector<ir::NodeRef> refs(const std::vector<PyNode>& v) {
  std::vector<ir::NodeRef> out;
  for (auto& n : v) out.push_back(n.ref);
  return out;
}

jit::OptimizerConfig optimizer_from_dict(const py::dict& d) {
  jit::OptimizerConfig c;
  std::string kind = d["kind"].cast<std::string>();
  using K = jit::OptimizerConfig::Kind;
  if (kind == "SGD")
    c.kind = K::SGD;
  else if (kind == "Adam")
    c.kind = K::Adam;
  else if (kind == "AdamW")
    c.kind = K::AdamW;
  else if (kind == "RMSProp")
    c.kind = K::RMSProp;
  else if (kind == "LAMB")
    c.kind = K::LAMB;
  else if (kind == "LARS")
    c.kind = K::LARS;
  else
    throw_user(ErrorKind::Value, "unknown optimizer '", kind, "'");
  auto f = [&](const char* k, double& dst) {
    if (d.contains(k)) dst = d[k].cast<double>();
  };
  f("momentum", c.momentum);
  f("beta1", c.beta1);
  f("beta2", c.beta2);
  f("epsilon", c.epsilon);
  f("weight_decay", c.weight_decay);
  f("decay_rate", c.decay_rate);
  f("lars_coefficient", c.lars_coefficient);
  f("clip_norm", c.clip_norm);
  f("loss_scale_factor", c.loss_scale_factor);
  if (d.contains("do_bias_correction")) c.do_bias_correction = d["do_bias_correction"].cast<bool>();
  if (d.contains("centered")) c.centered = d["centered"].cast<bool>();
  if (d.contains("weight_decay_includes"))
    c.weight_decay_includes = d["weight_decay_includes"].cast<std::vector<std::string>>();
  if (d.contains("weight_decay_excludes"))
    c.weight_decay_excludes = d["weight_decay_excludes"].cast<std::vector<std::string>>();
  // CombinedOptimizer / variables=: one rule per group, each with its rate.
  if (d.contains("variables")) c.variables = d["variables"].cast<std::vector<std::string>>();
  if (d.contains("weight_decay_variables")) {
    c.weight_decay_by_name = true;
    c.weight_decay_variables = d["weight_decay_variables"].cast<std::vector<std::string>>();
  }
  if (d.contains("sparse_variables"))
    c.sparse_variables = d["sparse_variables"].cast<std::vector<std::string>>();
  if (d.contains("lr") && !d["lr"].is_none()) c.lr = d["lr"].cast<PyNode>().ref;
  if (d.contains("groups"))
    for (py::handle g : d["groups"].cast<py::list>())
      c.groups.push_back(optimizer_from_dict(g.cast<py::dict>()));
  // optimizer.loss_scale.dynamic_loss_scale: the scale and counter variables.
  if (d.contains("loss_scale") && !d["loss_scale"].is_none()) {
    c.loss_scale = d["loss_scale"].cast<PyNode>().ref;
    c.good_steps = d["good_steps"].cast<PyNode>().ref;
    c.increment_period = d["increment_period"].cast<int64_t>();
    c.multiplier = d["multiplier"].cast<double>();
  }
  return c;
}

// Keeps Python objects alive on a worker thread and drops them only with the
// GIL held (on the callback thread).
// compile_job's request (flowjit._C.CompileRequest): the traced graph's
// parts, the training setup and the settings, by name.
struct CompileRequestPy {
  std::string name;
  bool train = false;
  bool run_once = false;  // the variables' initializer: compiled at O0
  std::vector<PyNode> params, outputs, effects, losses, trainable, watched_grads;
  py::object lr = py::none(), step = py::none();  // rank-0 nodes of a train job
  py::object optimizer = py::none();              // the optimizer's config dict
  std::string source, signature;
  py::dict settings;                     // keep_text, device, mixed_precision, ...
  py::object distribution = py::none();  // a job spread over devices: its plan dict
};

struct PyRefs {
  std::vector<py::object> objs;
  ~PyRefs() {
    if (objs.empty()) return;
    py::gil_scoped_acquire gil;
    objs.clear();
  }
};

class CompiledJobPy {
 public:
  // `device_state`: a GPU job's variable copies (RunDevice::state), kept alive with the job.
  // `generation`: the session generation the job was compiled in (read under
  // the run lock, so a clear that follows the compile is seen as one).
  // `gpus`: the GPUs of a job spread over several.
  CompiledJobPy(jit::CompiledJob job, uint64_t generation,
                std::shared_ptr<runtime::DeviceState> device_state = nullptr,
                std::shared_ptr<GpuGroup> gpus = nullptr)
      : job_(std::move(job)), device_state_(std::move(device_state)) {
    Session& s = Session::get();
    program_ = job_.program;
    if (job_.distributed && gpus) {
      std::lock_guard<std::mutex> lock(s.run_mutex());
      auto dist = jit::make_distributed(job_, s.store(), gpus->store_ptrs(), gpus->comm,
                                        gpus->first_rank, gpus->several_processes, gpus->copies);
      dist->keep_alive(gpus);
      program_ = std::move(dist);
    } else if (job_.distributed) {
      FJ_CHECK(s.communicator() != nullptr, "distributed job without configured devices");
      std::lock_guard<std::mutex> lock(s.run_mutex());
      program_ = jit::make_distributed(job_, s.store(), s.device_stores(), s.communicator(),
                                       s.first_rank(), s.several_processes());
    }
    if (job_.staged) {
      std::lock_guard<std::mutex> lock(s.run_mutex());
      program_ = jit::make_staged(job_, s.store(), s.device_stores());
      job_.program = program_;  // the summary plan: job name, slots, variables
    }
    one_cpu_executable_ = program_->runs_on_caller();
    for (const runtime::ProgramSlot& slot : program_->input_slots())
      for (int d = 0; d < slot.arrays; ++d) in_types_.push_back(slot.type);
    for (const runtime::ProgramSlot& slot : program_->output_slots()) {
      for (int d = 0; d < slot.arrays; ++d) out_types_.push_back(slot.type);
      out_groups_.push_back(slot.per_device ? slot.arrays : 0);
    }
    for (auto& t : in_types_) {
      in_dtypes_.push_back(to_numpy_dtype(t.dtype));
      in_nums_.push_back(in_dtypes_.back().num());
    }
    for (auto& t : out_types_) out_dtypes_.push_back(to_numpy_dtype(t.dtype));
    generation_ = generation;
  }

  // Per result: 0 for one array, n for a list of one array per device.
  const std::vector<int>& output_groups() const { return out_groups_; }
  bool distributed() const { return job_.distributed.has_value(); }
  // What FLOWJIT_PROFILE measured, per device (none for a GPU job: the
  // device times its launches, not the host).
  std::vector<const runtime::Executable*> profiled_devices() const {
    return program_->host_devices();
  }
  std::string device() const { return program_->device(); }
  // A job placed on several device sets: per segment, its placement, the
  // placement's device ids, its level and the variables it reads or writes.
  py::list segments() const {
    py::list out;
    if (!job_.staged) return out;
    for (const auto& seg : job_.staged->segments) {
      py::dict d;
      d["placement"] = seg.stage;
      d["devices"] = job_.staged->stages[seg.stage];
      d["level"] = seg.level;
      d["distributed"] = seg.job.distributed.has_value();
      py::list vars;
      for (auto& [name, type] : seg.job.plan().variables) vars.append(name);
      d["variables"] = vars;
      out.append(d);
    }
    return out;
  }
  std::string distribution() const {
    if (!job_.distributed) return "";
    std::string out;
    const auto& dg = *job_.distributed;
    for (size_t i = 0; i < dg.params.size(); ++i)
      out += "input " + std::to_string(i) + ": " + dg.params[i].str() + "\n";
    for (size_t i = 0; i < dg.outputs.size(); ++i)
      out += "output " + std::to_string(i) + ": " + dg.outputs[i].str() + "\n";
    for (auto& [name, sbp, type] : dg.variables)
      out += "variable " + name + ": " + sbp.str() + "\n";
    out += "boxing:\n" + dg.description;
    return out;
  }

  py::list group_results(const std::vector<py::array>& outs) const {
    py::list result;
    size_t i = 0;
    for (int g : out_groups_) {
      if (g == 0) {
        result.append(outs[i++]);
      } else {
        py::list per_device;
        for (int d = 0; d < g; ++d) per_device.append(outs[i++]);
        result.append(per_device);
      }
    }
    return result;
  }

  // Runs when `args` match the compiled signature exactly (arrays of the
  // planned dtype and shape); returns None otherwise, running nothing.
  py::object try_run(const py::tuple& args) {
    // After clear_default_session the job must be traced again: None sends
    // the caller down its slow path, which recompiles.
    if (generation_ != Session::get().generation()) return py::none();
    std::vector<const void*> ins;
    std::vector<py::object> keep;
    if (!convert_inputs(args, ins, keep)) return py::none();
    Session& s = Session::get();
    s.sync_before_call();  // sees every queued update, raises every earlier error
    std::vector<py::array> outs = allocate_outputs();
    std::vector<void*> out_ptrs;
    out_ptrs.reserve(outs.size());
    for (auto& o : outs) out_ptrs.push_back(o.mutable_data());
    bool cleared = false, interrupted = false;
    // [harden] Ctrl-C stops a long run of a one-device CPU job that Python's
    // main thread called at the next launch before it writes a variable (a
    // signal handler in front of Python's while it runs; not for runs under
    // 2 ms, which would only pay for the two sigaction calls).
    const bool watch = std::this_thread::get_id() == main_thread() && one_cpu_executable_ &&
                       last_run_seconds_ >= 0.002;
    {
      GilRelease release;
      std::lock_guard<std::mutex> lock(s.run_mutex());
      // clear_default_session() in another thread may have freed this job's
      // variables between the check above and the lock: never run then.
      cleared = generation_ != s.generation();
      if (!cleared) {
        SigintWatch sigint(watch);
        auto t0 = std::chrono::steady_clock::now();
        try {
          program_->run(ins.data(), out_ptrs.data());
        } catch (const Interrupted&) {
          interrupted = true;
        }
        last_run_seconds_ =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    }
    if (cleared) throw_cleared();
    if (interrupted) {
      // Python's handler ran behind ours: its KeyboardInterrupt (or what the
      // user's handler raises) is pending.
      if (PyErr_CheckSignals() == 0) PyErr_SetNone(PyExc_KeyboardInterrupt);
      throw py::error_already_set();
    }
    return group_results(outs);
  }

  // Queues a run; `deliver(list_of_outputs)` runs on the callback thread.
  // Inputs are copied now, so the caller may reuse its arrays at once.
  bool try_run_async(const py::tuple& args, py::object deliver) {
    std::vector<const void*> ins;
    std::vector<py::object> keep;
    if (!convert_inputs(args, ins, keep)) return false;
    check_generation();
    const auto& plan = job_.plan();
    auto copies = std::make_shared<std::vector<runtime::AlignedBuffer>>();
    auto in_ptrs = std::make_shared<std::vector<const void*>>();
    for (size_t i = 0; i < ins.size(); ++i) {
      size_t bytes = static_cast<size_t>(in_types_[i].bytes());
      copies->push_back(runtime::allocate_aligned(bytes));
      std::memcpy(copies->back().get(), ins[i], bytes);
      in_ptrs->push_back(copies->back().get());
    }
    auto refs = std::make_shared<PyRefs>();
    std::vector<py::array> outs = allocate_outputs();
    auto out_ptrs = std::make_shared<std::vector<void*>>();
    for (auto& o : outs) {
      out_ptrs->push_back(o.mutable_data());
      refs->objs.push_back(o);
    }
    refs->objs.push_back(deliver);
    auto program = program_;
    std::string name = plan.job_name;
    std::vector<int> groups = out_groups_;
    Session& s = Session::get();
    uint64_t generation = generation_;
    s.submit([program, copies, in_ptrs, out_ptrs, refs, name, groups, generation]() mutable {
      Session& ss = Session::get();
      std::exception_ptr err;
      std::shared_ptr<runtime::PendingRun> pending;
      try {
        std::lock_guard<std::mutex> lock(ss.run_mutex());
        if (generation != ss.generation())  // cleared after the submit: the variables are gone
          throw_user(ErrorKind::Runtime, "job '", name,
                     "': flow.clear_default_session() ran before this queued call could run; "
                     "nothing ran (call the job again to recompile it)");
        // A GPU run is only enqueued here: the worker goes on with the next
        // job while the GPU computes.
        pending = program->start(in_ptrs->data(), *out_ptrs);
      } catch (...) {
        err = std::current_exception();
      }
      copies.reset();
      ss.deliver([program, pending, refs, err, name, groups]() mutable {
        // The callback thread waits for a GPU run's event (without the
        // GIL), so its results arrive in call order with everything else.
        if (!err && pending) {
          try {
            pending->complete();
          } catch (...) {
            err = std::current_exception();
          }
        }
        deliver_results(*refs, err, name, groups);
      });
    });
    return true;
  }

  const jit::CompiledJob& job() const { return job_; }
  // Compiled before the session's last clear (its variables are gone).
  bool stale() const { return generation_ != Session::get().generation(); }

 private:
  // On the callback thread: the outputs (refs.objs, then the deliver
  // function last) to the callback, or the run's error for the next sync.
  static void deliver_results(PyRefs& refs, std::exception_ptr err, const std::string& name,
                              const std::vector<int>& groups) {
    py::gil_scoped_acquire gil;
    try {
      if (err) rethrow_as_python(err);
      py::list outs;
      size_t i = 0;
      for (int g : groups) {
        if (g == 0) {
          outs.append(refs.objs[i++]);
        } else {
          py::list per_device;
          for (int d = 0; d < g; ++d) per_device.append(refs.objs[i++]);
          outs.append(per_device);
        }
      }
      refs.objs.back()(outs);
    } catch (py::error_already_set& e) {
      record_async_error(e, name);
    } catch (...) {
      record_async_error(std::current_exception(), name);
    }
    refs.objs.clear();
  }

  [[noreturn]] void throw_cleared() const {
    throw_user(ErrorKind::Runtime, "job '", job_.plan().job_name,
               "': flow.clear_default_session() ran (in another thread) before this call could "
               "run; nothing ran (call the job again to recompile it)");
  }

  void check_generation() {
    if (generation_ != Session::get().generation())
      throw_user(ErrorKind::Runtime, "job '", job_.plan().job_name,
                 "' was compiled before flow.clear_default_session(); call the job function again "
                 "to recompile it");
  }

  bool convert_inputs(const py::tuple& args, std::vector<const void*>& ins,
                      std::vector<py::object>& keep) {
    size_t n = in_types_.size();
    if (args.size() != n) return false;
    ins.resize(n);
    for (size_t i = 0; i < n; ++i) {
      py::handle h = args[i];
      if (!py::isinstance<py::array>(h)) return false;
      auto a = py::reinterpret_borrow<py::array>(h);
      if (a.dtype().num() != in_nums_[i] || !numpy_dtype_matches(a.dtype(), in_types_[i].dtype))
        return false;
      const ir::Shape& want = in_types_[i].shape;
      if (a.ndim() != static_cast<py::ssize_t>(want.size())) return false;
      for (size_t d = 0; d < want.size(); ++d)
        if (a.shape(d) != want[d]) return false;
      bool aligned =
          (reinterpret_cast<uintptr_t>(a.data()) % ir::dtype_bytes(in_types_[i].dtype)) == 0;
      if (!(a.flags() & py::array::c_style) || !aligned) {
        // Other layouts are copied into a C-contiguous array first.
        py::array c = py::array::ensure(a, py::array::c_style);
        if (!c) throw py::error_already_set();
        keep.push_back(c);
        a = c;
      }
      ins[i] = a.data();
    }
    return true;
  }

  // Result arrays. Large ones (runtime::BufferPool::kMinBytes and up) live
  // in a pooled buffer that goes back to the pool when numpy frees the
  // array: a job called in a loop then writes into warm pages instead of
  // faulting in a fresh result every call. Small ones are numpy's own.
  std::vector<py::array> allocate_outputs() {
    std::vector<py::array> outs;
    for (size_t i = 0; i < out_types_.size(); ++i) {
      const ir::Shape& s = out_types_[i].shape;
      std::vector<py::ssize_t> shape(s.begin(), s.end());
      size_t bytes = static_cast<size_t>(out_types_[i].bytes());
      if (bytes < runtime::BufferPool::kMinBytes) {
        outs.emplace_back(out_dtypes_[i], shape);
        continue;
      }
      auto* block = new PooledBlock{runtime::BufferPool::instance().acquire(bytes), bytes};
      py::capsule owner(block, [](void* b) {
        auto* pb = static_cast<PooledBlock*>(b);
        runtime::BufferPool::instance().release(pb->p, pb->bytes);
        delete pb;
      });
      outs.emplace_back(out_dtypes_[i], shape, block->p, owner);
    }
    return outs;
  }
  struct PooledBlock {
    void* p;
    size_t bytes;
  };

  jit::CompiledJob job_;
  double last_run_seconds_ = 1.0;    // of the last synchronous run (none yet: watch it)
  bool one_cpu_executable_ = false;  // program_ is one CPU executable (Ctrl-C may stop it)
  std::shared_ptr<runtime::DeviceState> device_state_;
  // The job's program: job_.program, or the devices of a distributed job.
  std::shared_ptr<runtime::Program> program_;
  std::vector<ir::TensorType> in_types_, out_types_;  // one per array passed or returned
  std::vector<int> out_groups_;
  std::vector<py::dtype> in_dtypes_, out_dtypes_;
  std::vector<int> in_nums_;
  uint64_t generation_;
};

// flowjit._C.CacheWarning (a RuntimeWarning): the disk cache degraded.
PyObject* cache_warning() {
  static PyObject* cls = PyErr_NewExceptionWithDoc(
      "flowjit.CacheWarning",
      "The disk kernel cache could not be used as asked (a damaged entry was dropped, or the "
      "directory cannot be written); flowjit recompiled or kept the code in memory.",
      PyExc_RuntimeWarning, nullptr);
  return cls;
}

// What flowjit.export writes into a shared library: the kernels' ELF
// objects, the launch records with each kernel's code symbol, the buffers'
// types and the run's checks.
py::dict export_parts(const runtime::Plan& plan, const std::vector<char>& object) {
  codegen::cpu::CodeParts parts = codegen::cpu::unpack_code(object);
  std::map<std::string, std::string> aliases(parts.aliases.begin(), parts.aliases.end());
  py::dict d;
  py::list objects;
  for (const std::vector<char>& o : parts.objects) objects.append(py::bytes(o.data(), o.size()));
  d["objects"] = objects;
  auto types = [](const std::vector<ir::TensorType>& ts) {
    py::list out;
    for (const ir::TensorType& t : ts) out.append(py::make_tuple(ir::dtype_name(t.dtype), t.shape));
    return out;
  };
  d["inputs"] = types(plan.inputs);
  d["outputs"] = types(plan.outputs);
  py::list vars;
  for (auto& [name, t] : plan.variables)
    vars.append(py::make_tuple(name, ir::dtype_name(t.dtype), t.shape));
  d["variables"] = vars;
  py::list launches;
  for (const runtime::Launch& l : plan.launches) {
    py::dict r;
    auto alias = aliases.find(l.symbol);
    r["symbol"] = alias == aliases.end() ? l.symbol : alias->second;
    r["collective"] = l.collective.has_value();
    py::list args;
    for (const runtime::BufferRef& b : l.args)
      args.append(py::make_tuple(static_cast<int>(b.kind), b.index, b.offset_bytes));
    r["args"] = args;
    const runtime::CpuRange* g = l.cpu();
    FJ_USER_CHECK(g != nullptr || l.collective, ErrorKind::Value, "job '", plan.job_name,
                  "': launch ", l.symbol,
                  " is not a CPU launch (a GPU plan cannot be exported as CPU code)");
    r["range"] = g ? g->range : 0;
    r["grain"] = g ? g->grain : 1;
    r["scratch_bytes"] = g ? g->scratch_bytes : 0;
    r["summary"] = l.summary;
    launches.append(r);
  }
  d["launches"] = launches;
  d["arena_bytes"] = plan.arena_bytes;
  d["status_offset"] = plan.status_offset;
  py::list checks;
  for (const runtime::RunCheck& c : plan.checks) {
    py::dict r;
    r["job"] = c.job.empty() ? plan.job_name : c.job;
    r["what"] = c.what;
    r["where"] = c.where;
    r["limit"] = c.limit;
    r["limits"] = c.limits;
    r["shape"] = c.shape;
    r["numerics"] = c.numerics;
    checks.append(r);
  }
  d["checks"] = checks;
  d["job"] = plan.job_name;
  return d;
}

}  // namespace

void register_jobs(py::module_& m) {
  main_thread();  // the importing thread
  m.attr("CacheWarning") = py::handle(cache_warning());
  py::class_<CompiledJobPy, std::shared_ptr<CompiledJobPy>>(m, "CompiledJob")
      .def("try_run", &CompiledJobPy::try_run)
      .def_property_readonly("stale", &CompiledJobPy::stale)
      .def("try_run_async", &CompiledJobPy::try_run_async)
      .def_property_readonly("ir_traced", [](const CompiledJobPy& j) { return j.job().ir_traced; })
      .def_property_readonly("ir_optimized",
                             [](const CompiledJobPy& j) { return j.job().ir_optimized; })
      .def_property_readonly("fusion_plan",
                             [](const CompiledJobPy& j) { return j.job().fusion_plan; })
      .def_property_readonly("kernels", [](const CompiledJobPy& j) { return j.job().kernels; })
      .def_property_readonly("kernel_costs",
                             [](const CompiledJobPy& j) {
                               std::vector<std::tuple<std::string, int64_t, int64_t>> out;
                               for (const auto& c : j.job().kernel_costs)
                                 out.emplace_back(c.symbol, c.flops, c.bytes);
                               return out;
                             })
      .def_property_readonly("llvm_ir", [](const CompiledJobPy& j) { return j.job().llvm_ir; })
      .def_property_readonly("assembly", [](const CompiledJobPy& j) { return j.job().assembly; })
      .def_property_readonly("plan",
                             [](const CompiledJobPy& j) { return j.job().plan().describe(); })
      .def("profile",
           [](const CompiledJobPy& j) {
             // Device 0's, for a distributed job.
             std::vector<std::tuple<std::string, int64_t, double>> out;
             auto devices = j.profiled_devices();
             if (!devices.empty())
               for (auto& p : devices[0]->profile()) out.emplace_back(p.symbol, p.calls, p.seconds);
             return out;
           })
      .def("trace_events",
           [](const CompiledJobPy& j) {
             // (device, kernel symbol, start ns on CLOCK_MONOTONIC, duration ns, OS thread id)
             std::vector<std::tuple<int, std::string, int64_t, int64_t, int64_t>> out;
             auto devices = j.profiled_devices();
             for (size_t d = 0; d < devices.size(); ++d) {
               const auto& launches = devices[d]->plan().launches;
               for (auto& e : devices[d]->events())
                 out.emplace_back(static_cast<int>(d), launches[e.launch].symbol, e.start_ns,
                                  e.dur_ns, e.thread);
             }
             return out;
           })
      .def_property_readonly("arena_bytes",
                             [](const CompiledJobPy& j) { return j.job().plan().arena_bytes; })
      .def_property_readonly("num_kernels",
                             [](const CompiledJobPy& j) { return j.job().plan().launches.size(); })
      .def_property_readonly("device", &CompiledJobPy::device)
      .def_property_readonly("gpu_loaded_from",
                             [](const CompiledJobPy& j) { return j.job().gpu_loaded_from; })
      .def_property_readonly("distributed", &CompiledJobPy::distributed)
      .def_property_readonly("distribution", &CompiledJobPy::distribution)
      .def_property_readonly("segments", &CompiledJobPy::segments)
      .def_property_readonly("output_groups", &CompiledJobPy::output_groups)
      .def_property_readonly("from_disk_cache",
                             [](const CompiledJobPy& j) { return j.job().from_disk_cache; })
      .def_property_readonly("cache_key", [](const CompiledJobPy& j) { return j.job().cache_key; })
      .def_property_readonly("warnings",
                             [](const CompiledJobPy& j) {
                               std::vector<std::string> out;
                               for (auto& w : j.job().warnings)
                                 out.push_back(jit::printable_text(w));
                               return out;
                             })
      .def_property_readonly("seconds_total",
                             [](const CompiledJobPy& j) { return j.job().seconds_total; })
      .def_property_readonly("seconds_codegen",
                             [](const CompiledJobPy& j) { return j.job().seconds_codegen; })
      .def_property_readonly("seconds_passes",
                             [](const CompiledJobPy& j) { return j.job().seconds_passes; })
      // What flowjit.export writes into a shared library: the kernels' ELF
      // objects, the launch records with each kernel's code symbol, the
      // buffers and the run's checks (CompileSettings::keep_object jobs).
      // What flowjit.export writes into a shared library (a CPU job compiled
      // with keep_object): see export_parts.
      .def("export_parts",
           [](const CompiledJobPy& j) {
             const jit::CompiledJob& cj = j.job();
             FJ_USER_CHECK(!cj.code_object.empty() && cj.program && cj.program->device() == "cpu",
                           ErrorKind::Value, "job '", cj.program ? cj.plan().job_name : "?",
                           "' was not compiled for export (a CPU job compiled with keep_object)");
             py::dict d = export_parts(cj.plan(), cj.code_object);
             d["writes_variables"] = cj.writes_variables;
             return d;
           })
      .def_property_readonly("new_variables", [](const CompiledJobPy& j) {
        std::vector<std::string> out;
        for (auto& [n, t] : j.job().new_variables) out.push_back(n);
        return out;
      });

  // A cached CPU entry's plan text and code object as flowjit.export's parts
  // (flowjit-cache export). ValueError for a damaged plan or container.
  m.def("plan_export_parts", [](const std::string& plan_text, const py::bytes& object) {
    std::string bytes = object;
    runtime::Plan plan = runtime::Plan::deserialize(plan_text);
    return export_parts(plan, std::vector<char>(bytes.begin(), bytes.end()));
  });

  // The cache tool reads entries through these (python/flowjit/cache):
  // jit::inspect_cache_entry as a dict {meta (meta.json as a dict, or
  // None), meta_bytes, error, authenticated, problems}, and one listed file
  // as bytes (ValueError when it fails its check, FileNotFoundError when
  // it is missing).
  m.def("cache_inspect", [](const std::string& dir, const std::string& key) {
    jit::EntryReport r;
    {
      py::gil_scoped_release release;
      r = jit::inspect_cache_entry(dir, key);
    }
    py::dict d;
    d["meta"] = r.meta.empty() ? py::none() : json_to_python(r.meta);
    d["meta_bytes"] = r.meta_bytes;
    d["error"] = jit::printable_text(r.error);
    d["authenticated"] = r.authenticated;
    py::list problems;
    for (const std::string& p : r.problems) problems.append(jit::printable_text(p));
    d["problems"] = problems;
    return d;
  });
  m.def("cache_read",
        [](const std::string& dir, const std::string& key, const std::string& name, bool verify) {
          std::string out, why;
          bool ok;
          {
            py::gil_scoped_release release;
            ok = jit::DiskCache(dir, 0).read_listed(key, name, verify, out, why);
          }
          if (!ok) {
            why = jit::printable_text(why);
            if (why == jit::printable_text(name) + " is missing") {
              PyErr_SetString(PyExc_FileNotFoundError, why.c_str());
              throw py::error_already_set();
            }
            throw py::value_error(why);
          }
          return py::bytes(out);
        });
  // A CPU object container's ELF objects and {kernel symbol: unit symbol}
  // (codegen/cpu/kernel_units.h); ValueError when it is damaged.
  m.def("unpack_objects", [](const py::bytes& blob) {
    std::string bytes = blob;
    codegen::cpu::UnpackedObjects u;
    try {
      u = codegen::cpu::unpack_objects(std::vector<char>(bytes.begin(), bytes.end()));
    } catch (const UserError& e) {
      throw py::value_error(e.what());
    }
    py::list objects;
    for (const auto& [p, n] : u.objects) objects.append(py::bytes(p, n));
    return py::make_tuple(objects, u.aliases);
  });

  // Whether autodiff passes a gradient from op into an operand of dtype
  // (the Python walk that finds the variables a loss reaches asks it).
  m.def("gradient_flows_into", &jit::gradient_flows_into);

  // What Python asks compile_job for, as one record with named fields.
  py::class_<CompileRequestPy>(m, "CompileRequest")
      .def(py::init<>())
      .def_readwrite("name", &CompileRequestPy::name)
      .def_readwrite("train", &CompileRequestPy::train)
      .def_readwrite("run_once", &CompileRequestPy::run_once)
      .def_readwrite("params", &CompileRequestPy::params)
      .def_readwrite("outputs", &CompileRequestPy::outputs)
      .def_readwrite("effects", &CompileRequestPy::effects)
      .def_readwrite("losses", &CompileRequestPy::losses)
      .def_readwrite("lr", &CompileRequestPy::lr)
      .def_readwrite("step", &CompileRequestPy::step)
      .def_readwrite("trainable", &CompileRequestPy::trainable)
      .def_readwrite("optimizer", &CompileRequestPy::optimizer)
      .def_readwrite("source", &CompileRequestPy::source)
      .def_readwrite("signature", &CompileRequestPy::signature)
      .def_readwrite("settings", &CompileRequestPy::settings)
      .def_readwrite("distribution", &CompileRequestPy::distribution)
      .def_readwrite("watched_grads", &CompileRequestPy::watched_grads);

  m.def(
      "compile_job",
      [](const CompileRequestPy& req) {
        const std::string& name = req.name;
        const bool train = req.train;
        const auto& params = req.params;
        const auto& outputs = req.outputs;
        const auto& effects = req.effects;
        const auto& losses = req.losses;
        const py::object& lr = req.lr;
        const py::object& step = req.step;
        const auto& trainable = req.trainable;
        const py::object& optimizer = req.optimizer;
        const std::string& source = req.source;
        const std::string& signature = req.signature;
        const py::dict& settings = req.settings;
        const py::object& distribution = req.distribution;
        const auto& watched_grads = req.watched_grads;
        jit::JobDescription job;
        job.run_once = req.run_once;
        job.name = name;
        job.train = train;
        job.graph.name = name;
        job.graph.params = refs(params);
        job.graph.outputs = refs(outputs);
        job.graph.effects = refs(effects);
        job.losses = refs(losses);
        if (!lr.is_none()) job.lr = lr.cast<PyNode>().ref;
        if (!step.is_none()) job.step = step.cast<PyNode>().ref;
        job.trainable = refs(trainable);
        job.watched_grads = refs(watched_grads);
        FJ_USER_CHECK(
            job.watched_grads.empty() || train, ErrorKind::Value, "job '", name,
            "': flow.watch_diff needs a train job (gradients exist only where minimize runs)");
        if (!optimizer.is_none()) job.optimizer = optimizer_from_dict(optimizer.cast<py::dict>());
        job.source = source;
        job.signature = signature;
        if (!distribution.is_none()) {
          py::dict d = distribution.cast<py::dict>();
          job.distribution.parts = d["parts"].cast<int>();
          job.distribution.mirrored = d["mirrored"].cast<bool>();
          job.distribution.split_vars = d["split_vars"].cast<std::map<std::string, int>>();
          job.distribution.whole_outputs = d["whole_outputs"].cast<bool>();
          if (d.contains("stages")) {
            job.distribution.stages = d["stages"].cast<std::vector<std::vector<int>>>();
            job.distribution.default_stage = d["default_stage"].cast<int>();
          }
          if (job.optimizer && job.distribution.mirrored)
            job.optimizer->mirrored_parts = job.distribution.parts;
        }
        if (settings.contains("mixed_precision")) {
          auto mp = settings["mixed_precision"].cast<std::string>();
          auto t = ir::dtype_from_name(mp);
          FJ_USER_CHECK(t && ir::is_half(*t), ErrorKind::Value, "job '", name,
                        "': mixed precision takes float16 or bfloat16, got \"", mp, "\"");
          job.mixed_precision = *t;
        }
        jit::CompileSettings s = jit::CompileSettings::from_environment();
        if (settings.contains("keep_text")) s.keep_text = settings["keep_text"].cast<bool>();
        if (settings.contains("check_numerics"))  // [harden]
          s.check_numerics = settings["check_numerics"].cast<bool>();
        // flowjit.export: keep the code object, for this x86-64 CPU ("": the host).
        if (settings.contains("keep_object")) s.keep_object = settings["keep_object"].cast<bool>();
        if (settings.contains("cpu")) s.target.cpu = settings["cpu"].cast<std::string>();
        // "device": "cpu" (the default) or "gpu" with "gpu": its ordinal.
        std::string device =
            settings.contains("device") ? settings["device"].cast<std::string>() : "cpu";
        FJ_USER_CHECK(device == "cpu" || device == "gpu", ErrorKind::Value, "job '", name,
                      "': device must be \"cpu\" or \"gpu\", got \"", device, "\"");
        int gpu_ordinal = settings.contains("gpu") ? settings["gpu"].cast<int>() : 0;
        // "gpus": every GPU of a job spread over several (its first is "gpu").
        std::vector<int> gpus;
        if (settings.contains("gpus")) gpus = settings["gpus"].cast<std::vector<int>>();
        // "gpu_processes": the processes whose GPUs the job joins (each passes its own).
        int gpu_processes =
            settings.contains("gpu_processes") ? settings["gpu_processes"].cast<int>() : 1;
        // Across processes: this process's first NCCL rank and the job's GPUs in all.
        int gpu_first_rank =
            settings.contains("gpu_first_rank") ? settings["gpu_first_rank"].cast<int>() : 0;
        int gpu_world = settings.contains("gpu_world") ? settings["gpu_world"].cast<int>() : 0;
        std::shared_ptr<GpuGroup> group;
        // [harden] Ctrl-C during a compile on the main thread: Python's
        // signal handlers are run (at most every 20 ms, taking the GIL) from
        // the compile's stage, kernel and LLVM pass boundaries; a
        // KeyboardInterrupt stops the compile and is raised here.
        bool interrupted = false;
        if (settings.contains("interruptible") && settings["interruptible"].cast<bool>()) {
          // Kernels compile on the pool: only the calling (main) thread runs
          // Python's signal handlers; the others see its verdict.
          struct Poll {
            std::mutex mu;
            std::chrono::steady_clock::time_point last;
            std::atomic<bool> hit{false};
            std::thread::id owner = std::this_thread::get_id();
          };
          auto poll = std::make_shared<Poll>();
          s.interrupted = [poll] {
            if (poll->hit.load()) return true;
            if (std::this_thread::get_id() != poll->owner) return false;
            {
              std::lock_guard<std::mutex> lock(poll->mu);
              auto now = std::chrono::steady_clock::now();
              if (now - poll->last < std::chrono::milliseconds(20)) return false;
              poll->last = now;
            }
            PyGILState_STATE st = PyGILState_Ensure();
            if (PyErr_CheckSignals() != 0) poll->hit = true;  // the exception stays set
            PyGILState_Release(st);
            return poll->hit.load();
          };
        }
        Session& sess = Session::get();
        sess.wait_jobs();
        jit::CompiledJob cj;
        uint64_t generation = 0;
        {
          GilRelease release;
          std::lock_guard<std::mutex> lock(sess.run_mutex());
          if (device == "gpu") set_gpu_target(s, gpu_ordinal);
          if (device == "gpu" && (gpus.size() > 1 || gpu_processes > 1))
            group = gpu_group(gpus.empty() ? std::vector<int>{gpu_ordinal} : gpus, gpu_processes,
                              gpu_first_rank, gpu_world);
          try {
            cj = jit::compile_job(job, s, sess.store());
          } catch (const Interrupted&) {
            interrupted = true;
          }
          generation = sess.generation();
        }
        if (interrupted) {
          if (!PyErr_Occurred()) PyErr_SetNone(PyExc_KeyboardInterrupt);
          throw py::error_already_set();
        }
        // Cache problems (damaged entry, unwritable directory) are warnings,
        // never errors; they stay readable on the result too.
        // (A cache path need not be UTF-8; the messages quoting it must be.)
        for (const std::string& w : cj.warnings)
          if (PyErr_WarnEx(cache_warning(), jit::printable_text(w).c_str(), 1) != 0)
            throw py::error_already_set();
        if (cj.distributed)
          for (const std::string& w : cj.distributed->warnings)
            if (PyErr_WarnEx(PyExc_UserWarning, jit::printable_text(w).c_str(), 1) != 0)
              throw py::error_already_set();
        if (cj.staged)
          for (const auto& seg : cj.staged->segments)
            if (seg.job.distributed)
              for (const std::string& w : seg.job.distributed->warnings)
                if (PyErr_WarnEx(PyExc_UserWarning, jit::printable_text(w).c_str(), 1) != 0)
                  throw py::error_already_set();
        if (group) FJ_CHECK(cj.distributed.has_value(), "a job on several GPUs compiled for one");
        return std::make_shared<CompiledJobPy>(std::move(cj), generation, s.device.state, group);
      },
      py::arg("request"));
}

}  // namespace flowjit::python
