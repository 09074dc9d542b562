// Running a job on several devices; keeping variables' device copies in step.
#include "runtime/distributed.h"

#include <tbb/task_arena.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>

#include "ir/error.h"

namespace flowjit::runtime {

// ---------------------------------------------------------------- workers

// Devices 1..n-1 of a job, each a thread that waits for the next run. Every
// device runs its kernels in its own TBB arena with an equal share of the
// threads, so that devices do not steal each other's kernel chunks (a device
// waiting in a collective would otherwise also wait for chunks it took).
class DeviceWorkers {
 public:
  explicit DeviceWorkers(int devices) : n_(devices), errors_(devices) {
    int share = std::max(1, num_threads() / n_);
    for (int d = 0; d < n_; ++d) arenas_.push_back(std::make_unique<tbb::task_arena>(share));
    for (int d = 1; d < n_; ++d) threads_.emplace_back([this, d] { loop(d); });
  }
  ~DeviceWorkers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // Runs fn(d) for every device, device 0 on this thread. Rethrows the
  // first device's error (by device order) after all have finished.
  template <class Fn>
  void run_all(Fn&& fn, Communicator& comm) {
    std::function<void(int)> task = [&](int d) {
      try {
        arenas_[d]->execute([&] { fn(d); });
      } catch (const FailedCheckOnEveryDevice&) {
        // Every device raises it at the same launch: none waits for this
        // one, and the communicator stays usable for the next run.
        errors_[d] = std::current_exception();
      } catch (...) {
        errors_[d] = std::current_exception();
        std::string why = "device " + std::to_string(d) + " failed";
        try {
          std::rethrow_exception(errors_[d]);
        } catch (const std::exception& e) {
          why += ": " + std::string(e.what());
        } catch (...) {
        }
        comm.abort(why);  // unblocks the devices waiting for this one
      }
    };
    for (auto& e : errors_) e = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = &task;
      pending_ = n_ - 1;
      ++round_;
    }
    cv_.notify_all();
    task(0);
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return pending_ == 0; });
      task_ = nullptr;
    }
    for (auto& e : errors_)
      if (e) std::rethrow_exception(e);
  }

 private:
  void loop(int d) {
    uint64_t seen = 0;
    while (true) {
      std::function<void(int)>* task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || round_ != seen; });
        if (stop_) return;
        seen = round_;
        task = task_;
      }
      (*task)(d);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--pending_ == 0) done_cv_.notify_all();
      }
    }
  }

  int n_;
  std::vector<std::unique_ptr<tbb::task_arena>> arenas_;
  std::vector<std::thread> threads_;
  std::vector<std::exception_ptr> errors_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::function<void(int)>* task_ = nullptr;
  int pending_ = 0;
  uint64_t round_ = 0;
  bool stop_ = false;
};

// ---------------------------------------------------------------- variables

namespace {

// [outer][parts][inner] bytes around the split axis of `t`.
void split_geometry(const ir::TensorType& t, int axis, int parts, int64_t& outer, int64_t& piece) {
  outer = 1;
  for (int d = 0; d < axis; ++d) outer *= t.shape[d];
  int64_t inner = 1;
  for (int d = axis; d < t.rank(); ++d) inner *= t.shape[d];
  piece = inner / parts * ir::dtype_bytes(t.dtype);
}

void copy_piece(const VariableStorage& host, const Replicas& r, int d, bool to_host) {
  VariableStorage& replica = *r.local[d];
  // A GPU device's replica: its GPU copy may be newer (gathering), or must
  // take the new value (scattering).
  struct Written {
    VariableStorage* v;
    ~Written() {
      if (v) mark_host_written(*v);
    }
  } written{!to_host && replica.device_copies ? &replica : nullptr};
  if (to_host) sync_host(replica);
  char* local = replica.ptr();
  if (r.split_axis < 0) {
    size_t bytes = static_cast<size_t>(host.type.bytes());
    if (to_host)
      std::memcpy(host.ptr(), local, bytes);
    else
      std::memcpy(local, host.ptr(), bytes);
    return;
  }
  int64_t outer, piece;
  split_geometry(host.type, r.split_axis, r.parts, outer, piece);
  int g = r.first_rank + d;
  for (int64_t o = 0; o < outer; ++o) {
    char* h = host.ptr() + (o * r.parts + g) * piece;
    char* l = local + o * piece;
    if (to_host)
      std::memcpy(h, l, static_cast<size_t>(piece));
    else
      std::memcpy(l, h, static_cast<size_t>(piece));
  }
}

void push_to_devices(VariableStorage& host) {
  Replicas& r = *host.replicas;
  if (!r.devices_stale) return;
  for (size_t d = 0; d < r.local.size(); ++d) copy_piece(host, r, static_cast<int>(d), false);
  r.devices_stale = false;
}

}  // namespace

