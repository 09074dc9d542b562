// The Gloo communicator of runtime/comm/gloo_communicator.h.
//
// Hierarchy: the local devices of a process meet in shared memory: each
// publishes its buffers in slots_ and waits at a barrier of an in-process
// thread communicator. The first local device (the leader) then does the
// whole collective for its process: it reads every local input, runs the
// inter-process step over Gloo, and writes every local output; a second
// barrier releases the other local devices.
//
// Rank order: the leader ships every local input, not a local partial sum,
// so whichever process reduces an element sees all size() contributions and
// adds them in global rank order, and every rank then receives those same
// bits. all_reduce is an alltoall of chunks (process q reduces chunk q)
// followed by an allgather of the reduced chunks; reduce_scatter is one
// alltoall delivering to each process the blocks it owns; all_gather is one
// allgather. That sends local_devices times the bytes of a reduce-locally-
// first scheme, in exchange for results equal to a one-process run's.
//
// Failure: the leader turns any Gloo error into a UserError naming the step,
// aborts the communicator (waking the local devices at the second barrier)
// and closes its connections, so peers blocked on this process fail at once
// instead of at their timeout.
#include "runtime/comm/gloo_communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "ir/error.h"
#include "runtime/comm/tcp_store.h"

namespace flowjit::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string count_text(int n, const char* one, const char* many) {
  return str(n, " ", n == 1 ? one : many);
}

// gloo prefixes its messages with "[file:line] " (sometimes twice); the
// location is noise to a user.
std::string strip_location(std::string msg) {
  while (!msg.empty() && msg[0] == '[') {
    size_t end = msg.find("] ");
    if (end == std::string::npos) break;
    msg.erase(0, end + 2);
  }
  return msg;
}

// Gloo's TCP transport writes with writev, which raises SIGPIPE when a peer
// has gone, and the default action kills the process. Rather than change the
// process's disposition, block SIGPIPE in the calling thread while it is in
// Gloo (a write then fails with EPIPE, which Gloo reports), and discard a
// SIGPIPE that became pending meanwhile. Gloo's event-loop thread, created
// inside the guard, inherits the blocked mask for good.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
    was_pending_ = pending();
  }
  ~SigpipeGuard() {
    if (!was_pending_ && pending()) {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGPIPE);
      timespec zero{0, 0};
      while (sigtimedwait(&set, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  static bool pending() {
    sigset_t set;
    sigpending(&set);
    return sigismember(&set, SIGPIPE) == 1;
  }
  sigset_t old_;
  bool was_pending_;
};

// The address of this machine's interface that routes to `host`: what peers
// on other machines can reach this process at (127.0.0.1 when host is local).
// Connecting a UDP socket sends nothing; it only picks the route.
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* list = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &list) != 0) return host;
  std::string found = host;
  for (addrinfo* a = list; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    char text[INET6_ADDRSTRLEN] = {0};
    bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
              getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0;
    if (ok) {
      const void* addr =
          ss.ss_family == AF_INET6
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr);
      ok = inet_ntop(ss.ss_family, addr, text, sizeof(text)) != nullptr;
    }
    ::close(fd);
    if (ok) {
      found = text;
      break;
    }
  }
  freeaddrinfo(list);
  return found;
}

