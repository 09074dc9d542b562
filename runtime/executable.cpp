// Executable: resolving buffers and running launches on the thread pool.
#include "runtime/executable.h"

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include <sys/syscall.h>
#include <unistd.h>

#include "ir/error.h"
#include "runtime/distributed.h"

namespace flowjit::runtime {

namespace {
// A job's buffer, or a MemoryError that names the job, the buffer and its
// size (std::bad_alloc reached Python as "MemoryError: std::bad_alloc").
AlignedBuffer allocate_or_explain(const std::string& job, const char* what, int64_t bytes) {
  try {
    return allocate_aligned(static_cast<size_t>(bytes));
  } catch (const std::bad_alloc&) {
    char size[64];
    std::snprintf(size, sizeof size, "%.3g GiB", static_cast<double>(bytes) / (1 << 30));
    throw_user(ErrorKind::Memory, "job '", job, "': cannot allocate ", what, " of ", bytes,
               " bytes (", size, ")");
  }
}
}  // namespace

// ---------------------------------------------------------------- threads

namespace {
std::mutex g_threads_mu;
std::unique_ptr<tbb::global_control> g_threads_control;
int g_threads = 0;
}  // namespace

int num_threads() {
  std::lock_guard<std::mutex> lock(g_threads_mu);
  return g_threads > 0 ? g_threads : tbb::info::default_concurrency();
}

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lock(g_threads_mu);
  g_threads_control.reset();
  g_threads = n;
  if (n > 0)
    g_threads_control = std::make_unique<tbb::global_control>(
        tbb::global_control::max_allowed_parallelism, static_cast<size_t>(n));
}

// ---------------------------------------------------------------- plan text

namespace {

const char* kind_tag(BufferKind k) {
  switch (k) {
    case BufferKind::Input:
      return "I";
    case BufferKind::Output:
      return "O";
    case BufferKind::Variable:
      return "V";
    case BufferKind::Arena:
      return "A";
  }
  return "?";
}

std::string type_text(const ir::TensorType& t) { return t.str(); }

[[noreturn]] void bad_plan(const std::string& why) {
  throw_user(ErrorKind::Value, "corrupt compiled plan: ", why);
}

ir::TensorType parse_type(const std::string& s) {
  auto lb = s.find('[');
  if (lb == std::string::npos || s.back() != ']') bad_plan("bad type '" + s + "'");
  auto dt = ir::dtype_from_short_name(s.substr(0, lb));
  if (!dt) bad_plan("bad dtype in '" + s + "'");
  ir::Shape shape;
  std::string body = s.substr(lb + 1, s.size() - lb - 2);
  std::stringstream ss(body);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) shape.push_back(std::stoll(item));
  return {*dt, shape};
}

// A launch's geometry in plan text, three words after the symbol: a CPU
// range "range grain scratch_bytes", or a GPU grid
// "grid=x,y,z block=x,y,z shared=bytes".
void write_geometry(std::ostream& os, const Geometry& geometry) {
  if (const auto* c = std::get_if<CpuRange>(&geometry)) {
    os << c->range << " " << c->grain << " " << c->scratch_bytes;
  } else {
    const GpuGrid& g = std::get<GpuGrid>(geometry);
    os << "grid=" << g.grid[0] << "," << g.grid[1] << "," << g.grid[2] << " block=" << g.block[0]
       << "," << g.block[1] << "," << g.block[2] << " shared=" << g.shared_bytes;
  }
}

// "name=a,b,c" (n numbers) into out; false when the word is not that.
bool read_dims(const std::string& word, const char* name, uint32_t* out, int n) {
  std::string prefix = std::string(name) + "=";
  if (word.compare(0, prefix.size(), prefix) != 0) return false;
  std::stringstream ss(word.substr(prefix.size()));
  for (int i = 0; i < n; ++i) {
    int64_t v = -1;
    if (!(ss >> v) || v < 0 || v > std::numeric_limits<uint32_t>::max()) return false;
    out[i] = static_cast<uint32_t>(v);
    if (i + 1 < n && ss.get() != ',') return false;
  }
  return ss.peek() == std::char_traits<char>::eof();
}

Geometry read_geometry(std::istream& ls) {
  std::string a, b, c;
  if (!(ls >> a >> b >> c)) bad_plan("bad launch line");
  if (a.rfind("grid=", 0) == 0) {
    GpuGrid g;
    if (!read_dims(a, "grid", g.grid, 3) || !read_dims(b, "block", g.block, 3) ||
        !read_dims(c, "shared", &g.shared_bytes, 1))
      bad_plan("bad GPU grid '" + a + " " + b + " " + c + "'");
    for (int i = 0; i < 3; ++i)
      if (g.grid[i] == 0 || g.block[i] == 0) bad_plan("zero extent in '" + a + " " + b + "'");
    return g;
  }
  auto number = [&](const std::string& w) {
    size_t end = 0;
    int64_t v = std::stoll(w, &end);
    if (end != w.size()) bad_plan("bad CPU range '" + a + " " + b + " " + c + "'");
    return v;
  };
  CpuRange r;
  r.range = number(a);
  r.grain = number(b);
  r.scratch_bytes = number(c);
  return r;
}