void attach_replicas(VariableStorage& host, int split_axis, int parts, int first_rank,
                     std::vector<VariableStorage*> local) {
  if (host.replicas) {
    Replicas& r = *host.replicas;
    auto layout = [](int axis, int n) {
      return (axis < 0 ? std::string("broadcast") : "split(" + std::to_string(axis) + ")") +
             " over " + std::to_string(n) + " device(s)";
    };
    FJ_USER_CHECK(r.split_axis == split_axis && r.parts == parts, ErrorKind::Value, "variable '",
                  host.name, "' is used by jobs that lay it out differently over the devices (",
                  layout(r.split_axis, r.parts), " before, ", layout(split_axis, parts),
                  " now); declare the same distribute= and placement wherever it is used");
    // A job placed on a subset of the devices (flow.scope.placement in a job
    // body, jit/stages.h) keeps its copies in that subset's stores.
    FJ_USER_CHECK(r.local == local, ErrorKind::NotImplemented, "variable '", host.name,
                  "' is used by jobs spread over different devices (say the CPU devices and "
                  "several GPUs, or stages placed on other devices); a variable is distributed "
                  "over one set of devices per session");
    return;
  }
  auto r = std::make_unique<Replicas>();
  r->split_axis = split_axis;
  r->parts = parts;
  r->first_rank = first_rank;
  r->local = std::move(local);
  r->devices_stale = true;
  host.replicas = std::move(r);
}

void sync_host(VariableStorage& host) {
  // A GPU copy and the CPU devices' replicas are never both newer than the
  // host: every run first brings the host up to date (runtime/cuda).
  if (host.device_copies) host.device_copies->sync_host(host);
  if (!host.replicas || !host.replicas->host_stale) return;
  Replicas& r = *host.replicas;
  if (r.split_axis < 0) {
    copy_piece(host, r, 0, true);
  } else {
    FJ_CHECK(static_cast<int>(r.local.size()) == r.parts,
             "split variable pieces of other processes are gathered after each run");
    for (size_t d = 0; d < r.local.size(); ++d) copy_piece(host, r, static_cast<int>(d), true);
  }
  r.host_stale = false;
}

void mark_host_written(VariableStorage& host) {
  if (host.device_copies) host.device_copies->host_written();
  if (!host.replicas) return;
  host.replicas->devices_stale = true;
  host.replicas->host_stale = false;
}

// ---------------------------------------------------------------- runs

DistributedExecutable::DistributedExecutable(std::vector<std::shared_ptr<Program>> devices,
                                             std::shared_ptr<Communicator> comm, int first_rank,
                                             std::vector<DeviceSlot> inputs,
                                             std::vector<DeviceSlot> outputs,
                                             std::vector<VariableStorage*> host_vars,
                                             bool several_processes)
    : devices_(std::move(devices)),
      comm_(std::move(comm)),
      first_rank_(first_rank),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)),
      host_vars_(std::move(host_vars)),
      several_processes_(several_processes) {
  FJ_CHECK(!devices_.empty(), "a distributed job needs devices");
  for (size_t d = 0; d < devices_.size(); ++d) {
    devices_[d]->set_device(comm_, first_rank_ + static_cast<int>(d));
    std::vector<AlignedBuffer> discard;
    for (size_t o = 0; o < outputs_.size(); ++o) {
      bool needed = d > 0 && outputs_[o].kind == DeviceSlot::Whole;
      discard.push_back(needed ? allocate_aligned(static_cast<size_t>(outputs_[o].type.bytes()))
                               : AlignedBuffer());
    }
    discard_.push_back(std::move(discard));
  }
  workers_ = std::make_unique<DeviceWorkers>(num_devices());
}

std::vector<ProgramSlot> DistributedExecutable::slots(const std::vector<DeviceSlot>& s) const {
  std::vector<ProgramSlot> out;
  for (const DeviceSlot& d : s) {
    bool per_device = d.kind == DeviceSlot::PerDevice;
    out.push_back({d.type, per_device ? num_devices() : 1, per_device});
  }
  return out;
}

std::vector<const Executable*> DistributedExecutable::host_devices() const {
  std::vector<const Executable*> out;
  for (auto& d : devices_)
    for (const Executable* e : d->host_devices()) out.push_back(e);
  return out;
}

std::string DistributedExecutable::device() const {
  std::string first = devices_[0]->device();
  if (first.rfind("gpu:", 0) != 0) return first;
  std::string out = first;
  for (size_t d = 1; d < devices_.size(); ++d) out += "," + devices_[d]->device().substr(4);
  return out;
}

DistributedExecutable::~DistributedExecutable() = default;

size_t DistributedExecutable::num_input_pointers() const {
  size_t n = 0;
  for (auto& s : inputs_) n += s.kind == DeviceSlot::PerDevice ? devices_.size() : 1;
  return n;
}

size_t DistributedExecutable::num_output_pointers() const {
  size_t n = 0;
  for (auto& s : outputs_) n += s.kind == DeviceSlot::PerDevice ? devices_.size() : 1;
  return n;
}