// The n-th communicator a process makes on one store and tag rendezvouses
// with the n-th of every other process: the generation goes into the keys,
// so a communicator never reads keys an earlier one left in a store.
int next_generation(const std::string& store_and_tag) {
  static std::mutex mu;
  static auto* generations = new std::map<std::string, int>();
  std::lock_guard<std::mutex> lock(mu);
  return (*generations)[store_and_tag]++;
}

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const GlooOptions& o)
      : opts_(o), P_(o.num_processes), L_(o.local_devices), p_(o.process_rank) {
    FJ_USER_CHECK(P_ >= 1, ErrorKind::Value, "gloo: num_processes must be at least 1, not ", P_);
    FJ_USER_CHECK(L_ >= 1, ErrorKind::Value, "gloo: local_devices must be at least 1, not ", L_);
    FJ_USER_CHECK(p_ >= 0 && p_ < P_, ErrorKind::Value, "gloo: process_rank ", p_,
                  " is not in [0, ", P_, ")");
    FJ_USER_CHECK(o.timeout_seconds > 0 && std::isfinite(o.timeout_seconds), ErrorKind::Value,
                  "gloo: timeout_seconds must be positive, not ", o.timeout_seconds);
    FJ_USER_CHECK(P_ == 1 || !o.file_store_dir.empty() || (o.port > 0 && o.port < 65536),
                  ErrorKind::Value,
                  "gloo: GlooOptions.port must name the port of the rendezvous store that "
                  "process 0 hosts (or set file_store_dir), not ",
                  o.port);
    timeout_ = milliseconds(std::max<int64_t>(1, std::llround(o.timeout_seconds * 1000)));
    local_ = make_thread_communicator(L_);
    slots_.resize(static_cast<size_t>(L_));
    if (P_ > 1) rendezvous();
  }

  int size() const override { return P_ * L_; }

  std::string describe() const override {
    return str("gloo: ", count_text(P_, "process", "processes"), " x ",
               count_text(L_, "device", "devices"));
  }

  void all_reduce(int rank, const void* in, void* out, int64_t count, ir::DType dtype) override {
    int l = enter(rank, in, out);
    if (l == 0) lead("all_reduce", [&] { reduce_all(count, dtype); });
    local_->barrier(l);
  }

  void all_gather(int rank, const void* in, void* out, int64_t outer,
                  int64_t inner_bytes) override {
    int l = enter(rank, in, out);
    if (l == 0) lead("all_gather", [&] { gather_all(outer, inner_bytes); });
    local_->barrier(l);
  }

  void reduce_scatter(int rank, const void* in, void* out, int64_t outer, int64_t inner,
                      ir::DType dtype) override {
    int l = enter(rank, in, out);
    if (l == 0) lead("reduce_scatter", [&] { scatter_reduce(outer, inner, dtype); });
    local_->barrier(l);
  }

  void barrier(int rank) override {
    int l = enter(rank, nullptr, nullptr);
    if (l == 0)
      lead("barrier", [&] {
        if (P_ > 1) gloo_barrier();
      });
    local_->barrier(l);
  }

  void abort(const std::string& why) override {
    std::string reason = why.empty() ? "a device failed" : why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_.empty()) aborted_ = reason;
    }
    local_->abort(reason);
    // While the leader is inside Gloo the connections are its to close (it
    // does, when it returns); otherwise close them now, so that peers stop
    // waiting for this process.
    std::unique_lock<std::mutex> lock(gloo_mu_, std::try_to_lock);
    if (lock.owns_lock()) close_connections();
  }

 private:
  struct Slot {
    const void* in = nullptr;
    void* out = nullptr;
  };

  // -------------------------------------------------------------------------
  // Rendezvous

  void rendezvous() {
    SigpipeGuard guard;
    auto deadline = Clock::now() + timeout_;
    std::unique_ptr<RendezvousStore> store;
    try {
      if (!opts_.file_store_dir.empty())
        store = std::make_unique<FileStore>(opts_.file_store_dir, timeout_);
      else
        store = std::make_unique<TcpStore>(opts_.master_addr, opts_.port, p_ == 0, timeout_,
                                           opts_.store_token);
    } catch (const UserError& e) {
      std::string msg = e.what();
      if (msg.rfind("gloo: ", 0) == 0) msg.erase(0, 6);
      throw UserError(e.kind(), str("gloo: process ", p_, " of ", P_, ": ", msg));
    }
    std::string base =
        str("flowjit/", opts_.tag, "/", next_generation(store->where() + "|" + opts_.tag), "/");
    exchange_info(*store, base, deadline);
    try {
      auto context = std::make_shared<gloo::rendezvous::Context>(p_, P_);
      context->setTimeout(timeout_);
      gloo::transport::tcp::attr attr;
      attr.hostname = local_address_towards(opts_.master_addr);
      // Its event-loop thread keeps this thread's priority, deliberately not
      // prioritize_communication_thread()'s: it busy-polls epoll while a
      // sender holds the pair's lock (Pair::handleEvents try_locks and
      // returns), and raised it took the core from that sender (measured:
      // synchronous steps 2-7x slower, benchmarks/README.md).
      auto device = gloo::transport::tcp::CreateDevice(attr);
      gloo::rendezvous::PrefixStore prefixed(base + "gloo", *store);
      ScrubbedAddressStore mesh_store(prefixed);  // gloo's addresses, without its stack bytes
      context->connectFullMesh(mesh_store, device);
      context_ = context;
      // Nobody leaves (and process 0 stops serving the store) before
      // everyone has read what it needs from the store.
      gloo_barrier();
    } catch (const UserError&) {
      throw;
    } catch (const std::exception& e) {
      throw_user(ErrorKind::Runtime, "gloo: process ", p_, " of ", P_,
                 " could not connect to its peers: ", strip_location(e.what()));
    }
  }

  // Every process publishes the world it was started for and compares it
  // with everyone else's, so a mismatch is an error naming both sides rather
  // than a hang. A process other than 0 reads process 0's first and publishes
  // its own even when they differ: process 0 then reports the mismatch too,
  // and cannot stop serving the store before this process has seen it.
  void exchange_info(RendezvousStore& store, const std::string& base, Clock::time_point deadline) {
    const std::string mine = str("num_processes=", P_, ", local_devices=", L_);
    auto key = [&](int q) { return str(base, "info/", q); };
    auto text = [](const std::vector<char>& v) { return std::string(v.begin(), v.end()); };
    auto mismatch = [&](int q, const std::string& theirs) {
      return str("gloo: world size mismatch: process ", q, " was started with ", theirs,
                 ", but process ", p_, " with ", mine);
    };
    auto not_joined = [&](const std::vector<int>& missing) {
      std::string who;
      for (int q : missing) who += str(who.empty() ? "" : ", ", q);
      throw_user(ErrorKind::Runtime, "gloo: process", missing.size() == 1 ? " " : "es ", who,
                 " of ", P_, " did not join within ", timeout_.count() / 1000.0, " s at ",
                 store.where());
    };
    std::vector<bool> seen(static_cast<size_t>(P_), false);
    seen[static_cast<size_t>(p_)] = true;
    std::string error;
    std::vector<char> value;
    milliseconds pause(1);
    auto nap = [&] {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, milliseconds(50));
    };
    if (p_ != 0) {
      while (!store.try_get(key(0), &value)) {
        if (Clock::now() >= deadline) not_joined({0});
        nap();
      }
      seen[0] = true;
      if (text(value) != mine) error = mismatch(0, text(value));
    }
    store.set(key(p_), std::vector<char>(mine.begin(), mine.end()));
    if (!error.empty()) throw_user(ErrorKind::Runtime, error);
    pause = milliseconds(1);
    for (;;) {
      std::vector<int> missing;
      for (int q = 0; q < P_; ++q) {
        if (seen[static_cast<size_t>(q)]) continue;
        if (!store.try_get(key(q), &value)) {
          missing.push_back(q);
          continue;
        }
        seen[static_cast<size_t>(q)] = true;
        if (text(value) != mine) throw_user(ErrorKind::Runtime, mismatch(q, text(value)));
      }
      if (missing.empty()) return;
      if (Clock::now() >= deadline) not_joined(missing);
      nap();
    }
  }

  // -------------------------------------------------------------------------
  // The local phase

  // Checks the rank, publishes its buffers and waits for the other local
  // devices; returns the local index.
  int enter(int rank, const void* in, void* out) {
    int first = p_ * L_;
    FJ_USER_CHECK(rank >= first && rank < first + L_, ErrorKind::Value, "gloo: rank ", rank,
                  " is not a device of process ", p_, " (its ranks are ", first, "..",
                  first + L_ - 1, ")");
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.empty()) throw_user(ErrorKind::Runtime, "a collective was aborted: ", aborted_);
    }
    int l = rank - first;
    slots_[static_cast<size_t>(l)] = {in, out};
    local_->barrier(l);
    return l;
  }

  // Runs the leader's step. Any failure aborts the communicator, so that the
  // local devices waiting at the next barrier throw too.
  template <class F>
  void lead(const char* what, F&& step) {
    std::string failed;
    {
      std::lock_guard<std::mutex> lock(gloo_mu_);
      try {
        SigpipeGuard guard;
        if (closed_)
          failed = str("a collective was aborted: ", abort_reason());
        else
          step();
      } catch (const std::exception& e) {
        failed = explain(what, e);
      }
      if (!failed.empty() || !abort_reason().empty()) close_connections();
    }
    if (!failed.empty()) {
      abort(failed);
      throw_user(ErrorKind::Runtime, failed);
    }
    // The test-only delay, after the exchange: its result arrives that much
    // later, as over a slower network (before it, the sleep could overlap a
    // wait for a peer that arrives later, and it would also change how the
    // host schedules the exchange's wake-ups).
    inject_test_delay();
  }

  std::string explain(const char* what, const std::exception& e) const {
    if (dynamic_cast<const UserError*>(&e)) return e.what();
    std::string msg = strip_location(e.what());
    if (msg.find("imed out") != std::string::npos || msg.find("timeout") != std::string::npos)
      return str("gloo: ", what, " timed out after ", timeout_.count() / 1000.0,
                 " s waiting for a peer (did a process stall, die or skip the call?): ", msg);
    if (dynamic_cast<const gloo::IoException*>(&e))
      return str("gloo: lost connection to a peer during ", what, ": ", msg);
    return str("gloo: ", what, " failed: ", msg);
  }

  std::string abort_reason() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }

  // gloo_mu_ held.
  void close_connections() {
    if (closed_ || !context_) return;
    closed_ = true;
    try {
      context_->closeConnections();
    } catch (const std::exception&) {
      // Already broken; closing is best effort.
    }
  }

  // -------------------------------------------------------------------------
  // The leader's steps: read slots_[*].in, write slots_[*].out. Every input
  // is copied out before any output is written, since they may alias.

  // Every process gathers every rank's input and adds them in rank order
  // itself. Gloo's allgather is several times faster here than its alltoall
  // (16 bytes: 60 vs 350 us; 0.8 MB: 0.34 vs 0.43-0.7 ms on loopback), and
  // for two processes it receives no more bytes than the alltoall scheme.
  void reduce_all_by_gather(int64_t count, ir::DType dtype) {
    const size_t es = static_cast<size_t>(ir::dtype_bytes(dtype));
    const size_t piece = static_cast<size_t>(count) * es;  // one rank's input
    acc_.resize(static_cast<size_t>(P_) * L_ * piece);
    for (int l = 0; l < L_; ++l)
      std::memcpy(acc_.data() + (static_cast<size_t>(p_) * L_ + l) * piece,
                  slots_[static_cast<size_t>(l)].in, piece);
    allgather_in_place(acc_.data(), acc_.size());
    char* out0 = static_cast<char*>(slots_[0].out);
    std::memcpy(out0, acc_.data(), piece);
    for (int r = 1; r < P_ * L_; ++r)
      accumulate(out0, acc_.data() + static_cast<size_t>(r) * piece, count, dtype);
    for (int l = 1; l < L_; ++l) std::memcpy(slots_[static_cast<size_t>(l)].out, out0, piece);
  }

  // Gloo's ring all-reduce, in place in rank 0's output. Only for two
  // processes of one device each: every element is then one addition of
  // two values, which is the same in either order, so the bits equal the
  // rank-order sum of make_thread_communicator.
  template <class T>
  void reduce_all_by_ring(int64_t count) {
    T* out = static_cast<T*>(slots_[0].out);
    if (slots_[0].in != slots_[0].out)
      std::memcpy(out, slots_[0].in, static_cast<size_t>(count) * sizeof(T));
    gloo::AllreduceOptions o(context_);
    o.setOutput(out, static_cast<size_t>(count));
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    o.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
    o.setTag(tag_++);
    o.setTimeout(timeout_);
    gloo::allreduce(o);
  }

  // The size from which two processes use Gloo's ring (reduce-scatter, then
  // allgather: each process adds half the elements) rather than gathering
  // both inputs whole and adding all of them: the same bytes cross the
  // socket, but a process adds, copies and holds half as much. Below it,
  // one allgather round trip is the cheaper (latency-bound) exchange.
  static constexpr int64_t kRingBytes = 256 << 10;

  bool reduce_all_by_ring_if_best(int64_t count, ir::DType dtype) {
    if (P_ != 2 || L_ != 1 || count * ir::dtype_bytes(dtype) < kRingBytes) return false;
    switch (dtype) {
      case ir::DType::Float32:
        reduce_all_by_ring<float>(count);
        return true;
      case ir::DType::Float64:
        reduce_all_by_ring<double>(count);
        return true;
      case ir::DType::Int32:
        reduce_all_by_ring<int32_t>(count);
        return true;
      case ir::DType::Int64:
        reduce_all_by_ring<int64_t>(count);
        return true;
      default:
        return false;  // Bool is an or; 8-bit sums stay on the gather path
    }
  }

  void reduce_all(int64_t count, ir::DType dtype) {
    if (count <= 0) return;
    if (reduce_all_by_ring_if_best(count, dtype)) return;
    // Small exchanges are latency-bound and two processes move the same bytes
    // either way: gather. Large ones over more processes: alltoall + allgather.
    if (P_ > 1 && (P_ == 2 || count * ir::dtype_bytes(dtype) * L_ <= (64 << 10)))
      return reduce_all_by_gather(count, dtype);
    const size_t es = static_cast<size_t>(ir::dtype_bytes(dtype));
    const int64_t chunk = (count + P_ - 1) / P_;  // elements process q reduces: chunk q
    const size_t chunk_bytes = static_cast<size_t>(chunk) * es;
    const size_t total = static_cast<size_t>(P_) * L_ * chunk_bytes;
    // send_[q][l]: local device l's part of chunk q, zero past count.
    send_.resize(total);
    for (int q = 0; q < P_; ++q) {
      int64_t lo = std::min(count, q * chunk), n = std::min(count, lo + chunk) - lo;
      for (int l = 0; l < L_; ++l) {
        char* dst = send_.data() + (static_cast<size_t>(q) * L_ + l) * chunk_bytes;
        const char* src = static_cast<const char*>(slots_[static_cast<size_t>(l)].in);
        if (n > 0) std::memcpy(dst, src + lo * es, static_cast<size_t>(n) * es);
        std::memset(dst + n * es, 0, chunk_bytes - static_cast<size_t>(n) * es);
      }
    }
    const char* parts = send_.data();
    if (P_ > 1) {
      recv_.resize(total);
      alltoall(send_.data(), recv_.data(), total);
      parts = recv_.data();
    }
    // parts[r]: global rank r's part of this process's chunk; add in rank order.
    acc_.resize(static_cast<size_t>(P_) * chunk_bytes);
    char* mine = acc_.data() + static_cast<size_t>(p_) * chunk_bytes;
    std::memcpy(mine, parts, chunk_bytes);
    for (int r = 1; r < P_ * L_; ++r)
      accumulate(mine, parts + static_cast<size_t>(r) * chunk_bytes, chunk, dtype);
    if (P_ > 1) allgather_in_place(acc_.data(), acc_.size());
    for (int l = 0; l < L_; ++l)
      std::memcpy(slots_[static_cast<size_t>(l)].out, acc_.data(), static_cast<size_t>(count) * es);
  }

  void gather_all(int64_t outer, int64_t inner_bytes) {
    if (outer <= 0 || inner_bytes <= 0) return;
    const size_t B = static_cast<size_t>(inner_bytes), O = static_cast<size_t>(outer);
    const size_t block = static_cast<size_t>(L_) * O * B;  // this process's part: [L][outer][B]
    acc_.resize(static_cast<size_t>(P_) * block);
    char* mine = acc_.data() + static_cast<size_t>(p_) * block;
    for (int l = 0; l < L_; ++l)
      std::memcpy(mine + l * O * B, slots_[static_cast<size_t>(l)].in, O * B);
    if (P_ > 1) allgather_in_place(acc_.data(), acc_.size());
    // acc_[r][o] (r = p * L + l) goes to out[o][r].
    const size_t R = static_cast<size_t>(P_ * L_);
    char* out0 = static_cast<char*>(slots_[0].out);
    for (size_t o = 0; o < O; ++o)
      for (size_t r = 0; r < R; ++r)
        std::memcpy(out0 + (o * R + r) * B, acc_.data() + (r * O + o) * B, B);
    for (int l = 1; l < L_; ++l) std::memcpy(slots_[static_cast<size_t>(l)].out, out0, O * R * B);
  }

  // As reduce_all_by_gather: every process gathers all inputs whole and adds
  // its own devices' blocks in rank order.
  void scatter_reduce_by_gather(int64_t outer, int64_t inner, ir::DType dtype) {
    const size_t es = static_cast<size_t>(ir::dtype_bytes(dtype));
    const size_t O = static_cast<size_t>(outer), I = static_cast<size_t>(inner);
    const size_t R = static_cast<size_t>(P_) * L_;
    const size_t whole = O * R * I * es;  // one rank's input: [O][R][I]
    acc_.resize(R * whole);
    for (int l = 0; l < L_; ++l)
      std::memcpy(acc_.data() + (static_cast<size_t>(p_) * L_ + l) * whole,
                  slots_[static_cast<size_t>(l)].in, whole);
    allgather_in_place(acc_.data(), acc_.size());
    for (int l = 0; l < L_; ++l) {
      size_t g = static_cast<size_t>(p_) * L_ + l;
      char* out = static_cast<char*>(slots_[static_cast<size_t>(l)].out);
      for (size_t o = 0; o < O; ++o) {
        char* dst = out + o * I * es;
        std::memcpy(dst, acc_.data() + (o * R + g) * I * es, I * es);
        for (size_t r = 1; r < R; ++r)
          accumulate(dst, acc_.data() + r * whole + (o * R + g) * I * es, inner, dtype);
      }
    }
  }

  void scatter_reduce(int64_t outer, int64_t inner, ir::DType dtype) {
    if (outer <= 0 || inner <= 0) return;
    if (P_ > 1 && (P_ == 2 || outer * inner * P_ * L_ * ir::dtype_bytes(dtype) * L_ <= (64 << 10)))
      return scatter_reduce_by_gather(outer, inner, dtype);
    const size_t es = static_cast<size_t>(ir::dtype_bytes(dtype));
    const size_t O = static_cast<size_t>(outer), I = static_cast<size_t>(inner);
    const size_t L = static_cast<size_t>(L_), R = static_cast<size_t>(P_) * L;
    const size_t row = L * I * es;     // one source's [L dst][I] for one o and one process
    const size_t block = L * O * row;  // for one destination process: [L src][O][L dst][I]
    // send_[q][l][o]: local device l's in[o][ranks of process q].
    send_.resize(static_cast<size_t>(P_) * block);
    for (size_t q = 0; q < static_cast<size_t>(P_); ++q)
      for (size_t l = 0; l < L; ++l) {
        const char* src = static_cast<const char*>(slots_[l].in);
        for (size_t o = 0; o < O; ++o)
          std::memcpy(send_.data() + ((q * L + l) * O + o) * row, src + (o * R + q * L) * I * es,
                      row);
      }
    const char* parts = send_.data();
    if (P_ > 1) {
      recv_.resize(send_.size());
      alltoall(send_.data(), recv_.data(), send_.size());
      parts = recv_.data();
    }
    // parts[r][o][d]: global rank r's in[o][this process's rank d]; add in rank order.
    for (size_t d = 0; d < L; ++d) {
      char* out = static_cast<char*>(slots_[d].out);
      for (size_t o = 0; o < O; ++o) {
        char* dst = out + o * I * es;
        std::memcpy(dst, parts + (o * L + d) * I * es, I * es);
        for (size_t r = 1; r < R; ++r)
          accumulate(dst, parts + ((r * O + o) * L + d) * I * es, inner, dtype);
      }
    }
  }

  // -------------------------------------------------------------------------
  // Gloo calls. Every process makes the same calls in the same order, so a
  // counter gives each its own tag everywhere.

  void alltoall(char* send, char* recv, size_t bytes) {
    gloo::AlltoallOptions o(context_);
    o.setInput(reinterpret_cast<uint8_t*>(send), bytes);
    o.setOutput(reinterpret_cast<uint8_t*>(recv), bytes);
    o.setTag(tag_++);
    o.setTimeout(timeout_);
    gloo::alltoall(o);
  }

  // buf: [P][bytes / P]; process p's block is p's input and, after, everyone's.
  void allgather_in_place(char* buf, size_t bytes) {
    gloo::AllgatherOptions o(context_);
    o.setOutput(reinterpret_cast<uint8_t*>(buf), bytes);
    o.setTag(tag_++);
    o.setTimeout(timeout_);
    gloo::allgather(o);
  }

  void gloo_barrier() {
    gloo::BarrierOptions o(context_);
    o.setTag(tag_++);
    o.setTimeout(timeout_);
    gloo::barrier(o);
  }

  GlooOptions opts_;
  int P_, L_, p_;
  milliseconds timeout_{0};
  std::shared_ptr<Communicator> local_;  // the barriers of the local devices
  std::vector<Slot> slots_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::mutex gloo_mu_;  // held by the leader while it is in Gloo
  bool closed_ = false;
  uint32_t tag_ = 0;
  std::vector<char> send_, recv_, acc_;  // the leader's scratch, kept between calls
  std::mutex mu_;
  std::string aborted_;
};

}  // namespace

std::shared_ptr<Communicator> make_gloo_communicator(const GlooOptions& options) {
  return std::make_shared<GlooCommunicator>(options);
}

}  // namespace flowjit::runtime