// A check's text fields as one token: '%', whitespace and control
// characters as %XX; "-" for an empty text.
std::string token_text(const std::string& s) {
  if (s.empty()) return "-";
  std::string out;
  for (unsigned char c : s) {
    if (c == '%' || c <= ' ' || c == 0x7f) {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string untoken_text(const std::string& t) {
  if (t == "-") return "";
  std::string out;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] != '%') {
      out += t[i];
      continue;
    }
    if (i + 2 >= t.size() || !std::isxdigit(static_cast<unsigned char>(t[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(t[i + 2])))
      bad_plan("bad escape in '" + t + "'");
    out += static_cast<char>(std::stoi(t.substr(i + 1, 2), nullptr, 16));
    i += 2;
  }
  return out;
}

std::string int_list(const std::vector<int64_t>& v) {
  if (v.empty()) return "-";
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::vector<int64_t> parse_int_list(const std::string& t) {
  std::vector<int64_t> out;
  if (t == "-") return out;
  std::istringstream is(t);
  std::string item;
  while (std::getline(is, item, ',')) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

bool Plan::same_program(const Plan& o) const {
  if (job_name != o.job_name || inputs != o.inputs || outputs != o.outputs ||
      variables != o.variables || arena_bytes != o.arena_bytes ||
      launches.size() != o.launches.size())
    return false;
  for (size_t i = 0; i < launches.size(); ++i) {
    const Launch &a = launches[i], &b = o.launches[i];
    if (a.symbol != b.symbol || a.args != b.args || !(a.collective == b.collective) ||
        a.summary != b.summary)
      return false;
  }
  return true;
}

std::string Plan::serialize() const {
  std::ostringstream os;
  os << "flowjit-plan 2\n";
  os << "job " << job_name << "\n";
  os << "arena " << arena_bytes << "\n";
  for (auto& t : inputs) os << "input " << type_text(t) << "\n";
  for (auto& t : outputs) os << "output " << type_text(t) << "\n";
  for (auto& [n, t] : variables) os << "variable " << type_text(t) << " " << n << "\n";
  // The run's checks (exports run the plan without fusion to remake them).
  if (status_offset >= 0) os << "status " << status_offset << "\n";
  for (const RunCheck& c : checks)
    os << "check " << c.limit << " " << (c.numerics ? 1 : 0) << " " << c.device_split << " "
       << int_list(c.shape) << " " << int_list(c.limits) << " " << token_text(c.job) << " "
       << token_text(c.where) << " " << token_text(c.what) << "\n";
  for (auto& l : launches) {
    os << "launch " << l.symbol << " ";
    write_geometry(os, l.geometry);
    for (auto& a : l.args) os << " " << kind_tag(a.kind) << a.index << "+" << a.offset_bytes;
    os << "\n";
    if (const auto& c = l.collective) {
      os << "collective " << collective_op_name(c->op) << " " << ir::dtype_short_name(c->dtype)
         << " " << c->parts << " " << c->outer << " " << c->inner;
      if (c->complete_before >= 0) os << " " << c->complete_before;
      os << "\n";
    }
    os << "summary " << l.summary << "\n";
  }
  os << "end\n";
  return os.str();
}

Plan Plan::deserialize(const std::string& text) {
  Plan p;
  std::istringstream is(text);
  std::string line;
  if (!std::getline(is, line) || line != "flowjit-plan 2") bad_plan("missing header");
  bool ended = false;
  try {
    while (std::getline(is, line)) {
      std::istringstream ls(line);
      std::string key;
      ls >> key;
      if (key == "job") {
        ls >> p.job_name;
      } else if (key == "arena") {
        ls >> p.arena_bytes;
      } else if (key == "input" || key == "output") {
        std::string t;
        ls >> t;
        (key == "input" ? p.inputs : p.outputs).push_back(parse_type(t));
      } else if (key == "variable") {
        std::string t, n;
        ls >> t;
        std::getline(ls >> std::ws, n);
        p.variables.emplace_back(n, parse_type(t));
      } else if (key == "status") {
        if (!(ls >> p.status_offset) || p.status_offset < 0) bad_plan("bad status line");
      } else if (key == "check") {
        RunCheck c;
        int numerics = 0;
        std::string shape, limits, job, where, what;
        if (!(ls >> c.limit >> numerics >> c.device_split >> shape >> limits >> job >> where >>
              what))
          bad_plan("bad check line '" + line + "'");
        c.numerics = numerics != 0;
        c.shape = parse_int_list(shape);
        c.limits = parse_int_list(limits);
        c.job = untoken_text(job);
        c.where = untoken_text(where);
        c.what = untoken_text(what);
        p.checks.push_back(std::move(c));
      } else if (key == "launch") {
        Launch l;
        ls >> l.symbol;
        l.geometry = read_geometry(ls);
        std::string a;
        while (ls >> a) {
          BufferRef r;
          switch (a[0]) {
            case 'I':
              r.kind = BufferKind::Input;
              break;
            case 'O':
              r.kind = BufferKind::Output;
              break;
            case 'V':
              r.kind = BufferKind::Variable;
              break;
            case 'A':
              r.kind = BufferKind::Arena;
              break;
            default:
              bad_plan("bad buffer '" + a + "'");
          }
          auto plus = a.find('+');
          if (plus == std::string::npos) bad_plan("bad buffer '" + a + "'");
          r.index = std::stoi(a.substr(1, plus - 1));
          r.offset_bytes = std::stoll(a.substr(plus + 1));
          l.args.push_back(r);
        }
        if (ls.bad() || l.symbol.empty()) bad_plan("bad launch line");
        p.launches.push_back(std::move(l));
      } else if (key == "collective") {
        if (p.launches.empty()) bad_plan("collective before launch");
        std::string op, dt;
        CollectiveStep c;
        if (!(ls >> op >> dt >> c.parts >> c.outer >> c.inner))
          bad_plan("bad collective line '" + line + "'");
        if (!(ls >> c.complete_before)) c.complete_before = -1;
        bool known = false;
        for (auto o : {CollectiveStep::Op::AllReduce, CollectiveStep::Op::AllGather,
                       CollectiveStep::Op::ReduceScatter, CollectiveStep::Op::LocalSlice})
          if (op == collective_op_name(o)) {
            c.op = o;
            known = true;
          }
        if (!known) bad_plan("unknown collective '" + op + "'");
        auto d = ir::dtype_from_short_name(dt);
        if (!d) bad_plan("bad dtype in '" + line + "'");
        c.dtype = *d;
        if (c.parts < 1 || c.outer < 0 || c.inner < 0) bad_plan("bad sizes in '" + line + "'");
        if (c.complete_before >= 0 &&
            ((c.op != CollectiveStep::Op::AllReduce && c.op != CollectiveStep::Op::AllGather) ||
             c.complete_before <= static_cast<int64_t>(p.launches.size()) - 1))
          bad_plan("bad completion point in '" + line + "'");
        p.launches.back().collective = c;
      } else if (key == "summary") {
        if (p.launches.empty()) bad_plan("summary before launch");
        std::getline(ls >> std::ws, p.launches.back().summary);
      } else if (key == "end") {
        ended = true;
        break;
      } else if (!key.empty()) {
        bad_plan("unknown line '" + line + "'");
      }
    }
  } catch (const std::invalid_argument&) {
    bad_plan("bad number");
  } catch (const std::out_of_range&) {
    bad_plan("number out of range");
  }
  if (!ended) bad_plan("truncated (no 'end' line)");
  // Structural checks so that a damaged plan can never address memory wrongly.
  if (p.status_offset >= 0 && p.status_offset + 32 > p.arena_bytes)
    bad_plan("status buffer outside the arena");
  if (!p.checks.empty() && p.status_offset < 0) bad_plan("checks without a status buffer");
  for (auto& l : p.launches)
    if (l.collective && l.collective->complete_before > static_cast<int64_t>(p.launches.size()))
      bad_plan("completion point out of range in " + l.symbol);
  for (auto& l : p.launches)
    for (auto& a : l.args) {
      int64_t limit = a.kind == BufferKind::Input      ? static_cast<int64_t>(p.inputs.size())
                      : a.kind == BufferKind::Output   ? static_cast<int64_t>(p.outputs.size())
                      : a.kind == BufferKind::Variable ? static_cast<int64_t>(p.variables.size())
                                                       : 1;
      if (a.index < 0 || a.index >= limit) bad_plan("buffer index out of range in " + l.symbol);
      if (a.kind == BufferKind::Arena && (a.offset_bytes < 0 || a.offset_bytes > p.arena_bytes))
        bad_plan("arena offset out of range in " + l.symbol);
    }
  return p;
}

std::string Plan::describe() const {
  std::ostringstream os;
  for (size_t i = 0; i < launches.size(); ++i) {
    auto& l = launches[i];
    os << "  [" << i << "] " << l.symbol;
    if (const CpuRange* c = l.cpu()) {
      os << " range=" << c->range << " grain=" << c->grain;
      if (c->scratch_bytes) os << " scratch=" << c->scratch_bytes;
    } else {
      const GpuGrid& g = *l.gpu();
      os << " grid=" << g.grid[0] << "," << g.grid[1] << "," << g.grid[2] << " block=" << g.block[0]
         << "," << g.block[1] << "," << g.block[2];
      if (g.shared_bytes) os << " shared=" << g.shared_bytes;
    }
    // Where an asynchronous collective must be complete (tools read the
    // overlap structure from this: tools/scale_model.py).
    if (l.collective && l.collective->complete_before >= 0)
      os << " complete_before=" << l.collective->complete_before;
    os << " : " << l.summary << "\n";
  }
  return os.str();
}

// ---------------------------------------------------------------- running

namespace {
bool profiling_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FLOWJIT_PROFILE");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}
}  // namespace

std::vector<Executable::LaunchProfile> Executable::profile() const { return profile_; }

std::vector<Executable::LaunchEvent> Executable::events() const {
  if (events_.size() < kMaxEvents) return events_;
  std::vector<LaunchEvent> out(events_.begin() + events_next_, events_.end());
  out.insert(out.end(), events_.begin(), events_.begin() + events_next_);
  return out;
}

void Executable::record(size_t li, std::chrono::steady_clock::time_point t0) {
  auto t1 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(record_mu_);  // the communication thread records too
  profile_[li].calls += 1;
  profile_[li].seconds += std::chrono::duration<double>(t1 - t0).count();
  static thread_local const int64_t tid = static_cast<int64_t>(::syscall(SYS_gettid));
  LaunchEvent e{static_cast<int32_t>(li),
                std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count(),
                std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count(), tid};
  if (events_.size() < kMaxEvents) {
    events_.push_back(e);
  } else {
    events_[events_next_] = e;
    events_next_ = (events_next_ + 1) % kMaxEvents;
  }
}

// A bucket's later members ran with it: a call of no length each, on the
// thread that ran the bucket.
void Executable::record_bucket(size_t li, std::chrono::steady_clock::time_point t0) {
  record(li, t0);
  if (li < bucket_.size())
    for (size_t k = 1; k < bucket_[li].size(); ++k)
      record(bucket_[li][k], std::chrono::steady_clock::now());
}

const char* collective_op_name(CollectiveStep::Op op) {
  switch (op) {
    case CollectiveStep::Op::AllReduce:
      return "all_reduce";
    case CollectiveStep::Op::AllGather:
      return "all_gather";
    case CollectiveStep::Op::ReduceScatter:
      return "reduce_scatter";
    case CollectiveStep::Op::LocalSlice:
      return "local_slice";
  }
  return "?";
}

void Executable::bind(VariableStore& store, const std::shared_ptr<DeviceState>& device) {
  FJ_CHECK(device == nullptr, "a CPU program given a device's state");
  bind_variables(store);
}

std::shared_ptr<Program> Executable::instance_for(
    VariableStore& store, const std::shared_ptr<DeviceState>& device) const {
  auto e = instance();
  e->bind(store, device);
  return e;
}

std::shared_ptr<Executable> Executable::instance() const {
  return std::make_shared<Executable>(plan_, fns_, code_owner_);
}

std::string describe_failed_check(const std::string& job, const RunCheck& c, int64_t value,
                                  int64_t position, int rank, int parts) {
  std::ostringstream os;
  os << "job '" << (c.job.empty() ? job : c.job) << "'";
  if (!c.where.empty()) os << ", " << c.where;
  if (c.numerics) {
    double d;
    std::memcpy(&d, &value, sizeof d);
    os << ": " << c.what << ", " << (std::isnan(d) ? "nan" : d > 0 ? "inf" : "-inf");
  } else {
    os << ": " << c.what << " holds " << value;
  }
  // The position as an index of the checked tensor.
  std::vector<int64_t> at(c.shape.size(), 0);
  int64_t rest = position;
  for (size_t d = c.shape.size(); d-- > 0;) {
    int64_t e = std::max<int64_t>(c.shape[d], 1);
    at[d] = rest % e;
    rest /= e;
  }
  // A piece of a tensor split over the devices: its position in the whole.
  std::vector<int64_t> logical = at;
  const bool split =
      parts > 1 && c.device_split >= 0 && c.device_split < static_cast<int>(logical.size());
  if (split) logical[c.device_split] += static_cast<int64_t>(rank) * c.shape[c.device_split];
  os << " at [";
  for (size_t d = 0; d < logical.size(); ++d) os << (d ? ", " : "") << logical[d];
  os << "]";
  if (parts > 1 && (c.device_split == -2 || (c.numerics && !split)))
    os << " on device " << rank;  // no logical whole (mirrored), or not known
  if (c.numerics) return os.str();
  int64_t limit = c.limit;
  if (limit < 0 && !c.limits.empty())
    limit = c.limits[static_cast<size_t>(at.empty() ? 0 : at.back()) % c.limits.size()];
  os << ", outside the valid range [0, " << limit << ")";
  return os.str();
}

// [harden] The run's checks: raised after the launch whose kernel reported
// one, so no later launch (an optimizer update) runs on the bad values.
void Executable::raise_failed_check() const {
  const int64_t* st = reinterpret_cast<const int64_t*>(arena_.get() + plan_.status_offset);
  int64_t id = st[0] - 1;
  FJ_CHECK(id >= 0 && id < static_cast<int64_t>(plan_.checks.size()), "job '", plan_.job_name,
           "': a kernel reported check #", id, " which the plan does not have");
  const RunCheck& c = plan_.checks[id];
  // A device of a distributed program without collectives (each stops
  // alone; nothing waits for it): the position in the logical tensor.
  throw_user(
      c.numerics ? ErrorKind::FloatingPoint : ErrorKind::Index,
      describe_failed_check(plan_.job_name, c, st[1], st[2], rank_, comm_ ? comm_->size() : 1));
}

bool is_status_gather(const Plan& plan, const Launch& l) {
  return plan.status_offset >= 0 && l.collective &&
         l.collective->op == CollectiveStep::Op::AllGather && l.args.size() == 2 &&
         l.args[0].kind == BufferKind::Arena && l.args[0].offset_bytes == plan.status_offset;
}

void raise_first_gathered_check(const Plan& plan, const CollectiveStep& step,
                                const int64_t* words) {
  for (int64_t r = 0; r < step.parts; ++r) {
    const int64_t* st = words + r * step.inner;
    if (st[0] == 0) continue;
    int64_t id = st[0] - 1;
    FJ_CHECK(id >= 0 && id < static_cast<int64_t>(plan.checks.size()), "job '", plan.job_name,
             "': rank ", r, " reported check #", id, " which the plan does not have");
    const RunCheck& c = plan.checks[id];
    throw FailedCheckOnEveryDevice(
        c.numerics ? ErrorKind::FloatingPoint : ErrorKind::Index,
        describe_failed_check(plan.job_name, c, st[1], st[2], static_cast<int>(r),
                              static_cast<int>(step.parts)));
  }
}

void Executable::raise_gathered_check(size_t li, char* const* args) const {
  raise_first_gathered_check(plan_, *plan_.launches[li].collective,
                             reinterpret_cast<const int64_t*>(args[1]));
}

std::vector<std::vector<size_t>> all_reduce_buckets(const Plan& plan) {
  // Runs of all_reduce launches of one dtype whose buffers do not overlap
  // (a later member's result may reuse an earlier member's operand memory;
  // a bucket reads and writes them all at once).
  const size_t nl = plan.launches.size();
  std::vector<std::vector<size_t>> bucket(nl);
  auto all_reduce_at = [&](size_t li) -> const CollectiveStep* {
    const auto& c = plan.launches[li].collective;
    return c && c->op == CollectiveStep::Op::AllReduce ? &*c : nullptr;
  };
  struct Range {
    int64_t lo, hi;
  };
  for (size_t li = 0; li < nl; ++li) {
    const CollectiveStep* c = all_reduce_at(li);
    if (!c) continue;
    std::vector<Range> ranges;
    auto add = [&](size_t l) {
      const CollectiveStep& s = *plan.launches[l].collective;
      int64_t bytes = s.inner * ir::dtype_bytes(s.dtype);
      for (const BufferRef& r : plan.launches[l].args)
        if (r.kind == BufferKind::Arena) ranges.push_back({r.offset_bytes, r.offset_bytes + bytes});
    };
    auto overlaps = [&](size_t l) {
      const CollectiveStep& s = *plan.launches[l].collective;
      int64_t bytes = s.inner * ir::dtype_bytes(s.dtype);
      for (const BufferRef& r : plan.launches[l].args) {
        if (r.kind != BufferKind::Arena) continue;
        for (const Range& x : ranges)
          if (r.offset_bytes < x.hi && x.lo < r.offset_bytes + bytes) return true;
      }
      return false;
    };
    bucket[li].push_back(li);
    add(li);
    size_t next = li + 1;
    while (next < nl) {
      const CollectiveStep* d = all_reduce_at(next);
      if (!d || d->dtype != c->dtype || overlaps(next)) break;
      bucket[li].push_back(next);
      add(next);
      ++next;
    }
    li = next - 1;
  }
  return bucket;
}

Executable::Executable(Plan plan, std::vector<KernelFn> fns, std::shared_ptr<void> code_owner)
    : plan_(std::move(plan)), fns_(std::move(fns)), code_owner_(std::move(code_owner)) {
  FJ_CHECK(fns_.size() == plan_.launches.size(), "one function per launch");
  for (auto& l : plan_.launches) {
    FJ_CHECK(l.cpu() != nullptr, "job '", plan_.job_name, "': launch ", l.symbol,
             " has a GPU grid, not a CPU range");
    bool checks = false;
    for (const BufferRef& r : l.args)
      checks |= plan_.status_offset >= 0 && r.kind == BufferKind::Arena &&
                r.offset_bytes == plan_.status_offset;
    checks_.push_back(checks);
    status_gathers_.push_back(is_status_gather(plan_, l));
    if (l.collective) {
      FJ_USER_CHECK(l.args.size() == 2, ErrorKind::Value, "corrupt compiled plan: collective ",
                    l.symbol, " needs 2 buffers");
      collective_index_.push_back(static_cast<int>(collectives_.size()));
      collectives_.push_back(*l.collective);
    } else {
      collective_index_.push_back(-1);
    }
  }
  if (std::all_of(collective_index_.begin(), collective_index_.end(), [](int i) { return i < 0; }))
    collective_index_.clear();
  if (!collective_index_.empty()) bucket_ = all_reduce_buckets(plan_);
  bucketed_.assign(bucket_.size(), false);
  for (const std::vector<size_t>& b : bucket_)
    for (size_t k = 1; k < b.size(); ++k) bucketed_[b[k]] = true;
  arena_ =
      allocate_or_explain(plan_.job_name, "its arena (the intermediate values)", plan_.arena_bytes);
  size_t total = 0;
  for (auto& l : plan_.launches) {
    arg_start_.push_back(total);
    total += l.args.size();
  }
  argbuf_.assign(total, nullptr);
  for (auto& l : plan_.launches) profile_.push_back({l.symbol, 0, 0.0});
}

void Executable::set_device(std::shared_ptr<Communicator> comm, int rank) {
  comm_ = std::move(comm);
  rank_ = rank;
}

void Executable::gather_variable_pieces(size_t index, void* dst, int64_t outer,
                                        int64_t piece_bytes) {
  FJ_CHECK(comm_ != nullptr && index < variable_ptrs_.size(), "gathering variable ", index,
           " of job '", plan_.job_name, "' outside a distributed job");
  comm_->all_gather(rank_, variable_ptrs_[index], dst, outer, piece_bytes);
}

std::atomic<bool>& interrupt_requested() {
  static std::atomic<bool> flag{false};
  return flag;
}

bool overlap_enabled() {
  const char* v = std::getenv("FLOWJIT_OVERLAP");
  return !(v && std::string(v) == "0");
}

void Executable::run_collective(size_t li, char* const* args) {
  if (bucketed_[li]) return;  // ran with its bucket
  const CollectiveStep& c = collectives_[collective_index_[li]];
  if (bucket_[li].size() > 1) {
    FJ_USER_CHECK(comm_ != nullptr && comm_->size() == c.parts, ErrorKind::Runtime, "job '",
                  plan_.job_name, "' was compiled for ", c.parts, " devices but runs on ",
                  comm_ ? comm_->size() : 1);
    std::vector<Communicator::Buffer> bufs;
    for (size_t m : bucket_[li]) {
      char* const* a = argbuf_.data() + arg_start_[m];
      bufs.push_back({a[0], a[1], collectives_[collective_index_[m]].inner});
    }
    comm_->all_reduce_many(rank_, bufs, c.dtype);
    return;
  }
  FJ_USER_CHECK(comm_ != nullptr, ErrorKind::Runtime, "job '", plan_.job_name,
                "' has collectives but runs without devices to exchange data with");
  FJ_USER_CHECK(comm_->size() == c.parts, ErrorKind::Runtime, "job '", plan_.job_name,
                "' was compiled for ", c.parts, " devices but runs on ", comm_->size());
  size_t es = static_cast<size_t>(ir::dtype_bytes(c.dtype));
  switch (c.op) {
    case CollectiveStep::Op::AllReduce:
      comm_->all_reduce(rank_, args[0], args[1], c.inner, c.dtype);
      break;
    case CollectiveStep::Op::AllGather:
      comm_->all_gather(rank_, args[0], args[1], c.outer, c.inner * static_cast<int64_t>(es));
      break;
    case CollectiveStep::Op::ReduceScatter:
      comm_->reduce_scatter(rank_, args[0], args[1], c.outer, c.inner, c.dtype);
      break;
    case CollectiveStep::Op::LocalSlice: {
      size_t piece = static_cast<size_t>(c.inner) * es;
      for (int64_t o = 0; o < c.outer; ++o)
        std::memcpy(args[1] + o * piece, args[0] + (o * c.parts + rank_) * piece, piece);
      break;
    }
  }
}

void Executable::bind_variables(VariableStore& store) {
  variable_ptrs_.clear();
  variable_storages_.clear();
  for (auto& [name, type] : plan_.variables) {
    VariableStorage* v = store.find(name);
    FJ_USER_CHECK(v != nullptr, ErrorKind::Runtime, "job '", plan_.job_name, "' uses variable '",
                  name,
                  "', which no longer exists in the session (was "
                  "flow.clear_default_session() called?)");
    FJ_USER_CHECK(v->type == type, ErrorKind::Value, "job '", plan_.job_name,
                  "' expects variable '", name, "' as ", type.str(), " but the session holds ",
                  v->type.str());
    variable_ptrs_.push_back(v->ptr());
    variable_storages_.push_back(v);
  }
  bound_ = true;
}

char* Executable::scratch_for(int thread, int64_t bytes) {
  if (bytes == 0) return nullptr;
  return scratch_[thread].get();
}

void Executable::run(const void* const* inputs, void* const* outputs) {
  FJ_CHECK(bound_ || plan_.variables.empty(), "executable run before bind_variables");
  // Variables that distributed or GPU jobs also use: read the newest value,
  // and let the other copies pick up what this run writes (also when it
  // fails part way: it may have written some).
  struct HostWrites {
    std::vector<VariableStorage*>& vars;
    bool writes;
    ~HostWrites() {
      if (!writes) return;
      for (VariableStorage* v : vars)
        if (v->replicas || v->device_copies) mark_host_written(*v);
    }
  } host_writes{variable_storages_, writes_variables_};
  for (VariableStorage* v : variable_storages_)
    if (v->replicas || v->device_copies) sync_host(*v);
  // Resolve every launch's arguments.
  for (size_t li = 0; li < plan_.launches.size(); ++li) {
    const Launch& l = plan_.launches[li];
    char** dst = argbuf_.data() + arg_start_[li];
    for (size_t ai = 0; ai < l.args.size(); ++ai) {
      const BufferRef& r = l.args[ai];
      char* base = nullptr;
      switch (r.kind) {
        case BufferKind::Input:
          base = const_cast<char*>(static_cast<const char*>(inputs[r.index]));
          break;
        case BufferKind::Output:
          base = static_cast<char*>(outputs[r.index]);
          break;
        case BufferKind::Variable:
          base = variable_ptrs_[r.index];
          break;
        case BufferKind::Arena:
          base = arena_.get();
          break;
      }
      dst[ai] = base + r.offset_bytes;
    }
  }
  // Scratch: one block per thread, sized for the largest launch.
  int64_t need = 0;
  for (auto& l : plan_.launches) need = std::max(need, l.cpu()->scratch_bytes);
  int threads = tbb::this_task_arena::max_concurrency();
  if (need > 0 && (static_cast<int>(scratch_.size()) < threads || scratch_size_.empty() ||
                   scratch_size_[0] < need)) {
    scratch_.clear();
    scratch_size_.clear();
    for (int t = 0; t < threads; ++t) {
      scratch_.push_back(allocate_or_explain(plan_.job_name, "a thread's scratch memory", need));
      scratch_size_.push_back(need);
    }
  }
  // Overlap: an all_reduce (bucket) with a completion point runs on the
  // communication thread; each launch first waits for the buckets that must
  // be complete before it. Other collectives run here, after the pending ones
  // (every rank calls its communicator in plan order).
  const bool overlap = !collective_index_.empty() && overlap_enabled();
  if (overlap && !comm_thread_) comm_thread_ = std::make_unique<CollectiveQueue>();
  struct Pending {
    int64_t before;
    uint64_t ticket;
  };
  std::vector<Pending> pending;
  struct Drain {  // nothing of this run stays in flight, whatever happens
    CollectiveQueue* q;
    ~Drain() {
      if (q) q->drain();
    }
  } drain{overlap ? comm_thread_.get() : nullptr};
  auto settle = [&](int64_t li) {
    for (size_t i = 0; i < pending.size();) {
      if (pending[i].before <= li) {
        comm_thread_->wait(pending[i].ticket);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  };
  if (plan_.status_offset >= 0) std::memset(arena_.get() + plan_.status_offset, 0, 32);
  // The newest status all_gather not yet read (launch index, -1: none) and
  // the launch before which it is complete.
  int64_t status_gather = -1, status_due = 0;
  for (size_t li = 0; li < plan_.launches.size(); ++li) {
    // The devices of a distributed job stop only after a status all_gather,
    // all at the same launch: one that stopped alone would leave the others
    // waiting in a collective.
    if (li > 0 && checks_[li - 1] && collective_index_.empty() &&
        *reinterpret_cast<const int64_t*>(arena_.get() + plan_.status_offset) != 0)
      raise_failed_check();
    // [harden] Ctrl-C: between launches, before any variable is written (the
    // devices of a distributed job would have to stop together: they do not).
    if (static_cast<int64_t>(li) < plan_.first_variable_write && collective_index_.empty() &&
        interrupt_requested().load(std::memory_order_relaxed))
      throw Interrupted();
    const Launch& l = plan_.launches[li];
    char* const* args = argbuf_.data() + arg_start_[li];
    KernelFn fn = fns_[li];
    const bool prof = profiling_enabled();
    if (!pending.empty()) settle(static_cast<int64_t>(li));
    if (status_gather >= 0 && static_cast<int64_t>(li) >= status_due) {
      // Complete on every device: all raise here alike.
      raise_gathered_check(static_cast<size_t>(status_gather),
                           argbuf_.data() + arg_start_[status_gather]);
      status_gather = -1;
    }
    if (status_gathers_[li]) {
      status_gather = static_cast<int64_t>(li);
      status_due = static_cast<int64_t>(li) + 1;
      if (overlap && collectives_[collective_index_[li]].complete_before > status_due)
        status_due = collectives_[collective_index_[li]].complete_before;
    }
    if (!collective_index_.empty() && collective_index_[li] >= 0) {
      if (bucketed_[li]) continue;  // ran with its bucket
      int64_t before = -1;
      if (overlap && bucket_[li].empty()) {
        before = collectives_[collective_index_[li]].complete_before;  // an output's all_gather
      } else if (overlap) {
        before = static_cast<int64_t>(plan_.launches.size());
        for (size_t m : bucket_[li]) {
          int64_t b = collectives_[collective_index_[m]].complete_before;
          before = b < 0 ? -1 : std::min(before, b);
          if (before < 0) break;
        }
      }
      if (before > static_cast<int64_t>(li)) {
        pending.push_back({before, comm_thread_->submit([this, li, args, prof] {
                             auto t0 = prof ? std::chrono::steady_clock::now()
                                            : std::chrono::steady_clock::time_point{};
                             run_collective(li, args);
                             if (prof) record_bucket(li, t0);
                           })});
        continue;
      }
      if (!pending.empty()) settle(std::numeric_limits<int64_t>::max());
      auto t0 = prof ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      run_collective(li, args);
      if (prof) record_bucket(li, t0);
      continue;
    }
    const CpuRange& g = *l.cpu();  // checked by the constructor
    if (g.range <= 0) continue;
    auto t0 = prof ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    struct Record {
      Executable* self;
      size_t li;
      std::chrono::steady_clock::time_point t0;
      ~Record() {
        if (self) self->record(li, t0);
      }
    } recorder{prof ? this : nullptr, li, t0};
    if (g.range <= g.grain || threads <= 1) {
      fn(args, 0, g.range, scratch_for(0, g.scratch_bytes));
      continue;
    }
    int64_t chunks = std::min<int64_t>((g.range + g.grain - 1) / g.grain, threads);
    int64_t step = (g.range + chunks - 1) / chunks;
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, chunks, 1),
        [&](const tbb::blocked_range<int64_t>& r) {
          int t = tbb::this_task_arena::current_thread_index();
          if (t < 0 || t >= threads) t = 0;
          char* scratch = scratch_for(t, g.scratch_bytes);
          for (int64_t c = r.begin(); c < r.end(); ++c) {
            int64_t b = c * step, e = std::min(g.range, b + step);
            if (b < e) fn(args, b, e, scratch);
          }
        },
        tbb::static_partitioner());
  }
  if (!pending.empty()) settle(std::numeric_limits<int64_t>::max());
  if (status_gather >= 0)
    raise_gathered_check(static_cast<size_t>(status_gather),
                         argbuf_.data() + arg_start_[status_gather]);
  else if (!checks_.empty() && checks_.back() && collective_index_.empty() &&
           *reinterpret_cast<const int64_t*>(arena_.get() + plan_.status_offset) != 0)
    raise_failed_check();
  // (A distributed program ends with a status all_gather when anything
  // after the last one checks: jit/fusion/schedule.cpp.)
}

}  // namespace flowjit::runtime