void DistributedExecutable::run(const void* const* inputs, void* const* outputs) {
  for (VariableStorage* v : host_vars_) {
    // A GPU job wrote it last: its value goes through the host to the devices.
    if (v->device_copies && v->device_copies->sync_host(*v)) v->replicas->devices_stale = true;
    push_to_devices(*v);
  }
  const int n = num_devices();
  const int parts = comm_->size();
  // Per device pointer tables.
  std::vector<std::vector<const void*>> ins(n);
  std::vector<std::vector<void*>> outs(n);
  auto rows_offset = [&](const ir::TensorType& t, int rank) { return t.bytes() / parts * rank; };
  size_t p = 0;
  for (auto& s : inputs_) {
    for (int d = 0; d < n; ++d) {
      const char* base =
          static_cast<const char*>(inputs[p + (s.kind == DeviceSlot::PerDevice ? d : 0)]);
      if (s.kind == DeviceSlot::Rows) base += rows_offset(s.type, first_rank_ + d);
      ins[d].push_back(base);
    }
    p += s.kind == DeviceSlot::PerDevice ? n : 1;
  }
  p = 0;
  for (size_t o = 0; o < outputs_.size(); ++o) {
    const DeviceSlot& s = outputs_[o];
    for (int d = 0; d < n; ++d) {
      char* base = static_cast<char*>(outputs[p + (s.kind == DeviceSlot::PerDevice ? d : 0)]);
      if (s.kind == DeviceSlot::Rows) base += rows_offset(s.type, first_rank_ + d);
      if (s.kind == DeviceSlot::Whole && d > 0) base = discard_[d][o].get();
      outs[d].push_back(base);
    }
    p += s.kind == DeviceSlot::PerDevice ? n : 1;
  }
  // After the run, also a failed one: what the host reads next comes from
  // the devices (a failed check leaves them as they were, runtime/
  // executable.h; any other failure may have changed them).
  std::function<void()> devices_written = [&] {
    for (VariableStorage* v : host_vars_) {
      Replicas& r = *v->replicas;
      r.devices_stale = false;
      r.host_stale = !(several_processes_ && r.split_axis >= 0);
      if (writes_variables_ && v->device_copies) v->device_copies->host_written();
    }
  };
  struct Written {
    std::function<void()>* f;
    ~Written() { (*f)(); }
  } written{&devices_written};
  const bool check_first = several_processes_ && !fingerprint_checked_ &&
                           host_devices().size() == devices_.size();  // Gloo: host memory
  workers_->run_all(
      [&](int d) {
        if (check_first) check_same_program(d);
        devices_[d]->run(ins[d].data(), outs[d].data());
        if (!several_processes_) return;
        // Split variables: every process needs every piece on the host.
        for (size_t i = 0; i < host_vars_.size(); ++i) {
          VariableStorage* h = host_vars_[i];
          const Replicas& r = *h->replicas;
          if (r.split_axis < 0) continue;
          int64_t outer, piece;
          split_geometry(h->type, r.split_axis, r.parts, outer, piece);
          std::vector<char> scratch;
          char* dst = h->ptr();
          if (d > 0) {
            scratch.resize(static_cast<size_t>(h->type.bytes()));
            dst = scratch.data();
          }
          devices_[d]->gather_variable_pieces(i, dst, outer, piece);
        }
      },
      *comm_);
  if (check_first) fingerprint_checked_ = true;
}

namespace {
uint64_t fnv1a(uint64_t h, int64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= static_cast<uint64_t>(v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
  return h;
}
}  // namespace

void DistributedExecutable::check_same_program(int device) {
  const Plan& plan = devices_[0]->plan();
  int64_t collectives = 0;
  uint64_t h = 14695981039346656037ull;
  for (const Launch& l : plan.launches) {
    if (!l.collective) continue;
    const CollectiveStep& c = *l.collective;
    ++collectives;
    for (int64_t v :
         {static_cast<int64_t>(c.op), static_cast<int64_t>(c.dtype), c.parts, c.outer, c.inner})
      h = fnv1a(h, v);
  }
  for (VariableStorage* v : host_vars_) {
    h = fnv1a(h, v->type.bytes());
    h = fnv1a(h, v->replicas ? v->replicas->split_axis : -1);
  }
  const int64_t mine[2] = {collectives, static_cast<int64_t>(h)};
  const int ranks = comm_->size();
  std::vector<int64_t> all(2 * static_cast<size_t>(ranks));
  comm_->all_gather(first_rank_ + device, mine, all.data(), 1, sizeof(mine));
  for (int r = 0; r < ranks; ++r) {
    if (all[2 * r] == all[0] && all[2 * r + 1] == all[1]) continue;
    throw FailedCheckOnEveryDevice(
        ErrorKind::Runtime,
        "job '" + plan.job_name + "': the processes compiled different programs: rank 0's " +
            std::to_string(all[0]) + " collective(s) and variables differ from rank " +
            std::to_string(r) + "'s " + std::to_string(all[2 * r]) + " (fingerprints " +
            std::to_string(static_cast<uint64_t>(all[1])) + " and " +
            std::to_string(static_cast<uint64_t>(all[2 * r + 1])) +
            "). Every process must trace the same job with the same placeholder shapes, "
            "variable shapes and devices; nothing ran.");
  }
}

}  // namespace flowjit::runtime
